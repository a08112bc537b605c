"""Session 45 hostile review of commit 22c2d9b (scan._continuations' carry under a learned header; scan._PREFIXES'
path header of VLLM_LOGGING_LEVEL=DEBUG). Each strict xfail shows a log diagnosed one way with a harmless value
(or order) and another way with the client's text (or a request's ordinary log line) in its place.

Setting, as in test_review_session45_steer.py: the operator's logging config
(`%(asctime)s - %(name)s - %(levelname)s - %(message)s`, logging.Formatter: a header on a message's first line
only, the cookbook's format and the repository's own fixtures/vllm-cpu/custom-logging.json), vLLM 0.32's request
logger (`--enable-log-requests`; RequestLogger.log_inputs writes the body's `request_id` with %s: newlines kept).

Findings:
- A further line of the request id that opens with a header the scanner reads escapes the carry: the line is
  "headed", so _continuations hands it to _go_on, which gives it its own origin (ENGINE), not the request
  logger's. Headers a client can write without knowing anything of the deployment: vLLM's own
  (`ERROR 12-01 04:48:07 [kv_cache_utils.py:1] `), its DEBUG path form (`[v1/core/kv_cache_utils.py:1]`, read
  since this commit), the truncated `kv_cache_utils.py:1] ` form, and a JSON record line
  (`{"levelname": "ERROR", "name": "vllm.v1.core.kv_cache_utils", "message": ...}`, which log_records.decoded
  turns into a headed vLLM line before the scan). Under the operator's format no line of vLLM's carries any of
  these (log_format counts vLLM's header against the learned one), yet nothing treats one that follows a
  learned message as that message's. A real illegal memory access reads kv_cache_insufficient, the client's
  words quoted; a real serving OOM's weights figure goes 15.0 -> 70.0 the same way.
  (test_a_request_ids_further_line_with_a_header_decides_nothing)
- The same with the operator's own header itself on the further line (`2026-12-01 04:48:07,600 -
  vllm.v1.core.kv_cache_utils - ERROR - ...`): under a first-line-only format a client's line with the learned
  header is taken as a new message. Needs the format guessed (the cookbook's default is the obvious guess);
  the request logger's message has a fixed tail (`: params: ..., lora_request: ...`) that a fix could wait for.
  (test_a_request_ids_further_line_with_the_learned_header_names_no_kv_failure)
- A client can make the header not be learned at all, and so switch the carry off: log_format.header_of confirms
  a header on the lines before the log's first error "where no client's text can be", but the request logger's
  message IS such a line, and its further lines are the client's. A request id with some lines that open with a
  level word (`INFO: x`, uvicorn's shape, counted as another header; 4 suffice on the bundled base, ~100 on any
  log whose last 400 pre-error lines hold fewer headed lines) pushes the learned shape under SHARE: no line is
  learned_header, every bare line is ENGINE again, and the steer finding (a bare `To serve at least one request
  ...` line deciding kv_cache_insufficient on a real illegal access) comes back unchanged.
  (test_a_request_id_cannot_unlearn_the_operators_header)
- Hiding a real failure (a regression of this commit): `carried` is one value for the whole log, whatever
  process or writer a bare line comes from. A line that NO logger wrote (NCCL's own `NCCL WARN Cuda failure 2
  'out of memory'` from its proxy thread, real in vLLM issue #25597 at 1k concurrency; libstdc++'s `terminate
  called after throwing an instance of 'c10::OutOfMemoryError'` + what()) takes the origin of whatever vLLM
  message came last. With --enable-log-requests on a busy server that is a request's line (`Received request
  ...`, AsyncLLM's `Added request ...`), which is USER: the OOM is user text. The NCCL case then reads
  `not_oom nccl_error` (a heal lost, and a wrong "not memory" verdict); the C++ abort reads `unknown`. Before
  the commit both read as the OOM they are. No client text is needed: only the ordinary request log line last.
  (test_a_request_line_last_does_not_hide_a_raw_oom)

Limits noted (no test):
- Under a format without %(lineno)d the key of _go_on is logger+level only, so two consecutive messages of one
  logger and level are taken as one: vllm.v1.engine.core's `Unexpected error pre-processing request <id>`
  (USER) right before its `EngineCore encountered a fatal error.` makes the fatal message USER and (since this
  commit) its whole traceback too: a real serving OOM reads `unknown wrapper_without_cause`. It needs the
  pre-processing error (input thread) to land between the last `Dumping ...` line of dump_input.py (logged by
  log_error_detail just before) and the fatal message: an unlikely interleaving.
- A multi-process interleave inside one logged message (a traceback over a pipe write) makes the rest of it
  carry the other process's origin; rare.

Held (tried, not defects):
- Escapes of the carry by framing: `\\r`, `\\r\\n`, `\\x0b`, `\\x0c`, `\\x1c`-`\\x1e`, `\\x85`, U+2028/2029 in the id;
  a process prefix (`(EngineCore_DP0 pid=1) `), Ray's `(Name pid=1, ip=h) `, `[rank0]: `, compose's `svc | `,
  uvicorn's `ERROR:     `, glog's, KServe's, Ray Serve's, a CRI line and a docker json-file line inside the id, a
  traceback's opening: all carried as user text. The whole log under kubectl --timestamps, stern, CRI, docker
  json-file and Loki framings: the carry still holds.
- The grammar crash (the client's trigger in the engine's exception message) under the operator's format with
  vLLM's header, its path form, the learned header or the truncated form on the client's line: held
  (quoted.mark_continuations). Under vLLM's own format, the path header in the raw `Process EngineCore_DP0:`
  re-print and in a JSON record's exc_info: held.
- The path header's backtracking: `[` + `a/` * 4000 or `a.` * 4000 costs less than a normal line; the worst
  shape found (12 components of 80 characters, a failing end) is quadratic in the 80-character bound only
  (~70 us a line, ~3x a normal log's cost per byte for such candidate lines against ~2.3x for the same lines
  before the commit): no blow-up, under crafted.bases.BACKTRACKING.
- File-keyed rules and the path's last part: a client's path header gives no more than the plain file header
  (both read alike: FORGED after a first header); the vLLM 0.32 files outside entrypoints whose names the
  request/user rules trust (logger.py, parser/mistral.py, tokenizers/mistral.py, renderers/*) log no memory
  failure.
"""

from __future__ import annotations

import json
import re

import pytest

from crafted.bases import MARKER, PAYLOADS, corpus_log, illegal_access_log
from crafted.checks import assert_reads_like, diagnose
from crafted.records import CUSTOM, reformatted

_PROCESS = re.compile(r"(?m)^\([\w.:-]{1,60} pid=\d+\) ")


def _operators_format(log: str) -> str:
    """A real log as vLLM 0.31+ prints it under `%(asctime)s - %(name)s - %(levelname)s - %(message)s` with
    logging.Formatter (a message's further lines bare), as test_review_session45_steer.py builds it."""
    return reformatted(CUSTOM, every_line=False)(_PROCESS.sub("", log))


def _received(request_id: str) -> str:
    """RequestLogger.log_inputs' line (vLLM 0.32), the request id the body's `request_id`, under that format."""
    header = "2026-12-01 04:48:07,500 - vllm.entrypoints.serve.utils.request_logger - INFO - "
    return header + (
        f"Received request chatcmpl-{request_id}: params: SamplingParams(n=1, temperature=0.7), lora_request: None."
    )


def _before_crash(log: str, extra: str) -> str:
    lines = log.splitlines()
    at = next(i for i, ln in enumerate(lines) if "dump_input" in ln)  # the engine's dump of its input, then its error
    return "\n".join(lines[:at] + extra.split("\n") + lines[at:]) + "\n"


def _runtime_oom() -> str:
    return corpus_log("local-h200-runtime")  # a real vLLM 0.25 serving OOM on an H200


HARMLESS_ID = "call-" + MARKER.lower()
KV = PAYLOADS["kv-capacity"]
WEIGHTS = f"model weights take 70.00 GiB {MARKER}"


def _json_line(name: str, level: str, message: str) -> str:
    return json.dumps({"levelname": level, "name": name, "message": message})


# --- a further line of the id that opens with a header the scanner reads ---------------------------------------
_HEADERS = {
    "vllm": lambda level, message: f"{level} 12-01 04:48:07 [kv_cache_utils.py:1] {message}",
    "vllm-debug-path": lambda level, message: f"{level} 12-01 04:48:07 [v1/core/kv_cache_utils.py:1] {message}",
    "truncated": lambda level, message: f"kv_cache_utils.py:1] {message}",
    "json-record": lambda level, message: _json_line("vllm.v1.core.kv_cache_utils", level, message),
}


@pytest.mark.parametrize("kind", list(_HEADERS))
@pytest.mark.xfail(
    strict=True,
    reason="the operator's format with logging.Formatter: the request id's further line that opens with vLLM's "
    "header (plain, DEBUG path, truncated) or is a JSON record is a headed line of its own, not carried as the "
    "request logger's: kv_cache_insufficient on a real illegal access, the client's words quoted (and the "
    "weights figure 15.0 -> 70.0 on a real serving OOM)",
)
def test_a_request_ids_further_line_with_a_header_decides_nothing(kind):
    base = _operators_format(illegal_access_log())
    harmless = _before_crash(base, _received(HARMLESS_ID))
    assert diagnose(harmless).cause == "not_oom"
    crafted = _before_crash(base, _received("1\n" + _HEADERS[kind]("ERROR", KV) + "\nend"))
    assert_reads_like(crafted, harmless, f"a request id's further line with a {kind} header")
    serving = _operators_format(_runtime_oom())
    harmless_figures = diagnose(_before_crash(serving, _received(HARMLESS_ID))).numbers
    figures = diagnose(_before_crash(serving, _received("1\n" + _HEADERS[kind]("INFO", WEIGHTS) + "\nend"))).numbers
    assert harmless_figures["weights_gib"] == 15.0
    assert figures.get("weights_gib") == harmless_figures["weights_gib"], figures


# --- the learned header itself on the further line ---------------------------------------------------------------
@pytest.mark.xfail(
    strict=True,
    reason="the operator's format with logging.Formatter: a further line of the request id with the operator's "
    "own header is taken as a new message of vllm.v1.core.kv_cache_utils: kv_cache_insufficient, quoted",
)
def test_a_request_ids_further_line_with_the_learned_header_names_no_kv_failure():
    base = _operators_format(illegal_access_log())
    harmless = _before_crash(base, _received(HARMLESS_ID))
    forged = "2026-12-01 04:48:07,600 - vllm.v1.core.kv_cache_utils - ERROR - " + KV
    crafted = _before_crash(base, _received("1\n" + forged + "\nend"))
    assert_reads_like(crafted, harmless, "a request id's further line with the learned header")


# --- the header not learned: the carry off ------------------------------------------------------------------------
@pytest.mark.parametrize("lines", [4, 120])
@pytest.mark.xfail(
    strict=True,
    reason="log_format.header_of judges the lines before the first error, where the request logger's multi-line "
    "id is: lines that open with a level word (`INFO: x`) unlearn the operator's header, so no line carries, and "
    "the id's bare `To serve at least one request ...` line decides kv_cache_insufficient on a real illegal access",
)
def test_a_request_id_cannot_unlearn_the_operators_header(lines):
    base = _operators_format(illegal_access_log())
    harmless = _before_crash(base, _received(HARMLESS_ID))
    crafted = _before_crash(base, _received("1\n" + "\n".join(["INFO: x"] * lines) + "\n" + KV + "\nend"))
    assert_reads_like(crafted, harmless, f"a request id of {lines} level-word lines, then a bare line")


# --- hiding: another writer's raw lines after a request's log line ------------------------------------------------
_METRICS = (
    "2026-12-01 04:48:07,400 - vllm.v1.metrics.loggers - INFO - Engine 000: Avg prompt throughput: 812.4 tokens/s, "
    "Avg generation throughput: 1543.0 tokens/s, Running: 212 reqs, Waiting: 0 reqs, GPU KV cache usage: 61.2%, "
    "Prefix cache hit rate: 0.0%"
)
# Logged with --enable-log-requests (vLLM 0.32: RequestLogger.log_inputs; AsyncLLM.add_request's `Added request`).
_REQUEST_LINES = {
    "received": "2026-12-01 04:48:07,500 - vllm.entrypoints.serve.utils.request_logger - INFO - Received request "
    "chatcmpl-3f2a9c1e: params: SamplingParams(n=1, temperature=0.7, max_tokens=512), lora_request: None.",
    "added": "2026-12-01 04:48:07,500 - vllm.v1.engine.async_llm - INFO - Added request chatcmpl-3f2a9c1e.",
}
# NCCL writes its own lines (printf, no logger): vLLM issue #25597, a serving OOM in EPLB's rearrangement (DP16
# decode at 1k concurrency), its only memory words the proxy thread's; then the engine's logged fatal error.
_NCCL_OOM = """[2026-12-01 04:48:07] vllm-0:2441:9080 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'
vllm-0:2441:9080 [0] NCCL INFO transport/p2p.cc:217 -> 1
vllm-0:2441:9080 [0] NCCL INFO transport/net.cc:553 -> 1
vllm-0:2441:9080 [0] NCCL INFO transport/net.cc:784 -> 1
2026-12-01 04:48:08,085 - vllm.v1.engine.core - ERROR - EngineCore encountered a fatal error.
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1233, in run_engine_core
    engine_core.run_busy_loop()
  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/eplb/rebalance_execute.py", line 300, in rearrange
    torch.distributed.batch_isend_irecv(p2p_ops)
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, \
internal error - please report this issue to the NCCL developers, NCCL version 2.26.2
ncclInternalError: Internal check failed.
Last error:
ncclProxyClientGetFd call to tpRank 7 handle 0x77ed00e001d0 failed : 3"""
# libstdc++ writes a C++ exception that ends the process (std::terminate) to fd 2, no logger.
_CPP_OOM = """terminate called after throwing an instance of 'c10::OutOfMemoryError'
  what():  CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which \
1.05 GiB is free. Including non-PyTorch memory, this process has 78.13 GiB memory in use.
Exception raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1335 (most recent call first):
Fatal Python error: Aborted
2026-12-01 04:48:09,000 - vllm.v1.engine.core_client - ERROR - Engine core proc EngineCore_DP0 died \
unexpectedly, shutting down client."""


def _serving() -> str:
    """The operator's-format serving log (a real vLLM 0.25 H200 run) up to its crash."""
    lines = _operators_format(_runtime_oom()).splitlines()
    return "\n".join(lines[: next(i for i, ln in enumerate(lines) if "dump_input" in ln)])


@pytest.mark.parametrize("request_line", list(_REQUEST_LINES))
@pytest.mark.parametrize("crash", [_NCCL_OOM, _CPP_OOM], ids=["nccl-warn-oom", "cpp-abort-oom"])
@pytest.mark.xfail(
    strict=True,
    reason="the carry is one value for the whole log: NCCL's or libstdc++'s own lines (no logger wrote them) after a "
    "request's ordinary log line take its USER origin, and a real serving OOM reads not_oom nccl_error / unknown",
)
def test_a_request_line_last_does_not_hide_a_raw_oom(crash, request_line):
    start, request = _serving(), _REQUEST_LINES[request_line]
    harmless = "\n".join([start, request, _METRICS, crash]) + "\n"  # the same lines, the metrics line last
    assert diagnose(harmless).cause in ("multi_gpu_oom", "runtime_oom")
    crafted = "\n".join([start, _METRICS, request, crash]) + "\n"
    assert_reads_like(crafted, harmless, f"a request's line ({request_line}) right before the engine's raw OOM")
