"""Hostile review (session 38c) of d92254a..HEAD: the layers a model holds (quant_exclusions.Layers, layers_of) and
the share of a dense MLP a skip list leaves unquantized (quant_exclusions.mlp_share, read into
model_weights.weights_bytes_per_gpu as ModelShape.dense_mlp).

Ground truth: vLLM 0.25's source (/work/main/.gpu/dl/site/vllm): models/nemotron.py and models/arcee.py (an MLP of
up_proj and down_proj alone, ReLU squared: no gate), models/llama4.py Llama4DecoderLayer (a layer whose
(index + 1) % interleave_moe_layer_step != 0 is a dense LlamaMLP under "feed_forward", intermediate_size_mlp
wide), models/deepseek_v2.py DeepseekV2DecoderLayer (layer_idx < first_k_dense_replace: a dense DeepseekV2MLP
under "mlp"), quantization/fp8.py get_quant_method and utils/quant_utils.py is_layer_skipped (an exact name
skipped: UnquantizedLinearMethod, the model's dtype), compressed_tensors/utils.py should_ignore_layer
(re.match of a "re:" entry).

The xfail(strict) tests are defects: each asserts the right behaviour and fails now. The plain tests at the end
pin what is right."""

from __future__ import annotations

import copy
import json
import time

import pytest

from vllm_autoheal.model_config import check, parse, to_shape
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.quant_exclusions import Layers, layers_of

from samples import CONFIGS

GIB = 2**30
L8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
DSV2_LITE = json.loads((CONFIGS / "deepseek-v2-lite.json").read_text())
DSV3 = json.loads((CONFIGS / "deepseek-v3.json").read_text())
QWEN3_MOE = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
PHI35 = json.loads((CONFIGS / "phi-3.5-mini.json").read_text())
SCOUT = json.loads((CONFIGS / "llama-4-scout-17b-16e.json").read_text())
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
CT_FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": FP8_CHANNEL}},
}

# Nemotron-Mini-4B's shape (model_type nemotron, hidden_act relu2): vLLM's NemotronMLP is up_proj and down_proj
NEMOTRON = {
    "architectures": ["NemotronForCausalLM"],
    "model_type": "nemotron",
    "hidden_act": "relu2",
    "hidden_size": 3072,
    "intermediate_size": 9216,
    "num_hidden_layers": 32,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "partial_rotary_factor": 0.5,
    "vocab_size": 256000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# Llama 4 Maverick's text model (Scout's fixture with Maverick's layout): 128 experts in every other layer, the
# others dense MLPs of intermediate_size_mlp (vLLM's Llama4DecoderLayer: (i + 1) % 2 == 0 is MoE)
MAVERICK = copy.deepcopy(SCOUT)
MAVERICK["text_config"].update(
    interleave_moe_layer_step=2, num_local_experts=128, num_hidden_layers=48, intermediate_size_mlp=16384
)


def _fields(quant: dict, base: dict = L8) -> dict:
    return check({**base, "quantization_config": quant})


def _gib(fields: dict) -> float:
    return weights_bytes_per_gpu(to_shape(fields), capability=(9, 0)) / GIB


def _text(config: dict) -> dict:
    """The merged view check() reads (text_config over the top level)."""
    return {**{k: v for k, v in config.items() if k != "text_config"}, **config.get("text_config", {})}


def test_nemotron_fp8_with_every_down_proj_skipped_weighs_half_its_mlp_in_bf16():
    """Severity: medium (an under-count of the weights, the thing the module exists to prevent).
    Input: a Nemotron (model_type nemotron, hidden_act relu2; Arcee's AFM is the same MLP) fp8 checkpoint whose
    ignored_layers name every layer's mlp.down_proj. vLLM's NemotronMLP has up_proj and down_proj alone (no
    gate); Fp8Config.get_quant_method -> is_layer_skipped (exact name) -> UnquantizedLinearMethod: each
    down_proj, half the MLP (hidden x intermediate), loads in bf16.
    Now: quant_exclusions.mlp_share counts Llama's thirds whatever the model ('dense_mlp': 0.3333), and the
    shape (gated_mlp False: 2 x hidden x intermediate) weighs a third of that: 5.97 GiB where vLLM holds at
    least 5.41 + 32 x 3072 x 9216 B = 6.25 GiB (0.28 GiB under; on Nemotron-4-340B's shape tens of GiB).
    Right: the share is a half for each of up and down where the model's MLP is not gated (or 1.0 where the
    model's MLP layout is not Llama's gated three): never below what vLLM leaves in bf16."""
    layers, hidden, inter = 32, 3072, 9216
    fp8 = _gib(_fields(FP8, NEMOTRON))
    skipped = _fields({**FP8, "ignored_layers": [f"model.layers.{i}.mlp.down_proj" for i in range(layers)]}, NEMOTRON)
    assert skipped["quantization_config"]["dense_mlp"] >= 0.5
    assert _gib(skipped) >= fp8 + layers * hidden * inter / GIB - 0.01


def test_maverick_skipping_its_dense_layers_down_proj_is_weighed():
    """Severity: medium (an under-count of about 1.9 GiB).
    Input: Llama 4 Maverick's text model (interleave_moe_layer_step 2: 24 of its 48 layers are dense LlamaMLPs
    under 'feed_forward', intermediate_size_mlp 16384 wide) in compressed-tensors fp8 whose ignore list is
    're:.*feed_forward\\.down_proj$'. vLLM's should_ignore_layer re.match-es it on each dense layer's
    'language_model.model.layers.N.feed_forward.down_proj' (the routed experts are 'feed_forward.experts', the
    shared one 'feed_forward.shared_expert.down_proj': not matched): 24 x 5120 x 16384 weights in bf16.
    Now: layers_of reads dense layers only from first_k_dense_replace, mlp_only_layers, moe_layer_freq and
    decoder_sparse_step, so Layers(dense=False): the entry matches no candidate, nothing is weighed (376.73 GiB
    with and without the list), although the shape itself knows the dense layers (model_layers.moe_layers).
    Right: interleave_moe_layer_step > 1 (and Jamba's expert_layer_period > 1) means dense layers; the skipped
    projections weigh at least 1.875 GiB more."""
    plain = _gib(_fields(CT_FP8, MAVERICK))
    skipped = _fields({**CT_FP8, "ignore": ["re:.*feed_forward\\.down_proj$"]}, MAVERICK)
    assert "dense_mlp" in skipped["quantization_config"]
    assert _gib(skipped) >= plain + 24 * 5120 * 16384 / GIB - 0.01


def test_deepseek_v2_lite_first_dense_layer_skipped_is_weighed():
    """Severity: low (an under-count of 21 MiB here; GLM-4.5-Air's one dense layer, 128 MiB).
    Input: DeepSeek-V2-Lite (first_k_dense_replace 1, moe_layer_freq 1) in fp8 whose ignored_layers name
    'model.layers.0.mlp.down_proj'. vLLM's DeepseekV2DecoderLayer makes layer_idx < first_k_dense_replace a
    dense DeepseekV2MLP under 'mlp': layer 0's down_proj (2048 x 10944) is skipped and loads in bf16.
    Now: layers_of treats 1 as 'every layer MoE' for every DENSE_LAYER_KEYS key (right for moe_layer_freq and
    decoder_sparse_step, wrong for first_k_dense_replace, where 1 is one dense layer): Layers(dense=False), the
    entry matches nothing, the weights are those of the list-less checkpoint.
    Right: first_k_dense_replace >= 1 means dense layers; the skipped projection is weighed."""
    plain = _gib(_fields(FP8, DSV2_LITE))
    skipped = _fields({**FP8, "ignored_layers": ["model.layers.0.mlp.down_proj"]}, DSV2_LITE)
    assert "dense_mlp" in skipped["quantization_config"]
    assert _gib(skipped) >= plain + 2048 * 10944 / GIB - 0.001


def test_many_plain_entries_in_every_skip_list_are_cheap():
    """Severity: low (a slow read of a hostile config under the 1 MiB limit, on the operator's reconcile path).
    Input: a quantization_config of a method vLLM has no skip list for ('foo': all five lists are read, matched
    as substrings), each list 4096 entries (the MAX_NAMES limit): one 'mlp.down_proj' and 4095 names like
    '.h.1.h.1...N' (a dotted index _INDEX rewrites, six times an entry). 650 KB in all.
    Now: quant_exclusions.skipped builds a matcher and tests it on about 110 names per entry, then mlp_share
    builds it again and tests ~60 more: about 1.0 s on this machine (0.84 s before mlp_share; 'dense_mlp' 0.3333).
    Right: under 0.5 s (a bound on entries times names, or each entry's matcher built and run once)."""
    keys = ("exclude_modules", "ignore", "ignored_layers", "modules_to_not_convert", "llm_int8_skip_modules")
    names = ["mlp.down_proj"] + [".h.1" * 6 + str(i) for i in range(4095)]
    raw = json.dumps({**L8, "quantization_config": {"quant_method": "foo", **{k: names for k in keys}}})
    assert len(raw) < 1 << 20
    start = time.perf_counter()
    parse(raw)
    assert time.perf_counter() - start < 0.5


# What is right now: kept as is


def test_llama_fp8_every_down_proj_skipped_is_a_third_of_the_mlp():
    """vLLM's LlamaMLP: gate, up, down equal (hidden x intermediate each): a third each."""
    quant = _fields({**FP8, "ignored_layers": [f"model.layers.{i}.mlp.down_proj" for i in range(32)]})
    assert quant["quantization_config"]["dense_mlp"] == pytest.approx(1 / 3, abs=1e-4)


def test_phi3_fused_gate_up_skipped_is_two_thirds():
    """Phi-3's checkpoint holds gate_up_proj fused (is_layer_skipped honours the fused name): gate and up."""
    quant = _fields({**FP8, "ignored_layers": ["model.layers.0.mlp.gate_up_proj"]}, PHI35)
    assert quant["quantization_config"]["dense_mlp"] == pytest.approx(2 / 3, abs=1e-4)


def test_a_substring_entry_naming_the_whole_mlp_weighs_all_of_it():
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "modules_to_not_convert": ["mlp"]}
    assert _fields(awq)["quantization_config"]["dense_mlp"] == 1.0


def test_layers_of_the_common_moe_layouts():
    assert layers_of(QWEN3_MOE) == Layers(dense=False, shared=False, experts=True, mixers=False, linear=False)
    assert layers_of(DSV3).dense  # (first_k_dense_replace 3)
    assert layers_of(L8) == Layers(dense=True, shared=False, experts=False, mixers=False, linear=False)
    assert not layers_of(_text(SCOUT)).dense  # (interleave_moe_layer_step 1: every layer MoE)


def test_a_declared_share_out_of_range_is_dropped_not_raised():
    for share in (float("nan"), float("inf"), -1, 10**400, "1", True):
        fields = check({**L8, "quantization_config": {**FP8, "dense_mlp": share}}, declared=True)
        assert 0.0 <= to_shape(fields).dense_mlp <= 1.0
