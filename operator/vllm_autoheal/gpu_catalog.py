"""Owns the GPU catalog (memory per product), keyed by the `nvidia.com/gpu.product` label (GPU feature discovery).

Memory is what CUDA reports as total (torch.cuda.mem_get_info), which is what vLLM
multiplies by gpu_memory_utilization: a little under the marketing size. Sources:
H200 measured on the project's machine (tests/fixtures/gpu/ground-truth-cases.jsonl: 139.80 GiB);
others as printed in real vLLM logs (tests/corpus/) where marked, else the nominal size
less the ~0.6 GiB the driver keeps (nominal GB -> GiB, minus reserve).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .diagnosis.units import GB, GIB


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    source: str = "nominal"


_CATALOG: dict[str, tuple[float, str]] = {
    "H200": (139.80, "measured (H200, vLLM 0.25)"),
    "H200-NVL": (139.80, "as H200"),
    "H100-80GB-HBM3": (79.19, "nominal"),
    "H100-SXM5-80GB": (79.19, "nominal"),
    "H100-PCIE": (79.19, "nominal"),
    "H100-NVL": (93.09, "vLLM log in oom-corpus"),
    "B200": (178.36, "nominal"),
    "GB200": (184.0, "nominal"),
    "A100-SXM4-80GB": (79.15, "vLLM log in oom-corpus"),
    "A100-80GB-PCIE": (79.15, "as A100-SXM4-80GB"),
    "A100-SXM4-40GB": (39.39, "nominal"),
    "A100-PCIE-40GB": (39.39, "nominal"),
    "L40S": (44.39, "nominal"),
    "L40": (44.39, "nominal"),
    "L4": (22.05, "vLLM log in oom-corpus"),
    "A10": (22.06, "nominal"),
    "A10G": (22.06, "nominal"),
    "RTX-A6000": (47.38, "vLLM log in oom-corpus (48 GB class)"),
    "GEFORCE-RTX-4090": (23.65, "vLLM log in oom-corpus"),
    "GEFORCE-RTX-3090": (23.69, "nominal"),
    "GEFORCE-RTX-5090": (31.35, "vLLM log in oom-corpus"),
    "T4": (14.75, "nominal"),
    "V100-SXM2-32GB": (31.74, "nominal"),
    "V100-SXM2-16GB": (15.77, "vLLM log in oom-corpus"),
}
_MIG = re.compile(r"-MIG-(\d+)g\.(\d+)gb$", re.IGNORECASE)


def _key(name: str) -> str:
    k = re.sub(r"[\s_]+", "-", name.strip()).upper()
    k = re.sub(r"^(NVIDIA-|TESLA-)", "", k)
    return k.removesuffix("-SHARED")  # GFD marks time-sliced GPUs with -SHARED


def lookup(name: str, memory_gib: float | None = None) -> GpuSpec:
    """A GPU by its product label; an unknown name needs an explicit memory size."""
    if memory_gib is not None:
        return GpuSpec(name, float(memory_gib), "given")
    key = _key(name)
    mig = _MIG.search(key)
    if mig:  # a MIG slice: its memory is in the profile name (e.g. 3g.40gb)
        return GpuSpec(name, int(mig.group(2)) * GB / GIB - 0.5, "MIG profile")
    if key in _CATALOG:
        mem, src = _CATALOG[key]
        return GpuSpec(name, mem, src)
    raise KeyError(
        f"unknown GPU {name!r}: give its memory (--gpu-memory-gib / resources.gpuMemoryGiB); "
        f"known: {', '.join(sorted(_CATALOG))}"
    )


def known() -> list[str]:
    return sorted(_CATALOG)
