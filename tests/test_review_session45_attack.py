"""Session 45 hostile review of commit 22c2d9b, which gave a line without a header the origin of the message above it
where the log's own (learned) header heads a message's first line only (logging.Formatter under the operator's
`--logging-config`), so that a request id of many lines (the body's `request_id`, written with %s by vLLM 0.32's
request logger, newlines kept) could not write the engine's words (tests/test_review_session45_steer.py).

The review found that carry escaped three ways and hiding real failures:
- a further line of the id that opens with any header the scanner reads (vLLM's own, its DEBUG path form, the
  truncated `file.py:N] ` form, a JSON record) was taken as a new message, the engine's;
- so was one with the operator's own header (a format a client need only guess: the cookbook's default);
- a client could keep the header from being learned at all: log_format.header_of judges the lines before the first
  error, where the request logger's message is, and an id with a few lines opening with a level word (`INFO: x`; 4
  on the bundled base, ~120 on any log) pushes the operator's shape under SHARE: no carry, the steer as before;
- and, with no client at all, the lines no logger writes (NCCL's `NCCL WARN Cuda failure 2 'out of memory'`, real
  in vLLM issue #25597; libstdc++'s `terminate called after throwing an instance of 'c10::OutOfMemoryError'`) took
  the origin of the last vLLM message, on a busy server with --enable-log-requests a request's line: a real
  serving OOM read `not_oom nccl_error` (a heal lost, a wrong "not memory") or `unknown`.

So the carry was weak protection at the price of real failures read wrong, and it was taken back: under a format
that heads only a message's first line, with requests logged, a line without a header cannot be told from a
client's (a limit, kept as strict xfails in test_review_session45_steer.py; the README says to keep vLLM's own
formatter, which heads every line, or not to log requests there). What stays here is the regression guard: the raw
OOM lines after a request's ordinary log line decide, as they did before the carry.

Also found, held: the DEBUG path header (`[v1/engine/core.py:1233]`, kept) gives a forged header nothing the plain
file header did not, and costs no backtracking (`[` + `a/` x 4000 cheaper than a normal line; 12 components of 80
characters that fail at the end ~70 us a line, under BACKTRACKING).
"""

from __future__ import annotations

import json
import re

import pytest

from crafted.bases import MARKER, PAYLOADS, corpus_log
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
def test_a_request_line_last_does_not_hide_a_raw_oom(crash, request_line):
    start, request = _serving(), _REQUEST_LINES[request_line]
    harmless = "\n".join([start, request, _METRICS, crash]) + "\n"  # the same lines, the metrics line last
    assert diagnose(harmless).cause in ("multi_gpu_oom", "runtime_oom")
    crafted = "\n".join([start, _METRICS, request, crash]) + "\n"
    assert_reads_like(crafted, harmless, f"a request's line ({request_line}) right before the engine's raw OOM")
