"""Heal sizing attacked where the printed figures or the memory model already say how a change ends:
each test names what the planner did before its fix, what it must do, and how bad it was."""

from __future__ import annotations

import json

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.gpu_catalog import GpuSpec, lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import check, to_shape
from vllm_autoheal.quantity import parse_quantity
from vllm_autoheal.remedy import GIVE_UP, Inventory, plan_heal
from vllm_autoheal.shape_reader import shape_from_config

from samples import CONFIGS, config_shape

LLAMA8 = config_shape("llama-3.1-8b")
DEEPSEEK = config_shape("deepseek-v3")
KV_H200 = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (3.96 GiB). Based on the available memory, "
    "the estimated maximum model length is 32464. Try increasing"
)
FREE_20 = (
    "ValueError: Free memory on device (20.5/139.8 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
H200 = 139.8


def spec(heal: dict | None = None, **engine) -> VLLMServiceSpec:
    return VLLMServiceSpec(model="m", engine=engine, heal=heal or {})


def test_kv_with_a_fixed_kv_size_is_not_healed_by_utilization():
    """High. With kvCacheMemoryBytes set, vLLM sizes the KV cache from it and ignores
    gpu_memory_utilization for the cache. Before: a KV-cache-insufficient crash raised utilization
    0.5 -> 0.6, which changes nothing of the cache: a certain second crash. Now: utilization is
    left alone and the context is lowered to vLLM's own estimate."""
    s = spec(gpuMemoryUtilization=0.5, maxModelLen=131072, kvCacheMemoryBytes=4 * 2**30)
    r = plan_heal(s, classify(Signals(log=KV_H200)), inventory=Inventory(gpu_total_gib=H200))
    assert r.action == "LowerMaxModelLen" and r.changes == {"max_model_len": 32464}


def test_kv_short_beyond_the_utilization_bound_lowers_the_context_with_the_raise():
    """High. vLLM printed that the cache needs 16 GiB and has 3.96; the most utilization may rise
    (0.95) gives it 10.95 GiB, and minMaxModelLen (65536) is above vLLM's estimate (32464). Before:
    'no numbers' blind raise to 0.95 alone, which the printed figures say still fails at 131072 (a
    second restart the numbers could have avoided). Now: the raise comes with the context the grown
    cache holds by vLLM's own estimate, scaled by the memory it gains (within the bound)."""
    s = spec(gpuMemoryUtilization=0.9, maxModelLen=131072, heal={"bounds": {"minMaxModelLen": 65536}})
    r = plan_heal(s, classify(Signals(log=KV_H200)), inventory=Inventory(gpu_total_gib=H200))
    assert r.action == "RaiseGpuMemoryUtilization"
    assert r.changes["gpu_memory_utilization"] == 0.95
    grown = 3.96 + (0.95 - 0.9) * H200
    assert 65536 <= r.changes["max_model_len"] <= 32464 * grown / 3.96
    assert r.changes["max_model_len"] % 16 == 0


def test_kv_raise_does_not_carry_a_context_change_the_user_did_not_allow():
    """The combined raise needs LowerMaxModelLen allowed too; without it, no blind raise that the
    figures say fails."""
    allowed = ["RaiseGpuMemoryUtilization", "Fp8KvCache"]
    s = spec(gpuMemoryUtilization=0.9, maxModelLen=131072, heal={"allowedActions": allowed})
    r = plan_heal(s, classify(Signals(log=KV_H200)), inventory=Inventory(gpu_total_gib=H200))
    assert "max_model_len" not in r.changes
    assert r.changes != {"gpu_memory_utilization": 0.95}


def test_fp8_kv_cache_comes_with_the_context_it_holds():
    """High. fp8 doubles the tokens the cache holds: 32464 -> about 64900, still short of 131072.
    Before: fp8 alone, a certain second crash. Now: fp8 with max_model_len sized to twice vLLM's
    estimate (the bound, 40000, allows it)."""
    s = spec(maxModelLen=131072, heal={"bounds": {"minMaxModelLen": 40000}})
    inv = Inventory(gpu_total_gib=H200, gpu_free_gib=21.5)  # the GPU is full: no raise
    r = plan_heal(s, classify(Signals(log=KV_H200)), inventory=inv)
    assert r.action == "Fp8KvCache"
    assert r.changes["kv_cache_dtype"] == "fp8"
    assert 40000 <= r.changes["max_model_len"] <= 2 * 32464


def test_fp8_kv_cache_alone_when_twice_the_estimate_holds_the_context():
    s = spec(maxModelLen=60000, heal={"bounds": {"minMaxModelLen": 40000}})
    r = plan_heal(s, classify(Signals(log=KV_H200)), inventory=Inventory(gpu_total_gib=H200, gpu_free_gib=21.5))
    assert r.action == "Fp8KvCache" and r.changes == {"kv_cache_dtype": "fp8"}


def test_fp8_is_not_tried_when_even_twice_the_estimate_is_below_the_bound():
    s = spec(maxModelLen=131072, heal={"bounds": {"minMaxModelLen": 65536}})
    r = plan_heal(s, classify(Signals(log=KV_H200)), inventory=Inventory(gpu_total_gib=H200, gpu_free_gib=21.5))
    assert r.action == GIVE_UP


def test_batched_tokens_stay_at_max_model_len_without_chunked_prefill():
    """High. With chunked prefill off, vLLM refuses to start when max_num_batched_tokens <
    max_model_len ("... is smaller than max_model_len ..."): not a memory failure, so no heal
    follows and the service stays down. Before: 32768 halved to 16384 with max_model_len 32768.
    Now: no change below max_model_len."""
    d = Diagnosis(cause="runtime_oom", numbers={"tried_gib": 2.0})
    history = [
        {"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization"},
        {"cause": "runtime_oom", "action": "LowerMaxNumSeqs"},
    ]
    for off in (
        ["--no-enable-chunked-prefill"],
        ["--enable-chunked-prefill=false"],
        ["--enable-chunked-prefill", "False"],
    ):
        s = spec(maxModelLen=32768, maxNumBatchedTokens=32768, extraArgs=off)
        r = plan_heal(s, d, history=history, inventory=Inventory(gpu_total_gib=H200))
        assert r.changes.get("max_num_batched_tokens", 32768) >= 32768, off
    s = spec(maxModelLen=8192, maxNumBatchedTokens=32768, extraArgs=["--no-enable-chunked-prefill"])
    r = plan_heal(s, d, history=history, inventory=Inventory(gpu_total_gib=H200))
    assert r.changes == {"max_num_batched_tokens": 16384}  # still above max_model_len: allowed


def test_memory_limit_raise_reaches_a_decimal_bound():
    """Medium. The bound '32G' (32e9 bytes) is not a whole number of MiB; the raise capped at it was
    written rounded up (30518Mi > 32G) and the gate refused it: GiveUp with room left. Now the
    capped value is rounded down to whole MiB, inside the bound."""
    s = spec(heal={"bounds": {"maxMemoryLimit": "32G"}})
    used = 28 * 2**30
    r = plan_heal(s, Diagnosis(cause="host_ram_oom"), inventory=Inventory(memory_limit_bytes=used), memory_limit="28Gi")
    assert r.action == "RaiseMemoryLimit"
    assert used < parse_quantity(r.changes["memory_limit"]) <= 32 * 10**9


def test_utilization_fitted_to_free_memory_also_fits_the_context():
    """High. 20.5 GiB free of 139.8: utilization 0.12 holds the weights and a 2048-token cache, and
    the memory model says its 0.69 GiB of KV holds about 5,600 tokens, far below max_model_len 131072
    (the remedy's own 'Expected' said 'still fails'). Before: utilization alone, a certain
    KV-cache crash next. Now: the context the memory model fits (3% margin) comes with it."""
    s = spec(maxModelLen=131072)
    r = plan_heal(s, classify(Signals(log=FREE_20)), inventory=Inventory(gpu_total_gib=H200, shape=LLAMA8))
    assert r.action == "LowerGpuMemoryUtilization"
    assert "still fails" not in r.expected
    healed = r.apply(s.engine)
    assert healed.max_model_len is not None and 2048 <= healed.max_model_len < 131072
    assert estimate(LLAMA8, healed, GpuSpec("gpu", H200), 20.5 + 0.51).fits


def test_tensor_parallel_is_sized_to_what_holds_the_weights():
    """High. DeepSeek-V3's weights take ~1250 GiB; TP 2 leaves 625 GiB per H200, and the remedy's
    own 'Expected' said so ('still fails'). Before: TP 1 -> 2, then 4, then 8: three more loads of a
    671B model. Now: the smallest TP within the bound that the memory model says fits (16)."""
    allowed = ["IncreaseTensorParallel", "Quantize", "CpuOffload"]
    s = spec(heal={"bounds": {"maxTensorParallelSize": 16}, "allowedActions": allowed})
    r = plan_heal(s, Diagnosis(cause="weights_load_oom"), inventory=Inventory(gpu_total_gib=H200, shape=DEEPSEEK))
    assert r.action == "IncreaseTensorParallel" and r.changes == {"tensor_parallel_size": 16}
    assert estimate(DEEPSEEK, r.apply(s.engine), GpuSpec("gpu", H200)).fits


def test_tensor_parallel_not_raised_when_no_size_within_the_bound_fits():
    allowed = ["IncreaseTensorParallel"]
    s = spec(heal={"bounds": {"maxTensorParallelSize": 8}, "allowedActions": allowed})
    r = plan_heal(s, Diagnosis(cause="weights_load_oom"), inventory=Inventory(gpu_total_gib=H200, shape=DEEPSEEK))
    assert r.action == GIVE_UP


def test_tensor_parallel_respects_kv_heads():
    """vLLM needs the KV heads to divide by TP (or TP by them, replicated): 40 heads, 10 KV heads
    splits over 2 but not 4."""
    shape = LLAMA8.__class__(**{**LLAMA8.__dict__, "heads": 40, "kv_heads": 10})
    allowed = ["IncreaseTensorParallel"]
    s = spec(tensorParallelSize=2, heal={"bounds": {"maxTensorParallelSize": 4}, "allowedActions": allowed})
    d = Diagnosis(cause="weights_load_oom")
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=8.0, shape=shape))
    assert r.action == GIVE_UP


def test_a_vanishing_device_size_is_no_device_size():
    """High (bad input raised). A termination message may carry total_gib 1e-310: finite, not negative,
    within figures.check. Before: lower_utilization_step divided by it and math.ceil(inf) raised
    OverflowError out of plan_heal (the operator's crash handler). Now a device under half a GiB counts
    as unknown, as if none was printed."""
    s = spec(gpuMemoryUtilization=0.9)
    for cause in ("runtime_oom", "profiling_oom", "cudagraph_capture_oom", "kv_cache_insufficient"):
        d = Diagnosis(
            cause=cause, numbers={"total_gib": 1e-310, "tried_gib": 4096.0, "needed_gib": 16.0, "available_gib": 3.0}
        )
        r = plan_heal(s, d)
        assert all(not isinstance(v, float) or 0 < v <= 1 for v in r.changes.values()), r
    r = plan_heal(s, Diagnosis(cause="runtime_oom", numbers={"total_gib": 1e-310, "tried_gib": 4096.0}))
    assert r.changes == {"gpu_memory_utilization": 0.88}


def test_tensor_parallel_that_holds_the_weights_but_not_the_context_comes_with_the_context_it_holds():
    """Llama-3.1-70B on 80 GiB GPUs, TP up to 2: two GPUs hold its weights, but not a KV cache of
    131072 tokens. Sizing TP only to a full fit gave up here (no split within the bound keeps the
    context), and a blind TP 2 would have crashed again on the KV cache. The split that holds the
    weights comes with the context its cache holds, in one restart."""
    llama70 = config_shape("llama-3.1-70b")
    allowed = ["IncreaseTensorParallel", "LowerMaxModelLen"]
    s = spec(maxModelLen=131072, heal={"bounds": {"maxTensorParallelSize": 2}, "allowedActions": allowed})
    r = plan_heal(s, Diagnosis(cause="weights_load_oom"), inventory=Inventory(gpu_total_gib=80.0, shape=llama70))
    assert r.action == "IncreaseTensorParallel" and r.changes["tensor_parallel_size"] == 2, r
    assert 2048 <= r.changes["max_model_len"] < 131072
    assert estimate(llama70, r.apply(s.engine), GpuSpec("gpu", 80.0)).fits
    cannot_shorten = spec(
        maxModelLen=131072,
        heal={"bounds": {"maxTensorParallelSize": 2}, "allowedActions": ["IncreaseTensorParallel"]},
    )
    r = plan_heal(
        cannot_shorten, Diagnosis(cause="weights_load_oom"), inventory=Inventory(gpu_total_gib=80.0, shape=llama70)
    )
    assert r.action == GIVE_UP  # (LowerMaxModelLen not allowed: no shorter context, and no split keeps it)


MISTRAL = config_shape("mistral-7b-v0.1")
QWEN7 = config_shape("qwen2.5-7b")


def test_a_context_cut_sized_by_the_memory_model_is_not_made_for_a_sliding_window():
    """High (a wrong change: the user's context cut for nothing). Mistral-7B-v0.1 attends over a
    4096-token window: vLLM keeps at most the window's KV per request (plus a step's tokens). With
    20.5 GiB free, utilization 0.12 leaves ~2.5 GiB of cache: ~20k tokens counted at full context,
    < 32768, which cut max_model_len 32768 -> ~19k with the utilization fit. The memory model now
    counts the window as vLLM does: the cache holds a request of 32768, and the utilization goes alone."""
    s = spec(maxModelLen=32768)
    inv = Inventory(gpu_total_gib=H200, shape=MISTRAL)
    est = estimate(MISTRAL, s.engine.model_copy(update={"gpu_memory_utilization": 0.12}), GpuSpec("gpu", H200))
    assert est.kv_tokens < 32768 <= est.max_model_len_fit  # (full-context tokens short; the window's need fits)
    r = plan_heal(s, classify(Signals(log=FREE_20)), inventory=inv)
    assert r.action == "LowerGpuMemoryUtilization" and "max_model_len" not in r.changes, r


def test_tensor_parallel_for_a_sliding_window_model_keeps_the_context():
    """High (a wrong change). Mistral-7B-v0.1 on 10 GiB GPUs: TP 2 holds its weights, and counted at
    full context its cache falls short of 32768 tokens, which a 4096-token window never needs: TP 2
    came with max_model_len cut to that count. Counted as vLLM counts the window, TP 2 fits alone."""
    allowed = ["IncreaseTensorParallel", "LowerMaxModelLen"]
    s = spec(maxModelLen=32768, heal={"bounds": {"maxTensorParallelSize": 2}, "allowedActions": allowed})
    est = estimate(MISTRAL, s.engine.model_copy(update={"tensor_parallel_size": 2}), GpuSpec("gpu", 10.0))
    assert est.kv_tokens < 32768 and est.failure != "kv_cache_insufficient"
    r = plan_heal(s, Diagnosis(cause="weights_load_oom"), inventory=Inventory(gpu_total_gib=10.0, shape=MISTRAL))
    assert r.action == "IncreaseTensorParallel" and r.changes == {"tensor_parallel_size": 2}, r


def test_a_window_the_config_turns_off_is_no_window():
    """Qwen2.5 configs name a sliding_window with use_sliding_window false: vLLM attends over the whole
    context, so the memory model's count holds and the context cut still comes with the fit."""
    cfg = {**json.loads((CONFIGS / "qwen2.5-7b.json").read_text()), "sliding_window": 4096}
    cfg["use_sliding_window"] = False
    shape = shape_from_config(cfg)
    assert shape.sliding_window is None and shape.kv_layers() == (shape.layers, 0)
    checked = to_shape(check(cfg))  # (the operator's path: the flag survives the config check)
    assert checked.kv_layers() == (checked.layers, 0)


def test_a_vanishing_available_cache_never_raises():
    """High (bad input raised). A forged termination message: available_gib 1e-320 (finite, not
    negative, passes figures.check) with an estimated length. Before: raise_utilization_blind scaled
    the estimate by grown/available = inf, and int(nan) raised ValueError out of plan_heal (the
    operator's crash handler). Now: no context is sized from it; the planner answers."""
    s = spec(gpuMemoryUtilization=0.5, maxModelLen=131072)
    numbers = {"needed_gib": 100.0, "available_gib": 1e-320, "estimated_max_model_len": 1000.0}
    r = plan_heal(s, Diagnosis(cause="kv_cache_insufficient", numbers=numbers), inventory=Inventory(gpu_total_gib=H200))
    assert all(not isinstance(v, float) or 0 < v <= 1 for v in r.changes.values()), r


FREE_30_H100 = (
    "ValueError: Free memory on device (30.0/79.19 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)


def test_the_heal_sizes_the_context_under_the_images_release():
    """High. Llama 3.1 8B on an H100 with 30 GiB free: utilization 0.35 leaves a cache whose size
    depends on the release's start-up profile (vLLM 0.11.1-0.16 sample the dummy batch with PyTorch's
    sort, 3.9 GiB more). Before: the heal's estimates knew no release (92,368 tokens, which 0.14's
    7.76 GiB cache does not hold: a second crash). Now: 61,632 under vllm/vllm-openai:v0.14.0, and
    the operator's inventory reads the release off the VLLMService's image. Under 0.33 the CUDA graphs
    are reserved inside the budget: no room is kept for them beside it (0.36, not 0.35), and the cache
    they leave holds a little less than without a release."""
    from vllm_autoheal.api import VLLMService
    from vllm_autoheal.kube.heal import inventory
    from vllm_autoheal.vllm_release import parse_version

    d = classify(Signals(log=FREE_30_H100))
    shape = config_shape("llama-3.1-8b")
    lengths = {}
    for version in ("0.14.0", "0.33.0", None):
        release = parse_version(version) if version else None
        inv = Inventory(gpu_total_gib=79.19, gpu_name="NVIDIA-H100-80GB-HBM3", shape=shape, release=release)
        r = plan_heal(spec(), d, inventory=inv)
        assert r.changes["gpu_memory_utilization"] == (0.36 if version == "0.33.0" else 0.35)
        assert "(fits)" in r.expected
        lengths[version] = r.changes["max_model_len"]
    assert lengths["0.14.0"] < 0.7 * lengths[None] and 0.95 * lengths[None] < lengths["0.33.0"] < lengths[None]
    obj = VLLMService(spec=VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.14.0"))
    assert inventory(obj, None, shape, Diagnosis()).release == parse_version("0.14.0")


def test_a_second_free_memory_refusal_is_fitted_again_to_what_it_printed():
    """Medium. Another process grew between two starts: vLLM printed 20.5 GiB free, the heal fitted
    utilization to it, and the next start printed 12.5 GiB free. Before: LowerGpuMemoryUtilization
    counted as tried for the cause, so the second crash was given up (or stepped blind) though it
    printed what is free now. Now: fitted again to the new figure, lower than what ran."""
    first = plan_heal(spec(), classify(Signals(log=FREE_20)), inventory=Inventory(gpu_total_gib=H200))
    assert first.action == "LowerGpuMemoryUtilization"
    ran = first.changes["gpu_memory_utilization"]
    again_log = FREE_20.replace("20.5/139.8", "12.5/139.8").replace(
        "(0.9, 125.82 GiB)", f"({ran}, {ran * H200:.2f} GiB)"
    )
    history = [{"cause": "gpu_util_exceeds_free", "action": "LowerGpuMemoryUtilization"}]
    r = plan_heal(
        spec(gpuMemoryUtilization=ran),
        classify(Signals(log=again_log)),
        history,
        inventory=Inventory(gpu_total_gib=H200),
    )
    assert r.action == "LowerGpuMemoryUtilization", r.summary()
    assert r.changes["gpu_memory_utilization"] * H200 < 12.5 and r.changes["gpu_memory_utilization"] < ran


def test_a_free_memory_cut_sized_from_the_probe_alone_is_not_repeated():
    """The repeat is for a crash that printed what is free: a cut from the probe's figure at start is not
    made again on a crash that printed none (it would be the same guess)."""
    d = classify(
        Signals(log="ValueError: Free memory on device on startup is less than desired GPU memory utilization")
    )
    history = [{"cause": d.cause, "action": "LowerGpuMemoryUtilization"}]
    r = plan_heal(
        spec(gpuMemoryUtilization=0.5), d, history, inventory=Inventory(gpu_total_gib=H200, gpu_free_gib=40.0)
    )
    assert r.action != "LowerGpuMemoryUtilization", r.summary()


def test_a_split_that_would_stop_at_graph_capture_comes_with_room_for_the_graphs():
    """Medium. Qwen2.5-32B at --gpu-memory-utilization 0.95 on L4s: the weights do not fit one GPU, and
    the memory model says the 8-way split then stops at CUDA-graph capture (1.1 GiB left outside a
    0.95 budget, the graphs need about 1). Before: TP 8, a capture OOM, then utilization 0.93: two
    restarts. Now: TP 8 and 0.93 in one change, which the memory model says starts."""
    l4 = lookup("NVIDIA-L4")
    shape = config_shape("qwen2.5-32b")
    d = classify(
        Signals(
            log="ERROR [gpu_model_runner.py:1] Failed to load model - not enough GPU memory. (original error: CUDA "
            "out of memory. Tried to allocate 1.00 GiB.)"
        )
    )
    heal = {
        "bounds": {"maxTensorParallelSize": 8},
        "allowedActions": ["IncreaseTensorParallel", "LowerGpuMemoryUtilization"],
    }
    r = plan_heal(
        spec(heal, gpuMemoryUtilization=0.95), d, inventory=Inventory(gpu_total_gib=l4.memory_gib, shape=shape)
    )
    assert r.action == "IncreaseTensorParallel" and r.changes["tensor_parallel_size"] == 8, r.summary()
    assert r.changes.get("gpu_memory_utilization", 0.95) < 0.95, r.summary()
    after = r.apply(EngineArgs(gpu_memory_utilization=0.95))
    assert estimate(shape, after, l4, l4.memory_gib).fits
    # without LowerGpuMemoryUtilization allowed, the split alone, as before
    heal["allowedActions"] = ["IncreaseTensorParallel"]
    r = plan_heal(
        spec(heal, gpuMemoryUtilization=0.95), d, inventory=Inventory(gpu_total_gib=l4.memory_gib, shape=shape)
    )
    assert r.changes == {"tensor_parallel_size": 8}, r.summary()


def test_room_for_graphs_is_merged_only_where_the_change_brings_capture_on():
    """Medium (review2). The memory model says Qwen2.5-32B at TP 8 and utilization 0.95 on L4s stops at
    CUDA-graph capture. A pod with those very flags that served and was then OOM-killed on the host, or
    ran out of memory while serving, got past capture with them: the model is wrong about them there.
    Before: the memory-limit raise came with utilization 0.95 -> 0.93 (a GPU cut for a host-RAM
    kill, which the gate refuses for host_ram_oom), and the sequence cut with another utilization cut.
    Now: each change alone; the split that brings capture on still comes with the room."""
    l4 = lookup("NVIDIA-L4")
    shape = config_shape("qwen2.5-32b")
    inv = Inventory(gpu_total_gib=l4.memory_gib, shape=shape, memory_limit_bytes=64 << 30)
    s = VLLMServiceSpec(
        model="m",
        engine={"tensorParallelSize": 8, "gpuMemoryUtilization": 0.95},
        resources={"limits": {"memory": "64Gi"}},
        heal={"bounds": {"maxMemoryLimit": "256Gi", "maxTensorParallelSize": 8}},
    )
    host = classify(Signals(reason="OOMKilled", exit_code=137, ready_before=True))
    r = plan_heal(s, host, inventory=inv)
    assert r.action == "RaiseMemoryLimit" and set(r.changes) == {"memory_limit"}, r.summary()
    serving = classify(
        Signals(log="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.", ready_before=True)
    )
    assert serving.cause == "runtime_oom"
    r = plan_heal(s, serving, [{"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization"}], inv)
    assert r.action == "LowerMaxNumSeqs" and "gpu_memory_utilization" not in r.changes, r.summary()


def test_a_kv_refusal_is_never_healed_with_a_utilization_cut():
    """Low (review2). A KV refusal calls for more utilization (the gate refuses a cut for it). Before: Mixtral
    on RTX 4090s at TP 4 and 0.95 ('No available memory for the cache blocks') was split 8 ways with
    utilization 0.95 -> 0.93 merged in as room for the graphs, a cut of the very budget vLLM found short.
    Now: the split alone (a capture crash, if it comes, is healed by its own plan)."""
    g = lookup("NVIDIA-GeForce-RTX-4090")
    d = classify(
        Signals(log="ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`")
    )
    assert d.cause == "kv_cache_insufficient"
    heal = {
        "bounds": {"maxTensorParallelSize": 8},
        "allowedActions": ["IncreaseTensorParallel", "LowerGpuMemoryUtilization"],
    }
    r = plan_heal(
        spec(heal, tensorParallelSize=4, gpuMemoryUtilization=0.95),
        d,
        inventory=Inventory(gpu_total_gib=g.memory_gib, shape=config_shape("mixtral-8x7b")),
    )
    assert r.changes == {"tensor_parallel_size": 8}, r.summary()


# A capture OOM at the graphs' point in vLLM's start (its KV check passed), as the recovery bench renders it.
CAPTURE_OOM = (
    '  File "vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.\n"
)


def _capture_heal(max_model_len: int | None):
    """Qwen2.5-7B on a 24 GB RTX 4090 at 0.95 (graphs beside the budget: no release named): capture failed."""
    shape, gpu = config_shape("qwen2.5-7b"), lookup("NVIDIA-GeForce-RTX-4090")
    engine = EngineArgs(gpu_memory_utilization=0.95, max_model_len=max_model_len)
    assert estimate(shape, engine, gpu).failure == "cudagraph_capture_oom"
    inv = Inventory(gpu_total_gib=gpu.memory_gib, shape=shape, gpu_free_gib=gpu.memory_gib)
    remedy = plan_heal(VLLMServiceSpec(model="m", engine=engine), classify(Signals(log=CAPTURE_OOM)), [], inv, engine)
    return remedy, estimate(shape, remedy.apply(engine), gpu)


def test_a_capture_heal_keeps_the_context_with_the_leaner_room_that_holds_it():
    """The room for the graphs (their ~1 GiB, what failed and 0.5 GiB) cut 0.95 -> 0.91, where the cache holds
    126,944 tokens of the 131,072 the model runs at: the heal's own estimate said it still fails, and the KV
    check stopped the next start (a second restart, raising to 0.93). The graphs and 0.5 GiB alone (0.93) keep
    the context: that is the cut, in one restart."""
    remedy, after = _capture_heal(None)
    assert remedy.changes == {"gpu_memory_utilization": 0.93}, remedy.summary()
    assert after.fits, after.reasons


def test_a_capture_heal_whose_cut_leaves_the_context_too_long_shortens_it_in_the_same_restart():
    """Where even the leaner room leaves the cache short of the context (140,000 tokens: 135,792 held at 0.93),
    the cut comes with the context its cache holds (3% margin), as the free-memory heal's does."""
    remedy, after = _capture_heal(140000)
    assert remedy.changes["gpu_memory_utilization"] == 0.91 and remedy.changes["max_model_len"] < 126944
    assert after.fits, after.reasons


def _capture_heal_with(tried_mib: float, heal: dict | None = None):
    """As _capture_heal (131,072 tokens), with the size of the allocation that failed and the spec's heal policy."""
    log = CAPTURE_OOM.replace("512.00 MiB", f"{tried_mib:.2f} MiB")
    shape, gpu = config_shape("qwen2.5-7b"), lookup("NVIDIA-GeForce-RTX-4090")
    engine = EngineArgs(gpu_memory_utilization=0.95)
    inv = Inventory(gpu_total_gib=gpu.memory_gib, shape=shape, gpu_free_gib=gpu.memory_gib)
    s = VLLMServiceSpec(model="m", engine=engine, heal=heal or {})
    remedy = plan_heal(s, classify(Signals(log=log)), [], inv, engine)
    return remedy, estimate(shape, remedy.apply(engine), gpu), gpu.memory_gib


def test_the_leaner_capture_room_still_holds_the_allocation_that_failed():
    """High. Capture failed asking for 2 GiB in one allocation. Before: the leaner room (the graphs' ~1 GiB and
    0.5 GiB, 0.93) left 1.66 GiB outside the budget, less than the one allocation that already failed: a
    certain second capture OOM. Now: the leaner room holds at least what failed and 0.5 GiB."""
    remedy, after, total = _capture_heal_with(2048)
    util = remedy.changes["gpu_memory_utilization"]
    assert (1 - util) * total >= 2.0 + 0.5, remedy.summary()
    assert after.fits, after.reasons


def test_a_capture_heal_without_a_context_cut_takes_the_leaner_room_that_keeps_the_context():
    """High. LowerMaxModelLen not allowed: the full room (0.91) leaves the cache short of 131,072 tokens and no
    cut may come with it. Before: 0.91 alone, which the heal's own estimate said still fails (the KV check
    stops the next start: a second restart). Now: the leaner room (0.93) that keeps the context."""
    actions = ["LowerGpuMemoryUtilization", "EnforceEager"]
    remedy, after, _ = _capture_heal_with(512, {"allowedActions": actions})
    assert remedy.changes == {"gpu_memory_utilization": 0.93}, remedy.summary()
    assert after.fits, after.reasons


def test_a_capture_room_whose_cache_cannot_hold_the_context_is_no_heal():
    """High. LowerMaxModelLen not allowed and capture failed asking for 3 GiB: every room that holds it leaves
    the cache short of 131,072 tokens. Before: a utilization cut the heal's own estimate said still fails. Now:
    no room; the next step (eager) heals."""
    actions = ["LowerGpuMemoryUtilization", "EnforceEager"]
    remedy, after, _ = _capture_heal_with(3072, {"allowedActions": actions})
    assert remedy.changes == {"enforce_eager": True}, remedy.summary()
    assert after.fits, after.reasons
