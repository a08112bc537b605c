"""A hostile pod writes whatever termination message it likes: one that passes the schema (any known cause,
phase and subtype, any figure vLLM's table names, within its range) is read as the operator reads it
(classify, with the pod's exit state) and planned against specs, GPUs and model shapes drawn at random.
The planner never raises on it, and whatever it changes stays inside the VLLMService's bounds: a forged
message can at most pick among the changes the owner allowed."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.api.heal_policy import ALL_ACTIONS
from vllm_autoheal.diagnosis import MEMORY_CAUSES, PHASES, Signals, classify, figures
from vllm_autoheal.quantity import parse_quantity
from vllm_autoheal.remedy import plan_heal
from vllm_autoheal.remedy.model import Inventory

from samples import config_shape

# The subtypes the planner gives their own plans, and names it does not know.
SUBTYPES = (
    None,
    "no_cache_blocks",
    "no_blocks_beside_other_processes",
    "max_model_len_exceeds_kv_capacity",
    "state_blocks_below_max_num_seqs",
    "free_memory_below_requested",
    "free_memory_below_engine_budget",
    "other_process_holds_gpu",
    "weights_exceed_gpu",
    "allocation_larger_than_gpu",
    "sampler_warmup_oom",
    "kv_check_fails_on_smallest_stage",
    "not_a_subtype_anyone_knows",
)
FIGURE = st.one_of(
    st.integers(0, 2**31),
    st.floats(0, 1e5, allow_nan=False),
    st.floats(0, 1),
    st.sampled_from([0, 1, 0.5, 0.99, 1.0, 2**24 - 1, 4096, 23.65, 79.1, 139.8]),
)
ENGINE = st.fixed_dictionaries(
    {},
    optional={
        "gpuMemoryUtilization": st.floats(0.05, 1),
        "maxModelLen": st.integers(1, 2**20),
        "maxNumSeqs": st.integers(1, 1024),
        "maxNumBatchedTokens": st.integers(1, 2**20),
        "tensorParallelSize": st.sampled_from([1, 2, 4]),
        "enforceEager": st.booleans(),
        "kvCacheMemoryBytes": st.integers(1, 2**40),
        "cpuOffloadGb": st.floats(0, 100),
    },
)
BOUNDS = {
    "minGpuMemoryUtilization": 0.3,
    "maxGpuMemoryUtilization": 0.93,
    "minMaxModelLen": 1024,
    "minMaxNumSeqs": 4,
    "maxTensorParallelSize": 4,
    "maxMemoryLimit": "48Gi",
}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cause=st.sampled_from(sorted(MEMORY_CAUSES)),
    phase=st.sampled_from(PHASES),
    subtype=st.sampled_from(SUBTYPES),
    numbers=st.dictionaries(st.sampled_from(sorted(figures.KIND)), FIGURE, max_size=12),
    engine=ENGINE,
    gpu_gib=st.sampled_from([None, 0.5, 23.65, 79.1, 139.8]),
    shape=st.sampled_from([None, "qwen2.5-7b"]),
    bounded=st.booleans(),
)
def test_a_forged_message_changes_nothing_beyond_the_bounds(
    cause, phase, subtype, numbers, engine, gpu_gib, shape, bounded
):
    diagnosis = {"cause": cause, "phase": phase, "confidence": "high", "numbers": numbers}
    if subtype:
        diagnosis["subtype"] = subtype
    message = json.dumps({"autoheal": 1, "exit_code": 1, "diagnosis": diagnosis})
    diag = classify(Signals(termination_message=message, exit_code=1))
    heal: dict = {"backoffSeconds": 0}
    if bounded:
        heal |= {
            "bounds": BOUNDS,
            "allowedActions": list(ALL_ACTIONS),
            "quantizedFallback": {"allowed": True, "model": "org/model-awq", "method": "awq"},
        }
    spec = VLLMServiceSpec(model="org/model", engine=engine, resources={"limits": {"memory": "32Gi"}}, heal=heal)
    inventory = Inventory(gpu_total_gib=gpu_gib, shape=config_shape(shape) if shape else None)

    remedy = plan_heal(spec, diag, inventory=inventory)

    bounds, now, changes = spec.heal.bounds, spec.engine, remedy.changes
    util = changes.get("gpu_memory_utilization")
    if util is not None:
        assert 0 < util <= bounds.max_gpu_memory_utilization, remedy.summary()
        if util < now.gpu_memory_utilization and bounds.min_gpu_memory_utilization is not None:
            assert util >= bounds.min_gpu_memory_utilization, remedy.summary()
    if "max_model_len" in changes:
        assert changes["max_model_len"] >= min(bounds.min_max_model_len, now.max_model_len or 2**24), remedy.summary()
    if "max_num_seqs" in changes:
        assert changes["max_num_seqs"] >= bounds.min_max_num_seqs, remedy.summary()
    if "tensor_parallel_size" in changes:
        assert bounds.max_tensor_parallel_size and changes["tensor_parallel_size"] <= bounds.max_tensor_parallel_size
    if "memory_limit" in changes:
        assert bounds.max_memory_limit
        assert parse_quantity(changes["memory_limit"]) <= parse_quantity(bounds.max_memory_limit)
    if "model" in changes:
        assert changes["model"] == spec.heal.quantized_fallback.model
