"""A frontend or router that shares the engine's log stream answers requests while the engine starts.

NVIDIA Dynamo's frontend (Rust tracing: `2025-06-10T02:48:30.946Z  INFO http-request{...}: ...`),
llm-d's routing sidecar and inference scheduler (Go: klog's `I0610 ... proxy.go:120] "Handling request"`,
zap's JSON), KServe's `kserve.trace requestId: ...`, a disaggregated prefill/decode proxy, AIBrix's or
production-stack's router, an LMCache server: each is started next to vLLM (one script, one container)
and each takes requests, and logs them, whether or not the engine is up yet; a Python one runs uvicorn,
whose access lines and start-up words (`Application startup complete.`, `Uvicorn running on ...`) are
the same bytes as vLLM's own API server's where vLLM prints them bare (vLLM up to 0.10.0, and from
0.31). None of that is the engine's: only vLLM's own lines (its logger's header, its API server's
process prefix) prove that vLLM's server was up, and so that the engine had started. A start-up OOM
after such a line stays a start-up OOM (here unplaced: no change), never a serving one (runtime_oom,
whose remedy changes the serving flags).
"""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free.\n"
)
START_UP_OOM = (
    "(EngineCore_DP0 pid=99) ERROR 10-27 20:05:10 [core.py:710] EngineCore failed to start.\n"
    "(EngineCore_DP0 pid=99) ERROR 10-27 20:05:10 [core.py:710] " + OOM
)
FRONTEND_REQUESTS = {
    "dynamo-http-span": "2025-06-10T02:48:30.946Z  INFO http-request{method=POST uri=/v1/chat/completions "
    "version=HTTP/1.1}: dynamo_llm::http::service::openai: received request",
    "dynamo-request-id": '2025-06-10T02:48:30.946Z  WARN dynamo_llm::http::service::openai: request_id="3f8a" '
    "model not found",
    "llm-d-klog": 'I0610 02:48:30.946123       1 proxy.go:120] "Handling request" path="/v1/completions" '
    'x-request-id="3f8a"',
    "llm-d-zap-json": '{"level":"info","ts":"2025-06-10T02:48:30.946Z","logger":"proxy","msg":"request received",'
    '"path":"/v1/chat/completions"}',
    "kserve-trace": "2025-06-10 02:48:30.946 1 kserve.trace requestId: 3f8a, preprocess_ms: 1.2, explain_ms: 0, "
    "predict_ms: 3.4, postprocess_ms: 0.1",
    "uvicorn-access-503": 'INFO:     10.0.0.1:5555 - "POST /v1/completions HTTP/1.1" 503 Service Unavailable',
    "uvicorn-access-200": 'INFO:     10.0.0.1:5555 - "POST /v1/completions HTTP/1.1" 200 OK',
    "disagg-proxy": "[2025-06-10 02:48:30,946] INFO proxy: Request 3f8a forwarded to the prefill instance",
    "lmcache-server": "[2025-06-10 02:48:30,946] LMCache INFO: Received request for key 3f8a (server.py:55)",
}
FRONTEND_START = {
    "uvicorn-startup": "INFO:     Application startup complete.",
    "uvicorn-running": "INFO:     Uvicorn running on http://0.0.0.0:8192 (Press CTRL+C to quit)",
}


def _key(log: str) -> tuple[str, str]:
    d = classify(Signals(log=log))
    return d.cause, d.phase


@pytest.mark.parametrize("base", [START_UP_OOM, OOM], ids=["engine-core-failed-to-start", "bare-oom"])
@pytest.mark.parametrize("line", list(FRONTEND_REQUESTS.values()) + list(FRONTEND_START.values()))
def test_a_frontends_request_or_start_line_before_a_start_up_oom_is_no_sign_the_engine_served(line, base):
    assert _key(base) == ("unknown", "unknown")
    assert _key(line + "\n" + base) == ("unknown", "unknown")
    assert _key("\n".join([line] * 3) + "\n" + base) == ("unknown", "unknown")


VLLMS_OWN = {
    "request-logger": "INFO 10-27 20:05:01 [logger.py:39] Received request chatcmpl-3f8a: prompt: 'hi', "
    "params: SamplingParams(n=1)",
    "decorated-request-logger": "(APIServer pid=1) INFO 10-27 20:05:01 [logger.py:39] Received request "
    "chatcmpl-3f8a: prompt: 'hi'",
    "decorated-access": '(APIServer pid=1) INFO:     10.0.0.1:5555 - "POST /v1/completions HTTP/1.1" 200 OK',
    "decorated-startup": "(APIServer pid=1) INFO:     Application startup complete.",
    "vllm-header-startup": "INFO 10-27 20:05:01 [launcher.py:37] Application startup complete.",
}


@pytest.mark.parametrize("line", VLLMS_OWN.values(), ids=VLLMS_OWN.keys())
def test_vllms_own_request_or_start_line_still_says_it_served(line):
    """vLLM's API server listens only once the engine has started: its own lines still place an
    OOM the log does not otherwise place in serving."""
    assert _key(line + "\n" + OOM) == ("runtime_oom", "serving")


def _record(message: str, name: str, process: str = "MainProcess", level: str = "INFO") -> str:
    out = {"asctime": "2026-12-01 10:00:00,123", "levelname": level, "name": name, "processName": process}
    return json.dumps(out | {"process": 7, "message": message})


# A logging config of one's own with a JSON formatter (python-json-logger) on the root logger, where vLLM
# runs in a server's own process (KServe's huggingfaceserver, a Dynamo or Ray worker): that server's
# records are printed in the same JSON, each naming its logger.
FOREIGN_RECORDS = {
    "kserve-trace": _record("requestId: 3f8a, preprocess_ms: 1.2, predict_ms: 3.4", "kserve.trace"),
    "uvicorn-access": _record('10.0.0.1:5555 - "POST /v1/completions HTTP/1.1" 200', "uvicorn.access"),
    "uvicorn-startup": _record("Application startup complete.", "uvicorn.error"),
    "router-request": _record("Request 3f8a routed to the decode instance", "router"),
}


@pytest.mark.parametrize("base", [START_UP_OOM, OOM], ids=["engine-core-failed-to-start", "bare-oom"])
@pytest.mark.parametrize("record", FOREIGN_RECORDS.values(), ids=FOREIGN_RECORDS.keys())
def test_another_programs_json_record_is_no_sign_the_engine_served(record, base):
    """A JSON record is printed with a header like vLLM's own (log_records.py); only a vLLM logger's
    record is vLLM's."""
    assert _key(record + "\n" + base) == ("unknown", "unknown")


def test_vllms_own_json_request_record_still_says_it_served():
    own = _record("Received request cmpl-3f8a: prompt: 'hi'", "vllm.entrypoints.logger", "APIServer")
    assert _key(own + "\n" + OOM) == ("runtime_oom", "serving")


REQUEST_LINES = {k: v for k, v in VLLMS_OWN.items() if "startup" not in k}


@pytest.mark.parametrize("line", REQUEST_LINES.values(), ids=REQUEST_LINES.keys())
@pytest.mark.parametrize("where", ["before", "inside"])
def test_the_engines_own_start_up_failure_outranks_a_request_line(line, where):
    """The engine says it failed while starting (`EngineCore failed to start`): a request line of vLLM's
    own before it (another run's in the same stream, a new engine of an elastic data-parallel server, or
    interleaved with the failing engine's report) is only a sign it served, and the engine's word
    outranks it: the start-up OOM stays unplaced, never runtime_oom."""
    first, second = START_UP_OOM.splitlines(keepends=True)
    log = line + "\n" + START_UP_OOM if where == "before" else first + line + "\n" + second
    assert _key(log) == ("unknown", "unknown")
