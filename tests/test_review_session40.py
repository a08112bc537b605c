"""A hostile review of the host memory an offload pins (offload_pinned.py, remedy_gate's cap, host_steps.py):
each test asserts the right behaviour and is a strict xfail while the code does otherwise."""

from __future__ import annotations

from vllm_autoheal.api import EngineArgs, HealBounds, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.offload_pinned import HOST_BASE_GIB, HOST_PER_RANK_GIB, layer_blocks, pinned_gib
from vllm_autoheal.remedy import Inventory, plan_heal

from samples import config_shape

GIB = 2**30
QWEN32, LLAMA70 = config_shape("qwen2.5-32b"), config_shape("llama-3.1-70b")


def _host_oom(limit_gib: int, bounds: dict, gpu: str = "NVIDIA-H100-80GB-HBM3", allowed=None):
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 4096, "cpuOffloadGb": 24.0},
        resources={"limits": {"memory": f"{limit_gib}Gi"}},
        heal={"allowedActions": allowed or ["RaiseMemoryLimit", "LowerCpuOffload"], "bounds": bounds},
    )
    g = lookup(gpu)
    inv = Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name, shape=QWEN32, memory_limit_bytes=limit_gib * GIB)
    return spec, plan_heal(spec, Diagnosis(cause="host_ram_oom"), inventory=inv)


def test_an_abbreviated_cpu_offload_params_is_another_layout_too():
    # vLLM's FlexibleArgumentParser keeps argparse's allow_abbrev: --cpu-offload-p is --cpu-offload-params
    # (--cpu-offload-gb is the only other flag it starts like, and "p" tells them apart)
    for spelling in (["--cpu-offload-p", "qkv_proj"], ["--cpu-offload-par=qkv_proj"], ["--cpu_offload_pa", "qkv_proj"]):
        engine = EngineArgs(cpu_offload_gb=12.0, extra_args=spelling)
        # 12 GiB of qkv_proj blocks (160 MiB each, pinned as 256 MiB): 77 of them, 19.25 GiB pinned
        assert pinned_gib(LLAMA70, engine) >= 77 * 256 / 1024, spelling
        assert layer_blocks(LLAMA70, engine) is None, spelling


def test_a_bound_below_the_offload_does_not_stand_for_what_the_limit_holds():
    spec, r = _host_oom(44, {"maxCpuOffloadGb": 22})
    assert r.action == "LowerCpuOffload", r.summary()
    healed = r.apply(spec.engine)
    assert pinned_gib(QWEN32, healed) + HOST_BASE_GIB + HOST_PER_RANK_GIB <= 44 * 0.9, r.summary()
    assert r.changes == {"cpu_offload_gb": 19.0}, r.summary()


def test_a_bound_above_the_offload_still_cuts_to_what_the_limit_holds():
    spec, r = _host_oom(44, {"maxCpuOffloadGb": 30})
    assert r.action == "LowerCpuOffload" and r.changes == {"cpu_offload_gb": 19.0}, r.summary()


def test_a_cut_of_the_offload_the_memory_model_says_cannot_load_is_not_tried():
    spec, r = _host_oom(24, {}, gpu="RTX-A6000")
    healed = r.apply(spec.engine) if r.action == "LowerCpuOffload" else None
    if healed is not None:  # (only a cut whose weights the GPU holds)
        assert estimate(QWEN32, healed, lookup("RTX-A6000")).fits, r.summary()
    assert r.action != "LowerCpuOffload", r.summary()


def test_a_raise_the_bound_cannot_hold_is_explained_in_the_give_up():
    # 24 GiB of Qwen2.5-32B pins 45.1 GiB: with vLLM's 3.2 GiB, 48.3 GiB; a tenth spare, 53.6 GiB > 52Gi
    spec, r = _host_oom(44, {"maxMemoryLimit": "46Gi"}, allowed=["RaiseMemoryLimit"])
    assert r.action == "GiveUp", r.summary()
    assert "RaiseMemoryLimit" in r.reason and "46Gi" in r.reason, r.reason
    # (where the bound holds the 48.3 GiB, though not the tenth spare, the raise goes to the bound)
    spec, r = _host_oom(44, {"maxMemoryLimit": "52Gi"}, allowed=["RaiseMemoryLimit"])
    assert r.action == "RaiseMemoryLimit" and r.changes == {"memory_limit": "52Gi"}, r.summary()


def test_serve_is_told_its_own_option_for_the_offload_bound():
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 4096}, heal={"allowedActions": ["CpuOffload"]})
    g = lookup("RTX-A6000")
    inv = Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name, shape=QWEN32, memory_limit_bytes=None)
    r = plan_heal(spec, Diagnosis(cause="weights_load_oom"), inventory=inv)
    assert r.action == "GiveUp" and "no memory limit says how much host memory" in r.reason, r.summary()
    assert "--max-cpu-offload-gb" in r.reason, r.reason


def test_the_crds_description_of_the_offload_bound_is_the_rule_that_runs():
    description = HealBounds.model_fields["max_cpu_offload_gb"].description or ""
    assert "half the container's memory limit" not in description, description
    assert "twice the figure" not in description, description
