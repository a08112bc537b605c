"""Hostile review (session 37) of the float-format reading (quant_config.py, quant_width's float_weights,
quantizedFallback.weightType): forged and odd quantization_configs, ModelOpt's other algorithms, mixed
config_groups, a running fallback whose own config disagrees with its declaration. Ground truth: vLLM 0.25's
source (the vLLM 0.25 wheel) and the H100 runs in tests/fixtures/gpu/quantized-runs/. Five defects, six
strict xfails when found, all fixed the same session (ModelOpt MXFP8's scales, mixed config_groups weighed at
the heaviest, FP8_PB_WO's blocks, a running fallback's own float config, ModelOpt's kv_cache_quant_algo);
the plain tests at the end are attacks that were defended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import ModelConfigError, check, to_shape
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.remedy.model import running_shape
from vllm_autoheal.vllm_release import parse_version

from samples import CONFIGS

GIB = 2**30
H100 = "NVIDIA-H100-80GB-HBM3"
V025 = parse_version("0.25.0")
L8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
L70 = json.loads((CONFIGS / "llama-3.1-70b.json").read_text())
NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
W4A16_G128 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
QUANTIZED_RUNS = Path(__file__).parent / "fixtures" / "gpu" / "quantized-runs"


def _shape(quant: dict | None, base: dict = L70, **fields):
    config = {**base, **fields}
    if quant is not None:
        config["quantization_config"] = quant
    return to_shape(check(config))


def _gib(shape, **kw) -> float:
    return weights_bytes_per_gpu(shape, capability=(9, 0), **kw) / GIB


def _ct(**groups: dict) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {name: {"targets": targets, "weights": w} for name, (targets, w) in groups.items()},
    }


@pytest.mark.parametrize(
    "quant",
    [
        {"quant_method": "modelopt", "quantization": {"quant_algo": "MXFP8", "kv_cache_quant_algo": None}},
        {"quant_method": "modelopt", "quant_algo": "MXFP8"},
    ],
    ids=["nested", "flat"],
)
def test_modelopt_mxfp8_counts_its_block_scales(quant):
    """Severity: High (under-count: the heal promises KV cache that is not there).
    Input: a ModelOpt MXFP8 Llama-3.1-70B, quantization_config {"quant_method": "modelopt", "quantization":
    {"quant_algo": "MXFP8", ...}} (hf_quant_config's nested layout) or flat {"quant_algo": "MXFP8"} with no
    group_size (vLLM's ModelOptMxFp8Config needs none: MXFP8's block is fixed at 32).
    Now: MODELOPT_ALGOS gives 8 bits and float, no group is read (the nested group is never read, and the flat
    one is absent), default_group(8 bits, float) is -1: 1.0 B a weight, 67.71 GiB of weights. The same
    checkpoint described flat with "group_size": 32 weighs 69.70 GiB: 1.99 GiB under, on one GPU.
    Right: 1 + 1/32 B a weight (69.70 GiB). vLLM 0.25's ModelOptMxFp8LinearMethod.create_weights allocates
    weight [N, K] float8_e4m3fn and weight_scale [N, K // MXFP8_BLOCK_SIZE (32)] uint8 (e8m0) for every
    linear layer, and on an H100 (no FlashInfer MXFP8 below sm_100) MarlinMxfp8LinearKernel keeps them so
    (marlin_utils_fp8.prepare_mxfp8_layer_for_marlin: group_size = 32, scales back to e8m0)."""
    with_group = _gib(_shape({"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": 32}))
    assert with_group == pytest.approx(69.70, abs=0.05)
    assert _gib(_shape(quant)) >= with_group - 0.05


def test_mixed_nvfp4_and_int4_groups_weigh_at_least_the_heavier_format():
    """Severity: Medium (under-count).
    Input: a compressed-tensors Llama-3.1-70B whose config_groups quantize the MLP as NVFP4 (float, 4 bits,
    tensor_group of 16) and attention as W4A16 (int, 4 bits, groups of 128): a mixed-precision recipe.
    Now: the groups agree on 4 bits but not on the group or the type: _group gives None and _float_weights
    False, so quantized_bytes(4, None) guesses 0.5 + 0.031 B a weight: 37.81 GiB.
    Right: at least what vLLM loads. It picks a scheme per target (compressed_tensors.py
    _get_scheme_from_parts: CompressedTensorsW4A4Fp4 for the NVFP4 group, 0.5 + 1/16 B; CompressedTensorsWNA16
    for the int one, 0.5 + 2.5/128 B): 56.4e9 MLP weights at 0.5625 and 12.1e9 attention weights at 0.5195,
    plus the bf16 embeddings, about 39.3 GiB. The NVFP4 format alone gives 39.81 GiB; with targets not read,
    the heavier group's format (as FLOAT_GROUP takes NVFP4's 16, the heavier scales) is the safe weighing."""
    mixed = _ct(mlp=(["re:.*mlp.*"], NVFP4), attn=(["re:.*self_attn.*"], W4A16_G128))
    nvfp4_only = _gib(_shape(_ct(g=(["Linear"], NVFP4))))
    assert nvfp4_only == pytest.approx(39.81, abs=0.05)
    assert _gib(_shape(mixed)) >= 39.2


def test_modelopt_fp8_per_block_splits_only_into_whole_blocks():
    """Severity: Medium (a heal proposes a tensor-parallel size the checkpoint cannot load: another crash).
    Input: a ModelOpt FP8_PB_WO checkpoint of a Qwen2.5-72B-shaped model (Llama-3.1-70B's config with
    intermediate_size 29568), quantization_config {"quant_method": "modelopt", "quant_algo": "FP8_PB_WO"}.
    Now: the reader names its width (MODELOPT_ALGOS: 8) but not its blocks (weight_block None): splits()
    allows TP 1, 2, 4 and 8. The same weights described as block-wise fp8 ({"quant_method": "fp8",
    "weight_block_size": [128, 128]}) split at TP 1 only.
    Right: TP 1 only. vLLM 0.25's ModelOptFp8PbWoLinearMethod fixes _WEIGHT_BLOCK_SIZE = (128, 128) and its
    create_weights raises "ModelOpt FP8_PB_WO requires in_features divisible by 128" for down_proj's
    29568 / 2 = 14784 (14784 % 128 = 64), and likewise at TP 4 (7392) and 8 (3696)."""
    qwen72 = {"intermediate_size": 29568, "vocab_size": 152064}
    block_fp8 = _shape({"quant_method": "fp8", "weight_block_size": [128, 128]}, **qwen72)
    assert [tp for tp in (1, 2, 4, 8) if block_fp8.splits(tp)] == [1]
    pb_wo = _shape({"quant_method": "modelopt", "quant_algo": "FP8_PB_WO"}, **qwen72)
    assert pb_wo.quant_bits == 8
    assert [tp for tp in (1, 2, 4, 8) if pb_wo.splits(tp)] == [1]


def test_a_running_fallback_whose_own_config_says_float_is_not_weighed_lighter():
    """Severity: Medium (under-count in every heal, pre-flight and the classifier once the fallback runs).
    Input: spec.heal.quantizedFallback {allowed, model: org/L70-NVFP4, method: compressed-tensors, bits: 4}
    (weightType and groupSize unset: every policy written before weightType existed), running as spec.model
    with --quantization compressed-tensors, and the running checkpoint's own config a compressed-tensors
    NVFP4 (config_groups weights type float, group_size 16).
    Now: running_shape -> fallback_shape takes the declaration first and fills its unset fields with the
    int defaults (group 128, int): 0.5 + 2.5/128 B a weight, 37.07 GiB, where the checkpoint's own config
    weighs 39.81 GiB: 2.74 GiB of KV cache on one GPU promised that is not there.
    Right: where the declaration leaves weightType/groupSize unset and the config the operator reads for the
    running model (same method, same bits) says float in groups of 16, weigh the heavier of the two (vLLM
    0.25 loads NVFP4 at 0.5 + 1/16 B: tests/fixtures/gpu/quantized-runs/nvfp4.log, 5.70 GiB of
    Llama-3.1-8B). Taking the heavier stays safe when a PatchSpec switch kept the replaced model's config."""
    own = _shape(_ct(g=(["Linear"], NVFP4)))
    assert _gib(own) == pytest.approx(39.81, abs=0.05)
    model = "org/L70-NVFP4"
    engine = parse_args("--quantization compressed-tensors").engine
    fallback = {"allowed": True, "model": model, "method": "compressed-tensors", "bits": 4}
    spec = VLLMServiceSpec(model=model, engine=engine, heal={"quantizedFallback": fallback})
    runs, shape = running_shape(spec, model, engine, own)
    assert runs and shape is not None
    assert _gib(shape, quantization="compressed-tensors") >= _gib(own) - 0.05


def test_a_modelopt_fp8_kv_cache_is_not_promised_twice():
    """Severity: Medium (the fp8 KV remedy promises twice the cache tokens that vLLM already had).
    Input: a ModelOpt NVFP4 Llama-3.1-8B whose quantization_config names kv_cache_quant_algo "FP8" (nested
    under "quantization", as hf_quant_config.json writes it), served with --kv-cache-dtype auto (the default).
    Now: the memory model counts the cache in the served dtype under auto, 131072 B a token (bf16), and
    65536 B under --kv-cache-dtype fp8: an fp8 heal's `expected` (and the 'context twice M holds' choice)
    counts twice the tokens, where vLLM ran fp8 all along.
    Right: the same bytes a token under auto as under fp8. vLLM 0.25's EngineArgs.create_engine_config
    resolves kv_cache_dtype auto through utils/torch_utils.resolve_kv_cache_dtype_string, which for a
    quant_method starting with "modelopt" maps kv_cache_quant_algo (or kv_cache_scheme) "fp8" to fp8_e4m3."""
    nested = {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    shape = _shape({"quant_method": "modelopt", "quantization": nested}, base=L8)
    gpu = lookup(H100)
    auto = estimate(shape, parse_args("--max-model-len 8192").engine, gpu, release=V025)
    fp8 = estimate(shape, parse_args("--max-model-len 8192 --kv-cache-dtype fp8").engine, gpu, release=V025)
    assert fp8.kv_bytes_per_token == 65536
    assert auto.kv_bytes_per_token == fp8.kv_bytes_per_token


# Attacks that were defended.


@pytest.mark.parametrize(
    "quant",
    [
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": [4], "type": "float"}}}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"group_size": {"a": 1}}}}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"type": ["float"]}}}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": [1, 2]}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": "float"}}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 10**400}}}},
        {"quant_method": "modelopt", "quant_algo": {"NVFP4": 1}},
        {"quant_method": "modelopt", "quantization": [{"quant_algo": "NVFP4"}]},
        {"quant_method": "modelopt", "quantization": {"quant_algo": ["NVFP4"]}},
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": [16]},
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "config_groups": [1]},
        {"quant_method": "MODELOPT", "quant_algo": "nvfp4", "group_size": float("nan")},
    ],
)
def test_odd_values_are_a_config_error_or_weighed_never_a_crash(quant):
    try:
        shape = _shape(quant, base=L8)
    except ModelConfigError:
        return
    assert _gib(shape) > 0


def test_sixty_five_float_groups_fall_back_to_a_byte_a_weight():
    """More config_groups than MAX_GROUPS are not read: the method's usual width (1 B), above NVFP4's 0.5625."""
    many = {f"g{i}": (["Linear"], NVFP4) for i in range(65)}
    shape = _shape(_ct(**many), base=L8)
    assert (shape.quant_bits, shape.quant_float) == (None, False)
    assert _gib(shape) > 8.0


@pytest.mark.parametrize("algo", [" NVFP4", "NVFP4 ", "NV FP4", "W4A8_AWQ", "MIXED_PRECISION"])
def test_a_quant_algo_vllm_refuses_or_mixes_is_not_weighed_at_nvfp4(algo):
    """vLLM upper-cases quant_algo but does not strip it (modelopt.py from_config: not in QUANT_ALGOS, a
    ValueError), and MIXED_PRECISION is per layer: none is weighed at 4 bits (a byte a weight instead)."""
    shape = _shape({"quant_method": "modelopt", "quant_algo": algo}, base=L8)
    assert shape.quant_bits is None and _gib(shape) > 8.0


def test_lower_case_quant_algo_reads_as_vllm_upper_cases_it():
    shape = _shape({"quant_method": "modelopt", "quant_algo": "nvfp4"}, base=L8)
    assert (shape.quant_bits, shape.quant_float) == (4, True)


def test_float_fp8_per_channel_and_mxfp8_groups_in_compressed_tensors():
    """FP8 per channel: 1 B; compressed-tensors MXFP8 (group 32, uint8 scales: _is_mxfp8) reads its group."""
    fp8 = {"num_bits": 8, "type": "float", "strategy": "channel", "group_size": None, "symmetric": True}
    mxfp8 = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True}
    assert _gib(_shape(_ct(g=(["Linear"], fp8)))) == pytest.approx(67.71, abs=0.05)
    assert _gib(_shape(_ct(g=(["Linear"], mxfp8)))) == pytest.approx(69.70, abs=0.05)


def test_nvfp4_experts_of_a_compressed_tensors_moe_are_not_taken_for_gpt_oss_mxfp4():
    """EXPERTS_ONLY is quant_method mxfp4 alone: a compressed-tensors NVFP4 MoE weighs every linear layer at
    0.5625 B, lighter than bf16 and not through the expert padding."""
    qwen = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    shape = _shape(_ct(g=(["Linear"], NVFP4)), base=qwen)
    bf16 = _shape(None, base=qwen)
    assert shape.quant_float and 0.25 < _gib(shape) / _gib(bf16) < 0.33


def test_modelopt_nvfp4_both_layouts_match_the_h100_runs():
    """tests/fixtures/gpu/quantized-runs/modelopt-nvfp4*.log: 'Model loading took 5.70 GiB' in both layouts."""
    for name in ("modelopt-nvfp4.log", "modelopt-nvfp4-nested.log"):
        assert "Model loading took 5.7" in (QUANTIZED_RUNS / name).read_text()
    flat = _shape({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, base=L8)
    nested = _shape({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "group_size": 16}}, base=L8)
    assert _gib(flat) == pytest.approx(5.70, abs=0.07)
    assert _gib(nested) == pytest.approx(_gib(flat), abs=0.01)


def test_a_declared_float_fallback_beats_a_replaced_models_int_config():
    """A PatchSpec switch keeps the replaced model's config: a declared weightType float is weighed float."""
    own_int = _shape(_ct(g=(["Linear"], W4A16_G128)))
    model = "org/L70-NVFP4"
    engine = parse_args("--quantization compressed-tensors").engine
    fallback = {"allowed": True, "model": model, "method": "compressed-tensors", "bits": 4, "weightType": "float"}
    spec = VLLMServiceSpec(model=model, engine=engine, heal={"quantizedFallback": fallback})
    runs, shape = running_shape(spec, model, engine, own_int)
    assert runs and shape is not None and shape.quant_float and shape.quant_group == 16
    assert _gib(shape, quantization="compressed-tensors") == pytest.approx(39.81, abs=0.05)
    assert _gib(own_int, quantization="compressed-tensors") < 39.0
