"""The steps that ask the scheduler for more than ran before (more GPUs, more memory): each sized
to the smallest change that the figures say fits, since every try is a reschedule and a model load."""

from __future__ import annotations

from ..diagnosis.units import MIB
from ..quantity import format_bytes, parse_quantity
from .kv_steps import shorter_context
from .model import Context, Remedy

VPA_RATIO, VPA_MIN_BUMP = 1.2, 100 * MIB  # Kubernetes VPA's OOM bump (DefaultOOMBumpUpRatio/MinBumpUp)


def more_tensor_parallel(ctx: Context) -> Remedy | None:
    """The smallest doubling within the bound that the model splits into and, where the memory model
    knows the model and GPU, that it says fits: 1 -> 2 -> 4 -> 8 blind would load a model that does
    not fit several times over."""
    tp, limit = ctx.engine.tensor_parallel_size, ctx.policy.bounds.max_tensor_parallel_size
    sizes = []
    new = tp * 2
    while limit and new <= limit and (ctx.inv.shape is None or ctx.inv.shape.splits(new)):
        sizes.append(new)
        new *= 2
    if not sizes:
        return None
    shape, total, pick = ctx.inv.shape, ctx.total, sizes[0]
    if shape is not None and total:
        estimates = [
            (n, ctx.estimate(ctx.engine.model_copy(update={"tensor_parallel_size": n}), ctx.inv.gpu_free_gib))
            for n in sizes
        ]
        # (the graphs' margin is another heal's: the split is judged by its weights and cache)
        fits = [n for n, est in estimates if est.failure in (None, "cudagraph_capture_oom")]
        if not fits:
            # None keeps the whole context: the smallest split that holds the weights, with the
            # context its KV cache holds (3% margin), in the same restart, where that is allowed.
            for n, est in estimates:
                if est.failure == "kv_cache_insufficient" and (
                    length := shorter_context(ctx, est.max_model_len_fit * 0.97)
                ):
                    return Remedy(
                        "IncreaseTensorParallel",
                        {"tensor_parallel_size": n, "max_model_len": length},
                        f"split the model over {n} GPUs: 1/{n // tp} of the weights per GPU; no split within "
                        f"the bound keeps the context, and by the memory model (3% margin) this one's KV cache "
                        f"holds {length:,} tokens: max_model_len -> {length:,}.",
                    )
            return None  # none within the bound holds it (plan.what_would_fit says what would)
        pick = fits[0]
    return Remedy(
        "IncreaseTensorParallel",
        {"tensor_parallel_size": pick},
        f"split the model over {pick} GPUs: 1/{pick // tp} of the weights per GPU"
        + (" (the smallest split the memory model says fits)." if pick != sizes[0] else "."),
    )


def raise_memory_limit(ctx: Context) -> Remedy | None:
    limit_text = ctx.policy.bounds.max_memory_limit
    used = ctx.inv.memory_limit_bytes
    if not limit_text or not used:
        return None
    new = max(int(used * VPA_RATIO), used + VPA_MIN_BUMP)
    cap = parse_quantity(limit_text)
    new = min(new, cap // MIB * MIB)  # whole MiB within the bound: format_bytes rounds up otherwise ("32G")
    if new <= used:
        return None
    return Remedy(
        "RaiseMemoryLimit",
        {"memory_limit": format_bytes(new)},
        f"the container was killed at its {format_bytes(used)} limit; raised VPA-style to "
        f"max(x1.2, +100Mi) = {format_bytes(new)} (bound {limit_text}).",
    )
