"""Session 41's hostile review of the heal arithmetic: each heal is checked by hand against the figures vLLM printed
(its KV budget, the tokens that budget holds, its concurrency for one request of max_model_len) and vLLM's own
rules. Each test asserts the right behaviour and is a strict xfail while the code does otherwise."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.remedy import Inventory, plan_heal


def _v1_budget_log(budget_gib: float, tokens: int, context: int, concurrency: str) -> str:
    """vLLM V1's three lines on the cache it sized: its budget, the tokens that holds, and the concurrency for one
    request of max_model_len (below 1x: one request does not fit, which the classifier reads as a KV shortage)."""
    return (
        f"(EngineCore_0 pid=1) INFO 05-01 10:00:00 [gpu_worker.py:200] Available KV cache memory: {budget_gib:.2f} GiB\n"
        f"(EngineCore_0 pid=1) INFO 05-01 10:00:00 [kv_cache_utils.py:800] GPU KV cache size: {tokens:,} tokens\n"
        f"(EngineCore_0 pid=1) INFO 05-01 10:00:00 [kv_cache_utils.py:804] Maximum concurrency for {context:,} "
        f"tokens per request: {concurrency}x\n"
    )


def _plan(log: str, engine: dict, gpu: str, heal: dict | None = None):
    d = classify(Signals(log=log))
    spec = VLLMServiceSpec(model="m", engine=engine, heal=heal or {})
    g = lookup(gpu)
    inv = Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name)  # (no config.json: the CLI's `diagnose`, a
    # ConfigMap not given, a Hub that did not answer)
    return d, g, plan_heal(spec, d, inventory=inv)


def test_a_raise_beside_a_printed_budget_holds_the_tokens_vllm_said_the_budget_holds():
    # vLLM: 2.00 GiB of KV cache holds 16,384 tokens, 0.50x of one 32,768-token request: the context needs
    # 2.00 / 0.50 = 4.00 GiB. On an L4 (22.05 GiB) at 0.9, the bound 0.95 adds at most 0.05 x 22.05 = 1.1 GiB; the
    # heal takes 0.93 (free memory's limit), 2.00 + 0.03 x 22.05 = 2.66 GiB, which holds 16,384 x 2.66 / 2.00
    # = 21,790 tokens: vLLM's own check refuses max_model_len 32,768 again. The right heal keeps a context the
    # grown budget holds (about 21,500 tokens, with the raise), or shortens it to the 16,384 tokens alone.
    d, g, r = _plan(
        _v1_budget_log(2.0, 16384, 32768, "0.50"), {"maxModelLen": 32768, "gpuMemoryUtilization": 0.9}, "NVIDIA-L4"
    )
    assert d.cause == "kv_cache_insufficient" and d.numbers["kv_cache_tokens"] == 16384
    util = r.changes.get("gpu_memory_utilization", 0.9)
    context = r.changes.get("max_model_len", 32768)
    grown = 2.0 + (util - 0.9) * g.memory_gib
    assert context <= 16384 * grown / 2.0, r.summary()


def test_an_fp8_cache_alone_is_not_planned_where_twice_the_printed_tokens_miss_the_context():
    # vLLM: 1.60 GiB holds 13,104 tokens, 0.40x of a 32,768-token request. Utilization is at the bound (0.95), so no
    # raise; an fp8 cache doubles the tokens a GiB holds: 26,208 < 32,768, and vLLM refuses again. Its docstring's own
    # rule ("fp8 alone only when twice that holds the context; else with the context twice that holds") calls for
    # fp8 with max_model_len <= 26,208 (25,936 with its 1% margin).
    d, _, r = _plan(
        _v1_budget_log(1.6, 13104, 32768, "0.40"),
        {"maxModelLen": 32768, "gpuMemoryUtilization": 0.95},
        "NVIDIA-H100-80GB-HBM3",
    )
    assert d.cause == "kv_cache_insufficient" and d.numbers["kv_cache_tokens"] == 13104
    if r.action == "Fp8KvCache":
        assert r.changes.get("max_model_len", 32768) <= 2 * 13104, r.summary()


GPU_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu"


def _runtime_oom_at_the_kv_heals_share() -> str:
    """The real vLLM 0.25 serving OOM on the H200 beside another process (failure-logs/runtime.log), its figures
    those of the real KV heal it would follow (heal-runs/kv-beside-30g.log, the second start: Llama 3.1 8B,
    max_model_len 131,072 at utilization 0.24: 17.45 GiB of cache, 142,928 tokens, 1.09x)."""
    log = (GPU_FIXTURES / "failure-logs" / "runtime.log").read_text()
    log = log.replace("'max_model_len': 8192", "'max_model_len': 131072")
    log = log.replace("'gpu_memory_utilization': 0.5", "'gpu_memory_utilization': 0.24")
    log = log.replace("Available KV cache memory: 53.8 GiB", "Available KV cache memory: 17.45 GiB")
    log = log.replace("GPU KV cache size: 440,688 tokens", "GPU KV cache size: 142,928 tokens")
    return re.sub(
        r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x",
        "Maximum concurrency for 131,072 tokens per request: 1.09x",
        log,
    )


def test_a_runtime_cut_without_the_models_shape_keeps_a_context_vllms_own_budget_holds():
    # vLLM printed 17.45 GiB of cache holding 142,928 tokens (8,191 a GiB), 1.09x one request of 131,072. The heal
    # cuts utilization 0.24 -> 0.22 on the 139.8 GiB H200: 2.80 GiB off the cache, 14.65 GiB left, which holds
    # 14.65 x 8,191 = 120,000 tokens < 131,072 (vLLM: "16.0 GiB KV cache is needed ... (14.65 GiB)"). The cut must
    # come with max_model_len <= ~120,000 (as it does where the model's config is known: 116,512), or not at all.
    log = _runtime_oom_at_the_kv_heals_share()
    d = classify(Signals(log=log))
    assert d.cause == "runtime_oom" and d.numbers["available_kv_gib"] == 17.45
    spec = VLLMServiceSpec(
        model="m", engine={"maxModelLen": 131072, "gpuMemoryUtilization": 0.24, "enforceEager": True}
    )
    g = lookup("NVIDIA-H200")
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name))
    total = d.numbers["gpu_total_gib"]
    util = r.changes.get("gpu_memory_utilization", 0.24)
    left = 17.45 - (0.24 - util) * total
    held = 142928 * left / 17.45
    assert r.changes.get("max_model_len", 131072) <= held, r.summary()


def test_a_capture_cut_without_the_models_shape_keeps_a_context_vllms_own_budget_holds():
    # The real vLLM 0.25 capture OOM on the H200 at utilization 0.995 (failure-logs/capture.log): 122.77 GiB of cache
    # holding 1,005,712 tokens (8,192 a GiB); here with max_model_len 990,000 (1.01x). The heal cuts 0.995 -> 0.95
    # (the bound): 0.045 x 139.8 = 6.29 GiB off the cache, 116.48 GiB left, 954,200 tokens < 990,000. The cut must
    # come with max_model_len <= ~954,000, or the next step (--enforce-eager, which keeps the cache) must be taken.
    log = (GPU_FIXTURES / "failure-logs" / "capture.log").read_text()
    log = log.replace("'max_model_len': 8192", "'max_model_len': 990000")
    log = re.sub(
        r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x",
        "Maximum concurrency for 990,000 tokens per request: 1.01x",
        log,
    )
    d = classify(Signals(log=log))
    assert d.cause == "cudagraph_capture_oom" and d.numbers["kv_cache_tokens"] == 1005712
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 990000, "gpuMemoryUtilization": 0.995})
    g = lookup("NVIDIA-H200")
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=g.memory_gib, gpu_name=g.name))
    util = r.changes.get("gpu_memory_utilization", 0.995)
    left = 122.77 - (0.995 - util) * d.numbers["gpu_total_gib"]
    assert r.changes.get("max_model_len", 990000) <= 1005712 * left / 122.77, r.summary()
