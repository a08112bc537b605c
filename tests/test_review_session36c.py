"""Hostile review (session 36c) of the quantized fallback end to end, on the operator's own paths: what the
PatchSpec switch leaves in the spec (its modelConfig), pre-flight, the crash classifier's weights figure,
`plan --quantized-variant` against the heal's group formula, and status overrides. Seven strict xfails when
found, all fixed the same session (a declared width comes before a config that may be the replaced model's;
remedy.model.running_shape serves the heal, pre-flight and the classifier; model_weights.VARIABLE_WIDTH and the
4-bit QUANT_BYTES derive from the fallback's WIDTHS and quant_width; status's fallback only where allowed);
their docstrings still say what the code did. The plain tests are attacks that were defended."""

from __future__ import annotations

import copy
import json

import pytest

from vllm_autoheal import model_source
from vllm_autoheal.api import Deployed, HealPolicy, VLLMService
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube import resources
from vllm_autoheal.kube.crash import weights_per_gpu
from vllm_autoheal.kube.heal_apply import spec_patch
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import check, to_shape
from vllm_autoheal.plan_options import options
from vllm_autoheal.preflight import preflight
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy.model import fallback_shape
from vllm_autoheal.vllm_release import parse_version

from samples import CONFIGS

V025 = parse_version("0.25.0")
H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"
L70 = json.loads((CONFIGS / "llama-3.1-70b.json").read_text())
GPTQ8 = {"quant_method": "gptq", "bits": 8, "group_size": 128}
PRIMARY, INT4, INT8 = "org/L70-GPTQ-Int8", "org/L70-GPTQ-Int4", "org/L70-GPTQ-Int8"
KV_CRASH = Diagnosis(cause=Cause.KV_CACHE_INSUFFICIENT)


def _body(model: str, config: dict, fallback: dict, mode: str = "PatchSpec", status: dict | None = None) -> dict:
    heal = {"mode": mode, "allowedActions": ["Quantize", "LowerMaxModelLen"], "quantizedFallback": fallback}
    spec = {"model": model, "modelConfig": {"inline": config}, "heal": heal, "resources": {"gpuProduct": H100}}
    body = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "metadata": {"name": "s"}}
    return body | {"spec": spec} | ({"status": status} if status else {})


def _inv(shape, gpu: str = H100) -> Inventory:
    return Inventory(gpu_total_gib=lookup(gpu).memory_gib, gpu_name=gpu, shape=shape, release=V025)


def _shape(obj: VLLMService):
    resolved = model_source.for_service(obj, lambda _path: None)
    assert resolved.ok, resolved.error
    return resolved.shape


def _switched(body: dict) -> VLLMService:
    """The object after a weights OOM's Quantize heal is written into the spec (PatchSpec)."""
    obj = VLLMService.model_validate(body)
    remedy = plan_heal(obj.spec, Diagnosis(cause=Cause.WEIGHTS_LOAD_OOM), inventory=_inv(_shape(obj)))
    assert remedy.action == "Quantize", remedy.summary()
    target = Deployed(engine=remedy.apply(obj.spec.engine), model=remedy.changes["model"], memory_limit=None)
    patch = spec_patch(obj, target, obj.spec.engine.wire())
    out = copy.deepcopy(body)
    out["spec"].update(patch["spec"])
    return VLLMService.model_validate(out)


def test_after_a_patchspec_switch_the_primarys_inline_config_is_not_read_as_the_fallbacks():
    """Severity: high (the default mode and the Int8 -> Int4 pair 85a186a names; a heal that should cut the
    context gives up, and the service stays down).
    Input: Llama-3.1-70B GPTQ-Int8 (spec.modelConfig.inline, quant_method gptq, bits 8), one H100, vLLM 0.25;
    quantizedFallback org/L70-GPTQ-Int4, gptq_marlin, bits 4. Weights OOM -> Quantize (max_model_len 102,496):
    spec_patch writes spec.model := Int4 and the engine, and keeps spec.modelConfig. The next crash is
    kv_cache_insufficient with no figure printed.
    Now: model_source resolves the kept inline config (8 bits); plan.py's own= (spec.model is the fallback)
    lets that 8-bit width outrank the declared 4 bits: 69.2 GiB of weights, GiveUp. The same crash in
    StatusOverrides mode weighs 37 GiB and cuts the context.
    Right: the same heal in both modes (the switch drops or replaces the primary's modelConfig, or own= is
    only taken from a config that describes the fallback)."""
    fb = {"allowed": True, "model": INT4, "method": "gptq_marlin", "bits": 4}
    config = {**L70, "quantization_config": GPTQ8}
    patched = _switched(_body(PRIMARY, config, fb))
    assert patched.spec.model == INT4 and patched.spec.engine.quantization == "gptq_marlin"
    running = patched.spec.engine.model_copy(update={"max_model_len": None})
    r = plan_heal(patched.spec, KV_CRASH, inventory=_inv(_shape(patched)), engine=running)
    overridden = VLLMService.model_validate(_body(PRIMARY, config, fb, mode="StatusOverrides"))
    o = plan_heal(overridden.spec, KV_CRASH, inventory=_inv(_shape(overridden)), engine=running, model=INT4)
    assert o.action == "LowerMaxModelLen", o.summary()
    assert (r.action, r.changes) == (o.action, o.changes), r.summary()


def _int8_running():
    """spec.model is the 8-bit fallback (bits 8 declared) after a PatchSpec switch from bf16 Llama-3.1-70B,
    whose inline config stays; the engine as the switch wrote it, at a short context."""
    fb = {"allowed": True, "model": INT8, "method": "gptq_marlin", "bits": 8}
    engine = parse_args("--max-model-len 4096 --gpu-memory-utilization 0.95").engine
    body = _body("meta-llama/Llama-3.1-70B", L70, fb)
    body["spec"].update(model=INT8, engine=engine.model_copy(update={"quantization": "gptq_marlin"}).wire())
    obj = VLLMService.model_validate(body)
    heal_shape = fallback_shape(obj.spec.heal, _shape(obj), own=True)
    heal = estimate(heal_shape, obj.spec.engine, lookup(H100), None, "server", V025)
    return obj, heal


def test_preflight_weighs_the_running_fallback_at_its_declared_width():
    """Severity: medium (MemoryFit reports a KV cache 11x the real one; Fix acts on the wrong figure).
    Input: spec.model org/L70-GPTQ-Int8 with --quantization gptq_marlin, quantizedFallback naming it with
    bits 8, spec.modelConfig.inline the bf16 config (kept by the PatchSpec switch), one H100.
    Now: preflight() estimates the raw shape: weights 37.81 GiB, KV 34.49 GiB; plan_heal (fallback_shape)
    weighs 69.20 GiB and KV 3.10 GiB for the very same spec.
    Right: pre-flight weighs it as the heal does (within 0.1 GiB)."""
    obj, heal = _int8_running()
    result = preflight(obj.spec, lookup(H100), _shape(obj))
    assert result.estimate.weights_gib == pytest.approx(heal.weights_gib, abs=0.1)


def test_the_classifiers_weights_figure_is_not_a_guess_for_the_patched_fallback():
    """Severity: low (an unplaced OOM is weighed against half the weights that load: an OOM while loading
    them, holding 40-65 GiB, reads as a later step's).
    Input: as test_preflight_weighs_the_running_fallback_at_its_declared_width.
    Now: crash.weights_per_gpu(shape, engine) = 37.81 GiB (VARIABLE_WIDTH has gptq, not gptq_marlin).
    Right: None (as in StatusOverrides mode, where the model differs from spec.model), or 69.2."""
    obj, heal = _int8_running()
    figure = weights_per_gpu(_shape(obj), obj.spec.engine)
    assert figure is None or figure == pytest.approx(heal.weights_gib, abs=0.1), figure


@pytest.mark.parametrize("method", ["gptq", "bitsandbytes"])
def test_plans_quantized_variant_weighs_as_the_heal_does(method):
    """Severity: medium (plan is how a user picks quantizedFallback and minMaxModelLen; for bitsandbytes it
    promises 2.5x the context the heal then grants, a bound that makes the switch give up).
    Input: Llama-3.1-70B bf16, one L40S, --max-model-len 8192, `plan --quantized-variant METHOD`; the heal's
    quantizedFallback of METHOD with bits 4 (its default group).
    Now: weights 37.81 (gptq) / 36.85 (bitsandbytes) GiB in plan against 37.07 / 38.32 in the heal.
    Right: the same weights (within 0.1 GiB) and context for the same checkpoint."""
    shape, gpu, engine = to_shape(check(L70, config_file=True)), lookup(L40S), parse_args("--max-model-len 8192").engine
    planned = next(
        o.estimate
        for o in options(shape, engine, gpu, None, "server", [method], V025)
        if o.quantization == method and o.kv_cache_dtype == "auto" and o.tensor_parallel_size == 1
    )
    policy = HealPolicy(quantizedFallback={"allowed": True, "model": "org/q", "method": method, "bits": 4})
    healed = estimate(
        fallback_shape(policy, shape), engine.model_copy(update={"quantization": method}), gpu, None, "server", V025
    )
    assert planned.weights_gib == pytest.approx(healed.weights_gib, abs=0.1)
    assert planned.max_model_len_fit == pytest.approx(healed.max_model_len_fit, rel=0.05)


def _overridden(allowed: bool, model: str = "org/a-awq") -> VLLMService:
    fb = {"allowed": allowed, "model": model, "method": "awq"}
    status = {"baseline": {}, "effective": {"quantization": "awq"}, "effectiveModel": model}
    obj = VLLMService.model_validate(_body("org/a", L70, fb, mode="StatusOverrides", status=status))
    obj.status.baseline_for = resources.sized_for(obj)
    return obj


def test_a_disallowed_fallback_in_status_is_refused():
    """Severity: low (needs a writer of vllmservices/status, the threat overrides_refused exists for, or a
    fallback disallowed after it ran: the tenant's `allowed: false` does not take it back).
    Input: StatusOverrides, quantizedFallback {allowed: false, model org/a-awq, method awq}, status
    effectiveModel org/a-awq.
    Now: overrides_refused -> None; effective() deploys org/a-awq.
    Right: refused naming status.effectiveModel; spec.model deployed."""
    obj = _overridden(allowed=False)
    assert "effectiveModel" in (resources.overrides_refused(obj) or "")
    assert resources.effective(obj)[0] == "org/a"


def test_an_allowed_fallback_in_status_is_deployed_escaped():
    """Defended: a fallback named with $(VAR) reaches vLLM as written (the kubelet does not expand it)."""
    obj = _overridden(allowed=True, model="org/$(HF_TOKEN)")
    assert resources.overrides_refused(obj) is None
    command = json.dumps(resources.deployment(obj)["spec"]["template"]["spec"]["containers"][0])
    assert "org/$$(HF_TOKEN)" in command and "org/$(HF_TOKEN)" not in command.replace("$$", "")


def test_in_status_overrides_mode_the_running_fallback_is_weighed_at_its_declared_width():
    """Defended: the primary's GPTQ-Int8 config stays the spec model's; the running Int4 is weighed at 4 bits."""
    fb = {"allowed": True, "model": INT4, "method": "gptq_marlin", "bits": 4}
    obj = VLLMService.model_validate(_body(PRIMARY, {**L70, "quantization_config": GPTQ8}, fb, "StatusOverrides"))
    running = obj.spec.engine.model_copy(update={"quantization": "gptq_marlin"})
    r = plan_heal(obj.spec, KV_CRASH, inventory=_inv(_shape(obj)), engine=running, model=INT4)
    assert r.action == "LowerMaxModelLen" and 90_000 < r.changes["max_model_len"] < 110_000, r.summary()


def test_the_crds_group_size_description_names_the_defaults_the_code_uses():
    """Severity: low (kubectl explain is where a tenant reads it: an nf4 fallback's figure is not what it says).
    Input: QuantizedFallback.groupSize's description (rendered into the CRD) against quant_width.DEFAULT_GROUPS.
    Now: "Unset, 128: the default of AutoGPTQ, ..." only; DEFAULT_GROUPS {(compressed-tensors, 8): -1,
    (bitsandbytes, 8): -1, (bitsandbytes, 4): 64}, as README's weights_load_oom row says.
    Right: the description names the per-method defaults (nf4's 64 at least)."""
    from vllm_autoheal.api.heal_policy import QuantizedFallback

    description = QuantizedFallback.model_fields["group_size"].description or ""
    assert "bitsandbytes" in description and "64" in description, description
