"""Hostile review, round 2: the memory model on REAL config.json files of architectures and families
that neither tests/fixtures/configs/ nor round 1 (tests/test_review_unseen_architectures.py) holds.

Requirement under attack: "a wrong memory change is worse than none". On a config it has never seen
the memory model must give the figure vLLM uses, or refuse (plan exits 2 naming a field; pre-flight and
heals fall back): never a confident wrong figure.

Method (as round 1): expected weights = published parameter count x 2 bytes (bf16/fp16 as vLLM serves
them under --dtype auto) / TP + model_weights.WEIGHT_BUFFERS_GIB; expected KV bytes per token = vLLM's formula,
2 x attending layers x KV heads / TP x head_dim x 2 bytes; a Mamba layer keeps instead a state page a
request (vLLM mamba_utils.py). Right: weights within 5 %, KV bytes per token exact, or refused naming a
field. Wrong: a strict xfail asserting the right behaviour (the right figure, or a refusal), whose reason
gives the model's figure, vLLM's, and the config field behind the difference. (The four findings are
fixed since: Phi-3-small's ff_intermediate_size read, a named model type with no MLP width refused, Mamba
layers that are not Mamba-2 or Gated DeltaNet refused, plan refusing a context past the config's; each test
passes now, its docstring still saying what the model did.)

Sources of the configs (tests/fixtures/configs/unseen2/NAME.json, a folder of its own so that
test_model_config's glob of configs/*.json, which needs every config to parse, is not affected; saved
verbatim, or converted 1:1 from a Python dict literal: True->true, False->false, None->null; nothing
added or removed unless said):

- mlc-ai/mlc-llm, python/mlc_llm/model/model_preset.py @ 79d603f085f50500e9509fa01785ffa7ecfaaa93
  (MODEL_PRESETS, the HF config.json of each model as a dict; mlc adds its own context_window_size /
  prefill_chunk_size to a few, kept as found, fields the memory model does not read):
    gemma-2b.json                 <- "gemma_2b"                (google/gemma-2b, Gemma 1, MQA, head_dim 256)
    gemma-2-27b.json              <- "gemma2_27b"              (google/gemma-2-27b, head_dim 128 != 4608/32)
    stablelm-2-zephyr-1.6b.json   <- "stablelm-2-zephyr-1_6b"  (stabilityai/stablelm-2-zephyr-1_6b)
    stablelm-3b-4e1t.json         <- "stablelm"                (stabilityai/stablelm-3b-4e1t)
    baichuan2-7b.json             <- "baichuan"                (Baichuan2-7B: vocab 125,696, W_pack)
    internlm2.5-7b.json           <- "internlm2_5_7b"          (internlm/internlm2_5-7b-chat)
    internlm-7b.json              <- "internlm"                (internlm/internlm-7b, v1)
    orion-14b.json                <- "orion"                   (OrionStarAI/Orion-14B)
    rwkv5-3b.json                 <- "rwkv5_3b"                (RWKV/rwkv-5-world-3b, no attention)
    aya-23-8b.json                <- "aya-23"                  (CohereForAI/aya-23-8B, model_type cohere)
    deepseek-moe-16b.json         <- "deepseek"                (deepseek-ai/deepseek-moe-16b, v1 MoE)
    olmo2-7b.json                 <- "olmo2_7b"                (allenai/OLMo-2-1124-7B)
    phi-2-msft.json               <- "phi-2"                   (microsoft/phi-2 as first published:
                                                                model_type phi-msft, remote code)
    ministral-3-3b-2512.json      <- "ministral3_3b_2512"      (Mistral3ForConditionalGeneration, Pixtral
                                                                vision_config)
- jamba-1.5-mini.json: the dict `config` of get_ai21_jamba_15_mini (find_string id 32332034728, "See
  ai21labs/AI21-Jamba-1.5-Mini/config.json"), before the function's config.update(...) of token ids.
- phi-3-small-8k.json: the dict "# Phi 3 small from https://huggingface.co/microsoft/Phi-3-small-8k-
  instruct/blob/main/config.json" of an LLM-engine hardware test (find_string id 22133831111).
- falcon-7b.json: tiiuae/falcon-7b's RefinedWebModel config as the dict `params` of a Tenstorrent demo
  (find_string id 49222346037); its one added key "padded_heads": 1 (Tenstorrent's, not HF's) removed.
- opt-6.7b.json: `OPTConfig {"_name_or_path": "facebook/opt-6.7b", ...}` as transformers printed it
  (find_string id 44347156050).
- exaone-3.0-7.8b.json: `ExaoneConfig {"_name_or_path": "LGAI-EXAONE/EXAONE-3.0-7.8B-Instruct", ...}` as
  transformers printed it (find_string id 46001266965).

Searched for and not found verbatim (skipped, nothing invented): MiniMax-Text-01 (only trimmed test
dicts), Granite-4.0-H (trimmed), Falcon-40B (Tenstorrent's edited copy), BLOOM-7b1, MPT-7B, DBRX,
Arctic, Mllama.
"""

from __future__ import annotations

import json

import pytest

from test_review_unseen_architectures import H100, ReviewConfigs, expected_gib, plan, within
from vllm_autoheal.model_config import parse, to_shape

from samples import CONFIGS

ROUND = ReviewConfigs(CONFIGS / "unseen2")
config_path, shape, weights_gib, refused = ROUND.path, ROUND.shape, ROUND.weights_gib, ROUND.refused


# ---------------------------------------------------------------------------------------------------
# Checked and right (within 5 % on weights, exact on KV bytes per token).
# ---------------------------------------------------------------------------------------------------

RIGHT = [
    # name, published parameters, expected KV bytes/token at TP 1 (vLLM's formula with the config's numbers)
    ("gemma-2b", 2.51e9, 2 * 18 * 1 * 256 * 2),  # Gemma 2B card: 2.51 B; MQA, head_dim 256
    ("gemma-2-27b", 27.2e9, 2 * 46 * 16 * 128 * 2),  # Gemma 2 27B: 27.2 B; head_dim 128, not 4608 / 32
    ("stablelm-2-zephyr-1.6b", 1.64e9, 2 * 24 * 32 * 64 * 2),  # StableLM 2 1.6B card: 1.6 B (1.64 B)
    ("stablelm-3b-4e1t", 2.795e9, 2 * 32 * 32 * 80 * 2),  # StableLM-3B-4E1T: 2.8 B (2.795 B)
    (
        "baichuan2-7b",
        7.51e9,
        2 * 32 * 32 * 128 * 2,
    ),  # Baichuan2-7B: 7 B; 7.51 B from the config (vocab 125,696, untied)
    ("internlm2.5-7b", 7.74e9, 2 * 32 * 8 * 128 * 2),  # InternLM2.5-7B: 7.74 B
    (
        "internlm-7b",
        7.32e9,
        2 * 32 * 32 * 128 * 2,
    ),  # InternLM-7B (v1, vLLM's Llama with biases): 7 B; 7.32 B from the config
    ("orion-14b", 14.5e9, 2 * 40 * 40 * 128 * 2),  # Orion-14B card: 14.5 B
    ("aya-23-8b", 8.03e9, 2 * 32 * 8 * 128 * 2),  # Aya 23 8B (Cohere, tied): 8.03 B
    ("deepseek-moe-16b", 16.4e9, 2 * 28 * 16 * 128 * 2),  # DeepSeekMoE 16B: 16.4 B (2 shared experts)
    ("olmo2-7b", 7.30e9, 2 * 32 * 32 * 128 * 2),  # OLMo 2 7B: 7.30 B (float32 checkpoint, served bf16)
    # Falcon-7B: 7.22 B stored (lm_head saved beside the embedding it is tied to): 6.92 B loaded, as
    # vLLM's falcon.py ties lm_head to word_embeddings; multi_query: one KV head
    ("falcon-7b", 6.92e9, 2 * 32 * 1 * 64 * 2),
    ("opt-6.7b", 6.7e9, 2 * 32 * 32 * 128 * 2),  # OPT-6.7B: 6.7 B (fc1/fc2, tied, learned positions)
    # Ministral 3 3B: 3.4 B language model + 0.4 B Pixtral encoder (Mistral's card); head_dim 128 != 3072/32
    ("ministral-3-3b-2512", 3.8e9, 2 * 26 * 8 * 128 * 2),
]
# AI21-Jamba-1.5-Mini (51.6 B; 4 of 32 layers attend, offset 4, period 8) was sized within 3.4 % with its KV
# exact, but its Mamba-1 state counted 0: it is refused now (test_jamba_mamba1_state_is_counted_or_refused).


@pytest.mark.parametrize("name,params,kv", RIGHT, ids=[r[0] for r in RIGHT])
def test_unseen_config_sized_right(name, params, kv):
    assert within(weights_gib(name), expected_gib(params))
    assert shape(name).kv_bytes_per_token() == kv


@pytest.mark.parametrize(
    "name,field",
    [
        ("exaone-3.0-7.8b", "num_hidden_layers"),  # EXAONE names it num_layers: refused, not guessed
        ("rwkv5-3b", "num_attention_heads"),  # RWKV: no attention heads (and vLLM serves no RWKV): refused
    ],
)
def test_unseen_config_refused_with_exit_2(name, field):
    out = plan("--model-config", str(config_path(name)), "--gpu", H100, "--json")
    assert out.returncode == 2, out.stdout[-400:]
    assert field in out.stderr


# ---------------------------------------------------------------------------------------------------
# Findings: a confident figure where the memory model is wrong (strict xfails: each asserts the right
# behaviour, the figure vLLM uses or a refusal).
# ---------------------------------------------------------------------------------------------------


def test_phi3_small_mlp_width_is_read_or_refused():
    # Phi-3-small-8k-instruct: 7.39 B. Per layer: qkv 4096 x (4096 + 2 x 1024), o 4096^2, gegelu MLP
    # up 4096 x 2 x 14336 + down 14336 x 4096; x 32 + tied 100352 x 4096.
    assert refused("phi-3-small-8k") or within(weights_gib("phi-3-small-8k"), expected_gib(7.39e9))


def test_phi2_msft_config_is_sized_or_refused():
    assert refused("phi-2-msft") or within(weights_gib("phi-2-msft"), expected_gib(2_779_683_840))


def test_jamba_mamba1_state_is_counted_or_refused():
    assert refused("jamba-1.5-mini") or shape("jamba-1.5-mini").state_page_bytes() == 3 * 8192 * 2 + 8192 * 16 * 2


def test_plan_refuses_a_context_longer_than_the_model_takes():
    out = plan("--model-config", str(config_path("opt-6.7b")), "--gpu", H100, "--json", "--max-model-len", "16384")
    assert out.returncode == 2 or json.loads(out.stdout)["fits"] is False
    assert "--max-model-len 16,384 is longer than the model's 2,048" in out.stderr and "Traceback" not in out.stderr


def test_a_context_longer_than_the_model_is_planned_where_vllm_takes_it(monkeypatch):
    """vLLM takes it with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and where RoPE scaling or --hf-overrides set
    the length its own way (never refused then: a wrong refusal would block a start that works)."""
    from vllm_autoheal.api import EngineArgs
    from vllm_autoheal.plan_options import longer_than_the_model

    opt = shape("opt-6.7b")
    long = EngineArgs(max_model_len=16384)
    assert longer_than_the_model(opt, long, None) and longer_than_the_model(opt, long, "0")
    assert longer_than_the_model(opt, long, "1") is None and longer_than_the_model(opt, long, "True") is None
    assert longer_than_the_model(opt, EngineArgs(max_model_len=2048), None) is None
    overrides = EngineArgs(max_model_len=16384, extra_args=['--hf-overrides={"max_position_embeddings": 16384}'])
    assert longer_than_the_model(opt, overrides, None) is None
    config = json.loads(config_path("opt-6.7b").read_text())
    yarn = {**config, "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048}}
    assert longer_than_the_model(to_shape(parse(json.dumps(yarn), "yarn")), long, None) is None
    plain = {**config, "rope_scaling": {"rope_type": "default"}}
    assert longer_than_the_model(to_shape(parse(json.dumps(plain), "plain")), long, None)


def test_the_longest_context_is_read_under_each_name_vllm_reads():
    """GPT-2 names it n_positions (1,024): its default context is that, not a guess."""
    assert to_shape(parse((CONFIGS / "gpt2.json").read_text(), "gpt2")).max_position_embeddings == 1024
