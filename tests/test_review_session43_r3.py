"""Hostile review (session 43, round 3) of 21b4073 and cc3b49b: the PatchSpec heal under pre-flight Fix judged
against what runs (heal_apply._spec_change, heal.person_edited), refused heals (HealRecord.refused, attempts given
back, no backoff), the 'Healed' Event posted by complete() when its own mark lands, the no-id lastState rule, and
the memory model's Granite/Nemotron-H shared MLP and layer-list Mamba-2 mixers.

The core API cannot run here: tests/heal_stub.py's VLLMService store stands in for it; the heal is driven
through heal.handle_crash, heal_apply.complete, unschedulable.blocked and reconcile.reconcile, as kopf's handlers call them. Each defect is a strict xfail asserting
the right behaviour; the plain tests pin attacks that held."""

from __future__ import annotations

import copy
from pathlib import Path
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
    _vsvc,
    crashed,
    look,
    pod,
    quiet,
    reasons,
    reconcile_now,
    service,
    spec_patch_refused,
    status,
    terminated,
)
from vllm_autoheal.kube import heal, heal_apply, resources
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import deployed, parse

from operator_harness import PendingLater
from samples import KV_TERMINATION, NO_GPU, RUNTIME_OOM, SPEC


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    quiet(monkeypatch)


CONFIG = (Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json").read_text()
FIX_SPEC = {**SPEC, "preflight": "Fix", "engine": {"maxModelLen": 131072}, "heal": {"backoffSeconds": 0}}


def fitted_service(spec: dict[str, Any] = FIX_SPEC) -> StubKube:
    """PatchSpec (the default) under pre-flight Fix: reconcile fits status.effective (maxModelLen 131072 does not
    fit the L4: the fitted flags run, the spec stays the person's)."""
    kube = StubKube(_vsvc(spec))
    kube.body["metadata"]["annotations"] = {"vllm.autoheal.dev/model-config": CONFIG}
    reconcile_now(kube)
    assert status(kube)["effective"]["maxModelLen"] < 131072, status(kube).get("effective")
    return kube


def after_status_write(kube: StubKube, when: Any, then: Any) -> None:
    """Run `then()` right after the first status write whose patch satisfies `when(status_patch)` lands (another
    writer's act between two of the operator's writes)."""
    request, done = kube.request, []

    def wrapped(method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        out = request(method, path, body, *a, **k)
        if not done and path.endswith("/status") and when(body.get("status") or {}):
            done.append(True)
            then()
        return out

    kube.request = wrapped  # type: ignore[method-assign]


def records_heal(patch: dict[str, Any]) -> bool:
    return bool((patch.get("inFlight") or {}).get("crash")) and not patch["inFlight"].get("applied")


# --- (A) 'Healed' for a heal a person's racing edit dropped ---------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s["engine"].update(maxModelLen=8192),  # the engine
        lambda s: s["resources"]["limits"].update(memory="36Gi"),  # the memory limit only
    ],
    ids=["engine", "memory-limit"],
)
def test_a_heal_dropped_for_a_persons_racing_edit_is_not_announced_as_healed(edit):
    """Severity: low-medium (the Events and the heals metric say a heal was made that never was: the spec is the
    person's, nothing of the heal runs). 21b4073 promises "'Healed' is posted once a heal is made". Input: PatchSpec
    under pre-flight Fix (llama-3.1-8b, maxModelLen 131072 fitted to 26976 on the L4); a pod dies of a runtime OOM;
    right after the operator's status write records the heal, and before its spec patch, a person edits the spec
    (the engine, or only the memory limit, raised to 36Gi within the bounds: what runs moves off the heal's previous
    either way; a limit lowered below the heal's is dropped as a policy refusal instead, HealRefused). Now: _spec_change
    returns None, _complete drops the heal (inFlight cleared, spec the person's) and returns 'done'; _look posts
    OOMDetected + Healed. Right: no 'Healed' (the heal was dropped). Fix: return 'dropped' (or a third outcome,
    'superseded') from the person-changed-the-spec path, and have _look post no 'Healed' for it."""
    kube = fitted_service()
    after_status_write(kube, records_heal, lambda: kube.edit(edit))
    look(kube, crashed(kube, "pod-1", RUNTIME_OOM, "2026-11-30T03:00:00Z"))
    assert status(kube).get("inFlight") is None and kube.body["spec"]["engine"].get("maxModelLen") in (8192, 131072)
    assert "Healed" not in reasons(), reasons()


# --- (B) 'Healed' missing where the rollout's apply is deferred ------------------------------------------------


@pytest.mark.parametrize("mode", ["PatchSpec", "StatusOverrides"])
def test_a_heal_made_whose_apply_is_deferred_is_announced_once(mode):
    """Severity: low-medium (a heal made, rolled out by the deferred retry, and no 'Healed' Event ever: the Events
    end at OOMDetected, as for a heal still pending or lost). Input: a KV-cache crash; the heal's spec patch and
    status mark land (PatchSpec; in StatusOverrides the record is the heal), then the objects' apply answers 503
    once (an API server restart). Now: complete() returns 'deferred' from the apply; _look posts OOMDetected only
    (unmade); the retry finds the heal marked applied, announces nothing, applies: the heal runs, no 'Healed'.
    Right: exactly one 'Healed'. Fix: decide 'Healed' on the mark (or the StatusOverrides record), not on the
    apply: have _complete return a 'made' flag with the outcome, or post it in _look when the heal was marked even
    if the apply is deferred."""
    kube = service({**SPEC, "heal": {**SPEC["heal"], "mode": mode}})
    apply_all, calls = kube.apply_all, []

    def flaky(manifests: list[dict[str, Any]]) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ApiException(status=503, reason="Service Unavailable")
        return apply_all(manifests)

    kube.apply_all = flaky  # type: ignore[method-assign]
    later = PendingLater()
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"), later)
    later.pending.pop(f"complete/{NS}/{NAME}")()  # type: ignore[operator]
    assert deployed(parse(kube.body)).engine.max_model_len == HEALED_LEN and kube.applied
    assert reasons().count("Healed") == 1, reasons()


# --- (C) 'Healed' from a mark another writer made ---------------------------------------------------------------


def test_a_mark_another_writer_landed_first_is_not_announced_twice():
    """Severity: low (two 'Healed' Events for one heal, each budgeted). The comment says 'the last one's is the
    write that landed', but `marked` only ever grows: a first try of _mark_applied that the API server refuses
    (409) leaves True in it; the retry finds the heal marked by another writer and writes nothing, and this call
    still posts 'Healed'. Input: PatchSpec; the heal's spec patch is deferred (503s); at the retry, just before this
    operator's mark, another replica (a rolling update of the operator runs two) marks it applied and posts its
    own 'Healed'. Now: 2 'Healed'. Right: 1. Fix: `marked.clear()` at the top of _mark_applied's change (as
    unschedulable.blocked does with `acted`)."""
    kube = service()
    kube.fail = spec_patch_refused(status_code=503)  # (every spec patch: deferred)
    later = PendingLater()
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"), later)
    assert "Healed" not in reasons() and status(kube)["inFlight"]["applied"] is False
    kube.fail = None
    request, raced = kube.request, []

    def request_racing(method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        marking = ((body or {}).get("status") or {}).get("inFlight") or {}
        if path.endswith("/status") and marking.get("applied") and not raced:
            raced.append(True)  # the other replica's mark lands first (and its 'Healed')
            with kube._guard:
                kube.body["status"]["inFlight"]["applied"] = True
                kube.body["metadata"]["resourceVersion"] = str(int(kube.body["metadata"]["resourceVersion"]) + 1)
            EVENTS.append({"type": "Normal", "reason": "Healed", "message": "(the other replica's)"})
        return request(method, path, body, *a, **k)

    kube.request = request_racing  # type: ignore[method-assign]
    later.pending.pop(f"complete/{NS}/{NAME}")()  # type: ignore[operator]
    assert raced and kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN
    assert reasons().count("Healed") == 1, reasons()


# --- (D) a GPU edit while a heal is pending, under pre-flight Fix ------------------------------------------------


def test_a_gpu_edit_while_a_heal_is_pending_under_fix_is_an_edit():
    """Severity: medium (a regression of 21b4073: before it, under Fix, this was an edit). A heal's fingerprint
    holds the model, engine and memory limit, not the GPU; under Fix, what runs is status.effective while
    spec.engine is the baseline, which in PatchSpec mode ignores baselineFor. Input: PatchSpec, pre-flight Fix,
    llama-3.1-8b asking maxModelLen 131072 on an L4 (fitted to 26976); a runtime OOM is recorded, its spec patch
    deferred (503s); the person moves the service to an A100-40GB (gpuProduct). Now: person_edited False
    (deployed == the heal's previous); reconcile completes the heal: the spec becomes the L4-fitted flags plus the
    heal (maxModelLen 17872, gpuMemoryUtilization 0.85) under a healed-spec digest taken with the new GPU, so no
    later look sees an edit: attempts stay 1, baselineFor stays the L4's, pre-flight never fits for the A100 and the
    service runs at 1/7 of the context asked for until the next edit. Right: an edit (new baseline for the A100,
    attempts 0, the heal dropped, pre-flight fits anew). Fix: in person_edited's in-flight exception (and in
    _spec_change) also require status.baselineFor == resources.sized_for(obj) (the GPU the heal was planned for)."""
    kube = fitted_service()
    kube.fail = spec_patch_refused(status_code=503)
    look(kube, crashed(kube, "pod-1", RUNTIME_OOM, "2026-11-30T03:00:00Z"), PendingLater())
    assert status(kube)["inFlight"]["applied"] is False
    kube.fail = None
    kube.edit(lambda s: s["resources"].update(gpuProduct="NVIDIA-A100-SXM4-40GB"))
    reconcile_now(kube)
    obj = parse(kube.body)
    assert kube.body["spec"]["engine"] == {"maxModelLen": 131072}, kube.body["spec"]["engine"]
    assert status(kube)["baselineFor"] == resources.sized_for(obj) and status(kube)["attempts"] == 0


# --- (E) a refused unschedulable revert: attempt and backoff kept ---------------------------------------------


def test_a_refused_revert_heal_gives_its_attempt_back_and_starts_no_backoff(monkeypatch):
    """Severity: low-medium (the refusal rule of 21b4073 skips the revert path: its refused heal spends budget and
    holds the next crash back). unschedulable._revert records its heal with pod '<name> (unschedulable)', no uid and
    restart count 0, while its inFlight keeps the blocked heal's crash id: heal_apply._records never matches it.
    Input: PatchSpec, cpuOffloadGb 8, backoffSeconds 60; an OOMKilled pod is healed by RaiseMemoryLimit (32Gi ->
    39322Mi); its pods stay Unschedulable and the revert plans LowerCpuOffload (attempts 2, healCount 2), whose spec
    patch an admission policy refuses (422). Now: HealRefused, inFlight cleared, but attempts 2, healCount 2, the
    revert record not 'refused', and a crash now is held back by the backoff counted from that record. Right:
    attempts 1, healCount 1, the record refused, no backoff from it. Fix: record the revert with the crash id it
    carries in inFlight (or match revert records by `unschedulable` and the intent's time/action)."""
    from vllm_autoheal.kube import unschedulable

    monkeypatch.setattr(unschedulable, "event", lambda body, **k: EVENTS.append(k))
    engine = {"gpuMemoryUtilization": 0.9, "cpuOffloadGb": 8}
    kube = service({**SPEC, "engine": engine, "heal": {"backoffSeconds": 60, "bounds": {"maxMemoryLimit": "48Gi"}}})
    run = {**terminated("", "2026-11-30T03:00:00Z", 137), "reason": "OOMKilled"}
    look(kube, pod(kube, uid="pod-1", restarts=0, state={"terminated": run}))
    assert [h["action"] for h in status(kube)["heals"]] == ["RaiseMemoryLimit"]
    kube.body["status"]["heals"][0]["time"] = "2020-01-01T00:00:00Z"  # (that heal's own backoff is over)
    kube.fail = spec_patch_refused()
    obj = parse(kube.body)
    vsvc = kube.get_vsvc(NS, NAME)
    unschedulable.blocked(kube, OperatorConfig(), PendingLater(), obj, vsvc, obj.status.in_flight, NO_GPU, LOG)  # type: ignore[arg-type]
    heals = status(kube)["heals"]
    assert heals[-1]["action"] == "LowerCpuOffload" and "HealRefused" in reasons() and not status(kube).get("inFlight")
    assert (status(kube)["attempts"], status(kube)["healCount"]) == (1, 1), status(kube)
    assert heals[-1].get("refused") is True and not heal._backing_off(parse(kube.body))


# --- attacks that held -----------------------------------------------------------------------------------------


def test_a_second_heal_under_fix_starts_from_the_healed_spec_and_is_no_edit():
    """Held: PatchSpec under pre-flight Fix; the first heal is written into the spec (the fitted flags plus the
    heal: maxModelLen 17872, gpuMemoryUtilization 0.85), announced once; reconcile neither re-fits over it nor takes
    it for an edit; the next crash heals from the healed spec (what runs), one 'Healed' each, attempts 2."""
    kube = fitted_service()
    look(kube, crashed(kube, "pod-1", RUNTIME_OOM, "2026-11-30T03:00:00Z"))
    reconcile_now(kube)
    first = copy.deepcopy(kube.body["spec"]["engine"])
    assert first["maxModelLen"] < 131072 and status(kube)["effective"] == first
    assert not heal.person_edited(parse(kube.body)) and status(kube)["attempts"] == 1
    look(kube, crashed(kube, "pod-2", RUNTIME_OOM, "2026-11-30T03:05:00Z"))
    reconcile_now(kube)
    second = kube.body["spec"]["engine"]
    assert second != first and second["maxModelLen"] == first["maxModelLen"], second
    assert status(kube)["attempts"] == 2 and reasons().count("Healed") == 2
    assert not heal.person_edited(parse(kube.body)) and status(kube)["effective"] == second


def test_a_refused_heal_never_drives_the_counters_below_zero_nor_marks_another_crashs_record():
    """Held: _drop(refused) finds the record by crash id and action, never one already refused, and floors both
    counters at 0 (a status whose counters a tenant zeroed meanwhile)."""
    kube = service()
    kube.fail = spec_patch_refused(status_code=503)
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"), PendingLater())
    intent = parse(kube.body).status.in_flight
    assert intent is not None
    body = copy.deepcopy(kube.body)
    other = {**body["status"]["heals"][0], "podUID": "pod-0", "pod": "svc-pod-0"}
    body["status"].update(attempts=0, healCount=0, heals=[other, *body["status"]["heals"]])
    out = heal_apply._drop(body, intent, refused=True)
    assert out is not None and out["attempts"] == 0 and out["healCount"] == 0
    assert [h.get("refused") for h in out["heals"]] == [None, True]
