"""vLLM 0.34's extensible KV cache in the memory model (extensible_kv.py): a budget above the free memory is
no refusal, the cache holds what is free after warm-up less what vLLM keeps free, and that size is checked
again. Read in 0.34.0's sources (v1/worker/utils.py request_memory, extensible_kv_cache.py
measure_kv_cache_bytes, gpu_worker.py peak_activation_memory, kv_cache_planning.py shrink_kv_cache_configs,
config/vllm.py _resolve_extensible_kv_cache)."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.extensible_kv import extensible_kv_cache
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import CUDA_CONTEXT_GIB, estimate
from vllm_autoheal.preflight import preflight
from vllm_autoheal.vllm_release import Release, parse_version

from samples import config_shape

H100 = lookup("NVIDIA-H100-80GB-HBM3")
LLAMA = config_shape("llama-3.1-8b")
V033, V034 = parse_version("0.33.0"), parse_version("0.34.0")


def held(est, free: float, floor: float = 1.0) -> float:
    """measure_kv_cache_bytes with the estimate's parts: the budget capped by what is free less the margin,
    less what the engine holds (weights, non-torch, the captured graphs) and the reserve it keeps free (the
    activation peak and the graph estimate)."""
    reserve = est.activation_gib + est.cudagraph_gib
    margin = max(floor, 0.75 * reserve)
    return (
        min(est.requested_gib, free - CUDA_CONTEXT_GIB - margin)
        - est.weights_gib
        - est.non_torch_gib
        - est.cudagraph_gib
        - reserve
    )


def test_a_budget_above_the_free_memory_is_no_refusal_and_the_cache_takes_what_is_free():
    """Another process holds 30 GiB of an H100: 0.33 refuses 0.9 (71.27 GiB asked, 49.49 free); 0.34 starts,
    with a cache of what is free less the margin and the reserve."""
    engine = EngineArgs(gpu_memory_utilization=0.9, max_model_len=8192)
    old = estimate(LLAMA, engine, H100, 50.0, release=V033)
    assert old.failure == "gpu_util_exceeds_free"
    new = estimate(LLAMA, engine, H100, 50.0, release=V034)
    assert new.fits, new.reasons
    assert new.kv_cache_gib == pytest.approx(held(new, 50.0)) and 29 < new.kv_cache_gib < 31


def test_on_an_idle_gpu_the_cache_keeps_the_graph_estimate_free_beside_the_captured_graphs():
    """At 0.9 on an idle GPU the budget binds; the reserve vLLM keeps free after capture still counts the
    graph estimate, which the captured graphs also take: one graph share less than 0.33's cache."""
    engine = EngineArgs(gpu_memory_utilization=0.9, max_model_len=8192)
    old, new = (estimate(LLAMA, engine, H100, release=r) for r in (V033, V034))
    assert new.kv_cache_gib == pytest.approx(old.kv_cache_gib - new.cudagraph_gib)
    assert new.kv_cache_gib == pytest.approx(held(new, H100.memory_gib))
    # eager: no graphs taken, none kept free
    eager = estimate(LLAMA, engine.model_copy(update={"enforce_eager": True}), H100, release=V034)
    assert eager.cudagraph_gib == 0 and eager.kv_cache_gib == pytest.approx(held(eager, H100.memory_gib))


def test_near_a_utilization_of_one_the_free_memory_less_the_margin_binds_and_rocm_keeps_more():
    engine = EngineArgs(gpu_memory_utilization=0.99, max_model_len=8192)
    cuda = estimate(LLAMA, engine, H100, release=V034)
    rocm = estimate(LLAMA, engine, H100, release=Release((0, 34, 0), "rocm"))
    assert cuda.kv_cache_gib == pytest.approx(held(cuda, H100.memory_gib))
    # (the budget, 78.4 GiB, is above what is free less the margin: less than 0.33's less the graph share)
    assert cuda.kv_cache_gib < estimate(LLAMA, engine, H100, release=V033).kv_cache_gib - cuda.cudagraph_gib - 0.5
    assert rocm.kv_cache_gib == pytest.approx(held(rocm, H100.memory_gib, floor=3.0))
    assert rocm.kv_cache_gib < cuda.kv_cache_gib


def test_no_block_in_what_is_free_after_warm_up_is_a_kv_refusal():
    """17 GiB free: the weights load, nothing is left for a block once the graphs and the reserve are
    counted; vLLM's check after warm-up refuses it as a KV shortage (0.33 refused the budget itself)."""
    engine = EngineArgs(gpu_memory_utilization=0.9, max_model_len=8192)
    assert estimate(LLAMA, engine, H100, 17.0, release=V033).failure == "gpu_util_exceeds_free"
    new = estimate(LLAMA, engine, H100, 17.0, release=V034)
    assert new.failure == "kv_cache_insufficient" and new.kv_budget_gib <= 0 and new.kv_tokens == 0


@pytest.mark.parametrize(
    "engine",
    [
        {"extra_args": ["--no-enable-extensible-kv-cache"]},
        {"kv_cache_memory_bytes": 40 * 2**30},  # (with the weights: more than the 49.49 GiB free)
        {"extra_args": ["--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}']},
        {"extra_args": ["--num-gpu-blocks-override=2048"]},
        {"extra_args": ["--enable-elastic-ep"]},
    ],
)
def test_the_flags_that_size_the_cache_otherwise_keep_the_refusal(engine):
    args = EngineArgs(gpu_memory_utilization=0.9, max_model_len=8192, **engine)
    assert not extensible_kv_cache(args, V034)
    assert estimate(LLAMA, args, H100, 50.0, release=V034).failure == "gpu_util_exceeds_free"


def test_only_0_34_and_on_size_the_cache_after_warm_up():
    args = EngineArgs()
    assert extensible_kv_cache(args, V034) and extensible_kv_cache(args, parse_version("0.34.2"))
    assert not any(extensible_kv_cache(args, r) for r in (V033, parse_version("0.29.0"), None))
    # explicitly on, or elastic EP explicitly off, keeps it
    assert extensible_kv_cache(EngineArgs(extra_args=["--enable-extensible-kv-cache"]), V034)
    assert extensible_kv_cache(EngineArgs(extra_args=["--no-enable-elastic-ep"]), V034)


def test_preflight_under_0_34_changes_nothing_for_memory_another_process_holds():
    """Pre-flight Fix with 50 GiB free: under 0.33 it lowers the utilization to what is free; under 0.34
    the start fits as it is, and no flag changes."""
    engine = {"gpuMemoryUtilization": 0.9, "maxModelLen": 8192}

    def fixed(version: str):
        spec = VLLMServiceSpec(model="m", image=f"vllm/vllm-openai:v{version}", engine=engine, preflight="Fix")
        return preflight(spec, H100, LLAMA, 50.0)

    old, new = fixed("0.33.0"), fixed("0.34.0")
    assert old.steps and old.engine.gpu_memory_utilization < 0.9
    assert new.fits and not new.steps and new.engine.gpu_memory_utilization == 0.9


def test_plan_names_the_extensible_cache_among_the_releases_figures():
    from vllm_autoheal.vllm_release import describe

    assert "extensible KV cache" in describe(V034) and "extensible" not in describe(V033)


def test_a_raise_for_the_kv_cache_stops_where_the_free_memory_less_the_margin_does():
    """Another process holds part of the H100 (the launcher's probe says how much is free); vLLM 0.34 at 0.3
    refuses 131,072 tokens of Llama-3.1-8B. A utilization past what is free less the margin the extensible
    cache keeps (extensible_kv.margin_gib) buys no cache: every raise stays within it, and starts."""
    from vllm_autoheal.diagnosis import Diagnosis
    from vllm_autoheal.diagnosis.model import Cause
    from vllm_autoheal.extensible_kv import margin_gib
    from vllm_autoheal.remedy import Inventory, plan_heal

    engine = EngineArgs(gpu_memory_utilization=0.3, max_model_len=131072)
    spec = VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.34.0", engine=engine)
    raises = 0
    for free in [x / 4 for x in range(120, 200)]:  # 30 to 50 GiB free
        est = estimate(LLAMA, engine, H100, free, release=V034)
        assert not est.fits and est.kv_cache_gib > 0
        d = Diagnosis(
            cause=Cause.KV_CACHE_INSUFFICIENT,
            subtype="max_model_len_exceeds_kv_capacity",
            numbers={"max_seq_len": 131072, "needed_gib": est.kv_needed_gib, "available_gib": est.kv_cache_gib},
        )
        inv = Inventory(gpu_total_gib=H100.memory_gib, gpu_name=H100.name, shape=LLAMA, release=V034, gpu_free_gib=free)
        remedy = plan_heal(spec, d, inventory=inv)
        if remedy.action == "RaiseGpuMemoryUtilization":
            raises += 1
            after = estimate(LLAMA, remedy.apply(engine), H100, free, release=V034)
            margin = margin_gib(V034, after.activation_gib + after.cudagraph_gib)
            assert after.requested_gib <= free - CUDA_CONTEXT_GIB - margin, (free, remedy.summary())
            assert after.fits, (free, remedy.summary(), after.reasons)
        else:
            assert remedy.action == "LowerMaxModelLen", remedy.summary()
    assert 0 < raises < 80


# --- a review of 1a62931


def test_the_disable_spelling_vllms_parser_pairs_with_enable_turns_the_cache_off():
    """Severity: medium.
    Input: extraArgs ["--disable-extensible-kv-cache"] under 0.34 with 50 GiB of an H100 free at 0.9.
    vLLM 0.34's FlexibleArgumentParser registers EnableDisableAction for every BooleanOptionalAction
    (utils/argparse_utils.py): `--enable-extensible-kv-cache` is paired with `--disable-extensible-kv-cache`,
    which sets it False. 1a62931 knew only `--no-enable-...`: the cache counted as extensible, pre-flight
    predicted a start that fits and kept 0.9, and vLLM refused the budget above the free memory.
    What should: off, and the refusal predicted; the last spelling wins, as in argparse."""
    off = EngineArgs(gpu_memory_utilization=0.9, max_model_len=8192, extra_args=["--disable-extensible-kv-cache"])
    assert not extensible_kv_cache(off, V034)
    assert estimate(LLAMA, off, H100, 50.0, release=V034).failure == "gpu_util_exceeds_free"
    assert not extensible_kv_cache(EngineArgs(extra_args=["--enable-extensible-kv-cache", "--disable-ext"]), V034)
    back_on = ["--disable-extensible-kv-cache", "--enable-extensible-kv-cache"]
    assert extensible_kv_cache(EngineArgs(extra_args=back_on), V034)


def _refused_before_warmup(util: float, bound: float):
    """vLLM 0.34's first KV check (kv_cache_planning.py get_kv_cache_configs, before warm-up) on its budget,
    as determine_available_memory prints it: the utilization's share less the weights, non-torch memory,
    activation peak and graph estimate."""
    from vllm_autoheal.diagnosis import Diagnosis
    from vllm_autoheal.diagnosis.model import Cause
    from vllm_autoheal.remedy import Inventory, plan_heal

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
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.34.0",
        engine=engine,
        heal={"bounds": {"maxGpuMemoryUtilization": bound}},
    )
    inv = Inventory(gpu_total_gib=H100.memory_gib, gpu_name=H100.name, shape=LLAMA, release=V034)
    return engine, plan_heal(spec, d, inventory=inv)


@pytest.mark.parametrize("util", [0.25, 0.3, 0.4])
def test_a_heal_of_the_check_before_warm_up_counts_the_graphs_warm_up_takes_off_the_cache(util):
    """Severity: medium.
    Input: Llama-3.1-8B on an H100 under 0.34, max_model_len 131072 (16 GiB of cache) at 0.25-0.4: vLLM's
    first check refuses its budget (the KV cache memory determine_available_memory prints, before warm-up).
    The cache then holds that budget less the graphs captured (measure_kv_cache_bytes keeps the graph
    estimate free beside them): 1a62931 models that, but the heal sized its raise from the budget alone with
    a 0.01 margin: 0.43, whose cache the memory model itself says holds 15.98 GiB < 16.00, refused again
    after warm-up; a LowerMaxModelLen to vLLM's estimate (bounds at the current utilization) the same.
    What should: one change after which the cache warm-up leaves holds the context."""
    engine, remedy = _refused_before_warmup(util, 0.99)
    assert remedy.action == "RaiseGpuMemoryUtilization", remedy.summary()
    after = estimate(LLAMA, remedy.apply(engine), H100, release=V034)
    assert after.fits, (remedy.summary(), after.reasons)
    engine, remedy = _refused_before_warmup(util, util)
    assert remedy.action == "LowerMaxModelLen", remedy.summary()
    after = estimate(LLAMA, remedy.apply(engine), H100, release=V034)
    assert after.fits, (remedy.summary(), after.reasons)


def test_figures_read_after_warm_up_are_not_cut_for_the_graphs_again():
    """The 'Memory after warmup' line says what the cache holds after capture: a heal sized from it counts no
    graphs off it again, whether or not its peak was read (gpu_blocks alone)."""
    from vllm_autoheal.diagnosis import Diagnosis
    from vllm_autoheal.diagnosis.model import Cause
    from vllm_autoheal.remedy import Inventory
    from vllm_autoheal.remedy.model import Context
    from vllm_autoheal.remedy_gate import Limits

    def loss(numbers: dict) -> float:
        d = Diagnosis(cause=Cause.KV_CACHE_INSUFFICIENT, numbers=numbers)
        spec = VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.34.0")
        inv = Inventory(gpu_total_gib=H100.memory_gib, gpu_name=H100.name, shape=LLAMA, release=V034)
        return Context(spec, spec.engine, d, inv, Limits(spec.heal.bounds, 0.1, None)).warmup_loss()

    assert loss({"available_gib": 10.0, "needed_gib": 16.0}) > 0  # the check before warm-up, on the budget
    assert loss({"available_kv_gib": 10.0, "gpu_blocks": 5120}) == 0
    assert loss({"available_kv_gib": 10.0, "gpu_blocks": 5120, "warmup_peak_gib": 1.72}) == 0
