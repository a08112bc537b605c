"""Session 41's fifth hostile review, of 188f4a2 and ca54928: a utilization cut that fits vLLM's share to the free
memory declined where its cache no longer holds a context the bounds keep (share_steps.with_context_held, now None);
the context sized on the smallest pipeline stage (kv_steps.smaller_budget) beside vLLM 0.34's warm-up loss and an
fp8 cache; and the owner chain a crash must end at, after deployment_progress learned that an ownerReference's uid
is anyone's to copy. Each test asserts the right behaviour, with the numbers in a comment, and is a strict xfail
while the code does otherwise."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from test_review_session41d import IMAGE, V034, _pp_refusal
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube import ownership
from vllm_autoheal.remedy import Inventory, plan_heal

H200 = lookup("NVIDIA-H200")
L4 = lookup("NVIDIA-L4")
GPU_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu"


# --- 1. gpu_util_exceeds_free: the cut declined where the context may not be shortened ---------------------------


def _refused_beside_a_grown_process() -> str:
    """The real healthy start of heal-runs/kv-beside-30g.log (Llama-3.1-8B at 0.24, max_model_len 131,072 on the
    H200: "Available KV cache memory: 17.45 GiB", "Maximum concurrency for 131,072 tokens per request: 1.09x"),
    then the next start of the same flags refused as heal-runs/thief.log's is, another process having grown:
    "Free memory on device cuda:0 (30.00/139.8 GiB) on startup is less than desired GPU memory utilization
    (0.24, 33.55 GiB)" (the log of `vllm-autoheal serve`, or one a user hands to `diagnose`)."""
    kv = (GPU_FIXTURES / "heal-runs" / "kv-beside-30g.log").read_text().splitlines()
    healthy = [line for line in kv[129:213] if not line.startswith("[vllm-autoheal]")]
    thief = (GPU_FIXTURES / "heal-runs" / "thief.log").read_text().splitlines()
    start = next(i for i, line in enumerate(thief) if line.startswith("[vllm-autoheal] starting"))
    end = next(i for i, line in enumerate(thief) if line.startswith("[vllm-autoheal] healed"))
    refused = [
        line.replace("(38.77/139.8 GiB)", "(30.00/139.8 GiB)")
        .replace("(0.9, 125.82 GiB)", "(0.24, 33.55 GiB)")
        .replace("max_seq_len=8192", "max_seq_len=131072")
        for line in thief[start + 1 : end]
    ]
    return "\n".join(healthy + refused)


def _plan_refused(heal: dict[str, Any]):
    d = classify(Signals(log=_refused_beside_a_grown_process()))
    assert d.cause == "gpu_util_exceeds_free" and d.numbers["free_gib"] == 30.0
    assert d.numbers["available_kv_gib"] == 17.45 and d.numbers["max_concurrency"] == 1.09
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 131072, "gpuMemoryUtilization": 0.24}, heal=heal)
    # (no config.json: the shape is unknown, so vLLM's printed budget and concurrency size the context)
    return plan_heal(spec, d, inventory=Inventory(gpu_total_gib=H200.memory_gib, gpu_name=H200.name))


def test_a_share_cut_beside_a_grown_process_keeps_the_bounded_context_with_an_fp8_cache_rather_than_giving_up():
    # 30.00 GiB free of 139.8: fit_utilization_to_free cuts 0.24 -> 0.19 (26.56 GiB asked, 3.44 of margin). vLLM's
    # own figures: 17.45 GiB held 1.09x one request of 131,072 (16.08 GiB a request); at 0.19 the budget is
    # 17.45 - 0.05 x 139.8 = 10.46 GiB, 85,300 tokens in bf16. minMaxModelLen 131072 keeps the context, so
    # with_context_held returns None and the plan gives up: "no allowed change is left for gpu_util_exceeds_free
    # within the bounds (tried: none)". Before 188f4a2 the cut came alone (and vLLM's KV refusal that follows
    # was healed by Fp8KvCache: 170,600 tokens). An fp8 cache doubles the tokens a GiB holds: utilization 0.19
    # with --kv-cache-dtype fp8 holds 131,072 in one restart. Right: that change (or at least not a give-up).
    r = _plan_refused({"bounds": {"minMaxModelLen": 131072}})
    assert not r.gives_up, r.summary()
    util = r.changes.get("gpu_memory_utilization", 0.24)
    left = 17.45 - (0.24 - util) * 139.8
    tokens = 142928 * left / 17.45 * (2 if str(r.changes.get("kv_cache_dtype", "")).startswith("fp8") else 1)
    assert tokens >= r.changes.get("max_model_len", 131072), r.summary()


def test_the_give_up_after_a_declined_share_cut_says_the_cache_would_not_hold_the_kept_context():
    # The same refusal with Fp8KvCache not allowed: a give-up is right now (0.19 leaves ~85,300 tokens, the bound
    # keeps 131,072). Its reason is "no allowed change is left for gpu_util_exceeds_free within the bounds (tried:
    # none)." - as though no cut had been sized. The owner must read why: the cut to 0.19 that the free memory
    # allows leaves a cache short of the 131,072 tokens minMaxModelLen keeps.
    r = _plan_refused(
        {"bounds": {"minMaxModelLen": 131072}, "allowedActions": ["LowerGpuMemoryUtilization", "LowerMaxModelLen"]}
    )
    assert r.gives_up, r.summary()
    assert any(s in r.reason for s in ("131,072", "131072", "minMaxModelLen", "max_model_len")), r.reason


# --- 2. pipeline parallelism: the smallest stage -----------------------------------------------------------------


def test_a_context_cut_on_a_pipeline_under_0_34_counts_the_warm_up_loss_on_the_smallest_stage():
    # Two L4s, pipelineParallelSize 2, vLLM 0.34 (graphs captured: warm-up takes 0.99 GiB off each stage's cache),
    # no config.json. Stage 0 printed 2.00 GiB, stage 1 1.20 GiB; vLLM refused on stage 0: 8.00 GiB needed, 8,192
    # tokens estimated (4,096 a GiB). lower_max_model_len scales to the smallest stage (8,192 x 1.2 / 2.0 x 0.97 =
    # 4,768) and then by the refused stage's loss, (2.00 - 0.99) / 2.00 x 0.97: 2,335 -> max_model_len 2,320. Stage 1
    # after warm-up holds 1.20 - 0.99 = 0.21 GiB: 860 tokens. vLLM 0.34's check after warm-up (shrink_kv_cache_
    # configs) refuses 2,320 on stage 1. Right: at most 4,096 x (1.20 - 0.99) tokens, or another step.
    d = classify(Signals(log=_pp_refusal(2.0, 1.2, 8.0, 8192, 32768), exit_code=1, pipeline_parallel_size=2))
    assert d.subtype == "kv_check_fails_on_smallest_stage" and d.numbers["available_kv_gib"] == 1.2
    spec = VLLMServiceSpec(
        model="m", image=IMAGE, engine={"maxModelLen": 32768, "gpuMemoryUtilization": 0.9, "pipelineParallelSize": 2}
    )
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=L4.memory_gib, gpu_name=L4.name, release=V034))
    util = r.changes.get("gpu_memory_utilization", 0.9)
    after_warmup = 1.2 - 0.99 + (util - 0.9) * L4.memory_gib
    per_token = 2 if str(r.changes.get("kv_cache_dtype", "")).startswith("fp8") else 1
    assert r.gives_up or r.changes.get("max_model_len", 32768) <= 4096 * after_warmup * per_token, r.summary()


def test_an_fp8_cache_on_a_pipeline_holds_the_context_on_the_smallest_stage():
    # 41d's pipeline refusal (two L4s, PP 2, max_model_len 32,768): stage 0 2.00 GiB, stage 1 1.00 GiB, 8,192
    # tokens estimated on stage 0 (4,096 a GiB). Bounds: maxGpuMemoryUtilization 0.9 (no raise), minMaxModelLen
    # 4096 (the bf16 context cut, 3,973, is below it). The subtype's plan reaches fp8_kv_cache, which takes
    # vLLM's 8,192 whole: 2 x 8,192 x 0.99 -> max_model_len 16,208. Stage 1's 1.00 GiB holds 4,096 bf16 tokens,
    # 8,192 in fp8: vLLM refuses 16,208 there again. Right: fp8 with at most 8,192 (about 7,936 with a margin).
    d = classify(Signals(log=_pp_refusal(2.0, 1.0, 8.0, 8192, 32768), exit_code=1, pipeline_parallel_size=2))
    assert d.subtype == "kv_check_fails_on_smallest_stage" and d.numbers["available_kv_gib"] == 1.0
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 32768, "gpuMemoryUtilization": 0.9, "pipelineParallelSize": 2},
        heal={"bounds": {"minMaxModelLen": 4096, "maxGpuMemoryUtilization": 0.9}},
    )
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=L4.memory_gib, gpu_name=L4.name))
    if r.action == "Fp8KvCache":
        assert r.changes.get("max_model_len", 32768) <= 2 * 4096 * 1.0, r.summary()


# --- 3. ownership: a decoy Deployment with a copied ownerReference ------------------------------------------------

NS = "team-a"


def _ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    api = "vllm.autoheal.dev/v1alpha1" if kind == "VLLMService" else "apps/v1"
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def _obj(name: str, uid: str, *owners: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid, "ownerReferences": list(owners)}}


class _Reads:
    """The service `svc` (uid vsvc-1) with its own Deployment `svc`, and a decoy Deployment `decoy` that another
    tenant of the namespace created with the service's ownerReference copied onto it (the API server checks no
    owner's uid against the name), with the ReplicaSet the Deployment controller made for it."""

    def __init__(self) -> None:
        apps = f"/apis/apps/v1/namespaces/{NS}"
        self.objects = {
            f"{apps}/replicasets/svc-5d8f": _obj("svc-5d8f", "rs-1", _ref("Deployment", "svc", "dep-1")),
            f"{apps}/deployments/svc": _obj("svc", "dep-1", _ref("VLLMService", "svc", "vsvc-1")),
            f"{apps}/replicasets/decoy-7c9b": _obj("decoy-7c9b", "rs-9", _ref("Deployment", "decoy", "dep-9")),
            f"{apps}/deployments/decoy": _obj("decoy", "dep-9", _ref("VLLMService", "svc", "vsvc-1")),
        }

    def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    def get_vsvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _obj("svc", "vsvc-1") if name == "svc" else None


@pytest.fixture
def _fresh_chains(monkeypatch):
    monkeypatch.setattr(ownership, "_chains", type(ownership._chains)())


def test_a_pod_of_a_decoy_deployment_with_a_copied_owner_reference_is_not_the_services(_fresh_chains):
    # 188f4a2: "only the Deployment named after the service and controlled by it moves its rollout (an
    # ownerReference's uid is anyone's to copy)". The crash path reads the same chain: pod -> ReplicaSet (by uid)
    # -> Deployment (by uid) -> VLLMService (by uid), and never asks the Deployment's name. A tenant who may create
    # Deployments (not edit the VLLMService) labels a Deployment `decoy` with the service's label, copies its
    # ownerReference, and runs an image that prints an OOM of its choosing (a KV refusal, "Free memory ... less
    # than desired", a runtime OOM): handlers.pod_changed takes the crash as svc's and heals svc's flags (a cut,
    # a shorter context, the quantized fallback, a larger memory limit), however well svc itself serves.
    reads = _Reads()
    assert ownership.run_by_service(
        reads, NS, "svc", _obj("svc-5d8f-x2z", "pod-1", _ref("ReplicaSet", "svc-5d8f", "rs-1"))
    )
    decoy_pod = _obj("decoy-7c9b-q4w", "pod-9", _ref("ReplicaSet", "decoy-7c9b", "rs-9"))
    assert not ownership.run_by_service(reads, NS, "svc", decoy_pod)
