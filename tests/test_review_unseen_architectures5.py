"""Hostile review, round 5: the memory model on REAL config.json files of 2025-2026 architectures that none of
tests/fixtures/configs/, configs/unseen/ .. unseen4/ holds (rounds 1-4: tests/test_review_unseen_architectures.py,
...2.py, ...3.py, ...4.py).

Requirement under attack: "a wrong memory change is worse than none". On a config it has never seen the memory
model must give the figure vLLM uses, or refuse (plan exits 2 naming a field): never a confident wrong figure, never
a traceback.

Method (as rounds 3 and 4): expected weights = the parameters vLLM builds from the config (its model file, read in
the stored vllm-project/vllm source, counted here by hand; or the published count) x 2 bytes + WEIGHT_BUFFERS_GIB.
Expected KV bytes per token = 2 x attending layers x KV heads x head_dim x 2 bytes (FullAttentionSpec's page); a
Mamba-2 layer keeps a state page a request (mamba_utils.mamba2_state_shape: (d_conv - 1) x (inner + 2 x groups x
state) in the model dtype, heads x head_dim x state in mamba_ssm_cache_dtype). Right: weights within 5 %, KV exact,
or refused naming a field. Wrong: a strict xfail asserting the right behaviour, its reason giving both figures.

Sources (tests/fixtures/configs/unseen5/NAME.json, saved verbatim; nothing added or removed):
  ai-dynamo/aiconfigurator (a vendored copy of each model's Hub config.json), aic-core/src/aiconfigurator_core/
  model_configs/, at commit 0b077da5e017cb8ceac1ad14e91eb6e26c40207a unless said:
    nemotron-3-nano-30b-a3b.json            <- nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json
                                               (NemotronHForCausalLM: 23 Mamba-2, 23 MoE, 6 attention layers)
    llama-3.3-nemotron-super-49b-v1.json    <- nvidia--Llama-3_3-Nemotron-Super-49B-v1_config.json
                                               (DeciLMForCausalLM, model_type nemotron-nas: block_configs)
    nemotron-3-super-120b-a12b-fp8.json     <- nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8_config.json
                                               @ 87999a63b254b8d9a408515bc5241e2976694bc5 (latent MoE, modelopt fp8)
    llama-4-maverick-17b-128e-instruct.json <- meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json
                                               (aiconfigurator's copy keeps text_config's fields only: no
                                               vision_config, no tie_word_embeddings; see RIGHT)
    mimo-v2-flash.json                      <- XiaomiMiMo--MiMo-V2-Flash_config.json
    gemma-4-26b-a4b.json                    <- google--gemma-4-26B-A4B_config.json
  granitemoehybrid-toy.json <- find_string id 54994935916, a training repository's README, "Example Architecture
    Configs ... Each config is a transformers-compatible JSON": its GraniteMoeHybridForCausalLM block (a toy of
    Granite-4.0-H's form: Mamba-2 and NoPE attention layers by layer_types, routed experts and a shared MLP in
    every layer; 8 layers, hidden 512). No verbatim Hub config.json of a Granite-4.0-H checkpoint was found.

vLLM's formulas, from its source (vllm-project/vllm, read with read_file):
    nemotron_h.py NemotronHMoE: shared_experts = NemotronHMLP(moe_shared_expert_intermediate_size x
    n_shared_experts) (up and down, relu2); FusedMoE experts up/down of moe_intermediate_size; MambaMixer2 of
    mamba_num_heads x mamba_head_dim, n_groups.
    granitemoehybrid.py: layer_types[i] picks GraniteMoeHybridMambaDecoderLayer (MambaMixer2 of intermediate
    mamba_expand x hidden_size: in_proj hidden x (2 x inner + 2 x groups x state + heads), conv1d, A/D/dt_bias,
    gated norm, out_proj inner x hidden) or GraniteMoeHybridAttentionDecoderLayer (qkv, o; head_dim hidden /
    heads); EVERY layer then has GraniteMoeMoE (router, num_local_experts x gate/up/down of intermediate_size) and,
    where shared_intermediate_size > 0, GraniteMoeSharedMLP (input_linear hidden -> 2 x shared, output_linear).

Searched for and skipped (no verbatim config.json in the stored public code in the time given: test dicts,
trimmed "relevant fields" excerpts or MLX conversions only): Granite-4.0-H-Small/Tiny (Hub files), Falcon-H1, ERNIE-4.5
MoE, Hunyuan-A13B, MiniMax-Text-01/M1, Step-3, LFM2, Seed-OSS, Apertus, SmolLM3, Phi-4-mini-flash, InternVL3.5,
GLM-4.6/4.5-Air. Already covered by earlier rounds' architectures: DeepSeek-V3.2 (round 3), MiniMax-M2 (M2.7,
round 3), gpt-oss-20b/120b (round 3), Qwen3-VL-MoE (round 3). aiconfigurator's Step-3.7-Flash copy is trimmed (no
per-layer head settings) and was not used.
"""

from __future__ import annotations

import pytest

from test_review_unseen_architectures import H100, ReviewConfigs, assert_plan_answers, expected_gib, plan, within

from samples import CONFIGS

UNSEEN5 = CONFIGS / "unseen5"


ROUND = ReviewConfigs(UNSEEN5)
config_path, shape, weights_gib = ROUND.path, ROUND.shape, ROUND.weights_gib


# ---------------------------------------------------------------------------------------------------
# Checked and right (within 5 % on weights, exact on KV bytes per token and on the state page).
# ---------------------------------------------------------------------------------------------------

# Nemotron-3-Nano-30B-A3B as vLLM's nemotron_h.py builds it: untied 131072 x 2688 embedding and head (0.705 B);
# 23 Mamba-2 mixers (64 heads x 64, 8 groups, state 128, conv 4: 38.7 M each); 23 MoE layers (router, 128 experts
# x up/down 2688 x 1856, shared expert up/down 2688 x 3712: 1,297.2 M each); 6 attention layers (32 x 128 queries,
# 2 KV heads: 24.8 M each); 53 norms: 31,577,940,288 (NVIDIA's card: 31.6 B). The memory model counts 31,577,999,168
# since it reads moe_shared_expert_intermediate_size (3712) as the shared expert's width; it had read
# n_shared_experts x moe_intermediate_size (1856): 31,348,449,600, 229 M short (0.73 %, inside the tolerance).
NEMOTRON3_NANO_PARAMS = 31_577_940_288
# KV: 6 attention layers x 2 x 2 KV heads x 128 x 2 bytes. State page: (4 - 1) x (64 x 64 + 2 x 8 x 128) x 2 bytes
# (bf16 conv) + 64 x 64 x 128 x 4 bytes (mamba_ssm_cache_dtype float32) = 36,864 + 2,097,152.
NEMOTRON3_NANO_KV = 6 * 2 * 2 * 128 * 2
NEMOTRON3_NANO_PAGE = 3 * (64 * 64 + 2 * 8 * 128) * 2 + 64 * 64 * 128 * 4

# Llama-4-Maverick's text model as llama4.py builds it (MoE where (i + 1) % interleave_moe_layer_step == 0: 24 of
# 48 layers; dense layers intermediate_size_mlp 16384; each MoE layer 128 experts and one shared expert of 8192):
# 400,711,848,960 with an untied head (Meta's card: 400 B). This copy has no tie_word_embeddings, which the memory
# model then reads as tied (transformers' PretrainedConfig default): 399,677,486,080, 0.26 % under, inside the
# tolerance. KV: vLLM turns the hybrid manager off for chunked local attention (attention_chunk_size) unless
# VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE, so all 48 layers keep every token: 2 x 48 x 8 x 128 x 2.
MAVERICK_PARAMS = 400_711_848_960
MAVERICK_KV = 2 * 48 * 8 * 128 * 2


def test_nemotron3_nano_hybrid_moe_sized_right():
    name = "nemotron-3-nano-30b-a3b"
    assert within(weights_gib(name), expected_gib(NEMOTRON3_NANO_PARAMS))
    assert shape(name).kv_bytes_per_token() == NEMOTRON3_NANO_KV
    assert shape(name).mamba_layers == 23 and shape(name).state_page_bytes() == NEMOTRON3_NANO_PAGE


def test_llama4_maverick_text_model_sized_right():
    name = "llama-4-maverick-17b-128e-instruct"
    assert within(weights_gib(name, tp=8), expected_gib(MAVERICK_PARAMS, tp=8))
    assert shape(name).kv_bytes_per_token() == MAVERICK_KV
    assert shape(name).moe_layer_count(48) == 24


@pytest.mark.parametrize(
    "name,field",
    [
        # DeciLM's block_configs give each layer its own ffn_mult and attention (some no_op, some linear): no
        # intermediate_size, no num_key_value_heads at the top level
        ("llama-3.3-nemotron-super-49b-v1", "intermediate_size"),
        # sliding layers with swa_num_key_value_heads / swa_head_dim of their own (as MiMo-V2.5, round 4)
        ("mimo-v2-flash", "swa_num_key_value_heads"),
        # Gemma 4's full layers: global_head_dim 512 (as gemma-4-31b-it, round 4), here with MoE
        ("gemma-4-26b-a4b", "global_head_dim"),
    ],
)
def test_unseen_config_refused_naming_the_field(name, field):
    out = plan("--model-config", str(config_path(name)), "--gpu", H100, "--json")
    assert out.returncode == 2 and field in out.stderr, out.stderr[-400:]
    assert "Traceback" not in out.stderr


# Nemotron-3-Super-120B-A12B as nemotron_h.py builds it with moe_latent_size (session 45; it was refused before, over
# the Infinity in its time_step_limit, and its experts were then weighed hidden_size wide: 458.6 B): untied 131072 x
# 4096 embedding and head (1.074 B); 40 MoE layers, each 512 experts x up/down 1024 (the latent width) x 2688
# (2,818.6 M), router 4096 x 512, shared expert up/down 4096 x 5376, fc1/fc2_latent_proj 4096 <-> 1024 (8.4 M,
# ReplicatedLinear: whole on every rank): 2,873.1 M; 40 Mamba-2 mixers (128 heads x 64, 8 groups, state 128, conv 4);
# 8 attention layers (32 x 128 queries, 2 KV heads); 89 norms: 120,668,687,360 (NVIDIA's name: 120B).
NEMOTRON3_SUPER_PARAMS = 120_668_687_360
NEMOTRON3_SUPER_LATENT = 40 * 2 * 4096 * 1024  # the latent projections of its 40 MoE layers
# KV: 8 attention layers x 2 x 2 KV heads x 128 x 2 bytes. State page: (4 - 1) x (128 x 64 + 2 x 8 x 128) x 2 bytes
# + 128 x 64 x 128 x 4 bytes (mamba_ssm_cache_dtype float32).
NEMOTRON3_SUPER_KV = 8 * 2 * 2 * 128 * 2
NEMOTRON3_SUPER_PAGE = 3 * (128 * 64 + 2 * 8 * 128) * 2 + 128 * 64 * 128 * 4


def test_nemotron3_super_latent_moe_sized_right():
    """Its config.json writes "time_step_limit": [0.0, Infinity], a field the memory model does not read: it is
    read (model_config.NonFinite), and the routed experts are moe_latent_size wide, as vLLM builds them."""
    name = "nemotron-3-super-120b-a12b-fp8"
    assert within(weights_gib(name), expected_gib(NEMOTRON3_SUPER_PARAMS))
    # (on 8 ranks the latent projections stay whole: 0.55 GiB more a GPU than an even split)
    split = (NEMOTRON3_SUPER_PARAMS - NEMOTRON3_SUPER_LATENT) / 8 + NEMOTRON3_SUPER_LATENT
    assert within(weights_gib(name, tp=8), expected_gib(split), tolerance=0.01)
    assert weights_gib(name, tp=8) > expected_gib(NEMOTRON3_SUPER_PARAMS, tp=8)
    assert shape(name).kv_bytes_per_token() == NEMOTRON3_SUPER_KV
    assert shape(name).mamba_layers == 40 and shape(name).state_page_bytes() == NEMOTRON3_SUPER_PAGE
    out = plan("--model-config", str(config_path(name)), "--gpu", H100, "--json")
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr[-400:]


@pytest.mark.parametrize("name", sorted(p.stem for p in UNSEEN5.glob("*.json")))
def test_plan_answers_every_config_without_a_traceback(name):
    assert_plan_answers(config_path(name))


# ---------------------------------------------------------------------------------------------------
# Wrong: a confident figure that is not vLLM's.
# ---------------------------------------------------------------------------------------------------

# granitemoehybrid-toy as vLLM's granitemoehybrid.py builds it (hidden 512, tied 49152 vocabulary: 25,165,824):
#   every layer (8): router 512 x 8 (4,096) + experts 8 x 3 x 512 x 1024 (12,582,912) + shared MLP 3 x 512 x 512
#     (786,432) + 2 norms (1,024) = 13,374,464
#   attention layers (2): qkv 512 x 3 x 512 + o 512 x 512 = 1,048,576
#   Mamba-2 layers (6): in_proj 512 x (2 x 1024 + 2 x 1 x 128 + 8) = 1,183,744, conv1d (1024 + 256) x 4 + bias 1280 =
#     6,400, A/D/dt_bias 24, gated norm 1,024, out_proj 1024 x 512 = 524,288: 1,715,480
#   final norm 512: 25,165,824 + 8 x 13,374,464 + 2 x 1,048,576 + 6 x 1,715,480 + 512 = 144,552,080
# The memory model counts 134,259,200 (7.1 % under): shared_intermediate_size (Granite's name) is not read
# (shared_expert_of reads shared_expert_intermediate_size or n_shared_experts: 8 x 786,432 missed), and a Mamba layer
# named by layer_types is weighed as an attention layer (stack_params swaps in the mixer only for Gated DeltaNet and
# for Nemotron-H's hybrid_override_pattern: 6 x (1,715,480 - 1,048,576) missed). KV (2 x 2 x 8 x 64 x 2) and the state
# page (3 x 1280 x 2 + 8 x 128 x 128 x 2) are right.
GRANITE_TOY_PARAMS = 144_552_080


def test_granite4_hybrid_mamba_mixers_and_shared_mlp_weighed():
    name = "granitemoehybrid-toy"
    assert within(shape(name).params(), GRANITE_TOY_PARAMS, 0.02)
    assert within(weights_gib(name), expected_gib(GRANITE_TOY_PARAMS))


def test_granite4_hybrid_cache_is_right_already():
    """The toy's KV and state page, which the xfail above does not cover: 2 attention layers x 2 x 8 x 64 x 2 bytes;
    a Mamba-2 page of (4 - 1) x (1024 + 2 x 128) x 2 + 8 x 128 x 128 x 2 bytes (bf16 state: no mamba_ssm_cache_dtype)."""
    toy = shape("granitemoehybrid-toy")
    assert toy.kv_bytes_per_token() == 2 * 2 * 8 * 64 * 2
    assert toy.mamba_layers == 6 and toy.state_page_bytes() == 3 * (1024 + 256) * 2 + 8 * 128 * 128 * 2
