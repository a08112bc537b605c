"""The steps for host memory running out (an OOMKill, a worker killed by the kernel): a larger memory
limit, sized VPA-style or to what the offload pins where that is known; less offload, to what the limit
holds; a smaller KV cache on vLLM's CPU backend."""

from __future__ import annotations

import math

from ..diagnosis.units import GIB, MIB
from ..offload_pinned import (
    LIMIT_MARGIN,
    besides_offload_gib,
    held_beside_offload_gib,
    layer_blocks,
    least_pinned_gib,
    limit_for_pinned_gib,
    pinned_gib,
)
from ..quantity import format_bytes, parse_quantity
from .model import Context, Remedy

VPA_RATIO, VPA_MIN_BUMP = 1.2, 100 * MIB  # Kubernetes VPA's OOM bump (DefaultOOMBumpUpRatio/MinBumpUp)


def raise_memory_limit(ctx: Context) -> Remedy | None:
    """VPA's bump, or the limit what the flags pin needs where that is more (one restart, not several bumps):
    the offload's pinned memory on every rank (at the least what it moves where its layers are not laid out) and
    a KV offloading buffer, beside vLLM's processes, a tenth spare; the bound where it holds that need with less
    than a tenth spare; past the bound where it cannot, the bump too (the gate refuses it, saying so, and less
    offload is the next step)."""
    limit_text = ctx.policy.bounds.max_memory_limit
    used = ctx.inv.memory_limit_bytes
    if not limit_text or not used:
        return None
    cap = parse_quantity(limit_text) // MIB * MIB  # (whole MiB within the bound: format_bytes rounds up otherwise)
    new, basis = max(int(used * VPA_RATIO), used + VPA_MIN_BUMP), "VPA-style to max(x1.2, +100Mi)"
    needs = limit_for_pinned_gib(ctx.inv.shape, ctx.engine, offload_counts=not ctx.offload_ignored())
    if needs is None:
        new = min(new, cap)
    else:
        need_gib, exact = needs  # (finite: besides_offload_gib reads no buffer past what a host holds)
        if need_gib * GIB > new:
            new, basis = math.ceil(need_gib * GIB / MIB) * MIB, f"to {_pinned_basis(ctx, exact)}, a tenth spare,"
        if new > cap and need_gib * GIB <= cap:
            new = cap
        elif new > cap and need_gib * (1 - LIMIT_MARGIN) * GIB <= cap:
            new, basis = cap, f"to the bound, which holds {_pinned_basis(ctx, exact)} with less than a tenth spare,"
    if new <= used:
        return None
    return Remedy(
        "RaiseMemoryLimit",
        {"memory_limit": format_bytes(new)},
        f"the container was killed at its {format_bytes(used)} limit; raised {basis} = {format_bytes(new)} "
        f"(bound {limit_text}).",
    )


def _pinned_basis(ctx: Context, exact: bool) -> str:
    """What a raise holds: the offload's pinned memory (or the least of it) and the KV offloading buffer."""
    parts = []
    gb = 0.0 if ctx.offload_ignored() else ctx.engine.cpu_offload_gb or 0.0
    if gb:
        least = least_pinned_gib(ctx.inv.shape, ctx.engine)
        pinned = least[0] if least else gb
        parts.append(f"what cpu_offload_gb {gb:g} pins on each rank ({'' if exact else 'at least '}{pinned:.1f} GiB)")
    buffer = besides_offload_gib(ctx.engine)
    if buffer:
        parts.append(f"the {buffer:g} GiB KV offloading buffer")
    return " and ".join(parts) + " beside vLLM's processes"


def lower_cpu_offload(ctx: Context) -> Remedy | None:
    """Less offload: where the limit is known, the most it holds (the least cut; by the rounding's bound where the
    layers are not laid out), within maxCpuOffloadGb; else half. None where what the container holds besides the
    offload (vLLM's processes, a KV offloading buffer) is more than the whole limit: no cut stops that kill."""
    gb = ctx.engine.cpu_offload_gb
    if not gb or ctx.offload_ignored():
        return None  # (an offload the release ignores holds no host memory: less of it frees none)
    limit = ctx.inv.memory_limit_bytes
    beside = held_beside_offload_gib(ctx.engine)
    if limit and beside is not None and beside * GIB >= limit:
        ctx.declined.append(
            f"less CPU offload cannot stop the kill: vLLM's processes and the KV offloading buffer hold about "
            f"{beside:.1f} GiB whatever the offload, more than the {format_bytes(limit)} limit"
        )
        return None
    new, why = math.floor(gb / 2), "offloaded weights live in host RAM"
    held = ctx.limits.offload_the_limit_holds(ctx.engine, ctx.inv.shape)
    if held is not None and limit:
        bound = ctx.policy.bounds.max_cpu_offload_gb
        most = min(held, bound) if bound is not None else held
        laid_out = layer_blocks(ctx.inv.shape, ctx.engine) is not None
        if most < gb and (laid_out or most < new):
            new = math.floor(most)
            pinned = (
                f"it pinned about {pinned_gib(ctx.inv.shape, ctx.engine):.1f} GiB a GPU"
                if laid_out
                else "it pins up to twice itself (its layers are not laid out)"
            )
            why = f"{pinned}; the {format_bytes(limit)} limit holds {math.floor(held)} beside vLLM's processes"
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
