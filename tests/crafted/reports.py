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


# --- vLLM 0.34 as it serves (vllm/logger.py's formatter: `(APIServer pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] `,
# uvicorn's lines bare), then a crash of the engine's own or a SIGTERM -------------------------------------------
API_034 = "(APIServer pid=1) "


CORE_034 = "(EngineCore pid=181) "


SERVING_034 = [
    API_034 + "INFO 05-02 09:58:01 [utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.34.0",
    API_034 + "INFO 05-02 09:58:05 [model.py:2152] Using max model len 131072",
    CORE_034 + "INFO 05-02 09:58:12 [core.py:101] Initializing a V1 LLM engine (v0.34.0) with config: model='m'",
    CORE_034 + "INFO 05-02 09:58:15 [gpu_model_runner.py:3500] Starting to load model m...",
    CORE_034 + "INFO 05-02 09:58:31 [gpu_model_runner.py:3600] Model loading took 14.99 GiB memory and 15.2 seconds",
    CORE_034 + "INFO 05-02 09:58:45 [gpu_worker.py:400] Available KV cache memory: 104.35 GiB",
    CORE_034 + "INFO 05-02 09:58:45 [kv_cache_utils.py:1160] GPU KV cache size: 854,832 tokens",
    CORE_034 + "INFO 05-02 09:58:45 [kv_cache_utils.py:1170] Maximum concurrency for 131,072 tokens per request: 6.52x",
    CORE_034 + "INFO 05-02 09:58:55 [core.py:280] init engine (profile=True, kv_cache, warmup model) took 40.1 seconds",
    API_034 + "INFO 05-02 09:58:57 [api_server.py:1600] Starting vLLM API server 0 on http://0.0.0.0:8000",
    "INFO:     Application startup complete.",
    'INFO:     10.0.0.5:40112 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]


def _core_fatal(error: str) -> list[str]:
    head = CORE_034 + "ERROR 05-02 10:05:00 [core.py:3089] "
    return [
        head + "EngineCore encountered a fatal error.",
        head + "Traceback (most recent call last):",
        head + '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1250, in step',
        head + "    model_output = self.model_executor.execute_model(scheduler_output)",
        head + error,
        API_034 + "ERROR 05-02 10:05:01 [async_llm.py:957] AsyncLLM output_handler failed.",
    ]


ENDINGS_034 = {
    "illegal-access": _core_fatal("RuntimeError: CUDA error: an illegal memory access was encountered"),
    "runtime-oom": _core_fatal(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of "
        "139.80 GiB of which 1.25 GiB is free."
    ),
    "sigterm": [
        API_034 + "INFO 05-02 10:05:00 [launcher.py:110] Shutting down FastAPI HTTP server.",
        "INFO:     Shutting down",
        "INFO:     Application shutdown complete.",
    ],
}


# Where vLLM 0.34's API server logs a request's exception with its traceback (logger.exception): the exception's
# message may hold the client's text (a chat message the renderer refused, a tool call the parser choked on).
REPORTERS_034 = {
    "stream-generator": ("serving.py", 963, "Error in chat completion stream generator."),
    "inkling-renderer": ("inkling.py", 131, "Error while rendering Inkling chat messages"),
    "mistral-renderer": ("mistral.py", 46, "An error occurred in `mistral_common` while applying chat template"),
}


def served_034(reporter: str, exception_line: str, ending: str) -> str:
    """vLLM 0.34 serving, a request's exception logged by `reporter`, then `ending`."""
    file, line, opening = REPORTERS_034[reporter]
    head = API_034 + f"ERROR 05-02 10:01:00 [{file}:{line}] "
    report = [
        head + opening,
        head + "Traceback (most recent call last):",
        head + '  File "/usr/local/lib/python3.12/dist-packages/vllm/renderers/base.py", line 120, in render',
        head + "    return self._render(messages)",
        head + exception_line,
    ]
    return "\n".join([*SERVING_034, *report, *ENDINGS_034[ending]]) + "\n"
