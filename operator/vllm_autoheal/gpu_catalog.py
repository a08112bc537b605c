"""Owns the GPU catalog (memory and compute capability per product), keyed by the `nvidia.com/gpu.product` label
(GPU feature discovery).

Memory is what CUDA reports as total (torch.cuda.mem_get_info), which is what vLLM
multiplies by gpu_memory_utilization: a little under the marketing size. Sources:
H200 measured on the project's machine (tests/fixtures/gpu/ground-truth-cases.jsonl: 139.80 GiB), H100 80GB
HBM3 too (tests/fixtures/gpu/h100-runs/device.txt: 85,017,493,504 bytes = 79.18 GiB, as vLLM 0.25 printed it);
others as printed in real vLLM logs (tests/corpus/) where marked, else the nominal size
less the ~0.6 GiB the driver keeps (nominal GB -> GiB, minus reserve). Compute capability as NVIDIA lists it
(developer.nvidia.com/cuda-gpus): vLLM picks some kernels by it (mxfp4_experts.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .diagnosis.model import GpuInfo
from .diagnosis.units import GIB


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    source: str = "nominal"
    capability: tuple[int, int] | None = None  # CUDA compute capability, where the product is known


_CATALOG: dict[str, tuple[float, str, tuple[int, int]]] = {
    "H200": (139.80, "measured (H200, vLLM 0.25)", (9, 0)),
    "H200-NVL": (139.80, "as H200", (9, 0)),
    "H100-80GB-HBM3": (79.18, "measured (H100 80GB HBM3, vLLM 0.25)", (9, 0)),
    "H100-SXM5-80GB": (79.18, "as H100-80GB-HBM3", (9, 0)),
    "H100-PCIE": (79.19, "nominal", (9, 0)),
    "H100-NVL": (93.09, "vLLM log in oom-corpus", (9, 0)),
    "B200": (178.36, "nominal", (10, 0)),
    "GB200": (184.0, "nominal", (10, 0)),
    "A100-SXM4-80GB": (79.15, "vLLM log in oom-corpus", (8, 0)),
    "A100-80GB-PCIE": (79.15, "as A100-SXM4-80GB", (8, 0)),
    "A100-SXM4-40GB": (39.39, "nominal", (8, 0)),
    "A100-PCIE-40GB": (39.39, "nominal", (8, 0)),
    "L40S": (44.39, "nominal", (8, 9)),
    "L40": (44.39, "nominal", (8, 9)),
    "L4": (22.05, "vLLM log in oom-corpus", (8, 9)),
    "A10": (22.06, "nominal", (8, 6)),
    "A10G": (22.06, "nominal", (8, 6)),
    "RTX-A6000": (47.38, "vLLM log in oom-corpus (48 GB class)", (8, 6)),
    "GEFORCE-RTX-4090": (23.65, "vLLM log in oom-corpus", (8, 9)),
    "GEFORCE-RTX-3090": (23.69, "nominal", (8, 6)),
    "GEFORCE-RTX-5090": (31.35, "vLLM log in oom-corpus", (12, 0)),
    "T4": (14.75, "nominal", (7, 5)),
    "V100-SXM2-32GB": (31.74, "nominal", (7, 0)),
    "V100-SXM2-16GB": (15.77, "vLLM log in oom-corpus", (7, 0)),
}
_MIG = re.compile(r"-MIG-(\d+)g\.(\d+)gb$", re.IGNORECASE)


def _spelled(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip()).upper()


def _key(name: str) -> str:
    k = re.sub(r"^(NVIDIA-|TESLA-)", "", _spelled(name))
    return k.removesuffix("-SHARED")  # GFD marks time-sliced GPUs with -SHARED


def one_device_a_process(name: str) -> str | None:
    """Why a pod's GPUs of this product cannot hold one process's split, or None: a CUDA process sees one MIG
    slice only (NVIDIA's MIG guide, device enumeration), and time-sliced replicas (GFD's -SHARED) may be one GPU
    (vLLM: "World size (2) is larger than the number of available GPUs (1)")."""
    if _MIG.search(_key(name)):
        return "a CUDA process sees only one MIG slice"
    if _spelled(name).endswith("-SHARED"):
        return "time-sliced replicas of a GPU may be the same GPU"
    return None


def lookup(name: str, memory_gib: float | None = None) -> GpuSpec:
    """A GPU by its product label; an unknown name needs an explicit memory size."""
    key = _key(name)
    mig = _MIG.search(key)
    # (a MIG slice computes as its whole GPU; a product named beside a given size is still that product)
    known = _CATALOG.get(key[: mig.start()] if mig else key)
    capability = known[2] if known else None
    if memory_gib is not None:
        return GpuSpec(name, float(memory_gib), "given", capability)
    if mig:  # a MIG slice: its memory is in the profile name (e.g. 3g.40gb)
        whole = (key[: mig.start()], known[0]) if known else None
        return GpuSpec(name, _slice_gib(name, mig.group(2), whole), "MIG profile", capability)
    if known:
        return GpuSpec(name, known[0], known[1], capability)
    raise KeyError(
        f"unknown GPU {name!r}: give its memory (--gpu-memory-gib / resources.gpuMemoryGiB); "
        f"known: {', '.join(sorted(_CATALOG))}"
    )


# What CUDA reports of a MIG slice: its profile's number, read as GiB, less a little (`nvidia-smi mig -lgip` on an H100
# 80GB: 1g.10gb 9.75, 2g.20gb 19.62, 3g.40gb 39.50, 7g.80gb 79.25 GiB; torch on an A100 2g.20gb: 19.50): taken at the
# least of those, so a slice is never sized above what it has.
SLICE_SHORT_GIB = {40: 0.75, 0: 0.5}  # (from a profile of 40 up, and below it)
MOST_SLICE_GIB = 4096.0  # (as `plan --gpu-memory-gib` and no GPU: a profile past it names no slice)


# A whole GPU's memory in its MIG profiles' unit where its product name does not say it (`H100-80GB-...`: 80)
_PROFILE_WHOLE = {"H200": 141, "H200-NVL": 141, "B200": 180}
_NAMED_GB = re.compile(r"(\d{2,3})GB")


def _slice_gib(name: str, profile: str, whole: tuple[str, float] | None) -> float:
    """A MIG slice's memory from its profile's number, never above its share of the whole GPU (its eighths of the
    memory, as NVIDIA's MIG guide lays an A100's, H100's or H200's out: an H200 3g.71gb is half of 139.80 GiB, not
    70.25); KeyError where the number names no slice (0, or past any GPU)."""
    number = int(profile) if len(profile) <= 6 else 0
    gib = number - (SLICE_SHORT_GIB[40] if number >= 40 else SLICE_SHORT_GIB[0])
    if whole is not None:
        product, whole_gib = whole
        named = _NAMED_GB.search(product)
        nominal = int(named.group(1)) if named else _PROFILE_WHOLE.get(product)
        eighths = min(8, max(1, round(8 * number / nominal))) if nominal else 8
        gib = min(gib, whole_gib * eighths / 8)
    if not 0 < gib <= MOST_SLICE_GIB:
        raise KeyError(f"MIG profile of {name!r} names no slice's memory: give its memory (resources.gpuMemoryGiB)")
    return gib


def known() -> list[str]:
    return sorted(_CATALOG)


def gpu_total_gib(name: str, nvml_total_bytes: int) -> float:
    """The GPU's size as vLLM counts it (torch's total, which the catalog holds for a known product):
    NVML's total also counts what the driver reserves (140.40 GiB on an H200 against 139.80), and a
    share sized on it would ask for that too."""
    try:  # (torch's total is never above NVML's: a catalog size above it is another variant's, e.g. ECC off)
        return min(lookup(name).memory_gib, nvml_total_bytes / GIB)
    except KeyError:
        return nvml_total_bytes / GIB


def least_cuda_free_gib(gpus: Sequence[GpuInfo]) -> float | None:
    """The least memory CUDA can take on these GPUs, in GiB with two decimals as the launcher writes it, from
    NVML's figures (None for no GPU). NVML counts the driver's reserve as free on an idle GPU (140.40 GiB of an
    H200, where CUDA's total is 139.80) and as used once a process holds the GPU (79.29 free beside one of
    60.51 GiB: tests/fixtures/gpu/probe-second-process-60g.json), so no GPU has more free than its total."""
    if not gpus:
        return None
    return round(min(min(g.free_bytes / GIB, gpu_total_gib(g.name, g.total_bytes)) for g in gpus), 2)
