"""The shared experts' width as vLLM builds it: DeepSeek's n_shared_experts of moe_intermediate_size, Bailing's
num_shared_experts of (moe_shared_expert_intermediate_size or moe_intermediate_size) and Nemotron-H's
n_shared_experts of moe_shared_expert_intermediate_size, each one MLP that wide (bailing_moe.py, nemotron_h.py:
`intermediate_size *= config.num_shared_experts`); Qwen-MoE's shared_expert_intermediate_size as it is."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.model_config import ModelConfigError, parse, to_shape

# inclusionAI/Ling-lite-1.5's config.json (BailingMoeForCausalLM), as a public port's test reproduces it verbatim
# (find_string id 58554451241; the same test reads the checkpoint's mlp.shared_experts.gate_proj.weight as
# [2816, 2048]: 2 shared experts of 1408, one MLP). Fields not read by the memory model left out.
LING_LITE = {
    "architectures": ["BailingMoeForCausalLM"],
    "first_k_dense_replace": 0,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 1408,
    "max_position_embeddings": 32768,
    "model_type": "bailing_moe",
    "moe_intermediate_size": 1408,
    "num_experts": 64,
    "num_shared_experts": 2,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_qkv_bias": False,
    "vocab_size": 126464,
}
# By hand, as bailing_moe.py builds it: untied 126464 x 2048 embedding and head; each of 28 layers attention
# (16 x 128 queries, 4 KV heads) 10,485,760, 64 experts x gate/up/down 2048 x 1408 553,648,128, router 131,072,
# shared experts gate/up/down 2048 x 2816 17,301,504, two norms; the final norm: 16.80 B (inclusionAI: 16.8 B).
LING_LITE_PARAMS = 2 * 126464 * 2048 + 28 * (10_485_760 + 553_648_128 + 131_072 + 17_301_504 + 2 * 2048) + 2048


def _shape(config: dict):
    return to_shape(parse(json.dumps(config), "cm"))


def test_bailing_shared_experts_are_num_shared_experts_wide():
    shape = _shape(LING_LITE)
    assert shape.shared_intermediate == 2 * 1408
    assert abs(shape.params() - LING_LITE_PARAMS) <= 0.001 * LING_LITE_PARAMS  # (it was 2.9 % under: 16.32 B)


@pytest.mark.parametrize(
    "fields, width",
    [
        ({"moe_shared_expert_intermediate_size": 512, "num_shared_experts": 2}, 1024),  # Ling 2.0's spelling
        ({"moe_shared_expert_intermediate_size": 512, "n_shared_experts": 3}, 1536),  # Nemotron-H's
        ({"moe_shared_expert_intermediate_size": 512}, 512),  # (a count left to the config class's default: one)
        ({"num_shared_experts": 0}, 0),
        ({"shared_expert_intermediate_size": 5632, "n_shared_experts": 4}, 5632),  # Qwen-MoE's: one, that wide
    ],
)
def test_shared_expert_width_by_each_spelling(fields, width):
    config = {k: v for k, v in LING_LITE.items() if k != "num_shared_experts"} | fields
    assert _shape(config).shared_intermediate == width


def test_a_shared_expert_count_out_of_range_is_refused_by_name():
    with pytest.raises(ModelConfigError, match="num_shared_experts"):
        parse(json.dumps(LING_LITE | {"num_shared_experts": 1000}), "cm")


def test_moe_layers_the_memory_model_cannot_place_are_refused_by_name():
    """ERNIE-4.5's MoE layers run from moe_layer_start_index to moe_layer_end_index (ernie45_moe.py); an end before
    the last layer, or Step-3's moe_layers_enum, places them where the model does not count them."""
    from test_review_session45_memory import ERNIE45_21B_A3B

    with pytest.raises(ModelConfigError, match="moe_layer_end_index"):
        parse(json.dumps(ERNIE45_21B_A3B | {"moe_layer_end_index": 20}), "cm")
    with pytest.raises(ModelConfigError, match="moe_layer_end_index"):
        parse(json.dumps(ERNIE45_21B_A3B | {"moe_layer_end_index": [27, 27]}), "cm")  # (ERNIE-4.5-VL's lists)
    step3 = {k: v for k, v in ERNIE45_21B_A3B.items() if not k.startswith("moe_layer")}
    with pytest.raises(ModelConfigError, match="moe_layers_enum"):
        parse(json.dumps(step3 | {"moe_layers_enum": "1,2,3"}), "cm")
    # (ERNIE's own layout: the first layer dense, MoE in every later one)
    shape = _shape(ERNIE45_21B_A3B)
    assert (shape.dense_layers, shape.moe_layer_count(28), shape.experts_per_token) == (1, 27, 6)
