"""Where a release reserves its CUDA-graph estimate inside the budget (vllm_release.graphs_in_budget), every
part of the operator counts the graphs there once: the utilization floor, pre-flight, the free-memory and
capture heals, plan's report, and the flags that turn graphs off or pick the runner. Found by four hostile
reviews (of ba3d1ef, which first took the graphs off the cache, of ed0d609, 8e9f687 and 79335e7): each docstring
gives the severity, the input, what those commits did and what is right."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.engine_defaults import captures_graphs
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_runner import on_v1_runner
from vllm_autoheal.preflight import preflight
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy_gate import utilization_floor
from vllm_autoheal.report import render_plan
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

H100 = "NVIDIA-H100-80GB-HBM3"
NGRAM = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}']
NO_GRAPHS = ["--compilation-config", '{"cudagraph_mode": "NONE"}']


def fixed(model: str, gpu: str, engine: dict, version: str = "0.33.0", **spec):
    """Pre-flight Fix of `model` on `gpu` under the image of `version` (and the spec's other fields)."""
    service = VLLMServiceSpec(model="m", image=f"vllm/vllm-openai:v{version}", engine=engine, preflight="Fix", **spec)
    return preflight(service, lookup(gpu), config_shape(model))


def test_the_floor_counts_the_graphs_the_release_reserves():
    """Severity: high.
    Input: Llama-3.1-8B, vllm/vllm-openai:v0.33.0, max_model_len 2048, an H100 (79.19 GiB); vLLM printed
    gpu_util_exceeds_free with 18.2 GiB free.
    ba3d1ef: remedy_gate.utilization_floor sums weights + activation + non-torch + a 2048-token
    cache (0.21) but not the 0.99 GiB of graphs 0.33 takes off the cache; fit_utilization_to_free cuts to
    0.21 (not vetoed: sized from vLLM's free figure) and the heal's own `expected` says "KV cache 0.00 GiB
    ... still fails: no memory left for the KV cache" (16.63 requested - 15.00 - 0.87 - 0.22 - 0.99 < 0):
    a certain second crash.
    What should happen: the floor counts the reserved graphs (0.22 here), so no cut lands on a utilization
    the memory model says leaves no cache (it gives up where no cut fits)."""
    shape, release = config_shape("llama-3.1-8b"), parse_version("0.33.0")
    spec = VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.33.0", engine={"maxModelLen": 2048})
    d = Diagnosis(
        cause=Cause.GPU_UTIL_EXCEEDS_FREE,
        numbers={"free_gib": 18.2, "total_gib": 79.19, "util": 0.9, "requested_gib": 71.27},
    )
    inv = Inventory(gpu_total_gib=79.19, gpu_name=H100, shape=shape, release=release)
    remedy = plan_heal(spec, d, inventory=inv)
    assert "still fails" not in remedy.expected, (remedy.action, remedy.changes, remedy.expected)
    floor = utilization_floor(spec.heal.bounds, EngineArgs(), shape, 79.19, "server", H100, release)
    at_floor = estimate(
        shape, EngineArgs(gpu_memory_utilization=floor, max_model_len=2048), lookup(H100), release=release
    )
    assert at_floor.fits, at_floor.reasons


def test_no_graphs_by_compilation_config_reserves_nothing():
    """Severity: medium.
    Input: Llama-3.1-8B on an L4 (22.05 GiB), vllm/vllm-openai:v0.33.0, max_model_len 32768, utilization
    0.9 (default), extraArgs --compilation-config '{"cudagraph_mode": "NONE"}' (or -O0), preflight Fix.
    ba3d1ef: the estimate still counts 0.99 GiB of graphs and, new in ba3d1ef, takes them off the
    cache under 0.33: 3.40 GiB, 27,824 tokens < 32,768, kv_cache_insufficient; Fix raises utilization
    0.9 -> 0.94. vLLM's gpu_worker calls profile_cudagraph_memory only when cudagraph_mode != NONE (0.33
    line 709; the V2 runner's cudagraph_utils.profile_cudagraph_memory returns 0 for NONE too), so its
    cache is the eager one: 4.39 GiB, 35,936 tokens, the start fits. Before ba3d1ef the estimate said fits.
    What should happen: no graphs where the extra args turn them off (as --enforce-eager), the start fits
    and Fix changes nothing (not a raise the numbers do not call for)."""
    shape, gpu, release = config_shape("llama-3.1-8b"), lookup("NVIDIA-L4"), parse_version("0.33.0")
    est = estimate(shape, EngineArgs(max_model_len=32768, extra_args=NO_GRAPHS), gpu, release=release)
    assert est.fits, est.reasons
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.33.0",
        engine={"maxModelLen": 32768, "extraArgs": NO_GRAPHS},
        preflight="Fix",
    )
    assert preflight(spec, gpu, shape).steps == []


def test_a_draft_keeps_the_v1_runner_before_any_draft_could_move_it():
    """Severity: medium.
    Input: Llama-3.1-8B on an H100, vllm/vllm-openai:v0.21.0, utilization 0.99, an ngram
    --speculative-config, preflight Fix.
    ba3d1ef: memory.on_v1_runner returns False for any --speculative-config, so graphs_reserved is
    False and the estimate predicts cudagraph_capture_oom (0.99 GiB beyond the 78.40 requested, 78.68
    free); Fix cuts utilization 0.99 -> 0.95 ("ran out of the 0.79 GiB left outside the budget"). Without
    the draft the same flags fit at 0.99. In 0.20/0.21 config/vllm.py picks the V2 runner only from
    VLLM_USE_V2_MODEL_RUNNER (default "0"), and no draft forces V2 before 0.25 (dspark; dflash from
    0.26): the model is on the V1 runner for certain, which reserves the graphs inside the budget.
    What should happen: a draft makes the runner uncertain only in releases where a draft can move it
    (0.25 on); here the start fits and Fix changes nothing."""
    result = fixed("llama-3.1-8b", H100, {"gpuMemoryUtilization": 0.99, "extraArgs": NGRAM}, "0.21.0")
    assert result.engine.gpu_memory_utilization == 0.99, [(s.action, s.changes) for s in result.steps]


def test_without_the_shape_every_model_is_on_v1_in_0_21():
    """Severity: low.
    Input: no model config (a gated model without a token), vllm/vllm-openai:v0.21.0, an H100 of 79.19 GiB,
    vLLM printed gpu_util_exceeds_free with 40 GiB free.
    ba3d1ef: graphs_reserved(None, ...) is True only where every runner reserves ("all", 0.29 on),
    but in 0.20-0.21 every model runs the V1 runner (V2 only by VLLM_USE_V2_MODEL_RUNNER, which names no
    release), so the graphs are reserved whatever the shape. fit_utilization_to_free keeps 0.99 GiB beside
    the budget for them: 0.47, where 0.33's identical reservation gives 0.48 (the double count the change
    set out to remove).
    What should happen: 0.48, as under 0.33."""
    d = Diagnosis(
        cause=Cause.GPU_UTIL_EXCEEDS_FREE,
        numbers={"free_gib": 40.0, "total_gib": 79.19, "util": 0.9, "requested_gib": 71.27},
    )
    got = {}
    for version in ("0.21.0", "0.33.0"):
        spec = VLLMServiceSpec(model="m", image=f"vllm/vllm-openai:v{version}")
        inv = Inventory(gpu_total_gib=79.19, gpu_name=H100, release=parse_version(version))
        got[version] = plan_heal(spec, d, inventory=inv).changes.get("gpu_memory_utilization")
    assert got["0.33.0"] == 0.48
    assert got["0.21.0"] == got["0.33.0"], got


def test_room_for_graphs_does_not_count_reserved_graphs_beside_the_budget():
    """Severity: low (unsure what the ideal cut is; the double count is certain).
    Input: Llama-3.1-8B, max_model_len 8192, utilization 0.95 on an H100 (79.19 GiB), vllm/vllm-openai:v0.33.0;
    a cudagraph_capture_oom whose failed allocation was 4.0 GiB.
    ba3d1ef: steps.room_for_graphs sizes the room beside the budget as CUDAGRAPH_GIB + tried + 0.5
    = 5.49 GiB and cuts 0.95 -> 0.93, saying it "leaves 5.54 GiB for the graphs (about 0.99 GiB)" - the
    same as under 0.25. Under 0.33 vLLM already took its graph estimate off the cache and captures inside
    the budget; only the overrun (the 4.0 GiB that failed) lands beside it.
    What should happen: room for tried + 0.5 = 4.5 GiB beside the budget: 0.94 (4.75 GiB) keeps the graphs
    and a point more of cache."""
    shape = config_shape("llama-3.1-8b")
    spec = VLLMServiceSpec(
        model="m", image="vllm/vllm-openai:v0.33.0", engine={"maxModelLen": 8192, "gpuMemoryUtilization": 0.95}
    )
    d = Diagnosis(cause=Cause.CUDAGRAPH_CAPTURE_OOM, numbers={"tried_gib": 4.0})
    inv = Inventory(gpu_total_gib=79.19, gpu_name=H100, shape=shape, release=parse_version("0.33.0"))
    remedy = plan_heal(spec, d, inventory=inv)
    assert remedy.changes == {"gpu_memory_utilization": 0.94}, (remedy.changes, remedy.reason)


def test_the_estimate_flag_at_its_default_keeps_the_release():
    """Severity: low.
    Input: the README's example, Qwen2.5-7B on a 24 GB RTX 4090, utilization 0.95, max_model_len 32768,
    vllm/vllm-openai:v0.33.0, preflight Fix, with spec.env VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1
    (vLLM's own default from 0.20).
    ba3d1ef: any RELEASE_ENV variable makes spec.release() None, whatever its value; with no release
    the graphs are counted beside the budget and Fix cuts 0.95 -> 0.93 - the cut ba3d1ef says it stops
    making under 0.33. (The same holds for `vllm/vllm-openai:latest` or a digest, which today run >= 0.33:
    a policy choice, but the commit message's claim does not hold for them.)
    What should happen: "1" is the release's default, so the release stands and Fix changes nothing, as
    without the variable. (Only "0" changes where the graphs go.)"""
    assert (
        fixed(
            "qwen2.5-7b",
            "NVIDIA-GeForce-RTX-4090",
            {"gpuMemoryUtilization": 0.95, "maxModelLen": 32768},
            env=[{"name": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "value": "1"}],
        ).engine.gpu_memory_utilization
        == 0.95
    )


def test_kv_cache_memory_bytes_puts_the_graphs_beside_the_budget_in_the_report():
    """Severity: low.
    Input: Llama-3.1-8B on an H100, vllm/vllm-openai:v0.33.0, max_model_len 8192,
    kv_cache_memory_bytes 20 GiB.
    ba3d1ef: Estimate.graphs_in_budget is True (graphs_reserved ignores kv_cache_memory_bytes) and
    `plan` prints "CUDA graphs 0.99 GiB (inside the budget)", though gpu_worker.determine_available_memory
    returns kv_cache_memory_bytes before any graph estimate (0.20-0.34) and the estimate itself counts
    them beside (its capture check uses `outside = graphs` there).
    What should happen: graphs_in_budget False, "(outside the budget)"."""
    shape, gpu = config_shape("llama-3.1-8b"), lookup(H100)
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.33.0",
        engine={"maxModelLen": 8192, "kvCacheMemoryBytes": 20 * 2**30},
    )
    first = preflight(spec, gpu, shape)
    assert not first.estimate.graphs_in_budget
    assert "(outside the budget)" in render_plan(shape, gpu, first, first)


@pytest.mark.parametrize(
    ("args", "captures"),
    [
        ([], True),
        (["--compilation-config", '{"cudagraph_mode": "NONE"}'], False),
        (['--compilation-config={"cudagraph_mode": "none"}'], False),
        (["-O", '{"cudagraph_mode": "NONE"}'], False),
        (["-O.cudagraph_mode=NONE"], False),
        (["--compilation-config.cudagraph_mode", "NONE"], False),
        (["--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'], True),
        (["--compilation-config", "not json"], True),
        (["-O3"], True),
    ],
)
def test_graphs_are_captured_unless_the_flags_turn_them_off(args, captures):
    assert captures_graphs(False, args) is captures
    assert captures_graphs(True, args) is False


@pytest.mark.parametrize(
    ("image", "value", "kept"),
    [
        ("vllm/vllm-openai:v0.33.0", "1", True),  # vLLM's own default from 0.20
        ("vllm/vllm-openai:v0.33.0", "0", False),  # the graphs go beside the budget: not the release's figures
        ("vllm/vllm-openai:v0.33.0", None, False),  # from a Secret or ConfigMap: not known
        ("vllm/vllm-openai:v0.19.0", "1", False),  # turns on what 0.19 had off
    ],
)
def test_the_graph_estimate_at_the_releases_default_keeps_its_figures(image, value, kept):
    env = {"name": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"}
    env |= {"value": value} if value is not None else {"valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    spec = VLLMServiceSpec(model="m", image=image, env=[env])
    assert (spec.release() is not None) is kept


# --- a second review (of ed0d609): flag spellings, vLLM's parser, drafts, the bound, eager


def test_a_free_memory_cut_from_above_the_bound_is_clamped_to_it():
    """Severity: medium (a regression: pre-flight Fix gave up where the parent commit fixed the spec).
    Input: Qwen2.5-7B on an L40S (44.39 GiB), vllm/vllm-openai:v0.33.0, gpuMemoryUtilization 0.99,
    maxModelLen 32768, preflight Fix, the default bounds (maxGpuMemoryUtilization 0.95).
    What happened: the estimate says gpu_util_exceeds_free (43.95 GiB asked, 43.88 free).
    steps.fit_utilization_to_free no longer keeps 0.99 GiB of graphs in its margin under a reserving
    release, so it sizes (44.39 - 0.5 - 0.44) / 44.39 = 0.97, which the gate refuses ("0.97 is above its
    bound 0.95"); SetKvCacheMemoryBytes is vetoed too, and Fix gives up: fits False, no step. Before
    ba3d1ef (and under 0.25 still) the same step sized 0.95, which fits (KV 26.44 GiB at 0.95 under 0.33).
    The heal of a real crash goes the same way: with vLLM's printed 43.88 GiB free the cut is 0.96,
    refused, and the heal falls to SetKvCacheMemoryBytes 28 GiB (a fixed cache, 0.15 GiB of margin by the
    model), where 0.25 cuts to 0.94. Every GPU of 48 GiB or less at utilization 0.98-0.99 under the
    default image hits this (room_for_graphs already clamps with min(..., max_gpu_memory_utilization)).
    What should happen: a cut from above the bound lands on the bound at most (0.95 here), and Fix
    returns flags that fit."""
    result = fixed("qwen2.5-7b", "NVIDIA-L40S", {"gpuMemoryUtilization": 0.99, "maxModelLen": 32768})
    assert result.fits, result.reasons
    assert result.engine.gpu_memory_utilization <= 0.95


@pytest.mark.parametrize("args", [["-O0"], ["--optimization-level", "0"], ["--optimization-level=0"]])
def test_optimization_level_zero_captures_no_graphs(args):
    """Severity: medium.
    Input: Llama-3.1-8B on an L4 (22.05 GiB), vllm/vllm-openai:v0.33.0, max_model_len 32768, utilization
    0.9, extraArgs -O0 (or --optimization-level 0), preflight Fix.
    What happened: engine_defaults.captures_graphs reads only --compilation-config and its dotted
    spelling, so the estimate takes 0.99 GiB of graphs off the cache: 3.40 GiB, 27,824 tokens < 32,768,
    kv_cache_insufficient, and Fix raises utilization 0.9 -> 0.94. In vLLM 0.20-0.34 --optimization-level
    0 (config/vllm.py OPTIMIZATION_LEVEL_00: "cudagraph_mode": CUDAGraphMode.NONE, applied where the user
    set none) captures no graphs, and the worker skips its estimate (gpu_worker: only when cudagraph_mode
    != NONE): the cache is 4.39 GiB, 35,936 tokens, the start fits. (-O0 becomes --optimization-level 0 in
    FlexibleArgumentParser: read in vLLM's main branch, not in the release sources here; the long
    spelling is certain.) The first review's docstring named -O0 but its test never tried it.
    What should happen: no graphs at optimization level 0 (where cudagraph_mode is not set explicitly),
    the start fits, Fix changes nothing."""
    assert captures_graphs(False, args) is False
    shape, gpu, release = config_shape("llama-3.1-8b"), lookup("NVIDIA-L4"), parse_version("0.33.0")
    est = estimate(shape, EngineArgs(max_model_len=32768, extra_args=args), gpu, release=release)
    assert est.fits, est.reasons


@pytest.mark.parametrize(
    "args",
    [
        ["-cc", '{"cudagraph_mode": "NONE"}'],
        ["-cc.cudagraph_mode=none"],
        ["-cc.cudagraph_mode", "NONE"],
        ["--compilation_config.cudagraph_mode=NONE"],
        ["--compilation-config", '{"cudagraph_mode": 0}'],
    ],
)
def test_other_spellings_of_cudagraph_mode_none_capture_no_graphs(args):
    """Severity: medium (-cc.cudagraph_mode=none is the spelling vLLM's own log tells users to write).
    Input: Llama-3.1-8B on an L4, vllm/vllm-openai:v0.33.0, max_model_len 32768, utilization 0.9, with
    the compilation config's cudagraph_mode NONE in any of: -cc '{"cudagraph_mode": "NONE"}' (-cc is
    --compilation-config's alias in engine/arg_utils.py from 0.20 on), -cc.cudagraph_mode=none (config/
    vllm.py's enforce-eager warning: "equivalent to setting -cc.mode=none -cc.cudagraph_mode=none"),
    --compilation_config.cudagraph_mode=NONE (vLLM turns underscores before the first dot into dashes),
    '{"cudagraph_mode": 0}' (CUDAGraphMode.NONE = 0; pydantic takes an enum's value).
    What happened: captures_graphs returns True for each (it compares raw token names with two spellings
    and only a str mode), so the estimate says kv_cache_insufficient (3.40 GiB, 27,824 tokens) and Fix
    raises 0.9 -> 0.94: the raise the first review's fix removed for --compilation-config.
    What should happen: no graphs, the start fits (4.39 GiB, 35,936 tokens)."""
    assert captures_graphs(False, args) is False
    shape, gpu, release = config_shape("llama-3.1-8b"), lookup("NVIDIA-L4"), parse_version("0.33.0")
    est = estimate(shape, EngineArgs(max_model_len=32768, extra_args=args), gpu, release=release)
    assert est.fits, est.reasons


def test_a_later_compilation_config_replaces_the_one_that_turned_graphs_off():
    """Severity: low (unsure: the merging is read in vLLM's main-branch argparse_utils, not in 0.33's).
    Input: extraArgs --compilation-config '{"cudagraph_mode": "NONE"}' --compilation-config.mode=3.
    What happened: captures_graphs reads the JSON value and then only dotted cudagraph_mode tokens, so it
    says no graphs. vLLM's FlexibleArgumentParser collects the dotted keys into one JSON value appended
    at the end of the command line, and argparse keeps the last --compilation-config (parse_dataclass
    builds a whole CompilationConfig, no merge): the config is {"mode": 3}, cudagraph_mode unset, and
    optimization level 2 sets FULL_AND_PIECEWISE: graphs are captured and, under 0.33, reserved. The
    estimate's cache is then 0.99 GiB larger than vLLM's, and a start it says fits may be refused.
    What should happen: the last --compilation-config (the dotted ones counted last) decides: graphs."""
    args = ["--compilation-config", '{"cudagraph_mode": "NONE"}', "--compilation-config.mode=3"]
    assert captures_graphs(False, args) is True


def test_an_ngram_draft_puts_a_v2_listed_model_on_the_v1_runner():
    """Severity: medium.
    Input: Llama-3.1-8B on an H100 (79.19 GiB), vllm/vllm-openai:v0.23.0, utilization 0.99, an ngram
    --speculative-config, preflight Fix.
    What happened: 0.23 lists LlamaForCausalLM among its default V2 architectures, so runs_v1 says V2 and
    graphs_reserved is False (the V2 runner's estimate is 0 before 0.29): the estimate predicts
    cudagraph_capture_oom (0.99 GiB beyond the 78.40 GiB asked, 78.68 free) and Fix cuts 0.99 -> 0.95.
    But 0.22-0.28's _get_v2_model_runner_unsupported_features lists "ngram/ngram_gpu speculative
    decoding", and use_v2_model_runner then returns False ("using the V1 model runner instead"): the
    model runs on the V1 runner, which reserves the graphs inside the budget (0.23 gpu_worker subtracts
    profile_cudagraph_memory), so 0.99 fits and the cut costs 3.2 GiB of cache. runs_v1's docstring
    says such fallbacks leave the sampler's floor standing; for the graphs they do not (the uncertain
    case is counted beside, the optimistic side for the cache). The same holds in 0.24, and in 0.25-0.28
    (where any draft is counted uncertain, though ngram is V1 for certain), and for -sc / --spec-method,
    which on_v1_runner does not read as a speculative config at all.
    What should happen: an ngram draft in 0.22-0.28 puts the model on the V1 runner; the start fits and
    Fix changes nothing."""
    result = fixed("llama-3.1-8b", H100, {"gpuMemoryUtilization": 0.99, "extraArgs": NGRAM}, "0.23.0")
    assert result.estimate.graphs_in_budget
    assert result.engine.gpu_memory_utilization == 0.99, [(s.action, s.changes) for s in result.steps]


def test_a_kv_shortage_the_reserved_graphs_make_is_healed_by_enforce_eager():
    """Severity: medium (a regression against the parent commit's outcome).
    Input: Mistral-7B-v0.1 on a V100 16 GB (15.77 GiB), vllm/vllm-openai:v0.33.0, utilization 0.95 (the
    bound), max_model_len 4096, preflight Fix.
    What happened: under 0.33 the 0.99 GiB of graphs come off the cache: weights 13.53 + activation 0.24
    + non-torch 0.22 + graphs 0.99 leave 0.00 GiB, kv_cache_insufficient. The KV plan (raise, shorter
    context, blind raise, fp8, TP) has no EnforceEager, and the gate's kv_cache_insufficient row does
    not allow enforce_eager: Fix gives up, saying "The weights take 13.5 GiB per GPU ... no flag on 1
    GPU(s) makes them fit". The estimate itself says --enforce-eager fits (0.99 GiB, 8,112 tokens >=
    4,096): vLLM's worker skips the graph estimate under eager. Under 0.25 (graphs beside) Fix sets
    EnforceEager and fits; so did the parent commit for 0.33.
    What should happen: where the release reserves the graphs and the cache is short by no more than
    them, EnforceEager is a KV heal (and the give-up text does not claim no flag fits)."""
    result = fixed("mistral-7b-v0.1", "V100-SXM2-16GB", {"gpuMemoryUtilization": 0.95, "maxModelLen": 4096})
    assert result.fits, result.reasons


@pytest.mark.parametrize("value", ["01", "2", "+1"])
def test_the_graph_estimate_flag_on_in_any_spelling_keeps_the_release(value):
    """Severity: low.
    Input: the README's example (Qwen2.5-7B on a 24 GB RTX 4090, utilization 0.95, max_model_len 32768,
    vllm/vllm-openai:v0.33.0, preflight Fix) with spec.env VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS "01"
    (or "2", "+1").
    What happened: env_keeps_release keeps the release only for the text "1" (after strip), so the
    release is dropped, the graphs are counted beside the budget and Fix cuts 0.95 -> 0.93: the first
    review's finding 6 again. vLLM reads the variable as bool(int(value)) (envs.py, 0.20-0.34): each of
    these is on, its default.
    What should happen: any value vLLM reads as on keeps the release; Fix changes nothing."""
    shape, gpu = config_shape("qwen2.5-7b"), lookup("NVIDIA-GeForce-RTX-4090")
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.33.0",
        env=[{"name": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "value": value}],
        engine={"gpuMemoryUtilization": 0.95, "maxModelLen": 32768},
        preflight="Fix",
    )
    assert spec.release() is not None
    assert preflight(spec, gpu, shape).engine.gpu_memory_utilization == 0.95


def test_a_deeply_nested_compilation_config_does_not_raise():
    """Severity: low (the CRD's 512-character items keep the operator out of reach; plan --engine-args
    and serve take any length).
    Input: extraArgs --compilation-config with 10,000 nested JSON lists.
    What happened: captures_graphs catches ValueError only; json.loads raises RecursionError, which
    escapes through memory.estimate, preflight and plan_heal (the codebase catches RecursionError beside
    ValueError elsewhere: diagnosis/container_log.py, log_records.py, serve_history.py).
    What should happen: an unreadable value is no config (graphs captured, as for "not json")."""
    deep = "[" * 10000 + "]" * 10000
    assert captures_graphs(False, ["--compilation-config", deep]) is True


# --- a third review (of 8e9f687): vLLM's figures over the model's, 0.30's n-gram runner, vLLM's parser


def _eager_heal_of(log: str, available: float):
    """Llama-3.1-8B on an H100 at 0.95 under 0.33, a KV refusal of 16.0 GiB needed and `available`: the
    heal's EnforceEager, or None where it picks anything else."""
    d = classify(Signals(log=log, exit_code=1))
    assert (d.cause, d.numbers["needed_gib"], d.numbers["available_gib"]) == ("kv_cache_insufficient", 16.0, available)
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
    return remedy if remedy.action == "EnforceEager" else None


E = "(EngineCore pid=77) "
ERR = E + "ERROR 12-04 10:01:10 [core.py:1100] "


def test_enforce_eager_is_not_offered_for_a_shortfall_six_times_the_graphs():
    """Severity: high (a certain second crash, with decode speed lost, and a reason that says it fits).
    Input: Llama-3.1-8B on an H100 (79.19 GiB), vllm/vllm-openai:v0.33.0, gpuMemoryUtilization 0.95 (the
    bound), allowedActions [RaiseGpuMemoryUtilization, EnforceEager, LowerGpuMemoryUtilization] (a policy that
    never cuts context or the KV dtype); vLLM 0.33 printed 'Available KV cache memory: 10.0 GiB' and refused:
    16.0 GiB needed for 131072 tokens, 10.0 available, estimated maximum 81904.
    8e9f687: the raise steps are at the bound, so kv_steps.eager_for_reserved_graphs answers:
    EnforceEager, 'without graphs that share goes to the cache, which then holds one request of max_model_len'.
    It asks only the memory model (which says 59 GiB of cache), never vLLM's own figures for this run: eager
    gives back the graph estimate, about 0.99 GiB, and vLLM is 6 GiB short. verdict._sized_by_vllm's rule
    ('vLLM's own figures for this very run outrank the memory model's estimate') is not applied here.
    What should happen: no EnforceEager where vLLM's printed shortfall (needed - available) exceeds the
    graphs' share; here a give-up."""
    log = "\n".join(
        (
            E + "INFO 12-04 10:00:05 [core.py:121] Initializing a V1 LLM engine (v0.33.0) with config: "
            "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072",
            E + "INFO 12-04 10:00:40 [model_runner.py:428] Model loading took 14.99 GiB memory and 30.1 seconds",
            E + "INFO 12-04 10:00:52 [gpu_worker.py:795] Available KV cache memory: 10.0 GiB",
            ERR + "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
            "cache is needed, which is larger than the available KV cache memory (10.0 GiB). Based on the "
            "available memory, the estimated maximum model length is 81904. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
        )
    )
    assert _eager_heal_of(log, available=10.0) is None


def test_an_ngram_draft_does_not_force_the_v1_runner_in_0_33():
    """Severity: medium (pre-flight changes a spec that fits; every n-gram user of the default image).
    Input: Llama-3.1-8B on an L4 (22.05 GiB), vllm/vllm-openai:v0.33.0 (the default image), maxModelLen 26624,
    utilization 0.9, extraArgs --speculative-config '{"method": "ngram", ...}', preflight Fix.
    8e9f687: memory.on_v1_runner returns True for ngram in 0.22 <= release < 0.34, its docstring citing
    _get_v2_model_runner_unsupported_features 'to 0.33'. In 0.33 that function (config/vllm.py) lists only
    'suffix'/'custom_class' methods, P-EAGLE parallel drafting and heterogeneous vocabularies; the V2 runner
    has an n-gram speculator (v1/worker/gpu/spec_decode/ngram/speculator.py), so use_v2_model_runner is True
    and the model runs on V2 as it does without the draft. The estimate counts the V1 runner's Triton sampler
    (14 bytes a logit, 0.47 GiB activation instead of 0.24; 0.93 GiB on an H100) and Fix raises 0.9 -> 0.92
    for a start that fits without the draft (27,824 tokens >= 26,624 on V2). (Unsure when ngram left the
    list: only 0.33's and 0.34's sources were read; 0.22-0.28 may be right.)
    What should happen: in 0.33 an n-gram draft leaves the runner as the release's default (V2); Fix changes
    nothing."""
    shape, release = config_shape("llama-3.1-8b"), parse_version("0.33.0")
    assert on_v1_runner(shape, release, NGRAM) is False
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.33.0",
        engine={"maxModelLen": 26624, "extraArgs": NGRAM},
        preflight="Fix",
    )
    result = preflight(spec, lookup("NVIDIA-L4"), shape)
    assert result.engine.gpu_memory_utilization == 0.9, [(s.action, s.changes) for s in result.steps]


def test_dotted_keys_under_two_spellings_are_two_values_the_last_wins():
    """Severity: low.
    Input: extraArgs -cc.cudagraph_mode=NONE --compilation-config.mode=3.
    8e9f687: config_flag gathers every dotted key of any spelling into one dict: {cudagraph_mode:
    NONE, mode: 3}, no graphs. vLLM 0.33's FlexibleArgumentParser.parse_args keys dict_args by the flag as
    written ('-cc' and '--compilation-config' are two keys: `key, *keys = processed_arg.split(".")`) and
    appends each as its own whole value, in first-seen order; argparse keeps the last for the shared dest:
    the config is {"mode": 3}, cudagraph_mode unset, optimization level 2 sets FULL_AND_PIECEWISE: graphs,
    reserved under 0.33 (the estimate's cache 0.99 GiB larger than vLLM's).
    What should happen: graphs captured."""
    assert captures_graphs(False, ["-cc.cudagraph_mode=NONE", "--compilation-config.mode=3"]) is True


def test_piecewise_graphs_without_compilation_are_no_graphs():
    """Severity: low.
    Input: extraArgs -cc '{"mode": 0, "cudagraph_mode": "PIECEWISE"}' (or -O1 -cc.mode=0: level 1's default
    mode is PIECEWISE).
    8e9f687: captures_graphs sees a mode other than NONE/0 (or none at a level other than 0): graphs.
    vLLM 0.33's VllmConfig.__post_init__ always calls _normalize_piecewise_cudagraph_mode: a mode that
    requires piecewise compilation with compilation mode != VLLM_COMPILE (and no breakable cudagraphs, off by
    default) becomes mode.without_piecewise(), which for PIECEWISE is NONE (capture sizes emptied); the
    worker then skips its graph estimate. The estimate takes 0.99 GiB off a cache vLLM does not shrink.
    What should happen: no graphs for both spellings."""
    assert captures_graphs(False, ["-cc", '{"mode": 0, "cudagraph_mode": "PIECEWISE"}']) is False
    assert captures_graphs(False, ["-O1", "-cc.mode=0"]) is False


# --- a fourth review (of 79335e7): vLLM's printed graph share, a second run's milestones, an empty budget


def test_enforce_eager_is_not_offered_where_vllms_own_graph_estimate_is_smaller_than_the_shortfall():
    """Severity: high (a certain second crash, decode speed lost, and an `expected` that says it fits).
    Input: Llama-3.1-8B on an H100 (79.19 GiB), vllm/vllm-openai:v0.33.0, gpuMemoryUtilization 0.95 (the
    bound), allowedActions [RaiseGpuMemoryUtilization, EnforceEager, LowerGpuMemoryUtilization]. vLLM 0.33's
    gpu_worker.determine_available_memory printed its own graph estimate for this run, as it does whenever
    it takes one ('The current --gpu-memory-utilization=0.9500 is equivalent to
    --gpu-memory-utilization=0.9469 without CUDA graph memory profiling': cg_util_delta = estimate / total,
    so the estimate is 0.0031 x 79.19 = 0.25 GiB), then refused: 16.0 GiB needed, 15.5 GiB available.
    79335e7: kv_steps.eager_for_reserved_graphs compares the 0.5 GiB shortfall with the constant
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
    assert _eager_heal_of(log, available=15.5) is None


def _run(minute: int) -> list[str]:
    return [
        E + f"INFO 12-04 10:{minute:02d}:05 [core.py:121] Initializing a V1 LLM engine (v0.34.0) with config: "
        "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072",
        E + f"INFO 12-04 10:{minute:02d}:40 [model_runner.py:428] Model loading took 14.99 GiB memory and 30.1 seconds",
        E + f"INFO 12-04 10:{minute:02d}:52 [gpu_worker.py:795] Available KV cache memory: 55.10 GiB",
    ]


def test_a_second_run_in_the_same_log_is_placed_by_its_own_milestones():
    """Severity: low-medium (a wrong cause, so a wrong heal, where a log holds a restart and the failure
    line comes without frames, as the extensible-cache tests' own bare case does).
    Input: one log, two vLLM 0.34 runs. Run 1 reached 'Memory after warmup: ...; 5120 KV cache blocks
    (10.00 GiB) fit' (and died committing its blocks; that line is left out here). Run 2 starts
    again (Initializing ..., Model loading took 14.99 GiB, Available KV cache memory: 55.10 GiB: the address
    space, before warm-up and capture) and dies with a bare 'torch.OutOfMemoryError: CUDA out of memory.
    Tried to allocate 1.50 GiB'.
    79335e7: phase.py returns kv-allocation as soon as ANY 'Memory after warmup' milestone precedes the
    failure, the first run's included: gpu_util_exceeds_free / kv-allocation (a utilization cut for 'memory
    that vanished'). Run 2 alone reads cudagraph_capture_oom / graph-capture.
    What should happen: the rule looks at the run that failed (the SIZED_AFTER_CAPTURE milestone only when it
    is the last start-up milestone, or after the last 'Initializing' line): the same phase as run 2 alone."""
    run1 = _run(0) + [
        E + "INFO 12-04 10:01:10 [extensible_kv_cache.py:693] Memory after warmup: 12.60 GiB free, 1.00 GiB "
        "committed to the KV cache, 1.72 GiB kept for transient activations (1.72 GiB allocated at peak, "
        "0.30 GiB of torch reservation growth); 5120 KV cache blocks (10.00 GiB) fit within the requested "
        "71.27 GiB. Torch may reserve up to 3.50 GiB.",
    ]  # (its own failure left out: which of two runs' failures decides is another rule's)
    run2 = _run(10) + [
        E + "ERROR 12-04 10:11:10 [core.py:1100] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "1.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.20 GiB is free.",
    ]
    alone = classify(Signals(log="\n".join(run2), exit_code=1))
    both = classify(Signals(log="\n".join(run1 + run2), exit_code=1))
    assert alone.phase == "graph-capture"
    assert (both.cause, both.phase) == (alone.cause, alone.phase), (both.cause, both.phase)


def test_preflight_fix_finds_the_raise_with_a_cut_context_for_qwen_32b_on_an_h100_under_0_33():
    """Severity: medium (pre-flight Fix leaves a spec it predicts will crash, and says no flags within the
    bounds fit, under the default image).
    Input: Qwen2.5-32B on an H100 (79.19 GiB then; 79.18 as measured since session 29), vllm/vllm-openai:v0.33.0, gpuMemoryUtilization 0.8, default
    bounds (max 0.95, minMaxModelLen 2048), preflight Fix. (0.29 and 0.34 the same.)
    79335e7: on 4436551 Fix raised 0.8 -> 0.95 with max_model_len 48,240 (fits). Since the graph
    reservation (ba3d1ef) the model puts the 0.99 GiB of graphs inside the budget: at 0.8 the cache is
    0.48 - 0.99 < 0, so predicted_diagnosis passes available_gib 0.0 with no estimated length;
    lower_max_model_len stops at 'no memory at all', _raise_with_estimate returns None on `not available`, and
    Fix gives up: 'no allowed change is left ... (tried: none)'. By the same model, 0.95 gives an 11.37 GiB
    cache holding 46,560 tokens (46,512 at 79.18 GiB). (The limitation predates this session: the parent gives up at 0.78 too; the
    reservation moved a 0.8 start onto it.)
    What should happen: Fix ends on flags its model says fit (0.95 and a context of at most 46,512)."""
    shape, gpu = config_shape("qwen2.5-32b"), lookup(H100)
    spec = VLLMServiceSpec(
        model="m", image="vllm/vllm-openai:v0.33.0", engine={"gpuMemoryUtilization": 0.8}, preflight="Fix"
    )
    at_top = estimate(
        shape,
        spec.engine.model_copy(update={"gpu_memory_utilization": 0.95, "max_model_len": 46512}),
        gpu,
        None,
        "server",
        spec.release(),
    )
    assert at_top.fits, at_top.reasons
    result = preflight(spec, gpu, shape)
    assert result.fits, result.reasons


def test_vllms_printed_graph_share_is_read_where_the_engine_logs_it():
    """Both lines vLLM prints where it reserves the graphs (gpu_model_runner and gpu_worker, 0.29's format),
    and not where a client's prompt quotes them."""
    lines = (
        E + "INFO 07-30 07:11:00 [gpu_model_runner.py:6737] Estimated CUDA graph memory: 0.58 GiB total",
        E + "INFO 07-30 07:11:00 [gpu_worker.py:575] CUDA graph memory profiling is enabled (default since v0.21.0). "
        "The current --gpu-memory-utilization=0.9500 is equivalent to --gpu-memory-utilization=0.9139 without CUDA "
        "graph memory profiling. To maintain the same effective KV cache size as before, increase "
        "--gpu-memory-utilization to 0.9861. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
        ERR + "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
    )
    d = classify(Signals(log="\n".join(lines)))
    assert (d.numbers["graphs_gib"], d.numbers["util_with_graphs"], d.numbers["util_without_graphs"]) == (
        0.58,
        0.95,
        0.9139,
    )
    quoted = (
        "(APIServer pid=1) INFO 07-30 07:12:00 [logger.py:41] Received request chatcmpl-1: prompt: "
        "'Estimated CUDA graph memory: 90.00 GiB total', params: SamplingParams(n=1)"
    )
    d = classify(Signals(log="\n".join((quoted, lines[2]))))
    assert "graphs_gib" not in d.numbers


def test_enforce_eager_is_not_offered_for_a_budget_the_graphs_share_leaves_empty():
    """vLLM 0.33 printed 'Available KV cache memory: -3.00 GiB' and no block: giving the graphs' 0.99 GiB
    back leaves the budget empty still, whatever the memory model says of the eager start (it had been
    offered, 'fits' by the model's 59 GiB: a certain second crash)."""
    log = "\n".join(
        (
            E + "INFO 12-04 10:00:05 [core.py:121] Initializing a V1 LLM engine (v0.33.0) with config: model='m'",
            E + "INFO 12-04 10:00:52 [gpu_worker.py:771] Available KV cache memory: -3.00 GiB",
            ERR + "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
        )
    )
    d = classify(Signals(log=log, exit_code=1))
    assert (d.subtype, d.numbers["available_kv_gib"]) == ("no_cache_blocks", -3.0)
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.33.0",
        engine={"gpuMemoryUtilization": 0.95, "maxModelLen": 8192},
        heal={"allowedActions": ["RaiseGpuMemoryUtilization", "EnforceEager"]},
    )
    inv = Inventory(
        gpu_total_gib=79.19, gpu_name=H100, shape=config_shape("llama-3.1-8b"), release=parse_version("0.33.0")
    )
    assert plan_heal(spec, d, inventory=inv).action != "EnforceEager"
