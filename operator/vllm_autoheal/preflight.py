"""Pre-flight: will this spec fit this GPU, and if not, which flags would (Fix mode)?

The memory model predicts the failure vLLM would print; the remedy planner then
treats that prediction like a real crash. So pre-flight and healing share one
set of rules, and a `Fix` start is what a heal would have reached, minus the crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .api import EngineArgs, VLLMServiceSpec
from .diagnosis import Diagnosis
from .diagnosis.model import Cause, EnginePhase
from .engine_defaults import speculative_method
from .flag_tokens import flag_name
from .gpu_catalog import GpuSpec
from .lora_slots import lora_problem, lora_slots_gib
from .memory import Estimate, ModelShape, estimate
from .quantity import parse_quantity
from .remedy import Inventory, Remedy, plan_heal
from .remedy.model import running_shape

MAX_FIX_STEPS = 6
# Fix's flags are the engine alone (status.effective): a step that also changes the checkpoint or
# the memory limit would start half of itself (`--quantization awq` on the unquantized model).
BEYOND_ENGINE = frozenset({"Quantize", "RaiseMemoryLimit"})


@dataclass
class PreflightResult:
    fits: bool
    estimate: Estimate
    engine: EngineArgs  # the flags to start with (changed only in Fix mode)
    steps: list[Remedy] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    unweighed: str | None = None  # what the flags load that the memory model does not weigh: no fit can be told

    @property
    def changed(self) -> bool:
        return bool(self.steps)


def predicted_diagnosis(est: Estimate, engine: EngineArgs, fewest_seqs: int = 1) -> Diagnosis:
    """The diagnosis vLLM's own message would give for the memory model's predicted failure.
    `fewest_seqs`: the heal's bound, which the model's margin does not push blocks below."""
    numbers: dict[str, float | int] = {}
    subtype = None
    if est.failure == "kv_cache_insufficient" and est.kv_budget_gib <= 0 and not engine.kv_cache_memory_bytes:
        # as vLLM reports a budget with no block (its budget line, unclamped, then "No available memory for
        # the cache blocks"): the heal grows the budget from it, with the context the grown cache holds
        subtype, numbers = "no_cache_blocks", {"available_kv_gib": round(est.kv_budget_gib, 2)}
    elif (
        est.failure == "kv_cache_insufficient" and est.state_blocks is not None and est.state_blocks < est.max_num_seqs
    ):
        subtype = "state_blocks_below_max_num_seqs"  # as vLLM's refusal reads
        # (the model's 3 % error margin, but not below the bound where the blocks counted reach it:
        # else Fix gives up, or grows the cache, where the bound's sequences fit)
        blocks = max(int(est.state_blocks * 0.97), min(est.state_blocks, fewest_seqs))
        numbers = {"max_num_seqs": est.max_num_seqs, "mamba_blocks": blocks}
    elif est.failure == "kv_cache_insufficient":
        numbers = {
            "max_seq_len": est.max_model_len,
            "available_gib": round(est.kv_cache_gib, 2),
            "needed_gib": round(est.kv_needed_gib, 2),
        }
        if est.max_model_len_fit > 0:  # (the model's 3 % error margin, but not on a cache of the size given)
            margin = 1.0 if engine.kv_cache_memory_bytes else 0.97
            numbers["estimated_max_model_len"] = int(est.max_model_len_fit * margin)
    elif est.failure == "gpu_util_exceeds_free":
        numbers = {
            "free_gib": round(est.gpu_free_gib, 2),
            "total_gib": est.gpu_total_gib,
            "util": engine.gpu_memory_utilization,
            "requested_gib": round(est.requested_gib, 2),
        }
    return Diagnosis(
        cause=Cause(est.failure or Cause.UNKNOWN),
        phase=EnginePhase.PREDICTED,
        subtype=subtype,
        numbers=numbers,
        evidence=est.reasons[:2],
        confidence="medium",
        source="memory-model",
    )


# Speculative methods that load no weights of their own (the rest load a drafter, or the model's MTP layers, in the
# budget of the model, and put its layers in the same KV cache)
WEIGHTLESS_DRAFTS = frozenset({"ngram", "suffix"})


def unsplittable(shape: ModelShape, tp: int) -> str | None:
    """Why vLLM refuses this tensor-parallel size for the model at load (ModelShape.splits), or None."""
    if shape.splits(tp):
        return None
    kv = shape.kv_heads or shape.heads
    blocks = f", or its fp8 weights' blocks of {shape.weight_block[0]}" if shape.weight_block else ""
    return (
        f"--tensor-parallel-size {tp} does not split the model's {shape.heads} attention heads and {kv} KV heads"
        f"{blocks}: vLLM refuses it"
    )


def draft_problem(engine: EngineArgs) -> str | None:
    """Why vLLM refuses --speculative-config's value at start (a whole value that is no JSON object), or None."""
    args = engine.extra_args or []
    for i, token in enumerate(args):
        head, dot, _ = (flag_name(token) or "").partition(".")
        if dot or head not in ("--speculative-config", "--speculative_config", "-sc"):
            continue
        value = token.partition("=")[2] if "=" in token else args[i + 1] if i + 1 < len(args) else ""
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return f"--speculative-config {value[:40]!r} is no JSON object, which vLLM requires"
    return None


def _unweighed(shape: ModelShape, engine: EngineArgs) -> str | None:
    """What the flags load that the memory model does not weigh: a draft model, LoRA slots it cannot lay out."""
    method = speculative_method(engine.extra_args or [])
    if method is not None and method not in WEIGHTLESS_DRAFTS:
        return f"the speculative decoding draft ({method or 'a draft model'}) loads weights the memory model does not weigh"
    if lora_slots_gib(shape, engine) is None:
        return "the LoRA adapter slots of this model's layers (or flags) are not weighed"
    return None


def _memory_limit(spec: VLLMServiceSpec) -> int | None:
    try:
        return parse_quantity(spec.resources.limits.memory) if spec.resources.limits.memory else None
    except ValueError:  # (the CRD's pattern refuses it first)
        return None


def preflight(
    spec: VLLMServiceSpec, gpu: GpuSpec, shape: ModelShape, free_gib: float | None = None, entrypoint: str = "server"
) -> PreflightResult:
    engine, release = spec.engine, spec.release()
    shape = running_shape(spec, spec.model, engine, shape)[1] or shape  # (a fallback a PatchSpec heal switched to)
    est = estimate(shape, engine, gpu, free_gib, entrypoint, release)
    result = PreflightResult(fits=est.fits, estimate=est, engine=engine, reasons=list(est.reasons))
    refused = unsplittable(shape, engine.tensor_parallel_size) or lora_problem(engine) or draft_problem(engine)
    if refused:  # (vLLM refuses it at start, whatever the memory)
        result.fits, result.reasons = False, [refused, *result.reasons]
        return result
    unweighed = _unweighed(shape, engine)
    if unweighed:  # (no fit claimed, and no flags sized to the GiB without it: they would start into the crash)
        result.fits, result.unweighed = False, unweighed
        result.reasons = [f"cannot tell: {unweighed}; a heal sizes the flags from vLLM's own figures", *result.reasons]
        return result
    if est.fits or spec.preflight != "Fix":
        return result
    inventory = Inventory(
        gpu_total_gib=gpu.memory_gib,
        gpu_name=gpu.name,
        gpu_free_gib=free_gib,
        shape=shape,
        entrypoint=entrypoint,
        release=release,
        memory_limit_bytes=_memory_limit(spec),  # (what an offload may pin: offload_pinned.py)
    )
    history: list[dict] = []
    for _ in range(MAX_FIX_STEPS):
        diag = predicted_diagnosis(est, engine, spec.heal.bounds.min_max_num_seqs)
        remedy = plan_heal(spec, diag, history, inventory, engine, exclude=BEYOND_ENGINE)
        if remedy.gives_up:
            result.reasons.append(f"no fitting flags within the heal bounds: {remedy.reason}")
            break
        history.append({"cause": diag.cause, "action": remedy.action})
        engine = remedy.apply(engine)
        result.steps.append(remedy)
        est = estimate(shape, engine, gpu, free_gib, entrypoint, release)
        if est.fits:
            break
    result.engine, result.estimate, result.fits = engine, est, est.fits
    return result
