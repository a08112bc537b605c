"""A second hostile review of the offload heals (session 40's fixes and what came after them: the veto of a cut
whatever the cause, the cap sized from the limit or serve's MemAvailable, the raise to the bound): each test
asserts the right behaviour and is a strict xfail while the code does otherwise."""

from __future__ import annotations

from pathlib import Path

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.offload_pinned import HOST_BASE_GIB, HOST_PER_RANK_GIB, pinned_gib
from vllm_autoheal.remedy import Inventory, plan_heal

from samples import config_shape

GIB = 2**30
QWEN32 = config_shape("qwen2.5-32b")
README = Path(__file__).resolve().parents[1] / "README.md"


def _plan(cause: str, gpu: str, limit_gib: int, engine: dict, allowed: list[str] | None = None, bounds=None):
    heal = {**({"allowedActions": allowed} if allowed else {}), **({"bounds": bounds} if bounds else {})}
    spec = VLLMServiceSpec(model="m", engine=engine, resources={"limits": {"memory": f"{limit_gib}Gi"}}, heal=heal)
    g = lookup(gpu)
    inv = Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name, shape=QWEN32, memory_limit_bytes=limit_gib * GIB)
    return spec, g, plan_heal(spec, Diagnosis(cause=cause), inventory=inv)


def test_a_host_oom_cut_that_leaves_no_kv_cache_is_not_tried():
    # Qwen2.5-32B on an L40S with 24 GiB offloaded in 44Gi: the memory model says it starts (37 GiB of
    # weights on the GPU, ~2.2 GiB of cache); the cut to what 44Gi holds (19) puts 42.07 GiB of weights in a
    # 39.95 GiB budget: they load, and no block of KV cache is left
    engine = {"maxModelLen": 4096, "cpuOffloadGb": 24.0}
    spec, g, r = _plan("host_ram_oom", "NVIDIA-L40S", 44, engine, ["RaiseMemoryLimit", "LowerCpuOffload"])
    assert estimate(QWEN32, spec.engine, g).fits  # (the flags that ran start, by the memory model)
    if r.action == "LowerCpuOffload":
        after = estimate(QWEN32, r.apply(spec.engine), g)
        assert after.fits, (r.summary(), after.failure, after.reasons)
    assert r.action != "LowerCpuOffload", r.summary()


def test_serve_shares_the_host_memory_among_its_data_parallel_engines():
    # Qwen2.5-32B on 48 GB GPUs, 80 GiB available: one engine may offload 24 GiB (45.1 pinned); two data-parallel
    # engines pin 90.1 GiB beside their processes in 80: a certain kill by the kernel
    alone = _plan("weights_load_oom", "RTX-A6000", 80, {"maxModelLen": 4096})[2]
    assert alone.action == "CpuOffload" and alone.changes == {"cpu_offload_gb": 24.0}, alone.summary()
    for extra in (["--data-parallel-size", "2"], ["-dp", "2"]):
        spec, _, r = _plan("weights_load_oom", "RTX-A6000", 80, {"maxModelLen": 4096, "extraArgs": extra})
        if r.action == "CpuOffload":
            pinned = pinned_gib(QWEN32, r.apply(spec.engine))
            # (two engines' pinned memory and processes, a tenth of the 80 GiB spare)
            assert 2 * pinned + HOST_BASE_GIB + 2 * HOST_PER_RANK_GIB <= 80 * 0.9, (extra, r.summary())


def test_an_offload_is_sized_beside_the_kv_offload_buffer_the_flags_ask_for():
    # Qwen2.5-32B on a 48 GB GPU in 64Gi with a 32 GiB CPU KV offload buffer: the 24 GiB weight offload pins
    # 45.1 GiB; with the buffer and vLLM's 3.2 GiB, 80.3 GiB in a 64Gi container
    engine = {"maxModelLen": 4096, "extraArgs": ["--kv-offloading-size", "32"]}
    spec, _, r = _plan("weights_load_oom", "RTX-A6000", 64, engine)
    if r.action == "CpuOffload":
        held = pinned_gib(QWEN32, r.apply(spec.engine)) + 32 + HOST_BASE_GIB + HOST_PER_RANK_GIB
        assert held <= 64 * 0.9, (held, r.summary())
    assert r.action != "CpuOffload", r.summary()


def test_the_readme_says_the_raise_goes_to_the_bound_where_it_holds_the_offload_without_the_spare_tenth():
    engine = {"maxModelLen": 4096, "cpuOffloadGb": 24.0}
    bounds = {"maxMemoryLimit": "52Gi"}
    r = _plan("host_ram_oom", "NVIDIA-H100-80GB-HBM3", 44, engine, ["RaiseMemoryLimit"], bounds)[2]
    assert r.action == "RaiseMemoryLimit" and r.changes == {"memory_limit": "52Gi"}, r.summary()
    row = next(line for line in README.read_text().splitlines() if line.startswith("| `host_ram_oom` |"))
    assert "to the bound" in row or "less than a tenth" in row, row
