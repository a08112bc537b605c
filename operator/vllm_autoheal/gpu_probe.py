"""Owns the GPU probe: the inventory through NVML: per GPU its name and total/free/used memory, and the processes
holding memory. No driver (or no pynvml) gives a snapshot whose `error` says so, never an
exception. Standard library at import time: pynvml (nvidia-ml-py) is imported when probing,
falling back to the copy vLLM bundles (vllm.third_party.pynvml) inside vLLM images.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .diagnosis.model import GpuInfo, GpuProcess, GpuSnapshot
from .diagnosis.units import GIB


def _nvml() -> Any | None:
    try:
        import pynvml  # nvidia-ml-py

        return pynvml
    except ImportError:
        pass
    try:
        from vllm.third_party import pynvml

        return pynvml
    except ImportError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""  # another container's process: its /proc entry is not visible here


def snapshot(own_pids: list[int] | None = None) -> GpuSnapshot:
    nv = _nvml()
    if nv is None:
        return GpuSnapshot(error="no NVML: install nvidia-ml-py", own_pids=list(own_pids or []))
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return GpuSnapshot(error=f"no NVIDIA driver: {exc}", own_pids=list(own_pids or []))
    snap = GpuSnapshot(own_pids=list(own_pids or [os.getpid()]))
    errors: list[str] = []
    try:
        count = nv.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001
        count, snap.error = 0, f"NVML query failed: {exc}"
    try:
        for index in range(count):
            try:  # (one GPU that errors, fallen off the bus say, must not hide the others)
                _probe_gpu(nv, index, snap)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"GPU {index}: {exc}")
        if errors:
            snap.error = f"NVML query failed: {'; '.join(errors)}"
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return snap


def _probe_gpu(nv: Any, index: int, snap: GpuSnapshot) -> None:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(handle)
    snap.gpus.append(
        GpuInfo(
            index=index,
            name=_text(nv.nvmlDeviceGetName(handle)),
            total_bytes=int(mem.total),
            free_bytes=int(mem.free),
            used_bytes=int(mem.used),
        )
    )
    seen: set[int] = set()
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            procs = getattr(nv, getter)(handle)
        except Exception:  # noqa: BLE001 - not supported on every driver / MIG mode
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0
            snap.processes.append(
                GpuProcess(pid=int(p.pid), gpu_index=index, used_bytes=used, name=_process_name(int(p.pid)))
            )


def compact(snap: GpuSnapshot) -> dict[str, Any]:
    """A small JSON form for the 4 KiB termination message: GiB with two decimals."""
    out: dict[str, Any] = {}
    if snap.error:
        out["error"] = snap.error[:160]
    if snap.gpus:
        out["gpus"] = [
            [g.index, g.name[:40], round(g.total_bytes / GIB, 2), round(g.free_bytes / GIB, 2)] for g in snap.gpus
        ]
    others = [
        [p.pid, p.gpu_index, round(p.used_bytes / GIB, 2)] for p in snap.processes if p.pid not in set(snap.own_pids)
    ]
    if others:
        out["other_processes"] = others[:8]
    return out


def describe(snap: GpuSnapshot) -> str:
    if snap.error:
        return snap.error
    lines = [
        f"GPU {g.index} {g.name}: {g.total_bytes / GIB:.2f} GiB total, {g.free_bytes / GIB:.2f} GiB free, "
        f"{g.used_bytes / GIB:.2f} GiB used"
        for g in snap.gpus
    ]
    lines += [
        f"  process {p.pid} {p.name or '?'} on GPU {p.gpu_index}: {p.used_bytes / GIB:.2f} GiB" for p in snap.processes
    ]
    return "\n".join(lines) or "no GPUs"


_ORDINAL = re.compile(r"\s*([0-9]{1,4})\s*")


def gpus_for(snap: GpuSnapshot, count: int, env: Mapping[str, str]) -> list[GpuInfo] | None:
    """The GPUs a process started with `env` takes as its first `count` CUDA devices, as NVML numbers
    them; None where that cannot be told: a failed probe, a UUID or MIG name in CUDA_VISIBLE_DEVICES
    (NVML's snapshot keeps no UUID), unlike GPUs in CUDA's default order (fastest first, where NVML
    counts by PCI bus; like GPUs tie, and tie by bus), or fewer devices than asked."""
    if snap.error or count < 1:
        return None
    by_index = {g.index: g for g in snap.gpus}
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        ordinals = sorted(by_index)
    else:
        ordinals = []
        for item in listed.split(","):
            found = _ORDINAL.fullmatch(item)
            if found is None:
                if item.strip().startswith(("GPU-", "MIG-")):
                    return None
                break  # (CUDA stops at the first entry it cannot read: the devices before it are the visible ones)
            ordinals.append(int(found.group(1)))
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len({g.name for g in snap.gpus}) > 1:
        return None
    chosen = ordinals[:count]
    if len(set(chosen)) < count or not all(i in by_index for i in chosen):
        return None  # (vLLM fails short of devices; CUDA refuses a device listed twice)
    return [by_index[i] for i in chosen]


def visible_count(snap: GpuSnapshot, env: Mapping[str, str]) -> int | None:
    """How many CUDA devices a process started with `env` sees: every GPU NVML lists, or the entries of
    CUDA_VISIBLE_DEVICES up to the first CUDA cannot use (an ordinal NVML does not list ends the list), a MIG
    slice being the only device a process sees; None where the probe failed or found no GPU (vLLM's CPU
    backend: its ranks are no GPUs)."""
    if snap.error or not snap.gpus:
        return None
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return len(snap.gpus)
    known, seen = {g.index for g in snap.gpus}, list[str]()
    for item in listed.split(","):
        found = _ORDINAL.fullmatch(item)
        if item.strip().startswith("MIG-"):
            return len(seen) or 1
        if item.strip().startswith("GPU-"):
            seen.append(item.strip())
        elif found is not None and int(found.group(1)) in known and found.group(1) not in seen:
            seen.append(found.group(1))
        else:
            break
    return len(seen)
