"""Hostile review (session 34c) of the session-34b fixes (1400bd8) and their neighbours (d6cb13b, cf53315,
276a8a7): the gate's companion that must move off what runs (remedy_gate._moves), the planner's limits for a
change of the split or the quantization (plan.py: outside_budget_ceiling for the new GPU count), a deleted
Deployment applied again through Later (reconcile.deployment_deleted), diagnose's windows grown once
(log_file.windows) and serve's prefill context parallelism in every spelling (serve_sizing).

Each xfail(strict) test is a defect found today, asserting the right behaviour; the plain tests are attacks
that were defended."""

from __future__ import annotations

import logging
import os
import stat
import time
import types
from typing import Any

import kopf
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from fake_file import FakeFile
from vllm_autoheal import log_file
from vllm_autoheal.api import ALL_ACTIONS, VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube import owned_deleted, reconcile
from vllm_autoheal.kube import status as st
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.later import Later
from vllm_autoheal.local_ranks import prefill_context_ranks
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import ANY, CALLS_FOR, ONLY_WITH

from operator_harness import RecordingLog, peak_timers
from samples import config_shape

L4 = lookup("NVIDIA-L4")
MIXTRAL = config_shape("mixtral-8x7b")
WEIGHTS_OOM = (
    "ERROR [gpu_model_runner.py:1] Failed to load model - not enough GPU memory. "
    "(original error: CUDA out of memory. Tried to allocate 1.00 GiB.)"
)


# --- 1. the split's limits: outside_budget_ceiling for the new GPU count (1400bd8, remedy/plan.py) ----------


def _split_after_runtime_cut(history: list[dict[str, Any]]):
    """Mixtral (87 GiB) on L4s at utilization 0.5 (cut there from 0.55 after an OOM while serving on the
    one GPU it runs on), 32k context, split allowed up to 8: the weights fail to load. Alone, the planner
    splits it over 8 GPUs at 0.56 (tests/test_split_heals.py's first case)."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"gpuMemoryUtilization": 0.5, "maxModelLen": 32768},
        heal={"bounds": {"maxTensorParallelSize": 8}, "allowedActions": ALL_ACTIONS},
    )
    diag = classify(Signals(log=WEIGHTS_OOM))
    assert diag.cause == "weights_load_oom"
    inv = Inventory(gpu_total_gib=L4.memory_gib, shape=MIXTRAL, gpu_free_gib=L4.memory_gib)
    return plan_heal(spec, diag, history, inv, attempts=1)


def test_serve_splits_past_a_ceiling_that_another_split_set():
    """Defended (serve): its heal records carry ran_gpus, so a share that ran out while serving on 1 GPU is no
    ceiling for the 8-GPU split: TP 8 at 0.56, as without that record."""
    history = [
        {"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization", "numbers": {}, "ran_util": 0.55, "ran_gpus": 1}
    ]
    r = _split_after_runtime_cut(history)
    assert r.action == "IncreaseTensorParallel", r.summary()
    assert r.changes == {"tensor_parallel_size": 8, "gpu_memory_utilization": 0.56}


def test_the_operator_splits_past_a_ceiling_that_another_split_set():
    """Severity: low-medium (operator only; a regression of 1400bd8: a heal the operator made before, and serve
    makes now, becomes a give-up whose own advice says the refused split would fit within the bounds).
    Input: the crash above, in the operator: status.tried ['runtime_oom/LowerGpuMemoryUtilization'] and the
    runtime heal's record (gpus 1, gpuMemoryUtilization 0.55 -> 0.5), read by kube.status.history for the
    1 GPU a replica runs on now.
    Now: plan.py recomputes the limits of the split with outside_budget_ceiling(history, 8); the operator's
    entries have no ran_gpus, so `h.get('ran_gpus', gpus) == gpus` holds for the 1-GPU record and the ceiling
    is 0.55. The gate refuses 'gpu_memory_utilization 0.56 is at or above 0.55', and the plan gives up with
    'What would: tensor parallelism 8 (... within the bounds)'.
    Right: the ceiling for the new GPU count counts only crashes on that split (outside_budget_ceiling's own
    docstring; serve's records say so with ran_gpus): TP 8 at 0.56, as serve plans it."""
    record = {
        "cause": "runtime_oom",
        "action": "LowerGpuMemoryUtilization",
        "numbers": {},
        "gpus": 1,
        "changes": [{"field": "gpuMemoryUtilization", "before": 0.55, "after": 0.5}],
    }
    history = st.history(["runtime_oom/LowerGpuMemoryUtilization"], [record], 1)
    assert history[1]["ran_util"] == 0.55 and not history[1]["other_split"]
    r = _split_after_runtime_cut(history)
    assert r.action == "IncreaseTensorParallel", r.summary()
    assert r.changes == {"tensor_parallel_size": 8, "gpu_memory_utilization": 0.56}


# --- 2. the gate's companion must move off what runs (1400bd8, remedy_gate._moves) --------------------------


def test_only_model_is_a_companion_the_direction_rule_lets_stand_still():
    """Defended: every companion ONLY_WITH names but `model` has a direction (UP or DOWN) for its cause, so a
    companion set to its deployed value was already refused by the gate's direction rule before _moves; the
    stricter rule adds only a `model` equal to the deployed one, which plan_heal skips before the gate. No
    remedy the planner makes (a split's share, a cut with its context, the quantized fallback with its share
    or context) is refused anew."""
    for (cause, _field), companions in ONLY_WITH.items():
        for companion in companions:
            assert companion in CALLS_FOR[cause], (cause, companion)
            assert (CALLS_FOR[cause][companion] == ANY) == (companion == "model"), (cause, companion)


# --- 3. a deleted Deployment applied again, through Later (1400bd8, kube/reconcile.py) ---------------------


SERVICE = {"metadata": {"name": "s", "namespace": "team", "uid": "u-s"}}
DEPLOYMENT = {"metadata": {"name": "s", "namespace": "team", "ownerReferences": [{"controller": True, "uid": "u-s"}]}}
FAST = OperatorConfig(retry_delay_s=0.02)


class _Kube:
    """get_vsvc answers from `answers` in turn (an exception is raised), then the last one for good."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.gets = list(answers), 0

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _reconciles(monkeypatch, outcomes: list[BaseException | None]) -> list[int]:
    """reconcile.reconcile faked: each call raises the next of `outcomes` (None: applied), then succeeds."""
    calls: list[int] = []

    def fake(kube: Any, cfg: Any, body: Any, logger: Any) -> None:
        calls.append(1)
        if len(calls) <= len(outcomes) and outcomes[len(calls) - 1] is not None:
            raise outcomes[len(calls) - 1]  # type: ignore[misc]

    monkeypatch.setattr(reconcile, "reconcile", fake)
    monkeypatch.setattr(owned_deleted, "SETTLE_S", 0.0)
    return calls


def _settle(later: Later, seconds: float = 1.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and later._timers:
        time.sleep(0.01)
    time.sleep(0.05)


def test_a_retry_of_a_deleted_deployment_survives_the_api_server_still_restarting(monkeypatch):
    """Severity: medium (a service left with no Deployment, hence no server, until the next spec edit or an
    operator restart; exactly the case the retry was added for, 'an API server restarting').
    Input: a VLLMService's Deployment deleted; the re-apply fails transiently (reconcile raises
    kopf.TemporaryError 'applying the objects failed': the API server going down); retry_delay_s later the API
    server is still down, so the retry's read of the service fails (connection refused); a try after that works.
    Now: attempt 2 calls kube.get_vsvc, which raises MaxRetryError; nothing in deployment_deleted catches it,
    Later.fire logs 'a deferred check ... failed', no attempt 3 is scheduled: reconcile ran once.
    Right: a transient failure of the read is retried as the apply's is (within cfg.write_attempts), and the
    Deployment is applied again."""
    down = urllib3.exceptions.MaxRetryError(None, "/apis", "connection refused")  # type: ignore[arg-type]
    kube = _Kube(SERVICE, down, SERVICE)
    calls = _reconciles(monkeypatch, [kopf.TemporaryError("applying the objects failed: 503", delay=0)])
    later = Later()
    try:
        owned_deleted.owned_object_deleted(kube, FAST, later, "team", "s", DEPLOYMENT, RecordingLog())  # type: ignore[arg-type]
        _settle(later)
    finally:
        later.stop()
    assert len(calls) == 2, f"reconcile ran {len(calls)} time(s), the service was read {kube.gets} time(s)"


def test_a_deleted_deployment_is_retried_at_most_write_attempts_times_under_one_key(monkeypatch):
    """Defended: a reconcile that always raises kopf.TemporaryError (a heal never finishing, a name conflict a
    tenant keeps up) runs cfg.write_attempts times in all, one timer a service at a time, then says so once;
    no timer is left."""
    calls = _reconciles(monkeypatch, [kopf.TemporaryError("the recorded heal is not finished yet", delay=0)] * 99)
    later, log = Later(), RecordingLog()
    try:
        with peak_timers(later) as peak:
            owned_deleted.owned_object_deleted(_Kube(SERVICE), FAST, later, "team", "s", DEPLOYMENT, log)  # type: ignore[arg-type]
            _settle(later)
    finally:
        later.stop()
    assert len(calls) == FAST.write_attempts
    assert peak[0] <= 1 and not later._timers
    assert sum("not applied yet" in line for line in log.lines) == 1
    assert sum("was deleted" in line for line in log.lines) == 1


def test_a_retry_stops_once_the_service_is_deleted(monkeypatch):
    """Defended: the service deleted (or being deleted) between two attempts: the retry reads it, finds it gone,
    and applies nothing; a service made again under the name (a new uid) is not the Deployment's controller."""
    for after in (None, {"metadata": {**SERVICE["metadata"], "deletionTimestamp": "now"}}, {"metadata": {"uid": "x"}}):
        calls = _reconciles(monkeypatch, [kopf.TemporaryError("applying the objects failed: 503", delay=0)])
        later = Later()
        try:
            owned_deleted.owned_object_deleted(
                _Kube(SERVICE, after), FAST, later, "team", "s", DEPLOYMENT, RecordingLog()
            )  # type: ignore[arg-type]
            _settle(later)
        finally:
            later.stop()
        assert len(calls) == 1, after


@pytest.mark.parametrize("status", [403, 400])
def test_a_refused_apply_is_not_retried(monkeypatch, caplog, status):
    """Defended: a reconcile that raises something other than kopf.TemporaryError (a 403 where the operator
    watches namespaces it may not write, the API server refusing the rendered objects) is logged once (the
    re-apply runs off kopf's workers, in kube.later.Later): no retry, no loop."""
    calls = _reconciles(monkeypatch, [ApiException(status=status, reason="Forbidden")])
    later = Later()
    try:
        with caplog.at_level(logging.ERROR):
            owned_deleted.owned_object_deleted(_Kube(SERVICE), FAST, later, "team", "s", DEPLOYMENT, RecordingLog())  # type: ignore[arg-type]
            _settle(later)
        assert not later._timers
    finally:
        later.stop()
    assert len(calls) == 1
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


# --- 4. diagnose's windows grow once (1400bd8, log_file.windows) -----------------------------------------


class _SplitLog(FakeFile):
    """A regular file (fstat faked) whose head is `head` repeated (at most 1 MiB returned a read: it decodes to
    as little at any size) and whose tail is `tail` repeated; reads are recorded as (offset, size)."""

    def __init__(self, size: int, head: bytes, tail: bytes) -> None:
        super().__init__(size)
        self.head, self.tail = head, tail

    def record(self, n: int) -> object:
        return (self.pos, n)

    def content(self, n: int) -> bytes:
        pattern, take = (self.head, min(n, 2**20)) if self.pos == 0 else (self.tail, n)
        return (pattern * (take // len(pattern) + 1))[:take]


def test_a_head_that_never_decodes_long_enough_grows_within_the_bound_then_reads_through(monkeypatch):
    """Defended: a 50 GB node log whose head is the kubelet's empty partial records and whose tail is ordinary
    records: only the head grows (4, 16, 64 MiB: more than once, as the tail stays 16 MiB), each head+tail pair
    within GROWTH x (HEAD_RAW + TAIL_RAW) = 80 MiB; then the file is read through from where it stood."""
    stamp = b"2026-12-01T00:00:00.000000000Z stdout "
    fake = _SplitLog(50 * 10**9, stamp + b"P \n", stamp + b"F " + b"y" * 100 + b"\n")
    info = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, fake.size, 0, 0, 0))
    monkeypatch.setattr(log_file, "os", types.SimpleNamespace(fstat=lambda fd: info))
    out = log_file.windows(fake, utf8=True)  # type: ignore[arg-type]
    assert out is fake and fake.pos == 0
    pairs = [fake.reads[i][1] + fake.reads[i + 1][1] for i in range(0, len(fake.reads), 2)]
    assert pairs and max(pairs) <= log_file.GROWTH * (log_file.HEAD_RAW + log_file.TAIL_RAW) == 80 * 2**20


# --- 5. serve's prefill context parallelism in every spelling (1400bd8, serve_sizing) ----------------------


@pytest.mark.parametrize(
    ("flags", "ranks"),
    [
        ("--prefill_context_parallel_size 2", 2),
        ("--prefill_context_parallel_size=4", 4),
        ("-pcp=2", 2),
        ("-pcp 2 --prefill-context-parallel-size 4", 4),  # (the last wins, as in argparse)
        ("--prefill-context-parallel-size.x 2", None),  # (a dotted key: not plainly a count)
        ("-pc 2", None),
        ("--prefill-context-parallel-size 0", None),
        ("--prefill-context-parallel-size", None),
        ("-tp 2", 1),
    ],
)
def test_serve_reads_prefill_context_parallelism_plainly_or_says_it_cannot(flags, ranks):
    """Defended: underscores and `=` read as vLLM reads them; an abbreviation, a dotted key, a missing or
    non-positive value say 'not plainly' (None), never a count that undercounts the GPUs vLLM takes."""
    assert prefill_context_ranks(parse_args(flags).engine.extra_args) == ranks
