"""Hostile review (session 35b) of the watch on a VLLMService's Service and model-cache claim (b7201ce:
kube/handlers.owned_object_gone, reconcile.owned_object_deleted for Deployments, Services and PVCs, and the
chart's list/watch on services and persistentvolumeclaims).

Tests 1-5 were defects found on that code (strict xfails), asserting the right behaviour; all are fixed:
the README's count, the API server selecting what the watches send (kopf's settings.watching.label_selectors),
one re-apply a service a burst of deletions, with its retries under one key (kube/owned_deleted.py), and a
namespace being deleted read as the service going. The last tests are attacks that were defended."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from kubernetes.client.rest import ApiException

from vllm_autoheal.kube import owned_deleted, reconcile
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.later import Later

from operator_harness import HARNESS_AGENT, NS, Emulator, RecordingLog, drain, peak_timers, wait_for
from samples import SPEC

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "vllm-autoheal"
MANAGED = {"app.kubernetes.io/managed-by": "vllm-autoheal"}
FAST = OperatorConfig(retry_delay_s=0.02)


def _method(request: Any) -> str:
    return str(getattr(request.method, "value", request.method)).upper()


def _by_operator(kmock: Any) -> list[Any]:
    return [r for r in list(kmock._requests) if r.headers.get("User-Agent", "") != HARNESS_AGENT]


# --- 1. README: the permissions the chart grants --------------------------------------------------------


def test_the_readme_counts_the_permissions_the_chart_grants(helm):
    """Severity: low (documentation: an administrator reviewing the operator's rights reads a stale count,
    and the new cluster-wide list/watch of every Service and PVC is exactly what they would look for).
    Input: README's 'RBAC is least privilege and tested: ... (24 permissions, no wildcard)'; `helm template`
    of the chart with its default values.
    Now: the ClusterRole grants 29 (group, resource, verb) permissions: b7201ce added list and watch on
    services and persistentvolumeclaims (25 -> 29; the count was already one short since replicasets/get).
    Right: the README's count is the chart's (tests/test_rbac.py checks the chart against the operator's
    requests, so the README is the only place the number can drift)."""
    said = re.search(r"\((\d+) permissions, no wildcard", (ROOT / "README.md").read_text())
    assert said is not None
    rendered = subprocess.run([helm, "template", "rel", str(CHART)], capture_output=True, text=True, check=True)
    granted = {
        (g, r, v)
        for doc in yaml.safe_load_all(rendered.stdout)
        if doc and doc["kind"] == "ClusterRole"
        for rule in doc["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert int(said.group(1)) == len(granted), f"README: {said.group(1)}, chart: {len(granted)}"


# --- 2. what the new watches stream into the operator ----------------------------------------------------


@pytest.mark.kmock(cls=Emulator)
async def test_the_operator_is_sent_only_the_services_and_claims_it_manages(cluster):
    """Severity: low (cost and exposure, every tenant's: not a write).
    Input: the operator started (clusterwide, as the chart's default); a VLLMService settled.
    Now: kopf's `labels=` filter is applied in the operator's process: its list and watch of /api/v1/services
    and /api/v1/persistentvolumeclaims carry no labelSelector, so the API server streams every Service and
    PVC of every namespace (each tenant's unrelated churn included) into the operator, and kopf keeps a
    per-object memory and runs its cause detection (the diffbase digest) for each, to drop all but its own.
    Right: the API server selects them (kopf 1.45's settings.watching.label_selectors['', 'services'] and
    ['', 'persistentvolumeclaims'] = 'app.kubernetes.io/managed-by=vllm-autoheal'): the operator is sent
    only its own objects; the client-side filter stays. (The Deployment and pod watches are the same,
    from before this change.)"""
    await cluster.create_vsvc("sel", SPEC)
    await cluster.settled("sel")
    listed = [
        r
        for r in _by_operator(cluster.kmock)
        if _method(r) == "GET" and r.url.path.rstrip("/").split("/")[-1] in ("services", "persistentvolumeclaims")
    ]
    assert {r.url.path.rstrip("/").split("/")[-1] for r in listed} == {"services", "persistentvolumeclaims"}
    unselected = [
        (r.url.path, dict(r.params))
        for r in listed
        if "app.kubernetes.io/managed-by=vllm-autoheal" not in str(dict(r.params).get("labelSelector", ""))
    ]
    assert unselected == []
    # (and the Deployments and pods it watches: its own, and the pods that carry a service's label)
    selected = {
        r.url.path.rstrip("/").split("/")[-1]: str(dict(r.params).get("labelSelector", ""))
        for r in _by_operator(cluster.kmock)
        if _method(r) == "GET" and r.url.path.rstrip("/").split("/")[-1] in ("deployments", "pods")
    }
    assert selected == {
        "deployments": "app.kubernetes.io/managed-by=vllm-autoheal",
        "pods": "vllm.autoheal.dev/service",
    }, selected


# --- 3. work keyed per deleted object, not per service ----------------------------------------------------


def _controlled(name: str, uid: str, i: int) -> dict[str, Any]:
    """A headless Service (no cluster IP, no pods, no quota but count/services) labelled as the operator's
    and controlled by the tenant's own VLLMService `name` (its uid): anyone who may create Services may make it."""
    ref = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "name": name, "uid": uid}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}-decoy-{i}",
            "namespace": NS,
            "uid": f"decoy-{i}",
            "labels": {**MANAGED, "vllm.autoheal.dev/service": name},
            "ownerReferences": [{**ref, "controller": True}],
        },
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
    }


@pytest.mark.kmock(cls=Emulator)
async def test_a_storm_of_deleted_objects_of_one_service_costs_a_bounded_number_of_reconciles(cluster):
    """Severity: low (shared workers and API load a tenant can multiply; the same was possible with decoy
    Deployments before, and b7201ce opens Services and PVCs to it, the cheapest objects a tenant may make).
    Input: a tenant's VLLMService `storm` settled; 12 headless Services in its namespace, labelled
    managed-by=vllm-autoheal and vllm.autoheal.dev/service=storm, each with a controller ownerReference to
    storm's uid (no pods, no cluster IP); the tenant deletes them (one `kubectl delete svc -l ...`).
    Now: each DELETED passes owned_object_deleted's checks and runs reconcile() on one of kopf's 8 shared
    worker threads: 12 full reconciles (2 reads of the service, a read of each object, status compare) for
    one service whose objects are all there; 10,000 decoys are 10,000 reconciles, other tenants' heals
    waiting behind them. The same happens, 3 reconciles, when a person deletes a service's Deployment,
    Service and claim together.
    Right: deletions of one service's objects are coalesced (one pending re-apply a service, as Later's
    one-run-per-key gives): a burst costs a bounded number of reconciles (here at most 3)."""
    await cluster.create_vsvc("storm", SPEC)
    v = await cluster.settled("storm")
    for i in range(12):
        await cluster.call("POST", f"/api/v1/namespaces/{NS}/services", _controlled("storm", v["metadata"]["uid"], i))
    await asyncio.sleep(1.0)
    start = len(cluster.kmock._requests)
    for i in range(12):
        await cluster.call("DELETE", f"/api/v1/namespaces/{NS}/services/storm-decoy-{i}")

    def reconciles() -> int:
        return sum(
            1
            for r in list(cluster.kmock._requests)[start:]
            if r.headers.get("User-Agent", "") != HARNESS_AGENT
            and _method(r) == "GET"
            and r.url.path.rstrip("/") == f"/apis/apps/v1/namespaces/{NS}/deployments/storm"
        )

    await wait_for(lambda: reconciles() >= 1, what="a reconcile after the deletions")
    deadline = time.monotonic() + 8.0  # (the rest of the burst, on a loaded machine)
    while reconciles() <= 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert reconciles() <= 3, f"{reconciles()} reconciles of one service for one burst of deletions"


class _Kube:
    def __init__(self, service: dict[str, Any]) -> None:
        self.service = service

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.service


SERVICE = {"metadata": {"name": "s", "namespace": "team", "uid": "u-s"}}


def _gone(kind: str, name: str) -> dict[str, Any]:
    ref = {"controller": True, "uid": "u-s", "kind": "VLLMService", "name": "s"}
    return {"kind": kind, "metadata": {"name": name, "namespace": "team", "ownerReferences": [ref]}}


def test_a_service_whose_three_objects_are_deleted_under_a_failing_api_holds_one_retry(monkeypatch):
    """Severity: low (3x the timer threads and reconciles a service may hold; tests/test_review_session34c.py
    defended 'one timer a service at a time', which no longer holds).
    Input: a VLLMService's Deployment, Service and model-cache PVC deleted together (`kubectl delete
    deploy,svc,pvc -l app.kubernetes.io/instance=s`, or a namespace cleanup) while every apply fails
    transiently (reconcile raises kopf.TemporaryError 'applying the objects failed: 503').
    Now: owned_object_deleted retries under f'{ns}/{name}/{kind}-deleted': three keys, three timers pending
    at once for one service and three chains of cfg.write_attempts reconciles each (12 with the default 4),
    though any one reconcile applies all three objects.
    Right: one retry a service (a key without the kind: a newer deletion replaces the pending retry), at
    most one timer pending, and the three deletions cost the three immediate tries and one chain of retries
    (at most write_attempts + 2 reconciles)."""
    calls: list[int] = []

    def failing(kube: Any, cfg: Any, body: Any, logger: Any) -> None:
        calls.append(1)
        raise kopf.TemporaryError("applying the objects failed: 503", delay=0)

    monkeypatch.setattr(reconcile, "reconcile", failing)
    later = Later()
    try:
        with peak_timers(later) as peak:
            for kind, name in (("Deployment", "s"), ("Service", "s"), ("PersistentVolumeClaim", "s-model-cache")):
                owned_deleted.owned_object_deleted(
                    _Kube(SERVICE), FAST, later, "team", "s", _gone(kind, name), RecordingLog()
                )  # type: ignore[arg-type]
            drain(later)
    finally:
        later.stop()
    assert peak[0] <= 1 and len(calls) <= FAST.write_attempts + 2, f"peak {peak[0]} timers, {len(calls)} reconciles"


# --- 4. a namespace being deleted ---------------------------------------------------------------------------


def _terminating(resource: str, name: str) -> ApiException:
    """The API server's refusal of a create in a namespace being deleted (the NamespaceLifecycle plugin), as
    kube/client.py raises it: the Status body after the reason."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f'{resource} "{name}" is forbidden: unable to create new content in namespace team because it is '
        "being terminated",
        "reason": "Forbidden",
        "details": {"name": name, "kind": resource, "causes": [{"reason": "NamespaceTerminating", "field": "team"}]},
        "code": 403,
    }
    return ApiException(status=403, reason=f"Forbidden: {json.dumps(status)}")


def test_an_object_deleted_with_its_namespace_is_not_a_handler_error(monkeypatch, caplog):
    """Severity: low (an ERROR with a traceback in the operator's log, and a failed attempt to post an Event, for
    each of a service's objects at every routine namespace deletion: noise that reads as a malfunction).
    Input: `kubectl delete namespace team` holding VLLMService s. The namespace controller deletes the
    namespace's content one resource type after another, in no set order, with background propagation: s's
    Service (or claim, or Deployment) may go while s itself has no deletionTimestamp yet.
    Now: owned_object_deleted finds s there and not going, runs reconcile(); its create of the missing object
    is refused 403 'unable to create new content in namespace team because it is being terminated'
    (NamespaceTerminating); that is neither kopf.TemporaryError nor transient, so it is raised out of the
    event handler: kopf logs 'Handler ... failed with an exception' (three times a service since b7201ce).
    Right: a namespace being terminated is the service going, as its own deletionTimestamp is: nothing is
    raised, nothing retried."""
    calls: list[int] = []

    def refused(*a: Any, **k: Any) -> None:
        calls.append(1)
        raise _terminating("services", "s")

    monkeypatch.setattr(reconcile, "reconcile", refused)
    monkeypatch.setattr(owned_deleted, "SETTLE_S", 0.0)
    later = Later()
    try:
        with caplog.at_level(logging.ERROR):
            owned_deleted.owned_object_deleted(
                _Kube(SERVICE), FAST, later, "team", "s", _gone("Service", "s"), RecordingLog()
            )  # type: ignore[arg-type]
            drain(later)
        assert calls == [1] and not later._timers
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "raised out of the re-apply"
    finally:
        later.stop()


# --- defended ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gone", "service", "why"),
    [
        (
            _gone("Service", "s"),
            {"metadata": {"name": "s", "namespace": "team", "uid": "u-s", "deletionTimestamp": "t"}},
            "foreground",
        ),
        (_gone("Service", "s"), None, "background: the service is gone before its objects"),
        (
            _gone("PersistentVolumeClaim", "s-model-cache"),
            {"metadata": {"name": "s", "namespace": "team", "uid": "u-new"}},
            "made again",
        ),
        (
            {"kind": "PersistentVolumeClaim", "metadata": {"name": "mine", "namespace": "team"}},
            SERVICE,
            "not controlled",
        ),
        (
            {"kind": "Service", "metadata": {"name": "x", "ownerReferences": [{"controller": False, "uid": "u-s"}]}},
            SERVICE,
            "owned, not controlled",
        ),
    ],
)
def test_a_deleted_service_or_claim_reconciles_only_its_controller_while_it_stays(monkeypatch, gone, service, why):
    """Defended: the garbage collector's deletions of a going service's Service and claim (foreground: the
    service has a deletionTimestamp; background: it is gone first) and a service made again under the name
    (another uid) apply nothing; nor does a claim the service does not control (a user's spec.modelCache
    .claimName claim carrying the operator's labels) or one it owns without controlling."""
    called: list[Any] = []
    monkeypatch.setattr(reconcile, "reconcile", lambda *a, **k: called.append(a))
    monkeypatch.setattr(owned_deleted, "SETTLE_S", 0.0)
    later = Later()
    try:
        owned_deleted.owned_object_deleted(_Kube(service), FAST, later, "team", "s", gone, RecordingLog())  # type: ignore[arg-type]
        drain(later)
    finally:
        later.stop()
    assert called == [], why


@pytest.mark.kmock(cls=Emulator)
async def test_a_deleted_claim_of_a_user_named_cache_is_not_made_by_the_operator(cluster):
    """Defended: a VLLMService whose model cache is a user-named claim (spec.modelCache.claimName) has no claim
    of the operator's: a deletion of the Service re-applies the Service and Deployment only, never a claim
    under either name; the operator's watch puts no finalizer and no kopf annotation on a Service."""
    await cluster.create_vsvc("own", {**SPEC, "modelCache": {"enabled": True, "claimName": "users-cache"}})
    await cluster.settled("own")
    path = f"/api/v1/namespaces/{NS}/services/own"
    first = await wait_for(lambda: cluster.kube.get(path), what="service")
    assert not first["metadata"].get("finalizers")
    assert not any("vllm.autoheal.dev" in k for k in (first["metadata"].get("annotations") or {}) if "applied" not in k)
    await cluster.call("DELETE", path)
    await wait_for(lambda: cluster.kube.get(path), what="service applied again")
    for claim in ("users-cache", "own-model-cache"):
        assert await cluster.get(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/{claim}") is None
