"""A failure after which the whole server came up, or served, did not stop it (diagnosis/outlived.py).

vLLM's logger prints a few lines only once every rank's start-up succeeded, or while it serves: `init engine (profile,
create kv cache, warmup model) took`, uvicorn's `Application startup complete` / `Uvicorn running on`, the stats
line `Avg prompt throughput`. A failure before such a line is an earlier run's, a request's the engine survived, or a
client's text: after a gap (the operator's window on a long log, a paster's `[...]`) a client's headerless line
cannot be told from a dying engine's raw traceback, but it is followed by the server's own lines. On the corpus
this rule changes no answer (train or test); it makes 9 of the 11 s14b-2/s14c-1 cases pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.scan import GAP_LINE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_diagnosis_s14_review import _illegal_access  # noqa: E402

GPU = Path(__file__).resolve().parent / "fixtures" / "gpu" / "failure-logs"
USER = "ZZUSERZZ"

# Each memory cause's message as a client quotes it, raw (a line of uvicorn's report of its request)
QUOTES = {
    "torch-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total "
    "capacity of 139.80 GiB of which 1.00 GiB is free. " + USER,
    "kv-length": "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can "
    "be stored in KV cache (2048). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine. " + USER,
    "free-memory": "ValueError: Free memory on device (10.0/139.8 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 125.8 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes. "
    + USER,
    "kernel-oom-killer": "Out of memory: Killed process 123 (python3) total-vm:100kB, anon-rss:100kB " + USER,
    "nccl-oom": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda "
    "error, NCCL version 2.21.5 ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda failure "
    "'out of memory' " + USER,
}


def _log(name: str) -> str:
    return (GPU / name).read_text()


def _after_a_gap(quote: str, base: str) -> str:
    """The window opens inside a client's report: its raw lines, the quote, then the rest of the real log."""
    return GAP_LINE + "\n" + "hello\n" * 20 + quote + "\n" + base


def _key(d) -> tuple:
    return d.cause, d.subtype


def _clean(d) -> bool:
    return USER not in json.dumps(d.to_dict())


@pytest.mark.parametrize("quote", sorted(QUOTES))
def test_a_quote_before_the_servers_own_lines_does_not_turn_a_real_crash_into_memory(quote):
    base = _illegal_access()  # a real H200 log that served, its final error made an illegal memory access
    harmless = classify(Signals(log=_after_a_gap("bye", base)))
    assert _key(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=_after_a_gap(QUOTES[quote], base)))
    assert _key(crafted) == _key(harmless)
    assert _clean(crafted)
    assert any("set aside: the server came up or served after them" in n for n in crafted.notes)


@pytest.mark.parametrize("quote", sorted(QUOTES))
def test_a_quote_before_the_servers_own_lines_does_not_change_a_real_ooms_answer(quote):
    base = _log("runtime.log")  # a real serving OOM on an H200 (vLLM 0.25)
    want = classify(Signals(log=base))
    assert _key(want) == ("runtime_oom", "oom_in_serving")
    crafted = classify(Signals(log=_after_a_gap(QUOTES[quote], base)))
    assert _key(crafted) == _key(want) and crafted.numbers == want.numbers
    assert _clean(crafted)


def test_an_earlier_runs_memory_failure_does_not_decide_a_later_runs_crash():
    # the KV-length failure of one start, then a later start that served and died on an illegal memory access
    first, second = _log("kvlen.log"), _illegal_access()
    assert classify(Signals(log=first)).cause == "kv_cache_insufficient"
    d = classify(Signals(log=first + second))
    assert _key(d) == ("not_oom", "illegal_memory_access")
    # and the other way round, the last run decides
    assert classify(Signals(log=second + first)).cause == "kv_cache_insufficient"


def test_one_ranks_graph_capture_after_another_ranks_oom_does_not_set_it_aside():
    # each rank prints its own capture: rank 1 finishing does not mean rank 0 did
    lines = _log("capture.log").splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "torch.OutOfMemoryError" in ln) + 1
    rank1 = (
        "(VllmWorker TP1 pid=1170) INFO 12-02 06:06:46 [gpu_model_runner.py:2000] Graph capturing finished in 5 "
        "secs, took 0.50 GiB\n"
    )
    want = classify(Signals(log="".join(lines)))
    assert want.cause == "cudagraph_capture_oom"
    d = classify(Signals(log="".join(lines[:at] + [rank1] + lines[at:])))
    assert _key(d) == _key(want)


@pytest.mark.parametrize(
    "line",
    [
        "Avg prompt throughput: 1.0 tokens/s, Running: 1 reqs",  # raw: anyone's
        "INFO:     Application startup complete.  (quoted by a client)",  # a client's line in the raw report
        '(APIServer pid=2320) INFO 12-01 04:48:09 [logger.py:39] Received request cmpl-1: prompt: "Uvicorn running '
        'on http://0.0.0.0:8000 init engine (profile, create kv cache, warmup model) took 1.0 s"',  # the request logger
    ],
    ids=["raw-stats", "raw-uvicorn", "request-logger"],
)
def test_a_clients_server_up_words_after_a_real_oom_do_not_set_it_aside(line):
    base = _log("runtime.log")
    want = classify(Signals(log=base))
    d = classify(Signals(log=base + "hello\n" + line + "\n"))
    assert _key(d) == _key(want)
