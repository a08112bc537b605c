"""A split of a model whose weights are partly offloaded to host memory (--cpu-offload-gb).

vLLM's cpu_offload_gb is per GPU (vllm/config/offload.py: "The space in GiB to offload to CPU, per GPU";
each rank pins it: model_executor/offloader/uva.py), so a split that keeps the figure pins it on every new
rank too. Where the container's memory limit cannot hold that, the split used to be refused outright (a
GiveUp where two GPUs fit); now the split comes with the offload each rank can hold, never less than the
share of what ran (the host memory that ran, over more ranks: each GPU also holds half the weights)."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import EngineArgs, HealBounds, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import Limits, check

from samples import config_shape

GIB = 2**30
LLAMA70 = config_shape("llama-3.1-70b")
H100 = lookup("NVIDIA-H100-80GB-HBM3")


def _spec(limit: str | None, offload: float = 30.0, max_offload: float | None = None) -> VLLMServiceSpec:
    bounds: dict[str, object] = {"maxTensorParallelSize": 4}
    if max_offload is not None:
        bounds["maxCpuOffloadGb"] = max_offload
    return VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B",
        engine={"cpuOffloadGb": offload, "maxModelLen": 8192},
        resources={"limits": {"memory": limit}} if limit else {},
        heal={"bounds": bounds, "allowedActions": ["IncreaseTensorParallel", "CpuOffload"]},
    )


def _inventory(limit_gib: int | None) -> Inventory:
    return Inventory(gpu_total_gib=H100.memory_gib, shape=LLAMA70, memory_limit_bytes=limit_gib and limit_gib * GIB)


@pytest.mark.parametrize(
    "limit_gib, offload_after",
    [
        # the most the limit holds a rank: its 0.9, less 2.6 GiB and 0.6 a rank for vLLM's processes, over 2
        # ranks, each layer of 816 MiB pinning 960 (offload_pinned.py): 19.7 GiB pinned is 16.7 offloaded
        (48, 16.7),
        (64, 22.4),  # (26.9 GiB pinned a rank)
        (40, 15.0),  # the limit holds 13.6 a rank: the share of what ran (30 over 2 ranks), no less
        (None, 15.0),  # no limit known: the host memory that ran, over the ranks
    ],
)
def test_a_split_offloads_per_rank_what_the_host_memory_holds(limit_gib, offload_after):
    spec = _spec(f"{limit_gib}Gi" if limit_gib else None)
    for cause in ("weights_load_oom", "kv_cache_insufficient"):
        r = plan_heal(spec, Diagnosis(cause=cause), inventory=_inventory(limit_gib))
        assert r.action == "IncreaseTensorParallel", (cause, r.reason)
        assert r.changes == {"tensor_parallel_size": 2, "cpu_offload_gb": offload_after}, (cause, r.changes)
        assert f"cpu_offload_gb 30 -> {offload_after:g} per GPU" in r.reason
        healed = r.apply(spec.engine)
        assert healed.cpu_offload_gb < 30.0  # (less on each rank: the limit holds no more)
        assert estimate(LLAMA70, healed, H100).failure in (None, "cudagraph_capture_oom")


@pytest.mark.parametrize("limit_gib", [512, 96])  # (96: 30 a rank pins 35.3 GiB; 2 ranks and vLLM's 3.8 fit 86.4)
def test_a_split_keeps_the_offload_where_the_limit_holds_it_on_every_rank(limit_gib):
    r = plan_heal(_spec(f"{limit_gib}Gi"), Diagnosis(cause="weights_load_oom"), inventory=_inventory(limit_gib))
    assert r.action == "IncreaseTensorParallel" and r.changes == {"tensor_parallel_size": 2}, r.changes
    assert "cpu_offload_gb" not in r.reason


def test_the_bound_caps_the_offload_of_a_split_too():
    spec = _spec("96Gi", max_offload=20.0)
    r = plan_heal(spec, Diagnosis(cause="weights_load_oom"), inventory=_inventory(96))
    assert r.changes == {"tensor_parallel_size": 2, "cpu_offload_gb": 20.0}, r.changes


ENGINE = EngineArgs(cpu_offload_gb=30, max_model_len=8192)
LIMITS_48 = Limits(HealBounds(max_tensor_parallel_size=4), memory_limit_bytes=48 * GIB)


@pytest.mark.parametrize(
    "cause, changes, problem",
    [
        # the split that pins 30 on each of 2 ranks: twice the host memory that ran, more than 48Gi holds
        ("weights_load_oom", {"tensor_parallel_size": 2}, "more than the container's memory limit holds"),
        # less offload with no split: more weights on the same GPU, for a cache that was short
        ("kv_cache_insufficient", {"cpu_offload_gb": 15.0}, "not what kv_cache_insufficient calls for"),
        # a split may lower the offload per rank, never raise it for a KV shortage
        (
            "kv_cache_insufficient",
            {"tensor_parallel_size": 2, "cpu_offload_gb": 31.0},
            "does not move the way kv_cache_insufficient calls for",
        ),
        # a split's offload above what the limit holds and above the share of what ran
        ("weights_load_oom", {"tensor_parallel_size": 2, "cpu_offload_gb": 16.0}, "more than the container's"),
    ],
)
def test_the_gate_bounds_a_splits_host_memory(cause, changes, problem):
    limits = (
        LIMITS_48 if changes.get("cpu_offload_gb") != 31.0 else Limits(LIMITS_48.bounds, memory_limit_bytes=512 * GIB)
    )
    assert problem in (check(cause, changes, ENGINE, "m", "48Gi", limits) or "")


@pytest.mark.parametrize("cause", ["weights_load_oom", "kv_cache_insufficient", "gpu_util_exceeds_free"])
def test_the_gate_lets_a_split_keep_the_host_memory_that_ran(cause):
    changes: dict[str, float] = {"tensor_parallel_size": 2, "cpu_offload_gb": 15.0}
    if cause == "gpu_util_exceeds_free":  # (a split goes with a share of what was free there: ONLY_WITH)
        changes["gpu_memory_utilization"] = ENGINE.gpu_memory_utilization - 0.1
    assert check(cause, changes, ENGINE, "m", "48Gi", LIMITS_48) is None
