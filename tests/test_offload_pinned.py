"""The host memory --cpu-offload-gb pins, and the heals an offload may take in a container's limit.

Measured on an H100 80GB (tests/gpu/host_memory.sh, session 40; tests/fixtures/gpu/host-memory/v1*): real vLLM
0.25 on its V1 runner (--enable-prompt-embeds, which the V2 runner does not support), Llama-3.1-8B's random bf16
weights. Predicted before the run, from vLLM's offloader and torch's pinned allocator (each block rounded up to a
power of two): 11.0 and 7.0 GiB left on the GPU, and about 4.5 and 9.3 GiB pinned for 4 and 8 GiB (counting the
embedding as moved first). Measured: "Total CPU offloaded parameters: 4.06" and 8.02, 10.94 and 6.99 GiB loaded,
and shared host memory (RssShmem, which the container is charged) up by 4.69 and 9.25 GiB; anonymous memory
unchanged (2.47-2.49 GiB). The offloader wraps the decoder layers alone (models/utils.py make_layers), each
layer's parameters in order until the figure is reached: counted so, 4.06 and 8.02 GiB move and 4.69 and 9.25
GiB are pinned, the figures measured. Then Qwen2.5-7B (MODEL=qwen2.5-7b), predicted from this count before its
run: 8 GiB moves 8.12 and pins 15.19 GiB (1.9x); measured 8.12 and 15.19.

The gate had taken every offload to cost twice its figure against the whole limit (limit / 2 / ranks): for
Llama-3.1-8B's shapes it costs 1.15x, for Qwen2.5's 1.87x, so a Qwen2.5-32B heal offloaded 24 GiB in a 48Gi
container: 45.1 GiB pinned beside vLLM's own 2.5 GiB, a certain OOMKill."""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_autoheal import cgroups
from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, GpuSnapshot
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.offload_pinned import (
    HOST_BASE_GIB,
    HOST_PER_RANK_GIB,
    ROUNDING_BOUND,
    layer_blocks,
    most_offload_gib,
    offload_host_gib,
    offloaded_gib,
    pinned_gib,
)
from vllm_autoheal.preflight import preflight
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.serve_sizing import inventory
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

RUNS = Path(__file__).parent / "fixtures" / "gpu" / "host-memory"
GIB = 2**30
LLAMA8, QWEN7, QWEN32 = config_shape("llama-3.1-8b"), config_shape("qwen2.5-7b"), config_shape("qwen2.5-32b")


def _figure(text: str, pattern: str) -> float:
    return float(re.search(pattern, text)[1])  # type: ignore[index]


@pytest.mark.parametrize(
    "name, base, shape, figure",
    [
        ("v1offload4", "v1base", LLAMA8, 4.0),
        ("v1offload8", "v1base", LLAMA8, 8.0),
        # (Qwen2.5-7B: its MLP's blocks of 259 and 130 MiB pin 512 and 256; predicted 15.19 GiB pinned, 8.12 moved)
        ("qwen2.5-7b-v1offload8", "qwen2.5-7b-v1base", QWEN7, 8.0),
    ],
)
def test_the_pinned_memory_is_what_vllm_025_pinned(name, base, shape, figure):
    log, mem = (RUNS / f"{name}.log").read_text(), (RUNS / f"{name}.mem").read_text()
    base_mem = (RUNS / f"{base}.mem").read_text()
    assert f"'cpu_offload_gb': {figure}" in log and "using the V1 model runner instead" in log  # (the flag ran)
    shmem = r"peak RssShmem sum ([\d.]+) GiB"
    pinned = _figure(mem, shmem) - _figure(base_mem, shmem)
    engine = EngineArgs(
        max_model_len=4096, enforce_eager=True, cpu_offload_gb=figure, extra_args=["--enable-prompt-embeds"]
    )
    assert pinned_gib(shape, engine) == pytest.approx(pinned, abs=0.02)
    assert pinned_gib(shape, engine) > figure * 1.1  # (what a figure-for-figure count would miss)
    assert offloaded_gib(shape, engine) == pytest.approx(
        _figure(log, r"Total CPU offloaded parameters: ([\d.]+)"), abs=0.01
    )
    # the anonymous memory did not move: the offload is shared memory alone
    anon = r"peak RssAnon sum ([\d.]+) GiB"
    assert _figure(mem, anon) == pytest.approx(_figure(base_mem, anon), abs=0.05)
    # and the weights left on the GPU are the memory model's (on the V1 runner, which installs the offloader)
    loaded = _figure(log, r"Model loading took ([\d.]+) GiB")
    assert estimate(shape, engine, lookup("NVIDIA-H100-80GB-HBM3"), release=parse_version("0.25.0")).weights_gib == (
        pytest.approx(loaded, abs=0.1)
    )


def test_a_layer_pins_its_blocks_rounded_up_to_powers_of_two():
    blocks = layer_blocks(LLAMA8, EngineArgs())
    assert blocks is not None and sum(blocks) / 2**20 == pytest.approx(416, abs=0.1)  # (qkv 48, o 32, 224, 112 MiB)
    assert pinned_gib(LLAMA8, EngineArgs(), 416 / 1024 * 32) == pytest.approx(480 / 1024 * 32, abs=0.01)
    assert pinned_gib(QWEN7, EngineArgs(), 8.0) / 8.0 == pytest.approx(1.9, abs=0.02)  # (gate_up 259 MiB -> 512)
    # split: each rank's slices (Llama-3.1-8B's halves are powers of two but for the MLP's)
    assert pinned_gib(LLAMA8, EngineArgs(tensor_parallel_size=2), 4.0) < pinned_gib(LLAMA8, EngineArgs(), 4.0) + 0.3
    # a figure above the rank's layers pins them all (the offloader runs out of layers), no more
    assert pinned_gib(LLAMA8, EngineArgs(), 100.0) == pytest.approx(32 * 480 / 1024, abs=0.01)
    assert pinned_gib(LLAMA8, EngineArgs(pipeline_parallel_size=2), 100.0) == pytest.approx(16 * 480 / 1024, abs=0.01)


@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "deepseek-v2-lite", "nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_layers_this_does_not_lay_out_cost_the_roundings_bound(shape):
    s = config_shape(shape)
    assert layer_blocks(s, EngineArgs()) is None
    assert pinned_gib(s, EngineArgs(), 5.0) == 5.0 * ROUNDING_BOUND
    assert most_offload_gib(s, EngineArgs(), 10.0) == 10.0 / ROUNDING_BOUND


@pytest.mark.parametrize(
    "engine",
    [
        EngineArgs(quantization="awq"),
        EngineArgs(extra_args=["--offload-backend", "prefetch"]),
        EngineArgs(extra_args=["--offload_group_size=4"]),
        EngineArgs(extra_args=["--cpu-offload-params", "mlp"]),
    ],
)
def test_another_offloader_or_layout_costs_the_roundings_bound(engine):
    assert layer_blocks(LLAMA8, engine) is None and pinned_gib(LLAMA8, engine, 3.0) == 6.0


def test_the_most_offload_is_the_largest_figure_that_pins_within_the_room():
    for shape in (LLAMA8, QWEN7, QWEN32):
        for room in (0.3, 2.0, 7.5, 11.2, 40.0):
            most = most_offload_gib(shape, EngineArgs(), room)
            if math.isinf(most):  # (every layer fits)
                assert pinned_gib(shape, EngineArgs(), 1e6) <= room
                continue
            assert pinned_gib(shape, EngineArgs(), most) <= room + 1e-9
            assert pinned_gib(shape, EngineArgs(), most + 0.01) > room  # (the next block does not fit)


def test_hostile_figures_and_shapes_cost_nothing_and_never_raise():
    huge = replace(LLAMA8, layers=10**15)
    t0 = time.perf_counter()
    assert pinned_gib(huge, EngineArgs(), 1e12) > 1e12
    assert most_offload_gib(huge, EngineArgs(), 1e12) < 1e12
    assert time.perf_counter() - t0 < 1.0  # (counted, not iterated over layers)
    assert pinned_gib(LLAMA8, EngineArgs(), math.inf) == math.inf
    assert pinned_gib(LLAMA8, EngineArgs(), -3.0) == pinned_gib(LLAMA8, EngineArgs(), 0.0) == 0.0
    assert most_offload_gib(LLAMA8, EngineArgs(), -1.0) == 0.0
    assert layer_blocks(replace(LLAMA8, heads=0), EngineArgs()) is None
    assert (
        offload_host_gib(GIB, EngineArgs(tensor_parallel_size=8)) == 0.0
    )  # (a limit below vLLM's own processes leaves nothing)


def _offload_heal(shape_name: str, gpu: str, limit_gib: int):
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 4096},
        resources={"limits": {"memory": f"{limit_gib}Gi"}},
        heal={"allowedActions": ["CpuOffload"]},
    )
    g, shape = lookup(gpu), config_shape(shape_name)
    inv = Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name, shape=shape, memory_limit_bytes=limit_gib * GIB)
    return spec, shape, plan_heal(spec, Diagnosis(cause="weights_load_oom"), inventory=inv)


def test_an_offload_that_pins_more_than_the_limit_holds_is_refused_saying_so():
    spec, shape, r = _offload_heal("qwen2.5-32b", "RTX-A6000", 48)
    assert r.action == "GiveUp", r.summary()
    assert "cpu_offload_gb 24 on each of 1 GPU(s) pins about 45.1 GiB each" in r.reason, r.reason
    spec, shape, r = _offload_heal("qwen2.5-32b", "RTX-A6000", 64)
    assert r.action == "CpuOffload" and r.changes == {"cpu_offload_gb": 24.0}, r.summary()
    assert "it pins about 45.1 GiB there" in r.reason


@pytest.mark.parametrize("limit_gib", [24, 32, 48, 64, 96, 160])
@pytest.mark.parametrize(
    "shape_name, gpu",
    [
        ("qwen2.5-32b", "RTX-A6000"),
        ("qwen2.5-32b", "L4"),
        ("llama-3.1-70b", "NVIDIA-H100-80GB-HBM3"),
        ("qwen3-32b", "L4"),
    ],
)
def test_no_offload_heal_pins_more_than_the_limit_holds(shape_name, gpu, limit_gib):
    spec, shape, r = _offload_heal(shape_name, gpu, limit_gib)
    if r.action != "CpuOffload":
        return
    healed = r.apply(spec.engine)
    host = pinned_gib(shape, healed) + HOST_BASE_GIB + HOST_PER_RANK_GIB
    assert host <= limit_gib * 0.9, (r.summary(), host)


def _host_oom(limit_gib: int, bound: str | None, shape: str = "qwen2.5-32b", offload: float = 24.0):
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 4096, "cpuOffloadGb": offload},
        resources={"limits": {"memory": f"{limit_gib}Gi"}},
        heal={
            "allowedActions": ["RaiseMemoryLimit", "LowerCpuOffload"],
            "bounds": {"maxMemoryLimit": bound} if bound else {},
        },
    )
    g = lookup("NVIDIA-H100-80GB-HBM3")
    inv = Inventory(
        gpu_total_gib=g.memory_gib, gpu_name=g.name, shape=config_shape(shape), memory_limit_bytes=limit_gib * GIB
    )
    return spec, plan_heal(spec, Diagnosis(cause="host_ram_oom"), inventory=inv)


def test_an_oomkill_of_an_offload_raises_the_limit_to_what_it_pins_in_one_restart():
    """24 GiB of Qwen2.5-32B offloaded pins 45.1 GiB: in a 44Gi container VPA's x1.2 (52.8 GiB) would be
    killed again; the raise goes to what the offload and vLLM's processes need, a tenth spare (53.6 GiB)."""
    spec, r = _host_oom(44, "64Gi")
    assert r.action == "RaiseMemoryLimit", r.summary()
    limit = r.changes["memory_limit"]
    assert limit.endswith("Mi") and int(limit[:-2]) / 1024 == pytest.approx((45.06 + 3.2) / 0.9, abs=0.1)
    assert "what cpu_offload_gb 24 pins on each rank (45.1 GiB)" in r.reason
    # where VPA's bump is more, VPA's bump (the offload is not all that the container holds)
    spec, r = _host_oom(48, "64Gi")
    assert r.action == "RaiseMemoryLimit" and "VPA-style" in r.reason, r.summary()


@pytest.mark.parametrize("bound", ["46Gi", None])  # (46Gi: below the 48.3 GiB it needs)
def test_where_the_bound_cannot_hold_the_offload_it_is_cut_to_what_the_limit_holds(bound):
    spec, r = _host_oom(44, bound)
    assert r.action == "LowerCpuOffload" and r.changes == {"cpu_offload_gb": 19.0}, r.summary()
    healed = r.apply(spec.engine)
    assert pinned_gib(config_shape("qwen2.5-32b"), healed) + HOST_BASE_GIB + HOST_PER_RANK_GIB <= 44 * 0.9
    assert "it pinned about 45.1 GiB a GPU; the 44Gi limit holds 19" in r.reason


def test_an_offload_not_laid_out_is_still_halved():
    spec, r = _host_oom(44, None, shape="qwen3-30b-a3b", offload=20.0)  # (an MoE: the rounding's bound alone)
    assert r.action == "LowerCpuOffload" and r.changes == {"cpu_offload_gb": 10.0}, r.summary()


def test_serve_on_a_machine_without_a_limit_sizes_the_offload_by_what_is_available(tmp_path, monkeypatch):
    """`serve` on a machine of its own (no cgroup limit) had no memory figure, so no offload heal was ever
    made there without --max-cpu-offload-gb; the kernel's MemAvailable is what vLLM may pin."""
    (tmp_path / "memory.max").write_text("max")
    (tmp_path / "proc-cgroup").write_text("0::/\n")
    (tmp_path / "meminfo").write_text(f"MemTotal: {128 * 2**20} kB\nMemAvailable: {100 * 2**20} kB\n")
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "PROC_CGROUP", tmp_path / "proc-cgroup")
    monkeypatch.setattr(cgroups, "MEMINFO", tmp_path / "meminfo")
    inv = inventory(GpuSnapshot(), GpuSnapshot(), EngineArgs(), QWEN32, Diagnosis(cause="weights_load_oom"), {})
    assert inv.memory_limit_bytes == 100 * GIB
    g = lookup("RTX-A6000")
    inv.gpu_total_gib, inv.gpu_name = g.memory_gib, g.name
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 4096}, heal={"allowedActions": ["CpuOffload"]})
    r = plan_heal(spec, Diagnosis(cause="weights_load_oom"), inventory=inv)
    assert r.action == "CpuOffload" and r.changes == {"cpu_offload_gb": 24.0}, r.summary()


@pytest.mark.parametrize("memory, offload", [("64Gi", 24.0), ("48Gi", None), (None, None)])
def test_preflight_fix_offloads_what_the_specs_memory_limit_holds(memory, offload):
    """Pre-flight's Fix had no memory limit to size an offload by, so it never offloaded; it now has the spec's."""
    spec = VLLMServiceSpec(
        model="m",
        preflight="Fix",
        engine={"maxModelLen": 4096},
        resources={"limits": {"memory": memory}} if memory else {},
        heal={"allowedActions": ["CpuOffload"]},
    )
    result = preflight(spec, lookup("RTX-A6000"), QWEN32)
    assert result.fits is (offload is not None) and result.engine.cpu_offload_gb == offload, result.reasons
    if offload is None:  # (48Gi: 24 GiB would pin 45.1; none: nothing says what it may pin)
        assert "CpuOffload refused: cpu_offload_gb 24 on each of 1 GPU(s)" in result.reasons[-1]
