"""Checkpoints whose weights are a float format (NVFP4, MXFP4, FP8, MXFP8) keep a one-byte scale a group (fp8
e4m3 or e8m0) and no zero point, where an integer format's group keeps an fp16 scale and a zero: the memory
model reads the format from compressed-tensors' config_groups weights type and from ModelOpt's quant_algo,
and a quantized fallback declares it with weightType. Measured on an H100 (tests/test_quantized_fallback_gpu.py):
NVFP4 5.70 GiB of Llama-3.1-8B's weights, MXFP4 5.48."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.model_config import ModelConfigError, check, to_shape
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.quant_width import quantized_bytes
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import CONFIGS, config_shape

GIB = 2**30
NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
MXFP4 = {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True}
W4A16 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16, "symmetric": True}
FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel", "group_size": None}


def _ct(*weights: dict) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {f"group_{i}": {"targets": ["Linear"], "weights": w} for i, w in enumerate(weights)},
    }


def _shape(quant: dict, base: str = "llama-3.1-8b"):
    return to_shape(check({**json.loads((CONFIGS / f"{base}.json").read_text()), "quantization_config": quant}))


@pytest.mark.parametrize(
    "quant,bits,group,floats",
    [
        (_ct(NVFP4), 4, 16, True),
        (_ct(MXFP4), 4, 32, True),
        (_ct(FP8_CHANNEL), 8, None, True),
        (_ct(W4A16), 4, 16, False),
        (_ct(NVFP4, W4A16), 4, 16, False),  # (mixed formats: not read as float)
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]}, 4, 16, True),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "nvfp4", "group_size": 16}}, 4, 16, True),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, 8, None, True),
        ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, None, None, False),  # (per layer)
        ({"quant_method": "modelopt", "quant_algo": ["NVFP4"]}, None, None, False),  # (a tenant's list: not a name)
        ({"quant_method": "modelopt"}, None, None, False),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 4, 128, False),
    ],
)
def test_the_weights_format_is_read_from_the_checkpoints_config(quant, bits, group, floats):
    shape = _shape(quant)
    assert (shape.quant_bits, shape.quant_group, shape.quant_float) == (bits, group, floats)


@pytest.mark.parametrize(
    "quant,per_weight",
    [
        (_ct(NVFP4), 0.5 + 1 / 16),
        (_ct(MXFP4), 0.5 + 1 / 32),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, 0.5 + 1 / 16),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}}, 0.5 + 1 / 16),  # (16: NVFP4's)
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, 1.0),
        (_ct(W4A16), 0.5 + 2.5 / 16),  # (an integer format's group: an fp16 scale and a packed zero)
    ],
)
def test_a_float_formats_group_weighs_one_byte_and_no_zero(quant, per_weight):
    """Llama-3.1-70B's linear layers at the format's bytes a weight: against the same model at 4 bits with no
    scale at all, the difference is the scales alone."""
    shape = _shape(quant, "llama-3.1-70b")
    bare = weights_bytes_per_gpu(replace(shape, quant_group=-1, quant_float=False))
    linear = 2 * (
        weights_bytes_per_gpu(replace(shape, quant_bits=8, quant_group=-1))
        - weights_bytes_per_gpu(replace(shape, quant_bits=4, quant_group=-1))
    )  # (linear weights: 8 bits less 4 bits is half a byte a weight)
    expected = bare + linear * (per_weight - shape.quant_bits / 8)
    assert weights_bytes_per_gpu(shape) / GIB == pytest.approx(expected / GIB, abs=0.05)


def test_modelopt_nvfp4_was_weighed_at_a_byte_a_weight_before():
    """The regression this reading fixes: ModelOpt's NVFP4 (no config_groups in its older exports) was weighed
    as 'modelopt' at one byte a weight, 8.5 GiB of Llama-3.1-8B where vLLM loads 5.70."""
    shape = _shape({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    assert weights_bytes_per_gpu(shape) / GIB == pytest.approx(5.70, abs=0.07)


def _admit(fallback: dict) -> list[str]:
    from vllm_autoheal.validation import admit

    body = {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": "team"},
        "spec": {"model": "m", "heal": {"quantizedFallback": {"allowed": True, "model": "m-q", **fallback}}},
    }
    return admit(body)[1]


@pytest.mark.parametrize(
    "fallback,refused",
    [
        ({"method": "compressed-tensors", "bits": 4, "weightType": "float"}, False),
        ({"method": "compressed-tensors", "bits": 8, "weightType": "float"}, False),
        ({"method": "compressed-tensors", "bits": 4, "weightType": "int"}, False),
        ({"method": "gptq_marlin", "bits": 4, "weightType": "int"}, False),
        ({"method": "gptq_marlin", "bits": 4, "weightType": "float"}, True),
        ({"method": "compressed-tensors", "weightType": "float"}, True),  # (float of what width)
        ({"method": "modelopt_fp4", "weightType": "float"}, True),  # (the name fixes it)
    ],
)
def test_admission_takes_float_weights_only_where_a_checkpoint_holds_them(fallback, refused):
    """The CRD's rule as `render` and `serve` check it (the real API server: test_crd_server.py)."""
    problems = _admit(fallback)
    assert bool([p for p in problems if "quantizedFallback.weightType" in p]) == refused, problems


@pytest.mark.parametrize("value", ["FLOAT", "fp4", 4, ["float"]])
def test_a_weight_type_that_is_no_format_is_refused_naming_the_field(value):
    problems = _admit({"method": "compressed-tensors", "bits": 4, "weightType": value})
    assert any("weightType" in p for p in problems), problems


def test_an_inline_modelopt_config_is_weighed_at_its_algorithms_width():
    """spec.modelConfig.inline keeps config.json's spelling: ModelOpt's quant_algo comes through the schema
    (pydantic drops a key it does not name) to the reader, as from the checkpoint's own file."""
    from types import SimpleNamespace

    from vllm_autoheal.model_source import for_service

    base = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    inline = {**base, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}}
    spec = VLLMServiceSpec.model_validate({"model": "org/L8-NVFP4", "modelConfig": {"inline": inline}})
    resolved = for_service(SimpleNamespace(spec=spec, metadata={"name": "s", "namespace": "t"}), lambda path: None)
    assert resolved.error is None, resolved.error
    assert (resolved.shape.quant_bits, resolved.shape.quant_float) == (4, True)
    assert weights_bytes_per_gpu(resolved.shape) / GIB == pytest.approx(5.70, abs=0.07)


def _weights_heal(fallback: dict):
    """Llama-3.1-70B (bf16) out of memory loading its weights on one H100, the NVFP4 checkpoint allowed."""
    spec = VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B-Instruct",
        engine=parse_args("").engine,
        heal={"quantizedFallback": {"allowed": True, "model": "org/L70-NVFP4", **fallback}},
    )
    h100 = "NVIDIA-H100-80GB-HBM3"
    inv = Inventory(
        gpu_total_gib=lookup(h100).memory_gib,
        gpu_name=h100,
        shape=config_shape("llama-3.1-70b"),
        release=parse_version("0.25.0"),
    )
    return plan_heal(spec, Diagnosis(cause=Cause.WEIGHTS_LOAD_OOM), inventory=inv)


def test_a_declared_float_fallback_weighs_as_its_own_config_does():
    """The heal weighs an NVFP4 fallback declared float at 4 bits as its checkpoint's config reads: a context
    its cache holds. Declared int (the default), it weighs as a W4A16 checkpoint in groups of 128, 2.6 GiB
    under NVFP4's scales, and promises the cache more context than it holds."""
    floats = _weights_heal({"method": "compressed-tensors", "bits": 4, "weightType": "float"})
    ints = _weights_heal({"method": "compressed-tensors", "bits": 4})
    assert floats.action == ints.action == "Quantize", (floats.summary(), ints.summary())
    assert floats.changes["max_model_len"] < ints.changes["max_model_len"], (floats.summary(), ints.summary())
    own = _shape(_ct(NVFP4), "llama-3.1-70b")
    declared_bytes = quantized_bytes(4, None, "compressed-tensors", None, float_weights=True)
    assert declared_bytes == pytest.approx(0.5625)
    assert own.quant_float and own.quant_group == 16


@pytest.mark.parametrize("algo", [{"quant_algo": 7}, {"quant_algo": "x" * 100}, {"quantization": "NVFP4"}])
def test_a_forged_modelopt_config_is_not_read_as_a_width_and_never_raises(algo):
    try:
        shape = _shape({"quant_method": "modelopt", **algo})
    except ModelConfigError:
        return
    assert shape.quant_bits is None


@pytest.mark.parametrize(
    "quant",
    [
        _ct(NVFP4),
        _ct(MXFP4),
        _ct(NVFP4, W4A16),
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]},
        {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", "model.layers.*.self_attn*"]},
        {**_ct(FP8_CHANNEL), "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False}},
        {"quant_method": "gptq", "bits": 4, "group_size": 32},
    ],
)
def test_a_checked_config_checks_to_itself(quant):
    """A config the reader checked (a resolved source, kept and checked again, as a declaration: its own keys
    say the format) says the same the second time: the format, the cache and the layers left unquantized
    survive, not only the bits. (A raw config.json's copies of those keys are not read: vLLM reads none of
    them; tests/test_review_session38_hostile_config.py.)"""
    once = check({**json.loads((CONFIGS / "llama-3.1-8b.json").read_text()), "quantization_config": quant})
    twice = check(once, declared=True)
    assert twice["quantization_config"] == once["quantization_config"]
    fields = ("quantization", "quant_bits", "quant_group", "quant_float", "auto_kv_dtype", "dense_attention")
    assert [getattr(to_shape(twice), f) for f in fields] == [getattr(to_shape(once), f) for f in fields]
