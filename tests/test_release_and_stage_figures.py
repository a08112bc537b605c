"""Where the figures a heal sizes from are not what they seem: a profile allocation beside tensors that
shrink with it, one pipeline stage's KV budget beside another's, a release whose engine the tag does not
say (vLLM 0.8-0.10 fell back to V0). Each asserts what vLLM's figures, or its source, say the planner or
the memory model must do; each failed before its fix."""

from __future__ import annotations

import pytest

from test_memory_windows import shape_of
from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate, kv_need
from vllm_autoheal.model_runner import release_sampler
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import logged_release, parse_image, parse_version

from samples import config_shape

ENGINE = "(EngineCore_DP0 pid=9) "


def spec(**engine) -> VLLMServiceSpec:
    return VLLMServiceSpec(model="m", engine=engine)


# --- 1. A profile OOM whose halving was judged short falls through to a utilization cut -----------

# vLLM's V1 dummy sampler OOM (0.25 prints no count of dummy requests): the process holds 78 GiB of
# which 15 GiB are weights, so ~61 GiB of the profile's own tensors, all sized by the batch/sequences.
SAMPLER_OOM_NEAR_FULL = (
    ENGINE
    + "INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 14.99 GiB and 2.1 seconds\n"
    + ENGINE
    + "ERROR 12-01 10:00:40 [core.py:1] Traceback (most recent call last):\n"
    + ENGINE
    + 'ERROR 12-01 10:00:40 [core.py:1]   File "/v/vllm/v1/worker/gpu_worker.py", line 300, in '
    "determine_available_memory\n"
    + ENGINE
    + "ERROR 12-01 10:00:40 [core.py:1]     self.model_runner.profile_run()\n"
    + ENGINE
    + 'ERROR 12-01 10:00:40 [core.py:1]   File "/v/vllm/v1/worker/gpu_model_runner.py", line 3000, in '
    "profile_run\n"
    + ENGINE
    + "ERROR 12-01 10:00:40 [core.py:1]     output = self._dummy_sampler_run(last_hidden_states)\n"
    + ENGINE
    + "ERROR 12-01 10:00:40 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
    "2.32 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.10 GiB is free. Including non-PyTorch memory, "
    "this process has 78.07 GiB memory in use. Of the allocated memory 76.5 GiB is allocated by PyTorch, and "
    "0.5 GiB is reserved by PyTorch but unallocated.\n"
)


def test_a_profile_oom_near_a_full_gpu_is_not_answered_by_a_utilization_cut():
    """High. 2.32 GiB asked with 1.10 GiB free, the process holding 78 GiB (15 of them weights): a halving
    was called short by what was free, and the plan fell to utilization 0.9 -> 0.86, which bounds
    nothing in the profile. The profile's other tensors shrink with the counts: the sequences are cut."""
    d = classify(Signals(log=SAMPLER_OOM_NEAR_FULL, ready_before=False))
    assert d.cause == "profiling_oom" and d.numbers["tried_gib"] == 2.32 and d.numbers["gpu_free_gib"] == 1.1
    inv = Inventory(gpu_total_gib=79.19, gpu_name="NVIDIA-H100-80GB-HBM3")
    r = plan_heal(spec(), d, inventory=inv)
    assert r.action == "LowerMaxNumSeqs" and r.changes["max_num_seqs"] < 1024, r.summary()


# --- 2. A pipeline stage's KV budget read off the other stage's line ---------------------------------


def _pp_no_block_log(first: float, second: float) -> str:
    """Two pipeline stages print their KV budget (in either order), then vLLM's no-block refusal."""
    return (
        ENGINE
        + "(Worker_PP0 pid=11) INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 7.5 GiB and 2 s\n"
        + ENGINE
        + f"(Worker_PP1 pid=12) INFO 12-01 10:00:30 [gpu_worker.py:1] Available KV cache memory: {first} GiB\n"
        + ENGINE
        + f"(Worker_PP0 pid=11) INFO 12-01 10:00:30 [gpu_worker.py:1] Available KV cache memory: {second} GiB\n"
        + ENGINE
        + "ERROR 12-01 10:00:40 [core.py:1] ValueError: No available memory for the cache blocks. Try "
        "increasing `gpu_memory_utilization` when initializing the engine.\n"
    )


def test_a_stage_budget_is_the_smallest_stages_whatever_the_order():
    """High. PP 2: one stage printed -0.2 GiB, the other 10.5, then the no-block refusal. The last line's
    figure was taken: in one order the context was sized from the stage with room. Now the smallest."""
    inv = Inventory(gpu_total_gib=22.06, gpu_name="NVIDIA-A10G", shape=shape_of("llama-3.1-8b"))
    plans = []
    for first, second in ((10.5, -0.2), (-0.2, 10.5)):
        log = _pp_no_block_log(first, second)
        d = classify(
            Signals(log=log, ready_before=False, tensor_parallel_size=1, pipeline_parallel_size=2, gpu_count=2)
        )
        assert d.subtype == "kv_check_fails_on_smallest_stage"
        plans.append(plan_heal(spec(pipelineParallelSize=2, maxModelLen=131072), d, inventory=inv))
    assert plans[0].changes == plans[1].changes, [p.summary() for p in plans]


# --- 3. vLLM 0.8.0-0.8.3's 1024 sequences on a GPU that runs vLLM's V0 engine ------------------------

V0_PROFILE_OOM_T4 = (
    "INFO 04-10 10:00:01 [model_runner.py:1] Model loading took 4.9 GiB and 2.1 seconds\n"
    "ERROR 04-10 10:00:40 [engine.py:1] Traceback (most recent call last):\n"
    'ERROR 04-10 10:00:40 [engine.py:1]   File "/v/vllm/worker/worker.py", line 229, in '
    "determine_num_available_blocks\n"
    "ERROR 04-10 10:00:40 [engine.py:1]     self.model_runner.profile_run()\n"
    "ERROR 04-10 10:00:40 [engine.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 600.00 MiB. "
    "GPU 0 has a total capacity of 14.75 GiB of which 420.00 MiB is free. Including non-PyTorch memory, this "
    "process has 14.32 GiB memory in use.\n"
)


def test_a_v0_fallback_gpu_never_gets_more_sequences_than_ran():
    """High. v0.8.3 on a T4 runs vLLM's V0 engine (256 sequences), where the table gave V1's 1024: a
    'lower' max_num_seqs of 512. Releases before 0.11 are not described: which engine ran is unknown."""
    d = classify(Signals(log=V0_PROFILE_OOM_T4, ready_before=False))
    assert d.cause == "profiling_oom"
    release = parse_image("vllm/vllm-openai:v0.8.3")
    inv = Inventory(gpu_total_gib=14.75, gpu_name="Tesla-T4", release=release)
    r = plan_heal(spec(), d, inventory=inv)
    assert r.action == "LowerMaxNumSeqs" and r.changes["max_num_seqs"] < 256, r.summary()


def test_the_estimate_under_0_8_3_on_a_v100_is_not_above_the_release_free_one():
    """Medium. The same on a V100: V1's 1024 dummy sequences counted where V0 profiles 256."""
    shape, gpu = shape_of("qwen2.5-7b"), lookup("V100-SXM2-32GB")
    engine = EngineArgs(max_model_len=4096)
    with_release = estimate(shape, engine, gpu, None, "server", parse_version("0.8.3"))
    without = estimate(shape, engine, gpu, None, "server", None)
    assert with_release.activation_gib <= without.activation_gib + 1e-9


# --- 4. 0.8.3-0.9.0: vLLM's KV check sees the windows; the table counts them in full ----------------


@pytest.mark.parametrize("version", ["0.8.3", "0.8.5", "0.9.0"])
def test_the_kv_check_of_0_8_3_to_0_9_0_counts_windows_as_vllm_does(version):
    """Medium. 0.8.3-0.9.0 check the KV cache before unifying the layer specs, so the check sees the
    windows; the table counted them in full (0.812 GiB for Gemma 2 2B at 8,192 where vLLM asks 0.712)."""
    shape = shape_of("gemma-2-2b")
    engine = EngineArgs(max_model_len=8192)
    need = kv_need(shape, engine, 2048, parse_version(version))
    windows_kept = kv_need(shape, engine, 2048, parse_version("0.9.1"))
    assert need.bytes_for(8192) == pytest.approx(windows_kept.bytes_for(8192))


def test_a_pooling_model_or_a_draft_keeps_the_floor_under_0_26():
    """Low. 0.26 turns async scheduling off for pooling models (one step in flight, not two) and forces
    the V2 runner for some drafts: counted as generative models on V1, the estimate went above vLLM's."""
    from vllm_autoheal.engine_defaults import steps_in_flight

    assert steps_in_flight("in-flight", [], 1, "Gemma3ForCausalLM") == 2
    assert steps_in_flight("in-flight", [], 1, "Qwen3ForSequenceClassification") == 1
    assert steps_in_flight("in-flight", [], 1, "BertModel") == 1
    from vllm_autoheal.model_runner import release_sampler

    shape = shape_of("qwen3-next-80b-a3b")
    assert release_sampler(shape, parse_version("0.26.0")) == "v1-triton"
    draft = ["--speculative-config", '{"method": "eagle3"}']
    assert release_sampler(shape, parse_version("0.26.0"), draft) == "v2"


# --- review2: the release a log names ------------------------------------------------------------

_KV_REFUSAL = "\nValueError: No available memory for the cache blocks. Try increasing gpu_memory_utilization"


_BANNER = (
    "(APIServer pid=4) INFO 08-12 14:53:04 [api_utils.py:345]  \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 "
    "\u2580\u2584\u2580 \u2588  version {}"
)


def test_a_rocm_image_reads_the_release_its_log_names_as_a_rocm_build():
    """Medium (review2). A ROCm build prints a plain release (the corpus's MI308X log: `version 0.27.0`), and
    the logged release was always read as CUDA's: vllm/vllm-openai-rocm:latest naming 0.14.0 got the
    CUDA sort sampler's peak (4.8 GiB for a dense 8B at 1024 sequences, where the ROCm row keeps the
    1.7 GiB floor). Now a ROCm image's logged release is ROCm's, as its tag's would be."""
    from vllm_autoheal.api import VLLMService
    from vllm_autoheal.kube.heal import inventory

    d = classify(Signals(log=_BANNER.format("0.14.0") + _KV_REFUSAL))
    for image, platform in (
        ("vllm/vllm-openai-rocm:latest", "rocm"),
        ("rocm/vllm:latest", "rocm"),
        ("vllm/vllm-openai:latest", "cuda"),
        ("vllm/vllm-openai-rocm:v0.27.0", "rocm"),  # (the tag's own)
    ):
        release = inventory(VLLMService(spec=VLLMServiceSpec(model="m", image=image)), None, None, d).release
        assert release is not None and release.platform == platform, (image, release)
    shape = config_shape("llama-3.1-8b")
    rocm = inventory(VLLMService(spec=VLLMServiceSpec(model="m", image="vllm/vllm-openai-rocm:latest")), None, None, d)
    assert release_sampler(shape, rocm.release) == "v2"


def test_a_log_that_names_two_releases_names_none():
    """Medium (review2). Under a logging format that prints only a message's first line with a header
    (logging.Formatter through VLLM_LOGGING_CONFIG_PATH), a request id's newline starts a bare line of
    the client's: `Initializing a V1 LLM engine (v0.11.0)` there was read as the release (the nearest
    before the failure wins), over the engine's own 0.25.0. A run names one release; two in one log
    (another run's, or a client's) name none."""
    from crafted.bases import ENGINE_CORE, corpus_log, vllm_log
    from crafted.records import CUSTOM, reformatted

    log = corpus_log("local-h200-profile")  # (vLLM 0.25.0 on an H200: a profiling OOM)
    shape = reformatted(CUSTOM, every_line=False)
    assert logged_release(classify(Signals(log=shape(log))).numbers) == parse_version("0.25.0")
    client = vllm_log(
        ENGINE_CORE + "ERROR 12-01 04:42:20 [core.py:2056] ",
        "Unexpected error pre-processing request cmpl-a\nInitializing a V1 LLM engine (v0.11.0) with config: m\n-0-1a2b",
    )
    lines = log.splitlines()
    at = next(i for i, line in enumerate(lines) if "ERROR" in line)
    crafted = "\n".join(lines[:at] + client.splitlines() + lines[at:]) + "\n"
    d = classify(Signals(log=shape(crafted)))
    assert d.cause == "profiling_oom" and logged_release(d.numbers) is None
    assert any("more than one vLLM release" in n for n in d.notes)
    # two runs of one release still name it
    twice = classify(Signals(log=_BANNER.format("0.25.0") + "\n" + _BANNER.format("0.25.0") + _KV_REFUSAL))
    assert logged_release(twice.numbers) == parse_version("0.25.0")
