"""Real crashes from the corpus (training split only) replayed through the planner: each test takes
a thread's own log, classifies it as the operator would (the deployment's TP/PP and the pod's
state), rebuilds the flags the thread ran with, and asks plan_heal for the change. Each asserts what
the figures vLLM printed say the change must be; each names the change made before, which those
figures already showed would fail, go the wrong way, or need a second restart they could have avoided."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.diagnosis.corpus import context
from vllm_autoheal.remedy import plan_heal
from vllm_autoheal.remedy.model import Inventory, Remedy
from vllm_autoheal.remedy_gate import fingerprint

from crafted.bases import CORPUS, corpus_log


def diagnose(name: str) -> Diagnosis:
    """The sample's crash as the operator reads it: the log, the spec's TP/PP, the pod's state."""
    return classify(Signals(log=corpus_log(name), **context(CORPUS[name], pod_state=True)))


def spec(**engine) -> VLLMServiceSpec:
    return VLLMServiceSpec(model="m", engine=engine)


def again(s: VLLMServiceSpec, d: Diagnosis, first: Remedy, inv: Inventory | None = None) -> Remedy:
    """The next plan when the same crash comes back after `first` was applied."""
    return plan_heal(
        s,
        d,
        history=[{"cause": str(d.cause), "action": first.action, "numbers": d.numbers}],
        inventory=inv,
        engine=first.apply(s.engine),
        failed={fingerprint("m", s.engine, None)},
    )


def test_the_replayed_samples_read_as_their_labels():
    """The replays below start from a right classification (a wrong one is the classifier's to fix)."""
    for name in (*_STAGE_NO_BLOCKS, *_OTHER_PROCESS, *_LARGER_THAN_GPU, "local-h200-profile", *_ZERO_BLOCKS):
        assert CORPUS[name]["split"] == "train"
        assert diagnose(name).cause == CORPUS[name]["label"], name


def test_a_kv_refusal_the_numbers_size_is_healed_in_one_restart():
    """The healthy case for contrast: vLLM's estimate (34,736 tokens of the smallest stage's cache)
    is the new context, which it says fits."""
    d = diagnose("mgpu-34076-pp-mixed-gpus")
    r = plan_heal(spec(pipelineParallelSize=2, gpuMemoryUtilization=0.9), d)
    assert r.changes == {"max_model_len": 34736}


# --- 1. A pipeline stage with no room for the KV cache, answered with less memory for it --------

_STAGE_NO_BLOCKS = {
    # vLLM: "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utiliz..."
    "mgpu-36861-pp-no-cache-blocks": None,
    # Qwen3.5-35B-A3B over 4 A10s by pipeline: "No available memory for the cache blocks."
    "mgpu-36904-pp-embed-lmhead-all-ranks-no-kv": 22.06,
}


@pytest.mark.parametrize("name", list(_STAGE_NO_BLOCKS))
def test_a_pipeline_stage_without_cache_blocks_never_gets_less_memory(name):
    """Critical. vLLM printed 'No available memory for the cache blocks. Try increasing
    gpu_memory_utilization' on one pipeline stage. Before: the multi-GPU plan's cut, 0.9 -> 0.88 (a
    certain second crash, the wrong way), then EnforceEager, then GiveUp. Now: the KV plan."""
    d = diagnose(name)
    assert (d.cause, d.subtype) == ("multi_gpu_oom", "kv_check_fails_on_smallest_stage")
    r = plan_heal(spec(pipelineParallelSize=2), d, inventory=Inventory(gpu_total_gib=_STAGE_NO_BLOCKS[name]))
    assert r.action == "RaiseGpuMemoryUtilization" and r.changes["gpu_memory_utilization"] > 0.9, r.summary()


def test_a_second_kv_refusal_on_the_smallest_stage_never_gets_less_memory():
    """High. After max_model_len -> vLLM's estimate (34,736 tokens), the same refusal again: before,
    utilization 0.9 -> 0.88, less for a cache vLLM just said is short; now the KV plan's next step."""
    d = diagnose("mgpu-34076-pp-mixed-gpus")
    s = spec(pipelineParallelSize=2, gpuMemoryUtilization=0.9)
    first = plan_heal(s, d)
    assert first.changes == {"max_model_len": 34736}
    r = again(s, d, first)
    assert r.action in ("RaiseGpuMemoryUtilization", "Fp8KvCache"), r.summary()
    assert r.changes.get("gpu_memory_utilization", 0.9) >= 0.9, r.summary()


# --- 2. Another process holds the GPU: the cut is sized from the failed allocation, not from it --

# name -> (the GPU's total, the most vLLM can have by the OOM message's own figures, the thread's fix)
_OTHER_PROCESS = {
    # "40.00 GiB total capacity; 31.32 GiB already allocated; 200.38 MiB free; 31.34 GiB reserved in total by
    # PyTorch": this process can have its 31.34 + 0.20 GiB (+ at most 1 GiB of CUDA context) = 32.54 GiB, 0.81
    # of the GPU; the reporter's fix was --gpu-memory-utilization 0.7 (confirmed).
    "util-1013-h2ogpt-a100-grid-shared-embedding": (40.0, 32.54),
    # "44.56 GiB total capacity; ... 565.31 MiB free; 27.93 GiB reserved in total by PyTorch": 29.48 GiB, 0.66.
    "util-783-other-process-15g-opt125m": (44.56, 29.48),
    # "total capacity of 47.36 GiB ... Process 2585863 has 42.16 GiB memory in use": 5.2 GiB, 0.11.
    "util-1422-dynamo-run-other-process-42gib": (47.36, 5.2),
    # "23.69 GiB ... Process 1254 has 730.00 MiB, 1243 424 MiB, 1349 800 MiB, 1348 3.70 GiB, 1892152 2.96 GiB"
    # besides its own 14.90 GiB: 23.69 - 8.61 = 15.08 GiB, 0.64 (it ran at 0.75).
    "gpuutil-1224-qwen25vl-awq-other-procs": (23.69, 15.08),
    # "Process 35156 has 22.14 GiB memory in use. Including non-PyTorch memory, this process has 1.05 GiB":
    # 23.53 - 22.14 = 1.39 GiB, 0.06: no utilization loads a 6B model there.
    "util-xinf1361-second-model-same-gpu": (23.53, 1.39),
}
_OTHER_ENGINE = {"gpuutil-1224-qwen25vl-awq-other-procs": {"gpuMemoryUtilization": 0.75, "maxModelLen": 4096}}


@pytest.mark.parametrize("name", list(_OTHER_PROCESS))
def test_another_process_s_memory_sizes_the_cut(name):
    """High. A CUDA OOM with another process on the GPU prints no 'Free memory on device' figure. Before:
    utilization cut by what failed to allocate (0.9 -> 0.87, 0.85, 0.88; 0.75 -> 0.71), 2-37 GiB more
    than the GPU had left (util-1013's reporter started at 0.7). Now: the share is sized from what
    the failure's figures say the others hold (0.77 there), or a give-up where nothing is left."""
    total, room = _OTHER_PROCESS[name]
    d = diagnose(name)
    assert d.cause == "gpu_util_exceeds_free"
    r = plan_heal(spec(**_OTHER_ENGINE.get(name, {})), d, inventory=Inventory(gpu_total_gib=total))
    assert r.gives_up or r.changes["gpu_memory_utilization"] * total <= room, r.summary()


def test_a_share_that_counts_the_other_instance_is_raised_not_cut():
    """High. A second vLLM 0.6 instance at --gpu-memory-utilization 0.2 beside one holding most of an A100:
    'initial_memory_usage=68.01GiB', then 'No available memory for the cache blocks'. vLLM 0.6's budget
    (worker.py determine_num_available_blocks) is utilization x the GPU less the peak it measured, and
    that peak adds every byte in use on the GPU outside its own PyTorch allocations, the other
    instance's included: 0.2 x 79.15 - 68.01 < 0. Before (sessions to 23): a cut to fit the 11.14 GiB
    left, which leaves the budget more negative still (a certain second crash). Now: a raise, so that
    the share covers what vLLM counts in use; the cache it then allocates is the budget, not the share."""
    d = diagnose("gpufree-10533-two-instances-a100")
    assert (d.subtype, d.numbers["initial_usage_gib"]) == ("no_blocks_beside_other_processes", 68.01)
    r = plan_heal(
        spec(gpuMemoryUtilization=0.2, maxModelLen=16384, enforceEager=True),
        d,
        inventory=Inventory(gpu_total_gib=79.15),
    )
    assert r.action == "RaiseGpuMemoryUtilization", r.summary()
    assert r.changes["gpu_memory_utilization"] * 79.15 > 68.01 + 1.0, r.summary()


# --- 3. A profiling allocation no halving can bring within the GPU -----------------------------


def test_a_dummy_batch_too_large_is_cut_in_tokens_first():
    """High. vLLM 0.25's profile with --max-num-batched-tokens 2097152 asked for 112 GiB (2,097,152 x
    28,672 x 2 bytes) with 91.86 GiB free. Before: max_num_seqs halved, which leaves the batch and
    its 112 GiB (a certain second crash). Now: the batch, above vLLM's default, sized from the
    allocation in one step."""
    d = diagnose("local-h200-profile")
    assert d.numbers["tried_gib"] == 112.0 and d.numbers["gpu_free_gib"] == 91.86
    s = spec(maxModelLen=8192, maxNumSeqs=256, maxNumBatchedTokens=2097152, enforceEager=True)
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200"))
    assert r.changes.get("max_num_batched_tokens", 2097152) * 112.0 / 2097152 <= 91.86, r.summary()


def test_a_dummy_batch_is_cut_where_the_gpu_less_the_weights_holds_its_allocation():
    """Medium. The same profile with --max-num-batched-tokens 131072 asking for 40 GiB with 1.5 GiB free
    (the profile's other tensors, which shrink with the batch, held the rest). Before: the cut to
    vLLM's default refused, as 40 x 8192/131072 = 2.5 GiB is more than was free, and max_num_seqs was
    halved (256 -> 128), which leaves the batch and its 40 GiB. Now: the refusal asks halving_short's measure, the GPU less the 15 GiB of weights."""
    log = corpus_log("local-h200-profile")
    for was, now in (("112.00", "40.00"), ("91.86 GiB is", "1.50 GiB is"), ("47.93", "138.20"), ("47.20", "137.50")):
        log = log.replace(was, now)  # (this process holds all but what is free: no other one)
    d = classify(Signals(log=log))
    assert d.cause == "profiling_oom" and (d.numbers["tried_gib"], d.numbers["gpu_free_gib"]) == (40.0, 1.5)
    s = spec(maxModelLen=8192, maxNumSeqs=256, maxNumBatchedTokens=131072, enforceEager=True)
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200"))
    assert r.action == "LowerMaxNumBatchedTokens", r.summary()
    assert r.changes["max_num_batched_tokens"] <= 16384, r.summary()


def test_a_utilization_cut_never_leaves_less_than_the_printed_weights():
    """Medium. The same 112 GiB profiling OOM after both counts were cut: before, utilization cut by
    what failed, 0.9 -> 0.09 (12.58 GiB of the H200, where vLLM loaded 15.0 GiB of weights: a certain
    crash). Now the weights vLLM printed set the least utilization a heal may write."""
    d = diagnose("local-h200-profile")
    s = spec(maxModelLen=8192, maxNumSeqs=256, maxNumBatchedTokens=2097152, enforceEager=True)
    r = plan_heal(
        s,
        d,
        history=[{"cause": "profiling_oom", "action": a} for a in ("LowerMaxNumSeqs", "LowerMaxNumBatchedTokens")],
        inventory=Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200"),
    )
    assert r.gives_up or r.changes["gpu_memory_utilization"] * 139.8 > d.numbers["weights_gib"], r.summary()


# name -> the flags the thread ran with
_LARGER_THAN_GPU = {
    # Qwen3.5-0.8B's vision encoder under SDPA on ROCm: "Tried to allocate 192.00 GiB ... total capacity of
    # 15.98 GiB of which 11.56 GiB is free"
    "prof-gpustack4963-rocm-vit-sdpa-192g": {},
    # Kimi-VL's MoonViT without flash_attn: "Tried to allocate 1029.51 GiB ... 79.35 GiB of which 19.23 GiB"
    "profoom-54-kimivl-moonvit-1029gib": {"tensorParallelSize": 8, "maxNumBatchedTokens": 32768, "maxModelLen": 32768},
    # the same encoder: "Tried to allocate 408.29 GiB ... 79.33 GiB of which 50.72 GiB is free"
    "profoom-51-kimivl-8xa800-408gib": {},
}


@pytest.mark.parametrize("name", list(_LARGER_THAN_GPU))
def test_an_allocation_larger_than_the_gpu_is_not_halved(name):
    """High. Before: max_num_seqs halved, then max_num_batched_tokens, then a give-up: two certain
    crashes (a halving at best halves the allocation: 96 GiB of a 16 GiB GPU, 515 and 204 of 80 GiB
    ones) and the spec left degraded. Now: a give-up at once that names the allocation."""
    d = diagnose(name)
    assert (d.cause, d.subtype) == ("profiling_oom", "allocation_larger_than_gpu")
    r = plan_heal(spec(**_LARGER_THAN_GPU[name]), d)
    assert r.gives_up and f"asked for {d.numbers['tried_gib']:g} GiB" in r.reason


# --- 4. An fp8 cache for a KV budget that holds no block at all ---------------------------------

_ZERO_BLOCKS = {
    # "# GPU blocks: 0" at --gpu-memory-utilization 0.98 (above the 0.95 bound: no raise is left)
    "kv_cache_insufficient-1354-wsl2-vicuna7b-gpu-blocks-0": (
        {"gpuMemoryUtilization": 0.98, "maxModelLen": 2048},
        None,
    ),
    # the same refusal on an RTX 3090 once the planner's raise (0.9 -> 0.93) has been tried
    "kv-qanything302-qwen7b-zero-blocks": ({"maxModelLen": 4096}, 23.69),
}


@pytest.mark.parametrize("name", list(_ZERO_BLOCKS))
def test_zero_cache_blocks_are_not_doubled_by_fp8(name):
    """High. vLLM printed '# GPU blocks: 0': before, an fp8 cache once the raise was tried or out of
    bounds (twice no block is none: a certain second crash); now not."""
    engine, total = _ZERO_BLOCKS[name]
    d = diagnose(name)
    assert d.subtype == "zero_gpu_blocks"
    s, inv = spec(**engine), Inventory(gpu_total_gib=total)
    r = plan_heal(s, d, inventory=inv)
    if r.action == "RaiseGpuMemoryUtilization":  # the raise first; then the same refusal again
        r = again(s, d, r, inv)
    assert r.action != "Fp8KvCache", r.summary()


# --- 5. A raise that keeps a context 16x what the cache holds -----------------------------------


def test_a_raise_comes_with_a_context_the_printed_tokens_can_reach():
    """Medium. vLLM: the cache holds 1,984 tokens, the context is 32,768, and minMaxModelLen (2,048)
    forbids vLLM's figure. Before: 0.9 -> 0.95 keeping 32,768 (the cache would have to grow 16.5x).
    Now: the raise with the context it surely holds (the cache is at most the share, so 0.95/0.9 of
    1,984 tokens at least, less 1 %): 2,064."""
    d = diagnose("kv-2785-qwen1.5-7b-chat")
    assert d.numbers == {"max_seq_len": 32768, "kv_tokens": 1984}
    r = plan_heal(spec(maxModelLen=32768), d)
    assert r.changes == {"gpu_memory_utilization": 0.95, "max_model_len": 2064}, r.summary()


# --- 6. A give-up that says the weights do not fit, where vLLM's own figures say they do ----------


def test_a_give_up_never_says_weights_that_loaded_do_not_fit():
    """Low. RTX 4060 at 0.70: vLLM printed weights 5.20 GiB and a KV budget of -1.05 in a 5.60 GiB
    share. The give-up is right (0.81, the most free memory allows, leaves -0.17 GiB), but it said the
    weights fit no GPU and advised TP 2 (a flat 2 GiB counted beside them, where vLLM printed 1.45).
    Now: the printed figures count, and the give-up says what the raise would have left."""
    d = diagnose("kv-13882-rtx4060-negative-kv")
    r = plan_heal(spec(gpuMemoryUtilization=0.7, maxModelLen=4096), d)
    assert r.gives_up and "makes them fit" not in r.reason, r.summary()
    assert "KV budget was -1.05 GiB" in r.reason and "leaves it at -0.17 GiB" in r.reason


# --- 5. A KV refusal where the weights vLLM loaded leave the GPU nothing -----------------------


@pytest.mark.parametrize(
    ("heal", "action", "changes"),
    [
        ({"quantizedFallback": {"allowed": True, "model": "m-awq", "method": "awq"}}, "Quantize", {"model": "m-awq"}),
        (
            {"bounds": {"maxTensorParallelSize": 4}, "allowedActions": ["IncreaseTensorParallel"]},
            "IncreaseTensorParallel",
            {"tensor_parallel_size": 2},
        ),
    ],
)
def test_a_kv_refusal_under_weights_that_fill_the_gpu_takes_the_weights_remedy_the_policy_allows(heal, action, changes):
    """High. A 72B in bf16 on one H200: 'Model loading took 135.43 GiB', 'Available KV cache memory: -8.93
    GiB', then vLLM's KV refusal. Before: a give-up that told the user to name a quantized fallback or
    allow more tensor parallelism, whichever they had already done (the KV plan has no weights step).
    Now: the crash is healed as the weights' failure it is, with the change the policy allows."""
    d = diagnose("local-h200-weights72")
    assert d.cause == "kv_cache_insufficient" and d.numbers["weights_gib"] == 135.43
    s = VLLMServiceSpec(model="m", engine={"maxModelLen": 8192}, heal=heal)
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA-H200"))
    assert r.action == action and changes.items() <= r.changes.items(), r.summary()


def test_a_kv_refusal_under_weights_that_fill_the_gpu_says_how_to_allow_the_split():
    """Without either allowed: a give-up that names both settings a split needs (the bound alone,
    which the advice named before, leaves IncreaseTensorParallel out of the default allowedActions)."""
    r = plan_heal(spec(maxModelLen=8192), diagnose("local-h200-weights72"), inventory=Inventory(gpu_total_gib=139.8))
    assert r.gives_up and "maxTensorParallelSize and IncreaseTensorParallel in spec.heal.allowedActions" in r.reason
