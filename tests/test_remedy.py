from __future__ import annotations

from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.preflight import preflight
from vllm_autoheal.remedy import GIVE_UP, NO_CHANGE, Inventory, plan_heal

from samples import config_shape

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
LLAMA8 = config_shape("llama-3.1-8b")
KV_H200 = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (3.96 GiB). Based on the available memory, "
    "the estimated maximum model length is 32464. Try increasing"
)


def spec(**engine):
    return VLLMServiceSpec(model="meta-llama/Llama-3.1-8B", engine=engine)


def test_kv_raises_utilization_when_the_gpu_has_room_and_it_really_fits():
    s = spec(gpuMemoryUtilization=0.15, maxModelLen=131072)
    r = plan_heal(
        s, classify(Signals(log=KV_H200)), inventory=Inventory(gpu_total_gib=139.8, shape=LLAMA8, entrypoint="llm")
    )
    assert r.action == "RaiseGpuMemoryUtilization" and r.changes == {"gpu_memory_utilization": 0.25}
    healed = r.apply(s.engine)
    assert estimate(LLAMA8, healed, lookup("NVIDIA-H200"), entrypoint="llm").fits
    assert "fits" in r.expected


def test_kv_lowers_context_to_vllms_estimate_when_the_gpu_is_full():
    s = spec(gpuMemoryUtilization=0.15, maxModelLen=131072)
    r = plan_heal(s, classify(Signals(log=KV_H200)), inventory=Inventory(gpu_total_gib=139.8, gpu_free_gib=21.5))
    assert r.action == "LowerMaxModelLen" and r.changes == {"max_model_len": 32464}
    assert "32,464" in r.reason


def test_never_below_the_bound_and_never_repeats():
    s = VLLMServiceSpec(model="m", engine={"maxModelLen": 131072}, heal={"bounds": {"minMaxModelLen": 60000}})
    d = classify(Signals(log=KV_H200))
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=139.8, gpu_free_gib=21.5))
    # the estimate is below the bound; fp8 doubles the tokens instead, with the context that holds
    assert r.action == "Fp8KvCache" and r.changes == {"kv_cache_dtype": "fp8", "max_model_len": 64272}
    again = plan_heal(
        s,
        d,
        history=[{"cause": d.cause, "action": "Fp8KvCache"}],
        inventory=Inventory(gpu_total_gib=139.8, gpu_free_gib=21.5),
    )
    assert again.action == GIVE_UP and "Fp8KvCache" in again.reason


def test_allowed_actions_and_attempts():
    d = classify(Signals(log=KV_H200))
    only_eager = VLLMServiceSpec(model="m", heal={"allowedActions": ["EnforceEager"]})
    assert plan_heal(only_eager, d).action == GIVE_UP
    s = VLLMServiceSpec(model="m", heal={"maxAttempts": 2})
    hist = [{"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization"}, {"cause": "x", "action": "EnforceEager"}]
    r = plan_heal(s, d, history=hist)
    assert r.action == GIVE_UP and "maxAttempts" in r.reason


def test_not_oom_and_unknown_change_nothing():
    s = spec()
    assert plan_heal(s, Diagnosis(cause="not_oom", subtype="port_in_use")).action == NO_CHANGE
    assert plan_heal(s, Diagnosis(cause="unknown")).action == NO_CHANGE
    disabled = VLLMServiceSpec(model="m", heal={"enabled": False})
    assert plan_heal(disabled, classify(Signals(log=KV_H200))).action == NO_CHANGE


def test_free_memory_sizes_utilization_from_the_message():
    d = classify(
        Signals(
            log="ValueError: Free memory on device cuda:0 (1.53/22.05 GiB) on startup is less than "
            "desired GPU memory utilization (0.9, 19.84 GiB)."
        )
    )
    # 1.53 GiB free of 22: below the 0.3 floor -> it says so instead of starting a doomed engine
    assert plan_heal(spec(), d).action == GIVE_UP
    d2 = classify(
        Signals(
            log="ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired "
            "GPU memory utilization (0.95, 45.01 GiB)."
        )
    )
    r = plan_heal(spec(gpuMemoryUtilization=0.95), d2)
    assert r.action == "LowerGpuMemoryUtilization"
    assert r.changes["gpu_memory_utilization"] * 47.38 < 31.44 - 1.0


@pytest.mark.parametrize(
    "cause,first,numbers",
    [
        ("profiling_oom", "LowerMaxNumSeqs", {"dummy_requests": 1024}),
        ("cudagraph_capture_oom", "EnforceEager", {}),
        ("runtime_oom", "LowerGpuMemoryUtilization", {"tried_gib": 0.94, "gpu_total_gib": 79.14}),
        ("multi_gpu_oom", "LowerGpuMemoryUtilization", {}),
    ],
)
def test_first_remedy_per_cause(cause, first, numbers):
    r = plan_heal(spec(), Diagnosis(cause=cause, numbers=numbers))
    assert r.action == first, r
    if cause == "profiling_oom":
        assert r.changes == {"max_num_seqs": 512}
    if cause == "runtime_oom":
        assert r.changes == {"gpu_memory_utilization": 0.88}  # (0.94 + 0.5) / 79.14 -> 0.02 step


def test_host_ram_vpa_bump_within_bound():
    s = VLLMServiceSpec(
        model="m", resources={"limits": {"memory": "32Gi"}}, heal={"bounds": {"maxMemoryLimit": "40Gi"}}
    )
    r = plan_heal(s, Diagnosis(cause="host_ram_oom"), inventory=Inventory(memory_limit_bytes=32 * 2**30))
    assert r.action == "RaiseMemoryLimit" and r.changes == {"memory_limit": "39322Mi"}  # x1.2 of 32Gi
    capped = plan_heal(s, Diagnosis(cause="host_ram_oom"), inventory=Inventory(memory_limit_bytes=36 * 2**30))
    assert capped.changes == {"memory_limit": "40Gi"}
    kv = VLLMServiceSpec(model="m", engine={"kvCacheMemoryBytes": 4 * 2**30})
    cpu = Inventory(memory_limit_bytes=3 * 2**30, host_kv_cache=True)  # (vLLM's CPU backend: the cache is host RAM)
    r = plan_heal(kv, Diagnosis(cause="host_ram_oom"), inventory=cpu)
    assert r.action == "SetKvCacheMemoryBytes" and r.changes["kv_cache_memory_bytes"] == 2**30


def test_weights_quantized_fallback_then_tensor_parallel():
    s = VLLMServiceSpec(
        model="Qwen/Qwen2.5-32B",
        heal={
            "quantizedFallback": {"allowed": True, "model": "Qwen/Qwen2.5-32B-AWQ", "method": "awq_marlin"},
            "bounds": {"maxTensorParallelSize": 4},
            "allowedActions": ["Quantize", "IncreaseTensorParallel"],
        },
    )
    d = Diagnosis(cause="weights_load_oom")
    assert plan_heal(s, d).changes == {"model": "Qwen/Qwen2.5-32B-AWQ", "quantization": "awq_marlin"}
    assert plan_heal(s, d, history=[{"cause": "weights_load_oom", "action": "Quantize"}]).changes == {
        "tensor_parallel_size": 2
    }
    # Quantize is a HealAction like any other: leaving it out of allowedActions disallows it.
    no_quantize = s.model_copy(
        update={"heal": s.heal.model_copy(update={"allowed_actions": ["IncreaseTensorParallel"]})}
    )
    assert plan_heal(no_quantize, d).changes == {"tensor_parallel_size": 2}


def test_preflight_fix_starts_with_flags_that_fit():
    s = VLLMServiceSpec(model="m", engine={"maxModelLen": 131072}, preflight="Fix")
    l4 = lookup("NVIDIA-L4")
    r = preflight(s, l4, LLAMA8)
    assert r.fits and r.changed and r.engine.max_model_len < 131072
    assert estimate(LLAMA8, r.engine, l4).fits
    warn = preflight(s.model_copy(update={"preflight": "Warn"}), l4, LLAMA8)
    assert not warn.fits and not warn.changed and warn.engine.max_model_len == 131072


def test_preflight_fix_never_starts_a_quantization_flag_without_its_checkpoint():
    """Medium (a heal's flags that crash for certain). Pre-flight's fitted flags are the engine
    alone (status.effective): its Quantize step's model change was dropped and its `--quantization
    awq` kept, on the unquantized checkpoint the spec names, which vLLM refuses to load; and what
    "fits" was judged of flags no pod runs. Fix takes no step that changes more than the engine."""
    s = VLLMServiceSpec(
        model="org/big",
        preflight="Fix",
        heal={"quantizedFallback": {"allowed": True, "model": "org/big-awq", "method": "awq"}},
    )
    r = preflight(s, lookup("NVIDIA-H100-80GB-HBM3"), config_shape("llama-3.1-70b"))
    assert r.engine.quantization is None, r.engine
    assert all(set(step.changes) <= set(type(s.engine).model_fields) for step in r.steps), r.steps


# vLLM 0.32's CPU backend: the KV space asked for is more than the node has free.
CPU_KV_AUTO = (
    "ValueError: Available memory on node 0 (12.0/125.72 GiB) on kv cache allocation is less than requested "
    "memory for kv (98.5/115.66 GiB). Reduce CPU memory used by other processes."
)


def test_the_cpu_kv_space_heal_sets_the_kv_size_and_never_shrinks_the_workers_budget():
    """The free figure there is what is left after the worker's own memory (115.66 - 98.5 GiB): sized to
    it, a utilization would not hold the worker. The KV size is set to fit what is free instead."""
    s = VLLMServiceSpec(model="m", engine={"gpu_memory_utilization": 0.92})
    r = plan_heal(s, classify(Signals(log=CPU_KV_AUTO)))
    assert r.action == "SetKvCacheMemoryBytes" and r.changes == {"kv_cache_memory_bytes": 9 * 2**30}, r


def test_the_cpu_kv_space_is_left_alone_when_vllm_cpu_kvcache_space_would_override_it():
    s = VLLMServiceSpec(
        model="m",
        engine={"gpu_memory_utilization": 0.92},
        env=[{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "40"}],
    )
    r = plan_heal(s, classify(Signals(log=CPU_KV_AUTO)))
    assert r.action in (NO_CHANGE, GIVE_UP) and not r.changes, r
