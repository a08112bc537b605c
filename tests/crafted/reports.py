"""Reports of a request's failure: uvicorn's headerless ASGI report, vLLM's headed report of a request's
error (serving_chat.py), real bases for a client's reports that forge vLLM's header, and a V1 API
server's serving lines (access lines and stats)."""

from __future__ import annotations

from crafted.bases import API, corpus_log, illegal_access_log

# uvicorn's report of a request's unhandled exception: no vLLM header on any line, its exception a chat
# template's error. A newline in the exception's message (a client's template text, any str(e) that holds
# a client's value) starts a line of the client's where an engine line could be: whatever that line opens
# with (`CUDA out of memory`, `OOMKilled`, `SIGKILL`...), it must decide nothing.
ASGI = (
    "ERROR:    Exception in ASGI application\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", line 183, '
    "in create_chat_completion\n"
    "    ) = await self._preprocess_chat(\n"
    "jinja2.exceptions.TemplateError: x\n"
)


# The report with the marker as its exception's message.
CLIENT_ASGI = ASGI.replace("TemplateError: x\n", "TemplateError: ZZUSERZZ\n")


def asgi_with(exception_line: str) -> str:
    """uvicorn's report with `exception_line` for its exception line."""
    return ASGI.replace("jinja2.exceptions.TemplateError: x", exception_line)


def asgi(message: str) -> str:
    """uvicorn's report, its exception's message the client's."""
    return asgi_with("jinja2.exceptions.TemplateError: " + message)


def headed_report(header: str, further: list[str]) -> list[str]:
    """A request's error report as vLLM's NewLineFormatter prints it (serving_chat.py's logger.exception):
    the header on every line, the client's lines of the exception's message after the exception line."""
    opening = [
        "Error in preprocessing prompt inputs",
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", line 183, in '
        "create_chat_completion",
        "    ) = await self._preprocess_chat(",
        "jinja2.exceptions.TemplateError: x",
    ]
    return [header + ln for ln in opening + further]


# Bases for a client's headed reports whose lines forge vLLM's own header (a wrapper's header must not be
# learnt from them): name -> (the base log, the report's header, the header the client forges, how many
# of the client's lines go on after the crash).
V1_CHAT = "(APIServer pid=2320) ERROR 12-01 04:48:07 [serving_chat.py:200] "


V1_FORGED = "ERROR 12-01 04:48:07 [core.py:1233] "


V0_CHAT = "ERROR 02-03 13:14:04 serving_chat.py:200] "


V0_FORGED = "ERROR 02-03 13:14:04 llm_engine.py:1] "


FORGED_BASES = {
    # an engine that died on a shm broadcast timeout while serving (corpus, vLLM V1)
    "shm-timeout": (lambda: corpus_log("notoom-33802-ci-2xh100-shm-timeout"), V1_CHAT, V1_FORGED, 0),
    # an NCCL watchdog timeout under Ray while serving (corpus, vLLM V0's header without brackets)
    "nccl-watchdog": (lambda: corpus_log("neg-2734-llama2-70b-tp8-timeout"), V0_CHAT, V0_FORGED, 0),
    # an illegal memory access with EngineCore's whole headed traceback; the client's reports go on after it
    "illegal-access": (illegal_access_log, V1_CHAT, V1_FORGED, 500),
}


# The API server's stats lines while it serves (V1 per engine and aggregated, V0): no sign that a
# server came up.
V1_STATS = {
    "per-engine": "Engine 000: Avg prompt throughput: 700.0 tokens/s, Avg generation throughput: 12.0 tokens/s, "
    "Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.9%, Prefix cache hit rate: 0.0%",
    "aggregated": "2 Engines Aggregated: Avg prompt throughput: 700.0 tokens/s, Avg generation throughput: 12.0 "
    "tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.9%, Prefix cache hit rate: 0.0%",
}


V0_STATS = (
    "Avg prompt throughput: 700.0 tokens/s, Avg generation throughput: 12.0 tokens/s, Running: 2 reqs, Swapped: 0 "
    "reqs, Pending: 0 reqs, GPU KV cache usage: 1.9%, CPU KV cache usage: 0.0%."
)


STATS = V1_STATS["per-engine"]


def serving_minute(stats: str) -> str:
    """A minute of a V1 server's serving, as its API server logs it: access lines and the stats line every 10 s."""
    out = []
    for i in range(6):
        out.append(API + f'INFO:     127.0.0.1:{52100 + i} - "POST /v1/completions HTTP/1.1" 200 OK\n')
        out.append(API + f"INFO 12-01 04:48:{10 + i:02d} [loggers.py:257] {stats}\n")
    return "".join(out)
