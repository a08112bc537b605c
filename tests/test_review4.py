"""A fourth hostile review (of 4436551..79335e7): findings as strict xfail tests, each failing on 79335e7."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.preflight import preflight
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

E = "(EngineCore pid=77) "
ERR = E + "ERROR 12-04 10:01:10 [core.py:1100] "
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.mark.xfail(strict=True, reason="EnforceEager sized by the 0.99 GiB constant, not vLLM's printed graph estimate")
def test_enforce_eager_is_not_offered_where_vllms_own_graph_estimate_is_smaller_than_the_shortfall():
    """Severity: high (a certain second crash, decode speed lost, and an `expected` that says it fits).
    Input: Llama-3.1-8B on an H100 (79.19 GiB), vllm/vllm-openai:v0.33.0, gpuMemoryUtilization 0.95 (the
    bound), allowedActions [RaiseGpuMemoryUtilization, EnforceEager, LowerGpuMemoryUtilization]. vLLM 0.33's
    gpu_worker.determine_available_memory printed its own graph estimate for this run, as it does whenever
    it takes one ('The current --gpu-memory-utilization=0.9500 is equivalent to
    --gpu-memory-utilization=0.9469 without CUDA graph memory profiling': cg_util_delta = estimate / total,
    so the estimate is 0.0031 x 79.19 = 0.25 GiB), then refused: 16.0 GiB needed, 15.5 GiB available.
    What happened: kv_steps.eager_for_reserved_graphs compares the 0.5 GiB shortfall with the constant
    CUDAGRAPH_GIB (0.99) and answers EnforceEager, 'which then holds one request of max_model_len'. The line
    is not read anywhere (no pattern for it): eager gives back 0.25 GiB, the cache gets 15.75 < 16.0 GiB.
    What should happen: where vLLM printed its estimate, that figure is the graphs' share (vLLM's figures for
    this run outrank the model, as the step's own docstring says): no EnforceEager for a 0.5 GiB shortfall."""
    log = "\n".join(
        (
            E + "INFO 12-04 10:00:05 [core.py:121] Initializing a V1 LLM engine (v0.33.0) with config: "
            "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072",
            E + "INFO 12-04 10:00:40 [model_runner.py:428] Model loading took 14.99 GiB memory and 30.1 seconds",
            E + "INFO 12-04 10:00:52 [gpu_worker.py:771] Available KV cache memory: 15.5 GiB",
            E + "INFO 12-04 10:00:52 [gpu_worker.py:784] CUDA graph memory profiling is enabled (default since "
            "v0.21.0). The current --gpu-memory-utilization=0.9500 is equivalent to --gpu-memory-utilization=0.9469 "
            "without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase "
            "--gpu-memory-utilization to 0.9531. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
            ERR + "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
            "cache is needed, which is larger than the available KV cache memory (15.5 GiB). Based on the "
            "available memory, the estimated maximum model length is 126976. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
        )
    )
    d = classify(Signals(log=log, exit_code=1))
    assert (d.cause, d.numbers["needed_gib"], d.numbers["available_gib"]) == ("kv_cache_insufficient", 16.0, 15.5)
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.33.0",
        engine={"gpuMemoryUtilization": 0.95},
        heal={"allowedActions": ["RaiseGpuMemoryUtilization", "EnforceEager", "LowerGpuMemoryUtilization"]},
    )
    inv = Inventory(
        gpu_total_gib=79.19, gpu_name=H100, shape=config_shape("llama-3.1-8b"), release=parse_version("0.33.0")
    )
    remedy = plan_heal(spec, d, inventory=inv)
    assert remedy.action != "EnforceEager", (remedy.action, remedy.reason)


def _run(minute: int) -> list[str]:
    return [
        E + f"INFO 12-04 10:{minute:02d}:05 [core.py:121] Initializing a V1 LLM engine (v0.34.0) with config: "
        "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072",
        E + f"INFO 12-04 10:{minute:02d}:40 [model_runner.py:428] Model loading took 14.99 GiB memory and 30.1 seconds",
        E + f"INFO 12-04 10:{minute:02d}:52 [gpu_worker.py:795] Available KV cache memory: 55.10 GiB",
    ]


@pytest.mark.xfail(strict=True, reason="the SIZED_AFTER_CAPTURE rule reads milestones of an earlier run in the log")
def test_a_second_run_in_the_same_log_is_placed_by_its_own_milestones():
    """Severity: low-medium (a wrong cause, so a wrong heal, where a log holds a restart and the failure
    line comes without frames, as the extensible-cache tests' own bare case does).
    Input: one log, two vLLM 0.34 runs. Run 1 reached 'Memory after warmup: ...; 5120 KV cache blocks
    (10.00 GiB) fit' and died with 'GPU driver error 2: out of memory' (committing its blocks). Run 2 starts
    again (Initializing ..., Model loading took 14.99 GiB, Available KV cache memory: 55.10 GiB: the address
    space, before warm-up and capture) and dies with a bare 'torch.OutOfMemoryError: CUDA out of memory.
    Tried to allocate 1.50 GiB'.
    What happened: phase.py returns kv-allocation as soon as ANY 'Memory after warmup' milestone precedes the
    failure, the first run's included: gpu_util_exceeds_free / kv-allocation (a utilization cut for 'memory
    that vanished'). Run 2 alone reads cudagraph_capture_oom / graph-capture.
    What should happen: the rule looks at the run that failed (the SIZED_AFTER_CAPTURE milestone only when it
    is the last start-up milestone, or after the last 'Initializing' line): the same phase as run 2 alone."""
    run1 = _run(0) + [
        E + "INFO 12-04 10:01:10 [extensible_kv_cache.py:693] Memory after warmup: 12.60 GiB free, 1.00 GiB "
        "committed to the KV cache, 1.72 GiB kept for transient activations (1.72 GiB allocated at peak, "
        "0.30 GiB of torch reservation growth); 5120 KV cache blocks (10.00 GiB) fit within the requested "
        "71.27 GiB. Torch may reserve up to 3.50 GiB.",
        ERR + "RuntimeError: GPU driver error 2: out of memory",
    ]
    run2 = _run(10) + [
        E + "ERROR 12-04 10:11:10 [core.py:1100] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "1.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.20 GiB is free.",
    ]
    alone = classify(Signals(log="\n".join(run2), exit_code=1))
    both = classify(Signals(log="\n".join(run1 + run2), exit_code=1))
    assert alone.phase == "graph-capture"
    assert (both.cause, both.phase) == (alone.cause, alone.phase), (both.cause, both.phase)


@pytest.mark.xfail(strict=True, reason="Fix gives up where a raise with a context cut fits, by its own model")
def test_preflight_fix_finds_the_raise_with_a_cut_context_for_qwen_32b_on_an_h100_under_0_33():
    """Severity: medium (pre-flight Fix leaves a spec it predicts will crash, and says no flags within the
    bounds fit, under the default image).
    Input: Qwen2.5-32B on an H100 (79.19 GiB), vllm/vllm-openai:v0.33.0, gpuMemoryUtilization 0.8, default
    bounds (max 0.95, minMaxModelLen 2048), preflight Fix. (0.29 and 0.34 the same.)
    What happened: on 4436551 Fix raised 0.8 -> 0.95 with max_model_len 48,240 (fits). Since the graph
    reservation (ba3d1ef) the model puts the 0.99 GiB of graphs inside the budget: at 0.8 the cache is
    0.48 - 0.99 < 0, so predicted_diagnosis passes available_gib 0.0 with no estimated length;
    lower_max_model_len stops at 'no memory at all', _raise_with_estimate returns None on `not available`, and
    Fix gives up: 'no allowed change is left ... (tried: none)'. By the same model, 0.95 gives an 11.37 GiB
    cache holding 46,560 tokens. (The limitation predates this session: the parent gives up at 0.78 too; the
    reservation moved a 0.8 start onto it.)
    What should happen: Fix ends on flags its model says fit (0.95 and a context of at most 46,560)."""
    shape, gpu = config_shape("qwen2.5-32b"), lookup(H100)
    spec = VLLMServiceSpec(
        model="m", image="vllm/vllm-openai:v0.33.0", engine={"gpuMemoryUtilization": 0.8}, preflight="Fix"
    )
    at_top = estimate(
        shape, spec.engine.model_copy(update={"gpu_memory_utilization": 0.95, "max_model_len": 46560}), gpu, None,
        "server", spec.release(),
    )
    assert at_top.fits, at_top.reasons
    result = preflight(spec, gpu, shape)
    assert result.fits, result.reasons
