"""A hostile review of the collector-prefix / request-id / wrapper / Worker-failed / ALLOC change
(5ce6edb..7966b7e). Each test below either pins a problem the review found (it failed before the
fix in the same commit) or pins a behaviour the review tried to break and could not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify
from vllm_autoheal.diagnosis.candidates import _SEARCHED
from vllm_autoheal.diagnosis.collector import prefix_of
from vllm_autoheal.diagnosis.scan import scan, structured

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted_logs import real_log  # noqa: E402
from test_diagnosis_injection import (  # noqa: E402
    ABORTED,
    ENGINE_DEAD,
    FORMATS,
    ID_BASES,
    _same,
    _unchanged,
)

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ"
KV = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). ZZUSERZZ"
)


# --- 1. A bare carriage return in a client's text starts a line without a header ---------------------
# vLLM's NewLineFormatter repeats the header after each "\n" of a message (writing "\r\n" + header),
# but a bare "\r" is left as it is. A body `request_id` is a JSON string ("a\rtorch.OutOfMemoryError..."
# is one), and `Request %s aborted.` / `... failed (engine dead).` write it raw. scan() took every
# bare "\r" for a line break, so the text after it became a headerless line of the engine's:
# not_oom -> runtime_oom / kv_cache_insufficient, the client's words as evidence. (Older than this
# change, and also the one way a client gets a line of its own choosing to the collector's detector.)
@pytest.mark.parametrize("payload", [OOM, KV], ids=["oom", "kv"])
@pytest.mark.parametrize("fmt", [ABORTED, ENGINE_DEAD], ids=["aborted", "engine-dead"])
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_carriage_return_in_a_request_id_does_not_start_an_engine_line(base_name, fmt, payload):
    # (appended as text: str.splitlines, which _unchanged uses, would itself break the line at "\r")
    base_log = real_log(base_name).rstrip("\n") + "\n"
    crafted = classify(Signals(log=base_log + fmt.format("a\r" + payload) + "\n"))
    _same(crafted, classify(Signals(log=base_log)))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


def test_a_carriage_return_in_a_request_id_under_a_collector_prefix():
    base_log = real_log("neg-6042-watchdog-worker-died")
    extra = ENGINE_DEAD.format("a\r" + OOM + "\r" * 50)  # also: lines without the prefix, to dilute it

    def stern(log: str) -> str:
        return "".join("vllm-7d9f8c-x2x4q vllm " + line + "\n" for line in log.split("\n") if line)

    crafted = classify(Signals(log=stern(base_log + "\n" + extra)))
    _same(crafted, classify(Signals(log=stern(base_log))))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


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


# --- 2. V1's "Worker failed with error '<str(e)>'" row -------------------------------------------
EC = "(EngineCore_DP0 pid=9) ERROR 04-27 05:30:01 [core.py:700] "


def _executor_raises(quoted: str) -> str:
    """The executor's traceback (logged by EngineCore, header on every line) quoting str(e)."""
    message = (
        "EngineCore encountered a fatal error.\nTraceback (most recent call last):\n"
        '  File "/x/vllm/v1/executor/multiproc_executor.py", line 250, in get_response\n    raise RuntimeError(\n'
        f"RuntimeError: Worker failed with error '{quoted}', please check the stack trace above for the root cause"
    )
    return "".join(EC + line + "\n" for line in message.split("\n"))


NCCL_STR = (
    "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
    "Last error:\nCuda failure 'out of memory'"
)


def test_a_workers_multiline_error_that_says_out_of_memory_later_is_not_called_not_oom():
    """str(e) of torch's NCCL error spans lines, the CUDA failure last: the row matched its first line
    and turned multi_gpu_oom into unknown (signals_disagree)."""
    d = classify(Signals(log=_executor_raises(NCCL_STR)))
    assert (d.cause, d.subtype) == ("multi_gpu_oom", "nccl_cuda_oom")


@pytest.mark.parametrize(
    "quoted",
    [
        "Error in model execution: step 3\nCUDA out of memory. Tried to allocate 2.00 GiB.",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY",
        "miopenStatusAllocFailed",
        "rocBLAS error: rocblas_status_memory_error",
        "std::bad_alloc",
        "DefaultCPUAllocator: not enough memory: you tried to allocate 1073741824 bytes.",
    ],
)
def test_a_worker_error_that_may_be_memory_is_never_called_not_oom_by_the_executors_line(quoted):
    d = classify(Signals(log=_executor_raises(quoted)))
    assert d.cause != "not_oom" or d.subtype != "worker_failed_of_other_error"


@pytest.mark.parametrize(
    "quoted", ["NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)", "cu_seqlens_q must be on CUDA"]
)
def test_a_workers_one_line_non_memory_error_is_still_not_oom(quoted):
    d = classify(Signals(log=_executor_raises(quoted)))
    assert (d.cause, d.subtype) == ("not_oom", "worker_failed_of_other_error")


@pytest.mark.parametrize("fmt", FORMATS[:3])
def test_worker_failed_words_in_a_prompt_decide_nothing(fmt):
    """The new row's words in a client's prompt: the bases keep their diagnosis."""
    quote = (
        "RuntimeError: Worker failed with error 'KeyError: x', please check the stack trace above for the root cause"
    )
    for base_name in ("rt-27466-busy-loop", "rt-3430-lmcache-qwen3-8b-a5000-long-prompts"):
        _unchanged(base_name, fmt.format(r=repr(quote + " ZZUSERZZ")), "end")


# --- 3. The math libraries' statuses ----------------------------------------------------------------
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


# --- 4. Collector prefixes: what the review tried and could not break ------------------------------
STERN = "vllm-7d9f8c-x2x4q vllm "


def test_a_v0_log_of_request_lines_gets_no_prefix_cut():
    """V0's header opens with 'INFO 01-10 ' on every line (stern's two-token shape), and a log may be
    mostly request lines: a line with a header is structured, so no witness, no cut."""
    lines = [fmt.format(r=repr(OOM)) for fmt in FORMATS[:3]] * 200
    lines.append("INFO 01-10 12:00:00 async_llm_engine.py:379] x")
    assert prefix_of(lines, structured) is None


def test_a_collector_never_changes_a_line_that_has_a_header_of_its_own():
    """The prefix is cut only from lines without structure of their own: a request line whose text
    starts with the prefix keeps its header, stays user text, and decides nothing."""
    base_log = real_log("neg-6042-watchdog-worker-died")
    log = "".join(STERN + line + "\n" for line in base_log.splitlines())
    forged = FORMATS[2].format(r=repr(STERN + OOM))
    crafted = classify(Signals(log=log + STERN + forged + "\n"))
    _same(crafted, classify(Signals(log=log)))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())
    assert {ln.origin for ln in scan(log + STERN + forged + "\n").lines if "ZZUSERZZ" in ln.raw} == {"user"}


@pytest.mark.parametrize("prefix", [STERN, "[pod/vllm-7d9f8c-x2x4q/vllm] ", "Dec 01 12:00:00 node vllm[4]: ", "> "])
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "rt-27466-busy-loop"])
def test_request_echoes_under_a_collector_prefix_change_nothing(prefix, base_name):
    """The injection suite's request and response lines, every line under a collector's prefix."""
    base_log = "".join(prefix + line + "\n" for line in real_log(base_name).splitlines())
    base = classify(Signals(log=base_log))
    for fmt in FORMATS:
        crafted = classify(Signals(log=base_log + prefix + fmt.format(r=repr(OOM)) + "\n"))
        _same(crafted, base)
        assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


def test_the_hubs_request_id_does_not_let_a_request_line_be_the_engines():
    """A line that names a client's request stays user text, the Hub's id on it or not."""
    line = ABORTED.format("a (Request ID: Root=1-a) " + OOM)
    for base_name in ("neg-2734-llama2-70b-tp8-timeout", "rt-27466-busy-loop"):
        _unchanged(base_name, line, "end")
