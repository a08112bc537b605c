"""The operator writes only what it owns, by server-side apply: a field removed from the
VLLMService leaves the Deployment, and an object of the same name that it does not control is
never modified, adopted or given an owner (kopf in-process against kmock)."""

from __future__ import annotations

import asyncio
import copy

import pytest

from vllm_autoheal.kube.client import FIELD_MANAGER
from vllm_autoheal.kube.resources import SERVICE_LABEL

from operator_harness import (
    HARNESS_AGENT,
    NS,
    Emulator,
    vllm_container,
    wait_for,
)

pytestmark = pytest.mark.kmock(cls=Emulator)
VSVC = f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{NS}/vllmservices"
SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9},
    "resources": {"limits": {"memory": "32Gi"}, "shmSize": "4Gi"},
    "preflight": "Off",
}


def pod_spec(dep: dict) -> dict:
    return dep["spec"]["template"]["spec"]


async def test_a_service_of_someone_else_is_left_alone(cluster):
    payments = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "payments", "namespace": NS},
        "spec": {"selector": {"app": "payments"}, "ports": [{"name": "https", "port": 443}]},
    }
    await cluster.call("POST", f"/api/v1/namespaces/{NS}/services", payments)
    before = await cluster.get(f"/api/v1/namespaces/{NS}/services/payments")
    await cluster.create_vsvc("payments", SPEC)
    obj = await wait_for(
        lambda: (
            any(
                c["type"] == "Ready" and c["reason"] == "NameConflict"
                for c in (cluster.vsvc_now("payments").get("status") or {}).get("conditions", [])
            )
            and cluster.vsvc_now("payments")
        ),
        what="NameConflict",
    )
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "Service default/payments" in ready["message"]
    events = await wait_for(lambda: cluster.events_now("NameConflict"), what="NameConflict event")
    assert events[0]["type"] == "Warning" and "Service default/payments" in events[0]["message"]
    after = await cluster.get(f"/api/v1/namespaces/{NS}/services/payments")
    assert after == before  # not one field changed, no owner added
    assert await cluster.deployment("payments") is None  # and nothing half-deployed beside it
    operator_writes = [
        r.url.path
        for r in cluster.kmock._requests
        if r.headers.get("User-Agent", "") != HARNESS_AGENT
        and getattr(r.method, "value", r.method) in ("POST", "PATCH", "PUT", "DELETE")
        and ("/services" in r.url.path or "/deployments" in r.url.path)
    ]
    assert operator_writes == []


async def test_a_service_its_team_creates_while_the_operators_create_is_on_its_way_is_left_alone(cluster):
    # The operator looked (no Service of that name) and its create is in flight when the team's own
    # Service lands first. A forced apply would have taken theirs over (spec, labels, a controller
    # ownerReference: deleting the VLLMService would have garbage-collected it); the create is refused
    # (409), retried, and the retry finds their Service: a name conflict, nothing written over it.
    payments = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "payments", "namespace": NS},
        "spec": {"selector": {"app": "payments"}, "ports": [{"name": "https", "port": 443}]},
    }
    creating = cluster.kmock.fail("POST", "/services", delay=1.5)
    await cluster.create_vsvc("payments", SPEC)
    await wait_for(lambda: creating.pending == 1, what="the operator's create of its Service in flight")
    await cluster.call("POST", f"/api/v1/namespaces/{NS}/services", payments)
    before = await cluster.get(f"/api/v1/namespaces/{NS}/services/payments")
    await wait_for(lambda: cluster.events_now("NameConflict"), what="NameConflict event")
    after = await cluster.get(f"/api/v1/namespaces/{NS}/services/payments")
    assert after == before and not after["metadata"].get("ownerReferences")


async def test_a_pod_labelled_with_an_empty_service_name_is_ignored(cluster, caplog):
    # The service label with an empty value: the GET of that "name" is the namespace's list.
    await cluster.create_vsvc("svc", SPEC)
    dep = copy.deepcopy(await wait_for(lambda: cluster.deployment_now("svc"), what="deployment"))
    dep["spec"]["template"]["metadata"]["labels"][SERVICE_LABEL] = ""
    await cluster.crash_pod("svc", "unnamed", template_from=dep)
    await cluster.crash_pod("svc", "named")  # recorded after it: the operator has seen both
    await wait_for(lambda: (cluster.vsvc_now("svc").get("status") or {}).get("observedCrashes"), what="the crash")
    await asyncio.sleep(0.5)  # (pods are handled concurrently)
    assert not [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


async def test_objects_the_api_server_refuses_are_reported_not_retried_forever(cluster):
    """Low (the operator's work and log for a spec it can never apply; nothing in status). The CRD
    admits what the pod template may not: a node selector or toleration key that is no label key, a
    GPU product that is no label value. The API server refuses the Deployment (422); reconcile raised
    the bare ApiException, which kopf retried every minute with a traceback, and status said nothing.
    It must say so (Ready=False, the server's words) and wait for the next edit."""
    fault = cluster.kmock.fail("POST", "/deployments", 422, times=1000)  # (its create)
    await cluster.create_vsvc("bad", {**SPEC, "resources": {**SPEC["resources"], "nodeSelector": {"a b": "c"}}})
    ready = await wait_for(
        lambda: next(
            (
                c
                for c in (cluster.vsvc_now("bad").get("status") or {}).get("conditions", [])
                if c["type"] == "Ready" and c["reason"] == "ObjectsRefused"
            ),
            None,
        ),
        what="ObjectsRefused",
    )
    assert ready["status"] == "False" and "injected 422" in ready["message"], ready
    hits = fault.hits
    await asyncio.sleep(2.0)  # (the harness retries a temporary error after 0.5 s)
    assert fault.hits == hits, f"{fault.hits - hits} more applies of a refused Deployment"


async def test_an_object_controlled_by_another_vllmservice_is_not_taken_over(cluster):
    await cluster.create_vsvc("first", SPEC)
    dep = await wait_for(lambda: cluster.deployment_now("first"), what="deployment")
    owner = dep["metadata"]["ownerReferences"][0]["uid"]
    await cluster.call("DELETE", f"{VSVC}/first")  # kmock has no garbage collector: its objects stay
    await cluster.create_vsvc("first", {**SPEC, "model": "org/other"})  # a new object, a new uid
    await wait_for(lambda: cluster.events_now("NameConflict"), what="NameConflict event")
    dep = await cluster.deployment("first")
    assert dep["metadata"]["ownerReferences"][0]["uid"] == owner
    assert "org/other" not in vllm_container(dep)["command"]


async def test_fields_removed_from_the_spec_leave_the_deployment(cluster):
    spec = {
        **SPEC,
        "env": [{"name": "KEEP", "value": "1"}, {"name": "DROP", "value": "2"}],
        "resources": {
            **SPEC["resources"],
            "gpuProduct": "NVIDIA-L4",
            "nodeSelector": {"pool": "a100"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
        },
    }
    await cluster.create_vsvc("trim", spec)
    dep = await wait_for(lambda: cluster.deployment_now("trim"), what="deployment")
    assert pod_spec(dep)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4", "pool": "a100"}
    assert any(t.get("key") == "dedicated" for t in pod_spec(dep)["tolerations"])
    managers = {(m["manager"], m["operation"]) for m in dep["metadata"]["managedFields"]}
    assert managers == {(FIELD_MANAGER, "Apply")}
    # someone else's field on the same object: not the operator's, so it stays
    await cluster.call(
        "PATCH",
        f"/apis/apps/v1/namespaces/{NS}/deployments/trim",
        {"metadata": {"annotations": {"team.example.com/cost-center": "42"}}},
        "application/merge-patch+json",
    )
    await cluster.call(
        "PATCH",
        f"{VSVC}/trim",
        {
            "spec": {
                "env": [{"name": "KEEP", "value": "1"}],
                "resources": {"gpuProduct": None, "nodeSelector": None, "tolerations": None},
            }
        },
        "application/merge-patch+json",
    )
    dep = await wait_for(
        lambda: (
            (d := cluster.deployment_now("trim"))
            and "nvidia.com/gpu.product" not in pod_spec(d).get("nodeSelector", {})
            and d
        ),
        what="nodeSelector without the GPU product",
    )
    pod = pod_spec(dep)
    assert not pod.get("nodeSelector")  # gpuProduct and pool: both gone
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert [e["name"] for e in vllm_container(dep)["env"]] == ["KEEP", "PYTHONPATH"]
    assert dep["metadata"]["annotations"]["team.example.com/cost-center"] == "42"


def test_apply_emulation_keeps_other_fields_and_drops_its_own():
    from api_writes import server_side_apply

    live = {"metadata": {"name": "d", "annotations": {"theirs": "1"}}, "spec": {"replicas": 1}}
    first = server_side_apply(
        live, {"metadata": {"name": "d", "labels": {"a": "1", "b": "2"}}, "spec": {"replicas": 2, "x": [1, 2]}}, "m"
    )
    second = server_side_apply(first, {"metadata": {"name": "d", "labels": {"a": "1"}}, "spec": {"x": [3]}}, "m")
    assert second["metadata"]["labels"] == {"a": "1"} and second["spec"] == {"x": [3]}
    assert second["metadata"]["annotations"] == {"theirs": "1"}
    # replicas was the user's before the first apply; once applied by "m" and dropped, it goes
    assert "replicas" not in second["spec"]
