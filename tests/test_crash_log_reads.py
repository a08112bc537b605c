"""How many crash-log reads the operator makes at once, and where: kopf's worker threads are shared by
every tenant, and each read holds up to client.LOG_LIMIT_BYTES for up to client.LOG_BUDGET_S."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from vllm_autoheal.kube import crash
from vllm_autoheal.kube.later import PerNamespace

from operator_harness import PendingLater

KOPF_WORKERS = 8  # handlers.configure: settings.execution.max_workers


class StalledLogs:
    """previous_log that hangs until released, counting the reads in progress."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.now = self.most = 0
        self._guard = threading.Lock()

    def previous_log(self, namespace: str, pod: str, container: str) -> str:
        with self._guard:
            self.now += 1
            self.most = max(self.most, self.now)
        self.release.wait(10)
        with self._guard:
            self.now -= 1
        return ""


def incident(ns: str, i: int, off_workers: bool = False) -> SimpleNamespace:
    return SimpleNamespace(namespace=ns, pod_name=f"p{i}", crash_id=f"{ns}/{i}", off_workers=off_workers)


def _start(kube: StalledLogs, incidents: list[SimpleNamespace]) -> tuple[list[threading.Thread], list[str]]:
    busy: list[str] = []

    def read(inc: SimpleNamespace) -> None:
        try:
            crash._read_log(kube, inc)  # type: ignore[arg-type]
        except crash.LogReadsBusy:
            busy.append(inc.crash_id)

    threads = [threading.Thread(target=read, args=(inc,), daemon=True) for inc in incidents]
    for t in threads:
        t.start()
    return threads, busy


@pytest.fixture(autouse=True)
def fresh_slots(monkeypatch):
    monkeypatch.setattr(crash, "_log_reads", {})
    monkeypatch.setattr(crash, "_queued", PerNamespace(crash.QUEUED_CRASHES_PER_NAMESPACE))


def test_a_tenant_with_many_namespaces_does_not_hold_every_worker():
    """High (one tenant holds up every other's heal). The bound on reads on kopf's workers was per
    namespace (2): a tenant whose stalled replicas crash in 4 namespaces held all 8 workers for a
    read's whole budget, and another tenant's crash (even one the launcher explained, needing no
    read) waited for a worker. Reads on the workers must leave some free, however many namespaces."""
    kube = StalledLogs()
    threads, _ = _start(kube, [incident(f"team-{n}", i) for n in range(8) for i in range(3)])
    time.sleep(0.3)
    held = kube.now
    kube.release.set()
    for t in threads:
        t.join(5)
    assert held <= KOPF_WORKERS // 2, f"{held} of kopf's {KOPF_WORKERS} workers held by log reads"


def test_queued_reads_stay_within_their_bound_however_long_they_wait():
    """Medium (the operator's memory, shared by every tenant). Off kopf's workers, a crash waited at
    most QUEUED_READ_WAIT_S for one of its namespace's 4 read slots, then read anyway: a crash loop of
    hundreds of replicas had, after the wait, hundreds of reads of up to 2 MiB each at once. A read
    ends within its budget, so the turn comes: it must wait for it."""
    kube = StalledLogs()
    threads, _ = _start(kube, [incident("loop", i, off_workers=True) for i in range(12)])
    time.sleep(0.5)
    held = kube.most
    kube.release.set()
    for t in threads:
        t.join(5)
    assert held <= crash.QUEUED_READS_PER_NAMESPACE, f"{held} reads at once in one namespace"


def test_a_crash_queued_for_its_log_read_is_not_dropped_by_another_deferral_of_it(monkeypatch):
    """The queue's run shared the key `crash/<id>` with the edit wait's and the failed write's
    deferrals of the same crash: one of those replaced it before it fired, and the crash stayed in
    the queue for ever (each later event found it queued and did nothing): never recorded."""
    from vllm_autoheal.kube import heal

    def busy(*_):
        raise crash.LogReadsBusy("team")

    monkeypatch.setattr(heal, "diagnose", busy)
    monkeypatch.setattr(heal.ModelLookup, "of", classmethod(lambda cls, kube, obj: None))
    body = {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": "team", "generation": 1},
        "spec": {"model": "m"},
    }
    kube = SimpleNamespace(get_vsvc=lambda ns, name: body)
    pod = {"metadata": {"name": "svc-a", "uid": "u1", "labels": {}}, "spec": {}}
    inc = heal.Incident("team", "svc", pod, {"restartCount": 1})
    later = PendingLater()
    heal.handle_crash(kube, SimpleNamespace(), later, inc, SimpleNamespace(info=print))  # type: ignore[arg-type]
    assert inc.crash_id in crash._queued and len(later.pending) == 1
    later.run(f"crash/{inc.crash_id}", 0.5, lambda: None)  # e.g. the edit wait's look at the same crash
    queued_run = [fn for key, fn in later.pending.items() if not key.startswith("crash/")]
    assert queued_run, "the queued read's run was replaced: the crash stays queued and is never looked at"


def test_one_namespaces_crash_loop_queues_a_bounded_number_of_reads(monkeypatch):
    """Medium (the operator's threads and memory, shared by every tenant). Each crash beyond its
    namespace's share of the workers was queued on a timer thread of its own, waiting for one of 4
    read slots however long: a tenant's bare pods (no GPU needed) carrying the service label, each
    crash-looping with no termination message, queued a thread per crash, without end, while the
    reads drained 4 at a time. Beyond a bound the crash is left to the pod's next event."""
    from vllm_autoheal.kube import heal

    def busy(*_):
        raise crash.LogReadsBusy("team")

    monkeypatch.setattr(heal, "diagnose", busy)
    monkeypatch.setattr(heal.ModelLookup, "of", classmethod(lambda cls, kube, obj: None))

    def body(ns):
        return {
            "apiVersion": "vllm.autoheal.dev/v1alpha1",
            "kind": "VLLMService",
            "metadata": {"name": "svc", "namespace": ns, "generation": 1},
            "spec": {"model": "m", "heal": {"backoffSeconds": 0}},
        }

    kube = SimpleNamespace(get_vsvc=lambda ns, name: body(ns))
    later = PendingLater()

    def crash_in(ns: str, i: int) -> heal.Incident:
        pod = {"metadata": {"name": f"svc-{i}", "uid": f"u{i}", "labels": {}}, "spec": {}}
        inc = heal.Incident(ns, "svc", pod, {"restartCount": 1})
        heal.handle_crash(kube, SimpleNamespace(), later, inc, SimpleNamespace(info=print))  # type: ignore[arg-type]
        return inc

    for i in range(500):
        crash_in("loop", i)
    queued = [key for key in later.pending if key.startswith("crash-log/")]
    assert len(queued) <= 32, f"{len(queued)} crashes of one namespace queued, a thread each"
    other = crash_in("quiet", 0)
    assert other.crash_id in crash._queued, "another namespace's crash found the queue full"
    # a crash left out is queued on a later event of its pod, once the queue has room
    left_out = crash_in("loop", 499)
    assert left_out.crash_id not in crash._queued
    for key in queued:
        crash.unqueue_off_workers(key.removeprefix("crash-log/"))
    assert crash_in("loop", 499).crash_id in crash._queued
