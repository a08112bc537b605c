"""Session 41c: a hostile review of three changes (1fb6df2 and 88876e0): the context a shape-free heal sizes from
vLLM's printed budget and concurrency (kv_steps.concurrency_held), the in-flight heal held to the spec's policy
(resources.past_policy in heal_apply._complete), and the rollout status moved only by the Deployment the service
controls (ownership.controlled_by in reconcile.deployment_progress). Each test asserts the right behaviour and is a
strict xfail while the code does otherwise."""

from __future__ import annotations

import copy
import re

import pytest

from test_review_session41_heal import GPU_FIXTURES, _runtime_oom_at_the_kv_heals_share
from test_review_session41_tenant import (
    HEALED_SPEC,
    LOG,
    NS,
    OWNER_SPEC,
    StubKube,
    _forged_in_flight,
    _healed_status,
    _quiet,  # noqa: F401  (the autouse fixture that quiets events)
    _vsvc,
    decoy_deployment,
)
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube import handlers, heal_apply, resources
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.remedy import Inventory, plan_heal

H200 = lookup("NVIDIA-H200")


def _h200() -> Inventory:
    return Inventory(gpu_total_gib=H200.memory_gib, gpu_name=H200.name)  # (no config.json: the shape is unknown)


# --- (1) concurrency_held: a cut the bounds forbid to shorten comes alone ------------------------------------


def test_a_runtime_cut_whose_context_the_bounds_keep_is_not_planned_where_vllms_figures_say_it_no_longer_fits():
    # The real vLLM 0.25 serving OOM on the H200 (failure-logs/runtime.log), its figures those of the real KV heal it
    # follows: 17.45 GiB of cache, 1.09x one request of 131,072 (142,928 tokens). The owner's bounds keep the whole
    # context: minMaxModelLen 131072. The cut 0.24 -> 0.22 takes 0.02 x 139.8 = 2.80 GiB off the cache: 14.65 GiB,
    # which holds 131,072 x 14.65 / (17.45 / 1.085) = 119,400 tokens by vLLM's own figures (concurrency_held says
    # so: the same heal without the bound shortens to 115,840). vLLM refuses the next start ("16.0 GiB KV cache is
    # needed ... (14.65 GiB)"). Right: not that cut (as where the shape is known: the next step, max_num_seqs).
    d = classify(Signals(log=_runtime_oom_at_the_kv_heals_share()))
    assert d.cause == "runtime_oom" and d.numbers["max_concurrency"] == 1.09
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 131072, "gpuMemoryUtilization": 0.24, "enforceEager": True},
        heal={"bounds": {"minMaxModelLen": 131072}},
    )
    r = plan_heal(spec, d, inventory=_h200())
    util = r.changes.get("gpu_memory_utilization", 0.24)
    left = 17.45 - (0.24 - util) * d.numbers["gpu_total_gib"]
    assert r.changes.get("max_model_len", 131072) <= 142928 * left / 17.45, r.summary()


def test_a_capture_cut_whose_context_the_bounds_keep_gives_way_to_enforce_eager():
    # The real vLLM 0.25 capture OOM on the H200 at 0.995 (failure-logs/capture.log): 122.77 GiB of cache holding
    # 1,005,712 tokens, here with max_model_len 990,000 (1.01x), and minMaxModelLen 990000. The cut 0.995 -> 0.95
    # leaves 116.48 GiB: 954,200 tokens. Without the bound the heal shortens to 915,632 (so it knows); with it, the
    # cut comes alone and vLLM refuses 990,000 at the next start. With the shape known room_for_graphs returns None
    # here and EnforceEager follows, which keeps the 122.77 GiB cache.
    log = (GPU_FIXTURES / "failure-logs" / "capture.log").read_text()
    log = log.replace("'max_model_len': 8192", "'max_model_len': 990000")
    log = re.sub(
        r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x",
        "Maximum concurrency for 990,000 tokens per request: 1.01x",
        log,
    )
    d = classify(Signals(log=log))
    assert d.cause == "cudagraph_capture_oom" and d.numbers["available_kv_gib"] == 122.77
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 990000, "gpuMemoryUtilization": 0.995},
        heal={"bounds": {"minMaxModelLen": 990000}},
    )
    r = plan_heal(spec, d, inventory=_h200())
    util = r.changes.get("gpu_memory_utilization", 0.995)
    left = 122.77 - (0.995 - util) * d.numbers["gpu_total_gib"]
    assert r.changes.get("max_model_len", 990000) <= 1005712 * left / 122.77, r.summary()


# --- (2) past_policy: a forged in-flight target that still passes ---------------------------------------------


def _forged(target: dict) -> dict:
    forged = _forged_in_flight()
    forged["target"] = target
    return forged


def test_a_forged_in_flight_heal_without_a_memory_limit_does_not_remove_the_specs_limit():
    # A writer of vllmservices/status sets status.inFlight {applied: false, previous: the spec as it reads, target:
    # the spec's own model and engine, memoryLimit left out}. No heal plans that: the planner's target carries the
    # limit that ran (the spec's 32Gi), raised only up to maxMemoryLimit (RaiseMemoryLimit).
    # Now: _complete passes it (memory is None), spec_patch writes {"resources": {"limits": {"memory": None}}}:
    # spec.resources.limits is {} and the Deployment's container has no memory limit.
    target = {"engine": OWNER_SPEC["engine"], "model": OWNER_SPEC["model"]}
    kube = StubKube(_vsvc(OWNER_SPEC, {"baseline": OWNER_SPEC["engine"], "inFlight": _forged(target)}))
    heal_apply.complete(kube, OperatorConfig(), None, NS, "svc", LOG)  # type: ignore[arg-type]
    assert kube.body["spec"]["resources"]["limits"].get("memory") == "32Gi", kube.body["spec"]
    for manifests in kube.applied:
        dep = next(m for m in manifests if m["kind"] == "Deployment")
        limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits.get("memory") == "32Gi", limits


def test_a_forged_in_flight_heal_does_not_bring_another_repositorys_code_through_extra_args():
    # The same status writer as test_review_session41_tenant's first test, keeping the model, GPUs and memory the
    # check reads, and putting the other repository in extraArgs instead (the CRD's extraArgs rules refuse
    # `--model`, not `--tokenizer` nor `--speculative-config '{"model": ...}'`). vLLM loads the tokenizer with
    # trust_remote_code: its Python runs in the owner's pod. No heal plans extraArgs (remedy/ never changes them), so
    # a target whose extraArgs differ from what ran is not the operator's.
    engine = {
        **OWNER_SPEC["engine"],
        "extraArgs": ["--tokenizer", "attacker/remote-code-tokenizer", "--trust-remote-code"],
    }
    target = {"engine": engine, "model": OWNER_SPEC["model"], "memoryLimit": "32Gi"}
    kube = StubKube(_vsvc(OWNER_SPEC, {"baseline": OWNER_SPEC["engine"], "inFlight": _forged(target)}))
    heal_apply.complete(kube, OperatorConfig(), None, NS, "svc", LOG)  # type: ignore[arg-type]
    assert "attacker/remote-code-tokenizer" not in (kube.body["spec"]["engine"].get("extraArgs") or []), kube.body[
        "spec"
    ]
    for manifests in kube.applied:
        dep = next(m for m in manifests if m["kind"] == "Deployment")
        assert "attacker/remote-code-tokenizer" not in dep["spec"]["template"]["spec"]["containers"][0]["command"]


# --- (3) controlled_by: an ownerReference is anyone's to copy -------------------------------------------------


def test_a_decoy_deployment_with_a_copied_owner_reference_does_not_end_the_heal_in_flight(monkeypatch):
    # The decoy of test_review_session41_tenant's decoy test, plus the ownerReference it reads off the service's own
    # Deployment `svc` (or the VLLMService's metadata.uid): {apiVersion, kind VLLMService, name svc, uid, controller:
    # true}. The operator's Deployment is named after the service (resources.deployment): a Deployment of another name
    # is never its rollout, whoever it names as its controller.
    spec = HEALED_SPEC
    status, template = _healed_status(spec)
    kube = StubKube(_vsvc(spec, status))
    monkeypatch.setattr(handlers, "_kube", lambda memo: kube)
    owner = {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "name": "svc",
        "uid": kube.body["metadata"]["uid"],
        "controller": True,
    }
    decoy = decoy_deployment(template, owner=owner)
    handlers.deployment_progress(body=decoy, type="MODIFIED", namespace=NS, memo={}, logger=LOG)  # type: ignore[arg-type]
    after = kube.body["status"]
    assert after.get("inFlight") is not None, "the decoy's readiness ended the heal in flight"
    assert after.get("phase") != "Running", after.get("phase")


def test_the_services_own_deployment_still_ends_the_heal():
    """The control for (3): the Deployment the operator renders (named after the service, its ownerReference by uid)
    ends the rolled-out heal."""
    spec = HEALED_SPEC
    status, template = _healed_status(spec)
    kube = StubKube(_vsvc(spec, status))
    dep = next(m for m in resources.render(heal_apply.parse(kube.body)) if m["kind"] == "Deployment")
    dep = copy.deepcopy(dep)
    dep["metadata"].update(uid="dep-uid", generation=1)
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
    assert dep["spec"]["template"]["metadata"]["annotations"][resources.ENGINE_HASH] == template
    from vllm_autoheal.kube import reconcile

    reconcile.deployment_progress(kube, OperatorConfig(), NS, "svc", dep)  # type: ignore[arg-type]
    assert kube.body["status"].get("inFlight") is None


def _gemma3_runtime_oom() -> str:
    """The real vLLM 0.25 serving OOM on the H200 (failure-logs/runtime.log) with the figures of gemma-3-1b (5 of 6
    layers a 512-token sliding window), max_model_len 32,768 and max_num_batched_tokens 8,192, at a 2.95 GiB
    budget: vLLM's own figure for that model (window-logs/window-gemma3-150-b8192.log, a real run) is 0.32 GiB for one
    request of 32,768, so 2.95 GiB holds 9.22 of them."""
    log = (GPU_FIXTURES / "failure-logs" / "runtime.log").read_text()
    log = log.replace("/scratch/models/llama-3.1-8b", "/scratch/models/gemma-3-1b")
    log = log.replace("'max_model_len': 8192", "'max_model_len': 32768")
    log = log.replace("'gpu_memory_utilization': 0.5", "'gpu_memory_utilization': 0.24")
    log = log.replace("Available KV cache memory: 53.8 GiB", "Available KV cache memory: 2.95 GiB")
    log = log.replace("GPU KV cache size: 440,688 tokens", "GPU KV cache size: 302,120 tokens")
    return re.sub(
        r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x",
        "Maximum concurrency for 32,768 tokens per request: 9.22x",
        log,
    )


@pytest.mark.xfail(
    strict=True,
    reason="a limit: without the model's config nothing vLLM prints tells a sliding window (since 0.25 its 'GPU KV "
    "cache size' is concurrency x max_model_len), so a cut's context is sized in proportion, which a window's "
    "fixed part breaks: gemma-3-1b's 0.154 GiB is said to hold 15,280 tokens where it holds ~6,000. vLLM's refusal "
    "at the next start then sizes the context by its own estimate (before, the cut came with no context at all).",
)
def test_a_shape_free_cut_does_not_size_a_windowed_models_context_in_proportion():
    # vLLM 0.25 on gemma-3-1b, batched 8,192 (real, window-logs/window-gemma3-150-b8192.log): 150 MiB of cache holds
    # 5,472 tokens, and one request of 32,768 needs 0.32 GiB. Each of its 22 windowed layers keeps
    # min(511 + 8,192, context) tokens, its 4 global layers the whole context: 26 x 1 KiB a token up to 8,703 tokens,
    # so any context of 8,704 or more needs 8,703 x 26 KiB = 0.216 GiB at least.
    # The runtime cut 0.24 -> 0.22 takes 2.80 GiB of the H200 off the 2.95 GiB cache: 0.154 GiB is left, under that
    # floor. concurrency_held: 32,768 x 0.154 / (2.95 / 9.215) = 15,760 tokens, 15,280 with its margin; vLLM refuses
    # it at the next start. The docstring's "a smaller one a little less" is 2.7x here. Without the shape the
    # printed figures cannot tell a window: the cut that relies on the proportion must not come (the next step,
    # max_num_seqs, keeps the cache), or its context must be one vLLM holds.
    d = classify(Signals(log=_gemma3_runtime_oom()))
    assert d.cause == "runtime_oom" and d.numbers["max_concurrency"] == 9.22 and d.numbers["available_kv_gib"] == 2.95
    spec = VLLMServiceSpec(
        model="google/gemma-3-1b-it",
        engine={"maxModelLen": 32768, "gpuMemoryUtilization": 0.24, "maxNumBatchedTokens": 8192, "enforceEager": True},
    )
    r = plan_heal(spec, d, inventory=_h200())
    util = r.changes.get("gpu_memory_utilization", 0.24)
    left = 2.95 - (0.24 - util) * d.numbers["gpu_total_gib"]
    if util < 0.24:
        assert left >= 0.216 or r.changes.get("max_model_len", 32768) < 8704, r.summary()
