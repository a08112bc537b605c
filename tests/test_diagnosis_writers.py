"""Which process wrote a line (diagnosis/writers.py): a GPU memory failure on a line of vLLM's API server, where
the engine runs in processes of its own, is a client's text in a request's report, never the engine's.

vLLM V1 prefixes the lines each of its processes writes (`(APIServer pid=1)`, `(EngineCore_DP0 pid=2)`, `(VllmWorker
TP0 pid=3)`); in some versions uvicorn's reports and the newlines of a client's text in them too (vLLM 0.25 on the
H200: tests/fixtures/gpu/failure-logs/runtime.log; 0.32 on the CPU leaves uvicorn's lines bare, where the older limits
stand: the s14b/s15 strict xfails). These tests take the shape 0.25 prints. The operator's window on a
long log may open inside such a report, whose opening line then is gone: without the writer, the client's raw
`torch.OutOfMemoryError ...` read as the engine's (s15-3); a client's line opening with vLLM's header in the
report, even a whole one, decided (s9's limit, as V1 prints it). On the corpus the rule changes no answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.scan import GAP_LINE, scan
from vllm_autoheal.diagnosis.writers import writers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_diagnosis_log_format import ASGI  # noqa: E402
from test_diagnosis_s14_review import _illegal_access  # noqa: E402

GPU = Path(__file__).resolve().parent / "fixtures" / "gpu" / "failure-logs"
API = "(APIServer pid=2320) "
USER = "ZZUSERZZ"
KV = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (1.00 GiB). Based on the available memory, the estimated "
    "maximum model length is 8192. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine. "
)
QUOTES = {  # each GPU memory cause's message, as a client's text quotes it
    "torch-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total "
    "capacity of 139.80 GiB of which 1.00 GiB is free. " + USER,
    "kv-length": KV + USER,
    "free-memory": "ValueError: Free memory on device (10.0/139.8 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 125.8 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes. "
    + USER,
    "nccl-oom": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda "
    "error, NCCL version 2.21.5 ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda failure "
    "'out of memory' " + USER,
}


def _key(d) -> tuple:
    return d.cause, d.subtype


def _clean(d) -> bool:
    return USER not in json.dumps(d.to_dict())


def _window(quote: str, base: str) -> str:
    """The operator's window opens in uvicorn's report of a client's request (its opening cut): the client's lines,
    prefixed by the API server as V1 prints them; then the rest of a real log."""
    return GAP_LINE + "\n" + (API + "hello\n") * 50 + API + quote + "\n" + base


def _tail(name: str, first: str) -> str:
    """A real log from its line holding `first` on (no start-up: the window of a server that served a while)."""
    lines = (GPU / name).read_text().splitlines(keepends=True) if name.endswith(".log") else name.splitlines(True)
    return "".join(lines[next(i for i, ln in enumerate(lines) if first in ln) :])


@pytest.mark.parametrize("quote", sorted(QUOTES))
def test_after_a_gap_an_api_servers_raw_memory_error_does_not_turn_a_real_crash_into_memory(quote):
    base = _tail(_illegal_access(), "[dump_input.py:")  # a real H200 log, its final error an illegal memory access
    harmless = classify(Signals(log=_window("bye", base)))
    assert _key(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=_window(QUOTES[quote], base)))
    assert _key(crafted) == _key(harmless)
    assert _clean(crafted)


@pytest.mark.parametrize("quote", sorted(QUOTES))
def test_after_a_gap_an_api_servers_raw_memory_error_does_not_change_a_real_ooms_answer(quote):
    base = _tail("runtime.log", "[dump_input.py:")  # a real serving OOM on an H200 (vLLM 0.25)
    want = classify(Signals(log=base))
    assert _key(want) == ("runtime_oom", "oom_in_serving")
    crafted = classify(Signals(log=_window(QUOTES[quote], base)))
    assert _key(crafted) == _key(want) and crafted.numbers == want.numbers
    assert _clean(crafted)


@pytest.mark.parametrize(
    ("name", "want"),
    [("port.log", "not_oom"), ("maxlen.log", "not_oom"), ("batched.log", "not_oom"), ("missing.log", "not_oom")],
)
def test_the_api_servers_own_raw_errors_still_decide(name, want):
    # real H200 failures the API server printed raw: a busy port, bad flags, a missing model
    assert classify(Signals(log=(GPU / name).read_text())).cause == want


def test_the_engines_raw_lines_still_decide():
    # the engine core's raw re-print (`Process EngineCore:` and its traceback) of a real KV failure, beside the API
    # server's own lines
    log = (GPU / "kvlen.log").read_text()
    assert "(APIServer pid=" in log
    assert classify(Signals(log=log)).cause == "kv_cache_insufficient"


def test_a_kv_check_decides_where_no_api_server_writes_it():
    # the OpenAI server always runs the engine core apart (AsyncLLM refuses an in-process core): a KV check the API
    # server wrote is a client's; the same lines of a process that names no API server (the offline LLM class, a
    # worker) are the engine's
    def log(prefix: str) -> str:
        return (
            "(VllmWorker TP0 pid=3) INFO 12-01 10:00:00 [gpu_worker.py:1] Available KV cache memory: 1.00 GiB\n"
            + prefix
            + "Traceback (most recent call last):\n"
            + prefix
            + '  File "/usr/lib/vllm/v1/core/kv_cache_utils.py", line 1, in check_enough_kv_cache_memory\n'
            + prefix
            + KV
            + "\n"
        )

    assert classify(Signals(log=log(""))).cause == "kv_cache_insufficient"
    assert classify(Signals(log=log("(EngineCore_DP0 pid=2) "))).cause == "kv_cache_insufficient"
    assert classify(Signals(log=log(API))).cause != "kv_cache_insufficient"


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("(APIServer pid=1) hello", ["APIServer"]),
        ("(APIServer pid=1) (DPEngineCoreActor pid=2) hello", ["APIServer", "DPEngineCoreActor"]),
        ("(VllmWorker TP0 pid=3) INFO 12-01 10:00:00 [gpu_worker.py:1] hi", ["VllmWorker"]),
        ("(RayWorkerWrapper pid=5, ip=10.0.0.1) hello", ["RayWorkerWrapper"]),
        ("hello (APIServer pid=1) later on the line", []),
        ("hello", []),
    ],
)
def test_the_writers_are_the_process_prefixes_before_the_text_outermost_first(raw, names):
    (line,) = scan(raw + "\n").lines
    assert writers(line) == names


# --- A header a client wrote: vLLM's, or an engine process's prefix (s9's limit, where V1 names the writer) -----
FORGED = {
    "vllm-header": "ERROR 12-01 04:48:09 [core.py:1233] ",
    "engine-prefix": "(EngineCore_DP0 pid=2441) ",
    "both": "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:09 [core.py:1233] ",
}
PLACES = ("after-a-gap", "in-a-whole-report-before", "in-a-whole-report-after")
BASES = {
    "illegal-access": lambda: _tail(_illegal_access(), "[dump_input.py:"),
    "runtime-oom": lambda: _tail("runtime.log", "[dump_input.py:"),
}


def _forged(base: str, place: str, line: str) -> str:
    report = "".join(API + ln + "\n" for ln in ASGI.splitlines()) + (API + "hello\n") * 5 + API + line + "\n"
    if place == "after-a-gap":
        return GAP_LINE + "\n" + (API + "hello\n") * 5 + API + line + "\n" + base
    return report + base if place == "in-a-whole-report-before" else base + report


@pytest.mark.parametrize("quote", ["torch-oom", "kv-length"])
@pytest.mark.parametrize("forged", sorted(FORGED))
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("base_name", sorted(BASES))
def test_a_header_a_client_wrote_in_the_api_servers_lines_decides_nothing(base_name, place, forged, quote):
    base = BASES[base_name]()
    harmless = classify(Signals(log=_forged(base, place, FORGED[forged] + "bye")))
    assert _key(harmless) == _key(classify(Signals(log=base)))
    crafted = classify(Signals(log=_forged(base, place, FORGED[forged] + QUOTES[quote])))
    assert _key(crafted) == _key(harmless) and crafted.numbers == harmless.numbers
    assert _clean(crafted)


RAY_DP_LIMIT = pytest.mark.xfail(
    strict=True,
    reason="a limit, safe: under the Ray DP backend the engine cores are Ray actors whose output the API server "
    "prints under its own prefix first, and a client can write the same inner prefix byte for byte (the s15c "
    "review), so those lines are set aside too: a real OOM there is unknown, never a client's text the cause",
)


@RAY_DP_LIMIT
def test_under_ray_the_engines_lines_forwarded_by_the_api_server_still_decide():
    # Ray DP: the engine cores are Ray actors whose output the API server (Ray's driver) prints under its own prefix
    log = (GPU / "runtime.log").read_text().replace("(EngineCore pid=2441) ", API + "(DPEngineCoreActor pid=2441) ")
    assert "(EngineCore pid=" not in log
    want = classify(Signals(log=(GPU / "runtime.log").read_text()))
    d = classify(Signals(log=log))
    assert _key(d) == _key(want) == ("runtime_oom", "oom_in_serving")
