"""Hostile review (session 37d) of ebe1afd, 2135a24 and 8b34cea: quant_config's reading order (ModelOpt's
quant_algo, compressed-tensors' config_groups, GPTQ/AWQ's keys), the checkpoint's own cache under
--kv-cache-dtype auto (ModelShape.auto_kv_dtype) and its consumers. Ground truth: vLLM 0.25's source
(transformers_utils/config.py, transformers_utils/model_arch_config_convertor.py, utils/torch_utils.py,
model_executor/layers/attention/attention.py, quantization/modelopt.py, compressed_tensors/compressed_tensors.py).
Four defects (six strict xfails with their parameters) when found, all fixed the same session; the plain
tests at the end are attacks that were defended."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import check, to_shape
from vllm_autoheal.model_files import from_path
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import CONFIGS

GIB = 2**30
H100 = "NVIDIA-H100-80GB-HBM3"
V025 = parse_version("0.25.0")
L8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
L70 = json.loads((CONFIGS / "llama-3.1-70b.json").read_text())
FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel"}
FP8_KV_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
MODELOPT_FP8_KVFP8 = {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
KV_REFUSAL = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (8.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (1.98 GiB). Based on the available memory, "
    "the estimated maximum model length is 32464. Try increasing"
)


def _shape(quant: dict | None, base: dict = L8):
    config = dict(base)
    if quant is not None:
        config["quantization_config"] = quant
    return to_shape(check(config))


def _kv_heal(shape, engine: dict | None = None):
    spec = VLLMServiceSpec(
        model="m", engine={"maxModelLen": 131072, **(engine or {})}, heal={"bounds": {"minMaxModelLen": 60000}}
    )
    inv = Inventory(gpu_total_gib=79.2, shape=shape, release=V025)
    return plan_heal(spec, classify(Signals(log=KV_REFUSAL)), inventory=inv, exclude=["RaiseGpuMemoryUtilization"])


@pytest.mark.parametrize("dtype", ["bfloat16", "half"])
def test_an_explicit_model_dtype_keeps_the_checkpoints_auto_cache(dtype):
    """Severity: Medium (the cache sized at half what vLLM holds: diagnosis, pre-flight and plan numbers).
    Input: Llama-3.1-8B ModelOpt FP8 with kv_cache_quant_algo FP8 (nvidia/Llama-3.1-8B-Instruct-FP8's config),
    served with --dtype bfloat16 (or half) and --kv-cache-dtype auto, on an H100, vLLM 0.25.
    Now: 131,072 bytes a token, 505,200 tokens of cache (memory.kv_cache_dtype turns auto into --dtype's
    "bfloat16", and ModelShape.kv_bytes_per_token reads auto_kv_dtype only for None/"auto"); with no --dtype,
    65,536 bytes and 1,010,416 tokens.
    Right: 65,536 bytes a token and 1,010,416 tokens whatever --dtype says: vLLM 0.25's
    engine/arg_utils.py create_engine_config resolves the cache with resolve_kv_cache_dtype_string(
    self.kv_cache_dtype, model_config), which looks at kv_cache_dtype and the quantization_config only
    (utils/torch_utils.get_kv_cache_quant_algo_string -> "fp8_e4m3"); --dtype sets the activations."""
    shape = _shape(MODELOPT_FP8_KVFP8)
    est = estimate(shape, parse_args(f"--dtype {dtype}").engine, lookup(H100), None, "server", V025)
    assert est.kv_bytes_per_token == 65536
    assert est.kv_tokens == estimate(shape, parse_args("").engine, lookup(H100), None, "server", V025).kv_tokens


@pytest.mark.parametrize("method", ["compressed_tensors", "Compressed-Tensors"])
def test_a_compressed_tensors_cache_is_read_whatever_the_method_spelling(method):
    """Severity: Medium (an fp8 KV heal that changes nothing, and the cache counted at twice its bytes).
    Input: Llama-3.1-8B compressed-tensors FP8 (config_groups weights num_bits 8 float, channel) with
    kv_cache_scheme {num_bits 8, type float, dynamic false, strategy tensor}, its quant_method spelled
    "compressed_tensors" (or "Compressed-Tensors"); max_model_len 131,072, vLLM refuses with 1.98 GiB
    available and an estimated maximum model length of 32,464; minMaxModelLen 60,000.
    Now: auto_kv_dtype None, 131,072 bytes a token; the heal is Fp8KvCache --kv-cache-dtype fp8
    --max-model-len 64272 ("about 64,928 here"); spelled "compressed-tensors" it is 65,536 bytes and GiveUp.
    Right: as "compressed-tensors": vLLM 0.25's transformers_utils/model_arch_config_convertor.py
    _normalize_quantization_config lower-cases quant_method and replaces "compressed_tensors" with
    "compressed-tensors" (in the dict itself), so CompressedTensorsConfig keeps the kv_cache_scheme and
    attention.py runs an fp8 cache under auto: the 32,464 tokens are fp8 tokens already."""
    quant = {
        "quant_method": method,
        "config_groups": {"g": {"targets": ["Linear"], "weights": FP8_CHANNEL}},
        "kv_cache_scheme": FP8_KV_SCHEME,
    }
    shape = _shape(quant)
    assert shape.kv_bytes_per_token(None) == 65536
    r = _kv_heal(shape)
    assert r.action != "Fp8KvCache", r.summary()


def test_modelopt_excluded_layers_are_weighed_at_the_model_dtype():
    """Severity: High (under-count of the weights by about 16 GiB on a 70B: a fit promised that OOMs).
    Input: Llama-3.1-70B ModelOpt NVFP4 (quantization {quant_algo NVFP4, group_size 16, exclude_modules
    ["lm_head", "model.layers.*.self_attn*"]}, the layout of nvidia/DeepSeek-R1-FP4 which keeps attention in
    bf16), one GPU, H100.
    Now: 39.81 GiB of weights, exactly what the same config weighs with exclude_modules ["lm_head"]: the
    attention projections (80 x 8192 x 18,432 = 12.08 B parameters) are counted at NVFP4's 0.5625 B.
    Right: at least 39.81 + 12.08e9 x (2 - 0.5625) B = 56.0 GiB: vLLM 0.25's ModelOptQuantConfigBase.from_config
    keeps exclude_modules (config.json's "ignore"), and get_quant_method gives an excluded layer
    UnquantizedLinearMethod, which loads it in the model dtype (bf16, 2 B a weight)."""
    quant = {
        "quant_method": "modelopt",
        "quantization": {
            "quant_algo": "NVFP4",
            "group_size": 16,
            "exclude_modules": ["lm_head", "model.layers.*.self_attn*"],
        },
    }
    attention = 80 * 8192 * (2 * 8192 + 2 * 1024)
    gib = weights_bytes_per_gpu(_shape(quant, L70), capability=(9, 0)) / GIB
    assert gib >= 39.8 + attention * (2 - 0.5625) / GIB - 0.5, f"{gib:.2f} GiB"


def test_a_modelopt_hf_quant_config_json_counts(tmp_path):
    """Severity: Medium (the weights weighed at bf16, the cache at twice its bytes, an fp8 heal that changes
    nothing; a later step's OOM placed as a loading one against 15.0 GiB of weights).
    Input: a local Llama-3.1-8B directory whose config.json has no quantization_config and whose
    hf_quant_config.json is {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8",
    "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}} (ModelOpt 0.29 and before).
    Now: quantization None, auto_kv_dtype None: 15.00 GiB of weights, 131,072 bytes a token of cache.
    Right: ModelOpt FP8 with an fp8_e4m3 cache (8.50 GiB, 65,536 bytes a token, as the same settings weigh in
    config.json): vLLM 0.25's transformers_utils/config.py reads hf_quant_config.json where config.json has
    no quantization_config ("ModelOpt 0.29.0 and before saves the quantization config in a separate
    hf_quant_config.json"), and model_arch_config_convertor sets quant_method "modelopt" from
    producer.name; torch_utils.get_kv_cache_quant_algo_string then resolves auto to fp8_e4m3."""
    (tmp_path / "config.json").write_text(json.dumps(L8))
    hf_quant = {
        "producer": {"name": "modelopt", "version": "0.19.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
    }
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    shape = to_shape(from_path(str(tmp_path)))  # (the fields from_path checked: a second check reads them declared)
    assert shape.auto_kv_dtype == "fp8_e4m3"
    assert weights_bytes_per_gpu(shape, capability=(9, 0)) / GIB < 9.0


# Attacks that were defended.


def test_modelopt_method_casing_reads_its_cache():
    """quant_method "ModelOpt": vLLM lower-cases it (model_arch_config_convertor) before torch_utils reads it."""
    quant = {**MODELOPT_FP8_KVFP8, "quant_method": "ModelOpt"}
    assert _shape(quant).auto_kv_dtype == "fp8_e4m3"


def test_a_compressed_tensors_config_with_a_modelopt_algo_is_weighed_by_its_groups():
    """compressed-tensors ignores quant_algo: an 8-bit group is weighed at 8 bits, not NVFP4's 4."""
    quant = {
        "quant_method": "compressed-tensors",
        "quant_algo": "NVFP4",
        "config_groups": {"g": {"targets": ["Linear"], "weights": FP8_CHANNEL}},
    }
    shape = _shape(quant)
    assert (shape.quant_bits, shape.quant_float) == (8, True)


def test_a_modelopt_kv_scheme_without_dynamic_false_is_the_model_dtype():
    """get_kv_cache_quant_algo_string returns "auto" for an fp8 scheme not marked dynamic false."""
    quant = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}
    assert _shape(quant).auto_kv_dtype is None


def test_an_nvfp4_auto_cache_is_not_healed_to_fp8():
    """A heal never writes fp8 over a checkpoint's nvfp4 cache (which would make the cache larger)."""
    quant = {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}}
    assert _kv_heal(_shape(quant)).action != "Fp8KvCache"
