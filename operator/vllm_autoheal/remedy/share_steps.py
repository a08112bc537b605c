"""The steps that fit vLLM's share of the GPU (or of host memory, on its CPU backend) to what was free, and the
estimate of the engine at another share with the context its smaller cache holds, which other cuts use too."""

from __future__ import annotations

import math
from typing import Any

from ..diagnosis.units import GIB
from ..memory import (
    CUDA_CONTEXT_GIB,
    Estimate,
)
from .kv_steps import concurrency_held, kv_quantized, round_util, shorter_context, smaller_fixed_cache
from .model import Context, Remedy

# The least budget an engine beside weights held outside it can start in (what vLLM 0.32 gives it: the share less
# the weights held): its CUDA context (0.51 GiB), the profiling run's activations and a KV block need more.
MIN_ENGINE_BUDGET_GIB = 1.0
# vLLM's CPU backend's refusals of a share of host memory (not a GPU's): its ranks share the node's memory
HOST_MEMORY_SUBTYPES = frozenset({"cpu_memory_share_exceeds_free", "kv_space_exceeds_free_host_memory"})


def fit_utilization_to_free(ctx: Context) -> Remedy | None:
    share = share_of_free(ctx)
    if share is None:
        return None
    new, free, basis, printed = share
    if new < ctx.floor or new >= ctx.engine.gpu_memory_utilization:
        return None
    cut = with_context_held(ctx, new, fp8=True)
    if cut is None:
        return None
    changes, why = cut
    total = ctx.total or 0.0
    if ctx.engine.kv_cache_memory_bytes:  # (a cache of a fixed size: the share that passes vLLM's check must hold it)
        fitted = _fixed_cache_within(ctx, new)
        if fitted is None:
            return None
        changes, why = fitted
    return Remedy(
        "LowerGpuMemoryUtilization",
        changes,
        f"{basis}; utilization {new} asks for {new * total:.2f} GiB, leaving {free - new * total:.2f} GiB of "
        f"margin.{why}",
        repeatable=printed,
    )


def _fixed_cache_within(ctx: Context, util: float) -> tuple[dict[str, Any], str] | None:
    """A utilization cut where --kv-cache-memory-bytes fixes the cache: vLLM allocates that size whatever the share
    once its start-up check passes, so the cache comes down to what the share leaves beside the weights (the memory
    model's budget at that share), with the context it holds; None where that cannot be sized or is too small."""
    fixed = (ctx.engine.kv_cache_memory_bytes or 0) / GIB
    if ctx.inv.shape is None or not ctx.total:
        return None  # (without the model's shape, what the share leaves for the cache is not known)
    est = ctx.estimate(ctx.engine.model_copy(update={"gpu_memory_utilization": util, "kv_cache_memory_bytes": None}))
    if est.kv_cache_gib >= fixed:  # (the share leaves the cache room: the cut alone passes vLLM's check)
        return with_context_held(ctx, util)
    smaller = smaller_fixed_cache(ctx, est.kv_cache_gib, fixed)
    if smaller is None:
        return None
    changes, why = smaller
    note = f" The KV cache {fixed:.2f} -> {changes['kv_cache_memory_bytes'] / GIB:.2f} GiB, what utilization {util} "
    return {"gpu_memory_utilization": util, **changes}, note + "leaves beside the weights." + why


def share_of_free(ctx: Context) -> tuple[float, float, str, bool] | None:
    """The utilization that asks for no more than was free, with a margin: (it, the free GiB it is
    sized from, where that figure comes from, whether it is this crash's own: printed, or the launcher's
    at its start); None where not known."""
    if ctx.diag.subtype == "kv_space_exceeds_free_host_memory":
        # (the CPU backend's free figure at KV allocation is what is left after the worker's own
        # memory: sized to it, the worker's whole budget would not hold the worker)
        return None
    free, total = ctx.num("free_gib"), ctx.total
    if not total:
        return None
    others = ctx.num("others_gib")
    printed = free is not None or others is not None
    basis = f"only {free:g} of {total:g} GiB was free at start" if free is not None else ""
    if free is None and others is not None:  # what the OOM's figures leave beside the others
        free = total - others - CUDA_CONTEXT_GIB
        basis = f"other processes hold {others:g} of {total:g} GiB (by the failure's figures), {free:.2f} left"
    cpu = ctx.diag.subtype == "cpu_memory_share_exceeds_free"
    if ctx.inv.gpu_free_gib is not None and not cpu:  # the probe's least over the pod's GPUs, before vLLM started
        probed = ctx.inv.gpu_free_gib - CUDA_CONTEXT_GIB  # (a GPU's figure: never the CPU backend's host memory)
        if free is None or probed < free:  # (one rank printed its GPU's figure; another's may hold less)
            free, basis = probed, f"the least free on the pod's GPUs at start was {probed:.2f} of {total:g} GiB"
            printed = True  # (this crash's own figure too: a later crash's cuts again where others grew)
    if free is None:  # (with kv_cache_memory_bytes set too: vLLM checks total x utilization against free first)
        return None
    held = None
    if ctx.diag.subtype == "free_memory_below_engine_budget":  # (weights held outside: vLLM 0.32's IPC cache)
        held = ctx.held_outside()
        if held is None:  # (sized from the free figure alone, the share would not cover the weights held)
            return None
        free += held
        basis += f", beside {held:.2f} GiB of weights held outside the engine"
    # The printed free figure already excludes vLLM's own CUDA context. On a GPU keep room for the
    # CUDA graphs (where captured outside the budget) plus 0.5 GiB and 1%; free host memory moves
    # between runs (page cache, NUMA accounting), so on the CPU backend keep a quarter back.
    margin = 0.25 * free if cpu else ctx.graphs_outside() + 0.5 + 0.01 * total
    # (from above the bounds' highest utilization, to it at most: the cut must pass the gate)
    new = min(round_util((free - margin) / total), ctx.policy.bounds.max_gpu_memory_utilization)
    if held is not None and new * total - held < MIN_ENGINE_BUDGET_GIB:
        # (a share below the weights held: vLLM refuses it, "Externally held weights ... exceed"; barely above
        # them: the engine's budget beside them cannot hold its CUDA context, activations and one KV block)
        return None
    return new, free, basis, printed


def estimate_at(ctx: Context, util: float) -> Estimate | None:
    """The memory model's estimate of the engine at another utilization; None where it cannot tell."""
    if ctx.inv.shape is None or not ctx.total:
        return None
    return ctx.estimate(ctx.engine.model_copy(update={"gpu_memory_utilization": util}))


def with_context_held(ctx: Context, util: float, fp8: bool = False) -> tuple[dict[str, Any], str] | None:
    """A utilization cut, with the context its smaller cache holds where the memory model (without the model's
    shape: vLLM's printed budget and concurrency) says the current one no longer fits (3% margin): said now, in
    the same restart, not after a second crash. None where it no longer fits and no cut of it may come (the
    bounds, the allowed actions): the cut alone would be refused at the next start. `fp8`: the cut is the only
    change there is (what is free refused the share), so an fp8 KV cache that holds the context may come with it,
    where the other causes' next steps (CUDA graphs off, fewer sequences) keep the cache's precision."""
    changes: dict[str, Any] = {"gpu_memory_utilization": util}
    est = estimate_at(ctx, util)
    if est is not None:
        fit, context, basis = est.max_model_len_fit, est.max_model_len, "The memory model (3% margin) says"
    else:
        budget = ctx.kv_budget()
        cut = (ctx.engine.gpu_memory_utilization - util) * (ctx.total or 0.0)
        held = concurrency_held(ctx, budget - ctx.warmup_loss() - cut) if budget is not None else None
        if held is None:
            return changes, ""
        (fit, context), basis = held, "By vLLM's printed budget and concurrency (3% margin),"
    if fit >= context:
        return changes, ""
    length = shorter_context(ctx, fit * 0.97)
    if length is None:
        if fp8:
            return _with_fp8_cache(ctx, util, fit, context, est is not None)
        _declined(ctx, util, fit, context, "")
        return None
    changes["max_model_len"] = length
    return changes, f" {basis} its KV cache holds {length:,} tokens: max_model_len -> {length:,}."


def _with_fp8_cache(
    ctx: Context, util: float, fit: int, context: int, modelled: bool
) -> tuple[dict[str, Any], str] | None:
    """The cut with an fp8 KV cache, where the context may not be shortened to what the cut's cache holds: the
    context whole where fp8 (twice the tokens a GiB; by the memory model where it sizes the cut) holds it, else the
    one fp8 holds where the bounds allow it; where Fp8KvCache is allowed and the cache is not fp8 already. Else
    None, the reason noted for a give-up."""
    if "Fp8KvCache" not in ctx.policy.allowed_actions or kv_quantized(ctx):
        _declined(ctx, util, fit, context, "")
        return None
    if modelled:
        fp8 = ctx.engine.model_copy(update={"gpu_memory_utilization": util, "kv_cache_dtype": "fp8"})
        fit_fp8 = ctx.estimate(fp8).max_model_len_fit
    else:
        fit_fp8 = 2 * fit
    changes: dict[str, Any] = {"gpu_memory_utilization": util, "kv_cache_dtype": "fp8"}
    why = f" Its KV cache holds about {fit:,} tokens, short of max_model_len {context:,}, which may not be cut that far"
    if fit_fp8 * 0.97 >= context:
        return changes, f"{why}: an fp8 KV cache, twice the tokens a GiB, holds it."
    length = shorter_context(ctx, fit_fp8 * 0.97)
    if length is None:
        _declined(ctx, util, fit, context, f" ({fit_fp8:,} in fp8)")
        return None
    changes["max_model_len"] = length
    return changes, f"{why}: with an fp8 KV cache, twice the tokens a GiB, max_model_len -> {length:,}."


def _declined(ctx: Context, util: float, fit: int, context: int, fp8: str) -> None:
    """No cut: its reason noted, for a give-up."""
    bounds, allowed = ctx.policy.bounds, ctx.policy.allowed_actions
    shorter = "" if "LowerMaxModelLen" in allowed else "; LowerMaxModelLen is not allowed"
    ctx.declined.append(
        f"LowerGpuMemoryUtilization refused: utilization {util} leaves a KV cache of about {fit:,} tokens{fp8}, short "
        f"of max_model_len {context:,}, and no shorter context it holds is allowed (minMaxModelLen "
        f"{bounds.min_max_model_len:,}{shorter})"
    )


# vLLM's CPU backend sets the KV size from this variable over --kv-cache-memory-bytes (platforms/cpu.py).
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def fit_kv_bytes_to_free(ctx: Context) -> Remedy | None:
    free, requested = ctx.num("free_gib"), ctx.num("requested_gib")
    if free is None or any(e.name == CPU_KV_SPACE_ENV for e in ctx.spec.env):
        return None  # (the variable would override the flag: the change could not take effect)
    explicit = ctx.num("worker_budget_gib") is None  # vLLM was given the KV size, not sizing it itself
    if ctx.diag.subtype == "kv_space_exceeds_free_host_memory" and explicit and not ctx.engine.kv_cache_memory_bytes:
        return None  # a size the spec did not set came from the variable (envFrom, the image): it would win again
    # Only the CPU backend's refusal (its KV space against the node's free memory): on a GPU vLLM checks
    # total x utilization against what is free before anything else (request_memory), whether or not the
    # KV size is given, so a KV size with the same share is refused again.
    if ctx.diag.subtype != "kv_space_exceeds_free_host_memory":
        return None
    new_gib = math.floor((free * 0.75) * 4) / 4  # the KV alone must fit what is free, with margin
    if not math.isfinite(new_gib) or new_gib <= 0 or (requested is not None and new_gib >= requested):
        return None
    return Remedy(
        "SetKvCacheMemoryBytes",
        {"kv_cache_memory_bytes": int(new_gib * GIB)},
        f"{free:g} GiB was free; the KV cache is set to {new_gib:g} GiB so that it fits.",
    )
