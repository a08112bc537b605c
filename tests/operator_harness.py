"""Run the real kopf operator in-process against kmock (the Kubernetes API emulator by kopf's
author). The test plays the Deployment controller and the kubelet: it creates the pods a
Deployment would and writes their container statuses."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf
import kubernetes

from kube_emulator import (  # noqa: F401 - tests import them from here
    HARNESS_AGENT,
    KOPF_HANDLED,
    NS,
    VSVC,
    ApplyInvalid,
    Emulator,
    Fault,
    setup_emulator,
)
from vllm_autoheal.api import GROUP, KIND, PLURAL, VERSION
from vllm_autoheal.kube import client as kclient
from vllm_autoheal.kube import resources
from vllm_autoheal.kube.config import OperatorConfig


# Quick retries, so that tests of failing writes finish in seconds (the defaults are for clusters).
class RecordingLog:
    """A handler's logger that keeps what it was told (info and warning alike)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, msg: str) -> None:
        self.lines.append(msg)

    info = warning


TEST_CONFIG = OperatorConfig(write_attempts=3, retry_delay_s=0.5, request_timeout_s=5.0)


@contextlib.asynccontextmanager
async def running_operator(config: OperatorConfig = TEST_CONFIG):
    """The operator in its own thread and event loop, as kopf embeds: its shutdown cancels the
    tasks of its own loop, which must not be the test's (that loop serves kmock). Its settings
    reach the handlers through kopf's memo, as `vllm-autoheal operator` passes them."""
    import vllm_autoheal.kube.handlers  # noqa: F401 - registers the handlers

    stop = threading.Event()
    memo = kopf.Memo(config=config)
    thread = threading.Thread(
        target=lambda: asyncio.run(kopf.operator(clusterwide=True, standalone=True, stop_flag=stop, memo=memo)),
        daemon=True,
    )
    thread.start()
    try:
        await asyncio.sleep(0.5)
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 20)
    # (else it would go on handling events beside the next operator a test starts)
    assert not thread.is_alive(), "the operator did not stop within 20 s"


class Cluster:
    """What a test does to and reads from the emulated cluster."""

    def __init__(self, kmock, namespace: str = NS) -> None:
        self.kmock = kmock
        self.namespace = namespace
        self.kube = kclient.Kube()
        self.kube.api = kubernetes.client.ApiClient()  # its own client, marked so RBAC checks leave it out
        self.kube.api.user_agent = HARNESS_AGENT
        self._uids = itertools.count(1)

    def in_namespace(self, namespace: str) -> Cluster:
        """The same cluster, seen from another namespace (another tenant's objects)."""
        other = copy.copy(self)
        other.namespace = namespace
        return other

    async def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        return await asyncio.to_thread(self.kube.request, method, path, body, content_type)

    def uid(self) -> str:
        return f"uid-{next(self._uids):04d}"

    async def create_vsvc(self, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "uid": self.uid(),
                "generation": 1,
                "annotations": annotations or {},
            },  # (a real server sets its own uid)
            "spec": spec,
        }
        await self.call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}", body)

    async def resume(self, name: str) -> None:
        """What the operator's resume handler does for the object after a restart: a reconcile of it as it
        is now, in a worker thread, as the operator (its requests counted as the operator's). Edits of
        labels and of other tools' annotations no longer run one (handlers._changes_what_reconcile_reads)."""
        import logging

        from vllm_autoheal.kube import reconcile

        body = await self.vsvc(name)
        assert body is not None, name
        operator = kclient.Kube(timeout=TEST_CONFIG.request_timeout_s)
        await asyncio.to_thread(reconcile.reconcile, operator, TEST_CONFIG, body, logging.getLogger("resume"))

    # Blocking reads, for checks that run in a worker thread (wait_for): the event loop serves kmock.
    def vsvc_now(self, name: str) -> dict[str, Any] | None:
        return self.kube.get_vsvc(self.namespace, name)

    def deployment_now(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}")

    def events_now(self, reason: str | None = None) -> list[dict[str, Any]]:
        items = self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/events").get("items", [])
        return [e for e in items if reason is None or e.get("reason") == reason]

    # The same, awaitable, for the test body.
    async def vsvc(self, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.vsvc_now, name)

    async def deployment(self, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.deployment_now, name)

    async def get(self, path: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.kube.get, path)

    async def not_healed(self, name: str) -> list[dict[str, Any]]:
        """The CrashNotHealed Events of the VLLMService, once there is one."""
        return await wait_for(
            lambda: [e for e in self.events_now("CrashNotHealed") if e["involvedObject"]["name"] == name],
            what="CrashNotHealed event",
        )

    async def settled(self, name: str) -> dict[str, Any]:
        """The VLLMService once the operator is done with its current spec: reconciled (its
        Deployment and Service applied, then its status written: observedGeneration), the
        Deployment's handler has written Ready, and kopf has recorded the spec as handled. These
        are separate writes, the status after the objects: a test that crashes a pod once the
        Deployment exists races them (the reconcile's status write may land after the heal's,
        and a fault a test injects may hit one of them instead of the write it is meant for)."""

        def done() -> dict[str, Any] | None:
            v = self.vsvc_now(name)
            if not v or not self.deployment_now(name):
                return None
            status = v.get("status") or {}
            handled = (v["metadata"].get("annotations") or {}).get(KOPF_HANDLED)
            return (
                v
                if status.get("observedGeneration") == v["metadata"].get("generation")
                and any(c.get("type") == "Ready" for c in status.get("conditions", []))
                and handled
                and json.loads(handled).get("spec") == v.get("spec")
                else None
            )

        return await wait_for(done, what=f"{name} reconciled")

    async def quiet(self, name: str, for_s: float = 1.5, timeout: float = 20.0) -> list[tuple[str, str]]:
        """The operator's writes to this service's objects (operator_writes) once none has come for
        `for_s` seconds; an operator that keeps writing (an update storm) fails. Waiting for the
        writes to stop, rather than for a fixed time, keeps a slow write on a loaded machine from
        being counted in the wrong window."""
        deadline = time.monotonic() + timeout
        last, since = operator_writes(self.kmock, name), time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            now = operator_writes(self.kmock, name)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= for_s:
                return now
        raise AssertionError(f"still writing after {timeout} s: {last[-10:]}")

    async def heal_recorded(self, name: str, heals: int = 1) -> dict[str, Any]:
        """The VLLMService once `heals` heals are recorded (healCount) and the last one applied: the
        status write comes first, the spec patch after it, and a loaded machine (CI) showed a test
        reading the spec between the two."""

        def healed() -> dict[str, Any] | None:
            v = self.vsvc_now(name)
            status = (v or {}).get("status") or {}
            in_flight = status.get("inFlight")
            done = (status.get("healCount") or 0) >= heals and (not in_flight or in_flight.get("applied"))
            return v if done else None

        return await wait_for(healed, what="heal")

    async def with_condition(self, name: str, type_: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The VLLMService and its condition `type_`, once written (another handler may write other
        conditions first)."""

        def written() -> tuple[dict[str, Any], dict[str, Any]] | None:
            v = self.vsvc_now(name) or {}
            found = [c for c in (v.get("status") or {}).get("conditions", []) if c.get("type") == type_]
            return (v, found[0]) if found else None

        return await wait_for(written, what=f"condition {type_}")

    async def first_heal(self, name: str, spec: dict[str, Any], pod: str, **crash: Any) -> dict[str, Any]:
        """Create a VLLMService, crash a pod of its Deployment once it is settled, and return the
        object once its first heal is recorded and applied."""
        await self.create_vsvc(name, spec)
        await self.settled(name)
        await self.crash_pod(name, pod, **crash)
        return await self.heal_recorded(name)

    async def deployment_available(self, name: str, available: int = 1) -> None:
        """Play the Deployment controller: the current template's pods are rolled out, `available`
        of them ready (0: they crashed)."""
        dep = await self.deployment(name)
        status = {
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": available,
            "availableReplicas": available,
            "observedGeneration": dep["metadata"].get("generation", 1),
        }
        await self.call(
            "PATCH", f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}", {"status": status}, kclient.MERGE
        )

    async def pending_pod(self, vsvc: str, pod: str, message: str, since: str = "2026-11-30T03:00:00Z") -> None:
        """A pod of the VLLMService's current template that the scheduler cannot place."""
        dep = await self.deployment(vsvc)
        template = copy.deepcopy(dep["spec"]["template"])
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": self.namespace,
                "uid": self.uid(),
                "labels": template["metadata"]["labels"],
                "annotations": template["metadata"]["annotations"],
                "ownerReferences": [await self.replica_set(vsvc, template)],
            },
            "spec": template["spec"],
            "status": unschedulable_status(message, since),
        }
        await self.call("POST", f"/api/v1/namespaces/{self.namespace}/pods", body)

    async def crash_pod(
        self,
        vsvc: str,
        pod: str,
        *,
        exit_code: int = 1,
        reason: str = "Error",
        message: str = "",
        restart_count: int = 1,
        uid: str | None = None,
        template_from: dict[str, Any] | None = None,
        ready: str | None = None,
        finished_at: str = "2026-11-30T03:00:00Z",
        owned: bool = True,
    ) -> str:
        """A pod of the VLLMService's Deployment whose vllm container just died. `ready`, when
        given, is the pod's Ready condition since then ("False" at the crash of a ready run).
        `owned`: controlled by a ReplicaSet of the Deployment, as the Deployment controller makes it
        (else a copy of its template: `kubectl debug --copy-to`, a decoy)."""
        dep = template_from or await self.deployment(vsvc)
        template = copy.deepcopy(dep["spec"]["template"])
        uid = uid or self.uid()
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": self.namespace,
                "uid": uid,
                "labels": template["metadata"]["labels"],
                "annotations": template["metadata"]["annotations"],
                "ownerReferences": [await self.replica_set(vsvc, template, template_from)] if owned else [],
            },
            "spec": template["spec"],
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "vllm",
                        "ready": False,
                        "restartCount": restart_count,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": reason,
                                "message": message,
                                "startedAt": "2026-11-30T02:50:00Z",
                                "finishedAt": finished_at,
                            }
                        },
                    }
                ],
            },
        }
        if ready is not None:
            body["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": ready}]
        existing = await self.get(f"/api/v1/namespaces/{self.namespace}/pods/{pod}")
        if existing is None:
            await self.call("POST", f"/api/v1/namespaces/{self.namespace}/pods", body)
        else:
            await self.call(
                "PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{pod}", {"status": body["status"]}, kclient.MERGE
            )
        return uid

    async def replica_set(
        self, vsvc: str, template: dict[str, Any], rendered: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The controller reference to the service's Deployment's ReplicaSet for this template, made as the
        Deployment controller makes it (named by a digest of the template, controlled by the Deployment).
        A pod runs only once its Deployment exists: where a test crashes a pod of a `rendered` Deployment
        its operator has not applied yet (a reconcile held), that Deployment is created first."""
        dep = await self.deployment(vsvc)
        if dep is None and rendered is not None and rendered.get("kind") == "Deployment":
            rendered = {**rendered, "metadata": {**rendered["metadata"], "uid": self.uid()}}  # (kmock gives none)
            await self.call("POST", f"/apis/apps/v1/namespaces/{self.namespace}/deployments", rendered)
            dep = await self.deployment(vsvc)
        assert dep is not None, f"{vsvc} has no Deployment to run its pods"
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        name = f"{dep['metadata'].get('name', vsvc)}-{digest}"
        path = f"/apis/apps/v1/namespaces/{self.namespace}/replicasets/{name}"
        rs = await self.get(path)
        if rs is None:
            owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": dep["metadata"].get("name", vsvc)}
            owner |= {"uid": dep["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
            meta = {"name": name, "namespace": self.namespace, "uid": f"rs-{digest}", "ownerReferences": [owner]}
            rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta, "spec": {"template": template}}
            await self.call("POST", f"/apis/apps/v1/namespaces/{self.namespace}/replicasets", rs)
        uid = rs["metadata"]["uid"]
        return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": uid, "controller": True}


def vsvc_path(name: str) -> str:
    return f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{NS}/vllmservices/{name}"


async def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last value: {json.dumps(last, default=str)[:2000]}")


def vllm_container(dep: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == resources.CONTAINER)


def flag(dep: dict[str, Any], name: str) -> str | None:
    cmd = vllm_container(dep)["command"]
    return cmd[cmd.index(name) + 1] if name in cmd else None


def operator_writes(kmock, name: str) -> list[tuple[str, str]]:
    """(method, path) of every write the operator (not the test) made to this service's objects."""
    writes = []
    for r in kmock._requests:
        method = str(getattr(r.method, "value", r.method)).upper()
        path = r.url.path.rstrip("/")
        if (
            r.headers.get("User-Agent", "") != HARNESS_AGENT
            and method in ("PATCH", "POST", "PUT")
            and (path.split("/")[-1] == name or f"/{name}/" in path)
        ):
            writes.append((method, path))
    return writes


def unschedulable_status(message: str, since: str) -> dict:
    """A pod's status while the scheduler finds no node for it (since `since`, RFC 3339)."""
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    return {"phase": "Pending", "conditions": [{**condition, "message": message, "lastTransitionTime": since}]}


@contextlib.contextmanager
def peak_timers(later: Any):
    """The most runs a kube.later.Later held pending at once while the block ran: yields a list, its one
    item set when the block ends."""
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], len(later._timers))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        stop.set()
        watcher.join()


def drain(later: Any, timeout: float = 3.0) -> None:
    """Wait until a kube.later.Later has no run pending (each may schedule another), then a moment more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and later._timers:
        time.sleep(0.01)
    time.sleep(0.05)


class PendingLater:
    """kube.later.Later's contract (one pending run per key; a newer call replaces it), never firing."""

    def __init__(self) -> None:
        self.pending: dict[str, object] = {}

    def run(self, key: str, delay: float, fn) -> None:
        self.pending[key] = fn
