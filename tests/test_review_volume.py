"""A hostile review by volume: what one tenant (who creates VLLMServices, pods and Deployments in its own
namespace, annotates them, and deletes and recreates them in a loop) can make the shared operator hold in
memory, do per event, write to the API server, or keep on its disk. Each defect found on the current code
is a strict xfail asserting the right behaviour; an attack the operator withstands, not covered by the
earlier reviews, is a plain test."""

from __future__ import annotations

import asyncio
import copy
import time
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_autoheal import metrics
from vllm_autoheal.api import Deployed, EngineArgs, HealIntent
from vllm_autoheal.kube import heal, resources, unschedulable
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import fp

from operator_harness import Emulator, PendingLater, unschedulable_status, wait_for
from samples import NOT_MEMORY, PLAIN_SPEC

LOG = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
GROUP_PATH = "/apis/vllm.autoheal.dev/v1alpha1"


# --- 1. memory held per service, after the service is gone ---------------------------------------------


@pytest.mark.kmock(cls=Emulator)
async def test_a_deleted_service_is_forgotten_by_the_phase_gauge(cluster, kmock):
    """Medium (the operator's memory and CPU, shared by every tenant; the metric every dashboard reads). A
    tenant creates and deletes VLLMServices in a loop (a CI job per commit does it unasked). Each one's status
    write puts `namespace/name` in metrics._phase_of; none is ever removed. 100,000 such services a day (a
    253-char namespace/name key each: the CRD allows 63 + 63) hold ~30 MB a day in a pod limited to 512 MiB,
    and every status write of every tenant (metrics.set_phase) scans the whole table four times."""
    ns = "churn"
    tenant = cluster.in_namespace(ns)
    names = [f"svc-{i}" for i in range(20)]
    for name in names:
        await tenant.create_vsvc(name, PLAIN_SPEC)
    for name in names:
        await tenant.settled(name)
    assert sum(1 for k in metrics._phase_of if k.startswith(f"{ns}/")) == len(names)
    for name in names:  # a plain `kubectl delete` (background propagation: no finalizer on the object)
        await tenant.call("DELETE", f"{GROUP_PATH}/namespaces/{ns}/vllmservices/{name}")
    await wait_for(lambda: all(tenant.vsvc_now(n) is None for n in names), what="the services deleted")
    await asyncio.sleep(2.0)  # kopf has seen every DELETED event by now
    left = sorted(k for k in metrics._phase_of if k.startswith(f"{ns}/"))
    gauge = sum(metrics.SERVICES.labels(phase=p)._value.get() for p in metrics.PHASES)
    assert left == [], f"{len(left)} deleted services still in metrics._phase_of; the gauge counts {gauge:g}"


def test_the_phase_gauge_costs_a_status_write_no_more_with_many_services(monkeypatch):
    """Medium (CPU every tenant's handlers share). Each reconcile, heal and rollout status write calls
    metrics.set_phase, which sums over metrics._phase_of once per phase. The table holds every service ever
    written (the test above), so a tenant's create/delete loop makes every other tenant's writes slower."""
    table = {f"{'n' * 63}/{'s' * 56}{i:07d}": "Running" for i in range(100_000)}
    monkeypatch.setattr(metrics, "_phase_of", table)
    started = time.perf_counter()
    for _ in range(20):
        metrics.set_phase("team-b/svc", "Healing")
    each_ms = (time.perf_counter() - started) / 20 * 1000
    metrics.set_phase("team-b/svc", None)
    assert each_ms < 1.0, f"one set_phase took {each_ms:.1f} ms with {len(table):,} services in the table"


# --- 2. threads and timers a tenant can make the operator hold -----------------------------------------


class ManyServices:
    """Kube for many VLLMServices of one namespace, each with an applied heal whose one pod is Pending."""

    def __init__(self, ns: str, intent: HealIntent, since: str) -> None:
        self.ns, self.intent, self.since = ns, intent, since

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        status = {"inFlight": self.intent.wire(), "baseline": {"gpuMemoryUtilization": 0.9}}
        spec = {**copy.deepcopy(PLAIN_SPEC), "heal": {"unschedulableSeconds": 86400}}
        meta = {"name": name, "namespace": ns, "uid": f"u-{name}", "generation": 1, "resourceVersion": "7"}
        kind = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService"}
        return {**kind, "metadata": meta, "spec": spec, "status": status}

    def get(self, path: str) -> dict[str, Any] | None:
        """Each service's Deployment and ReplicaSet, as their controllers make them."""
        kind, name = path.rsplit("/", 2)[-2:]
        if kind == "replicasets":
            service = name.removesuffix("-rs")
            return {
                "metadata": {
                    "name": name,
                    "uid": f"rs-{service}",
                    "ownerReferences": [_controller("Deployment", service, f"dep-{service}")],
                }
            }
        if kind == "deployments":
            return {
                "metadata": {
                    "name": name,
                    "uid": f"dep-{name}",
                    "ownerReferences": [_controller("VLLMService", name, f"u-{name}")],
                }
            }
        return None

    def request(self, method: str, path: str, body: Any = None, *a: Any, query: Any = None, **k: Any) -> Any:
        assert method == "GET" and path.endswith("/pods")
        name = dict(query)["labelSelector"].split("=", 1)[1]
        pod = {
            "metadata": {
                "name": f"{name}-0",
                "namespace": self.ns,
                "labels": {resources.SERVICE_LABEL: name},
                "annotations": {resources.ENGINE_HASH: fp(self.intent.target)},
                "ownerReferences": [_controller("ReplicaSet", f"{name}-rs", f"rs-{name}")],
            },
            "status": unschedulable_status("0/9 nodes are available: 9 Insufficient nvidia.com/gpu.", self.since),
        }
        return {"items": [pod]}


def _controller(kind: str, name: str, uid: str) -> dict[str, Any]:
    api = "vllm.autoheal.dev/v1alpha1" if kind == "VLLMService" else "apps/v1"
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def _applied_intent() -> HealIntent:
    model = PLAIN_SPEC["model"]
    before = Deployed(engine=EngineArgs(gpu_memory_utilization=0.9), model=model, memory_limit="32Gi")
    after = Deployed(engine=EngineArgs(gpu_memory_utilization=0.9, tensor_parallel_size=2), model=model)
    return HealIntent(
        crash="uid-1/vllm/1",
        cause="weights_load_oom",
        action="IncreaseTensorParallel",
        summary="tensor parallel 1 -> 2",
        target=after,
        previous=before,
        applied=True,
        time="2026-11-30T03:00:00Z",
    )


def test_the_unschedulable_looks_one_tenant_holds_are_bounded_per_namespace():
    """Medium (the operator's threads, memory and PID limit, shared by every tenant). A tenant whose services
    each have a heal rolled out and a Pending pod (a heal to TP 2 that no node can place, or bare Pending pods
    with the service label and the template's hash, which cost only a pod quota) sets
    heal.unschedulableSeconds to 86400: each service's look waits a day on a thread of its own. 300 services
    hold 300 threads (8 MiB of stack address space each, a PID each: a container's pids.max reached makes
    every Later.run raise "can't start new thread", every tenant's retries and looks with it)."""
    import threading
    from datetime import UTC, datetime

    from vllm_autoheal.kube.later import Later

    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube = ManyServices("loop", _applied_intent(), now)
    later = Later()
    before = threading.active_count()
    try:
        for i in range(300):
            unschedulable.check(kube, OperatorConfig(), later, "loop", f"svc-{i}", LOG)  # type: ignore[arg-type]
        held = threading.active_count() - before
        timers = len(later._timers)
    finally:
        later.stop()
    assert held <= 32 and timers <= 32, f"one namespace's 300 services hold {held} threads ({timers} timers)"


# --- 3. writes a tenant can multiply ---------------------------------------------------------------------


def test_events_of_a_crash_loop_are_aggregated_per_object(monkeypatch):
    """Medium (the API server's priority-and-fairness share of the operator's ServiceAccount, one flow for
    all tenants; kopf's single event poster, a FIFO every tenant's Events wait in). A tenant creates bare pods
    with the service label that exit 1 at once (restartPolicy Never; no GPU needed), as fast as its own API
    quota lets it, and deletes them. Each is a new crash: the operator records it and posts an Event on the
    VLLMService. The tenant's pod creates are its own flow; the operator's Events, reads and status writes
    are one flow shared with every other tenant's heals, so the tenant's loop queues (and under load, 429s)
    them."""
    from test_review_tenant import StubKube, _vsvc
    from vllm_autoheal.kube import crash as kcrash
    from vllm_autoheal.kube import heal_events
    from vllm_autoheal.kube.later import PerNamespace

    monkeypatch.setattr(heal, "_waiting", PerNamespace(heal.WAITING_CRASHES_PER_NAMESPACE))
    monkeypatch.setattr(kcrash, "_queued", PerNamespace(kcrash.QUEUED_CRASHES_PER_NAMESPACE))
    posted: list[str] = []
    monkeypatch.setattr(heal_events, "post_event", lambda body, type, reason, message: posted.append(reason))
    kube = StubKube(_vsvc({"baseline": {"gpuMemoryUtilization": 0.9}}, mode="PatchSpec"))
    reads = 0
    get_vsvc = kube.get_vsvc

    def counted_get(ns: str, name: str) -> Any:
        nonlocal reads
        reads += 1
        return get_vsvc(ns, name)

    kube.get_vsvc = counted_get  # type: ignore[method-assign]
    n = 200
    for i in range(n):
        pod = {"metadata": {"name": f"bare-{i}", "uid": f"u{i}", "labels": {resources.SERVICE_LABEL: "svc"}}}
        ended = f"2026-11-30T{3 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        crash = {"restartCount": 0, "exitCode": 1, "reason": "Error", "message": NOT_MEMORY, "finishedAt": ended}
        heal.handle_crash(kube, OperatorConfig(), PendingLater(), heal.Incident("team-a", "svc", pod, crash), LOG)  # type: ignore[arg-type]
    requests = reads + len(kube.patches)
    assert len(posted) <= 30, f"{n} crashes posted {len(posted)} Events ({requests} API requests besides)"


# --- 4. the operator's disk -----------------------------------------------------------------------------


def _disk_bytes(root: Any) -> int:
    """What the files and directories under `root` take on disk (as the kubelet's emptyDir accounting sees)."""
    from pathlib import Path

    return sum(p.lstat().st_blocks * 512 for p in Path(root).rglob("*"))


def test_the_hub_cache_on_disk_is_bounded(tmp_path):
    """High (every tenant: the operator pod is evicted, and on its restart kopf resumes the tenant's services,
    which fetch the same configs again, so it is evicted again). A tenant pushes 72 commits to a Hub repo of
    its own, each a config.json just under the 1 MiB the operator reads (padding in a field the memory model
    does not read), and creates one VLLMService per commit (spec.modelConfig.revision), or edits one service's
    revision 72 times. The per-namespace Hub bound limits lookups at once, not what they leave on disk; the
    in-memory cache is bounded (512 answers), the on-disk one is not."""
    import json

    from vllm_autoheal import model_source
    from vllm_autoheal.api import VLLMService

    from hub_server import CONFIGS, Hub, Repo

    llama = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    revisions = [f"{i:040x}" for i in range(1, 73)]
    hub = Hub(repos={})
    server, hub.url = hub.serve()
    cache = tmp_path / "hub"  # the chart: --hub-cache-dir /tmp/vllm-autoheal/hub, /tmp an emptyDir of 64Mi
    model_source.configure(model_source.HubSettings(endpoint=hub.url, cache_dir=str(cache), timeout_s=10))
    try:
        for i, revision in enumerate(revisions):
            padded = json.dumps({**llama, "_pad": f"{i}-" + "x" * (1_040_000 - len(json.dumps(llama)))}).encode()
            hub.repos["tenant/big"] = Repo({"config.json": padded}, revisions=(revision,), commit=revision)
            obj = VLLMService.model_validate(
                {
                    "metadata": {"name": f"s{i}", "namespace": "team-a"},
                    "spec": {"model": "tenant/big", "modelConfig": {"revision": revision}},
                }
            )
            model_source.for_service(obj, lambda path: None)
        held = _disk_bytes(cache)
    finally:
        model_source.configure(model_source.HubSettings())
        server.shutdown()
        server.server_close()
    assert held <= 32 << 20, f"the Hub cache holds {held / 2**20:.1f} MiB on disk after {len(revisions)} lookups"


# --- 5. work per event ----------------------------------------------------------------------------------


def _operator_requests(kmock) -> list[tuple[str, str]]:
    from operator_harness import HARNESS_AGENT

    return [
        (str(getattr(r.method, "value", r.method)).upper(), r.url.path)
        for r in kmock._requests
        if r.headers.get("User-Agent", "") != HARNESS_AGENT
    ]


@pytest.mark.kmock(cls=Emulator)
async def test_an_annotation_edit_the_operator_does_not_read_costs_no_reconcile(cluster, kmock):
    """Low-Medium (the operator's ServiceAccount's share of the API server, one flow for every tenant; kopf's
    workers). A tenant (or its GitOps tool, which stamps a sync annotation on each sync) writes an annotation
    of its VLLMService in a loop: one request of its own flow each. Each runs reconcile: the live objects read,
    pre-flight computed, the status compared, and kopf's record of the spec patched, all in the operator's
    flow. Only kopf's own record (one PATCH) is needed for an annotation nothing renders."""
    from vllm_autoheal.kube import client as kclient

    await cluster.create_vsvc("svc", PLAIN_SPEC)
    await cluster.settled("svc")
    await cluster.quiet("svc")
    before = len(_operator_requests(kmock))
    n = 20
    for i in range(n):
        await cluster.call(
            "PATCH",
            f"{GROUP_PATH}/namespaces/default/vllmservices/svc",
            {"metadata": {"annotations": {"team.example/build": str(i)}}},
            kclient.MERGE,
        )
        await asyncio.sleep(0.3)
    await cluster.quiet("svc")
    made = _operator_requests(kmock)[before:]
    reads = [path for method, path in made if method == "GET"]
    assert len(made) <= n + 2 and not reads, f"{n} annotation edits made {len(made)} operator requests: {made[:8]}"


@pytest.mark.parametrize(
    "old, new, runs",
    [
        ({"spec": {"model": "a"}}, {"spec": {"model": "b"}}, True),
        ({"spec": {"model": "a"}}, {"spec": {"model": "a"}, "metadata": {"labels": {"x": "1"}}}, False),
        ({"spec": {}, "metadata": {"annotations": {"argocd/sync": "1"}}}, {"spec": {}}, False),
        (None, {"spec": {}}, True),
        ({"spec": {}}, "not an object", True),
    ],
)
def test_only_an_edit_of_what_reconcile_reads_runs_it(old, new, runs):
    from vllm_autoheal.kube.handlers import _changes_what_reconcile_reads

    assert _changes_what_reconcile_reads(old=old, new=new) is runs


# --- per-namespace tables ---------------------------------------------------------------------------------


def test_the_log_read_slots_of_a_namespace_are_dropped_when_its_reads_are_done(monkeypatch):
    """Low (the operator's memory; only where tenants create namespaces: a namespace per pull request, or a
    self-service namespace controller). Each namespace whose crash's log was read keeps a BoundedSemaphore in
    crash._log_reads after its reads ended and after the namespace is gone."""
    from vllm_autoheal.kube import crash as kcrash

    monkeypatch.setattr(kcrash, "_log_reads", {})
    kube = SimpleNamespace(previous_log=lambda ns, pod, container: "")
    for i in range(5000):
        pod = {"metadata": {"name": "p", "uid": f"u{i}"}}
        incident = heal.Incident(f"pr-{i}", "svc", pod, {"restartCount": 1}, off_workers=True)
        kcrash._read_log(kube, incident)  # type: ignore[arg-type]
    assert len(kcrash._log_reads) <= 64, f"{len(kcrash._log_reads)} namespaces' log-read slots kept, none busy"


# --- defended ---------------------------------------------------------------------------------------------


def test_no_metric_has_a_label_a_tenant_can_choose():
    """Defended: the operator's metrics carry no namespace, name or pod label, and their label values come
    from closed sets (a cause a termination message names must be a known one, an action the planner's,
    a phase the API's), so no tenant can mint series by naming its services, pods or causes."""
    from vllm_autoheal.api.heal_policy import ALL_ACTIONS
    from vllm_autoheal.diagnosis import model as dmodel
    from vllm_autoheal.diagnosis import termination

    allowed = {"cause": {c.value for c in dmodel.Cause}, "action": set(ALL_ACTIONS), "phase": set(metrics.PHASES)}
    for metric in (metrics.INCIDENTS, metrics.HEALS, metrics.EXHAUSTED, metrics.HEAL_LATENCY, metrics.SERVICES):
        assert set(metric._labelnames) <= set(allowed), f"{metric._name} is labelled {metric._labelnames}"
    metrics.set_phase("team-a/svc-x", "Running")
    metrics.set_phase("team-a/svc-x", None)
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label != "le":  # (the histogram's buckets)
                    assert value in allowed[label], f"{sample.name}{{{label}={value!r}}}"
    forged = '{"autoheal": 1, "diagnosis": {"cause": "team-a/svc-123", "phase": "loading"}}'
    _doc, note = termination.read(forged)
    assert note, "a termination message naming a cause of its own is refused, so it labels no series"


def test_a_status_written_from_the_worst_a_tenant_can_feed_it_stays_small():
    """Defended: every list and string the operator writes into status is cut by the code (heals: the last 20,
    evidence 5 x 500, reason 2,000; observedCrashes 50; tried 64; conditions one per type, 1,000 a message;
    the intent's summary 2,048), whatever the crash says: 200 crashes of 253-character pod names, each with
    the most evidence, numbers and text a diagnosis can hold, leave a status under 256 KiB."""
    import json

    from vllm_autoheal.api import MAX_OBSERVED_CRASHES
    from vllm_autoheal.diagnosis import Diagnosis
    from vllm_autoheal.kube import status as st
    from vllm_autoheal.remedy import Remedy

    heals: list[dict[str, Any]] = []
    observed: list[str] = []
    conditions: list[dict[str, Any]] = []
    for i in range(200):
        pod = ("p" * 240) + f"{i:013d}"
        diag = Diagnosis(
            cause="kv_cache_insufficient",
            evidence=["e" * 5000] * 8,
            numbers={f"figure_{k}": 1.0e6 + k for k in range(32)},
        )
        remedy = Remedy("RaiseGpuMemoryUtilization", {"gpu_memory_utilization": 0.95}, "r" * 10_000)
        record = st.heal_record(pod, "u" * 36, "vllm", i, diag, remedy, {"gpu_memory_utilization": 0.9}, "n" * 5000)
        heals = st.append_heal(heals, record)
        observed = st.remember_crash(observed, st.crash_id("u" * 36 + str(i), "vllm", i), 1.8e9 + i)
        for type_ in (st.READY, st.MEMORY_FIT, st.HEALING, st.HEAL_BLOCKED, st.HEAL_EXHAUSTED):
            conditions = st.set_condition(conditions, type_, "True", "Reason", "m" * 50_000, 1)
    status = {"heals": heals, "observedCrashes": observed, "conditions": conditions}
    size = len(json.dumps(status))
    assert len(observed) == MAX_OBSERVED_CRASHES and len(conditions) == 5
    assert size < 256 * 1024, f"status of {size:,} bytes"


def test_the_phase_gauge_counts_each_service_once_in_its_latest_phase(monkeypatch):
    """The gauge moves by one service's change (the fix above): it still says what the table says."""
    monkeypatch.setattr(metrics, "_phase_of", {})
    for p in metrics.PHASES:
        metrics.SERVICES.labels(phase=p).set(0)
    first, second = metrics.PHASES[0], metrics.PHASES[1]
    for key, phase in [("a/x", first), ("a/y", first), ("a/x", second), ("a/x", second), ("a/y", None), ("a/z", None)]:
        metrics.set_phase(key, phase)
    counts = {p: metrics.SERVICES.labels(phase=p)._value.get() for p in metrics.PHASES}
    assert counts == {p: sum(1 for v in metrics._phase_of.values() if v == p) for p in metrics.PHASES}
    assert counts[second] == 1 and counts[first] == 0


def test_an_objects_event_budget_refills_and_is_its_own():
    """25 at once, then one per 5 minutes, per (object, reason): another object or reason has its own."""
    from vllm_autoheal.kube.heal_events import EventBudget

    now = [0.0]
    budget = EventBudget(clock=lambda: now[0])
    assert sum(budget.take("u1", "NotMemory") for _ in range(100)) == 25
    assert budget.take("u1", "Healed") and budget.take("u2", "NotMemory")
    now[0] += 299.0
    assert not budget.take("u1", "NotMemory")
    now[0] += 2.0
    assert budget.take("u1", "NotMemory") and not budget.take("u1", "NotMemory")
