"""What a give-up says would fit: the weights against what one GPU can give them, and the split or
checkpoint that would hold them, sized from vLLM's figures or the memory model."""

from __future__ import annotations

from ..diagnosis.arithmetic import besides_weights
from ..gpu_catalog import one_device_a_process
from ..memory import CUDA_CONTEXT_GIB
from .kv_steps import raise_limit
from .model import Context
from .share_steps import HOST_MEMORY_SUBTYPES
from .steps import halving_short


def weights_beyond_gpu(ctx: Context) -> tuple[float, float] | None:
    """(weights, the most this GPU can give them), GiB per GPU, where the weights (vLLM's printed
    figure, else the memory model's) take more than the bounds' highest utilization leaves beside
    what vLLM needs besides them; None otherwise, or where either is not known."""
    if ctx.diag.cause not in ("weights_load_oom", "kv_cache_insufficient"):
        return None
    weights = _weights_per_gpu(ctx)
    total = ctx.total
    if not weights or not total:
        return None
    # beside the weights: the activation peak and non-torch memory vLLM printed and a short context's
    # cache (0.25 GiB), else about 2 GiB and the CUDA context
    printed = besides_weights(ctx.diag.numbers)
    beside = printed + 0.25 if printed is not None else CUDA_CONTEXT_GIB + 2.0
    budget = ctx.policy.bounds.max_gpu_memory_utilization * total - beside
    return (weights, budget) if weights > budget else None


def what_would_fit(ctx: Context) -> str:
    """For a give-up on weights: what would hold them, sized from vLLM's figures (or the memory model)."""
    beyond = weights_beyond_gpu(ctx)
    if beyond is None:
        return ""
    weights, budget = beyond
    tp = ctx.engine.tensor_parallel_size
    need = _smallest_split_that_fits(ctx)
    if need is None:
        need = tp
        while need <= 64 and weights * tp / need > budget * 0.75:  # blind: leave a quarter for the KV cache
            need *= 2
    while need <= 64 and weights * tp / need > budget:  # (the model's split must hold the weights vLLM printed)
        need *= 2
    shape = ctx.inv.shape
    if one_device_a_process(ctx.inv.gpu_name):  # (a MIG slice, a time-sliced replica: no split over them)
        return _no_split_holds(
            ctx, weights, budget, "tensor parallelism over whole GPUs (a process sees one of these: no split over them)"
        )
    if need > 64 or (shape is not None and not shape.splits(need)):  # (vLLM refuses it at load)
        return _no_split_holds(ctx, weights, budget)
    split = f"tensor parallelism {need} ({weights * tp / need:.1f} GiB of weights per GPU"
    actions = ctx.policy.allowed_actions
    if need <= (ctx.policy.bounds.max_tensor_parallel_size or 1) and "IncreaseTensorParallel" in actions:
        # (allowed, so tried, refused, set aside, or short of a share the actions allow: the reason says)
        split += "; within the bounds"
        if "RaiseGpuMemoryUtilization" not in actions and _split_needs_a_raise(ctx, need):
            split += ", but its KV cache needs a larger share: allow RaiseGpuMemoryUtilization"
        split += ")"
    else:
        split += (
            "; allow it with spec.heal.bounds.maxTensorParallelSize and IncreaseTensorParallel in "
            f"spec.heal.allowedActions, or serve --max-tensor-parallel-size {need}"
        )
        if _split_needs_a_raise(ctx, need):  # (the heal then sets the share too, where a raise is allowed)
            split += f"; its KV cache needs utilization up to {raise_limit(ctx)}"
            if "RaiseGpuMemoryUtilization" not in actions:
                split += ": allow RaiseGpuMemoryUtilization too"
        split += ")"
    return _no_split_holds(ctx, weights, budget, split)


def _no_split_holds(ctx: Context, weights: float, budget: float, split: str = "") -> str:
    """The give-up's sentence: the split that would hold the weights (none where no split the heads
    divide does), or an 8-bit checkpoint."""
    options = [split] if split else []
    if weights / 2 <= budget * 0.75:
        options.append(f"an 8-bit checkpoint (about {weights / 2:.1f} GiB; name it in spec.heal.quantizedFallback)")
    head = (
        f"The weights take {weights:.1f} GiB per GPU, more than the {budget:.1f} GiB this GPU can give them: "
        f"no flag on {ctx.engine.tensor_parallel_size} GPU(s) makes them fit"
    )
    if not options:
        return head + ", and no tensor-parallel split the model's heads divide holds them."
    return head + ". What would: " + ", or ".join(options) + "."


def weights_beyond_free(ctx: Context) -> str:
    """For a give-up on a free-memory refusal: the weights (vLLM's figure, else the memory model's) against what
    other processes leave on the GPU (vLLM's printed figure, else the probe's before the start, less vLLM's
    CUDA context), where no share can hold them."""
    if ctx.diag.cause != "gpu_util_exceeds_free" or ctx.diag.subtype in HOST_MEMORY_SUBTYPES:
        return ""
    if ctx.engine.cpu_offload_gb and not ctx.offload_ignored():  # (what stays on the GPU is not weighed: no claim)
        return ""
    free = ctx.num("free_gib")
    if free is None and ctx.inv.gpu_free_gib is not None:
        free = ctx.inv.gpu_free_gib - CUDA_CONTEXT_GIB
    weights = _weights_per_gpu(ctx)
    if free is None or not weights or weights <= free:
        return ""
    return (
        f"The weights take {weights:.1f} GiB per GPU, more than the {max(free, 0.0):.2f} GiB other processes leave "
        "free on it: no share makes them fit. Free that memory, or run where more is free."
    )


def allocation_out_of_reach(ctx: Context) -> str:
    """For a give-up on a start-up allocation that no halving brings within what was free: say so."""
    if not halving_short(ctx):
        return ""
    return (
        f"One start-up allocation asked for {ctx.num('tried_gib'):g} GiB of a {ctx.total:g} GiB GPU: halving the "
        "sequences or the batch at best halves it, which still does not fit, so no memory flag was changed."
    )


def _smallest_split_that_fits(ctx: Context) -> int | None:
    """The smallest doubling of the split (up to 64) that the model splits into and that the memory model
    says fits at the share that ran or at the most a raise may set (the bounds' highest, within free
    memory); None where the model or GPU is not known, or none fits. (The blind rule's quarter for the
    KV cache asked an H100 for TP 4 for Qwen2.5-72B at 8k, where TP 2 fits 22,784 tokens, as `plan` and
    the heal itself say.)"""
    shape = ctx.inv.shape
    if shape is None or not ctx.total:
        return None
    # (as the heal: at the share that ran, else at the most a raise may set, the bounds' and free memory's)
    shares = (ctx.engine.gpu_memory_utilization, raise_limit(ctx))
    n = ctx.engine.tensor_parallel_size * 2
    while n <= 64:
        for util in shares:
            split = ctx.engine.model_copy(update={"tensor_parallel_size": n, "gpu_memory_utilization": util})
            if shape.splits(n) and ctx.estimate(split, ctx.inv.gpu_free_gib).failure in (None, "cudagraph_capture_oom"):
                return n
        n *= 2
    return None


def _split_needs_a_raise(ctx: Context, n: int) -> bool:
    """Whether, by the memory model, the split n ways does not fit at the share that ran but does at
    the most a raise may set (the bounds' highest, within free memory: kv_steps.raise_limit, as the heal)."""
    if ctx.inv.shape is None or not ctx.total:
        return False
    split = ctx.engine.model_copy(update={"tensor_parallel_size": n})
    top = split.model_copy(update={"gpu_memory_utilization": raise_limit(ctx)})
    starts = (None, "cudagraph_capture_oom")  # (the graphs' room is a capture heal's, as for the split itself)
    free = ctx.inv.gpu_free_gib
    return ctx.estimate(split, free).failure not in starts and ctx.estimate(top, free).failure in starts


def _weights_per_gpu(ctx: Context) -> float | None:
    """The weights on one GPU: vLLM's printed figure, else the memory model's; None where neither is known."""
    weights = ctx.num("weights_gib")
    if weights is None and ctx.inv.shape is not None and ctx.total:
        weights = ctx.estimate().weights_gib
    return weights
