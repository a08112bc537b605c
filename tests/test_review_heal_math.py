"""Hostile review of the heal arithmetic: each test states the right heal for a realistic crash, checked
against vLLM's own memory arithmetic, and is xfail(strict) while the planner gets it wrong.

vLLM facts the tests lean on (read in vLLM's source and the H200 ground truth):
- `cpu_offload_gb` is "the space in GiB to offload to CPU, per GPU" (vllm/config/offload.py): each
  tensor-parallel rank of a pod pins that much host memory, and the weights left on the GPU are that
  much smaller (what "Model loading took" then prints).
- `request_memory` (vllm/v1/worker/utils.py, called unconditionally from Worker.init_device) raises
  "Free memory on device ... is less than desired GPU memory utilization" whenever
  ceil(total x gpu_memory_utilization) > free, whether or not `kv_cache_memory_bytes` is set: the H200
  run c5_kvbytes_8g (kv_cache_memory_bytes 8 GiB) logs "worker requested memory: 128.62GiB" (0.92 x 139.8).
- `kv_cache_memory_bytes` on a GPU sizes the KV cache in GPU memory ("Size of KV Cache per GPU"): it
  holds no host RAM.
- V1's KV budget is requested - weights - activation peak - non-torch (- the graphs' estimate where the
  release reserves it): linear in the utilization, so a cut of u GiB leaves the cache u GiB smaller.
"""

from __future__ import annotations

from vllm_autoheal.api import EngineArgs, HealBounds, VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import Limits, check, fingerprint

from samples import config_shape

GIB = 2**30
LLAMA8 = config_shape("llama-3.1-8b")
LLAMA70 = config_shape("llama-3.1-70b")
L4 = lookup("NVIDIA-L4")  # 22.05 GiB, as vLLM reports it

# --- CPU offload ------------------------------------------------------------------------------------

# Llama-3.1-70B (131.46 GiB of bf16 weights) on one H200 at 0.9: the weights load, the KV budget is
# negative, vLLM refuses the cache (the shape of every "weights fill the share" log in the corpus).
WEIGHTS_70B_H200 = (
    "(EngineCore_DP0 pid=1) INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 131.46 GiB and 60 s\n"
    "(EngineCore_DP0 pid=1) INFO 12-01 10:00:09 [gpu_worker.py:2] Available KV cache memory: -7.6 GiB\n"
    "(EngineCore_DP0 pid=1) ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.\n"
)


def test_cpu_offload_is_planned_where_it_is_the_allowed_heal_that_fits():
    """Input: the 70B log above, max_model_len 8192, utilization 0.9, one H200, maxTensorParallelSize 1,
    CpuOffload allowed (maxCpuOffloadGb 64, memory limit 256Gi), the model's shape known.
    Now: cpu_offload sizes 21 GiB (131.46 - 111.3 of budget), then _cannot_fit vetoes it: memory.estimate
    never reads engine.cpu_offload_gb, so it still counts 131.46 GiB of weights on the GPU ("the memory
    model says it still does not fit ... weights 131.46"), and the heal gives up saying "no flag on 1
    GPU(s) makes them fit". With any shape known, CpuOffload is only ever planned where the estimate
    says the weights fit without it.
    Right: with 21 GiB per GPU offloaded vLLM loads 110.5 GiB on the GPU and its budget is 125.82 -
    110.5 - 1.7 - 0.2 = 13.4 GiB, far more than 8,192 tokens need (2.5 GiB): CpuOffload, as allowed."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 8192, "gpuMemoryUtilization": 0.9},
        resources={"limits": {"memory": "256Gi"}},
        heal={
            "bounds": {"maxTensorParallelSize": 1, "maxCpuOffloadGb": 64},
            "allowedActions": ["CpuOffload", "RaiseGpuMemoryUtilization", "LowerMaxModelLen"],
        },
    )
    d = classify(Signals(log=WEIGHTS_70B_H200, exit_code=1))
    inv = Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200", shape=LLAMA70, memory_limit_bytes=256 * GIB)
    r = plan_heal(spec, d, inventory=inv)
    assert r.action == "CpuOffload", r.summary()
    # at least what the printed budget lacks (7.6 GiB), at most the bound
    assert 7.6 < r.changes["cpu_offload_gb"] <= 64


def test_the_gate_counts_every_rank_s_offload_against_the_container_limit():
    """Input: tensor parallelism 2 in one pod, a 32Gi memory limit, no maxCpuOffloadGb; a remedy sets
    cpu_offload_gb 20.
    Now: Limits.max_cpu_offload_gb is the container limit (32 GiB) and 20 <= 32 passes the gate.
    Right: vLLM's cpu_offload_gb is per GPU; both ranks (processes of the same container) pin 20 GiB,
    40 GiB of host memory in a 32 GiB container (before the processes' own memory): a certain
    OOMKill, a wrong change. The gate should refuse it (the cap is the limit over TP x PP at most)."""
    engine = EngineArgs(tensor_parallel_size=2, gpu_memory_utilization=0.9, max_model_len=8192)
    limits = Limits(HealBounds(max_tensor_parallel_size=2), memory_limit_bytes=32 * GIB)
    assert check("weights_load_oom", {"cpu_offload_gb": 20.0}, engine, "m", "32Gi", limits) is not None


# --- a free-memory refusal answered with kv_cache_memory_bytes ---------------------------------------

H200_FREE = (
    "ValueError: Free memory on device cuda:0 (38.69/139.8 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)


def test_a_free_memory_refusal_is_not_answered_by_a_kv_size_that_keeps_the_share():
    """Input: the real H200 refusal (38.69 of 139.8 GiB free, utilization 0.9), Llama-3.1-8B known,
    max_model_len 8192, minGpuMemoryUtilization 0.5 (the user's floor forbids the cut to 0.26).
    Now: fit_utilization_to_free is below the floor, so fit_kv_bytes_to_free sets kv_cache_memory_bytes
    21.5 GiB and keeps utilization 0.9; its `expected` even says "fits" (memory.estimate skips the free
    check when kv_cache_memory_bytes is set).
    Right: vLLM's Worker.init_device calls request_memory before anything else and raises whenever
    ceil(139.8 x 0.9) = 125.82 GiB > 38.69 GiB free, kv_cache_memory_bytes or not (the H200 run
    c5_kvbytes_8g logs "worker requested memory: 128.62GiB" with kv_cache_memory_bytes 8 GiB). The
    same ValueError comes back: a restart the printed figures could have avoided. The KV size must come
    with a utilization within what was free, or (as the floor forbids that here) no change."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"gpuMemoryUtilization": 0.9, "maxModelLen": 8192},
        heal={"bounds": {"minGpuMemoryUtilization": 0.5}},
    )
    d = classify(Signals(log=H200_FREE, exit_code=1))
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200", shape=LLAMA8))
    after = r.apply(spec.engine)
    assert r.gives_up or after.gpu_memory_utilization * 139.8 <= 38.69, r.summary()


# --- host RAM ----------------------------------------------------------------------------------------


def test_a_host_oom_kill_on_a_gpu_never_halves_the_gpu_kv_cache():
    """Input: a GPU pod (H100, gpuProduct set) with kvCacheMemoryBytes 20Gi and a 32Gi limit is
    OOMKilled ("Memory cgroup out of memory"); no maxMemoryLimit; default allowedActions.
    Now: raise_memory_limit has no bound, no CPU offload to lower, so shrink_kv_bytes halves the KV
    cache to 10 GiB ("host RAM ran out; the KV cache 20Gi -> 10Gi").
    Right: on a GPU, kv_cache_memory_bytes is the cache's size in GPU memory; it takes nothing from the
    container's host memory, so the same OOMKill follows with half the cache (only vLLM's CPU backend
    keeps its KV cache in host RAM). A wrong memory change: no change (a give-up naming maxMemoryLimit)."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"kvCacheMemoryBytes": 20 * GIB, "gpuMemoryUtilization": 0.9},
        resources={"gpuProduct": "NVIDIA-H100-80GB-HBM3", "limits": {"memory": "32Gi"}},
    )
    d = classify(Signals(log="Memory cgroup out of memory: Killed process 1234 (python3)\n", exit_code=137))
    assert d.cause == "host_ram_oom"
    inv = Inventory(gpu_total_gib=79.19, gpu_name="NVIDIA-H100-80GB-HBM3", memory_limit_bytes=32 * GIB)
    r = plan_heal(spec, d, inventory=inv)
    assert "kv_cache_memory_bytes" not in r.changes, r.summary()


# --- successive crashes: a runtime cut after a KV heal, and a KV raise after a runtime cut -----------

# vLLM's KV refusal of Llama-3.1-8B at 131,072 tokens on an L4 at 0.9 (4.39 GiB of cache, as the memory
# model and vLLM's 8,192 tokens a GiB give it), and a runtime OOM once the context was cut to its estimate.
KV_L4 = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (4.39 GiB). Based on the available memory, the "
    "estimated maximum model length is 35952. Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine.\n"
)
RUNTIME_L4 = (
    "INFO Avg prompt throughput: 100.0 tokens/s\n"
    '(EngineCore_DP0 pid=1) ERROR   File "/v/vllm/v1/worker/gpu_model_runner.py", line 2000, in execute_model\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
    "22.05 GiB of which 100.00 MiB is free.\n"
)


def _kv_then_cut():
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 131072, "gpuMemoryUtilization": 0.9})
    kv = classify(Signals(log=KV_L4, exit_code=1))
    first = plan_heal(spec, kv, inventory=Inventory(gpu_total_gib=22.05, gpu_name="NVIDIA-L4"))
    assert first.changes == {"max_model_len": 35952}  # vLLM's own estimate: the cache is then full
    return spec, kv, first


def test_a_runtime_cut_keeps_the_context_its_smaller_cache_holds():
    """Input: after the KV heal above (max_model_len 35,952 = what 4.39 GiB holds at 0.9), the server
    runs and dies of a runtime OOM (512 MiB). Llama-3.1-8B's shape is known.
    Now: lower_utilization_step cuts 0.9 -> 0.85 alone; the remedy's own `expected` reads "KV cache 3.28
    GiB holds 26,896 tokens for max_model_len 35,952 (still fails ...)". vLLM's arithmetic agrees: the
    cache loses 0.05 x 22.05 = 1.10 GiB, 3.29 < 4.39 GiB needed: a certain KV refusal at the restart.
    Right: the cut comes with the context its smaller cache holds, in the same restart (as the
    free-memory and capture cuts do, steps.with_context_held), or another step (fewer sequences)."""
    spec, kv, first = _kv_then_cut()
    engine = first.apply(spec.engine)
    rt = classify(Signals(log=RUNTIME_L4, ready_before=True))
    assert rt.cause == "runtime_oom"
    r = plan_heal(
        spec,
        rt,
        history=[{"cause": "kv_cache_insufficient", "action": first.action, "numbers": kv.numbers}],
        engine=engine,
        inventory=Inventory(gpu_total_gib=22.05, gpu_name="NVIDIA-L4", shape=LLAMA8),
        failed={fingerprint("m", spec.engine, None), fingerprint("m", engine, None)},
    )
    after = r.apply(engine)
    assert "gpu_memory_utilization" not in r.changes or estimate(LLAMA8, after, L4).fits, (r.summary(), after)


def test_a_kv_raise_never_undoes_a_runtime_cut():
    """Input: the sequence above without the model's shape: KV refusal at 0.9 -> max_model_len 35,952;
    runtime OOM at 0.9 -> utilization 0.85 (the runtime plan); at 0.85 vLLM refuses the cache
    (needs 4.39, has 3.29 GiB, estimate 26,944). status.tried and status.heals say both, and the
    settings 0.9/35,952 are among those that crashed of memory.
    Now: raise_utilization_for_kv sizes 0.85 + 1.10/22.05 + 0.01 -> 0.91: above the 0.9 that ran out of
    memory while serving with this very context, so the runtime OOM comes back (less room outside the
    budget than before), then the runtime plan cuts again: a loop between two causes.
    Right: no raise to or above a utilization whose settings (same context) already crashed of memory;
    the context cut to vLLM's estimate (26,944) fits at 0.85."""
    spec, kv, first = _kv_then_cut()
    ran = first.apply(spec.engine)  # 0.9 / 35,952: ran, then OOM while serving
    cut = ran.model_copy(update={"gpu_memory_utilization": 0.85})
    kv2 = classify(
        Signals(
            log=KV_L4.replace("(131072)", "(35952)")
            .replace("16.00 GiB", "4.39 GiB")
            .replace("(4.39 GiB)", "(3.29 GiB)")
            .replace("is 35952", "is 26944"),
            exit_code=1,
        )
    )
    assert kv2.numbers["available_gib"] == 3.29 and kv2.numbers["needed_gib"] == 4.39
    history = [
        {"cause": "kv_cache_insufficient", "action": "LowerMaxModelLen"},
        {"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization"},
        {"cause": "kv_cache_insufficient", "action": None, "numbers": kv.numbers},
        # (the record of the runtime heal, as kube.status.history and serve give it: what the crash ran at)
        {
            "cause": "runtime_oom",
            "action": None,
            "numbers": {"tried_gib": 0.5, "gpu_total_gib": 22.05},
            "ran_util": 0.9,
        },
    ]
    r = plan_heal(
        spec,
        kv2,
        history=history,
        engine=cut,
        attempts=2,
        inventory=Inventory(gpu_total_gib=22.05, gpu_name="NVIDIA-L4"),
        failed={fingerprint("m", spec.engine, None), fingerprint("m", ran, None)},
    )
    assert r.changes.get("gpu_memory_utilization", 0.85) < 0.9, r.summary()
