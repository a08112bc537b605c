"""Hostile review (session 37c) of d5f7214 and 424f6b4: ModelOpt's kv_cache_quant_algo/kv_cache_scheme read as
the cache vLLM runs under --kv-cache-dtype auto (ModelShape.auto_kv_dtype), config_groups weighed at the
heaviest group, ModelOpt's widths, groups and FP8_PB_WO blocks, and a running fallback weighed at the heavier
of its declaration and its own config. Ground truth: vLLM 0.25's source (utils/torch_utils.py
get_kv_cache_quant_algo_string, engine/arg_utils.py, model_executor/layers/attention/attention.py,
quantization/modelopt.py and compressed_tensors/) and the H100 runs in tests/fixtures/gpu/quantized-runs/.
Seven defects (fourteen strict xfails with their parameters) when found, all fixed the same session; the plain
tests at the end are attacks that were defended."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import ModelConfigError, check, to_shape
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.plan_options import options
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import CONFIGS, config_shape

GIB = 2**30
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
V025 = parse_version("0.25.0")
L8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
L70 = json.loads((CONFIGS / "llama-3.1-70b.json").read_text())
NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
FP8_KV_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}
# ModelOpt FP8 weights with ModelOpt's fp8 cache (as nvidia/Llama-3.1-70B-Instruct-FP8 names it)
MODELOPT_FP8_KVFP8 = {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
# vLLM's refusal when the cache holds less than one request (an fp8 cache already, where the checkpoint says so)
KV_REFUSAL = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (8.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (1.98 GiB). Based on the available memory, "
    "the estimated maximum model length is 32464. Try increasing"
)


def _shape(quant: dict | None, base: dict = L70, **fields):
    config = {**base, **fields}
    if quant is not None:
        config["quantization_config"] = quant
    return to_shape(check(config))


def _gib(shape) -> float:
    return weights_bytes_per_gpu(shape, capability=(9, 0)) / GIB


def _ct(**extra) -> dict:
    groups = {"g": {"targets": ["Linear"], "weights": NVFP4}}
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": groups, **extra}


def _quantize_heal(gpu: str, running: dict) -> object:
    """A 70B checkpoint out of memory loading its weights on one GPU; the policy names a 4-bit AWQ fallback
    (awq_marlin, groups of 128), a different checkpoint with its own (AWQ) quantization_config."""
    fallback = {"allowed": True, "model": "org/L70-AWQ", "method": "awq_marlin", "bits": 4, "groupSize": 128}
    spec = VLLMServiceSpec(
        model="nvidia/Llama-3.1-70B-Instruct-FP8", engine=parse_args("").engine, heal={"quantizedFallback": fallback}
    )
    inv = Inventory(gpu_total_gib=lookup(gpu).memory_gib, gpu_name=gpu, shape=_shape(running), release=V025)
    return plan_heal(spec, Diagnosis(cause=Cause.WEIGHTS_LOAD_OOM), inventory=inv)


def _awq_estimate(gpu: str, changes: dict):
    """The AWQ fallback as vLLM runs it: its own config names no ModelOpt cache, so auto is the model dtype."""
    awq = replace(config_shape("llama-3.1-70b"), quantization="awq_marlin", quant_bits=4, quant_group=128)
    keys = ("quantization", "max_model_len", "gpu_memory_utilization")
    engine = parse_args("").engine.model_copy(update={k: v for k, v in changes.items() if k in keys})
    return estimate(awq, engine, lookup(gpu), None, "server", V025)


@pytest.mark.parametrize("gpu", [H100, L40S])
def test_a_fallback_checkpoint_does_not_inherit_the_running_modelopt_cache(gpu):
    """Severity: High (under-count: the switch to the fallback promises twice the KV cache it gets, and
    crashes again on the cache).
    Input: the running model is a ModelOpt FP8 Llama-3.1-70B whose config names kv_cache_quant_algo "FP8"
    (its auto cache is fp8_e4m3); it runs out of memory loading its weights; spec.heal.quantizedFallback names
    org/L70-AWQ, awq_marlin, bits 4, groupSize 128 (another checkpoint, whose quantization_config is AWQ's).
    Now: Context.fallback_shape -> fallback_shape does replace(shape, quantization=..., quant_bits=...) and
    keeps auto_kv_dtype "fp8_e4m3", so the AWQ checkpoint is weighed at 1 B a KV element. On an H100 the
    Quantize heal keeps max_model_len 131,072, "KV cache 31.50 GiB holds 206,464 tokens (fits)", where the AWQ
    checkpoint's bf16 cache holds 103,232; on an L40S it sets max_model_len 14,000 where 7,216 fit.
    Right: the fallback's cache is its own config's: vLLM 0.25 resolves auto only from the served checkpoint's
    quantization_config (utils/torch_utils.get_kv_cache_quant_algo_string: quant_method starting "modelopt"),
    so an AWQ checkpoint runs auto as the model dtype (kv_cache_dtype_str_to_dtype), 2 B an element; the
    same heal from a bf16 70B (no ModelOpt cache) already sizes it so (100,128 on the H100, 6,992 on the L40S)."""
    r = _quantize_heal(gpu, MODELOPT_FP8_KVFP8)
    assert r.action == "Quantize", r.summary()
    after = _awq_estimate(gpu, r.changes)
    assert after.fits, (r.summary(), after.failure, after.kv_tokens)


def test_plan_weighs_a_quantized_variant_at_its_own_cache():
    """Severity: Medium (under-count in `plan`'s advice: the row marked smallest promises twice the tokens).
    Input: `plan` for a ModelOpt FP8 Llama-3.1-70B whose config names kv_cache_quant_algo FP8, on an H100,
    --quantized-variant awq --max-model-len 32768.
    Now: plan_options.options estimates every variant with the same shape, auto_kv_dtype "fp8_e4m3" included:
    the TP 1 awq row, kv_cache_dtype auto, holds 206,464 tokens (max len fits 131,072), the same as its fp8
    row; the bf16 model's plan gives that awq row 103,232.
    Right: a checkpoint quantized with AWQ is another checkpoint, whose config names no ModelOpt cache: vLLM
    0.25 serves its auto cache in the model dtype (torch_utils.resolve_kv_cache_dtype_string returns "auto"
    for a quant_method not starting with "modelopt"), 103,232 tokens."""
    engine = parse_args("--max-model-len 32768").engine
    opts = options(_shape(MODELOPT_FP8_KVFP8), engine, lookup(H100), quantized_variants=["awq"], release=V025)
    bf16 = options(_shape(None), engine, lookup(H100), quantized_variants=["awq"], release=V025)

    def awq_auto(rows):
        return next(
            o for o in rows if o.tensor_parallel_size == 1 and o.quantization == "awq" and o.kv_cache_dtype == "auto"
        )

    assert awq_auto(bf16).estimate.kv_tokens == 103232
    assert awq_auto(opts).estimate.kv_tokens <= awq_auto(bf16).estimate.kv_tokens


def test_a_text_config_modelopt_cache_is_not_the_auto_cache():
    """Severity: Medium (under-count: half the KV bytes a token, twice the tokens promised).
    Input: a multimodal config.json (Llava) whose quantization_config sits in text_config only
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}), as vLLM says "some
    vision model may keep quantization_config in their text_config" (weight_utils.get_quant_config).
    Now: model_config.check merges text_config over the top level, so auto_kv_dtype is "fp8_e4m3": 65,536 B
    a token for Llama-3.1-8B's text model under --kv-cache-dtype auto.
    Right: 131,072 B (bf16). vLLM 0.25 loads the weights with the text_config's quantization config, but
    EngineArgs.create_engine_config resolves auto through resolve_kv_cache_dtype_string, which reads only
    getattr(hf_config, "quantization_config") of the top-level config (None here): the cache stays "auto",
    the model's dtype (ModelOpt configs carry no kv_cache_scheme attribute for attention.py to apply)."""
    quant = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}
    shape = to_shape(check({**config, "text_config": {**L8, "quantization_config": quant}}))
    assert shape.kv_bytes_per_token(None) == 131072


def test_a_compressed_tensors_fp8_cache_is_not_promised_twice():
    """Severity: Medium (the fp8 KV heal promises twice the tokens vLLM already had, and changes nothing).
    Input: a compressed-tensors FP8 Llama-3.1-8B whose quantization_config names kv_cache_scheme {num_bits 8,
    type float, strategy tensor, dynamic false} (llm-compressor's fp8 KV recipe), served with --kv-cache-dtype
    auto and max_model_len 131,072; vLLM refuses: 1.98 GiB available, estimated maximum model length 32,464;
    heal.bounds.minMaxModelLen 60,000, RaiseGpuMemoryUtilization excluded.
    Now: Fp8KvCache --kv-cache-dtype fp8 --max-model-len 64272, "about 64,928 here" (twice the 32,464 printed);
    the commit skips fp8_kv_cache only for ModelOpt's kv_cache_quant_algo (auto_kv_dtype), so it is offered.
    Right: not offered (the same GiveUp as for ModelOpt's fp8 cache). vLLM 0.25's Attention.__init__
    (model_executor/layers/attention/attention.py) sets kv_cache_dtype "fp8" where the quant config's
    kv_cache_scheme is set and the cache dtype is auto (CompressedTensorsConfig keeps kv_cache_scheme): the
    32,464 tokens printed are fp8 tokens already, and --kv-cache-dtype fp8 holds no more."""
    weights = {"num_bits": 8, "type": "float", "strategy": "channel"}
    scheme = {**FP8_KV_SCHEME, "strategy": "tensor", "symmetric": True}
    quant = {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": weights}}}
    shape = _shape({**quant, "kv_cache_scheme": scheme}, base=L8)
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 131072}, heal={"bounds": {"minMaxModelLen": 60000}})
    inv = Inventory(gpu_total_gib=79.2, shape=shape, release=V025)
    r = plan_heal(spec, classify(Signals(log=KV_REFUSAL)), inventory=inv, exclude=["RaiseGpuMemoryUtilization"])
    assert r.action != "Fp8KvCache", r.summary()


@pytest.mark.parametrize("extra", [{"bits": 4}, {"w_bit": 4}, {"group_size": 128}], ids=["bits", "w_bit", "group"])
def test_top_level_fields_do_not_override_compressed_tensors_groups(extra):
    """Severity: Medium (under-count of the weights: 2.00 GiB, 3.48 GiB with the group, on a 70B).
    Input: a compressed-tensors NVFP4 Llama-3.1-70B (config_groups weights num_bits 4, type float, group_size
    16) whose quantization_config also carries a top-level "bits": 4 (or "w_bit": 4, or "group_size": 128).
    Now: _weights_format reads the config_groups only where no top-level bits is given: with "bits" it returns
    (4, None, False), an int group-less guess, 0.531 B a weight: 37.81 GiB (before d5f7214, 39.81: _bits took
    the 4, _group and _float_weights still read the groups, a regression); with "group_size" 128 every group
    is weighed at 128: 36.33 GiB.
    Right: 39.81 GiB, what the groups say. vLLM 0.25's CompressedTensorsConfig.from_config builds its schemes
    from config_groups alone (compressed_tensors.py _quantization_scheme_map_from_config: weights' num_bits,
    type, group_size) and never reads a top-level bits, w_bit or group_size; CompressedTensorsW4A4Fp4 keeps a
    one-byte scale a 16 (tests/fixtures/gpu/quantized-runs/nvfp4.log)."""
    assert _gib(_shape(_ct())) == pytest.approx(39.81, abs=0.05)
    assert _gib(_shape(_ct(**extra))) >= 39.81 - 0.05


@pytest.mark.parametrize(
    "quant, right",
    [
        ({"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": -1}, 69.70),
        ({"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": 128}, 69.70),
        (
            {
                "quant_method": "modelopt",
                "group_size": 128,
                "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None},
            },
            39.81,
        ),
    ],
    ids=["mxfp8-channel", "mxfp8-g128", "nested-nvfp4-top-group"],
)
def test_modelopt_groups_are_the_ones_vllm_loads(quant, right):
    """Severity: Medium (under-count of the weights: 1.99 GiB, 1.50 GiB, 3.48 GiB on a 70B).
    Input: a ModelOpt MXFP8 Llama-3.1-70B whose config also says "group_size": -1 (or 128); a ModelOpt NVFP4
    one in hf_quant_config's nested layout (quantization.group_size 16) with a top-level "group_size": 128.
    Now: _weights_format takes the given group before MXFP8's default 32 (`_checked_group(given) or default`,
    and -1 is truthy): 67.71 GiB (1 B a weight) and 68.20 GiB; for the nested layout the top-level group comes
    before the nested one: NVFP4 in groups of 128, 36.33 GiB.
    Right: 69.70 GiB for MXFP8: vLLM 0.25's ModelOptMxFp8Config reads no group_size and
    ModelOptMxFp8LinearMethod.create_weights allocates weight_scale [N, K // MXFP8_BLOCK_SIZE (32)] whatever
    the config says; 39.81 GiB for the nested NVFP4: ModelOptQuantConfigBase.from_config reads group_size
    from `quantization` only where that object is present (group_size_raw = quant_config.get("group_size"))."""
    assert _gib(_shape(quant)) >= right - 0.05


@pytest.mark.parametrize("given", [None, [64, 64], [1, 1]], ids=["null", "64", "1"])
def test_fp8_pb_wo_blocks_are_fixed_whatever_the_config_says(given):
    """Severity: Medium (a heal or `plan` proposes a tensor-parallel size the checkpoint cannot load).
    Input: a ModelOpt FP8_PB_WO checkpoint of a Qwen2.5-72B-shaped model (Llama-3.1-70B's config with
    intermediate_size 29568) whose quantization_config also carries "weight_block_size": null ([64, 64], [1, 1]).
    Now: quant.get("weight_block_size", MODELOPT_BLOCKS[...]) takes the config's value where the key is there:
    null gives no blocks and splits() allows TP 1, 2, 4, 8; [64, 64] allows 1 and 2; [1, 1] allows all.
    Right: TP 1 only, as without the key. vLLM 0.25's ModelOptFp8PbWoLinearMethod fixes _WEIGHT_BLOCK_SIZE =
    (128, 128) and never reads weight_block_size; create_weights raises "ModelOpt FP8_PB_WO requires
    in_features divisible by 128" for down_proj's 29568 / 2 = 14784."""
    quant = {"quant_method": "modelopt", "quant_algo": "FP8_PB_WO", "weight_block_size": given}
    shape = _shape(quant, intermediate_size=29568, vocab_size=152064)
    assert [tp for tp in (1, 2, 4, 8) if shape.splits(tp)] == [1]


# Attacks that were defended.


@pytest.mark.parametrize("method", ["ModelOpt", "MODELOPT", "modelopt_fp4", "modelopt_mixed"])
def test_modelopt_cache_read_under_any_case_of_the_method(method):
    """vLLM lower-cases quant_method and writes it back (model_arch_config_convertor
    _normalize_quantization_config) before resolve_kv_cache_dtype_string's startswith("modelopt")."""
    shape = _shape({"quant_method": method, "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}, base=L8)
    assert shape.auto_kv_dtype == "fp8_e4m3" and shape.kv_bytes_per_token(None) == 65536


@pytest.mark.parametrize(
    "kv",
    [
        {"kv_cache_scheme": {**FP8_KV_SCHEME, "dynamic": True}},
        {"kv_cache_scheme": {"num_bits": 8, "type": "int", "dynamic": False}},
        {"kv_cache_scheme": {"num_bits": [8], "type": "float", "dynamic": False}},
        {"kv_cache_scheme": {"num_bits": {"a": 1}, "type": {"b": 2}, "dynamic": False}},
        {"kv_cache_quant_algo": "FP8 "},
        {"kv_cache_quant_algo": "fp8" + "x" * 100000},
        {"kv_cache_quant_algo": True},
        {"kv_cache_quant_algo": ["FP8"]},
        {"kv_cache_quant_algo": "INT8"},
    ],
)
def test_a_cache_vllm_does_not_resolve_stays_the_model_dtype(kv):
    """vLLM's get_kv_cache_quant_algo_string returns "auto" (or None) for these: the model dtype, 2 B."""
    try:
        shape = _shape({"quant_method": "modelopt", "quant_algo": "NVFP4", **kv}, base=L8)
    except ModelConfigError:
        return
    assert shape.auto_kv_dtype is None and shape.kv_bytes_per_token(None) == 131072


def test_the_first_named_cache_wins_as_in_vllm():
    """inner kv_cache_scheme, top kv_cache_scheme, inner kv_cache_quant_algo, top kv_cache_quant_algo."""
    quant = {
        "quant_method": "modelopt",
        "kv_cache_scheme": FP8_KV_SCHEME,
        "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "NVFP4"},
    }
    assert _shape(quant, base=L8).auto_kv_dtype == "fp8_e4m3"


def test_an_nvfp4_auto_cache_is_never_healed_to_fp8_and_plan_sizes_fp8_larger():
    """Under auto an nvfp4 cache is 0.5625 B an element; the fp8 heal is not offered, and plan's fp8 row is
    sized at 1 B (fewer tokens than auto), not taken for a halving."""
    shape = _shape({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}, base=L8)
    assert shape.kv_bytes_per_token(None) == 2 * 32 * 8 * (64 + 8)  # (nvfp4_kv_cache_full_dim(128) = 72 B)
    assert shape.kv_bytes_per_token("fp8") == 65536
    engine = parse_args("--max-model-len 8192").engine
    rows = {o.kv_cache_dtype: o.estimate.kv_tokens for o in options(shape, engine, lookup(H100), release=V025)}
    assert rows["fp8"] < rows["auto"]
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 131072}, heal={"bounds": {"minMaxModelLen": 60000}})
    inv = Inventory(gpu_total_gib=79.2, shape=shape, release=V025)
    r = plan_heal(spec, classify(Signals(log=KV_REFUSAL)), inventory=inv, exclude=["RaiseGpuMemoryUtilization"])
    assert r.action != "Fp8KvCache" and "kv_cache_dtype" not in r.changes


def test_an_explicit_cache_dtype_beats_the_checkpoints():
    """--kv-cache-dtype bfloat16 is not auto: vLLM runs it (resolve_kv_cache_dtype_string returns it)."""
    shape = _shape(MODELOPT_FP8_KVFP8, base=L8)
    assert shape.kv_bytes_per_token("bfloat16") == 131072 and shape.kv_bytes_per_token("auto") == 65536


def test_the_heaviest_group_is_never_lighter_than_either_format():
    int4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": False}
    groups = {"a": {"targets": ["re:.*mlp.*"], "weights": NVFP4}, "b": {"targets": ["re:.*attn.*"], "weights": int4}}
    mixed = _gib(_shape({"quant_method": "compressed-tensors", "config_groups": groups}))
    only_int = {"g": {"targets": ["Linear"], "weights": int4}}
    assert (
        mixed
        >= max(_gib(_shape(_ct())), _gib(_shape({"quant_method": "compressed-tensors", "config_groups": only_int})))
        - 0.01
    )


def test_mixed_widths_stay_unknown():
    w8 = {"num_bits": 8, "type": "float", "strategy": "channel"}
    groups = {"a": {"targets": ["re:.*mlp.*"], "weights": NVFP4}, "b": {"targets": ["re:.*attn.*"], "weights": w8}}
    shape = _shape({"quant_method": "compressed-tensors", "config_groups": groups})
    assert shape.quant_bits is None and _gib(shape) > 60


def test_a_bf16_running_models_fallback_is_sized_as_before():
    """Without a ModelOpt cache, the AWQ fallback's heal fits what the AWQ checkpoint holds."""
    bf16 = {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}
    r = _quantize_heal(L40S, bf16)
    assert r.action == "Quantize" and r.changes["max_model_len"] == 6992
    assert _awq_estimate(L40S, r.changes).fits
