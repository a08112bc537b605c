"""The steps that ask the scheduler for more than ran before (more GPUs, more memory): each sized
to the smallest change that the figures say fits, since every try is a reschedule and a model load
(the host memory's are host_steps.py's)."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..api import EngineArgs
from ..gpu_catalog import one_device_a_process
from ..memory import CUDA_CONTEXT_GIB, Estimate
from ..quantity import format_bytes
from ..remedy_gate import utilization_floor
from .kv_steps import raise_limit, shorter_context, smaller_fixed_cache
from .model import Context, Remedy
from .share_steps import HOST_MEMORY_SUBTYPES, share_of_free


def more_tensor_parallel(ctx: Context) -> Remedy | None:
    """The smallest doubling within the bound that the model splits into and, where the memory model
    knows the model and GPU, that it says fits: 1 -> 2 -> 4 -> 8 blind would load a model that does
    not fit several times over. Where no split fits at the share that ran, the smallest that fits at
    the share the bounds and free memory allow comes with that share, in the same restart (a split's
    weights alone can fill a low share: the split by itself would crash on the KV cache)."""
    tp, limit = ctx.engine.tensor_parallel_size, ctx.policy.bounds.max_tensor_parallel_size
    if one_device_a_process(ctx.inv.gpu_name):
        return None  # (unsplittable says why)
    sizes = []
    new = tp * 2
    while limit and new <= limit and (ctx.inv.shape is None or ctx.inv.shape.splits(new)):
        sizes.append(new)
        new *= 2
    if not sizes:
        return None
    shape, total, pick = ctx.inv.shape, ctx.total, sizes[0]
    if ctx.diag.cause == "gpu_util_exceeds_free":  # (the share that ran asked for more than was free)
        if ctx.diag.subtype in HOST_MEMORY_SUBTYPES or shape is None or not total:
            return None  # (CPU ranks of one node share its memory: a split asks for more of it, not less)
        return _split_at_share(ctx, sizes)
    if shape is not None and total:
        estimates = [(n, _split(ctx, n)) for n in sizes]
        # (the graphs' margin is another heal's: the split is judged by its weights and cache)
        fits = [n for n, est in estimates if est.failure in (None, "cudagraph_capture_oom")]
        if not fits:
            return _split_at_share(ctx, sizes) or _split_with_shorter_context(ctx, estimates)
        pick = fits[0]
    return Remedy(
        "IncreaseTensorParallel",
        {"tensor_parallel_size": pick, **_offload_change(ctx, pick)},
        f"split the model over {pick} GPUs: 1/{pick // tp} of the weights per GPU"
        + (" (the smallest split the memory model says fits)" if pick != sizes[0] else "")
        + _offload_note(ctx, pick)
        + ".",
    )


def unsplittable(ctx: Context) -> str | None:
    """Why no split within the bound is tried where the model's shape divides none of them (vLLM refuses
    such a split at load, a failure no memory heal undoes); None where one divides, or none is allowed."""
    tp, limit, shape = ctx.engine.tensor_parallel_size, ctx.policy.bounds.max_tensor_parallel_size, ctx.inv.shape
    sizes = [tp * 2**k for k in range(1, 7) if tp * 2**k <= (limit or 0)]
    if sizes and (why := one_device_a_process(ctx.inv.gpu_name)):
        return f"the pod's GPUs are {ctx.inv.gpu_name}: {why}, so vLLM cannot split over them"
    if shape is None or not sizes or any(shape.splits(n) for n in sizes):
        return None
    named = " or ".join(str(n) for n in sizes)
    return f"the model does not split {named} ways (its heads, Mamba groups or quantization groups: vLLM refuses it)"


def offload_ignored_note(ctx: Context) -> str | None:
    """Why no offload change is made where the release runs this model on a V2 runner that ignores the flag."""
    shape, release = ctx.inv.shape, ctx.inv.release
    if shape is None or release is None or not ctx.offload_ignored():
        return None
    return (
        f"vLLM {release} runs {shape.architecture} on its V2 model runner, which ignores --cpu-offload-gb (every "
        "weight stays on the GPU; fixed from 0.29.0)"
    )


def split_offload(ctx: Context, n: int) -> float | None:
    """cpu_offload_gb for the engine split n ways: vLLM's figure is per GPU, so each new rank pins it too.
    Where the container's limit (or the bound) holds that for every rank, it stays; else the most that
    it holds, and never less than the share of what ran (the host memory that ran, spread over n ranks:
    each GPU also holds tp/n of the weights it did). None where nothing is offloaded."""
    offload = ctx.engine.cpu_offload_gb
    if not offload or offload_ignored_note(ctx):
        return None  # (nothing offloaded, or an offload the release ignores: no change of it means anything)
    split = ctx.engine.model_copy(update={"tensor_parallel_size": n})
    cap = ctx.limits.max_cpu_offload_gb(split, ctx.inv.shape)
    if offload <= cap:
        return offload
    share = math.floor(offload * ctx.engine.tensor_parallel_size / n * 10) / 10
    bound = ctx.policy.bounds.max_cpu_offload_gb  # (the user's hard limit: below the share, less host memory)
    return min(max(math.floor(cap * 10) / 10, share), bound if bound is not None else math.inf)


def _offload_change(ctx: Context, n: int) -> dict[str, float]:
    offload = split_offload(ctx, n)
    return {} if offload is None or offload == ctx.engine.cpu_offload_gb else {"cpu_offload_gb": offload}


def _offload_note(ctx: Context, n: int) -> str:
    if not (change := _offload_change(ctx, n)):
        return ""
    new, ran = change["cpu_offload_gb"], ctx.engine.cpu_offload_gb or 0.0
    kept = new > ctx.limits.max_cpu_offload_gb(
        split_engine(ctx, n), ctx.inv.shape
    )  # (the share of what ran, above the cap)
    why = "the host memory that ran, over the ranks" if kept else "the most the memory limit and bounds hold"
    return f"; cpu_offload_gb {ran:g} -> {new:g} per GPU (vLLM pins it on each of the {n} ranks: {why})"


def split_engine(ctx: Context, n: int, **update: float | int) -> EngineArgs:
    """The engine split n ways (with `update`), its offload per GPU as split_offload says."""
    offload = _offload_change(ctx, n)
    return ctx.engine.model_copy(update={"tensor_parallel_size": n, **offload, **update})


def _split(ctx: Context, n: int, util: float | None = None, free: float | None = None) -> Estimate:
    """The memory model's estimate of the engine split n ways (at another share), beside `free` GiB
    (default: the probe's figure)."""
    update: dict[str, float | int] = {} if util is None else {"gpu_memory_utilization": util}
    return ctx.estimate(split_engine(ctx, n, **update), ctx.inv.gpu_free_gib if free is None else free)


def _split_at_share(ctx: Context, sizes: list[int]) -> Remedy | None:
    """The smallest split that fits with the utilization moved within what the bounds and free memory
    allow: up to the least share that fits (and 0.01 more), or down to what was free where the share
    that ran asked for more than that; never below the split's own floor (its weights, activations and
    a cache of minMaxModelLen). None where neither move is allowed or no split fits so."""
    current, tp = ctx.engine.gpu_memory_utilization, ctx.engine.tensor_parallel_size
    allowed, top = ctx.policy.allowed_actions, ctx.policy.bounds.max_gpu_memory_utilization
    share, free = None, None
    if ctx.diag.cause == "gpu_util_exceeds_free":  # the share that ran asked for more than was free
        share = share_of_free(ctx)
        if share is None or share[0] >= current or "LowerGpuMemoryUtilization" not in allowed:
            return None
        top, why = share[0], f"{share[2]}: utilization {current} -> at most {share[0]}"
        free = share[1] + CUDA_CONTEXT_GIB  # (each GPU of the split taken to have as little free)
    else:
        if "RaiseGpuMemoryUtilization" not in allowed or ctx.fixed_kv_gib() or _others_hold_memory(ctx):
            return None
        top = raise_limit(ctx)
        known = "the bounds and free memory allow" if ctx.inv.gpu_free_gib is not None else "the bounds allow"
        why = f"at utilization {current} its weights leave the KV cache too little; {top} is the most {known}"
    for n in sizes:
        split = split_engine(ctx, n)
        floor = utilization_floor(
            ctx.policy.bounds, split, ctx.inv.shape, ctx.total, ctx.inv.entrypoint, ctx.inv.gpu_name, ctx.inv.release
        )
        low = max(floor or 0.0, current + 0.01 if share is None else 0.0)

        def fits(u: float, n: int = n) -> bool:
            return _split(ctx, n, u, free).failure in (None, "cudagraph_capture_oom")

        if share is not None:
            util = top if low <= top and fits(top) else None
        else:
            least = _least_share(fits, low, top)
            util = None if least is None else min(least + 0.01, top)
        if util is not None:
            return Remedy(
                "IncreaseTensorParallel",
                {"tensor_parallel_size": n, "gpu_memory_utilization": round(util, 2), **_offload_change(ctx, n)},
                f"split the model over {n} GPUs: 1/{n // tp} of the weights per GPU; {why}, and by the memory "
                f"model the split fits at utilization {round(util, 2)}, set in the same change"
                f"{_offload_note(ctx, n)}.",
            )
    return None


def _least_share(fits: Callable[[float], bool], low: float, top: float) -> float | None:
    """The least utilization from `low` to `top`, in steps of 0.01, at which `fits` says the start fits."""
    steps = (round(low + step / 100, 2) for step in range(round((top - low) * 100) + 1))
    return next((u for u in steps if low <= u <= top and fits(u)), None)  # (rounded: never past either end)


def _others_hold_memory(ctx: Context) -> bool:
    """Whether, with nothing saying what is free, the crash itself shows memory held by others: the
    weights failed to load where the memory model says the flags that ran hold them on an empty GPU.
    A raise sized as though the GPU were the pod's alone would then ask for what is not there."""
    if ctx.inv.gpu_free_gib is not None or ctx.diag.cause != "weights_load_oom" or ctx.num("weights_gib"):
        return False  # (weights vLLM printed it loaded left the cache nothing: no sign of others)
    return ctx.estimate(ctx.engine, None).failure != "weights_load_oom"


def _split_with_shorter_context(ctx: Context, estimates: list[tuple[int, Estimate]]) -> Remedy | None:
    """None keeps the whole context: the smallest split that holds the weights, with the context its KV
    cache holds (3% margin), in the same restart, where that is allowed."""
    tp = ctx.engine.tensor_parallel_size
    for n, est in estimates:
        if est.failure == "kv_cache_insufficient" and (length := shorter_context(ctx, est.max_model_len_fit * 0.97)):
            return Remedy(
                "IncreaseTensorParallel",
                {"tensor_parallel_size": n, "max_model_len": length, **_offload_change(ctx, n)},
                f"split the model over {n} GPUs: 1/{n // tp} of the weights per GPU; no split within "
                f"the bound keeps the context, and by the memory model (3% margin) this one's KV cache "
                f"holds {length:,} tokens: max_model_len -> {length:,}{_offload_note(ctx, n)}.",
            )
    return None  # none within the bound holds it (plan.what_would_fit says what would)


def quantized_model(ctx: Context) -> Remedy | None:
    """The quantized checkpoint the policy names. Where the memory model can weigh it (the model's shape at
    a width its method fixes or the policy declares: Context.fallback_shape) and says its start still falls
    short of the KV cache one request needs, the least utilization the bounds and free memory allow that fits
    comes with it, else the context its cache holds (3% margin), in the same restart; where neither does,
    verdict.cannot_fit refuses it, saying why."""
    fb = ctx.policy.quantized_fallback
    if not fb.allowed or not fb.model or ctx.spec.model == fb.model:
        return None
    changes: dict[str, object] = {"model": fb.model, "quantization": fb.method}
    reason = f"the weights do not fit; switching to the quantized {fb.model} ({fb.method}) the policy names"
    shape = ctx.fallback_shape()
    if shape is None or not ctx.total:
        return Remedy("Quantize", changes, reason + ".")
    quantized = ctx.engine.model_copy(update={"quantization": fb.method})
    est = ctx.estimate(quantized, ctx.inv.gpu_free_gib, shape)
    if est.failure != "kv_cache_insufficient":
        return Remedy("Quantize", changes, reason + ".")  # (fits, or its weights do not: the veto's to say)
    current, top = ctx.engine.gpu_memory_utilization, raise_limit(ctx)
    if ctx.limits.ceiling is not None:  # (a share that ran out of memory while serving: never back to it)
        top = min(top, round(ctx.limits.ceiling - 0.01, 2))
    raise_ok = "RaiseGpuMemoryUtilization" in ctx.policy.allowed_actions and not ctx.fixed_kv_gib()

    def fits(u: float) -> bool:  # (as a split's: the graphs' margin is another heal's)
        at = ctx.estimate(quantized.model_copy(update={"gpu_memory_utilization": u}), ctx.inv.gpu_free_gib, shape)
        return at.failure in (None, "cudagraph_capture_oom")

    if (
        raise_ok
        and not _others_hold_memory(ctx)
        and (least := _least_share(fits, round(current + 0.01, 2), top)) is not None
    ):
        util = min(round(least + 0.01, 2), top)  # (as a split's share: the model's 1% of margin)
        return Remedy(
            "Quantize",
            {**changes, "gpu_memory_utilization": util},
            f"{reason}; by the memory model its KV cache holds one request of the context from utilization "
            f"{least} ({current} leaves {est.max_model_len_fit:,} tokens): {util}, set in the same change.",
        )
    if length := shorter_context(ctx, est.max_model_len_fit * 0.97):
        return Remedy(
            "Quantize",
            {**changes, "max_model_len": length},
            f"{reason}; by the memory model (3% margin) its KV cache holds {length:,} tokens within the bounds: "
            f"max_model_len -> {length:,}, in the same change.",
        )
    return Remedy("Quantize", changes, reason + ".")


def shrink_fixed_kv_cache(ctx: Context) -> Remedy | None:
    """A GPU out of memory while serving where the KV cache's size was fixed: a utilization cut changes
    nothing vLLM allocates ("This does not respect the gpu_memory_utilization config"), so the cache itself
    gives up what failed to allocate and 0.5 GiB, with the context the smaller cache holds (same restart)."""
    fixed, tried = ctx.fixed_kv_gib(), ctx.num("tried_gib")
    if fixed is None or ctx.inv.host_kv_cache:
        return None
    smaller = smaller_fixed_cache(ctx, fixed - (tried or 0.0) - 0.5, fixed)
    if smaller is None:
        return None
    changes, why = smaller
    basis = f"{tried:g} GiB failed to allocate" if tried else "no allocation size was printed"
    return Remedy(
        "SetKvCacheMemoryBytes",
        changes,
        f"{basis} beside a KV cache fixed at {fixed:.2f} GiB, which the utilization does not size; the cache "
        f"-> {format_bytes(int(changes['kv_cache_memory_bytes']))}.{why}",
    )
