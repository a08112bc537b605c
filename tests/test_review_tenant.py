"""A hostile tenant's review: what one tenant (who creates VLLMServices, pods and Deployments in its own
namespace and controls its container's output) can make the shared operator do. Each test is a defect
found on the current code, marked xfail(strict) until it is fixed."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from vllm_autoheal.api import Deployed, EngineArgs, HealIntent
from vllm_autoheal.kube import heal, resources, unschedulable
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import fp, parse

from operator_harness import PendingLater, unschedulable_status

NS = "team-a"
SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9},
    "resources": {"gpuProduct": "NVIDIA-L4", "limits": {"memory": "32Gi"}},
    "heal": {"backoffSeconds": 0, "bounds": {"maxMemoryLimit": "40Gi"}},
}
LOG = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)


def _intent(applied: bool = True) -> HealIntent:
    before = Deployed(engine=EngineArgs(gpu_memory_utilization=0.9), model=SPEC["model"], memory_limit="32Gi")
    after = Deployed(engine=EngineArgs(gpu_memory_utilization=0.9), model=SPEC["model"], memory_limit="40Gi")
    return HealIntent(
        crash="uid-1/vllm/1",
        cause="host_ram_oom",
        action="RaiseMemoryLimit",
        summary="memory limit 32Gi -> 40Gi",
        target=after,
        previous=before,
        applied=applied,
        time="2026-11-30T03:00:00Z",
    )


def _vsvc(status: dict[str, Any] | None = None, mode: str = "StatusOverrides") -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec["heal"]["mode"] = mode
    return {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": NS, "uid": "vsvc-uid", "generation": 1, "resourceVersion": "7"},
        "spec": spec,
        "status": status or {},
    }


class StubKube:
    """The few Kube calls the handlers make, on one VLLMService, counting what they read."""

    def __init__(self, body: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> None:
        self.body = body
        self.pods = pods or []
        self.lists = 0
        self.pods_read = 0
        self.patches: list[dict[str, Any]] = []
        self.fail_writes: int | None = None  # HTTP status for every status write

    def vsvc_path(self, ns: str, name: str) -> str:
        return f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{ns}/vllmservices/{name}"

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.body) if name == self.body["metadata"]["name"] else None

    def get(self, path: str) -> dict[str, Any] | None:
        """The service's Deployment and its ReplicaSet, as their controllers make them; nothing else."""
        ns, owner = self.body["metadata"]["namespace"], self.body["metadata"]
        if path == f"/apis/apps/v1/namespaces/{ns}/replicasets/{RS_REF['name']}":
            dep = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": "svc",
                "uid": "svc-dep-uid",
                "controller": True,
            }
            return {"metadata": {"name": RS_REF["name"], "uid": RS_REF["uid"], "ownerReferences": [dep]}}
        if path == f"/apis/apps/v1/namespaces/{ns}/deployments/svc":
            ref = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "name": owner["name"]}
            ref |= {"uid": owner["uid"], "controller": True}
            return {"metadata": {"name": "svc", "uid": "svc-dep-uid", "ownerReferences": [ref]}}
        return None

    def previous_log(self, *a: Any) -> str:
        return ""

    def apply_all(self, manifests: list[dict[str, Any]]) -> Any:
        return SimpleNamespace(conflicts=[], outcomes=[])

    def request(self, method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        if method == "GET" and path.endswith("/pods"):
            self.lists += 1
            self.pods_read += len(self.pods)
            return {"items": copy.deepcopy(self.pods)}
        if method == "PATCH":
            if self.fail_writes:
                raise ApiException(status=self.fail_writes, reason="Conflict")
            self.patches.append(body)
            status = body.get("status")
            if status is not None:
                merged = {**(self.body.get("status") or {}), **status}
                self.body["status"] = {k: v for k, v in merged.items() if v is not None}
            return copy.deepcopy(self.body)
        raise AssertionError(f"unexpected {method} {path}")


RS_REF = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "svc-rs", "uid": "svc-rs-uid", "controller": True}


def _pending_pod(i: int, template_hash: str, since: str, owned: bool = True) -> dict[str, Any]:
    """A Pending pod with the service's label and the heal's template hash; `owned`: run by the service's
    Deployment's ReplicaSet (StubKube answers the chain), else a copy of its labels (a decoy)."""
    return {
        "metadata": {
            "name": f"decoy-{i}",
            "namespace": NS,
            "uid": f"decoy-uid-{i}",
            "labels": {resources.SERVICE_LABEL: "svc"},
            "annotations": {resources.ENGINE_HASH: template_hash},
            "ownerReferences": [RS_REF] if owned else [],
        },
        "status": unschedulable_status("0/9 nodes are available: 9 node(s) didn't match Pod's node affinity.", since),
    }


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _own_reads(monkeypatch):
    """Each test its own reads shared by unschedulable's looks (a module's, else kept across tests)."""
    monkeypatch.setattr(unschedulable, "_recent", unschedulable.RecentReads())


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(unschedulable, "_recent", unschedulable.RecentReads(clock=clock))
    return clock


def test_pending_pods_of_one_tenant_cost_work_linear_in_their_number():
    """High (the operator's CPU, memory and worker threads, shared by every tenant). Pods that cannot be
    scheduled consume nothing but a pod quota: a tenant creates N of them with the service label and the
    template's engine hash (copied from its own Deployment, or its own pods' annotation), and annotates them
    in a loop (each annotation is a pod event). Every event of a Pending pod while a heal is in flight runs
    unschedulable.check, which GETs the VLLMService and LISTs every pod with the label, on one of kopf's 8
    worker threads, parsing the whole list (a rendered pod is kilobytes): N events read N x N pods."""
    from datetime import UTC, datetime

    intent = _intent(applied=True)
    body = _vsvc({"inFlight": intent.wire(), "baseline": {"gpuMemoryUtilization": 0.9}})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # waiting since now: the check looks again later
    n = 300
    kube = StubKube(body, [_pending_pod(i, fp(intent.target), now) for i in range(n)])
    later = PendingLater()
    for _event in range(n):  # one event per pod (each annotate, each scheduler retry, makes more)
        unschedulable.check(kube, OperatorConfig(), later, NS, "svc", LOG)  # type: ignore[arg-type]
    assert list(later.pending) == [f"blocked/{NS}"]
    assert kube.pods_read <= 20 * n, f"{n} pod events read {kube.pods_read:,} pods ({kube.lists} LISTs)"


LONG_AGO = "2026-11-30T03:00:00Z"  # (more than unschedulableSeconds, 300 s, before any run of these tests)


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stuck_heal(monkeypatch, pods: list[dict[str, Any]], applied: bool = True) -> tuple[StubKube, list[Any]]:
    """A heal in flight (a raise of the memory limit, which the policy reverts), and the Events it sends."""
    intent = _intent(applied=applied)
    events: list[Any] = []
    monkeypatch.setattr(unschedulable, "event", lambda body, **k: events.append(k))
    return StubKube(_vsvc({"inFlight": intent.wire(), "baseline": {"gpuMemoryUtilization": 0.9}}), pods), events


def _look(kube: StubKube, later: PendingLater, pod: dict[str, Any] | None = None) -> None:
    unschedulable.check(kube, OperatorConfig(), later, NS, "svc", LOG, pod)  # type: ignore[arg-type]


def _reverted(kube: StubKube) -> bool:
    return ((kube.body["status"].get("heals") or [{}])[-1]).get("action") == "RevertUnschedulable"


@pytest.mark.parametrize("burst", ["first event", "within a read that saw none stuck"])
def test_a_pod_stuck_long_enough_is_acted_on_by_the_event_that_shows_it(clock, monkeypatch, burst):
    """Sharing reads delays no decision: the first event of a burst reads fresh, and an event that a shared
    read would act on reads again and acts then, with no look left for later (a revert waits for none)."""
    stuck = _pending_pod(0, fp(_intent().target), LONG_AGO)
    kube, events = _stuck_heal(monkeypatch, [] if burst != "first event" else [stuck])
    later = PendingLater()
    if burst != "first event":
        _look(kube, later)  # (no pod stuck then: this read is shared by the events of the next second)
        kube.pods = [stuck]
    _look(kube, later, stuck)
    assert _reverted(kube) and [e["reason"] for e in events] == ["HealBlocked"]
    assert kube.lists == (1 if burst == "first event" else 2) and not later.pending


def test_a_shared_read_acts_on_no_pod_placed_since(clock, monkeypatch):
    """A decision that acts reads fresh: an event whose pod says it is stuck (an event older than the pod's
    placement) is not reverted on a shared read, nor on the fresh read that says the pod is placed."""
    template = fp(_intent().target)
    waiting = _pending_pod(1, template, _now())  # stuck since now: the read asks a look for later
    stale = _pending_pod(0, template, LONG_AGO)
    placed = {**stale, "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    kube, events = _stuck_heal(monkeypatch, [waiting, placed])
    later = PendingLater()
    _look(kube, later, waiting)
    _look(kube, later, stale)
    assert not _reverted(kube) and not events and kube.lists == 2
    assert list(later.pending) == [f"blocked/{NS}"]


def test_an_event_after_the_shared_reads_window_lists_again(clock, monkeypatch):
    pod = _pending_pod(0, fp(_intent().target), _now())
    kube, _ = _stuck_heal(monkeypatch, [pod])
    later = PendingLater()
    for _event in range(3):
        _look(kube, later, pod)
    assert kube.lists == 1
    clock.now += unschedulable.READ_FOR_S - 0.01
    _look(kube, later, pod)
    assert kube.lists == 1
    clock.now += 0.01
    _look(kube, later, pod)
    assert kube.lists == 2 and list(later.pending) == [f"blocked/{NS}"]


def test_an_event_a_shared_read_cannot_explain_is_looked_at_fresh_when_the_read_expires(clock, monkeypatch):
    """A read from before the heal was applied (or before its pods' template) must not lose the event of a
    pod it cannot see as the heal's: a fresh look is asked for when the read expires, and that one acts."""
    stuck = _pending_pod(0, fp(_intent().target), LONG_AGO)
    kube, _ = _stuck_heal(monkeypatch, [stuck], applied=False)
    later = PendingLater()
    _look(kube, later, stuck)  # (not applied yet: a look once the read expires, as the heal applies)
    assert list(later.pending) == [f"blocked/{NS}"] and not _reverted(kube)
    kube.body["status"]["inFlight"]["applied"] = True
    for _event in range(3):
        _look(kube, later, stuck)
    assert kube.lists == 0 and list(later.pending) == [f"blocked/{NS}"]
    clock.now += unschedulable.READ_FOR_S
    later.pending.pop(f"blocked/{NS}")()  # type: ignore[operator]
    assert _reverted(kube) and kube.lists == 1 and not later.pending


def test_shared_reads_are_bounded_and_let_go_when_old(clock):
    reads = unschedulable.RecentReads(limit=8, clock=clock)
    for i in range(100):  # (one tenant's many services)
        reads.put(f"{NS}/svc-{i}", unschedulable.Read(clock(), 0.0, None, None, None))
    assert len(reads) == 8 and reads.get(f"{NS}/svc-99") is not None and reads.get(f"{NS}/svc-0") is None
    clock.now += unschedulable.READ_FOR_S
    reads.put(f"{NS}/svc", unschedulable.Read(clock(), 0.0, None, None, None))
    assert len(reads) == 1 and reads.get(f"{NS}/svc-99") is None


def test_crashes_whose_status_write_fails_are_retried_within_a_per_namespace_bound(monkeypatch):
    """Medium (the operator's threads and the API server's load, shared by every tenant). A tenant whose
    status writes conflict (a script writing its own VLLMService between the operator's read and write
    answers 409 to each; an object too large to grow answers 5xx) and whose bare pods with the service
    label (no GPU needed: a container that exits 1 after writing a launcher-shaped termination message)
    crash-loop, gets one threading.Timer per crash, each re-reading the object and re-diagnosing every
    retry_delay_s (10 s), and deferring itself again when it fails. The edit wait (WAITING_CRASHES_PER_NAMESPACE)
    and the off-worker log queue (QUEUED_CRASHES_PER_NAMESPACE) are bounded per namespace; this is not."""
    from vllm_autoheal.kube import crash as kcrash
    from vllm_autoheal.kube.later import PerNamespace

    from samples import KV_TERMINATION

    monkeypatch.setattr(heal, "_waiting", PerNamespace(heal.WAITING_CRASHES_PER_NAMESPACE))
    monkeypatch.setattr(kcrash, "_queued", PerNamespace(kcrash.QUEUED_CRASHES_PER_NAMESPACE))
    cfg = OperatorConfig(write_attempts=1, retry_delay_s=10.0)
    later = PendingLater()

    def crash_in(ns: str, i: int, kube: StubKube) -> None:
        pod = {
            "metadata": {"name": f"bare-{i}", "uid": f"{ns}-u{i}", "labels": {resources.SERVICE_LABEL: "svc"}},
            "spec": {},
        }
        crash = {"restartCount": 3, "exitCode": 1, "reason": "Error", "message": KV_TERMINATION}
        heal.handle_crash(kube, cfg, later, heal.Incident(ns, "svc", pod, crash), LOG)  # type: ignore[arg-type]

    body = _vsvc({"baseline": {"gpuMemoryUtilization": 0.9}}, mode="PatchSpec")
    loop = StubKube(body)
    loop.fail_writes = 409
    for i in range(300):
        crash_in(NS, i, loop)
    deferred = [key for key in later.pending if key.startswith(f"crash/{NS}-")]
    assert len(deferred) <= 32, f"{len(deferred)} crashes of one namespace hold a timer thread each"


@pytest.mark.kmock(cls=__import__("operator_harness").Emulator)
async def test_a_tenants_conflicting_writes_do_not_hold_the_shared_workers_asleep(kmock):
    """High (every tenant's reconciles and heals share kopf's 8 worker threads). A tenant makes each status
    write of its own VLLMService conflict (a script that writes the object, e.g. an annotation, as fast as
    the API server takes it: the operator's read-then-write with resourceVersion answers 409) and has 16
    pods crash (bare pods with the service label do: no GPU needed). Each crash's handler tries its write 4
    times and sleeps 3.5 s in between on its worker; with 16 such crashes every worker sleeps for two
    rounds, and another namespace's crash, explained by the launcher, waits ~7 s for a worker to heal it.
    (The log-read tests of test_tenant_isolation.py bound the same delay to under 4.5 s.)"""
    import asyncio
    import time

    from operator_harness import Cluster, running_operator, setup_emulator
    from samples import KV_TERMINATION, PLAIN_SPEC

    setup_emulator(kmock)
    production = OperatorConfig(request_timeout_s=5.0)  # the defaults: 4 tries, 0.5 s first pause
    async with running_operator(production):
        cluster = Cluster(kmock)
        other = cluster.in_namespace("team-b")
        await cluster.create_vsvc("many", PLAIN_SPEC)
        await other.create_vsvc("other", PLAIN_SPEC)
        await cluster.settled("many")
        await other.settled("other")
        kmock.fail("PATCH", "/vllmservices/many/status", 409, times=100000)
        for i in range(16):
            await cluster.crash_pod("many", f"many-{i}", message=KV_TERMINATION)
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await other.crash_pod("other", "other-a", message=KV_TERMINATION)
        await other.heal_recorded("other")
        waited = time.monotonic() - started
        assert waited < 5.0, f"another tenant's heal waited {waited:.1f} s for a worker"  # (before: ~7 s)


def test_a_tenant_without_a_token_never_gets_a_gated_config_another_tenants_token_fetched(tmp_path):
    """Low-Medium (confidentiality across tenants). Tenant A names a gated (or private) repo with its token
    (hfTokenSecretRef); the operator downloads config.json into its one Hub cache. Tenant B names the same
    repo with no token. While the Hub answers, B gets "is gated"; when it does not answer in time (a slow
    Hub, or a network blip: any error that is not an HTTP answer) from_hub takes the copy A's token put in
    the cache (hf_hub_download(local_files_only=True) checks no access), and B's pre-flight and heals are
    sized from the private model's shape (its MemoryFit message tells B the weights per GPU and KV size).
    The in-memory cache keys answers by the token's digest for exactly this reason; the disk cache is not."""
    import base64
    import threading
    import time

    from vllm_autoheal import model_source
    from vllm_autoheal.api import VLLMService

    from hub_server import GATED_TOKEN, Hub, default_repos

    hub = Hub(repos=default_repos())
    server, hub.url = hub.serve()
    hub.cache = str(tmp_path / "hub-cache")
    gated_model = "meta-llama/Llama-3.1-70B-Instruct"

    def service(ns: str, token: bool) -> VLLMService:
        spec: dict[str, Any] = {"model": gated_model}
        if token:
            spec["hfTokenSecretRef"] = {"name": "hf", "key": "token"}
        return VLLMService.model_validate({"metadata": {"name": "s", "namespace": ns}, "spec": spec})

    secret = {"data": {"token": base64.b64encode(GATED_TOKEN.encode()).decode()}}
    a_get = {"/api/v1/namespaces/team-a/secrets/hf": secret}.get
    model_source.configure(model_source.HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=0.25))
    try:
        deadline = time.monotonic() + 10
        a = model_source.for_service(service("team-a", True), a_get)
        while a.pending and time.monotonic() < deadline:
            time.sleep(0.1)
            a = model_source.for_service(service("team-a", True), a_get)
        assert a.ok and a.shape.layers == 80  # tenant A, with its token
        b = model_source.for_service(service("team-b", False), lambda path: None)
        while b.pending and time.monotonic() < deadline:
            time.sleep(0.1)
            b = model_source.for_service(service("team-b", False), lambda path: None)
        assert not b.ok and "is gated" in (b.error or "")  # tenant B, while the Hub answers
        model_source._cache.clear()  # (as ERROR_TTL_S, 60 s, later: B's "is gated" answer expired)
        hub.stall = threading.Event()  # the Hub stops answering in time
        b = model_source.for_service(service("team-b", False), lambda path: None)
        while b.pending and time.monotonic() < deadline:
            time.sleep(0.1)
            b = model_source.for_service(service("team-b", False), lambda path: None)
        assert not b.ok, f"tenant B, with no token, got the gated model's config: {b.shape.layers} layers"
    finally:
        model_source.configure(model_source.HubSettings())
        if hub.stall is not None:
            hub.stall.set()
        server.shutdown()
        server.server_close()


def test_an_admitted_spec_fits_the_annotation_kopf_keeps_it_in():
    """Low (the tenant's own service; no other tenant is slowed). handlers.configure keeps kopf's diffbase,
    the whole spec, in the annotation vllm.autoheal.dev/last-handled-configuration, and the API server
    refuses a write that makes an object's annotations exceed 256 KiB (ValidateObjectMeta, custom resources
    included). A spec with ten 32 KiB env values is admitted (the CRD's maxLength is per value, and 128 of
    them are allowed) and its Deployment renders, but kopf's merge patch of that annotation is refused with
    422, which kopf's patching.patch_obj does not catch on a merge patch ("Event processing has failed with
    an unrecoverable error"): kopf never records the spec as handled, and the handler progress it keeps in
    annotations too (a TemporaryError's retry: a name conflict, a model config still pending, a heal to
    finish) is never stored. Checked here with the CRD's rules offline (validation.admit) and the diffbase
    storage the operator configures kopf with (fixed: it keeps a large value as its digest,
    kube/diffbase.py). kubectl's own copy (last-applied-configuration) is the tenant's write, refused to the
    tenant at apply time, not to the operator later.
    """
    import kopf

    from vllm_autoheal import validation
    from vllm_autoheal.kube import handlers

    spec = copy.deepcopy(SPEC)
    spec["env"] = [{"name": f"PROMPT_{i}", "value": "x" * 32768} for i in range(10)]
    obj = {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": NS, "uid": "u"},
        "spec": spec,
    }
    admitted, problems = validation.admit(obj)
    assert problems == []  # the API server takes it (the CRD's rules, offline)
    assert resources.render(parse(admitted))  # and the operator renders its objects
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=kopf.Memo())
    storage = settings.persistence.diffbase_storage
    patch = kopf.Patch()
    storage.store(body=kopf.Body(admitted), patch=patch, essence=storage.build(body=kopf.Body(admitted)))
    size = sum(len(k) + len(v) for k, v in patch["metadata"]["annotations"].items())
    assert size <= 256 * 1024, f"kopf's annotation would be {size:,} bytes; the API server takes at most 262,144"


def test_a_crash_already_handled_is_not_handled_again_however_many_pods_crashed(monkeypatch):
    """Medium (the operator's workers and the API server, and the evidence in status and Events). A tenant
    with 51 or more crashed pods (bare pods with the service label need no GPU) pushes its first crashes out
    of status.observedCrashes. A crashed pod keeps its lastState.terminated while it runs again, and any
    event of the pod (the tenant annotates it, as often as the API server takes writes) finds that crash
    unrecorded: handle_crash diagnoses it again (a 2 MiB log read and its classification where the
    message is not the launcher's), writes another heal record and posts its Events again. A new crash costs
    the tenant a kubelet back-off (up to 5 minutes a pod); a replayed one costs a pod annotation."""
    from vllm_autoheal.kube import crash as kcrash
    from vllm_autoheal.kube.later import PerNamespace

    from samples import NOT_MEMORY

    monkeypatch.setattr(heal, "_waiting", PerNamespace(heal.WAITING_CRASHES_PER_NAMESPACE))
    monkeypatch.setattr(kcrash, "_queued", PerNamespace(kcrash.QUEUED_CRASHES_PER_NAMESPACE))
    posted: list[str] = []
    monkeypatch.setattr(heal.heal_events, "post", lambda vsvc, diag, remedy, pod, note, **k: posted.append(pod))
    body = _vsvc({"baseline": {"gpuMemoryUtilization": 0.9}}, mode="PatchSpec")
    kube = StubKube(body)
    cfg = OperatorConfig(write_attempts=1)

    def event_of(i: int) -> None:  # an event of pod i, whose container crashed once and runs again
        pod = {
            "metadata": {"name": f"bare-{i}", "uid": f"u{i}", "labels": {resources.SERVICE_LABEL: "svc"}},
            "spec": {},
        }
        ended = f"2026-11-30T03:{i // 60:02d}:{i % 60:02d}Z"  # (the kubelet's; pod i crashed i seconds in)
        crash = {"restartCount": 0, "exitCode": 1, "reason": "Error", "message": NOT_MEMORY, "finishedAt": ended}
        heal.handle_crash(kube, cfg, PendingLater(), heal.Incident(NS, "svc", pod, crash), LOG)  # type: ignore[arg-type]

    for i in range(60):
        event_of(i)
    assert len(posted) == 60  # each crash handled once
    for _round in range(3):  # the tenant annotates each of its pods, in turn, three times
        for i in range(60):
            event_of(i)
    assert len(posted) == 60, f"60 crashes handled {len(posted)} times ({posted.count('bare-0')} times bare-0's)"
