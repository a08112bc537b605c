"""Hostile review (session 43): crash-consistency, concurrency and fairness of the operator's heal path
(kube/heal.py, heal_apply.py, pods.py, reconcile.py, writes.py): the operator dying or an API call failing
between two writes of a heal, one crash seen in several of the kubelet's views, a person's edit racing a heal,
and the heal budget and backoff.

The core API cannot run here: tests/heal_stub.py's VLLMService store (merge patches under the resourceVersion
precondition) stands in for it, and the heal is driven through heal.handle_crash and
reconcile.reconcile, as kopf's handlers call them. Each defect is a strict xfail asserting the right
behaviour; the plain tests pin attacks that held and were not pinned yet."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from heal_stub import (
    HEALED_LEN,
    NAME,
    NS,
    backing_off,
    look,
    pod,
    quiet,
    reasons,
    reconcile_now,
    service,
    status,
    terminated,
)
from vllm_autoheal.kube import heal, heal_apply, pods, resources
from vllm_autoheal.kube.heal_apply import deployed, fp, parse

from operator_harness import PendingLater
from samples import KV_TERMINATION, NOT_MEMORY, RUNTIME_OOM, SPEC


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    quiet(monkeypatch)


# --- (1) one crash, two identities: the kubelet's CrashLoopBackOff view -----------------------------------------
#
# A run that died is reported three ways: state.terminated (restartCount k), then, while the kubelet backs off
# the restart, state.waiting with the run in lastState and restartCount still k, then, once the next run
# started, state.running with the run in lastState and restartCount k+1. pods.find_crash takes any lastState
# run as restartCount-1: right for the third view, one too low for the second.


def test_a_crash_first_seen_while_the_kubelet_backs_off_is_not_taken_for_the_run_before():
    """Severity: medium (a heal delayed by the kubelet's backoff, up to 5 minutes and one more full model load with
    the failing flags; the heal record names the wrong run). Input: run 0 of the pod died of a NCCL-ish error
    (not memory: recorded, nothing changed); run 1 dies of a KV-cache shortage; the operator sees that crash first
    in its CrashLoopBackOff view (the operator restarted, or its watch re-listed, while the pod backed off: in a
    crash loop the pod spends most of its time there).
    Now: find_crash says restartCount 0 -> crash id pod-1/vllm/0, the first crash's: crash_seen, nothing done.
    Right: the run in lastState beside a Waiting state is restartCount's own run (pod-1/vllm/1): healed now.
    Fix: identify a run by what the kubelet gives it (lastState/state.terminated.containerID, or its startedAt/
    finishedAt, which observedCrashes already stores), not by arithmetic on restartCount."""
    kube = service()
    look(kube, pod(kube, restarts=0, state={"terminated": terminated(NOT_MEMORY, "2026-11-30T03:00:00Z")}))
    assert [h["action"] for h in status(kube)["heals"]] == ["NoChange"]
    run1 = terminated(KV_TERMINATION, "2026-11-30T04:00:00Z")
    view = backing_off(run1)
    look(kube, pod(kube, restarts=1, state=view["state"], last=view["last"]))
    assert kube.body["spec"]["engine"].get("maxModelLen") == HEALED_LEN, kube.body["spec"]["engine"]
    assert status(kube)["healCount"] == 1
    assert any(c.startswith("pod-1/vllm/1@") for c in status(kube)["observedCrashes"])


def test_one_crash_seen_backing_off_and_then_restarted_is_recorded_once():
    """Severity: low-medium (each crash of a loop the operator first sees backing off is counted twice: duplicate
    records push real ones out of the 20 kept, duplicate Events spend the service's Event budget, and a GiveUp is
    reported twice). Input: the operator starts (or re-lists) while the pod backs off run 1's restart, then the
    kubelet starts run 2. Now: two records, restartCount 0 and 1, for one run (the same finishedAt). Right: one."""
    kube = service()
    run1 = terminated(NOT_MEMORY, "2026-11-30T04:00:00Z")
    view = backing_off(run1)
    look(kube, pod(kube, restarts=1, state=view["state"], last=view["last"]))
    look(kube, pod(kube, restarts=2, state={"running": {"startedAt": "2026-11-30T04:00:10Z"}}, last=run1))
    assert [(h["restartCount"], h["action"]) for h in status(kube)["heals"]] == [(1, "NoChange")]
    assert reasons().count("NotMemory") == 1, reasons()


# --- (2) the heal backoff: a crash held back is healed at any later event ---------------------------------------


def test_a_crash_held_back_by_the_heal_backoff_is_not_healed_hours_later():
    """Severity: medium (an unplanned rollout of a healthy service, at the next operator upgrade or pod event, for a
    stale crash). Input: heal.backoffSeconds 30 (the default). A KV heal rolls out; 5 s later a healed pod dies of a
    runtime OOM (a burst) - within the backoff, so handle_crash logs 'will look again on the next restart' and
    records nothing. The kubelet restarts it and it serves, Ready, for hours. Then the operator is upgraded: kopf
    lists the pod (running, the OOM in lastState).
    Now: the old crash is not in observedCrashes and no longer within the backoff: healed - utilization lowered,
    the Deployment rolled, healCount 2.
    Right: a crash the backoff held back is accounted for when it is held back (recorded as seen, with why, as a
    crash of flags already changed is): the pod's next crash heals, a replay of this one never does.
    Fix: in handle_crash, record the crash (record with expected='' and a note) instead of returning bare."""
    spec = {**SPEC, "heal": {**SPEC["heal"], "backoffSeconds": 30}}
    kube = service(spec)
    look(kube, pod(kube, restarts=0, state={"terminated": terminated(KV_TERMINATION, "2026-11-30T03:00:00Z")}))
    assert status(kube)["healCount"] == 1
    burst = terminated(RUNTIME_OOM, "2026-11-30T03:05:00Z")
    look(kube, pod(kube, uid="pod-2", restarts=0, state={"terminated": burst}))  # within the backoff
    assert status(kube)["healCount"] == 1
    engine = copy.deepcopy(kube.body["spec"]["engine"])
    for record in kube.body["status"]["heals"]:  # hours later: the backoff long over
        record["time"] = "2020-01-01T00:00:00Z"
    serving = {"running": {"startedAt": "2026-11-30T03:05:10Z"}}
    look(kube, pod(kube, uid="pod-2", restarts=1, state=serving, last=burst))  # the operator's restart
    assert kube.body["spec"]["engine"] == engine, kube.body["spec"]["engine"]
    assert status(kube)["healCount"] == 1


# --- (3) a spec patch the API server refuses -------------------------------------------------------------------


def test_a_heal_whose_spec_patch_is_refused_is_dropped_and_later_crashes_still_heal():
    """Severity: medium-high (healing of the service stops entirely, silently, after an Event that says it was
    healed). Input: PatchSpec (default); the platform runs an admission policy on VLLMServices stricter than the
    tenant's heal bounds (Kyverno/Gatekeeper/a ValidatingAdmissionPolicy: say, no max_model_len change without a
    ticket label): the heal's spec PATCH is answered 422. Now: handle_crash raises ApiException(422) after posting
    OOMDetected and Healed; inFlight {applied: false} stays; the next crash (another pod, a runtime OOM) raises the
    same 422 before it is looked at (observedCrashes keeps one entry); reconcile raises it too.
    Right: a refused heal is dropped (inFlight cleared, a HealRefused-style Warning with the server's message, the
    heal record says so, and no 'Healed'); later crashes are recorded and healed within what is allowed; reconcile
    works. Fix: in complete, treat 400/403/422 on the spec patch as a refusal: _drop plus an Event, then carry on."""
    kube = service()

    def admission(method: str, path: str, body: Any) -> Exception | None:
        if method == "PATCH" and not path.endswith("/status") and "spec" in body:
            return ApiException(status=422, reason="Unprocessable Entity: denied by policy platform-limits")
        return None

    kube.fail = admission
    raised: list[str] = []
    for uid, message, finished in (
        ("pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"),
        ("pod-2", RUNTIME_OOM, "2026-11-30T03:10:00Z"),
    ):
        try:
            look(kube, pod(kube, uid=uid, restarts=0, state={"terminated": terminated(message, finished)}))
        except ApiException as exc:
            raised.append(f"{uid}: {exc.status}")
    try:
        reconcile_now(kube)
    except ApiException as exc:
        raised.append(f"reconcile: {exc.status}")
    assert raised == [], raised
    assert "Healed" not in reasons(), reasons()
    assert len(status(kube)["observedCrashes"]) == 2, status(kube)["observedCrashes"]
    assert (status(kube).get("inFlight") or {}).get("crash") != "pod-1/vllm/0"


# --- (4) a person's revert between the heal's spec write and its status mark ------------------------------------


def test_a_persons_revert_after_the_heals_spec_write_is_an_edit_even_before_the_heal_is_marked_applied():
    """Severity: medium (the operator overwrites a person's spec; with Flux/Argo CD self-heal the two fight).
    README: 'a person's revert to the flags the heal started from is an edit as soon as the heal's patch is in'.
    Input: PatchSpec; a KV heal writes spec.engine.maxModelLen 524160 (and its healed-engine annotation); the status
    write that marks it applied fails four times (503: the API server is overloaded), so complete defers it by
    retry_delay_s. Meanwhile Flux reverts the spec to the Git copy (no maxModelLen). kopf's update handler runs
    reconcile for that revert.
    Now: reconcile sees no edit (the spec equals inFlight.previous and the heal is unapplied), calls complete, whose
    _spec_change writes the heal's spec again; the revert is lost, inFlight is marked applied.
    Right: once the heal's spec patch is in (the object carries its healed-engine annotation for the target, or the
    spec's generation moved past the heal's write), a spec back at the previous flags is a person's edit: new
    baseline, the heal dropped. Fix: record the generation the heal's spec write produced in inFlight (or read the
    annotation) and have person_edited/_spec_change treat previous's flags after that write as an edit."""
    kube = service()
    failures = {"left": 4}

    def overloaded(method: str, path: str, body: Any) -> Exception | None:
        marks = method == "PATCH" and path.endswith("/status")
        if marks and ((body.get("status") or {}).get("inFlight") or {}).get("applied") is True and failures["left"]:
            failures["left"] -= 1
            return ApiException(status=503, reason="Service Unavailable")
        return None

    kube.fail = overloaded
    later = PendingLater()
    look(kube, pod(kube, restarts=0, state={"terminated": terminated(KV_TERMINATION, "2026-11-30T03:00:00Z")}), later)
    assert kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN and not status(kube)["inFlight"].get("applied")
    assert list(later.pending) == [f"complete/{NS}/{NAME}"]
    kube.edit(lambda spec: spec.update(engine=copy.deepcopy(SPEC["engine"])))  # the revert to the Git copy
    reconcile_now(kube)
    assert "maxModelLen" not in kube.body["spec"]["engine"], kube.body["spec"]["engine"]
    assert status(kube).get("inFlight") is None
    assert "maxModelLen" not in status(kube)["baseline"]


# --- (5) the heal budget in PatchSpec mode ------------------------------------------------------------------------


def test_a_persons_memory_limit_edit_starts_the_heal_budget_over_in_patch_spec_mode_too():
    """Severity: medium (after a person fixes what the heals could not, the operator still refuses to heal: the next
    crash gives up at once). README: attempts are 'reset only by a person's edit of the spec'; 'HealExhausted stays
    a condition until a person edits the spec'. Input: PatchSpec, maxAttempts 1; one heal, then the healed pods
    crash again: HealExhausted. The person raises limits.memory 32Gi -> 40Gi (engine untouched).
    Now: attempts 1, tried ['kv_cache_insufficient/LowerMaxModelLen'], HealExhausted True, phase Failed.
    Right: as in StatusOverrides mode, a person's change of the memory limit, model or GPU is an edit: new baseline,
    attempts 0, HealExhausted cleared. Fix: mark the heal's whole target (engine, model, memory limit, GPUs) in the
    healed annotation and compare in_spec's fingerprint with it, not the engine alone."""
    spec = {**SPEC, "heal": {**SPEC["heal"], "mode": "PatchSpec", "maxAttempts": 1}}
    kube = service(spec)
    look(kube, pod(kube, restarts=0, state={"terminated": terminated(KV_TERMINATION, "2026-11-30T03:00:00Z")}))
    reconcile_now(kube)
    look(
        kube, pod(kube, uid="pod-2", restarts=0, state={"terminated": terminated(RUNTIME_OOM, "2026-11-30T03:10:00Z")})
    )
    assert any(c["type"] == "HealExhausted" and c["status"] == "True" for c in status(kube)["conditions"])
    kube.edit(lambda spec: spec["resources"]["limits"].update(memory="40Gi"))
    reconcile_now(kube)
    assert status(kube)["attempts"] == 0, (status(kube)["attempts"], status(kube).get("tried"))
    assert not any(c["type"] == "HealExhausted" for c in status(kube)["conditions"]), status(kube)["conditions"]


# --- (6) an API answer lost, an API error at the first read -----------------------------------------------------


def test_a_heal_whose_record_landed_but_whose_answer_was_lost_is_finished():
    """Severity: low-medium (the heal is delayed to the pod's next status change - in the running view of a crash,
    its next crash or readiness - and is never announced). Input: the status PATCH that records the heal is applied
    by the API server; the response times out (urllib3 ReadTimeoutError, a transient error: retried at once).
    Now: the retry reads the object, finds the crash in observedCrashes, writes nothing; handle_crash returns:
    inFlight {applied: false}, spec unchanged, later.pending empty, no Events. Right: the recorded heal in flight is
    finished (complete, idempotent) or a retry of it is scheduled. Fix: after update_status, when the fresh status
    holds an unapplied inFlight for this crash, call complete (as handle_crash does at its start)."""
    kube = service()
    lost = {"left": 1}
    real = kube.request

    def request(method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        out = real(method, path, body, *a, **k)
        if path.endswith("/status") and (body.get("status") or {}).get("inFlight") and lost["left"]:
            lost["left"] -= 1
            raise urllib3.exceptions.ReadTimeoutError(None, path, "Read timed out.")  # type: ignore[arg-type]
        return out

    kube.request = request  # type: ignore[method-assign]
    later = PendingLater()
    look(kube, pod(kube, restarts=0, state={"terminated": terminated(KV_TERMINATION, "2026-11-30T03:00:00Z")}), later)
    assert status(kube)["healCount"] == 1  # (recorded)
    finished = kube.body["spec"]["engine"].get("maxModelLen") == HEALED_LEN
    assert finished or f"complete/{NS}/{NAME}" in later.pending, (status(kube)["inFlight"], list(later.pending))


def test_a_transient_error_reading_the_service_at_a_crash_is_tried_again():
    """Severity: low-medium (a heal delayed to the pod's next event by one API hiccup: an etcd leader election, an
    API server restart). Input: the GET of the VLLMService answers 503 once. Now: ApiException(503) raised,
    observedCrashes empty, later.pending empty. Right: as for the record's write, a transient error defers the look
    (later.run under crash/<id>). The same holds for the ReplicaSet reads of ownership.run_by_service in
    handlers.pod_changed. Fix: wrap the look (reads included) in the transient-error deferral."""
    kube = service()
    hiccup = {"left": 1}

    def unavailable(method: str, path: str, body: Any) -> Exception | None:
        if method == "GET" and hiccup["left"]:
            hiccup["left"] -= 1
            return ApiException(status=503, reason="Service Unavailable")
        return None

    kube.fail = unavailable
    later = PendingLater()
    the_pod = pod(kube, restarts=0, state={"terminated": terminated(KV_TERMINATION, "2026-11-30T03:00:00Z")})
    try:
        look(kube, the_pod, later)
    except ApiException:
        pass
    assert status(kube).get("healCount") == 1 or any(k.startswith("crash/") for k in later.pending), list(later.pending)


# --- attacks that held -------------------------------------------------------------------------------------------


def test_an_operator_death_between_the_heals_spec_write_and_its_mark_heals_once(monkeypatch):
    """Held: the operator dies after the spec patch, before the status mark. On restart kopf's resume runs reconcile
    (which finishes the heal: spec as written is the target, so no second write) and re-lists the pod, whose crash
    is seen in both of its views: one heal, one step, attempts 1, the baseline the person's flags."""

    class Died(BaseException):
        pass

    def die(*a: Any) -> Any:
        raise Died

    kube = service()
    the_pod = pod(kube, restarts=0, state={"terminated": terminated(KV_TERMINATION, "2026-11-30T03:00:00Z")})
    with monkeypatch.context() as m:
        m.setattr(heal_apply, "_mark_applied", die)
        with pytest.raises(Died):
            look(kube, the_pod)
    assert kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN and not status(kube)["inFlight"].get("applied")
    reconcile_now(kube)  # the restart: resume
    look(kube, the_pod)  # ...and the pod re-listed, then restarted by the kubelet
    look(
        kube,
        pod(
            kube,
            restarts=1,
            state={"running": {}},
            last=the_pod["status"]["containerStatuses"][0]["state"]["terminated"],
        ),
    )
    s = status(kube)
    assert kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN
    assert (s["healCount"], s["attempts"], len(s["heals"]), s["inFlight"]["applied"]) == (1, 1, 1, True)
    assert "maxModelLen" not in s["baseline"]


def test_two_replicas_crashing_at_once_from_the_same_flags_take_one_step():
    """Held: two pods of one service die of the same shortage and are looked at on two of kopf's workers at once:
    the second record's fresh read sees the flags moved (expected fingerprint) and only notes its crash."""
    kube = service({**SPEC, "replicas": 2})
    template = fp(deployed(parse(kube.body)))
    pods_ = [
        pod(
            kube,
            uid=f"pod-{i}",
            restarts=0,
            template=template,
            state={"terminated": terminated(KV_TERMINATION, "2026-11-30T03:00:00Z")},
        )
        for i in (1, 2)
    ]
    errors: list[BaseException] = []

    def run(p: dict[str, Any]) -> None:
        try:
            look(kube, p)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in pods_]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    s = status(kube)
    assert (s["healCount"], s["attempts"], len(s["observedCrashes"])) == (1, 1, 2), s
    assert kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN


# --- the fixes' own rules, pinned --------------------------------------------------------------------------------


def _status(restarts: int, state: dict[str, Any], last: dict[str, Any], latest: str | None) -> dict[str, Any]:
    cs = {"name": resources.CONTAINER, "restartCount": restarts, "state": state, "lastState": {"terminated": last}}
    if latest:
        cs["containerID"] = latest
    return {"status": {"containerStatuses": [cs]}}


@pytest.mark.parametrize(
    ("state", "latest", "run"),
    [
        ({"waiting": {"reason": "CrashLoopBackOff"}}, "containerd://dead", 3),  # backing off: the dead run is latest
        ({"waiting": {}}, "containerd://next", 2),  # the next run created, not started: its count
        ({"running": {"startedAt": "2026-11-30T04:00:10Z"}}, "containerd://next", 2),
        ({"waiting": {"reason": "CrashLoopBackOff"}}, None, 3),  # no ids: the kubelet's backoff reason tells
        ({"waiting": {"reason": "ContainerCreating"}}, None, 2),
    ],
)
def test_a_last_state_run_is_numbered_by_whether_it_is_still_the_latest_container(state, latest, run):
    last = {**terminated(NOT_MEMORY, "2026-11-30T04:00:00Z"), "containerID": "containerd://dead"}
    restarts = 3
    assert pods.find_crash(_status(restarts, state, last, latest))["restartCount"] == run


def test_one_end_is_one_run_under_any_count():
    """One run seen under two counts (its end the same) is one; an id seen is seen, whatever end a later view
    gives it (a run's end never moves; a count the kubelet reused after a node restart is left unhealed, the
    safe side)."""
    seen = heal.st.remember_crash([], "pod-1/vllm/0", 1000.0)
    assert heal.st.crash_seen(seen, "pod-1/vllm/0", 1000.0)
    assert heal.st.crash_seen(seen, "pod-1/vllm/0", 5000.0)
    assert heal.st.crash_seen(seen, "pod-1/vllm/1", 1000.0)  # (the same end: the same run)
    assert not heal.st.crash_seen(seen, "pod-1/vllm/1", 5000.0)
    assert not heal.st.crash_seen(seen, "pod-1/vllm-sidecar/0", 1000.0)  # (another container)
    assert not heal.st.crash_seen(seen, "pod-2/vllm/1", 1000.0)  # (another pod)
    assert heal.st.crash_seen(["pod-1/vllm/0"], "pod-1/vllm/0", 1000.0)  # (an entry without its end: by id)
