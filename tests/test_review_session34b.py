"""Hostile review (session 34b) of four changes: the quantized fallback with the share or context its KV cache
needs (remedy/resource_steps.py `quantized_model`, remedy_gate.ONLY_WITH, plan.py's limits for a quantized
change; d6cb13b), `diagnose`'s windows grown until they decode long enough (log_file.windows, cf53315), a
deleted Deployment applied again (reconcile.deployment_deleted, 276a8a7), and `serve` counting prefill context
parallelism (serve_sizing.prefill_context_ranks, cf53315).

Each xfail(strict) test is a defect found today, asserting the right behaviour; the plain tests are attacks
that were defended."""

from __future__ import annotations

import os
import stat
import types
from typing import Any

import pytest

from fake_file import FakeFile
from vllm_autoheal import log_file
from vllm_autoheal.api import HealBounds, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.engine import parse_args
from vllm_autoheal.flag_tokens import spelled_by
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube import owned_deleted, reconcile
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.later import Later
from vllm_autoheal.local_ranks import prefill_context_ranks
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import Limits, check
from vllm_autoheal.serve_sizing import gpus_taken
from vllm_autoheal.vllm_release import parse_version

from operator_harness import Emulator, RecordingLog, drain, wait_for
from samples import SPEC, config_shape

LLAMA70 = config_shape("llama-3.1-70b")
V025 = parse_version("0.25.0")
H100 = "NVIDIA-H100-80GB-HBM3"
BF16 = "meta-llama/Llama-3.1-70B-Instruct"
FP8 = "RedHatAI/Llama-3.1-70B-Instruct-FP8"


def _fallback_heal(
    flags: str = "--max-model-len 8192",
    history: list[dict[str, Any]] | None = None,
    free: float | None = None,
    heal: dict[str, Any] | None = None,
    engine_flags: str | None = None,
    model: str | None = None,
):
    """A weights_load_oom of Llama-3.1-70B (bf16) on one H100 at utilization 0.9 (the operator's default), under
    the CRD's default heal policy (Quantize, RaiseGpuMemoryUtilization, LowerMaxModelLen allowed; no split) with
    the fp8 fallback allowed. `engine_flags`/`model`: what is deployed now, where it is not the spec's."""
    policy: dict[str, Any] = {"quantizedFallback": {"allowed": True, "model": FP8, "method": "fp8"}, **(heal or {})}
    spec = VLLMServiceSpec(model=BF16, engine=parse_args(flags).engine, heal=policy)
    inv = Inventory(
        gpu_total_gib=lookup(H100).memory_gib, gpu_name=H100, shape=LLAMA70, release=V025, gpu_free_gib=free
    )
    engine = parse_args(engine_flags).engine if engine_flags else None
    return plan_heal(spec, Diagnosis(cause=Cause.WEIGHTS_LOAD_OOM), history or [], inv, engine, model=model)


# --- 1. the quantized fallback with its share or context (d6cb13b) -----------------------------------------


def test_the_quantized_fallback_comes_with_the_least_share_that_holds_its_cache():
    """The baseline of the attacks below: fp8 at 0.9 holds 5,296 of 8,192 tokens; the least share that holds
    the context is 0.92, and 0.93 comes with the checkpoint in one change, within the bound (0.95)."""
    r = _fallback_heal()
    assert r.action == "Quantize" and r.changes == {"model": FP8, "quantization": "fp8", "gpu_memory_utilization": 0.93}
    assert "(fits)" in r.expected, r.expected


def test_the_quantized_fallback_never_raises_the_share_to_one_that_ran_out_of_memory_while_serving():
    """Severity: medium (a certain repeat of a crash the operator already healed: the runtime OOM comes back).
    Input: the fp8 fallback case above (Llama-3.1-70B bf16 on one H100, max_model_len 8192, 0.9), with status
    history showing a runtime_oom that ran at utilization 0.91 on this one GPU and was healed by a utilization
    cut (LowerGpuMemoryUtilization: plan.outside_budget_ceiling makes 0.91 the ceiling, 'no raise goes back to
    it'); now a weights_load_oom.
    Now: Quantize {model, quantization fp8, gpu_memory_utilization 0.93}: plan.py replaces ctx.limits with
    _limits(..., None) for any change holding `quantization` (meant for a split's own floor) and so drops the
    ceiling; the gate lets 0.93 >= 0.91 through. The quantized model's activations, which ran out outside the
    budget at 0.91, are the same width (the hidden size is unchanged).
    Right: the ceiling holds for a change on the same split: the raise stays below 0.91 (or the context cut
    comes instead, or Quantize goes alone)."""
    history = [{"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization", "ran_util": 0.91, "ran_gpus": 1}]
    r = _fallback_heal(history=history)
    assert r.changes.get("gpu_memory_utilization", 0.0) < 0.91, r.summary()
    assert r.action == "Quantize" and r.changes["max_model_len"] < 8192, r.summary()  # (the cut comes instead)


def test_the_quantized_fallback_share_stays_within_the_bound_and_free_memory():
    """Defended: the raise is bounded by raise_limit (maxGpuMemoryUtilization and what the GPU's free memory
    allows): at a 0.91 bound, or with 74 GiB free, the context cut comes instead; with 75 GiB free the share is
    the least that fits and no more than free memory allows (the 1% margin dropped)."""
    r = _fallback_heal(heal={"bounds": {"maxGpuMemoryUtilization": 0.91}})
    assert r.action == "Quantize" and "gpu_memory_utilization" not in r.changes and r.changes["max_model_len"] < 8192
    r = _fallback_heal(free=74.0)
    assert r.action == "Quantize" and "gpu_memory_utilization" not in r.changes, r.summary()
    r = _fallback_heal(free=75.0)
    assert r.changes.get("gpu_memory_utilization") == 0.92, r.summary()


def test_the_quantized_fallback_context_never_goes_below_the_bound():
    """Defended: where the context the fp8 cache holds (5,136 with the 3% margin) is below
    spec.heal.bounds.minMaxModelLen, shorter_context refuses it, the veto refuses the bare Quantize, and the plan
    gives up saying why; nothing below the bound is written."""
    heal = {"bounds": {"minMaxModelLen": 6000}, "allowedActions": ["Quantize", "LowerMaxModelLen"]}
    r = _fallback_heal(heal=heal)
    assert r.action == "GiveUp" and "Quantize refused" in r.reason and not r.changes, r.summary()


def test_the_gate_lets_a_weights_crash_move_the_share_only_with_a_model_that_changes():
    """Severity: medium (the gate's own rule, 'these moves only go with a split or the quantized checkpoint',
    is a key test only; see the reachable plan below).
    Input: check('weights_load_oom', {'model': <the model deployed>, 'gpu_memory_utilization': 0.95}, ...) and
    the same with max_model_len 4096.
    Now: None (allowed). A tensor_parallel_size companion that does not change is refused (its direction is UP),
    a `model` one is not (ANY, and the fingerprint differs by the share alone).
    Right: refused, as the share alone is ('moves for weights_load_oom only with tensor_parallel_size or
    model'): the companion must change."""
    engine = parse_args("--max-model-len 8192 --quantization fp8").engine
    limits = Limits(HealBounds())
    assert check("weights_load_oom", {"model": FP8, "gpu_memory_utilization": 0.95}, engine, FP8, None, limits)
    assert check("weights_load_oom", {"model": FP8, "max_model_len": 4096}, engine, FP8, None, limits)


def test_a_running_quantized_fallback_that_fails_to_load_is_not_healed_by_a_context_cut():
    """Severity: medium (a restart spent on a change that cannot help, and the user's context cut by 37%).
    Input: StatusOverrides mode; the fp8 fallback was deployed by an earlier heal of a KV refusal the planner
    took for the weights' failure (plan.weights_leave_no_cache: history 'kv_cache_insufficient/Quantize'), so
    status.effectiveModel is the fp8 checkpoint, status.effective has quantization fp8, spec.model is still the
    bf16 one. Its pods now fail loading the weights (weights_load_oom), with no free figure (the memory model
    says the fp8 weights fit on an empty GPU: others hold memory, _others_hold_memory).
    Now: Quantize {model: the fp8 checkpoint (unchanged), quantization fp8 (unchanged), max_model_len 5136}: the
    weights load before any KV cache is sized, so the cut cannot help; the gate's ONLY_WITH takes the unchanged
    `model` key as the companion that allows it.
    Right: no Quantize to the checkpoint already deployed (plan_heal's `model`), so no context cut nor share
    raise for a weights crash without a change of model or split: here a give-up (no split allowed)."""
    history = [{"cause": "kv_cache_insufficient", "action": "Quantize"}]
    r = _fallback_heal(history=history, engine_flags="--max-model-len 8192 --quantization fp8", model=FP8)
    assert not (r.action == "Quantize" and r.changes.get("model") == FP8), r.summary()


# --- 2. diagnose's windows, grown until they decode long enough (cf53315) --------------------------------


class _HugeLog(FakeFile):
    """A regular file of `size` bytes (as fstat reports it) whose every byte is `pattern` repeated: a node's log
    of partial records (the kubelet cuts a line that never ends at 16 KiB, a tqdm bar redrawn with \\r). Reads
    are recorded; what each returns is at most `cap` bytes of the pattern (1 MiB: it decodes to as little at any
    size, and a test holds no GiB)."""

    def __init__(self, size: int, pattern: bytes, cap: int = 2**20) -> None:
        super().__init__(size)
        self.pattern, self.cap = pattern, cap

    def content(self, n: int) -> bytes:
        take = min(n, self.cap)
        return (self.pattern * (take // len(self.pattern) + 1))[:take]


@pytest.mark.parametrize(
    "pattern",
    [
        b"2026-12-01T00:00:00.000000000Z stdout P \n",  # partial records of nothing
        b"2026-12-01T00:00:00.000000000Z stdout P " + b"x" * 200 + b"\n",  # one line that never ends
    ],
    ids=["empty-partials", "never-ending-line"],
)
def test_a_huge_log_whose_windows_never_decode_long_enough_is_read_in_bounded_memory(monkeypatch, pattern):
    """Severity: high (`diagnose FILE` of a large node log is OOM-killed, or takes minutes more, where reading
    it through took 135 s in bounded memory).
    Input: a regular 50 GB file of CRI records `<stamp> stdout P <text>`, the kubelet's partial records: either
    empty, or of a line that never ends (its joined line is kept to container_log.JOINED_MAX, 1 MiB: always
    less than TAIL_BYTES + MAX_LINE). fstat is faked to say 50 GB; each read is recorded.
    Now: head/tail reads of 4+16 MiB, 16+64, 64+256, 256 MiB+1 GiB, 1+4 GiB, 4+16 GiB (about 27 GB in all, each
    pair held and decoded at once: f.read(16 GiB), its str, unpacked's copies), then the file read through.
    Right: the growth stops at a bound on memory (no read above 1 GiB here), then the file is read through as a
    stream, in CHUNKs."""
    fake = _HugeLog(50 * 10**9, pattern)
    st = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, fake.size, 0, 0, 0))
    monkeypatch.setattr(log_file, "os", types.SimpleNamespace(fstat=lambda fd: st))
    out = log_file.windows(fake, utf8=True)  # type: ignore[arg-type]
    assert out is fake and fake.pos == 0  # read through, from where it stood
    assert max(fake.reads) <= 2**30, [f"{n / 2**30:.3g} GiB" for n in fake.reads]


def test_a_huge_log_whose_windows_decode_long_enough_is_read_as_two_windows(monkeypatch):
    """Defended: a node's log of ordinary records (100 characters a line) decodes long enough at the first read:
    20 MiB read of 50 GB, no growth."""
    fake = _HugeLog(50 * 10**9, b"2026-12-01T00:00:00.000000000Z stdout F " + b"y" * 100 + b"\n", cap=2**25)
    st = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, fake.size, 0, 0, 0))
    monkeypatch.setattr(log_file, "os", types.SimpleNamespace(fstat=lambda fd: st))
    out = log_file.windows(fake, utf8=True)  # type: ignore[arg-type]
    assert out is not fake and sorted(fake.reads) == [log_file.HEAD_RAW, log_file.TAIL_RAW]


# --- 3. a deleted Deployment applied again (276a8a7) -----------------------------------------------------


class _FakeKube:
    def __init__(self, services: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.services, self.gets = services, []

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        self.gets.append((ns, name))
        return self.services.get((ns, name))


def _dep(ns: str, name: str, uid: str) -> dict[str, Any]:
    ref = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "name": name, "uid": uid}
    return {"metadata": {"name": name, "namespace": ns, "ownerReferences": [{**ref, "controller": True}]}}


@pytest.mark.parametrize(
    ("dep_ns", "service", "why"),
    [
        ("attacker", {"metadata": {"name": "victim", "namespace": "prod", "uid": "u-victim"}}, "another namespace"),
        (
            "prod",
            {"metadata": {"name": "victim", "namespace": "prod", "uid": "u-victim", "deletionTimestamp": "now"}},
            "the service going",
        ),
        ("prod", {"metadata": {"name": "victim", "namespace": "prod", "uid": "u-new"}}, "a new service, same name"),
    ],
)
def test_a_deleted_deployment_reconciles_no_service_it_does_not_name_in_its_namespace(
    monkeypatch, dep_ns, service, why
):
    """Defended: a Deployment deleted in the tenant's namespace, labelled with another namespace's service and
    its uid as controller, is looked up in its own namespace (nothing there); a service being deleted
    (deletionTimestamp: foreground deletion deletes its Deployment first) and a service of the same name made
    again (a new uid: the garbage collector deleting the old one's Deployment) are not reconciled."""
    called: list[Any] = []
    monkeypatch.setattr(reconcile, "reconcile", lambda *a, **k: called.append(a))
    monkeypatch.setattr(owned_deleted, "SETTLE_S", 0.0)
    kube = _FakeKube({("prod", "victim"): service})
    dep = _dep(dep_ns, "victim", "u-victim")
    later = Later()
    try:
        owned_deleted.owned_object_deleted(kube, OperatorConfig(), later, dep_ns, "victim", dep, RecordingLog())  # type: ignore[arg-type]
        drain(later)
    finally:
        later.stop()
    assert called == [], why


@pytest.mark.kmock(cls=Emulator)
async def test_a_deleted_deployment_whose_apply_fails_once_is_applied_again(cluster):
    """Severity: medium (a service left with no Deployment, hence no server, after one API blip; the status
    still says what it said).
    Input: a VLLMService `blip` settled; the operator's next server-side apply of its Deployment answers 503
    once (an API server restarting, etcd leader change); a person deletes the Deployment.
    Now: deployment_deleted -> reconcile -> apply_all raises the 503 -> kopf.TemporaryError('applying the
    objects failed') -> swallowed (meant for 'a heal under way'); an event handler is not retried by kopf, so
    the Deployment never comes back (checked for 8 s, with retry_delay_s 0.5).
    Right: a transient failure is retried (the handler's own Later, as heal.complete does), and the Deployment is
    applied again within a few retry delays."""
    await cluster.create_vsvc("blip", SPEC)
    await wait_for(lambda: cluster.deployment_now("blip"), what="deployment")
    await cluster.settled("blip")
    cluster.kmock.fail("POST", "/deployments", 503, times=1)  # (the create of the Deployment again)
    await cluster.call("DELETE", "/apis/apps/v1/namespaces/default/deployments/blip")
    await wait_for(lambda: cluster.deployment_now("blip"), timeout=8.0, what="the deployment applied again")


# --- 4. serve counts prefill context parallelism (cf53315) -----------------------------------------------


@pytest.mark.parametrize("token", ["--prefill-context", "--prefill", "--prefill_context-parallel-size"])
def test_serve_counts_every_spelling_of_prefill_context_parallelism_vllm_reads(token):
    """Severity: low (serve only: a heal sized from the free memory of half the GPUs vLLM takes, as the
    session-34 defect this change fixed for `-pcp 2`).
    Input: serve's extra flags `<token> 2` with TP 1, where flag_tokens.spelled_by(token,
    '--prefill-context-parallel-size') is True (the spellings the CRD refuses as prefill context parallelism).
    Now: gpus_taken 1 (the name is neither in _PCP nor starts with the abbreviation prefixes it checks).
    Right: 2, or None (the flags do not say plainly): never the 1 GPU that undercounts."""
    assert spelled_by(token, "--prefill-context-parallel-size")
    engine = parse_args(f"{token} 2").engine
    assert prefill_context_ranks(engine.extra_args) in (2, None)
    assert gpus_taken(engine) in (2, None)


@pytest.mark.parametrize(
    ("flags", "gpus"), [("-pcp 2", 2), ("--prefill-context-parallel-size=4 -tp 2", 8), ("-pc 2", None)]
)
def test_serve_counts_the_plain_spellings_of_prefill_context_parallelism(flags, gpus):
    """Defended: the exact spellings count (TP x PP x PCP), a single-dash abbreviation says 'not plainly'."""
    assert gpus_taken(parse_args(flags).engine) == gpus
