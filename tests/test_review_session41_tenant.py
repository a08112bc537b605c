"""Hostile review (session 41) as a malicious or careless tenant: what a pod's author, a VLLMService's author, or
anyone else with an ordinary namespaced grant (create Deployments, write vllmservices/status through a wildcard)
can make the shared operator do to a VLLMService that is not theirs to change, or beyond its owner's bounds.

Each defect is a strict xfail asserting the right behaviour; the plain tests pin attacks found defended that the
earlier reviews (test_review_tenant/privilege/steering/steer3/volume/session*) did not already cover."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from api_writes import merge_patch
from vllm_autoheal.api import Deployed, EngineArgs, HealIntent
from vllm_autoheal.kube import handlers, heal_apply, reconcile, resources, unschedulable
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import fp, parse

NS = "team-a"
LOG = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None, debug=lambda *a, **k: None)
LONG_AGO = "2026-01-01T00:00:00Z"


class StubKube:
    """One VLLMService (merge patches with the resourceVersion precondition) and the objects the tests name."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.applied: list[list[dict[str, Any]]] = []
        self.objects: dict[str, dict[str, Any]] = {}

    def vsvc_path(self, ns: str, name: str) -> str:
        return f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{ns}/vllmservices/{name}"

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.body) if name == self.body["metadata"]["name"] else None

    def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    def previous_log(self, *a: Any) -> str:
        return ""

    def apply_all(self, manifests: list[dict[str, Any]]) -> Any:
        self.applied.append(copy.deepcopy(manifests))
        return SimpleNamespace(conflicts=[], outcomes=[])

    def request(self, method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        if method == "GET" and path.endswith("/pods"):
            return {"items": []}
        if method == "PATCH":
            version = (body.get("metadata") or {}).get("resourceVersion")
            if version is not None and version != self.body["metadata"]["resourceVersion"]:
                from kubernetes.client.rest import ApiException

                raise ApiException(status=409, reason="Conflict")
            patch = {k: v for k, v in body.items() if k != "metadata"}
            patch["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k != "resourceVersion"}
            self.body = merge_patch(self.body, patch)
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
            return copy.deepcopy(self.body)
        raise AssertionError(f"unexpected {method} {path}")


def _vsvc(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": NS, "uid": "vsvc-uid", "generation": 1, "resourceVersion": "1"},
        "spec": copy.deepcopy(spec),
        "status": status or {},
    }


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setattr(unschedulable, "_recent", unschedulable.RecentReads())
    monkeypatch.setattr(unschedulable, "_looks", unschedulable.NamespaceLooks())
    monkeypatch.setattr(unschedulable, "event", lambda body, **k: None)
    monkeypatch.setattr(reconcile, "event", lambda *a, **k: None, raising=False)
    monkeypatch.setattr(heal_apply, "event", lambda body, **k: EVENTS.append(k))


EVENTS: list[dict[str, Any]] = []


# --- (1) status.inFlight forged in PatchSpec mode: the operator writes it into the spec ------------------------

OWNER_SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9, "maxModelLen": 32768},
    "resources": {"gpus": 1, "limits": {"memory": "32Gi"}},
    # the owner's bounds: never more GPUs (maxTensorParallelSize unset), never more memory (maxMemoryLimit
    # unset), no quantized fallback: the only model this service may run is spec.model
    "heal": {"mode": "PatchSpec"},
}


def _forged_in_flight() -> dict[str, Any]:
    """What a writer of vllmservices/status (and nothing else) puts in status.inFlight: `previous` copied from the
    spec it can read, `target` of its own choosing."""
    previous = Deployed(
        engine=EngineArgs.model_validate(OWNER_SPEC["engine"]), model=OWNER_SPEC["model"], memory_limit="32Gi"
    )
    target = Deployed(
        engine=EngineArgs.model_validate(
            {
                "gpuMemoryUtilization": 0.9,
                "maxModelLen": 32768,
                "tensorParallelSize": 8,
                "extraArgs": ["--trust-remote-code"],
            }
        ),
        model="attacker/remote-code-model",
        memory_limit="1Ti",
    )
    return HealIntent(
        crash="forged/vllm/0",
        cause="weights_load_oom",
        action="IncreaseTensorParallel",
        summary="",
        target=target,
        previous=previous,
        applied=False,
        time=LONG_AGO,
    ).wire()


def test_a_forged_in_flight_heal_is_not_written_into_the_spec_past_the_owners_bounds():
    """Severity: high where anyone but the author may write vllmservices/status (the README's own threat: "a
    wildcard over the group's resources does"; a dashboard or CI bot with `vllmservices/*`), medium otherwise.
    Input: PatchSpec mode (the default); the owner's spec runs Llama-3.1-8B on 1 GPU, 32Gi, with no
    maxTensorParallelSize, no maxMemoryLimit and no quantized fallback. A status writer sets status.inFlight
    {applied: false, previous: the spec as it reads, target: model attacker/remote-code-model, TP 8 with
    extraArgs --trust-remote-code, memory 1Ti}. No crash is needed: the next reconcile (a resume, any edit)
    or pod event runs heal_apply.complete.
    Now: the operator patches the spec itself to that target (model, engine, resources.gpus 8, limits.memory
    1Ti) under its own identity, and deploys it: an arbitrary Hub model's code runs in the owner's pod with
    its HF_TOKEN and env Secrets, on 8 GPUs. README promises a status writer "deploys nothing past the spec
    and its heal bounds (more GPUs than maxTensorParallelSize, memory above maxMemoryLimit, a model other
    than the spec's or its quantized fallback)"; that holds for status.effective (overrides_refused) only.
    Right: an in-flight target outside the spec's bounds (as overrides_refused judges status.effective) is
    dropped, not written into the spec."""
    kube = StubKube(_vsvc(OWNER_SPEC, {"baseline": OWNER_SPEC["engine"], "inFlight": _forged_in_flight()}))
    EVENTS.clear()
    heal_apply.complete(kube, OperatorConfig(), None, NS, "svc", LOG)  # type: ignore[arg-type]
    assert kube.body["status"].get("inFlight") is None  # (dropped, and said so)
    assert [e["reason"] for e in EVENTS] == ["HealRefused"] and "status.inFlight.target.model" in EVENTS[0]["message"]
    spec = kube.body["spec"]
    assert spec["model"] == OWNER_SPEC["model"], spec
    assert spec["resources"].get("gpus") == 1 and spec["resources"]["limits"]["memory"] == "32Gi", spec
    assert "--trust-remote-code" not in (spec["engine"].get("extraArgs") or []), spec["engine"]
    for manifests in kube.applied:
        dep = next(m for m in manifests if m["kind"] == "Deployment")
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"][resources.GPU_RESOURCE] == 1, container["resources"]
        assert "attacker/remote-code-model" not in container["command"], container["command"]


def test_a_forged_status_effective_deploys_nothing_past_the_bounds():
    """Defended (the control): the same target written as status.effective/effectiveModel/effectiveMemoryLimit
    in StatusOverrides mode deploys the spec (overrides_refused)."""
    spec = {**copy.deepcopy(OWNER_SPEC), "heal": {"mode": "StatusOverrides"}}
    forged = _forged_in_flight()["target"]
    status = {
        "baseline": OWNER_SPEC["engine"],
        "baselineFor": resources.sized_for(parse(_vsvc(spec))),
        "effective": forged["engine"],
        "effectiveModel": forged["model"],
        "effectiveMemoryLimit": forged["memoryLimit"],
    }
    obj = parse(_vsvc(spec, status))
    assert resources.overrides_refused(obj) is not None
    model, engine, memory = resources.effective(obj)
    assert (model, engine.tensor_parallel_size, memory) == (OWNER_SPEC["model"], 1, "32Gi")


# --- (2) a Deployment the service does not control steers its status ----------------------------------------


def _healed_status(spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A StatusOverrides heal (maxModelLen 32768 -> 16384) applied and rolling out: status.inFlight applied."""
    before = Deployed(engine=EngineArgs.model_validate(spec["engine"]), model=spec["model"], memory_limit="32Gi")
    after = before.model_copy(update={"engine": before.engine.model_copy(update={"max_model_len": 16384})})
    intent = HealIntent(
        crash="pod-uid/vllm/0",
        cause="kv_cache_insufficient",
        action="LowerMaxModelLen",
        summary="LowerMaxModelLen",
        target=after,
        previous=before,
        applied=True,
        time=LONG_AGO,
    )
    status = {
        "baseline": spec["engine"],
        "baselineFor": resources.sized_for(parse(_vsvc(spec))),
        "effective": after.engine.wire(),
        "inFlight": intent.wire(),
        "attempts": 1,
        "healCount": 1,
        "phase": "Healing",
        "conditions": [{"type": "Ready", "status": "False", "reason": "Healing", "lastTransitionTime": LONG_AGO}],
    }
    return status, fp(after)


HEALED_SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9, "maxModelLen": 32768},
    "resources": {"limits": {"memory": "32Gi"}},
    "heal": {"mode": "StatusOverrides"},
}


def decoy_deployment(template: str | None, replicas: int = 1, available: int = 1, owner: dict | None = None) -> dict:
    """A Deployment `decoy` that anyone who may create Deployments in the namespace can make: the service's two
    labels, the heal's template hash (readable off the real Deployment), and an ownerReference where given."""
    annotations = {resources.ENGINE_HASH: template} if template else {}
    meta: dict[str, Any] = {
        "name": "decoy",
        "namespace": NS,
        "uid": "decoy-uid",
        "generation": 1,
        "labels": {resources.MANAGED_BY: resources.MANAGER, resources.SERVICE_LABEL: "svc"},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    status = {"observedGeneration": 1, "replicas": replicas, "availableReplicas": available}
    if available:
        status["updatedReplicas"] = available
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {"replicas": replicas, "template": {"metadata": {"annotations": annotations}}},
        "status": status,
    }


def test_a_decoy_deployment_does_not_mark_the_heal_rolled_out_nor_the_service_running(monkeypatch):
    """Severity: medium (false status and a heal's safety net switched off; one namespace). Input: someone who
    may create Deployments in the namespace but not edit the VLLMService (the same actor ownership.py
    guards pods against) creates Deployment `decoy` with the labels managed-by=vllm-autoheal and
    vllm.autoheal.dev/service=svc and the heal's engine-hash annotation (readable off the real Deployment),
    running a pause image that is Ready at once. The service's real pods are still rolling out (or Pending:
    the heal asked for more than a node has).
    Now: the decoy's event reaches reconcile.deployment_progress, which reads readiness and the template hash
    off the event's body without asking whose Deployment it is: status.inFlight is cleared and the phase is
    Running/Ready 1/1. With inFlight gone, heal.onUnschedulable's revert never runs for the real pods (the
    service stays down), and a crash of the heal's pods is no longer seen as the rolled-out heal's.
    Right: only the Deployment the service controls (its ownerReference to the service's uid, as
    owned_deleted and pods.create_refused already require) moves the rollout's status."""
    spec = HEALED_SPEC
    status, template = _healed_status(spec)
    kube = StubKube(_vsvc(spec, status))
    monkeypatch.setattr(handlers, "_kube", lambda memo: kube)
    decoy = decoy_deployment(template)
    handlers.deployment_progress(body=decoy, type="MODIFIED", namespace=NS, memo={}, logger=LOG)  # type: ignore[arg-type]
    after = kube.body["status"]
    assert after.get("inFlight") is not None, "the decoy's readiness ended the heal in flight"
    assert after.get("phase") != "Running", after.get("phase")


def test_a_decoy_deployment_that_is_not_ready_does_not_unready_a_running_service(monkeypatch):
    """Severity: low-medium (false status of another's service: alerts, a GitOps health check or a load
    balancer's readiness gate reading the VLLMService's Ready condition). Input: the service runs 1/1, Ready
    True; someone who may create Deployments in the namespace creates `decoy` with the service's two labels and
    replicas 3 that never become available (an image that does not exist).
    Now: each of the decoy's events sets Ready=False, reason Progressing, on the serving service.
    Right: a Deployment the service does not control is not its rollout."""
    spec = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "engine": {"gpuMemoryUtilization": 0.9},
        "resources": {"limits": {"memory": "32Gi"}},
        "heal": {"mode": "PatchSpec"},
    }
    ready = {"type": "Ready", "status": "True", "reason": "Running", "lastTransitionTime": LONG_AGO}
    kube = StubKube(_vsvc(spec, {"baseline": spec["engine"], "phase": "Running", "conditions": [ready]}))
    monkeypatch.setattr(handlers, "_kube", lambda memo: kube)
    decoy = decoy_deployment(None, replicas=3, available=0)
    handlers.deployment_progress(body=decoy, type="MODIFIED", namespace=NS, memo={}, logger=LOG)  # type: ignore[arg-type]
    status = kube.body["status"]
    cond = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert cond["status"] == "True" and status.get("phase") == "Running", (status.get("phase"), cond)


def test_the_heals_a_policy_allows_pass_the_in_flight_check():
    """The control for the in-flight check: what the planner may write within the owner's bounds (more GPUs up to
    maxTensorParallelSize, memory up to maxMemoryLimit, the quantized fallback it allows) is not refused."""
    spec = parse(
        _vsvc(
            {
                **OWNER_SPEC,
                "heal": {
                    "mode": "PatchSpec",
                    "bounds": {"maxTensorParallelSize": 4, "maxMemoryLimit": "64Gi"},
                    "quantizedFallback": {"allowed": True, "model": "org/llama-8b-awq", "method": "awq"},
                },
            }
        )
    ).spec
    engine = EngineArgs.model_validate({**OWNER_SPEC["engine"], "tensorParallelSize": 4})
    for model, memory in (("org/llama-8b-awq", "64Gi"), (OWNER_SPEC["model"], "48Gi"), (OWNER_SPEC["model"], None)):
        target = Deployed(engine=engine, model=model, memory_limit=memory)
        assert resources.past_policy(spec, target, heal_apply.IN_FLIGHT_FIELDS) is None, (model, memory)
    assert (
        resources.past_policy(
            spec, Deployed(engine=engine, model=OWNER_SPEC["model"], memory_limit="65Gi"), heal_apply.IN_FLIGHT_FIELDS
        )
        is not None
    )
