"""The steps for host memory running out (an OOMKill, a worker killed by the kernel): a larger memory
limit, sized VPA-style or to what the offload pins where that is known; less offload, to what the limit
holds; a smaller KV cache on vLLM's CPU backend."""

from __future__ import annotations

import math

from ..diagnosis.units import GIB, MIB
from ..offload_pinned import LIMIT_MARGIN, layer_blocks, limit_for_offload_gib, pinned_gib
from ..quantity import format_bytes, parse_quantity
from .model import Context, Remedy

VPA_RATIO, VPA_MIN_BUMP = 1.2, 100 * MIB  # Kubernetes VPA's OOM bump (DefaultOOMBumpUpRatio/MinBumpUp)


def raise_memory_limit(ctx: Context) -> Remedy | None:
    """VPA's bump, or the limit the offload's pinned memory needs where that is more (one restart, not
    several bumps): the bound where it holds that need with less than a tenth spare; past the bound where it
    cannot (the gate refuses it, saying so, and less offload is the next step)."""
    limit_text = ctx.policy.bounds.max_memory_limit
    used = ctx.inv.memory_limit_bytes
    if not limit_text or not used:
        return None
    cap = parse_quantity(limit_text) // MIB * MIB  # (whole MiB within the bound: format_bytes rounds up otherwise)
    new, basis = max(int(used * VPA_RATIO), used + VPA_MIN_BUMP), "VPA-style to max(x1.2, +100Mi)"
    needs = None if ctx.offload_ignored() else limit_for_offload_gib(ctx.inv.shape, ctx.engine)
    if needs is not None and math.isfinite(needs) and needs * GIB > new:
        new, spare = math.ceil(needs * GIB / MIB) * MIB, "a tenth spare"
        if new > cap and needs * (1 - LIMIT_MARGIN) * GIB <= cap:
            new, spare = cap, "to the bound (less than a tenth spare)"
        basis = (
            f"to what cpu_offload_gb {ctx.engine.cpu_offload_gb:g} pins on each rank "
            f"({pinned_gib(ctx.inv.shape, ctx.engine):.1f} GiB) beside vLLM's processes, {spare},"
        )
    else:
        new = min(new, cap)
    if new <= used:
        return None
    return Remedy(
        "RaiseMemoryLimit",
        {"memory_limit": format_bytes(new)},
        f"the container was killed at its {format_bytes(used)} limit; raised {basis} = {format_bytes(new)} "
        f"(bound {limit_text}).",
    )


def lower_cpu_offload(ctx: Context) -> Remedy | None:
    """Less offload: where the model's layers are laid out and the limit is known, the most the limit holds
    (the least cut), within maxCpuOffloadGb; else half."""
    gb = ctx.engine.cpu_offload_gb
    if not gb or ctx.offload_ignored():
        return None  # (an offload the release ignores holds no host memory: less of it frees none)
    new, why = math.floor(gb / 2), "offloaded weights live in host RAM"
    held = ctx.limits.offload_the_limit_holds(ctx.engine, ctx.inv.shape)
    if held is not None and ctx.inv.memory_limit_bytes and layer_blocks(ctx.inv.shape, ctx.engine) is not None:
        bound = ctx.policy.bounds.max_cpu_offload_gb
        most = min(held, bound) if bound is not None else held
        if most < gb:
            new = math.floor(most)
            pinned = f"it pinned about {pinned_gib(ctx.inv.shape, ctx.engine):.1f} GiB a GPU"
            why = (
                f"{pinned}; the {format_bytes(ctx.inv.memory_limit_bytes)} limit holds {math.floor(held)} beside "
                "vLLM's processes"
            )
            if most < held:
                why += f", maxCpuOffloadGb {bound:g}"
    if new >= gb:
        return None
    return Remedy("LowerCpuOffload", {"cpu_offload_gb": float(new)}, f"cpu_offload_gb {gb:g} -> {new}: {why}.")


def shrink_kv_bytes(ctx: Context) -> Remedy | None:
    kv = ctx.engine.kv_cache_memory_bytes
    if not kv or not ctx.inv.host_kv_cache:  # (a GPU's cache: a smaller one frees no host memory)
        return None
    new = kv // 2
    if ctx.inv.memory_limit_bytes:
        new = min(new, ctx.inv.memory_limit_bytes // 3)
    new = max(new // MIB, 1) * MIB
    new = max(new, ctx.policy.bounds.min_kv_cache_memory_bytes)
    return Remedy(
        "SetKvCacheMemoryBytes",
        {"kv_cache_memory_bytes": new},
        f"host RAM ran out; the KV cache {format_bytes(kv)} -> {format_bytes(new)}.",
    )
