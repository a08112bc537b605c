"""vLLM's request and response logger (prompts, outputs, stop strings), uvicorn's access lines, and the
lines vLLM's engine writes with a request id or another value the client chose, each a function of the
client's text; `inject` puts a prompt and its access line into a real log."""

from __future__ import annotations

from crafted.bases import API, ENGINE_CORE, vllm_log

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


ACCESS_LINE = 'INFO:     10.0.0.5:40112 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'


def inject(log: str, quote: str, fmt: str, where: str) -> str:
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


# Request ids in lines the engine writes: vLLM 0.32's own formats (site-packages/vllm). The request id is the client's X-Request-Id header
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


# A request id holding a memory failure.
OOM_IN_REQUEST_ID = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ"


# name -> the line for a client value: engine lines that carry a request id or a client-chosen value
CLIENT_ID_LINES = {
    # core.py:2056 logger.exception (ERROR, EngineCore): "pre-processing request" is no request-id form
    "preprocessing-error": lambda p: (
        ENGINE_CORE
        + "ERROR 12-01 04:48:08 [core.py:2056] Unexpected error pre-processing request cmpl-"
        + p
        + "-0-1a2b3c4d"
    ),
    # scheduler.py:1763 (WARNING): "but request %s input" and a client-chosen multimodal UUID (%r)
    "encoder-cache-request": lambda p: (
        ENGINE_CORE + "WARNING 12-01 04:48:08 [scheduler.py:1763] Encoder cache entry for "
        "multimodal identifier 'u1' holds 5 embeddings, but request cmpl-" + p + "-0-1a2b input 0 expects 7. A "
        "client-provided multimodal UUID may have been reused for different content."
    ),
    "encoder-cache-uuid": lambda p: (
        ENGINE_CORE + "WARNING 12-01 04:48:08 [scheduler.py:1763] Encoder cache entry for "
        "multimodal identifier " + repr(p) + " holds 5 embeddings, but request cmpl-a-0-1a2b input 0 expects 7. A "
        "client-provided multimodal UUID may have been reused for different content."
    ),
    # multi-line ids in messages the classifier does not list as a client's (their first line is the
    # client's, the rest is not)
    "http-exception": lambda p: vllm_log(
        "(APIServer pid=2320) ERROR 12-01 04:48:09 [http.py:18] ", "HTTPException caught. Request id: chatcmpl-a\n" + p
    ),
    "validation-error": lambda p: vllm_log(
        "(APIServer pid=2320) ERROR 12-01 04:48:09 [validation.py:151] ",
        "RequestValidationError caught. Request id: chatcmpl-a\n" + p,
    ),
    "grammar-rejected": lambda p: vllm_log(
        ENGINE_CORE + "ERROR 12-01 04:48:08 [scheduler.py:2190] ",
        "Unexpected: grammar rejected tokens [1, 2] for request chatcmpl-a\n" + p + "-0-1a2b. Terminating request.",
    ),
    "fsm-advance": lambda p: vllm_log(
        ENGINE_CORE + "ERROR 12-01 04:48:08 [backend_xgrammar.py:201] ",
        "Failed to advance FSM for request chatcmpl-a\n" + p + "-0-1a2b for tokens 5. Please file an issue.",
    ),
    "detokenizer": lambda p: vllm_log(
        "(APIServer pid=2320) WARNING 12-01 04:48:08 [detokenizer.py:250] ",
        "Encountered invalid prefix detokenization error for request chatcmpl-a\n"
        + p
        + "-0-1a2b, resetting decode stream.",
    ),
}


def realtime_validation_error(value: str) -> str:
    """A realtime (speech-to-text) websocket event that fails pydantic validation: pydantic's message
    repeats the client's value (input_value=...), and logger.exception adds the traceback."""
    detail = (
        "1 validation error for InputAudioBufferAppend\naudio\n  Input should be a valid string "
        f"[type=string_type, input_value=[{value!r}], input_type=list]\n"
        "    For further information visit https://errors.pydantic.dev/2.11/v/string_type"
    )
    return vllm_log(
        API + "ERROR 12-01 04:48:08 [connection.py:77] ",
        f"Error handling event: {detail}\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/speech_to_text/realtime/connection.py", '
        "line 73, in handle_connection\n    await self.handle_event(event)\n"
        f"pydantic_core._pydantic_core.ValidationError: {detail}",
    )


# name -> (level the line is logged at, the line for a client value): vLLM 0.32 lines that carry a
# request id or another client value without any "request <id>" form
LEVELED_CLIENT_LINES = {
    # distributed/kv_transfer/kv_connector/v1/lmcache_integration/vllm_v1_adapter.py:1227 (INFO, EngineCore):
    # "Reqid: %s, Total tokens %d, ..." with the request id (X-Request-Id + vLLM's suffix)
    "lmcache-reqid": (
        "INFO",
        lambda p: (
            ENGINE_CORE + "INFO 12-01 04:48:08 [vllm_v1_adapter.py:1227] Reqid: cmpl-" + p + "-0-1a2b, "
            "Total tokens 12, LMCache hit tokens: 0, need to load: 0"
        ),
    ),
    # distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_connector.py:729 and :442 (INFO, EngineCore)
    "hf3fs-token-matching": (
        "INFO",
        lambda p: (
            ENGINE_CORE + "INFO 12-01 04:48:08 [hf3fs_connector.py:729] Token matching for cmpl-" + p + "-0-1a2b: "
            "5 matched (1 blocks), 0 new hits, prompt len 12"
        ),
    ),
    "hf3fs-blocks": (
        "INFO",
        lambda p: (
            ENGINE_CORE + "INFO 12-01 04:48:08 [hf3fs_connector.py:442] load cmpl-" + p + "-0-1a2b: 3 blocks in 0.01s"
        ),
    ),
    # v1/core/sched/scheduler.py:3182 (DEBUG, EngineCore): the id opens the line
    "remote-kvs": (
        "DEBUG",
        lambda p: (
            ENGINE_CORE + "DEBUG 12-01 04:48:08 [scheduler.py:3182] cmpl-" + p + "-0-1a2b is still in "
            "WAITING_FOR_REMOTE_KVS state."
        ),
    ),
    # tokenizers/mistral.py:94 (WARNING): an assistant message's tool call id (any length > 9)
    "mistral-tool-call-id": (
        "WARNING",
        lambda p: API + "WARNING 12-01 04:48:08 [mistral.py:94] Truncating tool call ID: " + p + " to " + p[-9:],
    ),
    # parser/mistral.py:518 (WARNING): tool_choice's function name, %r
    "mistral-named-tool": (
        "WARNING",
        lambda p: (
            API + "WARNING 12-01 04:48:08 [mistral.py:518] Named tool " + repr(p) + " not found in tools "
            "list; skipping guided schema injection."
        ),
    ),
    # tool_parsers/utils.py:587 (WARNING, header `utils.py`): ast.dump of the model's tool call, text a
    # prompt steers
    "tool-call-ast": (
        "WARNING",
        lambda p: (
            API + "WARNING 12-01 04:48:08 [utils.py:587] Unsupported AST node type in tool call "
            "arguments: BinOp(left=Constant(value=" + repr(p) + "), op=Add(), right=Constant(value=1))"
        ),
    ),
    # parser/engine/parser_engine.py:1033 (DEBUG): the first 80 characters of a tool call's arguments
    "arg-converter": (
        "DEBUG",
        lambda p: API + "DEBUG 12-01 04:48:08 [parser_engine.py:1033] arg converter failed (streaming): " + p[:80],
    ),
    # entrypoints/openai/responses/utils.py:382 and :361 (WARNING): a Responses API input item's id
    "responses-summary-item": (
        "WARNING",
        lambda p: (
            API
            + "WARNING 12-01 04:48:08 [utils.py:382] Using summary text as reasoning content for item "
            + p
            + ". Please use content instead of summary for reasoning items."
        ),
    ),
    "responses-tool-call-id": (
        "WARNING",
        lambda p: (
            API + "WARNING 12-01 04:48:08 [utils.py:361] Previous assistant message has unknown tool_calls "
            "format. Tool call merging is skipped and a new assistant message is created. Call " + p
        ),
    ),
    # renderers/params.py:324 (WARNING): the request's `truncation` value in a dict repr
    "tokenization-kwargs": (
        "WARNING",
        lambda p: (
            API + "WARNING 12-01 04:48:08 [params.py:324] The following tokenization arguments are not "
            "supported by vLLM Renderer and will be ignored: {'truncation': " + repr(p) + "}"
        ),
    ),
    # entrypoints/serve/exception_handling/error_response.py:24 (DEBUG): every error response's text
    "error-response": (
        "DEBUG",
        lambda p: (
            API + "DEBUG 12-01 04:48:08 [error_response.py:24] create_error_response called with "
            "NotFoundError: The model `" + p + "` does not exist."
        ),
    ),
    # distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py:1767 (ERROR, EngineCore):
    # "req %s: ..." (the decode side's request id, from kv_transfer_params)
    "mooncake-group-mismatch": (
        "ERROR",
        lambda p: (
            ENGINE_CORE + "ERROR 12-01 04:48:08 [mooncake_connector.py:1767] req cmpl-" + p + "-0-1a2b: KV group "
            "count mismatch: local=1, remote=2"
        ),
    ),
    # .../mooncake/store/worker.py:2436 (ERROR): "Async Mooncake lookup failed for %s: %s"
    "mooncake-lookup": (
        "ERROR",
        lambda p: (
            ENGINE_CORE
            + "ERROR 12-01 04:48:08 [worker.py:2436] Async Mooncake lookup failed for cmpl-"
            + p
            + "-0-1a2b: timeout"
        ),
    ),
    # .../moriio/moriio_connector.py:2791 (ERROR): "RDMA read TIMED OUT for req %s after ..."
    "moriio-rdma-timeout": (
        "ERROR",
        lambda p: (
            ENGINE_CORE
            + "ERROR 12-01 04:48:08 [moriio_connector.py:2791] RDMA read TIMED OUT for req cmpl-"
            + p
            + "-0-1a2b after 30.0s (kv_connector_extra_config.recv_abort_timeout=30)"
        ),
    ),
    # .../nixl/push_worker.py:371 (ERROR): "... cannot send registration for %s"
    "nixl-push-registration": (
        "ERROR",
        lambda p: (
            ENGINE_CORE + "ERROR 12-01 04:48:08 [push_worker.py:371] No remote agents for engine e1; cannot send "
            "registration for cmpl-" + p + "-0-1a2b"
        ),
    ),
    # entrypoints/speech_to_text/realtime/connection.py:77 (ERROR, logger.exception): pydantic's message
    "realtime-validation": ("ERROR", realtime_validation_error),
}
