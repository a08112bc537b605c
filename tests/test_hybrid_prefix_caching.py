"""A hybrid's longest request under prefix caching: vLLM turns mamba_cache_mode to align for a Mamba or
Gated DeltaNet hybrid with --enable-prefix-caching (MambaModelConfig), and its check then counts two
state pages a Mamba layer (MambaSpec.max_memory_usage_bytes: 2 + speculative + checkpoint blocks), not
one: pre-flight, counting one, called a cache a fit that vLLM refuses at start-up."""

from __future__ import annotations

import json

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate, kv_need
from vllm_autoheal.shape_reader import shape_from_config

from samples import CONFIGS

QWEN35 = shape_from_config(json.loads((CONFIGS / "qwen3.5-0.8b.json").read_text()))
MIB = 2**20


def _args(*extra: str) -> EngineArgs:
    return EngineArgs(max_model_len=8192, kv_cache_memory_bytes=130 * MIB, enforce_eager=True, extra_args=list(extra))


def test_prefix_caching_doubles_the_state_pages_a_request_holds():
    plain = kv_need(QWEN35, _args(), 2048)
    cached = kv_need(QWEN35, _args("--enable-prefix-caching"), 2048)
    assert cached.state_bytes == 2 * plain.state_bytes  # 18 Gated DeltaNet layers: 36 pages of 544 tokens
    # vLLM needs 121 MiB of attention blocks and 38 MiB of state for 8,192 tokens: 130 MiB is refused
    got = estimate(QWEN35, _args("--enable-prefix-caching"), lookup("NVIDIA-H200"))
    assert not got.fits and got.failure == "kv_cache_insufficient", got.reasons
    assert estimate(QWEN35, _args(), lookup("NVIDIA-H200")).fits  # one page a layer: 121 MiB fits


def test_mode_all_or_no_caching_keeps_one_page():
    plain = kv_need(QWEN35, _args(), 2048).state_bytes
    assert kv_need(QWEN35, _args("--enable-prefix-caching", "--mamba-cache-mode", "all"), 2048).state_bytes == plain
    assert kv_need(QWEN35, _args("--no-enable-prefix-caching"), 2048).state_bytes == plain
