"""Session 41's hostile review (part d) of three parts of the heal arithmetic the first review did not reach: vLLM
0.34's extensible KV cache (extensible_kv.py, Context.warmup_loss), tensor-parallel raises, and pipeline parallelism
(the KV refusal on the smallest stage). Each test asserts the right behaviour, with the numbers in a comment, and is
a strict xfail while the code does otherwise."""

from __future__ import annotations

from pathlib import Path

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

V034 = parse_version("0.34.0")
LLAMA = config_shape("llama-3.1-8b")
H100 = lookup("NVIDIA-H100-80GB-HBM3")
H200 = lookup("NVIDIA-H200")
IMAGE = "vllm/vllm-openai:v0.34.0"
GPU_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu"
E = "(EngineCore pid=77) "


# --- 1. vLLM 0.34's extensible KV cache


def _runtime_oom_beside_another_process_034() -> str:
    """The real vLLM 0.25 serving OOM on the H200 beside another process (failure-logs/runtime.log: process 2656
    holds 68.58 GiB; 448 MiB failed), as 0.34 runs it at utilization 0.9: its extensible cache starts beside the
    other process (a budget above the free memory is no refusal) and says what fit after warm-up."""
    log = (GPU_FIXTURES / "failure-logs" / "runtime.log").read_text()
    log = log.replace("(v0.25.0)", "(v0.34.0)").replace("version 0.25.0", "version 0.34.0")
    log = log.replace("'gpu_memory_utilization': 0.5", "'gpu_memory_utilization': 0.9")
    warmup = (
        E.replace("77", "2441") + "INFO 12-01 04:47:52 [extensible_kv_cache.py:693] Memory after warmup: 55.10 GiB "
        "free, 1.00 GiB committed to the KV cache, 0.87 GiB kept for transient activations (0.87 GiB allocated at "
        "peak, 0.10 GiB of torch reservation growth); 27453 KV cache blocks (53.62 GiB) fit within the requested "
        "125.82 GiB. Torch may reserve up to 1.50 GiB."
    )
    lines = log.splitlines()
    at = next(i for i, line in enumerate(lines) if "Maximum concurrency for" in line)
    return "\n".join(lines[: at + 1] + [warmup] + lines[at + 1 :])


def test_a_runtime_cut_under_0_34_beside_another_process_gives_the_failed_allocation_room():
    # Llama-3.1-8B, eager, utilization 0.9 on an H200 (139.8 GiB) beside a process holding 68.58 GiB (the probe:
    # 71.22 GiB free). 0.34's cache holds min(budget, free - margin) less what the engine holds: the budget
    # (0.9 x 139.8 = 125.82 GiB) is far above the 71.22 - 0.51 - 1.0 free less the margin, so the free memory sizes
    # the cache (53.62 GiB by the memory model). Serving then fails on 448 MiB. The heal cuts utilization
    # 0.9 -> 0.88 (123.02 GiB, still far above what is free): the memory model's cache stays 53.62 GiB, the
    # headroom is the same, and the same allocation fails again; "Expected" even prints the unchanged 53.62 GiB.
    # A cut must bring the budget below free - margin by the allocation and 0.5 GiB (about (71.22 - 0.51 - 1.0 -
    # 0.44 - 0.5) / 139.8 = 0.49, with the context the smaller cache holds), or another step must be taken.
    d = classify(Signals(log=_runtime_oom_beside_another_process_034()))
    assert d.cause == "runtime_oom" and d.numbers["tried_gib"] == 0.4375
    engine = {"maxModelLen": 8192, "gpuMemoryUtilization": 0.9, "enforceEager": True}
    spec = VLLMServiceSpec(model="m", image=IMAGE, engine=engine)
    free = 139.8 - 68.58
    inv = Inventory(gpu_total_gib=H200.memory_gib, gpu_name=H200.name, shape=LLAMA, release=V034, gpu_free_gib=free)
    r = plan_heal(spec, d, inventory=inv)
    before = estimate(LLAMA, spec.engine, H200, free, release=V034)
    after = estimate(LLAMA, r.apply(spec.engine), H200, free, release=V034)
    if "gpu_memory_utilization" in r.changes:
        assert after.kv_cache_gib <= before.kv_cache_gib - d.numbers["tried_gib"], r.summary()


def _refused_before_warmup(util: float, bound: float) -> tuple[EngineArgs, Diagnosis]:
    """vLLM 0.34's first KV check (before warm-up) on Llama-3.1-8B at 131,072 tokens on an H100, its figures those
    of determine_available_memory's budget (as tests/test_extensible_kv_sizing.py builds them)."""
    engine = EngineArgs(gpu_memory_utilization=util, max_model_len=131072)
    est = estimate(LLAMA, engine, H100, release=V034)
    budget = round(est.requested_gib - est.weights_gib - est.activation_gib - est.non_torch_gib - est.cudagraph_gib, 2)
    needed = round(est.kv_needed_gib, 2)
    d = Diagnosis(
        cause=Cause.KV_CACHE_INSUFFICIENT,
        subtype="max_model_len_exceeds_kv_capacity",
        numbers={
            "max_seq_len": 131072,
            "needed_gib": needed,
            "available_gib": budget,
            "available_kv_gib": budget,
            "estimated_max_model_len": int(131072 * budget / needed) // 16 * 16,
        },
    )
    return engine, d


def test_a_context_cut_under_0_34_is_not_sized_from_a_budget_warm_up_empties():
    # Llama-3.1-8B on an H100 at 0.22 (bounds: maxGpuMemoryUtilization 0.22), max_model_len 131,072 (16.00 GiB).
    # vLLM 0.34's first check prints a budget of 0.34 GiB and estimates 2,784 tokens. After warm-up and capture the
    # cache holds that budget less the captured graphs (0.99 GiB): 0.34 - 0.99 < 0, no block. lower_max_model_len
    # counts the loss only where the budget exceeds it (`printed > loss`), so here it keeps vLLM's 2,784 whole and
    # sets max_model_len 2,784; its own Expected line says "KV cache 0.00 GiB ... still fails: no memory left for
    # the KV cache", and vLLM refuses again ("0 KV cache blocks"). No context fits at the bound: give up (or a
    # change the memory model says starts).
    engine, d = _refused_before_warmup(0.22, 0.22)
    assert d.numbers["available_gib"] == 0.34
    spec = VLLMServiceSpec(model="m", image=IMAGE, engine=engine, heal={"bounds": {"maxGpuMemoryUtilization": 0.22}})
    inv = Inventory(gpu_total_gib=H100.memory_gib, gpu_name=H100.name, shape=LLAMA, release=V034)
    r = plan_heal(spec, d, inventory=inv)
    after = estimate(LLAMA, r.apply(engine), H100, release=V034)
    assert r.gives_up or after.fits, (r.summary(), after.reasons)


def test_a_blind_raise_under_0_34_is_not_made_where_warm_up_leaves_the_grown_budget_empty():
    # vLLM 0.34 at 0.21 on an H100 (79.19 GiB), no config.json known: "Available KV cache memory: -0.45 GiB", then
    # "No available memory for the cache blocks". Bounds: maxGpuMemoryUtilization 0.22. The heal raises to 0.22:
    # "grows vLLM's budget to 0.34 GiB" (-0.45 + 0.01 x 79.19). That is the budget before warm-up; the extensible
    # cache then holds it less the captured graphs (Context.warmup_loss, 0.99 GiB): 0.34 - 0.99 = -0.65 GiB, no
    # block, a certain second crash. The step's own rule ("vLLM's own budget stays empty at the limit: a certain
    # second crash") must count the loss, as raise_utilization_for_kv and _raise_with_estimate do.
    log = "\n".join(
        [
            E + "INFO 12-04 10:00:05 [core.py:121] Initializing a V1 LLM engine (v0.34.0) with config: "
            "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=8192",
            E + "INFO 12-04 10:00:40 [model_runner.py:428] Model loading took 14.99 GiB memory and 30.1 seconds",
            E + "INFO 12-04 10:00:52 [gpu_worker.py:795] Available KV cache memory: -0.45 GiB",
            E + "ERROR 12-04 10:01:10 [core.py:1100] ValueError: No available memory for the cache blocks. Try "
            "increasing `gpu_memory_utilization` when initializing the engine.",
        ]
    )
    d = classify(Signals(log=log, exit_code=1))
    assert d.cause == "kv_cache_insufficient" and d.numbers["available_kv_gib"] == -0.45
    spec = VLLMServiceSpec(
        model="m",
        image=IMAGE,
        engine={"gpuMemoryUtilization": 0.21, "maxModelLen": 8192},
        heal={"bounds": {"maxGpuMemoryUtilization": 0.22}},
    )
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=H100.memory_gib, gpu_name=H100.name, release=V034))
    util = r.changes.get("gpu_memory_utilization", 0.21)
    after_warmup = -0.45 + (util - 0.21) * H100.memory_gib - 0.99
    assert "gpu_memory_utilization" not in r.changes or after_warmup > 0, r.summary()


# --- 3. Pipeline parallelism: the KV check on the smallest stage


def _pp_refusal(first: float, last: float, needed: float, estimated: int, context: int) -> str:
    """Two pipeline stages' budgets (the last stage's smaller: it also profiles the logits and sampler), and vLLM's
    refusal with the figures of the first stage it checks (get_kv_cache_configs checks each worker in order)."""
    w0, w1 = "(Worker_PP0 pid=101) ", "(Worker_PP1 pid=102) "
    return "\n".join(
        [
            w0 + f"INFO 05-01 10:00:00 [gpu_worker.py:200] Available KV cache memory: {first:.2f} GiB",
            w1 + f"INFO 05-01 10:00:00 [gpu_worker.py:200] Available KV cache memory: {last:.2f} GiB",
            "(EngineCore_0 pid=100) ERROR 05-01 10:00:01 [core.py:700] ValueError: To serve at least one request with "
            f"the models's max seq len ({context}), ({needed:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({first:.2f} GiB). Based on the available memory, the estimated maximum model "
            f"length is {estimated}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.",
        ]
    )


def test_a_raise_with_a_context_on_a_pipeline_holds_the_context_on_the_smallest_stage():
    # Two L4s (22.05 GiB), pipelineParallelSize 2, max_model_len 32,768 at 0.9, bounds minMaxModelLen 4,096. Stage 0
    # printed 2.00 GiB, stage 1 (the last: logits and sampler) 1.00 GiB; vLLM refused on stage 0: 8.00 GiB needed,
    # estimated 8,192 tokens (4,096 a GiB; the stages split 32 layers evenly, the same bytes a token). The context
    # cut alone is 8,192 x 1.00 / 2.00 x 0.97 = 3,973 < 4,096; the raise to the needed 8 GiB is past the bound. So
    # raise_utilization_blind -> _raise_with_estimate: utilization 0.93 (+0.66 GiB a stage) and max_model_len
    # 8,192 x 2.66 / 2.00 x 0.99 = 10,784, from stage 0's budget. Stage 1 then has 1.00 + 0.66 = 1.66 GiB, which
    # holds 4,096 x 1.66 = 6,800 tokens < 10,784: vLLM refuses again on stage 1. The context must be sized on the
    # smallest stage (about 6,700 with the 1% margin), as lower_max_model_len and raise_utilization_for_kv do.
    d = classify(Signals(log=_pp_refusal(2.0, 1.0, 8.0, 8192, 32768), exit_code=1, pipeline_parallel_size=2))
    assert (d.cause, d.subtype) == ("multi_gpu_oom", "kv_check_fails_on_smallest_stage")
    assert d.numbers["available_gib"] == 2.0 and d.numbers["available_kv_gib"] == 1.0
    g = lookup("NVIDIA-L4")
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 32768, "gpuMemoryUtilization": 0.9, "pipelineParallelSize": 2},
        heal={"bounds": {"minMaxModelLen": 4096}},
    )
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name))
    util = r.changes.get("gpu_memory_utilization", 0.9)
    smallest = 1.0 + (util - 0.9) * g.memory_gib
    assert r.gives_up or r.changes.get("max_model_len", 32768) <= 8192 / 2.0 * smallest, r.summary()
