"""Hostile review (session 43, round 4) of ed56302: resized_by_person blocking the PatchSpec heal's spec patch and
person_edited's in-flight exception, 'Healed' posted by the completion whose status mark lands, the person's-edit
drop returning 'dropped', and _records matching an unschedulable revert's record.

Driven through heal.handle_crash, heal_apply.complete, unschedulable.blocked and reconcile.reconcile on the stub
VLLMService store of heal_stub. Each defect is a strict xfail asserting the right behaviour; the plain tests pin
attacks that held."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from heal_stub import (
    EVENTS,
    HEALED_LEN,
    LOG,
    NAME,
    NS,
    StubKube,
    crashed,
    look,
    parse,
    pod,
    quiet,
    reasons,
    reconcile_now,
    service,
    spec_patch_refused,
    status,
    terminated,
)
from vllm_autoheal.kube import heal, heal_apply, resources, unschedulable
from vllm_autoheal.kube.config import OperatorConfig

from operator_harness import PendingLater
from samples import KV_TERMINATION, NO_GPU, SPEC


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    quiet(monkeypatch)
    monkeypatch.setattr(unschedulable, "event", lambda body, **k: EVENTS.append(k))


def oom_killed(kube: StubKube, uid: str = "pod-1") -> dict[str, Any]:
    run = {**terminated("", "2026-11-30T03:00:00Z", 137), "reason": "OOMKilled"}
    return pod(kube, uid=uid, restarts=0, state={"terminated": run})


def block(kube: StubKube) -> None:
    """unschedulable.blocked for the heal in flight (its pods Pending: no node has the GPU and memory)."""
    obj = parse(kube.body)
    vsvc = kube.get_vsvc(NS, NAME)
    unschedulable.blocked(kube, OperatorConfig(), PendingLater(), obj, vsvc, obj.status.in_flight, NO_GPU, LOG)  # type: ignore[arg-type]


# --- (A) a person's resize no edit sees: every later heal dropped ---------------------------------------------


def test_a_persons_memory_limit_change_before_any_heal_leaves_the_service_healable():
    """Severity: high (a regression of ed56302, in the default mode: after a person's change of the memory limit,
    model or GPU, the service is never healed again; each crash spends an attempt until HealExhausted). Input:
    PatchSpec (default), no pre-flight Fix, never healed; a person raises the memory limit 32Gi -> 36Gi; reconcile;
    then a KV-cache crash. Now: person_edited is False (no healed-spec annotation; status.effective == spec.engine:
    its last branch sees nothing), so baselineFor stays the 32Gi one; the crash's heal is recorded (attempts 1),
    _spec_change returns None (resized_by_person: baselineFor differs, no healed-spec digest), _complete takes the
    fresh spec for a person's racing edit and drops the heal: OOMDetected only, engine unchanged, attempts kept,
    and so for every later crash. Right: the heal is patched in (maxModelLen 524160) and announced. Fix: make the
    two agree: in PatchSpec mode person_edited must count a resize no operator patch explains (baselineFor !=
    sized_for and no healed-spec digest matching the spec) as an edit, so reconcile takes a new baseline."""
    kube = service()
    kube.edit(lambda s: s["resources"]["limits"].update(memory="36Gi"))
    reconcile_now(kube)
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    assert kube.body["spec"]["engine"].get("maxModelLen") == HEALED_LEN, (kube.body["spec"], reasons())
    assert reasons() == ["OOMDetected", "Healed"]


def test_a_service_healed_by_an_older_version_with_a_raised_limit_stays_healable():
    """Severity: medium-high (upgrade: services whose memory limit or model an older version's heal wrote into the
    spec, i.e. RaiseMemoryLimit or a quantized fallback between df5444f and f8dbb35, never heal again). Input: the
    spec's limit raised 32Gi -> 39322Mi by an older version's heal (only the healed-engine annotation; baselineFor
    the 32Gi one; attempts 1); the upgraded operator reconciles (no edit: the engine is the healed-engine one);
    a KV-cache crash. Now: resized_by_person is True (no healed-spec annotation at all), the heal is dropped as a
    person's racing edit: OOMDetected only, attempts 2, and nothing resets it. Right: the heal is patched in.
    Fix: in resized_by_person, with no healed-spec annotation, fall back to person_edited's older-version rule
    (healed-engine annotation == spec.engine: the operator's), or re-take baselineFor on upgrade."""
    kube = service()
    kube.body["spec"]["resources"]["limits"]["memory"] = "39322Mi"
    kube.body["metadata"]["generation"] += 1
    engine = json.dumps(parse(kube.body).spec.engine.wire(), sort_keys=True)  # (as those versions wrote it)
    kube.body["metadata"]["annotations"] = {heal_apply.HEALED_ENGINE: engine}
    kube.body["status"].update(attempts=1, healCount=1)
    reconcile_now(kube)
    assert not heal.person_edited(parse(kube.body)) and status(kube)["attempts"] == 1
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    assert kube.body["spec"]["engine"].get("maxModelLen") == HEALED_LEN, (kube.body["spec"], reasons())


# --- (B) 'Healed' lost where the mark's answer is lost ---------------------------------------------------------


def test_a_mark_whose_answer_is_lost_is_announced_once():
    """Severity: low (a heal made and rolled out, its Events ending at OOMDetected). marked.clear() (ed56302, the
    round-3 fix of a double 'Healed') also clears it for a try that landed: writes.retried retries a transient
    error (a 504, a read timeout) after the write may have landed; the retry reads the heal marked and writes
    nothing. Input: PatchSpec; a KV-cache crash; the mark's PATCH lands, then answers 504. Now: no 'Healed'.
    Right: one. Fix: clear `marked` only where the previous try was a 409 (nothing landed), or record in the mark
    who made it (a per-try token in inFlight) and announce where the mark found is this call's."""
    kube = service()
    request, lost = kube.request, []

    def answer_lost(method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        out = request(method, path, body, *a, **k)
        marking = ((body or {}).get("status") or {}).get("inFlight") or {}
        if path.endswith("/status") and marking.get("applied") and not lost:
            lost.append(True)
            raise ApiException(status=504, reason="Gateway Timeout")
        return out

    kube.request = answer_lost  # type: ignore[method-assign]
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    assert lost and status(kube)["inFlight"]["applied"] and kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN
    assert reasons().count("Healed") == 1, reasons()


# --- (C) a refused RevertUnschedulable gives back an attempt it never took ------------------------------------


def test_a_refused_revert_unschedulable_leaves_the_counters_as_they_were():
    """Severity: low-medium (the budget: the blocked RaiseMemoryLimit, made and still in the spec, is uncounted;
    one more heal than maxAttempts, healCount short). _revert adds attempts/healCount only for a real remedy; for
    RevertUnschedulable (nothing left to try) it adds none, but _drop(refused) decrements both for any matched
    record. Input: PatchSpec; OOMKilled healed by RaiseMemoryLimit (32Gi -> 39322Mi; attempts 1, healCount 1);
    its pods unschedulable, nothing else to try: RevertUnschedulable, whose spec patch a policy refuses (422).
    Now: attempts 0, healCount 0. Right: 1, 1 (the revert's record refused is fine). Fix: in _drop(refused), give
    back nothing where intent.action == REVERT (or record on the intent whether it counted)."""
    kube = service({**SPEC, "heal": {"backoffSeconds": 60, "bounds": {"maxMemoryLimit": "48Gi"}}})
    look(kube, oom_killed(kube))
    assert [h["action"] for h in status(kube)["heals"]] == ["RaiseMemoryLimit"]
    kube.fail = spec_patch_refused()
    block(kube)
    heals = status(kube)["heals"]
    assert heals[-1]["action"] == heal_apply.REVERT and "HealRefused" in reasons()
    assert kube.body["spec"]["resources"]["limits"]["memory"] == "39322Mi"
    assert (status(kube)["attempts"], status(kube)["healCount"]) == (1, 1), status(kube)


# --- (D) a revert with a real remedy: 'Healed' in one mode only ------------------------------------------------


def test_a_revert_with_a_real_remedy_is_announced_in_status_overrides_mode_too():
    """Severity: low (Events differ by mode for the same heal: attempts and healCount count it in both). Input:
    cpuOffloadGb 8; OOMKilled healed by RaiseMemoryLimit; its pods unschedulable; the revert plans
    LowerCpuOffload. Now: PatchSpec posts OOMDetected, Healed, HealBlocked, Healed; StatusOverrides stops at
    HealBlocked (PatchSpec pinned by the held test below). Right: a second 'Healed' in both. Fix: in unschedulable.blocked, post 'Healed' for a real-remedy
    revert where the mode is StatusOverrides (its record is the heal, as _look does)."""
    engine = {"gpuMemoryUtilization": 0.9, "cpuOffloadGb": 8}
    heal_spec = {"mode": "StatusOverrides", "backoffSeconds": 0, "bounds": {"maxMemoryLimit": "48Gi"}}
    kube = service({**SPEC, "engine": engine, "heal": heal_spec})
    look(kube, oom_killed(kube))
    block(kube)
    assert [h["action"] for h in status(kube)["heals"]] == ["RaiseMemoryLimit", "LowerCpuOffload"]
    assert reasons() == ["OOMDetected", "Healed", "HealBlocked", "Healed"]


# --- attacks that held -----------------------------------------------------------------------------------------


def test_a_raised_limit_heal_is_no_resize_before_its_mark_nor_in_the_next_heals_window():
    """Held: RaiseMemoryLimit writes the limit into the spec with the healed-spec digest of what it left; between
    its spec patch and its status mark, and while the next heal waits for its own patch, resized_by_person and
    person_edited are False; the next crash's heal is patched in; one 'Healed' each."""
    kube = service({**SPEC, "heal": {"backoffSeconds": 0, "bounds": {"maxMemoryLimit": "48Gi"}}})
    seen: list[tuple[bool, bool]] = []
    request = kube.request

    def spying(method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        out = request(method, path, body, *a, **k)
        if not path.endswith("/status") and "spec" in body:  # (the spec patch landed; the mark is next)
            obj = parse(kube.body)
            seen.append((heal_apply.resized_by_person(obj), heal.person_edited(obj)))
        return out

    kube.request = spying  # type: ignore[method-assign]
    look(kube, oom_killed(kube))
    assert kube.body["spec"]["resources"]["limits"]["memory"] == "39322Mi" and seen[0] == (False, False)
    reconcile_now(kube)
    kube.fail = spec_patch_refused(503)  # (the next heal waits for its patch)
    look(kube, crashed(kube, "pod-2", KV_TERMINATION, "2026-11-30T03:05:00Z"), PendingLater())
    obj = parse(kube.body)
    assert obj.status.in_flight is not None and not obj.status.in_flight.applied
    assert not heal_apply.resized_by_person(obj) and not heal.person_edited(obj)
    kube.fail = None
    reconcile_now(kube)  # (the next start)
    assert kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN and status(kube)["attempts"] == 2
    assert reasons().count("Healed") == 2, reasons()


def test_a_heal_dropped_for_a_persons_engine_edit_is_reset_by_the_reconcile_that_follows():
    """Held (attack on 'dropped' giving nothing back): the drop keeps the attempt, but the person's edit's
    reconcile takes a new baseline: attempts 0, tried [], no 'Healed'."""
    kube = service()
    request, done = kube.request, []

    def racing(method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        out = request(method, path, body, *a, **k)
        inf = ((body or {}).get("status") or {}).get("inFlight") or {}
        if not done and path.endswith("/status") and inf.get("crash") and not inf.get("applied"):
            done.append(True)
            kube.edit(lambda s: s["engine"].update(maxModelLen=8192))
        return out

    kube.request = racing  # type: ignore[method-assign]
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    assert done and status(kube).get("inFlight") is None and status(kube)["attempts"] == 1
    reconcile_now(kube)
    assert status(kube)["attempts"] == 0 and status(kube)["tried"] == []
    assert status(kube)["baselineFor"] == resources.sized_for(parse(kube.body)) and "Healed" not in reasons()


def test_a_heal_finished_by_the_next_start_is_announced_once():
    """Held: the spec patch deferred (503s) at the look; the next start's reconcile lands the patch and the mark
    and announces; further reconciles and completes announce nothing more."""
    kube = service()
    kube.fail = spec_patch_refused(503)
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"), PendingLater())
    assert reasons() == ["OOMDetected"]
    kube.fail = None
    reconcile_now(kube)
    reconcile_now(kube)
    heal_apply.complete(kube, OperatorConfig(), None, NS, NAME, LOG)  # type: ignore[arg-type]
    assert kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN
    assert reasons() == ["OOMDetected", "Healed"]


def test_a_revert_with_a_real_remedy_is_announced_once_in_patch_spec_mode():
    """Held: PatchSpec; the LowerCpuOffload revert's completion marks it and posts one 'Healed', after
    HealBlocked."""
    engine = {"gpuMemoryUtilization": 0.9, "cpuOffloadGb": 8}
    kube = service({**SPEC, "engine": engine, "heal": {"backoffSeconds": 0, "bounds": {"maxMemoryLimit": "48Gi"}}})
    look(kube, oom_killed(kube))
    block(kube)
    reconcile_now(kube)
    assert [h["action"] for h in status(kube)["heals"]] == ["RaiseMemoryLimit", "LowerCpuOffload"]
    assert reasons() == ["OOMDetected", "Healed", "HealBlocked", "Healed"]
