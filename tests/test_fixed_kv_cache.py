"""Where --kv-cache-memory-bytes (or vLLM 0.32's persisted startup plan, which sets it) fixes the KV cache,
vLLM sizes the cache "as specified by kv_cache_memory_bytes config ... This does not respect the
gpu_memory_utilization config" (gpu_worker.determine_available_memory, 0.25 and 0.32 alike). A GPU out of memory
while serving is then healed by the cache itself: a utilization cut would change nothing vLLM allocates, the
same OOM again."""

from __future__ import annotations

import json

import pytest

from test_review_session38_v032 import LOADED_8B, SERVING_OOM, STARTED_8B, _opening, _rec
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.model_config import check, to_shape
from vllm_autoheal.remedy import plan_heal
from vllm_autoheal.remedy.model import Inventory

from samples import CONFIGS

GIB = 2**30
FIXED_LINE = _rec(
    "EngineCore",
    "INFO",
    "gpu_worker.py:669",
    "Initial free memory 78.61 GiB, reserved 40.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes "
    "config and skipped memory profiling. This does not respect the gpu_memory_utilization config.",
    sec=20,
)


def _spec(engine: dict) -> VLLMServiceSpec:
    return VLLMServiceSpec.model_validate({"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": engine})


def _inventory() -> Inventory:
    shape = to_shape(check(json.loads((CONFIGS / "llama-3.1-8b.json").read_text())))
    return Inventory(gpu_total_gib=79.19, shape=shape)


@pytest.mark.parametrize("told", ["flag", "line"])
def test_a_serving_oom_beside_a_fixed_cache_shrinks_the_cache_not_the_share(told):
    """The flag in the spec, or only vLLM's line (a plan, an image's default args): the cache gives up what
    failed (2 GiB, the OOM's figure) and 0.5 GiB; the utilization is left as it was."""
    engine = {"gpuMemoryUtilization": 0.92, "maxModelLen": 8192}
    if told == "flag":
        engine["kvCacheMemoryBytes"] = 40 * GIB
    log = "\n".join([_opening("meta-llama/Llama-3.1-8B-Instruct"), LOADED_8B, FIXED_LINE, STARTED_8B, SERVING_OOM])
    diag = classify(Signals(log=log))
    assert diag.cause == "runtime_oom" and diag.numbers["kv_fixed_gib"] == 40.0
    remedy = plan_heal(_spec(engine), diag, inventory=_inventory())
    assert remedy.action == "SetKvCacheMemoryBytes", remedy.reason
    assert "gpu_memory_utilization" not in remedy.changes
    assert remedy.changes["kv_cache_memory_bytes"] <= (40 - 2.0 - 0.5) * GIB
    assert remedy.changes["kv_cache_memory_bytes"] >= (40 - 2.0 - 0.5) * GIB - 2**20


def test_a_smaller_fixed_cache_comes_with_the_context_it_holds():
    """A 3 GiB cache less 2.5 GiB holds about 4,000 tokens of Llama-3.1-8B (128 KiB a token), not 131,072: the
    context is cut in the same restart, not after vLLM's own refusal."""
    log = "\n".join(
        [_opening("meta-llama/Llama-3.1-8B-Instruct"), LOADED_8B, FIXED_LINE.replace("40.00", "3.00"), STARTED_8B]
        + [SERVING_OOM]
    )
    engine = {"gpuMemoryUtilization": 0.92, "maxModelLen": 131072, "kvCacheMemoryBytes": 3 * GIB}
    remedy = plan_heal(_spec(engine), classify(Signals(log=log)), inventory=_inventory())
    assert remedy.action == "SetKvCacheMemoryBytes", remedy.reason
    held = remedy.changes["kv_cache_memory_bytes"] // (128 * 1024)
    assert remedy.changes["max_model_len"] <= held


def test_without_a_fixed_cache_the_share_is_cut_as_before():
    log = "\n".join([_opening("meta-llama/Llama-3.1-8B-Instruct"), LOADED_8B, STARTED_8B, SERVING_OOM])
    remedy = plan_heal(_spec({"gpuMemoryUtilization": 0.92, "maxModelLen": 8192}), classify(Signals(log=log)))
    assert remedy.action == "LowerGpuMemoryUtilization"
