"""What the launcher's GPU probe saw before vLLM started reaches the operator's own reading of the
log: the real kopf operator against kmock. The launcher reads the log it kept with that snapshot;
when its reading says nothing (its copy of the output lost the failure), the operator reads the
container's previous log with the same snapshot, so the two readings agree."""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.launcher import termination_message

from operator_harness import NS, Emulator, wait_for
from samples import NO_GPU, PLAIN_SPEC

pytestmark = pytest.mark.kmock(cls=Emulator)
SPEC = PLAIN_SPEC
# An OOM at start-up that no frame or milestone places (the pod was never Ready).
BARE_OOM = (
    "(EngineCore_DP0 pid=1) ERROR 11-30 03:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 22.05 GiB of which 100.00 MiB is free.\n"
)
NEVER_READY = "2026-11-30T02:49:00Z"


def launcher_message(other_gib: float | None) -> str:
    """What the launcher writes when the output it kept shows nothing: its probe's snapshot, with
    another process holding `other_gib` of GPU 0 (none when None)."""
    gpu_start = {"gpus": [[0, "NVIDIA L4", 22.05, 22.05 - (other_gib or 0)]]}
    if other_gib:
        gpu_start["other_processes"] = [[4242, 0, other_gib]]
    said = classify(Signals(log="", exit_code=1)).to_dict()
    assert said["cause"] == "unknown"
    return termination_message(said, 1, gpu_start, None)


@pytest.mark.parametrize("other_gib", [12.0, None], ids=["another-process", "none"])
async def test_the_launchers_gpu_snapshot_places_the_oom_the_operator_reads(cluster, kmock, other_gib):
    name = "snap-other" if other_gib else "snap-none"
    await cluster.create_vsvc(name, SPEC)
    await cluster.settled(name)
    kmock[f"get /api/v1/namespaces/{NS}/pods/{name}-a/log"] << BARE_OOM.encode()
    await cluster.crash_pod(name, f"{name}-a", message=launcher_message(other_gib), ready=NEVER_READY)
    if other_gib is None:  # nothing else held the GPU: which start-up step failed is not told, no change
        await cluster.not_healed(name)
        assert (await cluster.vsvc(name))["spec"]["engine"] == SPEC["engine"]
        return
    obj = await cluster.heal_recorded(name)
    heal = obj["status"]["heals"][-1]
    assert heal["cause"] == "gpu_util_exceeds_free", heal
    assert obj["spec"]["engine"]["gpuMemoryUtilization"] < 0.9


# vLLM's KV refusal at utilization 0.5 of an L4: 2 GiB more would hold the context.
KV_SHORT = (
    "(EngineCore_DP0 pid=1) ERROR 11-30 03:00:00 [core.py:1] ValueError: To serve at least one request with the "
    "model's max seq len (131072), (4.00 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(2.00 GiB). Based on the available memory, the estimated maximum model length is 65536. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.\n"
)


@pytest.mark.parametrize("other_gib", [10.0, None], ids=["another-process", "none"])
async def test_a_raise_asks_no_more_than_the_launcher_saw_free(cluster, other_gib):
    """The planner knew no free figure in the operator (the bench's "no probe"): a raise took the GPU to be
    the pod's alone, though the launcher's probe had seen another process hold 10 of the L4's 22 GiB:
    0.5 -> 0.61 asks 13.5 GiB of the 12 free, a certain free-memory refusal and a second restart. Now the
    probe's least free figure sizes it: no raise fits, so the context is cut to what the cache holds."""
    name = "free-other" if other_gib else "free-none"
    spec = {**SPEC, "engine": {"gpuMemoryUtilization": 0.5, "maxModelLen": 131072}}
    await cluster.create_vsvc(name, spec)
    await cluster.settled(name)
    gpu_start = {"gpus": [[0, "NVIDIA L4", 22.05, 22.05 - (other_gib or 0)]]}
    if other_gib:
        gpu_start["other_processes"] = [[4242, 0, other_gib]]
    said = classify(Signals(log=KV_SHORT, exit_code=1)).to_dict()
    assert said["cause"] == "kv_cache_insufficient"
    await cluster.crash_pod(name, f"{name}-a", message=termination_message(said, 1, gpu_start, None), ready=NEVER_READY)
    obj = await cluster.heal_recorded(name)
    engine = obj["spec"]["engine"]
    if other_gib:
        assert obj["status"]["heals"][-1]["action"] == "LowerMaxModelLen", obj["status"]["heals"][-1]
        assert engine["gpuMemoryUtilization"] == 0.5 and engine["maxModelLen"] == 65536, engine
    else:
        assert obj["status"]["heals"][-1]["action"] == "RaiseGpuMemoryUtilization", obj["status"]["heals"][-1]
        assert engine["gpuMemoryUtilization"] > 0.5 and engine["maxModelLen"] == 131072, engine


async def test_a_revert_of_an_unschedulable_split_asks_no_more_than_the_launcher_saw_free(cluster):
    """High (a review). The first heal was sized by the launcher's free figure, but a revert of it planned
    again without it: with the split unschedulable, the revert raised 0.5 -> 0.61 beside another process
    holding 10 of the L4's 22 GiB, a certain free-memory refusal. The heal record keeps the figure now
    (status.heals[].gpuFreeGib), and the revert finds no raise that fits: back to the flags that ran."""

    name = "free-revert"
    spec = {
        **SPEC,
        "engine": {"gpuMemoryUtilization": 0.5, "maxModelLen": 131072},
        "resources": {**SPEC["resources"], "gpus": 1},
        "heal": {
            "backoffSeconds": 0,
            "unschedulableSeconds": 0,
            "allowedActions": ["IncreaseTensorParallel", "RaiseGpuMemoryUtilization"],
            "bounds": {"maxTensorParallelSize": 2},
        },
    }
    await cluster.create_vsvc(name, spec)
    await cluster.settled(name)
    gpu_start = {"gpus": [[0, "NVIDIA L4", 22.05, 12.05]], "other_processes": [[4242, 0, 10.0]]}
    said = classify(Signals(log=KV_SHORT, exit_code=1)).to_dict()
    await cluster.crash_pod(name, f"{name}-a", message=termination_message(said, 1, gpu_start, None), ready=NEVER_READY)
    obj = await cluster.heal_recorded(name)
    first = obj["status"]["heals"][-1]
    assert first["action"] == "IncreaseTensorParallel" and first["gpuFreeGib"] == 12.05, first

    def split_rolled_out() -> bool:  # (a pod of the heal's template: one made before it was applied is not)
        dep = cluster.deployment_now(name)
        limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] if dep else {}
        return limits.get("nvidia.com/gpu") == 2

    await wait_for(split_rolled_out, what="the heal's rollout")
    await cluster.pending_pod(name, f"{name}-b", NO_GPU)
    obj = await wait_for(
        lambda: (v := cluster.vsvc_now(name))["status"]["heals"][-1]["action"] != "IncreaseTensorParallel" and v,
        what="the revert",
    )
    revert = obj["status"]["heals"][-1]
    assert revert["action"] == "RevertUnschedulable", revert
    assert obj["spec"]["engine"]["gpuMemoryUtilization"] == 0.5, obj["spec"]["engine"]
