"""Heals that stay inside their bounds, finish what they start, keep GPUs equal to TP x PP, and a
phase that follows reality: the real kopf operator against kmock, asserting objects."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.kube.client import MERGE
from vllm_autoheal.kube.later import Later
from vllm_autoheal.launcher import termination_message

from operator_harness import (
    NS,
    Cluster,
    Emulator,
    flag,
    running_operator,
    setup_emulator,
    vllm_container,
    vsvc_path,
    wait_for,
)
from samples import (
    BAD_MESSAGES,
    H200_TERMINATION,
    KV_LOG,
    KV_TERMINATION,
    NO_GPU,
    NOT_MEMORY,
    PLAIN_SPEC,
    RUNTIME_OOM,
    TP_HEAL,
    WEIGHTS_OOM,
)

pytestmark = pytest.mark.kmock(cls=Emulator)
SPEC = PLAIN_SPEC


def just_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def crash_deferrals(monkeypatch) -> threading.Event:
    """Set when a crash's heal is put off (Later.run under a crash's key)."""
    deferred, run = threading.Event(), Later.run

    def spied(self, key, delay, fn):
        if key.startswith("crash/"):
            deferred.set()
        return run(self, key, delay, fn)

    monkeypatch.setattr(Later, "run", spied)
    return deferred


async def fitted_service(cluster: Cluster, name: str, mode: str) -> dict:
    """A service whose pre-flight (Fix) lowered maxModelLen at start; its status.effective."""
    config = (Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json").read_text()
    spec = {
        **SPEC,
        "preflight": "Fix",
        "engine": {"maxModelLen": 131072},
        "heal": {"backoffSeconds": 0, "mode": mode},
    }
    await cluster.create_vsvc(name, spec, annotations={"vllm.autoheal.dev/model-config": config})
    fitted = status(await cluster.settled(name))["effective"]
    assert fitted["maxModelLen"] < 131072
    return fitted


def status(obj: dict) -> dict:
    return obj.get("status") or {}


def condition(obj: dict, type_: str) -> dict | None:
    return next((c for c in status(obj).get("conditions", []) if c["type"] == type_), None)


def gpus(dep: dict) -> int:
    return vllm_container(dep)["resources"]["limits"]["nvidia.com/gpu"]


# --- floors from need: the H200 case heals in one restart with default settings ---------------


async def test_h200_other_process_heals_in_one_restart_with_default_settings(cluster):
    """38.69 of 139.8 GiB free: 0.26 under the default image, whose CUDA graphs are reserved inside the
    budget (0.25, leaving them room beside it, under vLLM 0.25: test_gpu_heal_runs.py)."""
    spec = {**SPEC, "resources": {"gpuProduct": "NVIDIA-H200"}}
    obj = await cluster.first_heal("h200", spec, "h200-a", message=H200_TERMINATION)
    assert obj["spec"]["engine"]["gpuMemoryUtilization"] == 0.26
    assert status(obj)["heals"][-1]["action"] == "LowerGpuMemoryUtilization"
    await wait_for(lambda: flag(cluster.deployment_now("h200"), "--gpu-memory-utilization") == "0.26", what="rollout")


# --- attempts: a counter, across non-memory crashes and operator restarts --------------------


async def test_max_attempts_holds_across_non_memory_crashes_and_restarts(kmock):
    setup_emulator(kmock)
    spec = {**SPEC, "heal": {"backoffSeconds": 0, "maxAttempts": 2}}
    c = Cluster(kmock)
    async with running_operator():
        await c.create_vsvc("cap", spec)
        await c.settled("cap")
        await c.crash_pod("cap", "cap-0", message=RUNTIME_OOM)
        await wait_for(lambda: status(c.vsvc_now("cap")).get("attempts") == 1, what="first heal")
        await wait_for(lambda: flag(c.deployment_now("cap"), "--gpu-memory-utilization") == "0.85", what="rollout")
        for i in range(22):  # more than the 20 heal records kept: they push the heal out of status.heals
            await c.crash_pod("cap", f"cap-n{i}", message=NOT_MEMORY)
        await wait_for(lambda: len(status(c.vsvc_now("cap")).get("observedCrashes", [])) == 23, what="22 crashes")
        obj = await c.vsvc("cap")
        assert all(h["action"] == "NoChange" for h in status(obj)["heals"])  # the heal record is gone...
        assert status(obj)["attempts"] == 1  # ...its count is not
    async with running_operator():  # a restarted operator counts on
        await c.crash_pod("cap", "cap-1", message=RUNTIME_OOM)
        await wait_for(lambda: status(c.vsvc_now("cap")).get("attempts") == 2, what="second heal")
        await wait_for(lambda: flag(c.deployment_now("cap"), "--max-num-seqs") == "128", what="rollout")
        healed = (await c.vsvc("cap"))["spec"]["engine"]
        await c.crash_pod("cap", "cap-2", message=RUNTIME_OOM)
        obj = await wait_for(
            lambda: (condition(v := c.vsvc_now("cap"), "HealExhausted") or {}).get("status") == "True" and v,
            what="HealExhausted",
        )
        assert status(obj)["attempts"] == 2 and status(obj)["healCount"] == 2 and obj["spec"]["engine"] == healed
        assert "maxAttempts" in condition(obj, "HealExhausted")["message"]


# --- tensor parallelism consistent everywhere -----------------------------------------------


@pytest.mark.parametrize("mode, resources", [("PatchSpec", {"gpus": 1}), ("StatusOverrides", {})])
async def test_tensor_parallel_heal_asks_for_tp_x_pp_gpus(cluster, mode, resources):
    name = f"tp-{mode.lower()}"
    spec = {**SPEC, "resources": {**SPEC["resources"], **resources}, "heal": {**TP_HEAL, "mode": mode}}
    obj = await cluster.first_heal(name, spec, f"{name}-a", message=WEIGHTS_OOM)
    dep = await wait_for(
        lambda: flag(d := cluster.deployment_now(name), "--tensor-parallel-size") == "2" and d, what="rollout"
    )
    assert (
        gpus(dep) == 2
        and status(
            await wait_for(lambda: status(v := cluster.vsvc_now(name)).get("gpus") == 2 and v, what="status.gpus")
        )["gpus"]
        == 2
    )
    if mode == "PatchSpec":
        assert obj["spec"]["engine"]["tensorParallelSize"] == 2 and obj["spec"]["resources"]["gpus"] == 2
    else:
        assert "tensorParallelSize" not in obj["spec"]["engine"] and "gpus" not in obj["spec"]["resources"]


# --- heals that cannot be scheduled ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["PatchSpec", "StatusOverrides"])
async def test_an_unschedulable_heal_goes_back_to_the_flags_that_scheduled(cluster, mode):
    name = f"sched-{mode.lower()}"
    spec = {
        **SPEC,
        "resources": {**SPEC["resources"], "gpus": 1} if mode == "PatchSpec" else SPEC["resources"],
        "heal": {**TP_HEAL, "mode": mode, "unschedulableSeconds": 0},
    }
    await cluster.first_heal(name, spec, f"{name}-a", message=WEIGHTS_OOM)
    await wait_for(lambda: gpus(cluster.deployment_now(name)) == 2, what="the heal's rollout")
    await cluster.pending_pod(name, f"{name}-b", NO_GPU)
    obj = await wait_for(
        lambda: (condition(v := cluster.vsvc_now(name), "HealBlocked") or {}).get("status") == "True" and v,
        what="HealBlocked",
    )
    assert NO_GPU in condition(obj, "HealBlocked")["message"]
    events = await wait_for(
        lambda: [
            e
            for e in cluster.events_now("HealBlocked")
            if e["type"] == "Warning" and e["involvedObject"]["name"] == name
        ],
        what="Warning event",
    )
    assert NO_GPU in events[0]["message"] and "IncreaseTensorParallel" in events[0]["message"]
    dep = await wait_for(lambda: gpus(d := cluster.deployment_now(name)) == 1 and d, what="back to one GPU")
    assert flag(dep, "--tensor-parallel-size") == "1"
    obj = await cluster.vsvc(name)
    assert status(obj)["heals"][-1]["action"] == "RevertUnschedulable"
    if mode == "PatchSpec":
        assert obj["spec"]["engine"]["tensorParallelSize"] == 1 and obj["spec"]["resources"]["gpus"] == 1


async def test_a_heal_is_blocked_only_once_its_pods_waited_the_configured_time(cluster):
    """The pod became Unschedulable just now: the operator looks again when unschedulableSeconds
    have passed (no further pod event comes), then reports and reverts."""
    spec = {**SPEC, "heal": {**TP_HEAL, "mode": "StatusOverrides", "unschedulableSeconds": 2}}
    await cluster.first_heal("later", spec, "later-a", message=WEIGHTS_OOM)
    await wait_for(lambda: gpus(cluster.deployment_now("later")) == 2, what="the heal's rollout")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await cluster.pending_pod("later", "later-b", NO_GPU, since=now)
    obj = await wait_for(
        lambda: (condition(v := cluster.vsvc_now("later"), "HealBlocked") or {}).get("status") == "True" and v,
        what="HealBlocked after the wait",
    )
    assert NO_GPU in condition(obj, "HealBlocked")["message"]
    assert await wait_for(
        lambda: [e for e in cluster.events_now("HealBlocked") if e["involvedObject"]["name"] == "later"],
        what="Warning event",
    )
    await wait_for(lambda: gpus(cluster.deployment_now("later")) == 1, what="back to one GPU")


async def test_wait_policy_only_reports_a_blocked_heal(cluster):
    spec = {
        **SPEC,
        "heal": {**TP_HEAL, "mode": "StatusOverrides", "unschedulableSeconds": 0, "onUnschedulable": "Wait"},
    }
    await cluster.first_heal("patient", spec, "patient-a", message=WEIGHTS_OOM)
    await wait_for(lambda: gpus(cluster.deployment_now("patient")) == 2, what="the heal's rollout")
    await cluster.pending_pod("patient", "patient-b", NO_GPU)
    await wait_for(
        lambda: (condition(cluster.vsvc_now("patient"), "HealBlocked") or {}).get("status") == "True",
        what="HealBlocked",
    )
    await asyncio.sleep(1)
    assert (
        gpus(await cluster.deployment("patient")) == 2 and status(await cluster.vsvc("patient"))["phase"] == "Healing"
    )


# --- the termination message is validated ---------------------------------------------------


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
async def test_an_invalid_termination_message_is_ignored_and_the_previous_log_read(cluster, case):
    message = BAD_MESSAGES[case]
    assert message != KV_TERMINATION
    name = f"msg-{case}"
    cluster.kmock[f"get /api/v1/namespaces/{NS}/pods/{name}-a/log"] << KV_LOG.encode()
    obj = await cluster.first_heal(name, SPEC, f"{name}-a", message=message)
    assert obj["spec"]["engine"]["maxModelLen"] == 524160  # vLLM's own figure, from its log
    record = status(obj)["heals"][-1]
    assert "termination message ignored" in record["reason"] and record["numbers"]["estimated_max_model_len"] == 524160
    assert await wait_for(
        lambda: [e for e in cluster.events_now("TerminationMessageIgnored") if e["involvedObject"]["name"] == name],
        what="event",
    )


# --- heals that finish or never start -------------------------------------------------------


async def test_a_failing_spec_patch_leaves_the_heal_recorded_and_it_is_finished(cluster):
    await cluster.create_vsvc("sp", SPEC)
    await cluster.settled("sp")
    fault = cluster.kmock.fail("PATCH", "/vllmservices/sp", 500, times=5)  # more than one round of retries
    await cluster.crash_pod("sp", "sp-a", message=KV_TERMINATION)
    obj = await wait_for(
        lambda: status(v := cluster.vsvc_now("sp")).get("inFlight", {}).get("applied") and v, what="the heal finished"
    )
    assert fault.hits == 5 and obj["spec"]["engine"]["maxModelLen"] == 524160
    assert status(obj)["attempts"] == 1 and status(obj)["healCount"] == 1 and len(status(obj)["heals"]) == 1
    assert "maxModelLen" not in status(obj)["baseline"]  # the completed heal is not taken for a person's edit
    await wait_for(lambda: flag(cluster.deployment_now("sp"), "--max-model-len") == "524160", what="rollout")


@pytest.mark.parametrize(
    "fault", [{"status": 409}, {"status": 500, "times": 2}, {"delay": 7.0}], ids=["conflict", "server-error", "timeout"]
)
async def test_a_failing_status_write_records_the_heal_exactly_once(cluster, fault):
    name = f"st-{next(iter(fault))}"
    await cluster.create_vsvc(name, SPEC)
    await cluster.settled(name)
    injected = cluster.kmock.fail("PATCH", f"/vllmservices/{name}/status", **fault)
    await cluster.crash_pod(name, f"{name}-a", message=KV_TERMINATION)
    # The heal's spec patch, not its last status write: kmock takes a stale write (a real server
    # answers 409), so the write the client gave up on may land over that one.
    await wait_for(lambda: cluster.vsvc_now(name)["spec"]["engine"].get("maxModelLen"), timeout=30, what="the heal")
    await wait_for(lambda: injected.pending == 0, what="the write the client gave up on, landed")
    obj = await cluster.vsvc(name)
    assert injected.hits >= 1 and obj["spec"]["engine"]["maxModelLen"] == 524160
    assert status(obj)["healCount"] == 1 and status(obj)["attempts"] == 1 and len(status(obj)["heals"]) == 1


async def test_a_failed_first_write_leaves_no_trace_until_it_succeeds(cluster):
    await cluster.create_vsvc("nt", SPEC)
    before = status(await cluster.settled("nt"))
    fault = cluster.kmock.fail("PATCH", "/vllmservices/nt/status", 500, times=1000)
    await cluster.crash_pod("nt", "nt-a", message=KV_TERMINATION)
    await wait_for(lambda: fault.hits >= 6, what="two rounds of failed tries")
    obj = await cluster.vsvc("nt")
    assert status(obj) == before and "maxModelLen" not in obj["spec"]["engine"]  # nothing of the heal
    fault.times = 0
    obj = await wait_for(lambda: status(v := cluster.vsvc_now("nt")).get("healCount") == 1 and v, what="heal")
    assert len(status(obj)["heals"]) == 1


async def test_an_operator_killed_between_the_writes_finishes_the_heal_when_it_starts(kmock):
    setup_emulator(kmock)
    c = Cluster(kmock)
    async with running_operator():
        await c.create_vsvc("killed", SPEC)
        await c.settled("killed")
        fault = kmock.fail("PATCH", "/vllmservices/killed", 500, times=10**6)  # the spec write never lands
        await c.crash_pod("killed", "killed-a", message=KV_TERMINATION)
        half = await wait_for(lambda: status(v := c.vsvc_now("killed")).get("inFlight") and v, what="recorded")
        await asyncio.sleep(0.5)
    assert status(half)["inFlight"]["applied"] is False and "maxModelLen" not in half["spec"]["engine"]
    fault.times = 0
    async with running_operator():  # a new process: reconcile on resume finishes it
        obj = await wait_for(
            lambda: status(v := c.vsvc_now("killed")).get("inFlight", {}).get("applied") and v,
            what="finished after the restart",
        )
        await wait_for(lambda: flag(c.deployment_now("killed"), "--max-model-len") == "524160", what="rollout")
    assert obj["spec"]["engine"]["maxModelLen"] == 524160
    assert status(obj)["attempts"] == 1 and status(obj)["healCount"] == 1
    assert status(obj)["baseline"] == status(half)["baseline"]  # not mistaken for a person's edit


@pytest.mark.parametrize("mode", ["PatchSpec", "StatusOverrides"])
async def test_a_heal_recorded_during_the_first_reconcile_is_kept(cluster, monkeypatch, mode):
    """A crash recorded while the first reconcile is between its apply (the Deployment exists, so
    its pods may crash) and its status write. Held here at that point; a loaded machine holds it
    there too, for less time."""

    from vllm_autoheal.kube import reconcile

    gate, real = threading.Event(), reconcile.update_status

    def held(*args, **kwargs):
        gate.wait(20)
        return real(*args, **kwargs)

    monkeypatch.setattr(reconcile, "update_status", held)
    name = f"first-{mode.lower()}"
    await cluster.create_vsvc(name, {**SPEC, "heal": {**SPEC["heal"], "mode": mode}})
    await wait_for(lambda: cluster.deployment_now(name), what="deployment")
    await cluster.crash_pod(name, f"{name}-a", message=KV_TERMINATION)
    await wait_for(lambda: status(cluster.vsvc_now(name)).get("healCount") == 1, what="the heal recorded")
    gate.set()
    obj = await cluster.settled(name)
    assert status(obj)["attempts"] == 1 and status(obj)["tried"] == ["kv_cache_insufficient/LowerMaxModelLen"]
    assert status(obj)["effective"]["maxModelLen"] == 524160


async def test_a_heal_applied_while_a_reconcile_renders_is_applied_again(cluster, monkeypatch):
    """StatusOverrides: a crash healed (its Deployment applied) while a reconcile that read the
    object before the heal is still rendering; that reconcile's apply of the old flags lands last.
    Nothing else re-applies in this mode (no spec change), so the reconcile must."""

    from vllm_autoheal.kube import heal, reconcile, resources

    from operator_harness import TEST_CONFIG

    gate, real = threading.Event(), reconcile.lock

    def held(ns: str, name: str):
        gate.wait(20)
        return real(ns, name)

    monkeypatch.setattr(reconcile, "lock", held)
    name = "stale-apply"
    await cluster.create_vsvc(name, {**SPEC, "heal": {**SPEC["heal"], "mode": "StatusOverrides"}})
    vsvc = await wait_for(lambda: cluster.vsvc_now(name), what="the object")
    rendered = resources.render(heal.parse(vsvc), TEST_CONFIG.operator_image)
    template = next(m for m in rendered if m["kind"] == "Deployment")
    await cluster.crash_pod(name, f"{name}-a", message=KV_TERMINATION, template_from=template)

    def healed() -> bool:
        dep = cluster.deployment_now(name)
        return dep is not None and flag(dep, "--max-model-len") == "524160"

    await wait_for(healed, what="the heal applied")
    gate.set()
    await cluster.settled(name)
    await cluster.quiet(name)
    assert flag(await cluster.deployment(name), "--max-model-len") == "524160"
    obj = await cluster.vsvc(name)
    assert status(obj)["attempts"] == 1 and status(obj)["effective"]["maxModelLen"] == 524160


async def test_a_blocked_heal_reverted_while_a_reconcile_renders_is_applied_again(cluster, monkeypatch):
    """StatusOverrides: a reconcile (here a restart's resume; an edit of the spec does the same) read the
    object with the TP=2 heal; the heal's pods cannot be scheduled and it is reverted
    to TP=1 with nothing left to try. That revert moves no counter (healCount stays), yet it changes
    status.effective and the Deployment: the reconcile must neither write back its TP=2 copy nor
    leave its apply of TP=2 last."""

    from vllm_autoheal.kube import reconcile

    name = "revert-race"
    spec = {**SPEC, "heal": {**TP_HEAL, "mode": "StatusOverrides", "unschedulableSeconds": 0}}
    await cluster.first_heal(name, spec, f"{name}-a", message=WEIGHTS_OOM)
    await wait_for(lambda: gpus(cluster.deployment_now(name)) == 2, what="the heal's rollout")
    await cluster.settled(name)
    gate, entered, real = threading.Event(), threading.Event(), reconcile.lock

    def held(ns: str, name: str):
        entered.set()
        gate.wait(20)
        return real(ns, name)

    monkeypatch.setattr(reconcile, "lock", held)
    resumed = asyncio.create_task(cluster.resume(name))
    await wait_for(entered.is_set, what="a reconcile holding the object it read")
    await cluster.pending_pod(name, f"{name}-b", NO_GPU)
    await wait_for(lambda: gpus(cluster.deployment_now(name)) == 1, what="the revert applied")
    gate.set()
    await resumed
    await cluster.settled(name)
    await cluster.quiet(name)
    assert gpus(await cluster.deployment(name)) == 1
    obj = await cluster.vsvc(name)
    assert status(obj)["heals"][-1]["action"] == "RevertUnschedulable"
    assert status(obj)["effective"]["tensorParallelSize"] == 1 and status(obj)["gpus"] == 1


async def test_preflight_fix_does_not_undo_a_status_overrides_heal_on_a_later_reconcile(cluster):
    """Fix mode fits the flags at start; a heal in StatusOverrides mode then changes status.effective.
    A later reconcile (a resume after an operator restart here; an edit of the spec too)
    must not put pre-flight's flags, the ones that crashed, back."""
    name = "fix-overrides"
    fitted = await fitted_service(cluster, name, "StatusOverrides")
    await cluster.crash_pod(name, f"{name}-a", message=RUNTIME_OOM)
    healed = status(await cluster.heal_recorded(name))["effective"]
    # (pre-flight fitted the context to the cache at 0.9: the cut comes with the context 0.85 holds)
    assert healed == {**fitted, "gpuMemoryUtilization": 0.85, "maxModelLen": healed["maxModelLen"]}
    assert healed["maxModelLen"] < fitted["maxModelLen"]
    await wait_for(lambda: flag(cluster.deployment_now(name), "--gpu-memory-utilization") == "0.85", what="rollout")
    await cluster.resume(name)
    await cluster.settled(name)
    await cluster.quiet(name)
    assert status(await cluster.vsvc(name))["effective"] == healed
    assert flag(await cluster.deployment(name), "--gpu-memory-utilization") == "0.85"


@pytest.mark.parametrize("mode", ["PatchSpec", "StatusOverrides"])
async def test_a_heal_of_a_persons_new_flags_during_the_edits_reconcile_is_kept(cluster, monkeypatch, mode):
    """A crash of a person's new flags while the reconcile of that edit is between its apply and
    its status write (held here). Planned then, the heal would start from the old baseline and
    that write would undo it; the crash is looked at again once the new baseline is written."""

    from vllm_autoheal.kube import reconcile

    deferred = crash_deferrals(monkeypatch)

    name = f"edit-race-{mode.lower()}"
    await cluster.create_vsvc(name, {**SPEC, "heal": {"backoffSeconds": 0, "mode": mode}})
    await cluster.settled(name)
    gate, real = threading.Event(), reconcile.update_status

    def held(*args, **kwargs):
        gate.wait(20)
        return real(*args, **kwargs)

    monkeypatch.setattr(reconcile, "update_status", held)
    await cluster.call("PATCH", vsvc_path(name), {"spec": {"engine": {"gpuMemoryUtilization": 0.8}}}, MERGE)
    await wait_for(lambda: flag(cluster.deployment_now(name), "--gpu-memory-utilization") == "0.8", what="the edit")
    await cluster.crash_pod(
        name, f"{name}-a", message=RUNTIME_OOM, finished_at=just_now()
    )  # a crash long past is waited for by no edit
    await wait_for(deferred.is_set, what="the crash deferred until the edit's baseline is written")
    assert status(await cluster.vsvc(name)).get("healCount", 0) == 0
    gate.set()
    await cluster.settled(name)
    await cluster.quiet(name)
    obj = await cluster.vsvc(name)
    assert status(obj)["baseline"]["gpuMemoryUtilization"] == 0.8
    assert status(obj)["attempts"] == 1 and status(obj)["tried"] == ["runtime_oom/LowerGpuMemoryUtilization"]
    assert flag(await cluster.deployment(name), "--gpu-memory-utilization") == "0.75"


# --- the phase follows reality --------------------------------------------------------------


async def test_phase_follows_the_pods_and_exhausted_stays_until_a_person_edits(cluster):
    spec = {**SPEC, "heal": {"backoffSeconds": 0, "maxAttempts": 1}}
    await cluster.first_heal("ph", spec, "ph-a", message=KV_TERMINATION)
    assert status(await cluster.vsvc("ph"))["phase"] == "Healing"
    await wait_for(lambda: flag(cluster.deployment_now("ph"), "--max-model-len") == "524160", what="rollout")
    await cluster.deployment_available("ph")
    obj = await wait_for(lambda: status(v := cluster.vsvc_now("ph"))["phase"] == "Running" and v, what="Running")
    assert condition(obj, "Healing")["status"] == "False" and "inFlight" not in status(obj)
    await cluster.crash_pod("ph", "ph-b", message=KV_TERMINATION)  # the healed pods crash: attempts spent
    await cluster.deployment_available("ph", 0)
    obj = await wait_for(lambda: status(v := cluster.vsvc_now("ph"))["phase"] == "Failed" and v, what="Failed")
    assert condition(obj, "HealExhausted")["status"] == "True"
    await cluster.deployment_available("ph")  # ...and then serve again
    obj = await wait_for(lambda: status(v := cluster.vsvc_now("ph"))["phase"] == "Running" and v, what="Running")
    assert condition(obj, "HealExhausted")["status"] == "True"  # the condition stays
    await cluster.call(
        "PATCH",
        f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{NS}/vllmservices/ph",
        {"spec": {"engine": {"maxModelLen": 4096}}},
        "application/merge-patch+json",
    )
    obj = await wait_for(
        lambda: condition(v := cluster.vsvc_now("ph"), "HealExhausted") is None and v, what="a person's edit"
    )
    assert status(obj)["attempts"] == 0 and status(obj)["baseline"]["maxModelLen"] == 4096


# --- issue 16: the launcher's real message from 72B bf16 on one H200 (tests/gpu/heal_runs.sh) ------

REAL_72B_ON_ONE_H200 = (
    Path(__file__).parent / "fixtures" / "gpu" / "heal-runs" / "termination-72b-tp1.json"
).read_text()


async def test_the_real_72b_crash_on_one_h200_heals_to_two_gpus(cluster):
    spec = {
        **SPEC,
        "model": "Qwen/Qwen2.5-72B-Instruct",
        "resources": {"gpuProduct": "NVIDIA-H200", "limits": {"memory": "64Gi"}},
        "heal": TP_HEAL,
    }
    obj = await cluster.first_heal("qwen72b", spec, "qwen72b-a", message=REAL_72B_ON_ONE_H200)
    dep = await wait_for(
        lambda: flag(d := cluster.deployment_now("qwen72b"), "--tensor-parallel-size") == "2" and d, what="rollout"
    )
    assert gpus(dep) == 2
    heal = status(obj)["heals"][-1]
    assert heal["cause"] == "weights_load_oom" and heal["action"] == "IncreaseTensorParallel"
    assert heal["gpus"] == 1  # the split the crash printed its per-GPU weights under
    assert obj["spec"]["engine"]["tensorParallelSize"] == 2


# The OOM line alone, no frame or milestone: where it failed only the pod's history tells.
BARE_OOM = (
    "(EngineCore_DP0 pid=1) ERROR 11-30 03:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 22.05 GiB of which 100.00 MiB is free.\n"
)


# One allocation larger than the whole GPU: before the pod was ever ready, the profiling batch.
HUGE_OOM = BARE_OOM.replace("512.00 MiB", "64.00 GiB")


@pytest.mark.parametrize(
    "ready, log, cause",
    [
        ("2026-11-30T03:00:01Z", BARE_OOM, "runtime_oom"),  # Ready flipped to False at the crash: it had served
        ("2026-11-30T02:49:00Z", BARE_OOM, None),  # never ready: which start-up step, the log does not tell
        ("2026-11-30T02:49:00Z", HUGE_OOM, "profiling_oom"),  # never ready, and larger than the GPU
        (None, BARE_OOM, None),  # the pod does not tell: no memory change
    ],
    ids=["served", "never-ready", "never-ready-huge", "not-told"],
)
async def test_the_pods_readiness_places_an_oom_the_log_does_not(cluster, kmock, request, ready, log, cause):
    name = f"bare-{request.node.callspec.id}"
    await cluster.create_vsvc(name, SPEC)
    await cluster.settled(name)
    kmock[f"get /api/v1/namespaces/{NS}/pods/{name}-a/log"] << log.encode()
    await cluster.crash_pod(name, f"{name}-a", message=log, ready=ready)
    if cause is None:
        crash = await cluster.not_healed(name)
        obj = await cluster.vsvc(name)
        assert (obj.get("status") or {}).get("healCount", 0) == 0, crash
        return
    if log is HUGE_OOM:  # 64 GiB of a 22 GiB GPU: no halving brings it within, so no change, and why
        mine = lambda reason: [e for e in cluster.events_now(reason) if e["involvedObject"]["name"] == name]  # noqa: E731
        exhausted = await wait_for(lambda: mine("HealExhausted"), what="HealExhausted event")
        assert "asked for 64 GiB of a 22.05 GiB GPU" in exhausted[-1]["message"]
        detected = await wait_for(lambda: mine("OOMDetected"), what="OOMDetected event")
        assert detected[-1]["message"].startswith(cause)
        assert ((await cluster.vsvc(name)).get("status") or {}).get("healCount", 0) == 0
        return
    obj = await cluster.heal_recorded(name)
    assert status(obj)["heals"][-1]["cause"] == cause


# The launcher in the pod does not know the model's size, so a bare OOM is `unknown` there; the
# operator does (spec.modelConfig), reads the previous log and sees the weights were still loading.
LLAMA_70B = json.loads((Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-70b.json").read_text())
LOADING_OOM = (
    "(EngineCore_DP0 pid=1) ERROR 11-30 03:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 448.00 MiB. GPU 0 has a total capacity of 139.81 GiB of which 300.00 MiB is free. "
    "Including non-PyTorch memory, this process has 139.50 GiB memory in use. Of the allocated memory "
    "138.90 GiB is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch but unallocated.\n"
)


@pytest.mark.parametrize("sized", [True, False], ids=["model-known", "model-unknown"])
async def test_the_operator_places_an_oom_by_the_models_weights_that_the_launcher_cannot(cluster, kmock, sized):
    name = f"load-{'sized' if sized else 'unsized'}"
    spec = {
        **SPEC,
        "model": "meta-llama/Llama-3.1-70B-Instruct",
        "engine": {"dtype": "float32", "maxModelLen": 8192},  # 262 GiB of weights: more than one H200 holds
        "resources": {"gpuProduct": "NVIDIA-H200", "limits": {"memory": "64Gi"}},
        "heal": {**TP_HEAL, "bounds": {"maxTensorParallelSize": 4}},
        **({"modelConfig": {"inline": LLAMA_70B}} if sized else {}),
    }
    launcher_said = termination_message(classify(Signals(log=LOADING_OOM, exit_code=1)).to_dict(), 1, None, None)
    assert json.loads(launcher_said)["diagnosis"]["cause"] == "unknown"
    await cluster.create_vsvc(name, spec)
    await cluster.settled(name)
    kmock[f"get /api/v1/namespaces/{NS}/pods/{name}-a/log"] << LOADING_OOM.encode()
    await cluster.crash_pod(name, f"{name}-a", message=launcher_said, ready="2026-11-30T02:49:00Z")
    if not sized:  # no model config at hand (the Hub is off here): the OOM stays unplaced, nothing changes
        await cluster.not_healed(name)
        assert (await cluster.vsvc(name))["spec"]["engine"] == spec["engine"]
        return
    obj = await cluster.heal_recorded(name)
    heal = status(obj)["heals"][-1]
    assert heal["cause"] == "weights_load_oom" and heal["action"] == "IncreaseTensorParallel", heal
    assert obj["spec"]["engine"]["tensorParallelSize"] >= 2


async def test_preflight_fix_in_patch_spec_is_no_edit_and_defers_no_crash(cluster, monkeypatch):
    """PatchSpec with pre-flight Fix: status.effective holds the fitted flags, which differ from
    spec.engine and carry no HEALED_ENGINE annotation. That is no person's edit: a crash is healed
    at once, not deferred a minute as if an edit's baseline were pending (a review of 3c95a73)."""

    deferred = crash_deferrals(monkeypatch)
    name = "fix-patchspec"
    await fitted_service(cluster, name, "PatchSpec")
    await cluster.crash_pod(
        name, f"{name}-a", message=RUNTIME_OOM, finished_at=just_now()
    )  # recent: waited for, were it an edit
    await wait_for(lambda: status(cluster.vsvc_now(name)).get("healCount") == 1, what="the heal recorded")
    assert not deferred.is_set(), "a crash with no edit was deferred as if a person had edited spec.engine"
