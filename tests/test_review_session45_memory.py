"""Session 45 attack review of the memory model's three changes: 8588540 (a config.json's NaN/Infinity read as
config_field.NonFinite, refused only where a field read holds one; Nemotron-3 Super's latent MoE, moe_latent_size
wide with ReplicatedLinear projections) and b59dfbc (shared experts: moe_shared_expert_intermediate_size x
n_shared_experts / num_shared_experts). Each defect was a strict xfail; all four are fixed this session (the latent
projections weighed in the model's dtype, whole on every rank; a deepstack list entry that is no layer number
refused; ERNIE-4.5's and Aria's moe_num_experts, moe_k/moe_topk, moe_num_shared_experts, moe_layer_start_index and
moe_layer_interval read, a moe_layer_end_index before the last layer refused, Step-3's moe_layers_enum and
share_expert_dim refused; a shared expert's count times the routed experts' width, intermediate_size where there is
no moe_intermediate_size). Figures are per GPU, bf16 unless said.

1. Latent MoE, quantized: NVIDIA's FP8 (and NVFP4) Nemotron-3 Super keeps its "MoE latent projection GEMM" in
   BF16 (NVIDIA's quantization page), and vLLM's nemotron_h.py says so too ("ModelOpt excludes the latent
   projections, so quantized checkpoints still get an UnquantizedLinearMethod here"): its ignore list names
   fc1_latent_proj / fc2_latent_proj, which ModelOptFp8Config.is_layer_excluded matches (fnmatch). quant_exclusions
   has no candidate name for them, so the entries change nothing and the 40 x 2 x 4096 x 1024 = 335,544,320
   projection weights are weighed at fp8's 1 byte where vLLM holds 2, whole on every rank (ReplicatedLinear): the
   model says 14.519 GiB a GPU at --tensor-parallel-size 8 with or without those entries; vLLM loads 0.3125 GiB more
   on every GPU (14.83 GiB). An under-count at any TP.
2. NonFinite silently read: vision_config.deepstack_visual_indexes, a list model_config reads (vision_tower counts
   one Qwen3-VL merger per entry), drops a NaN entry instead of refusing it: [NaN, 16, 24] counts 2 deepstack
   mergers where vLLM's Qwen3_VisionTransformer builds len(list) = 3 (qwen3_vl.py: deepstack_merger_list over
   range(len(self.deepstack_visual_indexes)); `layer_num in` never matches the NaN, so it loads and runs). Qwen3-VL-8B:
   one merger (4608 x 4608 + 4608 x 4096 = 40,108,032 weights) missing, 16.295 GiB said where vLLM loads 16.370
   (plan --model-config answers exit 0 with the lower figure). Before 8588540 the whole config was refused.
3. Shared experts, ERNIE-4.5 MoE (Ernie4_5_MoeForCausalLM, ernie45_moe.py): its keys are moe_num_experts and
   moe_num_shared_experts (shared width moe_intermediate_size x moe_num_shared_experts), neither in model_config's
   FIELDS, so check() drops them and the model is weighed as a dense 28-layer model: ERNIE-4.5-21B-A3B (its
   config.json verbatim) 3.35 B parameters, 6.28 GiB, where vLLM builds 21,825,437,888 (Baidu's 21 B): 40.69 GiB;
   the shared experts are counted 0 (vLLM: 2 x 1536 = 3072 wide in each of 27 MoE layers). (Aria's text model,
   moe_num_experts / moe_num_shared_experts, and Step3 / Step-3.5, moe_num_experts / share_expert_dim, share the
   unread keys; not tested here.)
4. Shared experts, Cohere2-MoE (Cohere2MoeForCausalLM, cohere2_moe.py): the shared expert is
   intermediate_size x num_shared_experts wide, as its routed experts are intermediate_size wide (no
   moe_intermediate_size in transformers' Cohere2MoeConfig). b59dfbc now reads num_shared_experts, but
   shared_expert_of multiplies it by moe_intermediate_size, which the family does not have: 1 x 0 = 0. With
   Cohere2MoeConfig's own sizes (hidden 8192, intermediate 22528, 40 layers) that is 553,648,128 weights a layer,
   22.15 B in all (41.25 GiB) not counted.

Held: no NaN/Infinity/-Infinity placed anywhere in the 79 fixture configs (every leaf, list item and container,
every FIELD/alias, STRINGS, BOOLEANS, layer lists, quantization_config's keys and lists, vision_config's fields, in
text_config too) raised anything but ModelConfigError, and none reached to_shape (the checked fields hold no
NonFinite); a read field holding one is refused by name on the CLI (exit 2, no traceback: moe_latent_size,
quantization_config.bits), and one in a skip list, config_groups or `dynamic` reads as "unknown" (an over-count).
The Hub and annotation/ConfigMap paths go through model_config.parse; the CRD's inline is pydantic-typed
(bounded floats refuse NaN/inf) and the API server's JSON carries none. The latent width is read only by
nemotron_h.py in vLLM 0.32 (use_latent_moe), the projections are whole on every rank (the `replicated` term),
mxfp4 padding now pads the latent width, activation/workspace estimates sized from hidden_size over-count a latent
MoE (the safe side). Shared experts agree with vLLM for DeepSeek-V2/V3, GLM-4.x MoE, AXK1, OpenPangu, Afmoe,
EXAONE-MoE, K2-Horizon (n/num_shared_experts x moe_intermediate_size), Bailing/Ling, Sarvam, Nemotron-H
(moe_shared_expert_intermediate_size x count), Qwen2/3-MoE, Qwen3-Next, Laguna, InternS2 (shared_expert_
intermediate_size), Granite MoE shared (shared_intermediate_size), Llama 4. Param2MoE's
moe_shared_expert_intermediate_size is the total (param2moe.py does not multiply it): read x num_shared_experts it
would over-count where that is above 1 (no real config seen; the safe side).
"""

from __future__ import annotations

import json

from vllm_autoheal.config_field import ModelConfigError
from vllm_autoheal.diagnosis.units import GIB
from vllm_autoheal.model_config import parse, to_shape
from vllm_autoheal.model_weights import weights_bytes_per_gpu

from samples import CONFIGS

SUPER = CONFIGS / "unseen5" / "nemotron-3-super-120b-a12b-fp8.json"
QWEN3_VL_8B = CONFIGS / "unseen3" / "qwen3-vl-8b-instruct.json"


def _weights_gib(config: dict, tp: int = 1) -> float:
    return weights_bytes_per_gpu(to_shape(parse(json.dumps(config), "cm")), tp=tp) / GIB


# ---------------------------------------------------------------------------------------------------
# 1. A latent MoE's projections, left in BF16 by a quantized checkpoint, weighed at the quantized width.

# ModelOpt's config.json form (quant_method modelopt, its ignore list): attention and the latent projections in
# BF16, as NVIDIA's FP8 Nemotron-3 Super keeps them.
ATTENTION_SKIPS = ["*q_proj*", "*k_proj*", "*v_proj*", "*o_proj*"]
LATENT_SKIPS = ["*fc1_latent_proj*", "*fc2_latent_proj*"]
# 40 MoE layers x (fc1 4096 -> 1024 + fc2 1024 -> 4096), one byte more each in BF16 than in fp8, on every rank.
LATENT_EXTRA_GIB = 40 * 2 * 4096 * 1024 * (2 - 1) / GIB


def _super_fp8(ignore: list[str]) -> dict:
    config = json.loads(SUPER.read_text())
    config["quantization_config"] = {
        "quant_method": "modelopt",
        "quant_algo": "FP8",
        "kv_cache_quant_algo": "FP8",
        "producer": {"name": "modelopt"},
        "ignore": ignore,
    }
    return config


def test_latent_projections_a_fp8_checkpoint_leaves_in_bf16_are_weighed_in_bf16():
    """Fixed (session 45): the projections are weighed in the model's dtype under any method (ModelOpt leaves them
    so; an online fp8 would quantize them: a 0.16 GiB over-count, the safe side), whole on every rank."""
    without = _weights_gib(_super_fp8(ATTENTION_SKIPS), tp=8)
    with_latent = _weights_gib(_super_fp8(ATTENTION_SKIPS + LATENT_SKIPS), tp=8)
    assert without == with_latent
    assert abs(with_latent - (14.519 + LATENT_EXTRA_GIB)) < 0.01, with_latent  # (14.519: all of it fp8, as before)


# ---------------------------------------------------------------------------------------------------
# 2. A NaN in a list the memory model reads, dropped instead of refused.


def test_a_nan_in_deepstack_visual_indexes_is_refused_or_counted():
    text = QWEN3_VL_8B.read_text()
    config = json.loads(text)
    assert config["vision_config"]["deepstack_visual_indexes"] == [8, 16, 24]
    config["vision_config"]["deepstack_visual_indexes"][0] = float("nan")
    poisoned = json.dumps(config)  # (Python's json writes NaN, as a config.json may hold it)
    assert "[NaN, 16, 24]" in poisoned
    plain = to_shape(parse(text, "cm")).vision_params
    try:
        counted = to_shape(parse(poisoned, "cm")).vision_params
    except ModelConfigError as exc:
        assert "deepstack_visual_indexes" in str(exc)
        return
    assert counted == plain, f"{counted:,} vision weights counted, vLLM builds {plain:,}"


# ---------------------------------------------------------------------------------------------------
# 3. ERNIE-4.5 MoE: experts and shared experts under keys model_config does not read.

# baidu/ERNIE-4.5-21B-A3B-PT's config.json (as published; torch_dtype added, bf16 as shipped).
ERNIE45_21B_A3B = {
    "architectures": ["Ernie4_5_MoeForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "intermediate_size": 12288,
    "max_position_embeddings": 131072,
    "model_type": "ernie4_5_moe",
    "moe_intermediate_size": 1536,
    "moe_k": 6,
    "moe_layer_end_index": 27,
    "moe_layer_interval": 1,
    "moe_layer_start_index": 1,
    "moe_num_experts": 64,
    "moe_num_shared_experts": 2,
    "num_attention_heads": 20,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_bias": False,
    "vocab_size": 103424,
}
# As ernie45_moe.py builds it: tied 103424 x 2560 embedding (264,765,440); 28 attention layers (q/o 2560 x 2560,
# k/v 2560 x 512: 15,728,640 each); layer 0 a dense MLP 3 x 2560 x 12288 (94,371,840); layers 1..27 MoE (use_moe,
# start 1, end 27, interval 1): 64 experts x 3 x 2560 x 1536, shared experts 3 x 2560 x (1536 x 2), router 2560 x 64
# and its 64 correction biases (778,731,584 each); 57 norms of 2560.
ERNIE45_PARAMS = 264_765_440 + 28 * 15_728_640 + 94_371_840 + 27 * 778_731_584 + 57 * 2560


def test_ernie45_moe_experts_and_shared_experts_are_counted():
    shape = to_shape(parse(json.dumps(ERNIE45_21B_A3B), "cm"))
    assert (shape.experts, shape.shared_intermediate) == (64, 2 * 1536)
    expected = ERNIE45_PARAMS * 2 / GIB
    assert abs(_weights_gib(ERNIE45_21B_A3B) - expected) <= 0.05 * expected


# ---------------------------------------------------------------------------------------------------
# 4. Cohere2-MoE: the shared expert is intermediate_size x num_shared_experts wide.

# transformers' Cohere2MoeConfig defaults (configuration_cohere2_moe.py), with one shared expert as CohereLabs'
# North / Command A+ MoE checkpoints run one; its routed experts are intermediate_size wide too (cohere2_moe.py).
COHERE2_MOE = {
    "architectures": ["Cohere2MoeForCausalLM"],
    "model_type": "cohere2_moe",
    "vocab_size": 256000,
    "hidden_size": 8192,
    "intermediate_size": 22528,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "sliding_window_pattern": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "shared_expert_combination_strategy": "average",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def test_cohere2_moe_shared_expert_is_intermediate_size_wide():
    shape = to_shape(parse(json.dumps(COHERE2_MOE), "cm"))
    assert shape.moe_intermediate == 22528  # (its routed experts: read right)
    assert shape.shared_intermediate == 22528 * 1
