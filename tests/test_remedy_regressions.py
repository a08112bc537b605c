"""Regressions found by replaying the train split through the planner at 3d3952d and now: crashes where
today's plan was worse than the one before, by the figures vLLM printed in the crash's own log. Each
test names the old plan, the worse one and the figures that say which is right."""

from __future__ import annotations

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.diagnosis.corpus import context
from vllm_autoheal.remedy import plan_heal
from vllm_autoheal.remedy.model import Inventory

from crafted.bases import CORPUS, corpus_log
from samples import config_shape

RTX_4090_GIB = 23.65  # the GPU the rl-swarm thread names (gpu_catalog's GEFORCE-RTX-4090)


def diagnose(name: str) -> Diagnosis:
    """The sample's crash as the operator reads it: the log, the spec's TP/PP, the pod's state."""
    return classify(Signals(log=corpus_log(name), **context(CORPUS[name], pod_state=True)))


def test_the_regression_samples_read_as_their_labels():
    """The replays below start from a right classification (a wrong one is the classifier's to fix)."""
    name = "kv_cache_insufficient-334-rlswarm-4090-7b"
    assert CORPUS[name]["split"] == "train"
    d = diagnose(name)
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "max_model_len_exceeds_kv_capacity")
    assert d.numbers["kv_tokens"] == 112 and d.numbers["max_seq_len"] == 256


def test_a_raise_the_shape_shows_holds_the_context_is_not_given_up():
    """rl-swarm's 7B next to its trainer on a 24 GB GPU: 'The model's max seq len (256) is larger than the
    maximum number of tokens that can be stored in KV cache (112)'. With the model's shape, which the
    operator has from spec.model, the cache's 112 tokens are a size; the raise to 0.93 (the most free
    memory allows) grows that size by 0.71 GiB, far past 256 tokens. Before: that raise. Now: a give-up
    that names no figure ('tried: none'), leaving the spec degraded where one restart heals it."""
    d = diagnose("kv_cache_insufficient-334-rlswarm-4090-7b")
    s = VLLMServiceSpec(model="m", engine={"gpuMemoryUtilization": 0.9, "maxModelLen": 256})
    inv = Inventory(gpu_total_gib=RTX_4090_GIB, gpu_name="GEFORCE-RTX-4090", shape=config_shape("qwen2.5-7b"))
    r = plan_heal(s, d, inventory=inv)
    assert r.action == "RaiseGpuMemoryUtilization", r.summary()
    assert r.changes["gpu_memory_utilization"] > 0.9, r.summary()
    assert r.changes.get("max_model_len", 256) >= 256, r.summary()


# --- a hostile review of 2f45c4b..baa3587 (the same replay, and crafted figures): each failed there ---

P = "(EngineCore pid=1700) "


def test_a_token_count_with_a_shape_and_no_gpu_total_plans_without_raising():
    """High. kv-2785: 'max seq len (32768) is larger than ... KV cache (1984)'; the spec names no GPU
    product or size (inventory total None), the operator has the model's shape. baa3587: AssertionError
    in ctx.estimate() via _budget_before, so the heal path raises. Before: a raise to 0.95 with
    max_model_len 2064 (vLLM's count grown in proportion)."""
    d = diagnose("kv-2785-qwen1.5-7b-chat")
    s = VLLMServiceSpec(model="m", engine={"maxModelLen": 32768})
    r = plan_heal(s, d, inventory=Inventory(shape=config_shape("qwen2.5-7b")))
    assert r.action == "RaiseGpuMemoryUtilization" and r.changes["max_model_len"] == 2064, r.summary()


def _kv_log(weights: float, kv: float, tail: str) -> str:
    return (
        "\n".join(
            [
                P + f"INFO 12-02 06:09:22 [model_runner.py:302] Model loading took {weights:.2f} GiB and 2.5 seconds",
                P + f"INFO 12-02 06:09:25 [gpu_worker.py:538] Available KV cache memory: {kv:.2f} GiB",
                P + "ERROR 12-02 06:09:25 [core.py:1231] ValueError: " + tail,
            ]
        )
        + "\n"
    )


def test_a_kv_refusal_with_a_positive_printed_budget_is_not_healed_as_weights():
    """High. 20.17 GiB of weights on a 24 GiB GPU at 0.95, 'Available KV cache memory: 0.80 GiB', vLLM's
    estimate 7,488 tokens. weights_beyond_gpu's estimated 2.51 GiB 'beside' says 20.17 > 19.96 and the
    crash is healed as the weights' (GiveUp, or Quantize where allowed); before: LowerMaxModelLen 7488."""
    log = _kv_log(
        20.17,
        0.80,
        "To serve at least one request with the models's max seq len (32768), (3.50 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.80 GiB). Based on the available memory, the "
        "estimated maximum model length is 7488. Try increasing `gpu_memory_utilization`.",
    )
    d = classify(Signals(log=log, exit_code=1))
    for heal in ({}, {"quantizedFallback": {"allowed": True, "model": "m-awq", "method": "awq"}}):
        s = VLLMServiceSpec(model="m", engine={"gpuMemoryUtilization": 0.95, "maxModelLen": 32768}, heal=heal)
        r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=23.65, gpu_name="GEFORCE-RTX-4090"))
        assert r.changes == {"max_model_len": 7488}, r.summary()


def test_a_state_block_shortage_keeps_its_own_remedy_under_large_weights():
    """High. 'max_num_seqs (1024) exceeds available Mamba cache blocks (37)' with 20.5 GiB of weights on a
    24 GiB GPU: vLLM says 37 blocks exist; baa3587 gives up ('no flag makes them fit')."""
    log = _kv_log(
        20.5,
        0.60,
        "max_num_seqs (1024) exceeds available Mamba cache blocks (37). Each decode sequence requires one "
        "Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at most 37 or "
        "increase gpu_memory_utilization.",
    )
    d = classify(Signals(log=log, exit_code=1))
    s = VLLMServiceSpec(model="m", engine={"gpuMemoryUtilization": 0.95, "maxNumSeqs": 1024})
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=23.65, gpu_name="GEFORCE-RTX-4090"))
    assert r.changes == {"max_num_seqs": 37}, r.summary()


def test_a_kv_refusal_under_weights_that_fill_the_gpu_still_takes_the_weights_plan():
    """The commit's own case stays: 'Available KV cache memory: -8.93 GiB' stays empty at 0.95."""
    d = diagnose("local-h200-weights72")
    s = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 8192},
        heal={"quantizedFallback": {"allowed": True, "model": "q", "method": "awq"}},
    )
    assert plan_heal(s, d, inventory=Inventory(gpu_total_gib=139.8)).action == "Quantize"


def test_a_raise_never_cuts_below_what_vllm_says_the_smaller_cache_holds():
    """Medium. gemma-2-2b (half its layers windowed), 'KV cache (30000)' at 0.9, LowerMaxModelLen tried:
    baa3587 raises to 0.93 AND cuts to 23,456, below the 30,000 the 0.9 cache already held (the tokens'
    GiB count a window's layers only to the window); before: 30,688."""
    log = (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (30000). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`.\n"
    )
    d = classify(Signals(log=log, exit_code=1))
    s = VLLMServiceSpec(
        model="m", engine={"gpuMemoryUtilization": 0.9, "maxModelLen": 32768, "maxNumBatchedTokens": 65536}
    )
    inv = Inventory(gpu_total_gib=23.65, shape=config_shape("gemma-2-2b"))
    r = plan_heal(s, d, [{"cause": "kv_cache_insufficient", "action": "LowerMaxModelLen"}], inventory=inv)
    assert r.action == "RaiseGpuMemoryUtilization" and r.changes.get("max_model_len", 32768) >= 30000, r.summary()


def test_a_batch_cut_the_printed_figures_do_not_size_is_not_made():
    """Medium-low. Kimi-VL's MoonViT asked 1029.51 GiB with 19.23 GiB free (58.52 GiB held by PyTorch), no
    weights printed: baa3587 cuts the batch 32768 -> 2048, which scales the allocation to 64.3 GiB (3.3x
    what was free) and says it 'keeps that allocation within a quarter of it'; before: a give-up."""
    d = diagnose("profoom-54-kimivl-moonvit-1029gib")
    s = VLLMServiceSpec(model="m", engine={"maxModelLen": 32768, "tensorParallelSize": 8, "maxNumBatchedTokens": 32768})
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=79.35, gpu_name="A100-SXM4-80GB"))
    assert r.action != "LowerMaxNumBatchedTokens", r.summary()


def test_a_repeated_free_memory_cut_stops_at_the_weights_an_earlier_crash_printed():
    """Medium. Free memory shrinks 60 -> 30 -> 16 GiB on an H200; an earlier crash printed 14.99 GiB of
    weights (status.heals), the shape is unknown. baa3587 cuts to 0.09 (12.58 GiB < 14.99) and 0.04: certain
    crashes, where before the second refusal gave up."""
    s = VLLMServiceSpec(model="m", engine={"maxModelLen": 8192, "gpuMemoryUtilization": 0.19})
    log = (
        "ValueError: Free memory on device (16.0/139.8 GiB) on startup is less than desired GPU memory "
        "utilization (0.19, 26.56 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    hist = [
        {"cause": "kv_cache_insufficient", "action": None, "numbers": {"weights_gib": 14.99}},
        {"cause": "gpu_util_exceeds_free", "action": "LowerGpuMemoryUtilization"},
    ]
    r = plan_heal(s, classify(Signals(log=log)), hist, inventory=Inventory(gpu_total_gib=139.8))
    assert r.changes.get("gpu_memory_utilization", 1.0) * 139.8 >= 14.99, r.summary()


def test_a_repeated_free_memory_cut_is_not_held_to_weights_another_split_printed():
    """Medium (review2). A KV refusal at TP 1 printed 60 GiB of weights on an H100; the heal split the model
    over 2 GPUs (30 GiB each); other processes then took memory twice. 0919d69 refused the second free-memory
    cut (0.62 -> 0.49: 38.8 GiB a GPU, room for the 30 GiB that GPU holds) against TP 1's 60 GiB, and gave up.
    The weights printed before a split changed, in serve's history and the operator's (status.heals), are
    another split's."""
    from vllm_autoheal.kube.status import history

    s = VLLMServiceSpec(model="m", engine={"tensorParallelSize": 2, "gpuMemoryUtilization": 0.62})
    log = (
        "ValueError: Free memory on device (40.0/79.19 GiB) on startup is less than desired GPU memory "
        "utilization (0.62, 49.1 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    served = [  # serve's history: action and numbers in one record
        {"cause": "kv_cache_insufficient", "action": "IncreaseTensorParallel", "numbers": {"weights_gib": 60.0}},
        {"cause": "gpu_util_exceeds_free", "action": "LowerGpuMemoryUtilization", "numbers": {"free_gib": 50.0}},
    ]
    heals = [  # the operator's: status.tried, then status.heals' figures
        {
            "cause": "kv_cache_insufficient",
            "numbers": {"weights_gib": 60.0},
            "action": "IncreaseTensorParallel",
            "changes": [{"field": "tensorParallelSize", "before": "1", "after": "2"}],
        },
        {
            "cause": "gpu_util_exceeds_free",
            "numbers": {"free_gib": 50.0},
            "action": "LowerGpuMemoryUtilization",
            "changes": [{"field": "gpuMemoryUtilization", "before": "0.9", "after": "0.62"}],
        },
    ]
    operator = history(
        ["kv_cache_insufficient/IncreaseTensorParallel", "gpu_util_exceeds_free/LowerGpuMemoryUtilization"], heals
    )
    for hist in (served, operator):
        r = plan_heal(s, classify(Signals(log=log)), hist, inventory=Inventory(gpu_total_gib=79.19))
        assert r.action == "LowerGpuMemoryUtilization" and r.changes["gpu_memory_utilization"] < 0.62, r.summary()
    # the same split's weights still hold a repeat back
    r = plan_heal(
        s,
        classify(Signals(log=log)),
        [served[1], {"cause": "kv_cache_insufficient", "action": None, "numbers": {"weights_gib": 45.0}}, served[1]],
        inventory=Inventory(gpu_total_gib=79.19),
    )
    assert r.gives_up, r.summary()


def test_a_repeated_free_memory_cut_reads_the_split_each_crash_ran_on():
    """A user's own edit of TP or PP is in no heal's changes: the crash recorded before it printed its
    weights per GPU of the old split. Each record now names the split its crash ran on (status.heals[].gpus),
    and only the current split's weights hold a repeated cut back: TP 1's 60 GiB neither refuses a cut that
    leaves TP 2's GPU room for its 30 GiB, nor does TP 4's 15 GiB let a cut below TP 2's own weights pass."""
    from vllm_autoheal.kube.status import history

    s = VLLMServiceSpec(model="m", engine={"tensorParallelSize": 2, "gpuMemoryUtilization": 0.62})
    log = (
        "ValueError: Free memory on device (40.0/79.19 GiB) on startup is less than desired GPU memory "
        "utilization (0.62, 49.1 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    tried = ["gpu_util_exceeds_free/LowerGpuMemoryUtilization"]

    def crash(weights: float, gpus: int) -> dict:
        return {
            "cause": "kv_cache_insufficient",
            "numbers": {"weights_gib": weights},
            "action": "NoChange",
            "gpus": gpus,
        }

    def cut(gpus: int) -> dict:
        change = {"field": "gpuMemoryUtilization", "before": "0.9", "after": "0.62"}
        return {
            "cause": "gpu_util_exceeds_free",
            "numbers": {"free_gib": 50.0},
            "action": "x",
            "changes": [change],
            "gpus": gpus,
        }

    def planned(heals: list[dict]):
        return plan_heal(
            s, classify(Signals(log=log)), history(tried, heals, 2), inventory=Inventory(gpu_total_gib=79.19)
        )

    # TP 1 crashed with 60 GiB a GPU; the user then set TP 2 by hand (no heal changed it)
    r = planned([crash(60.0, 1), cut(2)])
    assert r.action == "LowerGpuMemoryUtilization" and r.changes["gpu_memory_utilization"] < 0.62, r.summary()
    # TP 2's own 45 GiB still hold the repeat back, whatever a TP 4 run printed after it
    assert planned([crash(45.0, 2), crash(15.0, 4), cut(2)]).gives_up
    # a record from before the field (no gpus) still counts, as before
    legacy = crash(45.0, 2)
    del legacy["gpus"]
    assert planned([legacy, cut(2)]).gives_up
