"""Review of pre-flight's state-block foresight: inputs where the count it foresaw was not the one vLLM
checks (vLLM 0.25: config/compilation.py resolve_cudagraph_mode_and_sizes compares max_num_seqs with
kv_cache_config.num_blocks, only under full CUDA graphs; v1/core/kv_cache_utils.py sizes num_blocks
per worker). A count too small made Fix lower max_num_seqs where vLLM would have started; a default
read wrong made Fix raise the sequences, or the heal refuse vLLM's own refusal."""

from __future__ import annotations

import math

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.preflight import preflight
from vllm_autoheal.remedy import Inventory, plan_heal

from crafted.checks import diagnose
from samples import config_shape

GIB = 2**30
NEMOTRON_PAGE = 1040 * 4096  # the attention page vLLM 0.25 printed for Nemotron-H 8B (1,040 tokens, 4 KiB)


@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_stages_each_hold_their_share_of_a_group(pp):
    """vLLM groups the layers globally (4 attention, 24 Mamba-2: groups of 4), then each worker holds
    only its stage's layers of each group (_project_kv_cache_groups_to_worker; layers[i::n] spread a
    group over the stages): at PP 2 a pool block holds 2 pages on each GPU, at PP 4 one. 1 GiB is 126
    blocks, 252 - pre-flight counted 63 (4 pages, and the block doubled by per-layer bytes spread over
    all 4 attention layers), so Fix lowered 100 sequences vLLM starts with to 61."""
    shape, h200 = config_shape("nemotron-h-8b"), lookup("NVIDIA-H200")
    engine = {"maxNumSeqs": 100, "maxModelLen": 8192, "kvCacheMemoryBytes": GIB, "pipelineParallelSize": pp}
    est = estimate(shape, EngineArgs(max_model_len=8192, max_num_seqs=100, kv_cache_memory_bytes=GIB,
                                     pipeline_parallel_size=pp), h200)  # fmt: skip
    assert est.state_blocks == GIB // (4 // pp * NEMOTRON_PAGE), est.reasons
    fixed = preflight(VLLMServiceSpec(model="m", engine=engine, preflight="Fix"), h200, shape)
    assert fixed.fits and not fixed.steps and fixed.engine.max_num_seqs == 100, fixed.reasons


def test_an_a100_runs_vllms_256_sequences_and_fix_does_not_raise_them():
    """vLLM's default is 1,024 sequences from 70 GiB, except on an A100 ('a100' not in device_name:
    256, PR #17885). Nemotron-H 8B with an 8 GiB cache on an A100-80GB has 504 blocks, enough for the
    256 that run; pre-flight took 1,024 and Fix set max_num_seqs 488, nearly twice what vLLM runs."""
    shape, a100 = config_shape("nemotron-h-8b"), lookup("A100-SXM4-80GB")
    engine = {"maxModelLen": 8192, "kvCacheMemoryBytes": 8 * GIB}
    est = estimate(shape, EngineArgs(max_model_len=8192, kv_cache_memory_bytes=8 * GIB), a100)
    assert est.max_num_seqs == 256 and est.fits, est.reasons
    fixed = preflight(VLLMServiceSpec(model="m", engine=engine, preflight="Fix"), a100, shape)
    assert not fixed.steps and fixed.engine.max_num_seqs is None, fixed.steps


@pytest.mark.parametrize(
    "extra",
    [
        ["-O0"],  # optimization level 0: cudagraph_mode NONE
        ["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}'],  # no full graphs: no check
        ["-cc.cudagraph_mode=NONE"],
        ["--mamba-ssm-cache-dtype", "bfloat16"],  # Nemotron-H's float32 default overridden: half the page
        ["--num-gpu-blocks-override", "4096"],  # vLLM's num_blocks is this
    ],
)
def test_flags_that_change_vllms_check_or_its_count_leave_the_sequences_alone(extra):
    """vLLM checks max_num_seqs against the pool only with full CUDA graphs, and counts the pool from
    the page the flags make. With these extraArgs vLLM starts Nemotron-H 8B with 100 sequences in
    1 GiB (no check, or about 124 blocks, or 4,096); pre-flight foresaw 63 blocks and Fix lowered
    max_num_seqs to 61, a change no heal would make."""
    shape, h200 = config_shape("nemotron-h-8b"), lookup("NVIDIA-H200")
    engine = {"maxNumSeqs": 100, "maxModelLen": 8192, "kvCacheMemoryBytes": GIB, "extraArgs": extra}
    fixed = preflight(VLLMServiceSpec(model="m", engine=engine, preflight="Fix"), h200, shape)
    assert not fixed.steps and fixed.engine.max_num_seqs == 100, (fixed.steps, fixed.reasons)


def test_throughput_mode_doubles_vllms_default_and_its_refusal_is_healed():
    """vLLM's --performance-mode throughput doubles the default max_num_seqs (arg_utils: 2,048 on an
    H100). Its refusal "max_num_seqs (2048) exceeds available Mamba cache blocks (900)" is the run's
    own; the heal took 2,048 for a forged count (above 1,024) and lowered nothing."""
    message = (
        "ValueError: max_num_seqs (2048) exceeds available Mamba cache blocks (900). Each decode sequence "
        "requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to "
        "at most 900 or increase gpu_memory_utilization."
    )
    spec = VLLMServiceSpec(model="m", engine={"extraArgs": ["--performance-mode", "throughput"]})
    remedy = plan_heal(spec, diagnose(message), inventory=Inventory(gpu_total_gib=79.2))
    assert remedy.changes == {"max_num_seqs": 900}, remedy
    est = estimate(config_shape("nemotron-h-8b"), spec.engine, lookup("NVIDIA-H200"))
    assert est.max_num_seqs == 2048
    # (a count above even the doubled default is still no default)
    forged = plan_heal(spec, diagnose(message.replace("2048", "4096")), inventory=Inventory(gpu_total_gib=79.2))
    assert "max_num_seqs" not in forged.changes, forged


def test_pipeline_counts_keep_the_tp1_figures():
    """(The change above leaves PP 1 as vLLM printed it: 63 blocks in 1 GiB.)"""
    est = estimate(
        config_shape("nemotron-h-8b"),
        EngineArgs(max_model_len=8192, max_num_seqs=1024, kv_cache_memory_bytes=GIB),
        lookup("NVIDIA-H200"),
    )
    assert est.state_blocks == 63 == math.floor(GIB / (4 * NEMOTRON_PAGE))


def test_a_mamba2_page_extends_its_groups_to_the_tensor_parallel_size():
    """vLLM's mamba2_state_shape gives each GPU all the B and C groups its heads need: n_groups not
    divisible by TP is extended by TP - n_groups (extra_groups_for_head_shards), so Bamba-9B's one
    group is 8 at TP 8: a convolution of (8,192 + 2 x 8 x 128) / 8 = 1,280 channels, not 1,056."""
    from vllm_autoheal.shape_reader import shape_from_config

    bamba = {
        "architectures": ["BambaForCausalLM"],
        "model_type": "bamba",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "attn_layer_indices": [9, 18, 27],
        "mamba_n_heads": 128,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "torch_dtype": "bfloat16",
    }
    shape = shape_from_config(bamba)
    assert shape.mamba_layers == 29
    for tp, groups in ((1, 1), (2, 2), (8, 8)):
        conv = 3 * (8192 + 2 * groups * 128) // tp
        temporal = 128 // tp * 64 * 128
        assert shape.state_page_bytes(tp) == 2 * (conv + temporal), tp


def test_the_served_dtype_sizes_the_state_page_as_it_sizes_the_attention_page():
    """--dtype float32 serves Qwen3-Next in float32: vLLM keeps its state (mamba_cache_dtype auto) in
    the model's dtype as it keeps K and V, so both pages double and the block stays 544 tokens. The
    page was sized in the config's bf16 while K and V doubled: a 272-token block, pool blocks of half
    the bytes, and twice the blocks vLLM has foreseen."""
    shape = config_shape("qwen3-next-80b-a3b")
    from vllm_autoheal.memory import kv_need

    for tp in (1, 2):
        assert kv_need(shape, EngineArgs(tensor_parallel_size=tp, dtype="float32"), 8192).block == 544
        assert kv_need(shape, EngineArgs(tensor_parallel_size=tp, dtype="bfloat16"), 8192).block == 544


def test_an_a100_of_80_gb_takes_the_small_gpus_batch_default_as_vllm_does():
    """vLLM's get_batch_defaults gives an A100 the small GPUs' defaults (2,048 batched tokens for the server),
    as for max_num_seqs: counted at 8,192, its profiling peak (and so the cache) was misjudged."""
    from vllm_autoheal.memory import default_max_num_batched_tokens

    a100, h100 = lookup("NVIDIA-A100-SXM4-80GB"), lookup("NVIDIA-H100-80GB-HBM3")
    assert default_max_num_batched_tokens(a100.memory_gib, "server", a100.name) == 2048
    assert default_max_num_batched_tokens(a100.memory_gib, "llm", a100.name) == 8192
    assert default_max_num_batched_tokens(h100.memory_gib, "server", h100.name) == 8192
    shape = config_shape("llama-3.1-8b")
    assert estimate(shape, EngineArgs(max_model_len=8192), a100).max_num_batched_tokens == 2048
