"""Hostile review of the heal plans the first review left alone (profiling, multi-GPU, weights, quantized
fallback): each test states the right heal for a realistic crash, checked against vLLM's own arithmetic, and
is xfail(strict) while the planner gets it wrong.

vLLM facts the tests lean on (read in vLLM 0.32's source, and in the real H100/H200 runs under
tests/fixtures/gpu/):
- profile_run runs the dummy forward batch of max_num_batched_tokens tokens (_dummy_run), then, on the last
  pipeline rank, the sampler warm-up over max_num_seqs rows of vocabulary logits (_dummy_sampler_run): a row
  of Llama-3.1-8B's logits is 128,256 x 4 bytes, 0.49 MiB (the real `seqs` heal run: 62.62 GiB for 131,072).
- SchedulerConfig.verify_max_model_len (config/scheduler.py) refuses max_num_batched_tokens below
  max_model_len when chunked prefill is off (failure-logs/batched.log is that refusal on the H200).
- get_kv_cache_configs (v1/core/kv_cache_utils.py) checks each worker's KV memory in rank order and raises
  at the first that is short, with that worker's figures; every worker logs its own "Available KV cache
  memory" line first (gpu_worker.py determine_available_memory).
"""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.diagnosis import GpuInfo, GpuSnapshot, Signals, classify
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import check, to_shape
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

GIB = 2**30
FIXTURES = Path(__file__).parent / "fixtures"
GPU = FIXTURES / "gpu"
LLAMA8 = config_shape("llama-3.1-8b")
LLAMA70 = config_shape("llama-3.1-70b")
H100 = lookup("NVIDIA-H100-80GB-HBM3")
V025 = parse_version("0.25.0")


def _qwen72():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    from make_models import QWEN25_72B

    return to_shape(check(QWEN25_72B))


# --- profiling_oom: seqs_from_allocation -------------------------------------------------------------


def test_a_forward_pass_allocation_is_not_healed_by_fewer_sequences():
    """Input: the real H200 `profile` failure (Llama-3.1-8B, max_model_len 8192, max_num_batched_tokens
    2,097,152, eager): 'Tried to allocate 112.00 GiB ... 91.86 GiB is free' inside _dummy_run -> llama.py
    mlp -> gate_up_proj (2,097,152 tokens x 28,672 x 2 bytes = 112 GiB), with max_num_seqs 2048 (above the
    H200's default 1024) instead of the run's 256.
    Now: with no dummy-request count printed and max_num_seqs above the default, seqs_from_allocation takes
    the 112 GiB for the sampler warm-up of 2048 rows (56 MiB a row, where a row of logits is 0.49 MiB) and
    plans max_num_seqs 2048 -> 256; the forward batch is untouched, and the remedy's own `expected` says
    it still fails (215.84 GiB of activation): a certain second crash.
    Right: the batch is what asks for it: max_num_batched_tokens 2,097,152 -> 262,144 (batch_from_allocation,
    the heal the same log gets at max_num_seqs 256), which the memory model says fits."""
    log = (GPU / "failure-logs" / "profile.log").read_text().replace("'max_num_seqs': 256", "'max_num_seqs': 2048")
    d = classify(Signals(log=log, exit_code=1))
    assert d.cause == "profiling_oom" and d.numbers["tried_gib"] == 112.0 and "dummy_requests" not in d.numbers
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 8192, "maxNumSeqs": 2048, "maxNumBatchedTokens": 2097152, "enforceEager": True},
    )
    inv = Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200", shape=LLAMA8)
    r = plan_heal(spec, d, inventory=inv)
    right = r.action == "LowerMaxNumBatchedTokens" and r.changes["max_num_batched_tokens"] <= 262144
    assert right and "still fails" not in r.expected, r.summary()


# --- profiling_oom: batch_from_allocation ------------------------------------------------------------

# Llama-3.1-8B on an L4 (22.05 GiB): the profile's dummy batch of 65,536 tokens runs out in gate_up_proj
# (65,536 x 28,672 x 2 bytes = 3.5 GiB) beside the 15 GiB of weights.
PROFILE_OOM_L4 = (
    "(EngineCore_DP0 pid=7) INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 15.0 GiB and 3 s\n"
    '(EngineCore_DP0 pid=7) ERROR 12-01 10:00:09 [core.py:1]   File "/v/vllm/v1/worker/gpu_worker.py", line 468, '
    "in determine_available_memory\n"
    "(EngineCore_DP0 pid=7) ERROR 12-01 10:00:09 [core.py:1]     self.model_runner.profile_run()\n"
    "(EngineCore_DP0 pid=7) ERROR 12-01 10:00:09 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to "
    "allocate 3.50 GiB. GPU 0 has a total capacity of 22.05 GiB of which 1.95 GiB is free. Including non-PyTorch "
    "memory, this process has 19.59 GiB memory in use.\n"
)


def test_a_batch_cut_keeps_the_context_vllm_requires_without_chunked_prefill():
    """Input: the L4 log above; max_model_len 16384, max_num_batched_tokens 65536, --no-enable-chunked-prefill.
    Now: batch_from_allocation sizes the batch to a quarter of the free 1.95 GiB and floors it at the L4's
    default (8192): max_num_batched_tokens 65,536 -> 8,192. vLLM's SchedulerConfig.verify_max_model_len
    raises 'max_num_batched_tokens (8192) is smaller than max_model_len (16384)' with chunked prefill off (the
    real batched.log): the heal trades an OOM for a start vLLM refuses (_halve holds that floor; this step not).
    Right: not below max_model_len: 16,384 (about 1.7 GiB of activation, the memory model says it fits)."""
    d = classify(Signals(log=PROFILE_OOM_L4, exit_code=1))
    assert d.cause == "profiling_oom"
    engine = {"maxModelLen": 16384, "maxNumBatchedTokens": 65536, "extraArgs": ["--no-enable-chunked-prefill"]}
    inv = Inventory(gpu_total_gib=22.05, gpu_name="NVIDIA-L4", shape=LLAMA8)
    fits = EngineArgs(max_model_len=16384, max_num_batched_tokens=16384, extra_args=["--no-enable-chunked-prefill"])
    assert estimate(LLAMA8, fits, lookup("NVIDIA-L4")).fits
    r = plan_heal(VLLMServiceSpec(model="m", engine=engine), d, inventory=inv)
    assert r.changes.get("max_num_batched_tokens", 65536) >= 16384, r.summary()


# --- quantized fallback -------------------------------------------------------------------------------


def test_a_quantized_fallback_that_still_fails_gives_way_to_the_split_that_fits():
    """Input: the real H100 run q72 (Qwen2.5-72B, max_model_len 8192, eager, vLLM 0.25's 0.92: out of memory
    loading the weights); quantizedFallback an fp8 checkpoint of the same model, IncreaseTensorParallel allowed
    up to 2; the model's shape known.
    Now: Quantize, first in the weights plan and never vetoed, whose own `expected` reads 'still fails': at
    fp8 the weights are about 70 GiB, 0.92 x 79.18 = 72.85 GiB leaves 0.79 GiB of KV cache, and 8192 tokens
    need 2.5 GiB (80 layers x 8 KV heads x 128 x 2 x 2 bytes = 320 KiB a token): vLLM's KV check refuses it.
    Right: the split the bounds allow and the memory model says fits: tensor_parallel_size 2 (67.75 GiB of
    bf16 weights a GPU, 3.47 GiB of cache), the model as asked."""
    shape = _qwen72()
    snapshot = GpuSnapshot(gpus=[GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=81559 * 2**20)])
    log = (GPU / "h100-runs" / "q72.log").read_text()
    d = classify(Signals(log=log, exit_code=1, ready_before=False, gpu=snapshot))
    assert d.cause == "weights_load_oom"
    engine = parse_args("--max-model-len 8192 --enforce-eager").engine.model_copy(
        update={"gpu_memory_utilization": 0.92}
    )
    assert estimate(shape, engine.model_copy(update={"quantization": "fp8"}), H100, release=V025).failure
    assert estimate(shape, engine.model_copy(update={"tensor_parallel_size": 2}), H100, release=V025).fits
    heal = {
        "bounds": {"maxTensorParallelSize": 2},
        "allowedActions": ["Quantize", "IncreaseTensorParallel"],
        "quantizedFallback": {"allowed": True, "model": "/models/qwen2.5-72b-instruct-fp8", "method": "fp8"},
    }
    spec = VLLMServiceSpec(model="/models/qwen2.5-72b-instruct", engine=engine, heal=heal)
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=H100.memory_gib, shape=shape, release=V025))
    right = r.action == "IncreaseTensorParallel" and r.changes["tensor_parallel_size"] == 2
    assert right and "still fails" not in r.expected, r.summary()


# --- multi_gpu_oom: the KV check on a pipeline stage ---------------------------------------------------

E = "(EngineCore_DP0 pid=9) "
# Llama-3.1-70B over two H100s by pipeline (40 layers a stage: 160 KiB of KV a token), max_model_len 32768
# (5 GiB a request). The last stage also runs the sampler warm-up, so its budget is the smaller: 2.5 GiB
# against the first stage's 3.5. vLLM checks the workers in rank order and raises with the first stage's
# figures (3.5 GiB: 22,928 tokens), though the last stage's own line says it holds 16,384.
PP_KV_SHORT = (
    E
    + "(Worker_PP0 pid=11) INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 65.4 GiB and 60 s\n"
    + E
    + "(Worker_PP1 pid=12) INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 65.4 GiB and 60 s\n"
    + E
    + "(Worker_PP0 pid=11) INFO 12-01 10:00:30 [gpu_worker.py:1] Available KV cache memory: 3.5 GiB\n"
    + E
    + "(Worker_PP1 pid=12) INFO 12-01 10:00:30 [gpu_worker.py:1] Available KV cache memory: 2.5 GiB\n"
    + E
    + "ERROR 12-01 10:00:40 [core.py:1] ValueError: To serve at least one request with the model's max seq len "
    "(32768), (5.00 GiB KV cache is needed, which is larger than the available KV cache memory (3.50 GiB). "
    "Based on the available memory, the estimated maximum model length is 22928. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n"
)


def test_a_pipeline_kv_heal_holds_the_context_on_the_smallest_stage():
    """Input: the PP 2 log above, max_model_len 32768, utilization 0.9, two H100s.
    Now: the diagnosis records the smallest stage's budget (available_kv_gib 2.5) yet lower_max_model_len
    takes vLLM's estimate from the first stage's refusal: max_model_len 32768 -> 22,928. The last stage's
    2.5 GiB hold 2.5 x 2^30 / 163,840 = 16,384 tokens: vLLM refuses 22,928 there, a second restart the
    printed line could have avoided (with the model's shape, the remedy's own `expected` says 'still fails').
    Right: a change after which the smallest stage's cache (2.5 GiB, plus what a raise adds on every stage)
    holds one request of the new context at 160 KiB a token."""
    d = classify(
        Signals(log=PP_KV_SHORT, ready_before=False, tensor_parallel_size=1, pipeline_parallel_size=2, gpu_count=2)
    )
    assert (d.cause, d.subtype) == ("multi_gpu_oom", "kv_check_fails_on_smallest_stage")
    assert d.numbers["available_kv_gib"] == 2.5 and d.numbers["estimated_max_model_len"] == 22928
    spec = VLLMServiceSpec(model="m", engine={"pipelineParallelSize": 2, "maxModelLen": 32768})
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=H100.memory_gib, gpu_name="NVIDIA-H100-80GB-HBM3"))
    assert not r.gives_up, r.summary()
    util = r.changes.get("gpu_memory_utilization", 0.9)
    smallest = (2.5 + (util - 0.9) * H100.memory_gib) * GIB
    assert r.changes.get("max_model_len", 32768) * 160 * 1024 <= smallest, r.summary()


def _q72_heal(actions: list[str], method: str) -> tuple[object, object]:
    shape = _qwen72()
    snapshot = GpuSnapshot(gpus=[GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=81559 * 2**20)])
    d = classify(Signals(log=(GPU / "h100-runs" / "q72.log").read_text(), exit_code=1, gpu=snapshot))
    engine = parse_args("--max-model-len 8192 --enforce-eager").engine.model_copy(
        update={"gpu_memory_utilization": 0.92}
    )
    heal = {
        "bounds": {"maxTensorParallelSize": 2},
        "allowedActions": actions,
        "quantizedFallback": {"allowed": True, "model": "/models/qwen2.5-72b-q", "method": method},
    }
    spec = VLLMServiceSpec(model="/models/qwen2.5-72b-instruct", engine=engine, heal=heal)
    return plan_heal(spec, d, inventory=Inventory(gpu_total_gib=H100.memory_gib, shape=shape, release=V025)), d


def test_a_quantized_fallback_that_still_fails_and_nothing_else_allowed_gives_up_saying_why():
    """The fp8 fallback of q72 alone allowed: the memory model says its KV cache cannot hold one request,
    so no restart is spent on it; the answer names the refusal, and the user's settings stay."""
    r, _ = _q72_heal(["Quantize"], "fp8")
    assert r.action == "GiveUp" and "Quantize refused: the memory model says it still does not fit" in r.reason
    assert not r.changes


def test_a_quantized_fallback_whose_width_the_method_does_not_say_is_not_weighed():
    """awq names no width by itself (4 bits in most checkpoints, 8 in some): the memory model cannot weigh the
    fallback, so the user's named checkpoint is tried, as before."""
    r, _ = _q72_heal(["Quantize", "IncreaseTensorParallel"], "awq")
    assert r.action == "Quantize" and r.changes["model"] == "/models/qwen2.5-72b-q", r.summary()


def test_a_quantized_fallback_short_of_cache_comes_with_the_share_or_the_context_that_holds_it():
    """q72's fp8 fallback at 0.92 leaves its KV cache 2,576 tokens of the 8,192 asked: with a raise allowed,
    the quantized checkpoint comes with the least share the memory model says holds the context (and 0.01
    more, within the bound), in one restart; with only a context cut allowed, with the context its cache
    holds (3% margin). Neither is a second restart the numbers could have avoided."""
    r, _ = _q72_heal(["Quantize", "RaiseGpuMemoryUtilization"], "fp8")
    assert r.action == "Quantize" and 0.92 < r.changes["gpu_memory_utilization"] <= 0.95, r.summary()
    assert "(fits)" in r.expected, r.expected
    r, _ = _q72_heal(["Quantize", "LowerMaxModelLen"], "fp8")
    assert r.action == "Quantize" and 2048 <= r.changes["max_model_len"] <= 2576 * 0.97, r.summary()
    assert "(fits)" in r.expected, r.expected
