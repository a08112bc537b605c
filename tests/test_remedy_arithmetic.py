"""Remedies sized by arithmetic from what vLLM printed (the H200 starts of issue 14), so that a
restart is spent only on a change that can work."""

from __future__ import annotations

from pathlib import Path

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import GpuInfo, GpuSnapshot, Signals, classify
from vllm_autoheal.remedy import GIVE_UP, Inventory, plan_heal

from samples import config_shape

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
H200 = GpuSnapshot(gpus=[GpuInfo(index=0, name="NVIDIA H200", total_bytes=143771 * 2**20)])

CAPTURE_OOM = """(EngineCore_DP0 pid=9) INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 15.0 GiB and 2.1 seconds
(EngineCore_DP0 pid=9) INFO 12-01 10:00:30 [gpu_worker.py:1] Available KV cache memory: 122.04 GiB
(EngineCore_DP0 pid=9) ERROR 12-01 10:00:40 [core.py:1] Traceback (most recent call last):
(EngineCore_DP0 pid=9) ERROR 12-01 10:00:40 [core.py:1]   File "/v/vllm/v1/worker/gpu_model_runner.py", line 3362, in capture_model
(EngineCore_DP0 pid=9) ERROR 12-01 10:00:40 [core.py:1]     self._capture_cudagraphs(
(EngineCore_DP0 pid=9) ERROR 12-01 10:00:40 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which 28.31 MiB is free.
"""
SAMPLER_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 31.31 GiB. GPU 0 has a total capacity "
    "of 139.80 GiB of which 58.10 GiB is free.\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "RuntimeError: CUDA out of memory occurred when warming up sampler with 65536 dummy requests. "
    "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.\n"
)
WEIGHTS_72B = (
    "(EngineCore_DP0 pid=1) INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 135.43 GiB and 9 s\n"
    "(EngineCore_DP0 pid=1) INFO 12-01 10:00:09 [gpu_worker.py:2] Available KV cache memory: -11.6 GiB\n"
    "(EngineCore_DP0 pid=1) ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.\n"
)


def spec(heal: dict | None = None, **engine) -> VLLMServiceSpec:
    return VLLMServiceSpec(model="m", engine=engine, heal=heal or {})


def test_capture_oom_lowers_utilization_just_enough_and_keeps_graphs():
    d = classify(Signals(log=CAPTURE_OOM, ready_before=False))
    assert d.cause == "cudagraph_capture_oom"
    r = plan_heal(spec(gpuMemoryUtilization=0.995), d, inventory=Inventory(gpu_total_gib=139.8))
    assert r.action == "LowerGpuMemoryUtilization", r.summary()
    assert 0.95 <= r.changes["gpu_memory_utilization"] < 0.995  # the default bound is 0.95
    assert "enforce_eager" not in r.changes


def test_capture_oom_with_room_already_gives_up_graphs():
    d = classify(Signals(log=CAPTURE_OOM, ready_before=False))
    r = plan_heal(spec(gpuMemoryUtilization=0.9), d, inventory=Inventory(gpu_total_gib=139.8))
    assert r.action == "EnforceEager"


def test_sampler_oom_sizes_max_num_seqs_from_the_failed_allocation():
    d = classify(Signals(log=SAMPLER_OOM, ready_before=False))
    assert d.cause == "profiling_oom" and d.numbers["dummy_requests"] == 65536
    r = plan_heal(spec(maxNumSeqs=65536, maxNumBatchedTokens=65536), d, inventory=Inventory(gpu_total_gib=139.8))
    assert r.action == "LowerMaxNumSeqs"
    assert r.changes["max_num_seqs"] == 1024  # vLLM's default on this GPU, far below a halving's 65536
    assert "31.31 GiB" in r.reason


def test_a_warm_up_oom_before_the_server_answered_is_a_start_up_failure():
    log = (
        'File "/v/vllm/v1/worker/gpu_model_runner.py", line 2000, in execute_model\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    assert classify(Signals(log=log, ready_before=False)).cause == "profiling_oom"
    assert classify(Signals(log=log, ready_before=True)).cause == "runtime_oom"


def test_weights_larger_than_one_gpu_give_up_at_once_and_say_what_would_fit():
    d = classify(Signals(log=WEIGHTS_72B, gpu=H200))
    assert d.cause == "weights_load_oom"
    r = plan_heal(spec(), d, inventory=Inventory(gpu_total_gib=140.4))
    assert r.action == GIVE_UP
    assert "tensor parallelism 2" in r.reason and "8-bit checkpoint" in r.reason


def test_weights_larger_than_one_gpu_heal_to_two_gpus_when_allowed():
    d = classify(Signals(log=WEIGHTS_72B, gpu=H200))
    heal = {
        "bounds": {"maxTensorParallelSize": 2},
        "allowedActions": ["IncreaseTensorParallel", "LowerGpuMemoryUtilization"],
    }
    r = plan_heal(spec(heal=heal), d, inventory=Inventory(gpu_total_gib=140.4))
    assert r.action == "IncreaseTensorParallel" and r.changes == {"tensor_parallel_size": 2}


def test_an_empty_kv_budget_that_no_allowed_raise_fills_is_not_raised_nor_halved():
    """Where the GPU is not named the log reads as the cache's shortage (no cache blocks), but vLLM's
    own budget line says -11.6 GiB: utilization 0.9 -> 0.95 adds 7 GiB, still none, and an fp8 cache
    halves nothing. Before: 'utilization raised to the most the bounds allow' (a certain second
    crash), then fp8. Now: neither; more GPUs where allowed, else the weights' explanation."""
    d = classify(Signals(log=WEIGHTS_72B))
    assert d.cause == "kv_cache_insufficient" and d.numbers["available_kv_gib"] == -11.6
    r = plan_heal(spec(), d, inventory=Inventory(gpu_total_gib=140.4))
    assert r.action == GIVE_UP and "tensor parallelism 2" in r.reason
    allowed = ["RaiseGpuMemoryUtilization", "Fp8KvCache", "IncreaseTensorParallel"]
    heal = {"bounds": {"maxTensorParallelSize": 2}, "allowedActions": allowed}
    r = plan_heal(spec(heal=heal), d, inventory=Inventory(gpu_total_gib=140.4))
    assert r.action == "IncreaseTensorParallel" and r.changes == {"tensor_parallel_size": 2}


def test_an_empty_kv_budget_that_the_raise_fills_is_raised():
    """-1.5 GiB on an 80 GiB GPU: 0.9 -> 0.95 adds 4 GiB, so the raise is the change."""
    log = WEIGHTS_72B.replace("135.43", "71.2").replace("-11.6", "-1.5")
    r = plan_heal(spec(), classify(Signals(log=log)), inventory=Inventory(gpu_total_gib=80.0))
    assert r.action == "RaiseGpuMemoryUtilization" and r.changes == {"gpu_memory_utilization": 0.95}


def test_a_raise_into_an_empty_budget_comes_with_the_context_the_grown_cache_holds():
    """Llama 3.1 70B at TP 2 on 80 GiB GPUs, budget -0.5 GiB: 0.9 -> 0.95 gives each GPU 3.5 GiB of
    cache, about 22,900 tokens at 160 KiB a token, not the 131,072 the context asks. Before: the raise
    alone, then vLLM's refusal of the context (a second restart the shape already foretold); with the
    context unset, a 'lower' max_model_len from the memory model's own cache, which holds more than
    the model's context. Now: the raise with the context the grown cache holds, set or not; the raise
    alone where that context fits; without LowerMaxModelLen allowed, no raise at all."""
    log = WEIGHTS_72B.replace("135.43", "65.7").replace("-11.6", "-0.5")
    d = classify(Signals(log=log))
    inv = Inventory(gpu_total_gib=80.0, shape=config_shape("llama-3.1-70b"))
    held = 3.5 * 2**30 / (80 * 4 * 128 * 2 * 2)
    for s in (spec(maxModelLen=131072, tensorParallelSize=2), spec(tensorParallelSize=2)):
        r = plan_heal(s, d, inventory=inv)
        assert r.action == "RaiseGpuMemoryUtilization" and r.changes["gpu_memory_utilization"] == 0.95
        assert 0.95 * held <= r.changes["max_model_len"] <= held and r.changes["max_model_len"] % 16 == 0
    short = plan_heal(spec(maxModelLen=8192, tensorParallelSize=2), d, inventory=inv)
    assert short.changes == {"gpu_memory_utilization": 0.95}  # 8,192 tokens fit: the raise alone
    fixed = spec(maxModelLen=131072, tensorParallelSize=2, heal={"allowedActions": ["RaiseGpuMemoryUtilization"]})
    assert plan_heal(fixed, d, inventory=inv).changes.get("gpu_memory_utilization") is None


def test_a_lower_context_is_never_longer_than_the_default_one():
    """vLLM printed no figure (V0's refusal alone) and the memory model's cache holds far more than
    Llama 3.1 8B's 131,072 tokens. Before: max_model_len 'lowered' to over 800,000, past the model's
    context, which vLLM refuses at once. Now: no 'lower' context from the model's cache (vLLM said it
    has no block); the raise, with the context its 7 GiB hold at the shape's bytes a token."""
    log = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.\n"
    inv = Inventory(gpu_total_gib=139.8, shape=config_shape("llama-3.1-8b"))
    r = plan_heal(spec(), classify(Signals(log=log)), inventory=inv)
    assert r.action == "RaiseGpuMemoryUtilization" and r.changes["gpu_memory_utilization"] == 0.95
    held = 0.05 * 139.8 * 2**30 / (32 * 8 * 128 * 2 * 2)
    assert 0.95 * held <= r.changes["max_model_len"] <= held < 131072


def test_the_memory_model_vetoes_a_change_that_cannot_fit():
    """70B on one H100: no utilization or context makes the weights fit; none is tried."""
    shape = config_shape("llama-3.1-70b")
    log = (
        "ValueError: To serve at least one request with the model's max seq len (131072), (40.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.5 GiB). Based on the available memory, "
        "the estimated maximum model length is 1600."
    )
    r = plan_heal(
        spec(gpuMemoryUtilization=0.9, maxModelLen=131072),
        classify(Signals(log=log)),
        inventory=Inventory(gpu_total_gib=79.2, shape=shape),
    )
    assert r.action == GIVE_UP, r.summary()
    assert "memory model" in r.reason and "tensor parallelism" in r.reason
