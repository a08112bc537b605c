"""Hostile review (gpus33) of the "heal needs more resources" path, as a platform engineer running a
shared GPU cluster sees it: tensor-parallel raises (what vLLM can split, what the pod gets), heals that
raise the memory limit, and what happens when the API server or the scheduler will not give the pod
what the heal asked for. Each defect is an xfail(strict) test that fails today; the rest are cases
the code defends."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from api_writes import merge_patch
from vllm_autoheal import model_source, validation
from vllm_autoheal.api import ALL_ACTIONS, Deployed, EngineArgs, HealIntent, VLLMService, VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube import crash, handlers, heal, reconcile, resources, unschedulable
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import deployed, fp, parse
from vllm_autoheal.quantity import parse_quantity
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import Limits, check
from vllm_autoheal.serve_sizing import gpus_taken
from vllm_autoheal.shape_reader import shape_from_config

from operator_harness import PendingLater, unschedulable_status
from samples import config_shape

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
L4 = lookup("NVIDIA-L4")
WEIGHTS_OOM = classify(
    Signals(
        log="ERROR [gpu_model_runner.py:1] Failed to load model - not enough GPU memory. "
        "(original error: CUDA out of memory. Tried to allocate 1.00 GiB.)"
    )
)
NS = "team-a"
LOG = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
LONG_AGO = "2026-01-01T00:00:00Z"  # (more than unschedulableSeconds before any run of these tests)
GIB = 2**30


# --- a small API server: the calls the handlers make on one VLLMService -----------------------------


class StubKube:
    """The VLLMService (status and spec merge patches), its pods and its Deployment's chain."""

    def __init__(self, body: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> None:
        self.body = body
        self.pods = pods or []
        self.applied: list[list[dict[str, Any]]] = []
        self.deployment: dict[str, Any] = {}  # (its spec and status, where a test sets them)

    def vsvc_path(self, ns: str, name: str) -> str:
        return f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{ns}/vllmservices/{name}"

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.body) if name == self.body["metadata"]["name"] else None

    def get(self, path: str) -> dict[str, Any] | None:
        owner = self.body["metadata"]
        if path.endswith(f"/replicasets/{RS_REF['name']}"):
            dep = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "svc", "uid": "dep-uid", "controller": True}
            return {"metadata": {"name": RS_REF["name"], "uid": RS_REF["uid"], "ownerReferences": [dep]}}
        if path.endswith("/deployments/svc"):
            ref = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "name": owner["name"]}
            ref |= {"uid": owner["uid"], "controller": True}
            meta = {"name": "svc", "uid": "dep-uid", "ownerReferences": [ref]}
            return {**copy.deepcopy(self.deployment), "metadata": {**self.deployment.get("metadata", {}), **meta}}
        return None

    def previous_log(self, *a: Any) -> str:
        return ""

    def apply_all(self, manifests: list[dict[str, Any]]) -> Any:
        self.applied.append(manifests)
        return SimpleNamespace(conflicts=[], outcomes=[])

    def request(self, method: str, path: str, body: Any = None, *a: Any, **k: Any) -> Any:
        if method == "GET" and path.endswith("/pods"):
            return {"items": copy.deepcopy(self.pods)}
        if method == "PATCH":
            patch = {k: v for k, v in body.items() if k != "metadata"}
            patch["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k != "resourceVersion"}
            self.body = merge_patch(self.body, patch)
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
            return copy.deepcopy(self.body)
        raise AssertionError(f"unexpected {method} {path}")


RS_REF = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "svc-rs", "uid": "rs-uid", "controller": True}


def _vsvc(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": NS, "uid": "vsvc-uid", "generation": 1, "resourceVersion": "1"},
        "spec": copy.deepcopy(spec),
        "status": status or {},
    }


def _pending_pod(template_hash: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "svc-rs-x",
            "namespace": NS,
            "uid": "pod-uid-x",
            "labels": {resources.SERVICE_LABEL: "svc"},
            "annotations": {resources.ENGINE_HASH: template_hash},
            "ownerReferences": [RS_REF],
        },
        "status": unschedulable_status(message, LONG_AGO),
    }


def _oomkilled_pod(n: int, template_hash: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"svc-rs-{n}",
            "uid": f"pod-uid-{n}",
            "labels": {resources.SERVICE_LABEL: "svc"},
            "annotations": {resources.ENGINE_HASH: template_hash},
        }
    }


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    """Each test its own shared reads; no Events, no Hub (the model's shape is not known here)."""
    monkeypatch.setattr(unschedulable, "_recent", unschedulable.RecentReads())
    monkeypatch.setattr(unschedulable, "_looks", unschedulable.NamespaceLooks())
    monkeypatch.setattr(unschedulable, "event", lambda body, **k: None)
    monkeypatch.setattr(
        crash.model_source, "for_service", lambda obj, get: model_source.Resolved(source="test", error="unknown")
    )


def _record_crash(kube: StubKube, n: int) -> Any:
    """A host-RAM crash (OOMKilled) of the pod that runs what is deployed now, recorded as the operator
    records it (heal.record under update_status); returns the remedy planned."""
    obj = parse(kube.body)
    now = fp(deployed(obj))
    incident = heal.Incident(
        NS, "svc", _oomkilled_pod(n, now), {"restartCount": n, "reason": "OOMKilled", "exitCode": 137}
    )
    incident.diagnosis = classify(Signals(reason="OOMKilled", exit_code=137))
    assert incident.diagnosis.cause == "host_ram_oom"
    incident.model = crash.ModelLookup.of(kube, obj)  # type: ignore[arg-type]
    heal.update_status(
        kube,  # type: ignore[arg-type]
        OperatorConfig(),
        NS,
        "svc",
        lambda fresh: heal.record(kube, incident, fresh, OperatorConfig(), expected=now),  # type: ignore[arg-type]
    )
    return incident.remedy


def _condition(body: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == type_), None)


# --- (4) Revert after Unschedulable: a raise of the memory limit comes back, again and again --------

MEMORY_SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9},
    "resources": {"gpuProduct": "NVIDIA-L4", "limits": {"memory": "32Gi"}},
    "heal": {
        "mode": "StatusOverrides",
        "backoffSeconds": 0,
        "unschedulableSeconds": 0,
        "maxAttempts": 5,
        "bounds": {"maxMemoryLimit": "48Gi"},
    },
}


def test_a_memory_limit_the_scheduler_refused_is_not_planned_again_after_the_revert():
    """Lost time and a loop (a needless restart each round). The container is OOMKilled at 32Gi; the heal
    raises it VPA-style to 38.4Gi (bound 48Gi); no node has 38.4Gi allocatable beside the GPUs, so the pod
    stays Unschedulable, and heal.onUnschedulable: Revert goes back to 32Gi. The reverted pod is OOMKilled
    again (nothing changed), and the planner, for whom RaiseMemoryLimit may repeat (REPEATABLE: VPA bumps
    on every OOM) and whose gate only remembers settings that crashed of memory (38.4Gi never ran), plans
    38.4Gi again: Unschedulable again, reverted again, until maxAttempts is spent, each round costing
    unschedulableSeconds of downtime plus a crash. An IncreaseTensorParallel that could not be scheduled
    is not planned again (status.tried); a memory limit that could not be scheduled should not be either
    (at least not the same or a larger one)."""
    kube = StubKube(_vsvc(MEMORY_SPEC))
    first = _record_crash(kube, 1)
    assert first.action == "RaiseMemoryLimit", first.summary()
    blocked_limit = first.changes["memory_limit"]
    intent = parse(kube.body).status.in_flight
    assert intent is not None and intent.applied  # (StatusOverrides: the status write was the heal)

    kube.pods = [_pending_pod(fp(intent.target), "0/9 nodes are available: 9 Insufficient memory.")]
    unschedulable.check(kube, OperatorConfig(), PendingLater(), NS, "svc", LOG)  # type: ignore[arg-type]
    reverted = parse(kube.body)
    assert reverted.status.heals[-1].action == "RevertUnschedulable"
    assert deployed(reverted).memory_limit == "32Gi"  # back to the limit that scheduled

    kube.pods = []
    again = _record_crash(kube, 2)  # the reverted pod is OOMKilled again
    assert not (
        again.action == "RaiseMemoryLimit"
        and parse_quantity(again.changes["memory_limit"]) >= parse_quantity(blocked_limit)
    ), f"the limit the scheduler refused ({blocked_limit}) is planned again: {again.summary()}"


def test_a_split_the_scheduler_refused_is_not_planned_again_after_the_revert(monkeypatch):
    """Defended: the TP raise is remembered in status.tried, so the crash of the reverted flags gets
    another remedy or a give-up, never the same split again."""
    spec = copy.deepcopy(MEMORY_SPEC)
    spec["heal"] |= {"allowedActions": ALL_ACTIONS, "bounds": {"maxTensorParallelSize": 2}}
    kube = StubKube(_vsvc(spec))
    obj = parse(kube.body)
    now = fp(deployed(obj))
    incident = heal.Incident(NS, "svc", _oomkilled_pod(1, now), {"restartCount": 1, "exitCode": 1})
    incident.diagnosis = WEIGHTS_OOM
    incident.model = crash.ModelLookup.of(kube, obj)  # type: ignore[arg-type]
    cfg = OperatorConfig()
    record = lambda fresh: heal.record(kube, incident, fresh, cfg, expected=now)  # type: ignore[arg-type]  # noqa: E731
    heal.update_status(kube, cfg, NS, "svc", record)  # type: ignore[arg-type]
    assert incident.remedy.action == "IncreaseTensorParallel", incident.remedy.summary()
    intent = parse(kube.body).status.in_flight
    kube.pods = [_pending_pod(fp(intent.target), "0/9 nodes are available: 9 Insufficient nvidia.com/gpu.")]
    unschedulable.check(kube, cfg, PendingLater(), NS, "svc", LOG)  # type: ignore[arg-type]
    assert parse(kube.body).status.heals[-1].action == "RevertUnschedulable"
    assert deployed(parse(kube.body)).engine.tensor_parallel_size == 1
    kube.pods = []
    incident2 = heal.Incident(NS, "svc", _oomkilled_pod(2, now), {"restartCount": 2, "exitCode": 1})
    incident2.diagnosis, incident2.model = WEIGHTS_OOM, incident.model
    heal.update_status(
        kube,  # type: ignore[arg-type]
        cfg,
        NS,
        "svc",
        lambda fresh: heal.record(kube, incident2, fresh, cfg, expected=now),  # type: ignore[arg-type]
    )
    assert incident2.remedy.action != "IncreaseTensorParallel", incident2.remedy.summary()


# --- (5) a heal the API server refuses: no pod is ever created, nothing is blocked -----------------

LIMIT_RANGE = 'pods "svc-rs-x" is forbidden: maximum memory usage per Container is 32Gi, but limit is 38Gi'
GPU_QUOTA = (
    'pods "svc-rs-x" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, '
    "used: requests.nvidia.com/gpu=3, limited: requests.nvidia.com/gpu=4"
)


def _intent(action: str, before: Deployed, after: Deployed) -> HealIntent:
    return HealIntent(
        crash="uid-1/vllm/1",
        cause="host_ram_oom" if action == "RaiseMemoryLimit" else "weights_load_oom",
        action=action,
        summary=action,
        target=after,
        previous=before,
        applied=True,
        time=LONG_AGO,
    )


@pytest.mark.parametrize("via", ["check", "deployment-event"])
@pytest.mark.parametrize("refusal", ["LimitRange", "ResourceQuota"])
def test_a_heal_whose_pods_the_api_server_refuses_is_reported_and_reverted(refusal, via, monkeypatch):
    """Downtime without end (a wrong change never undone). A namespace LimitRange caps a container at 32Gi
    (max), or a ResourceQuota caps the namespace's nvidia.com/gpu at 4 with 3 in use by other services;
    README itself recommends the quota. A RaiseMemoryLimit to 38Gi, or an IncreaseTensorParallel to 2 GPUs,
    is written into the Deployment (the Deployment itself is admitted: LimitRange and ResourceQuota
    judge pods). The Deployment controller scales the old ReplicaSet down first (maxSurge 0,
    maxUnavailable 1) and the new one's pod create is refused with 403 Forbidden: no pod, so no pod event
    and no Unschedulable condition for unschedulable.check; the Deployment reports
    ReplicaFailure=True, reason FailedCreate, with the API server's message, which deployment_progress
    does not read. The service has no replica and stays Healing forever; heal.onUnschedulable never
    applies. It should be treated as blocked (HealBlocked with the API server's message, and reverted
    under Revert)."""
    spec = copy.deepcopy(MEMORY_SPEC)
    before = Deployed(engine=EngineArgs(gpu_memory_utilization=0.9), model=spec["model"], memory_limit="32Gi")
    if refusal == "LimitRange":
        after, action, message = before.model_copy(update={"memory_limit": "38Gi"}), "RaiseMemoryLimit", LIMIT_RANGE
    else:
        spec["heal"] |= {"allowedActions": ALL_ACTIONS, "bounds": {"maxTensorParallelSize": 2}}
        engine = EngineArgs(gpu_memory_utilization=0.9, tensor_parallel_size=2)
        after, action, message = before.model_copy(update={"engine": engine}), "IncreaseTensorParallel", GPU_QUOTA
    intent = _intent(action, before, after)
    status = {"inFlight": intent.wire(), "effective": after.engine.wire(), "baseline": {"gpuMemoryUtilization": 0.9}}
    if after.memory_limit != "32Gi":
        status["effectiveMemoryLimit"] = after.memory_limit
    kube = StubKube(_vsvc(spec, status))
    dep = resources.deployment(parse(kube.body))
    assert dep["spec"]["template"]["metadata"]["annotations"][resources.ENGINE_HASH] == fp(after)
    dep["metadata"]["generation"] = 2
    dep["status"] = {
        "observedGeneration": 2,
        "replicas": 0,
        "updatedReplicas": 0,
        "unavailableReplicas": 1,
        "conditions": [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"},
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": message,
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            },
        ],
    }
    kube.deployment = dep
    if via == "check":
        reconcile.deployment_progress(kube, OperatorConfig(), NS, "svc", dep)  # type: ignore[arg-type]
        unschedulable.check(kube, OperatorConfig(), PendingLater(), NS, "svc", LOG)  # type: ignore[arg-type]
    else:  # (what runs it: no pod exists, so no pod event comes; the Deployment's own event does)
        monkeypatch.setattr(handlers, "_kube", lambda memo: kube)
        monkeypatch.setattr(handlers, "_later", lambda memo: PendingLater())
        dep["metadata"]["labels"] = {resources.SERVICE_LABEL: "svc"}
        handlers.deployment_progress(body=dep, type="MODIFIED", namespace=NS, memo={}, logger=LOG)  # type: ignore[arg-type]
    blocked = _condition(kube.body, "HealBlocked")
    heals = (kube.body.get("status") or {}).get("heals") or [{}]
    assert (blocked is not None and blocked["status"] == "True") or heals[-1].get("action") == "RevertUnschedulable", (
        f"phase {kube.body['status'].get('phase')}, no HealBlocked, no revert: the refused heal stays in flight"
    )


# --- (1) a split vLLM refuses at load: the block size of an fp8 checkpoint ---------------------------


def _qwen3_moe_fp8():
    """Qwen/Qwen3-30B-A3B-FP8: Qwen3-30B-A3B's config with its checkpoint's block-wise fp8 quantization."""
    config = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    config["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
    return shape_from_config(config)


def test_a_split_the_fp8_checkpoints_blocks_do_not_divide_is_not_planned():
    """A wrong change that vLLM refuses at load, and then stays (not_oom: NoChange, no revert). Qwen3-30B-A3B
    in its official block-wise fp8 checkpoint (weight_block_size [128, 128]) has 768-wide experts. vLLM's
    Fp8MoEMethod.create_weights (vllm/model_executor/layers/quantization/fp8.py) raises
    "ValueError: The output_size of gate's and up's weight = 192 is not divisible by weight quantization
    block_n = 128." when intermediate_size_per_partition (768 / TP) % block_n != 0, which is the case at
    TP 4 (192) and not at TP 2 (384); the dense layers go through validate_fp8_block_shape
    (quantization/utils/fp8_utils.py) with the same rule. The planner checks only heads (32) and KV heads
    (4), both split 4 ways, so from TP 2 with maxTensorParallelSize 4 it plans TP 4: the pods get 4 GPUs
    (a quota and a reschedule) for a start the numbers already forbid, and the ValueError is not_oom, so
    nothing heals it. (With --enable-expert-parallel the experts stay whole and TP 4 loads.)"""
    shape = _qwen3_moe_fp8()
    assert shape.quantization == "fp8" and shape.moe_intermediate == 768
    spec = VLLMServiceSpec(
        model="Qwen/Qwen3-30B-A3B-FP8",
        engine={"tensorParallelSize": 2, "maxModelLen": 32768},
        heal={"bounds": {"maxTensorParallelSize": 4}, "allowedActions": ALL_ACTIONS},
    )
    r = plan_heal(spec, WEIGHTS_OOM, inventory=Inventory(gpu_total_gib=L4.memory_gib, gpu_name=L4.name, shape=shape))
    split = r.changes.get("tensor_parallel_size")
    assert split is None or (768 // split) % 128 == 0, f"{r.summary()}: 768/{split} = {768 / split:g} per rank"


def test_a_split_the_heads_or_kv_heads_do_not_divide_is_never_planned():
    """Defended: Qwen2.5-7B has 28 heads and 4 KV heads; vLLM refuses TP 8 ("Total number of attention
    heads (28) must be divisible by tensor parallel size (8)", ModelConfig.verify_with_parallel_config).
    From TP 4 with maxTensorParallelSize 8 no split is planned."""
    shape = config_shape("qwen2.5-7b")
    assert (shape.heads, shape.kv_heads) == (28, 4) and not shape.splits(8)
    spec = VLLMServiceSpec(
        model="Qwen/Qwen2.5-7B-Instruct",
        engine={"tensorParallelSize": 4},
        heal={"bounds": {"maxTensorParallelSize": 8}, "allowedActions": ALL_ACTIONS},
    )
    r = plan_heal(spec, WEIGHTS_OOM, inventory=Inventory(gpu_total_gib=L4.memory_gib, gpu_name=L4.name, shape=shape))
    assert r.changes.get("tensor_parallel_size") is None, r.summary()


def test_a_vocabulary_the_split_does_not_divide_does_not_block_it():
    """Defended (no false refusal): vLLM pads the vocabulary to a multiple of 64 before it splits it
    (VocabParallelEmbedding, pad_vocab_size), so GPT-2's 50,257 tokens split 4 ways; its 12 heads do too."""
    shape = config_shape("gpt2")
    assert shape.vocab % 4 != 0 and shape.splits(4)


def test_no_split_above_the_bound_passes_the_gate():
    """Defended: the gate refuses a tensor-parallel size above heal.bounds.maxTensorParallelSize, and the
    default (unset) bound refuses any raise."""
    spec = VLLMServiceSpec(model="m", heal={"bounds": {"maxTensorParallelSize": 4}})
    limits = Limits(spec.heal.bounds)
    engine = EngineArgs(tensor_parallel_size=4)
    assert "above its bound 4" in (
        check("weights_load_oom", {"tensor_parallel_size": 8}, engine, "m", None, limits) or ""
    )
    unbounded = Limits(VLLMServiceSpec(model="m").heal.bounds)
    assert check("weights_load_oom", {"tensor_parallel_size": 2}, EngineArgs(), "m", None, unbounded)


# --- (3) what the pod's host memory must hold when the GPUs per pod double -------------------------


def test_a_split_does_not_double_the_offloaded_weights_past_the_container_limit():
    """A needless restart (OOMKilled). vLLM's --cpu-offload-gb is "The space in GiB to offload to CPU, per
    GPU" (vllm/config/offload.py, OffloadConfig.cpu_offload_gb): each tensor-parallel rank pins that much
    host memory. The service runs TP 1 with 12 GiB offloaded in a 32Gi container (within the gate's own
    rule: the limit / ranks / 2 = 16 GiB per GPU); its weights still do not fit, and the heal splits it to
    TP 2 keeping 12 GiB per GPU: 24 GiB pinned, which by the gate's own rule (pinned memory costs about
    twice the figure: 32 / 2 / 2 = 8 GiB per GPU at TP 2) the 32Gi container does not hold. The pod is
    OOMKilled; had the split halved the offload (each GPU now holds half the weights) or been refused,
    no second crash."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"cpuOffloadGb": 12},
        resources={"limits": {"memory": "32Gi"}},
        heal={"bounds": {"maxTensorParallelSize": 2}, "allowedActions": ALL_ACTIONS},
    )
    inv = Inventory(gpu_total_gib=L4.memory_gib, gpu_name=L4.name, memory_limit_bytes=32 * GIB)
    r = plan_heal(spec, WEIGHTS_OOM, inventory=inv)
    after = r.apply(spec.engine)
    limits = Limits(spec.heal.bounds, memory_limit_bytes=32 * GIB)
    assert (after.cpu_offload_gb or 0) <= limits.max_cpu_offload_gb(after, None), (
        f"{r.summary()}: {after.cpu_offload_gb:g} GiB x {after.tensor_parallel_size} ranks pinned in a 32Gi container"
    )
    if r.action != "IncreaseTensorParallel":  # (the gate refused the split: said, with its reason)
        assert "cpu_offload_gb 12 on each of 2 GPU(s)" in r.summary(), r.summary()


def test_shm_never_exceeds_the_memory_limit_the_heal_deploys():
    """Defended: /dev/shm (memory-backed, NCCL's and vLLM's IPC buffers) is rendered no larger than the
    memory limit that runs, the healed one included."""
    obj = VLLMService.model_validate(
        {
            "metadata": {"name": "s", "namespace": NS, "uid": "u"},
            "spec": {"model": "m", "resources": {"limits": {"memory": "8Gi"}, "shmSize": "16Gi"}},
        }
    )
    volumes = resources.deployment(obj)["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "dshm")["emptyDir"]["sizeLimit"] == "8Gi"


# --- (2) the GPUs a pod gets under data parallelism ------------------------------------------------


@pytest.mark.parametrize(
    "flags", [["--data-parallel-size", "2"], ["-dp=2"], ["--data_parallel_size_local", "2"], ["-pcp", "2"]]
)
def test_a_flag_that_makes_vllm_take_more_gpus_than_the_pod_asks_for_is_refused(flags: list[str]):
    """Was a wrong change (a pod with half the GPUs vLLM takes). vLLM starts --data-parallel-size N engine
    cores on this machine (data_parallel_size_local defaults to it), each on its own TP x PP GPUs, and
    prefill context parallelism multiplies a world (ParallelConfig: world_size = TP x PP x PCP,
    world_size_across_dp = world_size x DP, vllm/config/parallel.py 0.25); the Deployment asks
    nvidia.com/gpu = TP x PP, and a TP raise (2 -> 4 GPUs for DP 2) kept asking half.
    Now: the CRD refuses those flags in extraArgs, naming the field (more pods: spec.replicas); the
    operator's own admission reads the same rules."""
    engine = {"tensorParallelSize": 2, "extraArgs": flags}
    body = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "metadata": {"name": "s"}}
    _, problems = validation.admit({**body, "spec": {"model": "m", "engine": engine}})
    assert any("spec.engine.extraArgs" in p and "makes vLLM take more" in p for p in problems), problems
    assert gpus_taken(EngineArgs(extra_args=["--data-parallel-size", "2"], tensor_parallel_size=2)) == 4  # (serve)


def test_a_split_keeps_the_pipeline_stages_in_the_gpu_count():
    """Defended: a TP raise under pipeline parallelism asks for TP x PP GPUs (the heal's, in both modes)."""
    spec = {"model": "m", "engine": {"tensorParallelSize": 2, "pipelineParallelSize": 2}, "resources": {"gpus": 4}}
    obj = VLLMService.model_validate(
        {
            "metadata": {"name": "s", "namespace": NS, "uid": "u"},
            "spec": {**spec, "heal": {"mode": "StatusOverrides", "bounds": {"maxTensorParallelSize": 4}}},
            "status": {
                "baseline": {"tensorParallelSize": 2, "pipelineParallelSize": 2},
                "effective": {"tensorParallelSize": 4, "pipelineParallelSize": 2},
            },
        }
    )
    assert resources.gpu_count(obj) == 8


# --- (4) a person's edit while the heal is blocked ----------------------------------------------------


def test_a_persons_edit_while_the_split_is_blocked_wins_over_the_revert():
    """Defended: PatchSpec. The heal wrote TP 2 into the spec; its pod cannot be scheduled; meanwhile a
    person edited spec.engine (back to one GPU, a lower share). The revert, decided on the fresh object,
    finds the spec is neither the heal's nor what it planned from, and drops itself: the person's flags
    stay as written."""
    spec = copy.deepcopy(MEMORY_SPEC)
    spec["heal"] |= {"mode": "PatchSpec", "allowedActions": ALL_ACTIONS, "bounds": {"maxTensorParallelSize": 2}}
    before = Deployed(engine=EngineArgs(gpu_memory_utilization=0.9), model=spec["model"], memory_limit="32Gi")
    after = before.model_copy(update={"engine": EngineArgs(gpu_memory_utilization=0.9, tensor_parallel_size=2)})
    intent = _intent("IncreaseTensorParallel", before, after)
    person = {"gpuMemoryUtilization": 0.8}
    spec["engine"] = person
    body = _vsvc(
        spec,
        {
            "inFlight": intent.wire(),
            "baseline": {"gpuMemoryUtilization": 0.9},
            "effective": after.engine.wire(),
            "attempts": 1,
            "tried": ["weights_load_oom/IncreaseTensorParallel"],
        },
    )
    body["metadata"]["annotations"] = {heal.HEALED_ENGINE: json.dumps(after.engine.wire(), sort_keys=True)}
    kube = StubKube(body, [_pending_pod(fp(after), "0/9 nodes are available: 9 Insufficient nvidia.com/gpu.")])
    unschedulable.check(kube, OperatorConfig(), PendingLater(), NS, "svc", LOG)  # type: ignore[arg-type]
    assert kube.body["spec"]["engine"] == person
    assert (kube.body["status"].get("inFlight") or {}).get("target", {}).get("engine") != after.engine.wire()
