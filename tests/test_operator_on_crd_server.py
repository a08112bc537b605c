"""The operator's heal path in a split cluster: VLLMServices in the real CRD API server, the
core objects (pods, Deployments, Services, Events) in kmock, one proxy in front of both.

The operator runs unmodified against the proxy: it lists and watches VLLMServices on the
real server (which applies the CRD's defaults, keeps resourceVersion and generation, prunes
what the schema does not declare, and takes status only through the subresource) and pods
and Deployments in kmock; the test plays the kubelet there."""

from __future__ import annotations

import asyncio

import pytest

from vllm_autoheal.api import GROUP, PLURAL, VERSION
from vllm_autoheal.kube.client import MERGE

from operator_harness import (
    Cluster,
    Emulator,
    flag,
    running_operator,
    setup_emulator,
    wait_for,
)
from samples import KV_TERMINATION, SPEC

pytestmark = [pytest.mark.crdserver, pytest.mark.kmock(cls=Emulator)]
HEAL_RECORD_FIELDS = {
    "time",
    "pod",
    "podUid",
    "container",
    "restartCount",
    "cause",
    "phase",
    "evidence",
    "numbers",
    "action",
    "reason",
    "changes",
    "gpus",
}


@pytest.fixture
async def split(kmock, crd_server):
    from crdserver.discovery_proxy import DiscoveryProxy
    from crdserver.server import install_crd

    await asyncio.to_thread(install_crd, crd_server)
    with DiscoveryProxy(crd_server.url, crd_server.workdir / "certs", core_url=str(kmock.url)) as proxy:
        setup_emulator(kmock, api_url=proxy.url)
        async with running_operator():
            yield Cluster(kmock)


async def test_heal_through_the_real_crd_server(split):
    c, name = split, "split-llama"
    path = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{name}"
    if await c.get(path):  # the server is shared by the session
        await c.call("DELETE", path)
    await wait_for(lambda: c.vsvc_now(name) is None, what="a clean start")
    await c.create_vsvc(name, SPEC)
    created = await c.vsvc(name)
    assert created["spec"]["engine"]["tensorParallelSize"] == 1  # the CRD's default, from the server
    assert created["metadata"]["uid"] != "uid-0001"  # the server's own uid
    dep = await wait_for(lambda: c.deployment_now(name), what="deployment in kmock")
    assert dep["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    await wait_for(lambda: (c.vsvc_now(name).get("status") or {}).get("observedGeneration") == 1, what="status")

    await c.crash_pod(name, f"{name}-a", message=KV_TERMINATION)
    healed = await wait_for(
        lambda: (
            (v := c.vsvc_now(name))["metadata"]["generation"] == 2
            and (v.get("status") or {}).get("observedGeneration") == 2
            and v
        ),
        what="heal",
    )
    assert healed["spec"]["engine"]["maxModelLen"] == 524160
    status = healed["status"]
    assert status["baseline"]["gpuMemoryUtilization"] == 0.9 and "maxModelLen" not in status["baseline"]
    assert status["healCount"] == 1 and status["attempts"] == 1 and status["lastCause"] == "kv_cache_insufficient"
    record = status["heals"][-1]
    assert set(record) == HEAL_RECORD_FIELDS, "the real server pruned part of the heal record"
    assert record["numbers"]["estimated_max_model_len"] == 524160 and record["evidence"]
    assert any(cond["type"] == "Healing" and cond["status"] == "True" for cond in status["conditions"])
    assert f"{GROUP}/healed-engine" in healed["metadata"]["annotations"]
    await wait_for(lambda: flag(c.deployment_now(name), "--max-model-len") == "524160", what="rollout")
    events = await wait_for(
        lambda: [e for e in c.events_now("Healed") if e["involvedObject"]["uid"] == created["metadata"]["uid"]],
        what="event",
    )
    assert "LowerMaxModelLen" in events[0]["message"]

    await c.crash_pod(name, f"{name}-a", message=KV_TERMINATION)  # the same crash, reported again
    await asyncio.sleep(2)
    again = await c.vsvc(name)
    assert again["status"]["healCount"] == 1 and again["metadata"]["generation"] == 2


# The heal cases of tests/test_operator_heal.py, with the VLLMService on the real API server: its
# schema, CEL rules (resources.gpus == TP x PP), defaults, pruning and resourceVersion preconditions.
from samples import BAD_MESSAGES, H200_TERMINATION, KV_LOG, NO_GPU, TP_HEAL, WEIGHTS_OOM  # noqa: E402

CASES = {
    "h200-default-floor": (
        {**SPEC, "resources": {"gpuProduct": "NVIDIA-H200"}},
        H200_TERMINATION,
        lambda o: o["spec"]["engine"]["gpuMemoryUtilization"] == 0.26,  # (the default image: graphs in the budget)
    ),
    "tp-with-gpus": (
        {**SPEC, "resources": {**SPEC["resources"], "gpus": 1}, "heal": TP_HEAL},
        WEIGHTS_OOM,
        lambda o: o["spec"]["engine"]["tensorParallelSize"] == 2 and o["spec"]["resources"]["gpus"] == 2,
    ),
    "tp-status-overrides": (
        {**SPEC, "heal": {**TP_HEAL, "mode": "StatusOverrides"}},
        WEIGHTS_OOM,
        lambda o: o["status"]["effective"]["tensorParallelSize"] == 2 and o["status"]["gpus"] == 2,
    ),
    "huge-number-in-message": (SPEC, BAD_MESSAGES["huge"], lambda o: o["spec"]["engine"]["maxModelLen"] == 524160),
}


async def _fresh(c, name: str, spec: dict) -> dict:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{name}"
    if await c.get(path):  # the server is shared by the session
        await c.call("DELETE", path)
    await wait_for(lambda: c.vsvc_now(name) is None, what="a clean start")
    await c.create_vsvc(name, spec)
    await wait_for(lambda: (c.vsvc_now(name).get("status") or {}).get("observedGeneration") == 1, what="status")
    return await c.vsvc(name)


@pytest.mark.parametrize("case", sorted(CASES))
async def test_heal_cases_are_accepted_by_the_real_crd_server(split, case):
    spec, message, healed = CASES[case]
    c, name = split, f"case-{case}"
    await _fresh(c, name, spec)
    c.kmock[f"get /api/v1/namespaces/default/pods/{name}-a/log"] << KV_LOG.encode()
    await c.crash_pod(name, f"{name}-a", message=message)
    obj = await wait_for(
        lambda: (v := c.vsvc_now(name)).get("status", {}).get("inFlight", {}).get("applied") and healed(v) and v,
        what="the heal, accepted",
    )
    status = obj["status"]
    assert status["attempts"] == 1 and status["healCount"] == 1 and status["tried"]
    assert set(status["inFlight"]) >= {"crash", "cause", "action", "target", "previous", "applied", "time"}
    assert status["failedEngines"] and status["phase"] == "Healing"


async def test_an_unschedulable_revert_is_accepted_by_the_real_crd_server(split):
    c, name = split, "case-unschedulable"
    spec = {**SPEC, "resources": {**SPEC["resources"], "gpus": 1}, "heal": {**TP_HEAL, "unschedulableSeconds": 0}}
    await _fresh(c, name, spec)
    await c.crash_pod(name, f"{name}-a", message=WEIGHTS_OOM)
    await wait_for(lambda: c.vsvc_now(name)["spec"]["resources"].get("gpus") == 2, what="the TP heal")
    await wait_for(lambda: flag(c.deployment_now(name), "--tensor-parallel-size") == "2", what="its rollout")
    await c.pending_pod(name, f"{name}-b", NO_GPU)
    obj = await wait_for(lambda: (v := c.vsvc_now(name))["spec"]["resources"]["gpus"] == 1 and v, what="revert")
    assert obj["spec"]["engine"]["tensorParallelSize"] == 1
    blocked = next(cond for cond in obj["status"]["conditions"] if cond["type"] == "HealBlocked")
    assert blocked["status"] == "True" and NO_GPU in blocked["message"]


async def test_a_persons_edit_between_the_heals_read_and_its_write_wins(split, monkeypatch):
    """PatchSpec: the heal reads the spec, sees the flags it was planned from, and writes its own.
    A person's edit that lands in between (here: max_model_len 4096, set while the heal builds its
    patch) must not be overwritten by the heal's 524160: the write carries the resourceVersion it
    read, the real server answers 409, and the heal reads again and gives way."""
    from vllm_autoheal.kube import heal_apply

    c, name = split, "case-edit-race"
    await _fresh(c, name, SPEC)
    path = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{name}"
    real_patch, edits = heal_apply.spec_patch, []

    def edited_meanwhile(obj, target, written_engine, heal=None):
        if not edits:  # the person's edit lands once, after the heal's read
            edits.append(c.kube.request("PATCH", path, {"spec": {"engine": {"maxModelLen": 4096}}}, MERGE))
        return real_patch(obj, target, written_engine, heal)

    monkeypatch.setattr(heal_apply, "spec_patch", edited_meanwhile)
    c.kmock[f"get /api/v1/namespaces/default/pods/{name}-a/log"] << KV_LOG.encode()
    await c.crash_pod(name, f"{name}-a", message=KV_TERMINATION)
    obj = await wait_for(
        lambda: edits and (v := c.vsvc_now(name)).get("status", {}).get("healCount") and v, what="the heal decided"
    )
    await asyncio.sleep(1.0)  # (a heal that went on would have written by now)
    obj = c.vsvc_now(name)
    assert obj["spec"]["engine"]["maxModelLen"] == 4096, obj["spec"]["engine"]
    assert not (obj.get("status") or {}).get("inFlight"), obj["status"]
