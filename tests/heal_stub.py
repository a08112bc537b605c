"""A stub VLLMService store for heal-path tests (the session-43 reviews): merge patches under the resourceVersion
precondition (the spec's generation moving with a spec write), one service reconciled once, pods as the kubelet
reports their vllm container, and the heal driven through heal.handle_crash and reconcile.reconcile as kopf's
handlers call them. The core API cannot run here; this stands in for it."""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace
from typing import Any

from kubernetes.client.rest import ApiException

from api_writes import merge_patch
from vllm_autoheal.kube import heal, heal_apply, heal_events, pods, reconcile, resources
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import deployed, fp, parse
from vllm_autoheal.kube.later import PerNamespace

from operator_harness import PendingLater
from samples import SPEC

NS, NAME = "team-a", "svc"
LOG = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None, debug=lambda *a, **k: None)
EVENTS: list[dict[str, Any]] = []
HEALED_LEN = 524160  # KV_TERMINATION's heal: max_model_len 1048576 -> 524160


class StubKube:
    """One VLLMService: merge patches with the resourceVersion precondition (the spec's generation moves with a
    spec write); `fail(method, path, body)` may return an exception to raise instead of a request (before it lands)."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.applied: list[list[dict[str, Any]]] = []
        self.fail: Any = None
        self._guard = threading.Lock()

    def vsvc_path(self, ns: str, name: str) -> str:
        return f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{ns}/vllmservices/{name}"

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        if self.fail is not None and (exc := self.fail("GET", self.vsvc_path(ns, name), None)) is not None:
            raise exc
        with self._guard:
            return copy.deepcopy(self.body) if name == self.body["metadata"]["name"] else None

    def get(self, path: str) -> dict[str, Any] | None:
        return None

    def previous_log(self, *a: Any) -> str:
        return ""

    def apply_all(self, manifests: list[dict[str, Any]]) -> Any:
        self.applied.append(copy.deepcopy(manifests))
        return SimpleNamespace(conflicts=[], outcomes=[])

    def request(self, method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        assert method == "PATCH", (method, path)
        if self.fail is not None and (exc := self.fail(method, path, body)) is not None:
            raise exc
        with self._guard:
            version = (body.get("metadata") or {}).get("resourceVersion")
            if version is not None and version != self.body["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
            status_write = path.endswith("/status")
            patch = {k: v for k, v in body.items() if k != "metadata" and (k == "status") == status_write}
            patch["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k != "resourceVersion"}
            self.body = merge_patch(self.body, patch)
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
            if "spec" in patch:
                self.body["metadata"]["generation"] += 1
            return copy.deepcopy(self.body)

    def edit(self, change: Any) -> None:
        """A person's (or a GitOps tool's) write of the spec."""
        with self._guard:
            change(self.body["spec"])
            self.body["metadata"]["generation"] += 1
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)


def _vsvc(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": NAME, "namespace": NS, "uid": "vsvc-uid", "generation": 1, "resourceVersion": "1"},
        "spec": copy.deepcopy(spec),
        "status": {},
    }


def service(spec: dict[str, Any] = SPEC) -> StubKube:
    """A VLLMService reconciled once (baseline written, objects applied), as before any crash."""
    kube = StubKube(_vsvc(spec))
    reconcile_now(kube)
    return kube


def reconcile_now(kube: StubKube) -> None:
    """kopf's resume/update handler for the VLLMService as it is now."""
    reconcile.reconcile(kube, OperatorConfig(), kube.get_vsvc(NS, NAME), LOG)  # type: ignore[arg-type]


def terminated(message: str, finished: str, exit_code: int = 1) -> dict[str, Any]:
    return {
        "exitCode": exit_code,
        "reason": "Error",
        "message": message,
        "startedAt": "2026-11-30T02:50:00Z",
        "finishedAt": finished,
    }


def pod(
    kube: StubKube,
    *,
    restarts: int,
    state: dict[str, Any],
    last: dict[str, Any] | None = None,
    uid: str = "pod-1",
    template: str | None = None,
) -> dict[str, Any]:
    """A pod of the service's Deployment (its template hash: the flags deployed now, unless given) as the kubelet
    reports its vllm container: `state`, `lastState` and restartCount."""
    return {
        "metadata": {
            "name": f"svc-{uid}",
            "uid": uid,
            "labels": {resources.SERVICE_LABEL: NAME},
            "annotations": {resources.ENGINE_HASH: template or fp(deployed(parse(kube.body)))},
        },
        "spec": {},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": resources.CONTAINER,
                    "restartCount": restarts,
                    "state": state,
                    "lastState": {"terminated": last} if last else {},
                }
            ],
        },
    }


def backing_off(run: dict[str, Any]) -> dict[str, Any]:
    """The kubelet's view while it backs off the restart (CrashLoopBackOff): the run that died moved to lastState,
    restartCount as it was (kubelet's convertToAPIContainerStatuses changes no count for a Waiting state)."""
    return {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "last": run}


def look(kube: StubKube, the_pod: dict[str, Any], later: Any = None) -> None:
    """handlers.pod_changed for a pod of the service's own ReplicaSet."""
    crash = pods.find_crash(the_pod)
    assert crash is not None
    heal.handle_crash(
        kube,  # type: ignore[arg-type]
        OperatorConfig(),
        later or PendingLater(),  # type: ignore[arg-type]
        heal.Incident(NS, NAME, the_pod, crash),
        LOG,  # type: ignore[arg-type]
    )


def status(kube: StubKube) -> dict[str, Any]:
    return kube.body.get("status") or {}


def reasons() -> list[str]:
    return [e["reason"] for e in EVENTS]


def quiet(monkeypatch: Any) -> None:
    """Events into EVENTS, fresh Event budgets and crash-wait tables (each test's autouse fixture calls it)."""
    EVENTS.clear()
    monkeypatch.setattr(heal_apply, "event", lambda body, **k: EVENTS.append(k))
    monkeypatch.setattr(heal_events, "post_event", lambda body, **k: EVENTS.append(k))
    monkeypatch.setattr(heal_events, "_budget", heal_events.EventBudget())
    monkeypatch.setattr(heal_events, "_namespaces", heal_events.EventBudget(100, 10.0))
    monkeypatch.setattr(reconcile, "event", lambda body, **k: EVENTS.append(k))
    monkeypatch.setattr(heal, "_waiting", PerNamespace(heal.WAITING_CRASHES_PER_NAMESPACE))


def spec_patch_refused(status_code: int = 422, reason: str = "", transient_first: int = 0) -> Any:
    """An admission policy (or missing RBAC) that refuses every spec PATCH of the VLLMService; the first
    `transient_first` tries answer 503 instead (an overloaded API server: writes.retried tries 4 times)."""
    said = reason or "Unprocessable Entity: denied by policy platform-limits"
    left = {"transient": transient_first}

    def fail(method: str, path: str, body: Any) -> Exception | None:
        if method == "PATCH" and not path.endswith("/status") and "spec" in body:
            if left["transient"]:
                left["transient"] -= 1
                return ApiException(status=503, reason="Service Unavailable")
            return ApiException(status=status_code, reason=said)
        return None

    return fail


def crashed(kube: StubKube, uid: str, message: str, finished: str) -> dict[str, Any]:
    return pod(kube, uid=uid, restarts=0, state={"terminated": terminated(message, finished)})
