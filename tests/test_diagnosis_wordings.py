"""What a library's own wording of a failure is read as: rocBLAS's and NCCL's allocation messages,
Triton's OutOfResources, tqdm's redrawn bars, each anchor searched once, and the rows that mean memory
never read as "not memory"."""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify
from vllm_autoheal.diagnosis.candidates import _SEARCHED

from crafted.bases import CENSUS, real_log, with_lines
from crafted.checks import cause_of, said
from crafted.exceptions import CLIENT_FORMATS
from crafted.wrappers import KSERVE, TRITON, V1_KILLED


def test_progress_bars_redrawn_with_carriage_returns_still_read():
    """tqdm redraws its bar after a bare "\\r": the bar stays one line and the marker in it is read."""
    log = (
        "INFO 05-01 12:00:00 [gpu_model_runner.py:5150] Model loading took 14.99 GiB memory and 10.9 seconds\n"
        "INFO 05-01 12:00:10 [gpu_worker.py:298] Available KV cache memory: 50.28 GiB\n"
        + "".join(f"\rCapturing CUDA graph shapes: {k:3d}%|#| {k}/67" for k in range(0, 60, 5))
        + "\n"
        "Traceback (most recent call last):\n"
        '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 3362, in capture_model\n'
        "    self._dummy_run(num_tokens)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 1.10 GiB is free.\n"
    )
    assert classify(Signals(log=log)).cause == "cudagraph_capture_oom"


# --- The math libraries' statuses ----------------------------------------------------------------
def test_rocblas_memory_error_is_not_an_oom():
    """rocblas_status_memory_error is 'Failed internal memory allocation, copy or dealloc', and rocBLAS
    maps hipErrorLaunchOutOfResources (a kernel's launch configuration) to it: not a shortage for
    sure, and a wrong memory cause is worse than none."""
    log = (
        "INFO 05-01 12:00:00 [gpu_model_runner.py:5150] Model loading took 14.99 GiB memory and 10.9 seconds\n"
        'Traceback (most recent call last):\n  File "/x/vllm/v1/worker/gpu_model_runner.py", line 6000, in '
        "profile_run\n    hidden_states = self._dummy_run(self.max_num_tokens)\n"
        "RuntimeError: rocBLAS error: rocblas_status_memory_error\n"
    )
    assert classify(Signals(log=log)).cause not in MEMORY_CAUSES


def test_each_anchor_is_searched_once():
    """'ALLOC' was listed twice (the new line and the old one): a second pass over the window."""
    assert len(_SEARCHED) == len(set(_SEARCHED))


@pytest.mark.parametrize(
    "line",
    [
        "Cuda error /workspace/csrc/custom_all_reduce.cuh:143 'out of memory'",
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:307 'out of memory'",
        TRITON + "Failed to initialize Python stub: RuntimeError: " + "x" * 320 + " CUDA out of memory. Tried to "
        "allocate 2.00 GiB",
        KSERVE + "Failed to start model server: " + "y" * 320 + " CUDA error: out of memory",
        KSERVE + "Failed to start model server: " + V1_KILLED,
        TRITON + "Failed to initialize Python stub: jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Error "
        "loading program",
        "terminate called after throwing an instance of 'c10::OutOfMemoryError'\n  what():  CUDA out of memory. "
        "Tried to allocate 2.00 GiB.\nAborted (core dumped)",
        "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n"
        "Aborted (core dumped)",
    ],
    ids=[
        "cudacheck-oom",
        "failed-cudacheck-oom",
        "triton-oom-past-300",
        "kserve-oom-past-300",
        "kserve-v1-killed",
        "triton-xla",
        "abort-after-cuda-oom",
        "abort-after-bad-alloc",
    ],
)
def test_an_out_of_memory_the_new_rows_see_is_never_not_oom(line):
    assert cause_of(line + "\n") != "not_oom"


TRITON_BASES = [
    "kv-cache-too-small.log",
    "cg-15228-qwen25-v080",
    "memory-limit-kill.log",
    "rt-27466-busy-loop",
    "local-h200-runtime",
    "neg-2734-llama2-70b-tp8-timeout",
]


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("fmt", sorted(CLIENT_FORMATS))
@pytest.mark.parametrize("base_name", TRITON_BASES)
def test_a_clients_outofresources_does_no_more_than_the_rows_older_words(base_name, fmt, where):
    """The newly live alternative in a client's text gives the same diagnosis as the
    row's older `InductorError` in the same place (the same cause, subtype, phase and numbers; the
    evidence differs only by the payload's own words, where the older words are quoted too: section 6)."""
    base_log = real_log(base_name)

    def diag(payload: str):
        d = classify(Signals(log=with_lines(base_log, CLIENT_FORMATS[fmt](payload), where)))
        return d.cause, d.subtype, d.phase, d.numbers, len(d.evidence), bool(d.evidence and "ZZUSERZZ" in d.evidence[0])

    older = diag("InductorError ZZUSERZZ")
    for payload in (
        "triton.runtime.errors.OutOfResources: out of resource: shared memory ZZUSERZZ",
        "OutOfResources: out of resource: shared memory ZZUSERZZ",
    ):
        assert diag(payload) == older


def test_a_real_triton_outofresources_is_read_outside_the_raw_tail():
    """The line holds anchors (`rror` in the module path, `out of` in the message), so it
    is a candidate even with more than the raw tail's 64 KiB after it (a shutdown's unanchored lines)."""
    h = "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] "
    log = (
        h + "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 165888, Hardware limit: "
        "163840. Reducing block sizes or `num_stages` may help.\n"
        + "(APIServer pid=7) INFO 01-01 00:00:01 [launcher.py:1] Shutting down FastAPI HTTP server.\n"
        * 900
    )
    d = classify(Signals(log=log))
    assert (d.cause, d.subtype) == ("not_oom", "compile_toolchain_error")


# --- Another writer's line after an exception -----------------------------------------
WEIGHTS_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 MiB. GPU 0 has a total capacity of 79.19 "
    "GiB of which 60.69 MiB is free. Process 4242 has 79.10 GiB memory in use. Of the allocated memory 78.2 GiB is "
    "allocated by PyTorch, and 12.81 MiB is reserved by PyTorch but unallocated."
)


BAR = "Loading safetensors checkpoint shards:   3% Completed | 1/37 [00:02<01:39,  2.77s/it]"


NCCL_EXIT = (
    "[rank0]:[W1224 08:50:36.247935068 ProcessGroupNCCL.cpp:1524] Warning: WARNING: destroy_process_group() was "
    "not called before program exit, which can leak resources."
)


@pytest.mark.parametrize("prefix", ["(EngineCore_DP0 pid=7) ", ""], ids=["process-prefix", "bare"])
def test_tqdms_loading_bar_after_a_weight_loading_oom_still_places_it(prefix):
    """A cut log: the engine's OOM while loading weights, then tqdm's bar, closed at exit (the shape of two
    corpus samples). Taken for part of the OOM's message it would give unknown oom_phase_unknown (the
    remedy lost): the bar taken for a further line of the OOM's message, so its marker places
    nothing. It should stay weights_load_oom: a line that is not the exception's writer's (no header on
    either, another prefix or none) is no further line of its message."""
    d = classify(Signals(log="\n".join([prefix + WEIGHTS_OOM, "", BAR, "", NCCL_EXIT]) + "\n"))
    assert (d.cause, d.subtype, d.phase) == ("weights_load_oom", "oom_in_load", "load"), f"said {said(d)}"


# --- NCCL's calloc warning after any failed allocation ----------------------------------------
NCCL_LOG = CENSUS["nccl2.18-cudamalloc-oom-torch2.1-allreduce-warmup"]["log"]


@pytest.mark.parametrize(
    "error",
    [
        "Cuda failure 'operation not supported'",
        "Cuda failure 1 'invalid argument'",
        "Cuda failure 'an illegal memory access was encountered'",
    ],
)
def test_a_calloc_after_a_non_oom_cuda_failure_says_not_memory(error):
    """Unfixed: unknown signals_disagree; should be not_oom cuda_error. NCCL printed the CUDA call's
    real failure, then (as it does after any failed allocation) `Failed to CUDA calloc 4194304 bytes`,
    which the new row reads as an out-of-memory after a non-memory failure. It should say not_oom."""
    d = classify(Signals(log=NCCL_LOG.replace("Cuda failure 'out of memory'", error)))
    assert d.cause == "not_oom", f"said {said(d)}"


def test_a_bare_calloc_last_error_is_no_memory_cause():
    """Unfixed: multi_gpu_oom nccl_cuda_oom; should be unknown. Without NCCL_DEBUG only torch's `Last
    error: Failed to CUDA calloc 4194304 bytes` is left, which NCCL prints after any failed cudaMalloc or
    cuMem allocation: the message alone cannot tell an OOM from `operation not supported`. It should not
    name a memory cause (the census' `ambiguous`)."""
    log = NCCL_LOG.replace(
        "\ngpu-node-3:1893:1893 [0] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n", ""
    )
    log = log.replace(
        "\ngpu-node-3:1893:1893 [0] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 4194304 bytes\n", "\n"
    )
    assert "NCCL WARN" not in log
    d = classify(Signals(log=log))
    assert not d.is_memory, f"said {said(d)}"


# --- vLLM 0.34's own wordings, in the engine core's format (`(EngineCore pid=N)` in the logger's header) ----
V034_ENGINE = "(EngineCore pid=77) "
V034_START = "\n".join(
    V034_ENGINE + line
    for line in (
        "INFO 12-04 10:00:05 [core.py:121] Initializing a V1 LLM engine (v0.34.0) with config: "
        "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072",
        "INFO 12-04 10:00:41 [model_runner.py:442] Model loading took 14.99 GiB memory and 30.100000 seconds",
    )
)


def v034_startup_failure(frames: list[tuple[str, str, str]], error: str, before: str = "") -> str:
    """vLLM 0.34's start-up failure: core.py's `logger.exception("EngineCore failed to start.")`, every line of
    the traceback under its header, then the API server's RuntimeError (v1/engine/utils.py)."""
    head = V034_ENGINE + "ERROR 12-04 10:01:10 [core.py:1757] "
    lines = ["EngineCore failed to start.", "Traceback (most recent call last):"]
    frames = [
        ("v1/engine/core.py", "run_engine_core", "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)"),
        ("v1/engine/core.py", "__init__", "kv_cache_config = self._initialize_kv_caches(vllm_config)"),
        *frames,
    ]
    for path, function, code in frames:
        lines += [
            f'  File "/usr/local/lib/python3.12/dist-packages/vllm/{path}", line 100, in {function}',
            f"    {code}",
        ]
    api = (
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore': 1}"
    )
    return "\n".join([V034_START, *filter(None, [before]), *(head + line for line in lines + [error]), api]) + "\n"


def test_the_kv_size_line_of_a_hisparse_engine_is_read():
    """vLLM 0.33 and 0.34 (v1/core/kv_cache_utils.py update_kv_cache_capacity) name the pools before "KV cache
    size": "GPU", or the device type, and " + host" where HiSparse keeps part of the cache in host memory.
    Read only where a known message opens an INFO line, "GPU + host KV cache size: ..." was not (its marker
    allowed one word before "KV"): neither the size nor the concurrency below 1x that alone says one
    request of max_model_len does not fit."""
    line = (
        V034_ENGINE + "INFO 12-04 10:00:53 [kv_cache_utils.py:1169] GPU + host KV cache size: 2,048 tokens, "
        "Maximum concurrency for 131,072 tokens per request: 0.02x"
    )
    d = classify(Signals(log=V034_START + "\n" + line + "\n"))
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "kv_cache_below_one_request"), f"said {said(d)}"
    assert (d.numbers["kv_cache_tokens"], d.numbers["max_concurrency"]) == (2048, 0.02)


def test_the_cpu_runners_pooler_warmup_oom_is_a_warmup_oom():
    """vLLM 0.34's standalone CPU runner words the pooler's warm-up OOM its own way
    (v1/worker/cpu/pooling_runner.py: "Out of memory while warming up the pooler (task=...) with N dummy
    requests. Lower `max_num_seqs`."), raised from the CPU worker's profiling warm-up. Only the GPU runner's
    "CUDA out of memory occurred when warming up pooler" was known: unknown, the dummy batch's size lost.
    It should be the warm-up OOM the GPU's wording is, with the batch that did not fit."""
    frames = [
        (
            "v1/engine/core.py",
            "_initialize_kv_caches",
            "available_gpu_memory = self.model_executor.determine_available_memory()",
        ),
        ("v1/worker/cpu_worker.py", "determine_available_memory", "self.model_runner.warming_up_model()"),
        ("v1/worker/cpu/pooling_runner.py", "_dummy_pooler_run_task", "raise RuntimeError("),
    ]
    error = (
        "RuntimeError: Out of memory while warming up the pooler (task='embed') with 256 dummy requests. "
        "Lower `max_num_seqs`."
    )
    d = classify(Signals(log=v034_startup_failure(frames, error)))
    assert (d.cause, d.subtype, d.phase) == ("profiling_oom", "sampler_warmup_oom", "profile"), f"said {said(d)}"
    assert d.numbers["dummy_requests"] == 256


# vLLM 0.34's SimpleCPUOffloadConnector maps and pre-faults its host copy of the KV cache at start-up
# (v1/simple_kv_offload/host_buffer.py alloc_host_buffer), wrapping the OSError in words of its own.
HOST_BUFFER_FRAMES = [
    ("v1/engine/core.py", "_initialize_kv_caches", "self.model_executor.initialize_from_config(kv_cache_configs)"),
    ("v1/worker/gpu/model_runner.py", "initialize_kv_cache", "self.kv_connector.register_kv_caches(kv_caches_dict)"),
    (
        "v1/simple_kv_offload/worker.py",
        "_alloc_cpu_caches",
        "buf = alloc_host_buffer(sum(layer_bytes), self.cpu_hugepage_size)",
    ),
    ("v1/simple_kv_offload/host_buffer.py", "alloc_host_buffer", "raise RuntimeError("),
]


@pytest.mark.parametrize(
    "error",
    [
        "RuntimeError: Cannot map 40.00 GiB of ordinary pages: [Errno 12] Cannot allocate memory. Reserve the pages "
        "on the host and request them for the container.",
        "RuntimeError: Cannot populate 40.00 GiB of ordinary pages: [Errno 12] Cannot allocate memory. The "
        "container's memory or hugetlb limit is too small.",
        # (MADV_POPULATE_WRITE fails with EFAULT where a page could not be had: a hugetlb pool run dry)
        "RuntimeError: Cannot populate 40.00 GiB of 2 MiB HugeTLB pages: [Errno 14] Bad address. The container's "
        "memory or hugetlb limit is too small.",
    ],
    ids=["map-enomem", "populate-enomem", "populate-hugetlb-efault"],
)
def test_the_cpu_offload_buffer_that_does_not_fit_host_memory_is_host_memory(error):
    """The map failure's own advice says "request them for the container", and any line naming a "request"
    was taken for a client's (origin.py): the engine's error was dropped, unknown. The populate failure
    with EFAULT, which vLLM itself calls a memory or hugetlb limit too small, said not_oom. Both are the
    host's memory."""
    d = classify(Signals(log=v034_startup_failure(HOST_BUFFER_FRAMES, error)))
    assert d.cause == "host_ram_oom", f"said {said(d)}"


@pytest.mark.parametrize(
    "error",
    [
        # (multimodal/gpu_ipc_memory.py's reservation refusal, which names the utilization and both figures,
        # is a KV shortage healed from them: tests/test_review_session38_v032.py)
        # v1/hisparse/runtime.py: the node's available RAM (psutil), which no container limit raises
        "ValueError: HiSparse pinned host pool needs ~512 GiB but only 300 GiB of RAM is available. Lower the "
        "HiSparseConnector host_pool_gib or leave headroom for co-tenants.",
        # model_executor/kernels/linear/mixed_precision/rdna_hybrid_w4a16.py (AMD RDNA, opt-in)
        "ValueError: Not enough room in the gpu_memory_utilization budget to cache a dequantized W4A16 prefill "
        "weight (kernel_config.rdna_hybrid_w4a16_prefill_dequant) while keeping KV cache for one max_model_len "
        "request. Increase `gpu_memory_utilization`, lower `max_model_len`, or disable it.",
    ],
    ids=["hisparse-host-pool", "rdna-w4a16-cache"],
)
def test_a_need_set_against_what_is_left_is_no_not_memory_answer(error):
    """vLLM 0.34's own words for memory that is short, in failures no row places (a reserve of an opt-in
    feature, the node's RAM): they said not_oom ("not memory"), which is false. Now `unknown`, naming the
    line: no setting is changed (which one would help is the feature's, not a flag the heal owns)."""
    frames = [
        (
            "v1/engine/core.py",
            "_initialize_kv_caches",
            "available_gpu_memory = self.model_executor.determine_available_memory()",
        ),
        ("v1/worker/gpu_worker.py", "determine_available_memory", "return reserve_mm_ipc_gpu_memory("),
    ]
    d = classify(Signals(log=v034_startup_failure(frames, error)))
    assert (d.cause, d.subtype) == ("unknown", "allocation_failure_unplaced"), f"said {said(d)}"
    assert error.split(": ", 1)[1][:60] in " ".join(d.evidence)
