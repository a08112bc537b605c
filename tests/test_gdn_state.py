"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5/3.6): one state page a request in each linear-attention
layer, sized from the config's linear_* dims as vLLM's gated_delta_net_state_shape sizes it, and
pre-flight's foresight of vLLM's refusal of more sequences than the pool has blocks.

The figures are what vLLM printed in public start-up logs (copied below, the lines that matter):
the attention block widened to hold a state page, the state page padded to the attention page,
and the pool's size. Each follows from the config alone only if the page, the group and the pool
block are counted as vLLM counts them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate, kv_need, state_blocks

from samples import config_shape

GIB = 2**30

# vLLM 0.10.2, Qwen3-Next-80B-A3B-Instruct, --tensor-parallel-size 2 on two H200s (defaults otherwise)
QWEN3_NEXT_TP2 = """\
(APIServer pid=1804347) INFO 10-23 15:10:22 [config.py:390] Setting attention block size to 544 tokens to ensure that attention page size is >= mamba page size.
(APIServer pid=1804347) INFO 10-23 15:10:22 [config.py:411] Padding mamba page size by 1.49% to ensure that mamba page size and attention page size are exactly equal.
(Worker_TP0 pid=1806413) INFO 10-23 15:14:30 [gpu_worker.py:298] Available KV cache memory: 44.59 GiB
(EngineCore_DP0 pid=1805889) INFO 10-23 15:14:30 [kv_cache_utils.py:1028] GPU KV cache size: 973,760 tokens
(EngineCore_DP0 pid=1805889) INFO 10-23 15:14:30 [kv_cache_utils.py:1032] Maximum concurrency for 262,144 tokens per request: 14.77x
"""
# vLLM 0.19.0, Qwen3.5-0.8B (mamba_ssm_dtype float32), one GPU
QWEN35_08B = """\
(EngineCore pid=9900) INFO 04-20 19:27:59 [interface.py:601] Setting attention block size to 544 tokens to ensure that attention page size is >= mamba page size.
(EngineCore pid=9900) INFO 04-20 19:27:59 [interface.py:625] Padding mamba page size by 2.64% to ensure that mamba page size and attention page size are exactly equal.
(EngineCore pid=9900) INFO 04-20 19:28:04 [gpu_worker.py:437] Available KV cache memory: 5.03 GiB
(EngineCore pid=9900) INFO 04-20 19:28:04 [kv_cache_utils.py:1319] GPU KV cache size: 109,344 tokens
(EngineCore pid=9900) INFO 04-20 19:28:04 [kv_cache_utils.py:1324] Maximum concurrency for 4,096 tokens per request: 73.36x
"""


def _padding_pct(name: str, tp: int) -> float:
    shape = config_shape(name)
    need = kv_need(shape, EngineArgs(tensor_parallel_size=tp), 8192)
    attention_page = need.block * need.full_per_token / shape.kv_layers()[0]
    return round(100 * (attention_page / shape.state_page_bytes(tp) - 1), 2)


@pytest.mark.parametrize(
    "name, tp, log, block",
    [
        ("qwen3-next-80b-a3b", 2, QWEN3_NEXT_TP2, 544),  # bf16 state (no mamba_ssm_dtype)
        ("qwen3-next-80b-a3b", 1, None, 544),  # halves of the same page, the same block
        ("qwen3.5-0.8b", 1, QWEN35_08B, 544),  # a float32 state (its config's mamba_ssm_dtype)
        ("qwen3.5-27b", 1, None, 784),  # the block LMCache's docs list for Qwen3.6-27B's shapes
    ],
)
def test_the_attention_block_and_the_state_pages_padding_are_vllms(name, tp, log, block):
    need = kv_need(config_shape(name), EngineArgs(tensor_parallel_size=tp), 8192)
    assert need.block == block
    if log:
        assert f"block size to {block} tokens" in log
        assert f"Padding mamba page size by {_padding_pct(name, tp)}%" in log


def test_the_pools_blocks_are_the_cache_over_a_groups_pages():
    """44.59 GiB over pool blocks of 12 layers' 544-token pages (12 attending layers, 36 Gated DeltaNet
    layers: 4 groups of 12) is 7,162 blocks; vLLM prints a hybrid's size in tokens as the blocks a
    group has times the block: 7,162 // 4 x 544 = 973,760, as it printed."""
    need = kv_need(config_shape("qwen3-next-80b-a3b"), EngineArgs(tensor_parallel_size=2), 8192)
    blocks = state_blocks(need, 44.59 * GIB)
    assert f"GPU KV cache size: {blocks // 4 * need.block:,} tokens" in QWEN3_NEXT_TP2


def test_pre_flight_foresees_a_qwen35_refusal_and_fixes_it_with_the_sequences_the_pool_holds():
    """Qwen3.5-27B on one H200 with a 2 GiB cache: 41 pool blocks (16 layers' 3.06 MiB pages), short of
    the 1,024 sequences vLLM defaults to there. Fix starts at 39 (the 3 % margin); the context stays."""
    from vllm_autoheal.preflight import preflight

    shape, h200 = config_shape("qwen3.5-27b"), lookup("NVIDIA-H200")
    engine = {"maxModelLen": 8192, "kvCacheMemoryBytes": 2 * GIB}
    est = estimate(shape, EngineArgs(max_model_len=8192, kv_cache_memory_bytes=2 * GIB), h200)
    assert (est.failure, est.state_blocks, est.max_num_seqs) == ("kv_cache_insufficient", 41, 1024), est.reasons
    fixed = preflight(VLLMServiceSpec(model="m", engine=engine, preflight="Fix"), h200, shape)
    assert fixed.fits and fixed.engine.max_num_seqs == 39 and fixed.engine.max_model_len == 8192, fixed.reasons


def test_a_layer_list_of_linear_attention_words_counts_its_state_pages():
    """Qwen3.5's config lists its layers ("linear_attention" x3, "full_attention"): the linear ones are
    the state pages' layers, as Qwen3-Next's full_attention_interval names the same layers."""
    listed = config_shape("qwen3.5-0.8b")
    assert listed.mamba_layers == 18 and listed.kv_layers() == (6, 0)
    assert config_shape("qwen3-next-80b-a3b").mamba_layers == 36


def test_without_its_dims_a_gated_deltanet_model_is_not_checked_for_blocks():
    """A config without the linear_* dims gives no page size: no block count is guessed."""
    import json

    from vllm_autoheal.shape_reader import shape_from_config

    from samples import CONFIGS

    cfg = json.loads((CONFIGS / "qwen3-next-80b-a3b.json").read_text())
    del cfg["linear_num_value_heads"]
    est = estimate(shape_from_config(cfg), EngineArgs(max_model_len=8192, max_num_seqs=100_000), lookup("NVIDIA-H200"))
    assert est.state_blocks is None


# Real vLLM 0.25 runs on one H200 (tests/gpu/hybrid_state.sh, MODEL=qwen3.5-0.8b): Qwen3.5-0.8B's shapes
# with dummy weights, text only, a fixed cache of 1 GiB (blocks-1024) and of 100 MiB (kv-8k).
HYBRID_LOGS = Path(__file__).parent / "fixtures" / "gpu" / "hybrid-logs"


def test_the_memory_model_gives_vllms_figures_for_qwen35_on_the_h200():
    """Counted from the config alone, before any start: 160 pool blocks in 1 GiB (6 layers' 544-token
    pages of 2 KiB a token), one 8K request's 0.12 GiB (6 attending layers' 16 blocks, 18 float32 state
    pages), and 6,528 tokens as the longest that 100 MiB holds: what vLLM printed, each."""
    shape = config_shape("qwen3.5-0.8b")
    blocks_log = (HYBRID_LOGS / "hybrid-qwen3.5-0.8b-blocks-1024.log").read_text()
    kv_log = (HYBRID_LOGS / "hybrid-qwen3.5-0.8b-kv-8k.log").read_text()
    est = estimate(
        shape, EngineArgs(max_model_len=8192, kv_cache_memory_bytes=GIB, max_num_seqs=1024), lookup("NVIDIA-H200")
    )
    assert f"max_num_seqs (1024) exceeds available Mamba cache blocks ({est.state_blocks})" in blocks_log
    need = kv_need(shape, EngineArgs(max_model_len=8192), 8192)
    assert f"({need.bytes_for(8192) / GIB:.2f} GiB KV cache is needed" in kv_log
    assert f"the estimated maximum model length is {need.longest(100 * 2**20, 8192)}." in kv_log


def test_the_real_qwen35_refusal_is_healed_to_the_blocks_vllm_has():
    from vllm_autoheal.remedy import Inventory, plan_heal

    from crafted.checks import diagnose

    d = diagnose((HYBRID_LOGS / "hybrid-qwen3.5-0.8b-blocks-1024.log").read_text())
    assert (d.cause, d.subtype, d.numbers["mamba_blocks"]) == (
        "kv_cache_insufficient",
        "state_blocks_below_max_num_seqs",
        160,
    )
    spec = VLLMServiceSpec(model="m", engine={"maxNumSeqs": 1024, "maxModelLen": 8192, "kvCacheMemoryBytes": GIB})
    remedy = plan_heal(spec, d, inventory=Inventory(shape=config_shape("qwen3.5-0.8b"), gpu_total_gib=139.8))
    assert remedy.changes == {"max_num_seqs": 160}, remedy


@pytest.mark.parametrize(
    "name, tp, kv_gib, length, log, groups",
    [
        ("qwen3-next-80b-a3b", 2, 44.59, 262144, QWEN3_NEXT_TP2, 4),
        ("qwen3.5-0.8b", 1, 5.03, 4096, QWEN35_08B, 4),
    ],
)
def test_a_hybrids_concurrency_is_the_pools_blocks_over_a_requests(name, tp, kv_gib, length, log, groups):
    """vLLM's "Maximum concurrency": the pool's blocks over one request's (its attention blocks and one
    state block a group of Gated DeltaNet layers): 7,162 / (482 + 3) = 14.77 and 807 / (8 + 3) = 73.36.
    Counted as attention tokens over the length, 14.86 and 77.0."""
    need = kv_need(config_shape(name), EngineArgs(tensor_parallel_size=tp), 8192)
    blocks = state_blocks(need, kv_gib * GIB)
    assert f"GPU KV cache size: {blocks // groups * need.block:,} tokens" in log
    est = estimate(
        config_shape(name),
        EngineArgs(tensor_parallel_size=tp, max_model_len=length, kv_cache_memory_bytes=int(kv_gib * GIB)),
        lookup("NVIDIA-H200"),
    )
    assert f"Maximum concurrency for {length:,} tokens per request: {est.max_concurrency:.2f}x" in log


def test_pre_flight_sees_a_hybrids_request_short_of_its_cache_as_vllm_does():
    """100 MiB for Qwen3.5-0.8B at 8K: vLLM refused (0.12 GiB needed, 6,528 tokens fit) on the H200. Counted
    as attention tokens alone, the cache held 8,528 and pre-flight called it a fit; Nemotron-H 8B's 24 state
    pages alone (97.5 MiB) leave no room for a request at all."""
    kv_log = (HYBRID_LOGS / "hybrid-qwen3.5-0.8b-kv-8k.log").read_text()
    engine = EngineArgs(max_model_len=8192, kv_cache_memory_bytes=100 * 2**20, max_num_seqs=16, enforce_eager=True)
    est = estimate(config_shape("qwen3.5-0.8b"), engine, lookup("NVIDIA-H200"))
    assert est.failure == "kv_cache_insufficient"
    assert f"the estimated maximum model length is {est.max_model_len_fit}." in kv_log
    needed = re.search(r"\((\d+\.\d+) GiB KV cache is needed", kv_log)[1]
    assert f"({needed} GiB needed)" in est.reasons[0]  # vLLM's own figure, in pre-flight's words
    est = estimate(config_shape("nemotron-h-8b"), engine, lookup("NVIDIA-H200"))
    assert est.failure == "kv_cache_insufficient" and est.max_model_len_fit == 0
