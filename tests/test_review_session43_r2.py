"""Hostile review (session 43, round 2) of this session's heal-path and serve changes (81dcb62..766d4fc):
kube/pods.py's numbering of a lastState run, heal.py's backoff recording and transient deferral, heal_apply.py's
refused spec patch (HealRefused, complete() -> done/deferred/dropped, Events after complete), the healed-spec
annotation and person_edited, and serve's Ctrl-C, exit status and flag-before-MODEL rules.

The core API cannot run here: tests/heal_stub.py's VLLMService store (merge patches under the resourceVersion
precondition) stands in for it, and the heal is driven through heal.handle_crash and reconcile.reconcile, as kopf's
handlers call them. Each defect is a
strict xfail asserting the right behaviour; the plain tests pin attacks that held."""

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
    backing_off,
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
from vllm_autoheal.kube import heal, heal_apply, pods, resources
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import deployed, fp, parse

from operator_harness import PendingLater
from samples import KV_TERMINATION, NOT_MEMORY, RUNTIME_OOM, SPEC


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    quiet(monkeypatch)


# --- (A) Events after complete: a deferred spec patch that is then refused ---------------------------------------


def test_a_heal_deferred_then_refused_is_never_announced_as_healed():
    """Severity: low-medium (the Events contradict each other: 'Healed' with the flags it set, then 'HealRefused';
    the healed metric counts it). README: a heal whose spec patch the API server refuses is dropped 'with the
    server's message, and no Healed Event'. Input: PatchSpec; the spec PATCH answers 503 four times (writes.retried
    gives up: complete() returns 'deferred', a retry scheduled under complete/ns/name), then 422 (an admission
    policy). Now: _look treats 'deferred' as not refused and posts OOMDetected + Healed; the retry drops the heal
    and posts HealRefused. Right: no 'Healed' for a heal that was not applied: post it only once complete() says
    'done' (from complete itself, or hold the Event until the deferred completion ends)."""
    kube = service()
    kube.fail = spec_patch_refused(transient_first=4)
    later = PendingLater()
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"), later)
    retry = later.pending.pop(f"complete/{NS}/{NAME}")
    retry()  # type: ignore[operator]
    assert status(kube).get("inFlight") is None and "HealRefused" in reasons(), reasons()
    assert "Healed" not in reasons(), reasons()


# --- (B) a refused heal still counts as a heal: backoff and budget ---------------------------------------------


def test_a_refused_heal_starts_no_heal_backoff():
    """Severity: medium (a crash lost for good: since this session a crash within the backoff is recorded as
    seen, never healed later). README: a refused heal is dropped 'and later crashes are still healed'; the backoff
    exists to let a heal's rollout show whether it worked, and a refused heal rolled nothing out. Input: PatchSpec,
    backoffSeconds 30; the first crash's heal (LowerMaxModelLen) is refused (422) and dropped; 5 s later another
    pod dies of a runtime OOM, whose heal the policy allows. Now: 'within the 30s heal backoff': the crash is
    written to observedCrashes, no heal record, nothing changes; a later look never heals it. Right: healed.
    Fix: _backing_off should skip heal records whose heal was dropped (mark the record when _drop runs, e.g.
    action 'Refused' or a refused flag, and exclude it as NoChange/GiveUp are)."""
    kube = service({**SPEC, "heal": {**SPEC["heal"], "backoffSeconds": 30}})
    kube.fail = spec_patch_refused()
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    assert "HealRefused" in reasons() and status(kube).get("inFlight") is None
    kube.fail = None  # (the policy allows this one)
    look(kube, crashed(kube, "pod-2", RUNTIME_OOM, "2026-11-30T03:00:05Z"))
    assert len(status(kube)["heals"]) == 2, [h["action"] for h in status(kube)["heals"]]
    assert kube.body["spec"]["engine"] != SPEC["engine"], kube.body["spec"]["engine"]


def test_a_refused_heal_does_not_spend_the_heal_budget():
    """Severity: medium (healing stops with HealExhausted, the condition says the heals were spent, while not one
    was made; with the operator's own RBAC missing `patch vllmservices` (403) every heal of every service is
    refused and each service is 'exhausted' after maxAttempts crashes, pointing the reader at the model instead of
    the chart). README: 'attempts, reset only by a person's edit'; a refused heal is dropped 'and later crashes are
    still healed'. Input: PatchSpec, maxAttempts 1; the first heal's spec patch is refused (422), then the policy
    is lifted and another pod dies of the same shortage. Now: attempts 1 -> the planner gives up: heals
    [LowerMaxModelLen, GiveUp], HealExhausted. Right: the dropped heal gives its attempt back (its action may stay
    in `tried`, so the same refused change is not planned again): the next crash is healed.
    Fix: in _drop (refused path), decrement attempts/healCount for the dropped intent and mark its heal record."""
    kube = service({**SPEC, "heal": {**SPEC["heal"], "maxAttempts": 1}})
    kube.fail = spec_patch_refused()
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    kube.fail = None
    look(kube, crashed(kube, "pod-2", KV_TERMINATION, "2026-11-30T03:10:00Z"))
    assert "HealExhausted" not in reasons(), (reasons(), [h["action"] for h in status(kube)["heals"]])
    # (healed, by another change: the refused one stays tried, so a policy still in force is not asked again)
    first, second = status(kube)["heals"]
    assert first.get("refused") is True and not second.get("refused"), status(kube)["heals"]
    assert kube.body["spec"]["engine"].get("maxModelLen") not in (None, HEALED_LEN), kube.body["spec"]["engine"]
    assert status(kube)["attempts"] == 1 and status(kube)["healCount"] == 1


# --- (C) PatchSpec with pre-flight Fix: every heal silently dropped, announced as 'Healed' -----------------------


def test_a_patch_spec_heal_under_preflight_fix_is_applied_not_silently_dropped():
    """Severity: high (PatchSpec is the default mode: a service with `preflight: Fix` whose fitted flags still
    crash is never healed; each crash posts OOMDetected + Healed, spends an attempt, and after maxAttempts says
    HealExhausted). Pre-existing in _spec_change (946fa30), but this session's complete() now promises 'dropped'
    (no Healed) for a heal that is not made, and returns 'done' here. Input: PatchSpec, preflight Fix, spec
    maxModelLen 131072 with the llama-3.1-8b config: reconcile fits status.effective (maxModelLen 26976); the pod
    (running the fitted flags) dies of a runtime OOM. Now: heal record LowerGpuMemoryUtilization, attempts 1,
    'Healed' Event, inFlight cleared, spec unchanged, the fitted flags still deployed.
    Right: the heal is written into the spec (the fitted flags plus the heal's change; the spec is still the
    person's, so 'the spec as the heal found it' is in_spec == baseline while unhealed_since_baseline), or, if
    dropped, no 'Healed' and no attempt spent. Fix: in _spec_change accept in_spec == baseline with the fitted
    effective as previous (as person_edited does), and make the 'person changed the spec' path return 'dropped'."""
    config = (Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json").read_text()
    spec = {
        **SPEC,
        "preflight": "Fix",
        "engine": {"maxModelLen": 131072},
        "heal": {"backoffSeconds": 0, "mode": "PatchSpec"},
    }
    kube = StubKube(_vsvc(spec))
    kube.body["metadata"]["annotations"] = {"vllm.autoheal.dev/model-config": config}
    reconcile_now(kube)
    fitted = fp(deployed(parse(kube.body)))
    assert status(kube)["effective"]["maxModelLen"] < 131072  # (pre-flight fitted it)
    look(kube, crashed(kube, "pod-1", RUNTIME_OOM, "2026-11-30T03:00:00Z"))
    assert status(kube)["attempts"] == 1 and "Healed" in reasons()
    assert fp(deployed(parse(kube.body))) != fitted, (kube.body["spec"]["engine"], status(kube).get("effective"))


# --- (D) a lastState run beside a kubelet start failure, where no container ids are given ------------------------


@pytest.mark.parametrize("waiting", ["CreateContainerConfigError", "ImagePullBackOff", "CreateContainerError"])
def test_without_ids_a_run_beside_any_kubelet_start_failure_is_restart_counts_own(waiting):
    """Severity: low (only where a status carries no containerIDs; real kubelets give them, so the id rule
    decides). kubelet's convertToAPIContainerStatuses moves the latest container's Terminated state to
    lastState and sets Waiting with the reason its reasonCache holds for the failed restart: CrashLoopBackOff, or
    CreateContainerConfigError (a Secret gone), ErrImagePull/ImagePullBackOff (pull policy Always, a registry
    down), CreateContainerError, RunContainerError. For each, no newer container than the dead run exists: the
    count is the dead run's. Now: restartCount-1 (the run before, already recorded: this crash skipped).
    Fix: in the no-id fallback, take `restarts` for any waiting reason but the kubelet's defaults for a newer
    container (ContainerCreating, PodInitializing)."""
    last = terminated(NOT_MEMORY, "2026-11-30T04:00:00Z")
    cs = {
        "name": resources.CONTAINER,
        "restartCount": 3,
        "state": {"waiting": {"reason": waiting}},
        "lastState": {"terminated": last},
    }
    assert pods.find_crash({"status": {"containerStatuses": [cs]}})["restartCount"] == 3


# --- attacks that held ---------------------------------------------------------------------------------------


def test_a_crash_held_back_by_the_backoff_is_healed_at_the_pods_next_crash():
    """Held (as documented): a healed pod that dies within backoffSeconds of the heal is recorded, not healed; its
    CrashLoopBackOff and running views of that run are the same crash; the pod's next crash, past the backoff,
    heals (one more crash cycle, no lost heal for a deterministic failure of the healed flags)."""
    kube = service({**SPEC, "heal": {**SPEC["heal"], "backoffSeconds": 30}})
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    reconcile_now(kube)
    assert status(kube)["healCount"] == 1
    run0 = {**terminated(RUNTIME_OOM, "2026-11-30T03:00:20Z"), "containerID": "containerd://a"}
    look(kube, pod(kube, uid="pod-2", restarts=0, state={"terminated": run0}))  # within the backoff
    view = backing_off(run0)
    backoff = pod(kube, uid="pod-2", restarts=0, state=view["state"], last=view["last"])
    backoff["status"]["containerStatuses"][0]["containerID"] = "containerd://a"
    look(kube, backoff)
    running = pod(kube, uid="pod-2", restarts=1, state={"running": {}}, last=run0)
    running["status"]["containerStatuses"][0]["containerID"] = "containerd://b"
    look(kube, running)
    assert status(kube)["healCount"] == 1 and len(status(kube)["observedCrashes"]) == 2
    for record in kube.body["status"]["heals"]:  # the backoff over
        record["time"] = "2020-01-01T00:00:00Z"
    run1 = {**terminated(RUNTIME_OOM, "2026-11-30T03:01:30Z"), "containerID": "containerd://b"}
    look(kube, pod(kube, uid="pod-2", restarts=1, state={"terminated": run1}))
    assert status(kube)["healCount"] == 2


def test_the_operators_own_missing_rbac_drops_the_heal_once_with_a_bounded_message():
    """Held: a 403 on the spec patch (the operator's Role lacks `patch vllmservices`) drops the heal with one
    HealRefused naming HTTP 403 and the server's message (from the Status JSON, bounded), no 'Healed', inFlight
    cleared; reconcile after it raises nothing and re-applies nothing of the heal; no retry loop is scheduled."""
    message = 'vllmservices.vllm.autoheal.dev "svc" is forbidden: User "system:serviceaccount:x:op" cannot patch'
    long = message + " " + "x" * 5000
    reason = 'Forbidden: {"kind":"Status","status":"Failure","message":"' + long + '","code":403}'
    kube = service()
    kube.fail = spec_patch_refused(403, reason[:2000])  # (client.py keeps at most 2000 characters of the body)
    later = PendingLater()
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"), later)
    refused = [e for e in EVENTS if e["reason"] == "HealRefused"]
    assert len(refused) == 1 and "Healed" not in reasons(), reasons()
    assert "HTTP 403" in refused[0]["message"] and len(refused[0]["message"]) <= 1000
    assert "Forbidden: {" in refused[0]["message"] or "cannot patch" in refused[0]["message"]
    assert status(kube).get("inFlight") is None and not later.pending
    reconcile_now(kube)
    assert kube.body["spec"]["engine"] == SPEC["engine"]


def test_server_says_quotes_the_status_message_and_bounds_anything_else():
    """Held: the Status's message, not its JSON; a reason that is no JSON (a webhook's plain text) or a JSON
    without a message (a list, a number) is quoted as is; at most 800 characters either way."""
    from vllm_autoheal.kube.writes import server_says

    ok = ApiException(status=422, reason='Unprocessable Entity: {"message": "denied: rule r1", "code": 422}')
    assert server_says(ok) == "denied: rule r1"
    for reason in ("Bad Request: [1, 2]", "Bad Request: 7", "Forbidden", "Unprocessable Entity: " + "y" * 9000):
        said = server_says(ApiException(status=400, reason=reason))
        assert said == reason[:800]


def test_a_revert_to_the_baseline_after_a_rolled_out_heal_is_an_edit_and_resets_the_budget():
    """Held: PatchSpec; a heal rolled out (spec B, healed-spec annotation at B's digest); a person (or Argo CD's
    sync of the Git copy) sets the spec back to A: an edit - new baseline, attempts 0 - whether or not the tool
    also replaced the annotations (a replace drops them: the older rule, status.effective B != spec A, says the
    same)."""
    for strip in (False, True):
        kube = service()
        look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
        reconcile_now(kube)
        assert status(kube)["attempts"] == 1 and heal_apply.HEALED_SPEC in kube.body["metadata"]["annotations"]

        def revert(spec: dict[str, Any]) -> None:
            spec["engine"] = copy.deepcopy(SPEC["engine"])

        kube.edit(revert)
        if strip:
            kube.body["metadata"]["annotations"] = {}
        assert heal.person_edited(parse(kube.body))
        reconcile_now(kube)
        assert status(kube)["attempts"] == 0 and status(kube)["baseline"] == parse(kube.body).spec.engine.wire()


def test_a_tool_that_strips_the_annotations_but_keeps_the_healed_spec_is_no_edit():
    """Held: a GitOps replace that drops the operator's annotations while the spec stays at the heal's flags
    (the Git copy was updated to them) is no edit: the older rule (spec == status.effective) still holds."""
    kube = service()
    look(kube, crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z"))
    reconcile_now(kube)
    kube.body["metadata"]["annotations"] = {}
    assert not heal.person_edited(parse(kube.body))


def test_a_transient_error_in_the_ownership_read_defers_the_look_once_and_heals():
    """Held: a 503 from the ReplicaSet read (handlers' ownership check) defers the look under crash/<id>, with the
    check, once per crash however many events arrive meanwhile; the deferred look heals once."""
    kube = service()
    calls = {"n": 0}

    def owned() -> bool:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ApiException(status=503, reason="Service Unavailable")
        return True

    later = PendingLater()
    the_pod = crashed(kube, "pod-1", KV_TERMINATION, "2026-11-30T03:00:00Z")
    crash = pods.find_crash(the_pod)
    for _ in range(2):  # (the pod's first event, then its next one while the first look waits)
        heal.handle_crash(kube, OperatorConfig(), later, heal.Incident(NS, NAME, the_pod, crash), LOG, owned)  # type: ignore[arg-type]
    assert list(later.pending) == ["crash/pod-1/vllm/0"]
    later.pending.pop("crash/pod-1/vllm/0")()  # type: ignore[operator]
    assert status(kube)["healCount"] == 1 and kube.body["spec"]["engine"]["maxModelLen"] == HEALED_LEN


def test_serve_never_reads_a_flag_typed_after_a_leading_double_dash_as_the_model(monkeypatch, capsys):
    """Held: the refusal's advice says 'after --'; `serve --fresh -- --tokenizer T MODEL` makes argparse read
    '--tokenizer' as MODEL, and serve refuses it (exit 2: a model cannot open with '-') rather than start vLLM."""
    from vllm_autoheal import local
    from vllm_autoheal.cli import main

    seen: list[Any] = []
    monkeypatch.setattr(local, "supervise", lambda opts: seen.append(opts) or 0)
    assert main(["serve", "--fresh", "--", "--tokenizer", "org/tok", "meta-llama/X"]) == 2 and seen == []
    assert main(["serve", "--fresh", "--history=h.jsonl", "meta-llama/X", "--", "--tokenizer", "t"]) == 0
    assert seen[0].model == "meta-llama/X" and seen[0].spec.engine.extra_args == ["--tokenizer", "t"]


def test_exit_status_keeps_serves_own_signals_and_reads_the_kernels():
    """Held: a SIGKILL serve did not send (the kernel's, systemd-oomd's) is 137 even while serve's SIGTERM is
    pending (a kill racing serve's stop); one serve sent stays -9; a plain exit code is untouched."""
    import signal

    from vllm_autoheal.serve_process import exit_status

    assert exit_status(-9, {signal.SIGTERM}) == 137
    assert exit_status(-9, {signal.SIGTERM, signal.SIGKILL}) == -9
    assert exit_status(-15, {signal.SIGTERM}) == -15
    assert exit_status(1, set()) == 1 and exit_status(0, {signal.SIGTERM}) == 0
