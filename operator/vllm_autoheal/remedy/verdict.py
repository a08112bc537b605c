"""The memory model's verdict on a planned change: what it expects of the changed flags (a remedy's
`expected`), and the veto of a change it says still cannot start."""

from __future__ import annotations

from typing import Any

from ..api import EngineArgs
from ..memory import FIXED_WIDTH
from .model import Context, Remedy


def expected(ctx: Context, changes: dict[str, Any]) -> str:
    """The memory model's verdict on the changed flags, when it knows the model and GPU."""
    if ctx.inv.shape is None or not ctx.total:
        return ""
    if not _weighed(changes):
        return f"The memory model does not weigh a {changes['quantization']} checkpoint: its method does not fix its width."
    after = ctx.engine.model_copy(update={k: v for k, v in changes.items() if k in EngineArgs.model_fields})
    est = ctx.estimate(after, ctx.inv.gpu_free_gib)
    verdict = "fits" if est.fits else f"still fails: {'; '.join(est.reasons)}"
    return (
        f"KV cache {est.kv_cache_gib:.2f} GiB holds {est.kv_tokens:,} tokens for max_model_len "
        f"{est.max_model_len:,} ({verdict})."
    )


# Changes to the GPU count or the container are not the memory model's to veto (the split's step
# consults it itself; host RAM is not its to weigh). The quantized fallback is, where its method fixes
# its width: the named checkpoint weighed as the model's shape at that width (`expected` says the same).
_NOT_VETOED = {"IncreaseTensorParallel", "RaiseMemoryLimit"}


def _weighed(changes: dict[str, Any]) -> bool:
    """Whether the memory model can weigh these changes: not a checkpoint whose width its method leaves open."""
    return "model" not in changes or changes.get("quantization") in FIXED_WIDTH


_MEMORY_MODEL_CAUSES = {"kv_cache_insufficient", "weights_load_oom", "gpu_util_exceeds_free"}


def cannot_fit(ctx: Context, remedy: Remedy) -> str | None:
    """A change the memory model says still cannot start is never tried: a restart costs minutes.
    Only where the model's shape and the GPU are known, and for the causes it predicts well."""
    if (
        ctx.inv.shape is None
        or not ctx.total
        or remedy.action in _NOT_VETOED
        or not _weighed(remedy.changes)
        or ctx.diag.cause not in _MEMORY_MODEL_CAUSES
        or _sized_by_vllm(ctx, remedy)
    ):
        return None
    after = ctx.engine.model_copy(update={k: v for k, v in remedy.changes.items() if k in EngineArgs.model_fields})
    est = ctx.estimate(after, ctx.inv.gpu_free_gib)
    if est.fits or (remedy.action == "Quantize" and est.failure == "cudagraph_capture_oom"):
        return None  # (the quantized weights and cache fit: the graphs' margin is plan._with_room_for_graphs's)
    return f"the memory model says it still does not fit ({'; '.join(est.reasons)[:200]})"


def _sized_by_vllm(ctx: Context, remedy: Remedy) -> bool:
    """vLLM's own figures for this very run outrank the memory model's estimate."""
    needs = {
        "LowerMaxModelLen": ("estimated_max_model_len", "kv_tokens"),
        "RaiseGpuMemoryUtilization": ("needed_gib",),
        "LowerGpuMemoryUtilization": ("free_gib",),
        "LowerMaxNumSeqs": ("mamba_blocks",),
    }
    return any(ctx.num(key) is not None for key in needs.get(remedy.action, ()))
