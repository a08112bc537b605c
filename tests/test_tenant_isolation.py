"""One tenant's crashing pods must not hold up another tenant's heal: the real kopf operator
against kmock, with the shared resources (kopf's worker threads, the API client) under load."""

from __future__ import annotations

import asyncio
import time

import pytest

from operator_harness import Emulator, PendingLater, wait_for
from samples import KV_TERMINATION, PLAIN_SPEC

pytestmark = pytest.mark.kmock(cls=Emulator)
SPEC = {**PLAIN_SPEC, "heal": {"backoffSeconds": 0}}


async def test_a_tenant_whose_crash_logs_stall_does_not_delay_another_tenants_heal(cluster, kmock):
    # Tenant A: more replicas than kopf has worker threads crash without a termination message,
    # and the kubelet never finishes sending their logs (a node that hangs). Tenant B: one crash
    # the launcher explained. Each log read was given the request timeout, and urllib3 repeated a
    # GET that timed out 3 more times (2 minutes a pod with the default 30 s), then the error
    # lost A's crash; B waited for a worker all that time. Now a log read has a budget (the
    # request timeout here, 5 s), and A's crashes are recorded without their logs.
    await cluster.create_vsvc("stuck", SPEC)
    await cluster.create_vsvc("other", SPEC)
    await cluster.settled("stuck")
    await cluster.settled("other")
    kmock.fail("GET", "/log", delay=120, times=1000)
    for i in range(10):
        await cluster.crash_pod("stuck", f"stuck-{i}")
    await asyncio.sleep(1.0)
    started = time.monotonic()
    await cluster.crash_pod("other", "other-a", message=KV_TERMINATION)
    await cluster.heal_recorded("other")
    assert time.monotonic() - started < 8.0
    await wait_for(
        lambda: len(((cluster.vsvc_now("stuck") or {}).get("status") or {}).get("observedCrashes") or []) == 10,
        what="every crash of the tenant whose logs stall recorded",
    )


async def test_a_tenant_with_more_stalled_log_reads_than_workers_leaves_the_others_theirs(cluster, kmock, monkeypatch):
    # Tenant A: twice as many crashing replicas as kopf has workers, every log read stalling for its
    # whole budget. Each read held a worker: B's crash queued behind two rounds of them. Now one
    # namespace's reads hold at most crash.LOG_READS_PER_NAMESPACE workers; the rest wait their
    # turn off kopf's workers, and every crash of A is still recorded.
    from vllm_autoheal.kube import client

    # The bound is relative to the budget, so that load on the machine running the tests does not
    # decide: queued behind two rounds of reads B waited at least 2 budgets; its own work is far less.
    budget = 5.0
    monkeypatch.setattr(client, "LOG_BUDGET_S", budget)
    other = cluster.in_namespace("team-b")
    await cluster.create_vsvc("many", SPEC)
    await cluster.settled("many")
    reads = kmock.fail("GET", "/log", delay=120, times=1000)
    for i in range(16):
        await cluster.crash_pod("many", f"many-{i}")
    for i in range(16):  # the pod's further events of the same crash: it is read once, all the same
        await cluster.crash_pod("many", f"many-{i}", finished_at="2026-11-30T03:00:01Z")
    await asyncio.sleep(0.5)
    started = time.monotonic()
    await other.create_vsvc("other", SPEC)
    await other.settled("other")
    await other.crash_pod("other", "other-a", message=KV_TERMINATION)
    await other.heal_recorded("other")
    assert time.monotonic() - started < 1.5 * budget
    await wait_for(
        lambda: len(((cluster.vsvc_now("many") or {}).get("status") or {}).get("observedCrashes") or []) == 16,
        what="every crash of the tenant whose logs stall recorded",
        timeout=60,
    )
    assert reads.hits == 16


def test_crashes_waiting_for_a_persons_edit_are_bounded_per_namespace(monkeypatch):
    """Medium (the operator's threads and the API server's load, shared by every tenant). A crash
    seen while a person's edit has no new baseline yet waits for it: a timer thread that reads the
    object again every 0.5 s for up to a minute. A tenant whose edit's reconcile never writes its
    baseline (a name conflict, objects the server refuses) and whose bare pods with the service
    label (no GPU needed) crash-loop got a thread and 120 reads per crash, without bound."""
    from types import SimpleNamespace

    from vllm_autoheal.kube import heal
    from vllm_autoheal.kube.later import PerNamespace

    monkeypatch.setattr(heal, "_waiting", PerNamespace(heal.WAITING_CRASHES_PER_NAMESPACE))

    def body(ns: str) -> dict:
        return {
            "apiVersion": "vllm.autoheal.dev/v1alpha1",
            "kind": "VLLMService",
            "metadata": {"name": "svc", "namespace": ns, "generation": 2},
            "spec": {"model": "m", "engine": {"gpuMemoryUtilization": 0.9}},
            # the edit (0.8 -> 0.9) has no new baseline yet
            "status": {"baseline": {"gpuMemoryUtilization": 0.8}, "effective": {"gpuMemoryUtilization": 0.8}},
        }

    kube = SimpleNamespace(get_vsvc=lambda ns, name: body(ns))
    later = PendingLater()

    def crash_in(ns: str, i: int) -> None:
        pod = {"metadata": {"name": f"svc-{i}", "uid": f"{ns}-u{i}", "labels": {}}, "spec": {}}
        inc = heal.Incident(ns, "svc", pod, {"restartCount": 1})
        heal.handle_crash(kube, SimpleNamespace(), later, inc, SimpleNamespace(info=print))  # type: ignore[arg-type]

    assert heal.person_edited(heal.parse(body("loop")))
    for i in range(300):
        crash_in("loop", i)
    waiting = [key for key in later.pending if key.startswith("crash/loop-")]
    assert len(waiting) <= 32, f"{len(waiting)} crashes of one namespace wait for the edit, a thread each"
    crash_in("quiet", 0)
    assert any(key.startswith("crash/quiet-") for key in later.pending), "another namespace found no room"
