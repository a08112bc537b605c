"""The figures an OOM is judged by: torch's own accounting at the failure outweighs the operator's GPU
snapshot taken at start, a process on another GPU or a small one does not count against GPU 0, and a
CPU engine's KV size is healed by the flag that set it."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify, termination
from vllm_autoheal.diagnosis.model import GpuSnapshot
from vllm_autoheal.remedy import plan_heal

from crafted.bases import CENSUS, H100
from crafted.checks import said


# --- The start snapshot in the operator's reading ------------------------------------
def _snapshot(gpus, processes) -> GpuSnapshot:
    doc = termination.validate(
        json.dumps(
            {
                "autoheal": 1,
                "diagnosis": {"cause": "unknown"},
                "gpu_start": {"gpus": gpus, "other_processes": processes},
            }
        )
    )
    snap = termination.gpu_snapshot(doc)
    assert snap is not None
    return snap


def test_a_small_process_at_start_does_not_hide_torchs_report_at_the_failure():
    """Unfixed: gpu_util_exceeds_free -> weights_load_oom oom_in_load. The snapshot (taken before vLLM
    started) lists a 0.25 GiB process, so other_process_gib reads 0.25 from it and never looks at torch's
    own list at the failure ("Process 31877 has 38.52 GiB memory in use"). Without a snapshot, or with an
    empty one, it says gpu_util_exceeds_free. It should still: a later process is in torch's report."""
    log = CENSUS["torch2.2-2.4-oom-two-processes-weights"]["log"]
    assert classify(Signals(log=log)).cause == "gpu_util_exceeds_free"
    snap = _snapshot([[0, H100, 79.15, 78.6]], [[4242, 0, 0.25]])
    d = classify(Signals(log=log, gpu=snap))
    assert d.cause == "gpu_util_exceeds_free", f"said {said(d)}; torch named a 38.52 GiB process at the failure"


def test_a_process_on_another_gpu_does_not_count_for_an_oom_on_gpu_0():
    """Unfixed: profiling_oom -> gpu_util_exceeds_free. torch places the OOM on GPU 0 and its figures
    (79.15 total, 2.13 free, 76.23 reserved by PyTorch) leave no other process there; the snapshot's
    30 GiB process is on GPU 1, and other_process_bytes() sums every GPU. It should say profiling_oom."""
    log = CENSUS["torch1.5-1.9-oom-reserved-no-hint-profile"]["log"]
    snap = _snapshot([[0, H100, 79.15, 78.6], [1, H100, 79.15, 48.6]], [[4242, 1, 30.0]])
    d = classify(Signals(log=log, gpu=snap))
    assert d.cause == "profiling_oom", f"said {said(d)}; the other process is on GPU 1, the OOM on GPU 0"


# --- The CPU backend's KV checks and their heals ---------------------------------------
def _cpu_spec(**engine) -> VLLMServiceSpec:
    return VLLMServiceSpec(model="m", engine={"gpu_memory_utilization": 0.92, "enforce_eager": True, **engine})


def test_the_cpu_auto_kv_heal_keeps_the_workers_own_memory_in_its_budget():
    """Unfixed: the auto form (`for kv (98.5/115.66 GiB)`, the worker's budget 115.66 less its RSS 17.16)
    with 12.0 GiB available -> gpu_util_exceeds_free kv_space_exceeds_free_host_memory, heal
    LowerGpuMemoryUtilization 0.08 (10.06 GiB of 125.72: below the 17.16 GiB the worker already uses).
    The next start then fails with `for kv (-7.10/10.06 GiB)`, kv_cache_insufficient, heal
    RaiseGpuMemoryUtilization 0.95, which is the first crash again. The budget must keep the worker's
    own memory (requested - kv) plus room for a KV cache."""
    log = CENSUS["v0.32-cpu-auto-kv-exceeds-available"]["log"].replace("(31.2/125.72 GiB)", "(12.0/125.72 GiB)")
    d = classify(Signals(log=log))
    r = plan_heal(_cpu_spec(), d)
    consumed = 115.66 - 98.5  # what the worker held when vLLM checked (its budget less the KV it asked for)
    new = (r.changes or {}).get("gpu_memory_utilization")
    assert new is None or new * 125.72 > consumed + 1.0, (
        f"{d.cause} {d.subtype} -> {r.action} {r.changes}: a budget of {new * 125.72:.2f} GiB is below the "
        f"{consumed:.2f} GiB the worker already uses"
    )


def test_an_explicit_cpu_kv_size_is_not_healed_by_lowering_utilization():
    """Unfixed (census DESIGNED: gpu_util_exceeds_free, "the KV space is the flag to lower"): the explicit
    form (`for kv (40.0 GiB)`) with no kvCacheMemoryBytes in the spec (the size is VLLM_CPU_KVCACHE_SPACE,
    which vLLM 0.32's platforms/cpu.py applies over the flag) -> LowerGpuMemoryUtilization 0.14. With an
    explicit KV size cpu_worker neither checks nor uses the utilization: the same crash follows. The heal
    should change the KV size or nothing."""
    d = classify(Signals(log=CENSUS["v0.32-cpu-explicit-kv-exceeds-available"]["log"]))
    r = plan_heal(_cpu_spec(), d)
    assert set(r.changes or {}) != {"gpu_memory_utilization"}, f"{d.subtype} -> {r.action} {r.changes}"


# --- The 2 GiB allowance for torch < 2.2 (measured) -----------------------------------------------
def test_a_3_gib_other_process_is_still_seen_under_old_torch():
    """At 3 GiB: 79.15 total, 0.5 free, 74.0 reserved by PyTorch (own non-torch ~0.65 GiB,
    another process ~4 GiB): 79.15 - 0.5 - 76 = 2.65 > 1, gpu_util_exceeds_free. (At ~2.4 GiB another
    process is no longer seen: the allowance's trade, item 10.)"""
    log = CENSUS["torch1.5-1.9-oom-reserved-no-hint-profile"]["log"].replace(
        "2.13 GiB free; 76.23 GiB reserved", "0.50 GiB free; 74.00 GiB reserved"
    )
    assert classify(Signals(log=log)).cause == "gpu_util_exceeds_free"


# --- A stale start snapshot against torch's own accounting ---------------------------------------
@pytest.mark.parametrize(
    "census_id,cause", [("v0.11-weights-oom", "weights_load_oom"), ("v0.32-profile-run-oom", "profiling_oom")]
)
def test_torchs_own_accounting_at_the_failure_outweighs_a_stale_start_snapshot(census_id, cause):
    """Unfixed: -> gpu_util_exceeds_free other_process_holds_gpu, heal
    LowerGpuMemoryUtilization. torch's figures at the failure leave < 0.1 GiB for any other process
    (total - free - this process), so the snapshot's 30 GiB process had exited. Should say `cause`."""
    log = CENSUS[census_id]["log"]
    assert classify(Signals(log=log)).cause == cause
    snap = _snapshot([[0, "NVIDIA A100-SXM4-80GB", 79.19, 49.0]], [[4242, 0, 30.0]])
    d = classify(Signals(log=log, gpu=snap))
    r = plan_heal(VLLMServiceSpec(model="m", engine={"gpu_memory_utilization": 0.9}), d)
    assert d.cause == cause, (
        f"said {said(d)} -> {r.action} {r.changes}; torch's own figures leave no room for the snapshot's process"
    )


# --- VLLM_CPU_KVCACHE_SPACE from elsewhere than spec.env ----------------------------------------
@pytest.mark.parametrize(
    "spec_extra",
    [{"env_from": [{"configMapRef": {"name": "cpu-env"}}]}, {}],
    ids=["env-from-configmap", "no-kv-flag-in-spec"],
)
def test_an_explicit_cpu_kv_size_the_flag_did_not_set_is_not_healed_by_the_flag(spec_extra):
    """Unfixed: SetKvCacheMemoryBytes 16106127360. The log's explicit KV size (40.0 GiB) is not the spec's
    flag (it sets none): platforms/cpu.py applied VLLM_CPU_KVCACHE_SPACE (from envFrom, or the image) over
    the flag, and will again. Should: no kv_cache_memory_bytes change."""
    d = classify(Signals(log=CENSUS["v0.32-cpu-explicit-kv-exceeds-available"]["log"]))
    assert d.subtype == "kv_space_exceeds_free_host_memory"
    spec = VLLMServiceSpec(model="m", engine={"gpu_memory_utilization": 0.92, "enforce_eager": True}, **spec_extra)
    r = plan_heal(spec, d)
    assert "kv_cache_memory_bytes" not in (r.changes or {}), f"{r.action} {r.changes}: the variable overrides it"
