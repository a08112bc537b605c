"""A tenant's model config read as vLLM reads it: odd but real configs (multi-query and ChatGLM KV heads,
linear-attention hybrids, a float32 engine) must size the cache as vLLM will, and `plan` must offer
only the tensor-parallel sizes vLLM can split the model into."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.gpu_catalog import GpuSpec, lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import ModelConfigError, check, to_shape
from vllm_autoheal.plan_options import options, tensor_parallel_sizes
from vllm_autoheal.preflight import preflight

from samples import config_shape

BASE = {"num_hidden_layers": 40, "hidden_size": 6144, "num_attention_heads": 48, "vocab_size": 49152}


def shape(config: dict):
    return to_shape(check(config))


def test_plan_offers_only_splits_vllm_accepts():
    """vLLM divides the KV heads by TP, or TP by them (QKVParallelLinear): Qwen2.5-7B's 4 KV heads
    do not split 7 ways, Phi-3-medium's 10 neither 4 nor 8 ways."""
    assert tensor_parallel_sizes(config_shape("qwen2.5-7b")) == [1, 2, 4]
    phi3_medium = shape({**BASE, "num_attention_heads": 40, "num_key_value_heads": 10, "hidden_size": 5120})
    assert tensor_parallel_sizes(phi3_medium) == [1, 2, 5]
    opts = options(phi3_medium, EngineArgs(max_model_len=4096), lookup("NVIDIA-L4"))
    assert {o.tensor_parallel_size for o in opts} == {1, 2, 5}


def test_kv_heads_under_the_names_vllm_reads():
    """vLLM's get_total_num_kv_heads: multi_query (StarCoder, Falcon-7B) is one KV head, and
    n_head_kv / num_kv_heads (Falcon) and multi_query_group_num (ChatGLM) name the count."""
    assert shape({**BASE, "model_type": "gpt_bigcode", "multi_query": True}).kv_heads == 1
    assert shape({**BASE, "num_kv_heads": 8}).kv_heads == 8
    assert shape({**BASE, "n_head_kv": 8}).kv_heads == 8
    assert shape({**BASE, "multi_query_group_num": 2}).kv_heads == 2
    # Falcon-40B's new decoder architecture ignores multi_query and reads num_kv_heads
    falcon = {**BASE, "model_type": "falcon", "multi_query": True, "new_decoder_architecture": True}
    assert shape({**falcon, "num_kv_heads": 8}).kv_heads == 8


def test_starcoder_preflight_keeps_the_context_that_fits():
    """StarCoder-15B (one KV head) at 8K on a 40 GiB GPU: counting 48 KV heads, pre-flight cut the
    context to 1,200 tokens."""
    starcoder = shape(
        {
            **BASE,
            "model_type": "gpt_bigcode",
            "multi_query": True,
            "intermediate_size": 16384,
            "max_position_embeddings": 8192,
        }
    )
    spec = VLLMServiceSpec.model_validate({"model": "bigcode/starcoder", "preflight": "Fix", "engine": {}})
    result = preflight(spec, GpuSpec("gpu", 40.0), starcoder)
    assert result.fits and not result.changed, result.reasons


QWEN3_NEXT = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "vocab_size": 151936,
    "max_position_embeddings": 262144,
    "full_attention_interval": 4,
    # (Qwen3-Next-80B's Gated DeltaNet dims: a config without them is refused, its state unsized)
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}


def test_linear_attention_layers_hold_no_per_token_cache():
    """Qwen3-Next / Qwen3.5: three of four layers are Gated DeltaNet, a fixed state per request; only
    the full-attention quarter keeps K and V per token (vLLM gives the others a MambaSpec)."""
    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12
    listed = shape({**QWEN3_NEXT, "full_attention_interval": None, "layer_types": types})
    by_interval = shape(QWEN3_NEXT)
    for s in (listed, by_interval):
        assert s.kv_layers() == (12, 0)
        assert s.kv_bytes_per_token() == 2 * 12 * 2 * 256 * 2


def test_a_float32_engine_keeps_a_float32_cache():
    """kv_cache_dtype auto is the model dtype vLLM serves (--dtype float32: 4 bytes an element)."""
    s = config_shape("llama-3.1-8b")
    gpu = lookup("NVIDIA-H200")
    half = estimate(s, EngineArgs(max_model_len=8192), gpu)
    full = estimate(s, EngineArgs(max_model_len=8192, dtype="float32"), gpu)
    assert full.kv_bytes_per_token == 2 * half.kv_bytes_per_token
    assert estimate(s, EngineArgs(dtype="float32", kv_cache_dtype="fp8"), gpu).kv_bytes_per_token == (
        half.kv_bytes_per_token // 2
    )


def test_mamba_hybrids_count_only_their_attention_layers():
    """Each family names its few attending layers its own way, as HF's config classes and vLLM's
    models read them: Jamba by period and offset (layer i where i % 8 == 4), Nemotron-H letter by
    letter ("*" attends; M Mamba, - MLP, E MoE), Bamba by index, Nemotron 3.5 and Zamba2 word by word.
    Counted as attention everywhere, Jamba's cache was 8x what vLLM allocates."""
    jamba = {**BASE, "num_hidden_layers": 32, "attn_layer_period": 8, "attn_layer_offset": 4}
    assert shape(jamba).kv_layers() == (4, 0)
    nemotron_h = {**BASE, "num_hidden_layers": 8, "hybrid_override_pattern": "M-M*-ME*"}
    assert shape(nemotron_h).kv_layers() == (2, 0)
    bamba = {**BASE, "num_hidden_layers": 32, "attn_layer_indices": [9, 18, 27]}
    assert shape(bamba).kv_layers() == (3, 0)
    words = ["mamba", "mamba", "attention", "mlp", "moe", "hybrid"]  # Zamba2's hybrid layers attend
    assert shape({**BASE, "num_hidden_layers": 6, "layers_block_type": words}).kv_layers() == (2, 0)
    per_layer = shape(BASE).kv_bytes_per_token() // BASE["num_hidden_layers"]
    assert shape(jamba).kv_bytes_per_token() == 4 * per_layer


def test_mamba_hybrid_fields_are_checked_like_the_rest():
    with pytest.raises(ModelConfigError, match="attn_layer_period is 5000"):
        check({**BASE, "attn_layer_period": 5000})
    with pytest.raises(ModelConfigError, match="hybrid_override_pattern must be a string of at most 1024"):
        check({**BASE, "hybrid_override_pattern": "M" * 5000})
    with pytest.raises(ModelConfigError, match=r"attn_layer_indices\[\] must be a whole number"):
        check({**BASE, "attn_layer_indices": [9, "18"]})
    with pytest.raises(ModelConfigError, match="layers_block_type must be a list"):
        check({**BASE, "layers_block_type": "mamba"})
    with pytest.raises(ModelConfigError, match="multi_query must be true or false"):
        check({**BASE, "multi_query": 1})


def test_an_inline_config_carries_the_hybrid_and_kv_head_fields():
    """What the CRD's inline modelConfig keeps reaches the same shape as the file itself."""
    from vllm_autoheal.api.config_json import ConfigJson

    for config in (
        {**BASE, "num_hidden_layers": 32, "attn_layer_period": 8, "attn_layer_offset": 4},
        {**BASE, "num_hidden_layers": 8, "hybrid_override_pattern": "M-M*-ME*"},
        {**BASE, "num_hidden_layers": 32, "attn_layer_indices": [9, 18, 27]},
        {**BASE, "num_hidden_layers": 4, "layers_block_type": ["mamba", "attention", "mlp", "moe"]},
        {**BASE, "model_type": "gpt_bigcode", "multi_query": True},
    ):
        inline = ConfigJson.model_validate(config).model_dump(exclude_none=True)
        assert shape(inline) == shape(config), config


@pytest.mark.xfail(
    strict=True,
    reason="a config whose every layer keeps a fixed state (all layer_types linear_attention) leaves no per-token "
    "cache, and the estimate reads zero tokens as 'no memory left for the KV cache'; real pure-state models "
    "(Mamba) have no num_attention_heads and are refused by the check, so only a forged config gets here",
)
def test_a_model_without_per_token_layers_is_not_called_short_of_cache():
    s = shape({**QWEN3_NEXT, "full_attention_interval": None, "layer_types": ["linear_attention"] * 48})
    assert estimate(s, EngineArgs(max_model_len=4096), lookup("NVIDIA-H200")).fits


def test_a_hybrids_estimate_counts_a_state_block_per_sequence():
    """vLLM keeps one state block per running sequence in the KV cache's pool, and refuses 'max_num_seqs
    (N) exceeds available Mamba cache blocks (M)': with Gated DeltaNet's dims (tests/test_gdn_state.py
    has vLLM's figures), 4096 sequences on an L4 are refused where 8 fit."""
    dims = {
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    s = shape({**QWEN3_NEXT, **dims})
    few, many = (estimate(s, EngineArgs(max_model_len=4096, max_num_seqs=n), lookup("NVIDIA-L4")) for n in (8, 4096))
    assert many.state_blocks is not None and 8 < many.state_blocks < 4096
    assert not many.fits and "Mamba state blocks" in many.reasons[0]
    # (more sequences make the profile's dummy sampler run hold more logits, so the pool of 4096 is smaller)
    assert few.state_blocks > many.state_blocks and "Mamba state blocks" not in " ".join(few.reasons)
