"""Hostile review of today's heal-math fixes (e4d31ec..6c16608): each test states the right heal for a
realistic crash, checked against vLLM's arithmetic (the stored vLLM 0.32 source), and is xfail(strict)
while the planner gets it wrong.

vLLM facts the tests lean on:
- `request_memory` (vllm/v1/worker/utils.py, from Worker.init_device) refuses a start whenever
  ceil(total x gpu_memory_utilization) > free, whatever `kv_cache_memory_bytes`; with that flag set,
  determine_available_memory skips profiling and reserves exactly that many bytes for the KV cache ("This
  does not respect the gpu_memory_utilization config", gpu_worker.py): the utilization then only sets what
  the free check asks for. The H200 run c5_kvbytes_8g (kv_cache_memory_bytes 8 GiB) started.
- With enforce_eager vLLM captures no CUDA graph (cudagraph_mode NONE): nothing is allocated beside the
  budget for graphs.
- V1's KV budget is requested - weights - activation peak - non-torch: a cut of u GiB leaves the cache
  u GiB smaller; vLLM refuses a cache that does not hold one request of max_model_len.
"""

from __future__ import annotations

import pytest

from test_review_heal_math import H200_FREE, KV_L4, L4, LLAMA8, RUNTIME_L4
from vllm_autoheal.api import EngineArgs, HealBounds, VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.kube import status as st
from vllm_autoheal.memory import estimate
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import Limits, check

GIB = 2**30

# --- CPU offload: the new cap blocks lowering it -----------------------------------------------------


def test_a_host_oom_kill_lowers_a_set_cpu_offload_without_a_memory_limit():
    """Input: a GPU pod (H100) with cpuOffloadGb 40 and no memory limit is killed by the node's OOM killer
    ("Out of memory: Killed process"); default bounds and allowedActions.
    Now: lower_cpu_offload sizes 40 -> 20, and the gate refuses it: Limits.max_cpu_offload_gb(engine) is
    0.0 where neither the bound nor a limit is known, and bounds_problem holds every cpu_offload_gb a
    change sets to it ("cpu_offload_gb 20.0 is above its bound 0.0"): GiveUp. Before cd8ac1c the cap was
    None (no upper check) and the heal went through.
    Right: each rank pins cpu_offload_gb of host memory (vllm/model_executor/offloader/uva.py); halving it
    frees 20 GiB of the host RAM that ran out. A cap on how much offload a heal may *add* must not refuse
    a heal that takes it away (the gate's direction check already says DOWN for host_ram_oom)."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"cpuOffloadGb": 40, "gpuMemoryUtilization": 0.9},
        resources={"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    )
    d = classify(Signals(log="Out of memory: Killed process 1234 (python3)\n", exit_code=137))
    assert d.cause == "host_ram_oom"
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=79.19, gpu_name="NVIDIA-H100-80GB-HBM3"))
    assert r.action == "LowerCpuOffload", r.summary()
    # (the gate alone: the same refusal)
    engine = EngineArgs(cpu_offload_gb=40, gpu_memory_utilization=0.9)
    assert check("host_ram_oom", {"cpu_offload_gb": 20.0}, engine, "m", None, Limits(HealBounds())) is None


# --- a GPU free-memory refusal with kv_cache_memory_bytes set: no heal left ---------------------------


def test_a_free_memory_refusal_with_a_kv_size_set_is_healed_by_the_share():
    """Input: the real H200 refusal (38.69 of 139.8 GiB free, utilization 0.9) of an engine with
    kvCacheMemoryBytes 8 GiB, Llama-3.1-8B known, max_model_len 8192, default bounds.
    Now: fit_utilization_to_free returns None (share_of_free: "with kv_cache_memory_bytes set,
    utilization does not size the KV cache"), fit_kv_bytes_to_free is now CPU-only (2ca57fb),
    lower_utilization_step skips a refusal that printed what was free, more_tensor_parallel has no
    bound: GiveUp ("no allowed change is left").
    Right: request_memory's only test is ceil(139.8 x u) <= 38.69; with the KV size given, vLLM reserves
    exactly 8 GiB whatever u (it skips profiling), so utilization 0.25 (34.95 GiB asked) passes the
    check and changes nothing else; weights 15 + KV 8 + overheads fit the 38.69 GiB free (the memory
    model agrees). One flag, sized from the printed figures: the heal the share refusal calls for."""
    spec = VLLMServiceSpec(
        model="m", engine={"gpuMemoryUtilization": 0.9, "maxModelLen": 8192, "kvCacheMemoryBytes": 8 * GIB}
    )
    d = classify(Signals(log=H200_FREE, exit_code=1))
    assert d.cause == "gpu_util_exceeds_free" and d.numbers["free_gib"] == 38.69
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200", shape=LLAMA8))
    assert not r.gives_up, r.summary()
    after = r.apply(spec.engine)
    assert after.gpu_memory_utilization * 139.8 <= 38.69, r.summary()
    assert after.kv_cache_memory_bytes == 8 * GIB, r.summary()


# --- a runtime cut whose context cannot be held goes alone -------------------------------------------


@pytest.mark.parametrize(
    "heal",
    [
        {"allowedActions": ["LowerGpuMemoryUtilization", "LowerMaxNumSeqs", "LowerMaxNumBatchedTokens"]},
        {"bounds": {"minMaxModelLen": 26500}},
    ],
    ids=["LowerMaxModelLen-not-allowed", "minMaxModelLen-above-the-held-context"],
)
def test_a_runtime_cut_whose_context_cannot_be_held_is_not_taken(heal):
    """Input: Llama-3.1-8B on an L4 at 0.9 with max_model_len 35,952 (the cache is full: 4.39 GiB) dies of a
    runtime OOM (512 MiB); the shape is known. Either LowerMaxModelLen is not allowed (a user who needs the
    context), or minMaxModelLen 26,500 is above what with_context_held keeps (26,080 with its 3% margin).
    Now: with_context_held finds no shorter context allowed (shorter_context -> None) and returns the cut
    alone: 0.9 -> 0.85, whose own `expected` says "KV cache 3.28 GiB holds 26,896 tokens for max_model_len
    35,952 (still fails ...)".
    Right: vLLM's cache loses 0.05 x 22.05 = 1.10 GiB: 3.29 < 4.39 GiB needed for one request of 35,952, a
    certain "To serve at least one request" refusal at the restart (and the ceiling then refuses the raise
    back to 0.9). Where the cut's context cannot be held, the cut is not this step's (room_for_graphs
    already returns None then): the next step, LowerMaxNumSeqs, which keeps the cache."""
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 35952, "gpuMemoryUtilization": 0.9}, heal=heal)
    rt = classify(Signals(log=RUNTIME_L4, ready_before=True))
    assert rt.cause == "runtime_oom"
    r = plan_heal(spec, rt, inventory=Inventory(gpu_total_gib=22.05, gpu_name="NVIDIA-L4", shape=LLAMA8))
    after = r.apply(spec.engine)
    assert "gpu_memory_utilization" not in r.changes or estimate(LLAMA8, after, L4).fits, r.summary()


# --- the outside-the-budget ceiling outlives what it was about ---------------------------------------

# vLLM's KV refusal of Llama-3.1-8B at 40,000 tokens on an L4 at 0.9 (4.39 GiB of cache, 4.88 GiB needed).
KV_L4_40K = KV_L4.replace("(131072)", "(40000)").replace("16.00 GiB", "4.88 GiB")


def test_a_capture_ceiling_does_not_outlive_the_graphs():
    """Input: status.heals holds a cudagraph_capture_oom record (room_for_graphs cut 0.93 -> 0.9, one GPU);
    the user then edits the spec to enforceEager true and maxModelLen 40,000 (status.tried and attempts
    reset, status.heals kept, as reconcile does). vLLM refuses the cache: 4.88 GiB needed, 4.39 available.
    Now: kube.status.history gives the record ran_util 0.93, outside_budget_ceiling makes it the ceiling,
    and the gate refuses raise_utilization_for_kv's 0.94 ("at or above 0.93, which already ran out of
    memory outside the budget"): LowerMaxModelLen 40,000 -> 35,952, the context the user just asked for.
    With no such record the same crash gets RaiseGpuMemoryUtilization 0.94 (no context lost).
    Right: with enforce_eager vLLM captures no CUDA graph; nothing is allocated beside the budget for them,
    so a capture OOM at 0.93 says nothing about 0.94 (the free memory allows up to 0.95). A ceiling kept
    across the edit cuts the user's context for a crash that cannot recur: the raise."""
    heals = [
        {
            "cause": "cudagraph_capture_oom",
            "action": "LowerGpuMemoryUtilization",
            "numbers": {"tried_gib": 0.25},
            "changes": [{"field": "gpuMemoryUtilization", "before": "0.93", "after": "0.9"}],
            "gpus": 1,
        }
    ]
    history = st.history([], heals, 1)
    assert history[0]["ran_util"] == 0.93
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 40000, "gpuMemoryUtilization": 0.9, "enforceEager": True})
    d = classify(Signals(log=KV_L4_40K, exit_code=1))
    assert d.numbers["needed_gib"] == 4.88 and d.numbers["available_gib"] == 4.39
    r = plan_heal(spec, d, history=history, inventory=Inventory(gpu_total_gib=22.05, gpu_name="NVIDIA-L4"))
    assert "max_model_len" not in r.changes, r.summary()


def test_serve_s_ceiling_is_of_the_split_that_runs_now():
    """Input: `serve` (local.py) records each heal as {cause, action, numbers, ran_util}: a runtime OOM at
    TP 1, utilization 0.92, then a heal IncreaseTensorParallel to TP 2 (at 0.9). At TP 2, eager, vLLM
    refuses the cache for 40,000 tokens (4.88 GiB needed, 4.39 available); maxTensorParallelSize 2.
    Now: serve's records carry neither `gpus` (other_split) nor `resplit`, so outside_budget_ceiling keeps
    0.92 from the TP 1 run and the gate refuses the raise to 0.94: LowerMaxModelLen 40,000 -> 35,952.
    Without the TP 1 record the raise is planned.
    Right: outside_budget_ceiling is "on the split that runs now" by its own contract, and the operator
    drops that very record (status.history marks it other_split: its gpus 1 != 2); the per-GPU memory of a
    TP 1 run (its weights twice those of TP 2) bounds nothing at TP 2. serve must plan as the operator
    does: the raise, no context lost."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 40000, "gpuMemoryUtilization": 0.9, "enforceEager": True},
        heal={"bounds": {"maxTensorParallelSize": 2}},
    )
    engine = spec.engine.model_copy(update={"tensor_parallel_size": 2})
    # (as local.Supervisor.serve appends them: what each crash ran at, and on how many GPUs)
    history = [
        {"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization", "numbers": {}, "ran_util": 0.92, "ran_gpus": 1},
        {
            "cause": "kv_cache_insufficient",
            "action": "IncreaseTensorParallel",
            "numbers": {},
            "ran_util": 0.9,
            "ran_gpus": 1,
        },
    ]
    d = classify(Signals(log=KV_L4_40K, exit_code=1))
    r = plan_heal(
        spec, d, history=history, engine=engine, inventory=Inventory(gpu_total_gib=22.05, gpu_name="NVIDIA-L4")
    )
    assert "max_model_len" not in r.changes, r.summary()
