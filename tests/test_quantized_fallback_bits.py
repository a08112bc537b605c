"""A quantized fallback whose method leaves its width open (AWQ, GPTQ, bitsandbytes: 4 or 8 bits) is weighed
when spec.heal.quantizedFallback.bits declares the width: the heal brings the context its KV cache holds in
the same restart, and a checkpoint whose weights still do not fit is never tried. Unset, it is tried
unweighed, as before. The CRD refuses a width where the method fixes one or cannot be one figure."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import CONFIGS, config_shape

LLAMA70 = config_shape("llama-3.1-70b")
V025 = parse_version("0.25.0")
H100 = "NVIDIA-H100-80GB-HBM3"


def _weights_heal(gpu: str, method: str, bits: int | None, flags: str = "") -> object:
    """Llama-3.1-70B (bf16) out of memory loading its weights on one GPU, under the CRD's default heal
    policy (Quantize, LowerMaxModelLen and RaiseGpuMemoryUtilization among its actions, no split)."""
    fallback = {"allowed": True, "model": "org/Llama-3.1-70B-Instruct-quantized", "method": method}
    spec = VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B-Instruct",
        engine=parse_args(flags).engine,
        heal={"quantizedFallback": fallback | ({"bits": bits} if bits else {})},
    )
    inv = Inventory(gpu_total_gib=lookup(gpu).memory_gib, gpu_name=gpu, shape=LLAMA70, release=V025)
    return plan_heal(spec, Diagnosis(cause=Cause.WEIGHTS_LOAD_OOM), inventory=inv)


def test_a_declared_4_bit_awq_fallback_comes_with_the_context_its_cache_holds():
    """On an H100 the 4-bit weights fit but their KV cache holds fewer than the default 131,072 tokens:
    unweighed, the switch alone would crash again on the cache; weighed, it comes with a context the
    memory model says fits (3% margin), in one restart."""
    unweighed = _weights_heal(H100, "awq_marlin", None)
    assert unweighed.action == "Quantize" and "max_model_len" not in unweighed.changes, unweighed.summary()
    assert "does not weigh" in unweighed.expected and "bits declares it" in unweighed.expected

    r = _weights_heal(H100, "awq_marlin", 4)
    assert r.action == "Quantize" and r.changes["quantization"] == "awq_marlin", r.summary()
    assert r.changes["max_model_len"] < 131072 and "(fits)" in r.expected, r.summary()
    after = parse_args("").engine.model_copy(
        update={"quantization": "awq_marlin", "max_model_len": r.changes["max_model_len"]}
    )
    est = estimate(replace(LLAMA70, quantization="awq_marlin", quant_bits=4), after, lookup(H100), None, "server", V025)
    assert est.fits and est.kv_tokens >= r.changes["max_model_len"]


def test_a_declared_8_bit_fallback_whose_weights_still_do_not_fit_is_not_tried():
    """70 GB of 8-bit weights on one L40S (44.4 GiB): the declared width says the switch cannot start, so no
    restart is spent on it and the answer says why; the user's settings stay. At 4 bits it is tried."""
    r = _weights_heal("NVIDIA-L40S", "gptq_marlin", 8, "--max-model-len 4096")
    assert r.action == "GiveUp" and not r.changes, r.summary()
    assert "Quantize refused: the memory model says it still does not fit" in r.reason

    unweighed = _weights_heal("NVIDIA-L40S", "gptq_marlin", None, "--max-model-len 4096")
    assert unweighed.action == "Quantize", unweighed.summary()


def test_the_declared_width_sizes_the_weights_as_the_checkpoints_own_width_does():
    """bits 4 weighs a linear weight at 4 bits and its group scales, bits 8 at one byte: the same figures
    the memory model gives a checkpoint whose own config says that width."""
    four = weights_bytes_per_gpu(replace(LLAMA70, quantization="gptq", quant_bits=4), "gptq")
    eight = weights_bytes_per_gpu(replace(LLAMA70, quantization="gptq", quant_bits=8), "gptq")
    dense = weights_bytes_per_gpu(LLAMA70)
    assert 0.25 < four / dense < 0.3 and 0.5 < eight / dense < 0.55


@pytest.mark.parametrize(
    "fallback,refused",
    [
        ({"allowed": True, "model": "m-awq", "method": "awq", "bits": 4}, False),
        ({"allowed": True, "model": "m-bnb", "method": "bitsandbytes", "bits": 8}, False),
        ({"allowed": True, "model": "m-fp8", "method": "fp8", "bits": 4}, True),
        ({"allowed": True, "model": "m.gguf", "method": "gguf", "bits": 4}, True),
        ({"bits": 4}, True),
        ({"allowed": True, "model": "m-awq", "method": "awq", "bits": 1}, True),
        ({"allowed": True, "model": "m-awq", "method": "awq", "bits": 16}, True),
    ],
)
def test_admission_takes_a_width_only_where_the_method_leaves_it_open(fallback, refused):
    """The CRD's rules as `render` and `serve` check them (the real API server: test_crd_server.py)."""
    from vllm_autoheal.validation import admit

    body = {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": "team"},
        "spec": {"model": "m", "heal": {"quantizedFallback": fallback}},
    }
    _, problems = admit(body)
    named = [p for p in problems if "quantizedFallback.bits" in p]
    assert bool(named) == refused, problems


def test_once_the_fallback_runs_its_heals_weigh_the_declared_width():
    """The 8-bit AWQ fallback of Llama-3.1-70B runs on an H200 at utilization 0.6 (switched by PatchSpec:
    spec.model and its quantization are the fallback's) and its KV cache falls short of the default context,
    with no figure printed: the memory model sizes the cut at 8 bits and the fp16 scales of groups of 128
    (69.2 GiB of weights), about 40,000 tokens. At the 4 bits the method's name would guess (37.9 GiB) the
    cache holds the whole context: no cut at all, and the same crash again."""
    fallback = {"allowed": True, "model": "org/l70-awq-int8", "method": "awq_marlin", "bits": 8}
    running = parse_args("--gpu-memory-utilization 0.6 --quantization awq_marlin").engine
    spec = VLLMServiceSpec(
        model="org/l70-awq-int8",
        engine=running,
        heal={"allowedActions": ["LowerMaxModelLen"], "quantizedFallback": fallback},
    )
    inv = Inventory(gpu_total_gib=lookup("NVIDIA-H200").memory_gib, gpu_name="NVIDIA-H200", shape=LLAMA70, release=V025)
    diag = Diagnosis(cause=Cause.KV_CACHE_INSUFFICIENT)
    r = plan_heal(spec, diag, inventory=inv)
    assert r.action == "LowerMaxModelLen" and 30000 <= r.changes["max_model_len"] <= 45000, r.summary()
    assert "(fits)" in r.expected, r.expected
    unweighed = {"allowedActions": ["LowerMaxModelLen"], "quantizedFallback": {**fallback, "bits": None}}
    guessed = VLLMServiceSpec(model="org/l70-awq-int8", engine=running, heal=unweighed)
    g = plan_heal(guessed, diag, inventory=inv)
    assert "max_model_len" not in g.changes, g.summary()  # (the 4-bit guess, kept where no width is declared)


@pytest.mark.parametrize(
    "quant,group",
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 32}, 32),
        ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64}, 64),
        ({"quant_method": "gptq", "bits": 8, "group_size": -1}, -1),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": 128}}},
            },
            128,
        ),
        ({"quant_method": "fp8"}, None),
    ],
)
def test_the_checkpoints_group_is_read_from_its_config(quant, group):
    from vllm_autoheal.model_config import check, to_shape

    config = {**json.loads((CONFIGS / "llama-3.1-8b.json").read_text()), "quantization_config": quant}
    assert to_shape(check(config)).quant_group == group


@pytest.mark.parametrize("value", [0, [128], {"a": 1}, "128", 10**9, 1.5])
def test_a_group_no_checkpoint_has_is_refused_naming_the_field(value):
    """A tenant's config (inline, or a file it controls) never raises past the check: refused by name."""
    from vllm_autoheal.model_config import ModelConfigError, check

    base = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    weights = {"num_bits": 4, "group_size": value}
    for quant in (
        {"quant_method": "gptq", "bits": 4, "group_size": value},
        {"quant_method": "compressed-tensors", "config_groups": {"a": {"weights": weights}, "b": {"weights": weights}}},
    ):
        with pytest.raises(ModelConfigError, match="group_size"):
            check({**base, "quantization_config": quant})
