"""Session 41's sixth hostile review, of f28f989: the fp8 KV cache that now comes with a cut to what is free
(share_steps._with_fp8_cache) where the cut's smaller cache no longer holds a context the bounds keep, the reason a
give-up then gives (Context.declined), and fp8_kv_cache sized on a pipeline's smallest stage (on_smallest_stage).
Each test asserts the right behaviour, with the numbers in a comment, and is a strict xfail while the code does
otherwise."""

from __future__ import annotations

from test_review_session41d import IMAGE, V034, _pp_refusal
from test_review_session41e import H200, L4, _refused_beside_a_grown_process
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.remedy import Inventory, plan_heal


def _plan_refused(engine: dict, heal: dict, free: float = 30.0):
    """41e's refusal (Llama-3.1-8B at 0.24 on an H200, max_model_len 131,072; vLLM printed 17.45 GiB holding 1.09x
    one request), the next start refused with `free` GiB free of 139.8."""
    log = _refused_beside_a_grown_process().replace("(30.00/139.8 GiB)", f"({free:.2f}/139.8 GiB)")
    d = classify(Signals(log=log))
    assert d.cause == "gpu_util_exceeds_free" and d.numbers["free_gib"] == free
    spec = VLLMServiceSpec(model="m", engine=engine, heal=heal)
    return plan_heal(spec, d, inventory=Inventory(gpu_total_gib=H200.memory_gib, gpu_name=H200.name))


def test_an_explicit_bfloat16_kv_cache_gets_the_fp8_cache_with_the_share_cut():
    # The same engine as 41e's healed case, but the spec spells kvCacheDtype: bfloat16 (a valid KVCacheDtype, 2
    # bytes an element: the very cache "auto" gives this bf16 model). 30 GiB free: the cut to 0.19 leaves ~85,246
    # tokens, short of the 131,072 minMaxModelLen keeps; fp8 holds ~170,500. With kvCacheDtype unset or "auto" the
    # plan is "--gpu-memory-utilization 0.19 --kv-cache-dtype fp8"; with "bfloat16" it is a give-up: "LowerGpu
    # MemoryUtilization refused: ... which the bounds (minMaxModelLen 131,072) or the allowed actions keep" - fp8
    # is allowed and holds it. (fp8_kv_cache, the KV refusal's step, does take bfloat16 to fp8: it checks
    # dtype.startswith("fp8").) Right: the same fp8 cut as for "auto".
    engine = {"maxModelLen": 131072, "gpuMemoryUtilization": 0.24, "kvCacheDtype": "bfloat16"}
    r = _plan_refused(engine, {"bounds": {"minMaxModelLen": 131072}})
    assert not r.gives_up, r.summary()
    assert r.changes.get("kv_cache_dtype") == "fp8" and r.changes["gpu_memory_utilization"] <= 0.19, r.summary()


def test_a_share_cut_whose_fp8_cache_holds_a_context_within_the_bounds_comes_with_both():
    # 27.00 GiB free of 139.8: the cut is 0.24 -> 0.17 (23.77 GiB asked). vLLM's figures (17.45 GiB held 142,868
    # tokens) leave 17.45 - 0.07 x 139.8 = 7.66 GiB: ~62,459 bf16 tokens, below minMaxModelLen 65,536, so no bf16
    # context cut; fp8 holds ~124,900, short of 131,072, so _with_fp8_cache declines and the plan gives up:
    # "utilization 0.17 leaves a KV cache of about 62,459 tokens, short of max_model_len 131,072, which the bounds
    # (minMaxModelLen 65,536) ... keep". fp8 with max_model_len ~121,000 (3% margin) is within every bound and
    # LowerMaxModelLen and Fp8KvCache are allowed (the default): fp8_kv_cache does the same for a KV refusal
    # ("kv_cache_dtype fp8, max_model_len := what twice the cache holds"). Right: 0.17, fp8 and a context between
    # 65,536 and what fp8 holds - one restart, not a give-up.
    r = _plan_refused({"maxModelLen": 131072, "gpuMemoryUtilization": 0.24}, {"bounds": {"minMaxModelLen": 65536}}, 27)
    assert not r.gives_up, r.summary()
    util = r.changes["gpu_memory_utilization"]
    assert util * 139.8 <= 27.0 - 0.5, r.summary()
    left = 17.45 - (0.24 - util) * 139.8
    fp8 = str(r.changes.get("kv_cache_dtype", "")).startswith("fp8")
    tokens = 142868 * left / 17.45 * (2 if fp8 else 1)
    assert 65536 <= r.changes.get("max_model_len", 131072) <= tokens, r.summary()


def test_an_fp8_cache_on_a_pipeline_under_0_34_counts_the_warm_up_loss_on_the_smallest_stage():
    # 41e's 0.34 pipeline refusal (two L4s, PP 2, max_model_len 32,768, graphs captured: warm-up takes 0.99 GiB off
    # each stage's cache): stage 0 2.00 GiB, stage 1 1.20 GiB, 8,192 tokens estimated on stage 0 (4,096 a GiB).
    # maxGpuMemoryUtilization 0.9: no raise. lower_max_model_len (now with the loss on the smallest stage) finds
    # 8,192 x 1.2/2.0 x 0.97 x (1.2 - 0.99)/1.2 x 0.97 = ~809 tokens, below minMaxModelLen 2,048: declined, right.
    # fp8_kv_cache then takes on_smallest_stage's 4,768 whole: 2 x 4,768 x 0.99 -> --kv-cache-dtype fp8
    # --max-model-len 9,440. Stage 1 after warm-up holds 1.20 - 0.99 = 0.21 GiB: 860 bf16 tokens, ~1,720 in fp8.
    # vLLM 0.34's check after warm-up refuses 9,440 there: a certain second crash. Right: no context above what fp8
    # holds after warm-up on stage 1 (here below the bound: a give-up, or another step).
    d = classify(Signals(log=_pp_refusal(2.0, 1.2, 8.0, 8192, 32768), exit_code=1, pipeline_parallel_size=2))
    assert d.subtype == "kv_check_fails_on_smallest_stage" and d.numbers["available_kv_gib"] == 1.2
    spec = VLLMServiceSpec(
        model="m",
        image=IMAGE,
        engine={"maxModelLen": 32768, "gpuMemoryUtilization": 0.9, "pipelineParallelSize": 2},
        heal={"bounds": {"maxGpuMemoryUtilization": 0.9}},
    )
    r = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=L4.memory_gib, gpu_name=L4.name, release=V034))
    util = r.changes.get("gpu_memory_utilization", 0.9)
    after_warmup = 1.2 - 0.99 + (util - 0.9) * L4.memory_gib
    per_token = 2 if str(r.changes.get("kv_cache_dtype", "")).startswith("fp8") else 1
    assert r.gives_up or r.changes.get("max_model_len", 32768) <= 4096 * after_warmup * per_token, r.summary()
