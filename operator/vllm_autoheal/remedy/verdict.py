"""The memory model's verdict on a planned change: what it expects of the changed flags (a remedy's
`expected`), and the veto of a change it says still cannot start."""

from __future__ import annotations

from typing import Any

from ..api import EngineArgs
from ..api.heal_policy import WIDTHS
from ..memory import ModelShape
from .model import Context, Remedy


def expected(ctx: Context, changes: dict[str, Any]) -> str:
    """The memory model's verdict on the changed flags, when it knows the model and GPU."""
    if ctx.inv.shape is None or not ctx.total:
        return ""
    weighed, shape = _weighed(ctx, changes)
    if not weighed:
        method = changes["quantization"]
        declare = " (spec.heal.quantizedFallback.bits declares it)" if method in WIDTHS else ""
        return f"The memory model does not weigh a {method} checkpoint: its method does not fix its width{declare}."
    after = ctx.engine.model_copy(update={k: v for k, v in changes.items() if k in EngineArgs.model_fields})
    est = ctx.estimate(after, ctx.inv.gpu_free_gib, shape)
    verdict = "fits" if est.fits else f"still fails: {'; '.join(est.reasons)}"
    # (a windowed or state layer's cache does not grow with the context: one request may then be longer than
    # the tokens vLLM counts)
    longest = f", one request of up to {est.max_model_len_fit:,}," if est.max_model_len_fit != est.kv_tokens else ""
    return (
        f"KV cache {est.kv_cache_gib:.2f} GiB holds {est.kv_tokens:,} tokens{longest} for max_model_len "
        f"{est.max_model_len:,} ({verdict})."
    )


# Changes to the GPU count or the container are not the memory model's to veto (the split's step
# consults it itself; host RAM is not its to weigh). The quantized fallback is, where its method fixes
# its width or the policy declares it: the named checkpoint weighed as the model's shape at that width
# (`expected` says the same).
_NOT_VETOED = {"IncreaseTensorParallel", "RaiseMemoryLimit"}


def _weighed(ctx: Context, changes: dict[str, Any]) -> tuple[bool, ModelShape | None]:
    """Whether the memory model can weigh these changes, and the shape it weighs them as (None: the
    model's): a change of checkpoint is the quantized fallback, weighed only at a width that is known."""
    if "model" not in changes:
        return True, None
    shape = ctx.fallback_shape()
    return shape is not None, shape


_MEMORY_MODEL_CAUSES = {"kv_cache_insufficient", "weights_load_oom", "gpu_util_exceeds_free"}


def cannot_fit(ctx: Context, remedy: Remedy) -> str | None:
    """A change the memory model says still cannot start is never tried: a restart costs minutes.
    Only where the model's shape and the GPU are known, and for the causes it predicts well."""
    weighed, shape = _weighed(ctx, remedy.changes)
    if (
        ctx.inv.shape is None
        or not ctx.total
        or remedy.action in _NOT_VETOED
        or not weighed
        or (ctx.diag.cause not in _MEMORY_MODEL_CAUSES and not _onto_the_gpu(ctx, remedy))
        or _sized_by_vllm(ctx, remedy)
    ):
        return None
    after = ctx.engine.model_copy(update={k: v for k, v in remedy.changes.items() if k in EngineArgs.model_fields})
    est = ctx.estimate(after, ctx.inv.gpu_free_gib, shape)
    if est.fits or (remedy.action == "Quantize" and est.failure == "cudagraph_capture_oom"):
        return None  # (the quantized weights and cache fit: the graphs' margin is plan._with_room_for_graphs's)
    return f"the memory model says it still does not fit ({'; '.join(est.reasons)[:200]})"


def _onto_the_gpu(ctx: Context, remedy: Remedy) -> bool:
    """Whether the change moves offloaded weights back onto the GPU (less cpu_offload_gb), whatever the cause."""
    cut = remedy.changes.get("cpu_offload_gb")
    return isinstance(cut, int | float) and cut < (ctx.engine.cpu_offload_gb or 0.0)


def _sized_by_vllm(ctx: Context, remedy: Remedy) -> bool:
    """vLLM's own figures for this very run outrank the memory model's estimate."""
    needs = {
        "LowerMaxModelLen": ("estimated_max_model_len", "kv_tokens"),
        "RaiseGpuMemoryUtilization": ("needed_gib",),
        "LowerGpuMemoryUtilization": ("free_gib",),
        "LowerMaxNumSeqs": ("mamba_blocks",),
    }
    return any(ctx.num(key) is not None for key in needs.get(remedy.action, ()))
