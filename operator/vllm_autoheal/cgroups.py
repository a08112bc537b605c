"""This process's memory cgroup: its limit and its OOM-kill counter (v2 or v1), and where no limit is set,
the host memory available. Standard library only.

When the kernel kills only a vLLM worker for the memory limit, vLLM's own last words vary
(`exit code: -9`, `exit code: None`, or just `cancelled`), and the container may exit with 1
rather than 137. The cgroup's oom_kill counter is what the kubelet itself reads: if it grew
while vLLM ran, host RAM ran out, whatever vLLM printed.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
MEMINFO = Path("/proc/meminfo")


def _memory_dirs() -> list[Path]:
    dirs = []
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]  # (a malformed line is skipped)
        if hid == "0" and path:
            dirs.append(ROOT / path.lstrip("/"))  # v2 unified
        elif "memory" in controllers.split(","):
            dirs.append(ROOT / "memory" / path.lstrip("/"))  # v1
    # Without a cgroup namespace (the usual case on cgroup v1 nodes) those paths are the host's,
    # while the container's own cgroup is mounted at the root: look there when they are not found.
    return [*dirs, *(d for d in (ROOT, ROOT / "memory") if d not in dirs)]


def memory_limit() -> int | None:
    """The memory limit in bytes, or None when unlimited or unknown."""
    for d in _memory_dirs():
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                value = (d / name).read_text().strip()
                limit = int(value) if value != "max" else None
            except (OSError, ValueError):  # missing, unreadable, or not a number: another place may tell
                continue
            if limit is not None and 0 < limit < 2**60:  # (v1 writes "unlimited" as a page-aligned 2**63)
                return limit
    return None


def host_memory() -> int | None:
    """What vLLM may hold of host memory here, in bytes: the cgroup's limit, else (a machine of its own, as
    `serve` often runs on) what the kernel says is available now (MemAvailable: free and reclaimable, less
    what other processes hold); None where neither can be read."""
    limit = memory_limit()
    if limit is not None:
        return limit
    try:
        for line in MEMINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                kib = int(value.split()[0])
                return kib * 1024 if 0 < kib < 2**50 else None
    except (OSError, ValueError, IndexError):
        pass
    return None


def oom_kills() -> int | None:
    """How many processes the kernel has OOM-killed in this cgroup, or None when unknown."""
    for d in _memory_dirs():
        for name in ("memory.events", "memory.oom_control"):
            try:
                for line in (d / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                continue
    return None


def killed_since(before: int | None) -> bool:
    after = oom_kills()
    return before is not None and after is not None and after > before
