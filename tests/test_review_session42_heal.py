"""Session 42's hostile review of the host-memory heals (host_ram_oom: remedy/host_steps.py's larger memory limit and
smaller --cpu-offload-gb, sized by offload_pinned.py), checked by hand against what the container must hold: the
weights --cpu-offload-gb moves (vLLM's offloader moves parameters until their bytes reach the figure, so at least the
figure moves, and torch pins each block rounded up to a power of two, so at least what moves is pinned), the CPU KV
offloading buffer --kv-offloading-size asks for (pinned host memory, allocated at start), and what vLLM's own
processes hold besides (HOST_BASE_GIB + HOST_PER_RANK_GIB a rank). Each test asserts the right behaviour and is a
strict xfail while the code does otherwise."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.offload_pinned import HOST_BASE_GIB, HOST_PER_RANK_GIB, layer_blocks, pinned_gib
from vllm_autoheal.quantity import parse_quantity
from vllm_autoheal.remedy import Inventory, plan_heal

from samples import config_shape

GIB = 2**30
BESIDE = HOST_BASE_GIB + HOST_PER_RANK_GIB  # vLLM's processes on one rank: 3.2 GiB


def _host_oom(limit_gib: float, engine: dict, bound: str | None = None, shape: str = "qwen2.5-32b"):
    """A container OOM-killed at `limit_gib` on one H100, the model's config known, the limit and offload heals
    allowed (a larger limit only up to `bound`)."""
    spec = VLLMServiceSpec(
        model="m",
        engine=engine,
        resources={"limits": {"memory": f"{limit_gib}Gi"}},
        heal={
            "allowedActions": ["RaiseMemoryLimit", "LowerCpuOffload", "SetKvCacheMemoryBytes"],
            "bounds": {"maxMemoryLimit": bound} if bound else {},
        },
    )
    g = lookup("NVIDIA-H100-80GB-HBM3")
    inv = Inventory(
        gpu_total_gib=g.memory_gib, gpu_name=g.name, shape=config_shape(shape), memory_limit_bytes=int(limit_gib * GIB)
    )
    return spec, plan_heal(spec, Diagnosis(cause="host_ram_oom"), inventory=inv)


def test_a_cut_of_an_offload_not_laid_out_never_pins_more_than_the_whole_limit():
    """Qwen3-30B-A3B (128 experts: layer_blocks lays none out) with --cpu-offload-gb 50, OOM-killed at 24Gi, no
    maxMemoryLimit (no raise). The offloader moves parameters until their bytes reach the figure (the model's 56.9
    GiB of weights are more than it), and each moved byte is pinned (rounded up, never down): a cut to 25 GiB pins at
    least 25 GiB, beside vLLM's 3.2 GiB: 28.2 GiB > 24 GiB, killed again. The limit holds, at the very best (pinned =
    moved, the tenth of margin host_steps keeps elsewhere), 24 x 0.9 - 3.2 = 18.4 GiB of offload; by offload_pinned's
    own rounding bound (x2, what most_offload_gib gives a layout it cannot read) 9.2. The cut must be at most that,
    or not made."""
    spec, r = _host_oom(24, {"maxModelLen": 4096, "cpuOffloadGb": 50.0}, shape="qwen3-30b-a3b")
    assert layer_blocks(config_shape("qwen3-30b-a3b"), spec.engine) is None  # (the rounding's bound case)
    if r.action == "LowerCpuOffload":
        new = r.changes["cpu_offload_gb"]
        assert new + BESIDE <= 24 * 0.9, r.summary()


def test_a_raise_for_an_offload_not_laid_out_holds_at_least_the_offload_itself():
    """Qwen3-30B-A3B with --cpu-offload-gb 40 on one GPU, OOM-killed at 32Gi, maxMemoryLimit 256Gi. At least 40 GiB
    moves (the figure; the model's weights are 56.9 GiB) and all of it is pinned, beside vLLM's 3.2 GiB: the
    container needs at least 43.2 GiB (48 GiB with the tenth of margin raise_memory_limit keeps for a laid-out
    offload; 92.4 by the rounding's bound). VPA's bump gives 32 x 1.2 = 38.4 GiB: killed again, then 46.1, then
    55.3 (the bump repeats): three restarts where the figure sized one."""
    spec, r = _host_oom(32, {"maxModelLen": 4096, "cpuOffloadGb": 40.0}, bound="256Gi", shape="qwen3-30b-a3b")
    if r.action == "RaiseMemoryLimit":
        new = parse_quantity(r.changes["memory_limit"]) / GIB
        assert new >= 40.0 + BESIDE, r.summary()


def test_a_raise_holds_the_kv_offloading_buffer_the_flags_ask_for():
    """--kv-offloading-size 64 (GiB of pinned host memory for the native CPU KV offload, all of one engine's TP
    ranks together; offload_pinned.besides_offload_gib counts it so), one rank, OOM-killed at 32Gi, maxMemoryLimit
    256Gi. The container needs 64 + 2.6 + 0.6 = 67.2 GiB at the least (74.7 with the tenth of margin). VPA's bumps
    go 38.4, 46.1, 55.3, 66.4, 79.6 GiB: four more kills before the fifth start, where the flag sized the limit in
    one."""
    engine = {"maxModelLen": 4096, "extraArgs": ["--kv-offloading-size", "64"]}
    spec, r = _host_oom(32, engine, bound="256Gi")
    assert r.action == "RaiseMemoryLimit", r.summary()
    new = parse_quantity(r.changes["memory_limit"]) / GIB
    assert new >= 64 + BESIDE, r.summary()


def test_a_bump_capped_at_the_bound_is_not_planned_where_the_bound_cannot_hold_the_offload():
    """Qwen2.5-32B (laid out: 64 layers of 0.91 GiB, each pinning 1.69) with --cpu-offload-gb 21, OOM-killed at
    40Gi, maxMemoryLimit 42Gi. offload_pinned: 21 GiB pins 39.0 GiB on the rank; with vLLM's 3.2 GiB the container
    holds 42.2 GiB, 46.9 with the tenth of margin. VPA's bump (48 GiB) is above that need, so raise_memory_limit
    takes the bump and caps it at the bound: 42 GiB < 42.2 GiB, a certain second kill (then no raise is left: 42 x
    1.2 is capped to 42 again, and the cut comes a restart late). The need is above the bound even with no margin:
    the one change that fits is the cut to what 40Gi holds (LowerCpuOffload), in this restart."""
    engine = {"maxModelLen": 4096, "cpuOffloadGb": 21.0}
    spec, r = _host_oom(40, engine, bound="42Gi")
    pinned = pinned_gib(config_shape("qwen2.5-32b"), spec.engine)
    assert pinned == pytest.approx(39.0, abs=0.05)
    if r.action == "RaiseMemoryLimit":
        new = parse_quantity(r.changes["memory_limit"]) / GIB
        assert new >= pinned + BESIDE, r.summary()


@pytest.mark.parametrize("bound", [None, "40Gi"])
def test_no_offload_cut_is_planned_where_the_kv_offload_buffer_alone_overflows_the_limit(bound):
    """Qwen2.5-32B with --cpu-offload-gb 8 (pins 15.2 GiB) and --kv-offloading-size 40, OOM-killed at 32Gi. The
    buffer is pinned at start whatever the weight offload: 40 + 2.6 + 0.6 = 43.2 GiB > 32 GiB with cpu_offload_gb
    0. Without a bound (or with maxMemoryLimit 40Gi, below the 64.9 GiB the whole needs) no allowed change fits:
    LowerCpuOffload to 0 restarts into the same kill."""
    engine = {"maxModelLen": 4096, "cpuOffloadGb": 8.0, "extraArgs": ["--kv-offloading-size", "40"]}
    spec, r = _host_oom(32, engine, bound=bound)
    if r.action == "LowerCpuOffload":
        after = r.apply(spec.engine)
        held = pinned_gib(config_shape("qwen2.5-32b"), after) + 40 + BESIDE
        assert held <= 32, (held, r.summary())
    assert r.action != "LowerCpuOffload", r.summary()
