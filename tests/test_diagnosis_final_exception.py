"""The engine's last words where no vLLM message names the failure. An exception no row names says
"not memory" only when its message does not say that an allocation failed; one that does (an
accelerator's or a library's own words for it) is `unknown`, since which memory ran out cannot be
told, and never a memory change. A failed status printed on its own line is the failure itself."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import TRACEBACK, startup_failure, vllm_log
from crafted.exceptions import CHAT
from crafted.reports import ASGI
from crafted.request_logging import ACCESS_LINE


@pytest.mark.parametrize(
    "message",
    [
        # (words of failed allocations that no row places in a phase)
        ("RuntimeError: NPU function error: aclrtMalloc, error code is 207001 [Error]: Failed to allocate memory.",),
        ("RuntimeError: CUDNN_BACKEND_TENSOR_DESCRIPTOR cudnnFinalize failed: unable to allocate workspace",),
        ("RuntimeError: external allocator: allocation failed (size 2147483648)",),
        # the allocation's failure on a further line of an engine's report (torch's DistBackendError)
        (
            "torch.distributed.DistBackendError: communicator setup failed",
            "workspace allocation failed (2147483648 bytes)",
        ),
    ],
)
def test_an_unplaced_allocation_failure_is_not_called_not_memory(message):
    diag = classify(Signals(log=startup_failure(*message)))
    assert diag.cause == "unknown"
    assert diag.subtype == "allocation_failure_unplaced"
    assert diag.evidence and diag.evidence[-1].endswith(message[-1])  # the words that named it


@pytest.mark.parametrize(
    "message",
    [
        ("RuntimeError: size mismatch, got input (512), mat (512x512), vec (0)",),
        ("KeyError: 'model.layers.55.mlp.experts.w2_weight_scale_inv'",),
        ("ValueError: The input size is not aligned with the quantized weight shape.",),
    ],
)
def test_any_other_unnamed_exception_is_not_memory(message):
    diag = classify(Signals(log=startup_failure(*message)))
    assert (diag.cause, diag.subtype) == ("not_oom", "other_error")


def test_a_later_log_line_is_not_part_of_the_exceptions_message():
    """Only the exception's own message counts: the engine's next record (here a shutdown notice
    naming memory) is not a further line of it."""
    log = startup_failure("KeyError: 'model.layers.55.mlp.experts.w2_weight_scale_inv'") + (
        "INFO 11-22 10:01:29 [launcher.py:80] Shutting down: freeing memory; allocation failed callbacks run\n"
    )
    assert classify(Signals(log=log)).cause == "not_oom"


def test_a_further_line_that_may_be_a_clients_does_not_move_the_answer():
    """A RuntimeError's message may carry a client's text over lines (a path, a template): its
    further lines name no failure, not even to turn "not memory" into "unknown"."""
    log = startup_failure("RuntimeError: failed to render template:", "  std::bad_alloc ZZUSERZZ")
    diag = classify(Signals(log=log))
    assert (diag.cause, diag.subtype) == ("not_oom", "other_error")
    assert "ZZUSERZZ" not in " ".join(diag.evidence)


def test_xlas_status_on_its_own_line_is_the_failure_not_a_quote():
    """absl/XLA print a failed status as `RESOURCE_EXHAUSTED: <message>`: the status name is the
    failure (the out-of-memory row's own word), not an exception type quoting one."""
    line = (
        "RESOURCE_EXHAUSTED: Error loading program 'jit__multi_slice': Attempting to reserve 6.14G at the "
        "bottom of memory. That was not possible.\n"
    )
    assert classify(Signals(log=line)).subtype == "oom_phase_unknown"  # an OOM; where, the line does not say
    assert classify(Signals(log=line, ready_before=True)).cause == "runtime_oom"


CUT = TRACEBACK  # the engine's traceback, cut before its error line: what failed is not shown


REQUEST_REPORT = (
    "ERROR:    Exception in ASGI application\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.11/site-packages/uvicorn/protocols/http/httptools_impl.py", line 409, '
    "in run_asgi\n"
    "    result = await app(  # type: ignore[func-returns-value]\n"
    '  File "/usr/local/lib/python3.11/site-packages/vllm/entrypoints/openai/serving_chat.py", line 201, '
    "in create_chat_completion\n"
    "    raise TemplateError(message)\n"
    "jinja2.exceptions.TemplateError: ZZUSERZZ\n"
)


def test_a_requests_report_never_says_not_memory_for_the_engine():
    """A request's exception (its report, which a client can cause at will) after an engine failure the
    log does not name: the crash stays `unknown`, as without the report, and nothing of it is quoted."""
    alone = classify(Signals(log=CUT))
    crafted = classify(Signals(log=CUT + REQUEST_REPORT))
    assert (crafted.cause, crafted.subtype) == (alone.cause, alone.subtype) == ("unknown", "traceback_without_error")
    assert "ZZUSERZZ" not in " ".join(crafted.evidence)


def test_a_bare_error_word_in_a_message_is_no_exception_type():
    """`Failed to load model with Error: unable to mmap ...: Cannot allocate memory`: the bare word `Error`
    names no exception, so the host's allocation failure in the message still counts."""
    line = (
        "Failed to load model with Error: unable to mmap 4965799096 bytes from file "
        "<model-00001-of-00002.safetensors>: Cannot allocate memory\n"
    )
    assert classify(Signals(log=line)).cause == "host_ram_oom"


ALLOC = "RuntimeError: NPU function error: aclrtMalloc, error code is 207001 [Error]: Failed to allocate memory."


def _said(log: str, **kwargs) -> tuple[str, str | None]:
    d = classify(Signals(log=log, **kwargs))
    return d.cause, d.subtype


# --- An exception of a type that carries no failure quotes what it was given --------------------
# EngineCore's busy loop dies on a KeyError of the multimodal cache (vllm#17284's shape), the key being a
# client-supplied multimodal uuid (vllm#55547: the uuid is the cache key verbatim). KeyError prints repr(key):
# one line, any text the client chose.
EC = "(EngineCore_DP0 pid=245) ERROR 04-19 17:04:00 [core.py:387] "


def _mm_cache_key_error(key: str) -> str:
    return (
        vllm_log(
            EC,
            "EngineCore hit an exception: Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.12/site-packages/cachetools/__init__.py", line 68, in __getitem__\n'
            "    return self.__data[key]\n"
            "           ~~~~~~~~~~~^^^^^\n"
            f"KeyError: {key!r}\n"
            "\n"
            "During handling of the above exception, another exception occurred:\n"
            "\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 380, in run_engine_core\n'
            "    engine_core.run_busy_loop()\n"
            '  File "/usr/lib/python3.12/site-packages/cachetools/__init__.py", line 97, in __missing__\n'
            "    raise KeyError(key)\n"
            f"KeyError: {key!r}",
        )
        + "\n"
    )


CLIENT_KEYS = {
    "unable": "img-1 unable to allocate ZZUSERZZ",
    "failed": "img-1 Failed to allocate memory ZZUSERZZ",
    "enomem": "img-1 ENOMEM ZZUSERZZ",
    "torch-words": "img-1 CUDA out of memory. Tried to allocate 64.00 GiB ZZUSERZZ",
}


def test_the_base_of_finding_1_is_not_memory():
    assert _said(_mm_cache_key_error("img-1")) == ("not_oom", "other_error")


@pytest.mark.parametrize("key", sorted(CLIENT_KEYS))
def test_an_exception_of_another_type_quoting_allocation_words_stays_not_memory(key):
    assert _said(_mm_cache_key_error(CLIENT_KEYS[key])) == ("not_oom", "other_error")


# --- A request's report after the crash hides the engine's allocation failure ------------------
V0_ENGINE = (
    vllm_log(
        "ERROR 11-22 10:01:28 async_llm_engine.py:61] ",
        "Engine background task failed\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.10/dist-packages/vllm/engine/async_llm_engine.py", line 51, in '
        "_log_task_completion\n    return_value = task.result()\n"
        '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/model_runner.py", line 1546, in execute_model\n'
        "    hidden_or_intermediate_states = model_executable(\n" + ALLOC,
    )
    + "\n"
)


# What uvicorn prints for each in-flight stream when V0's background loop died: the engine's own error,
# chained under AsyncEngineDeadError (a wrapper, skipped by final_exception).
V0_IN_FLIGHT = (
    "ERROR:    Exception in ASGI application\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.10/dist-packages/vllm/engine/async_llm_engine.py", line 51, in '
    "_log_task_completion\n"
    "    return_value = task.result()\n" + ALLOC + "\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.10/dist-packages/starlette/responses.py", line 250, in stream_response\n'
    "    async for chunk in self.body_iterator:\n"
    '  File "/usr/local/lib/python3.10/dist-packages/vllm/engine/async_llm_engine.py", line 65, in '
    "_log_task_completion\n"
    "    raise AsyncEngineDeadError(\n"
    "vllm.engine.async_llm_engine.AsyncEngineDeadError: Task finished unexpectedly. This should never happen! "
    "Please open an issue on Github. See stack trace above for the actual cause.\n"
)


AFTER_THE_CRASH = {
    "v0-in-flight-stream": V0_IN_FLIGHT,
    "client-request-error": ASGI.replace("TemplateError: x", "TemplateError: ZZUSERZZ"),
}


def test_the_base_of_finding_2_is_unknown():
    assert _said(ACCESS_LINE + V0_ENGINE) == ("unknown", "allocation_failure_unplaced")


@pytest.mark.parametrize("after", sorted(AFTER_THE_CRASH))
def test_a_requests_report_after_the_crash_does_not_hide_the_engines_allocation_failure(after):
    crafted = classify(Signals(log=ACCESS_LINE + V0_ENGINE + AFTER_THE_CRASH[after]))
    assert (crafted.cause, crafted.subtype) == ("unknown", "allocation_failure_unplaced")
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- Another process's line inside the engine's message ------------------------------------------
W = "(Worker_TP0 pid=77) ERROR 11-22 10:01:28 [multiproc_executor.py:527] "


WORKER_NCCL = [
    W + "WorkerProc hit an exception.",
    W + "Traceback (most recent call last):",
    W + '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", line 1, in init_device',
    W + "    init_worker_distributed_environment()",
    W + "torch.distributed.DistBackendError: communicator setup failed",
    W + "workspace allocation failed (2147483648 bytes)",
]


BETWEEN = {
    "request-logger": "(APIServer pid=7) INFO 11-22 10:01:28 [logger.py:41] Received request cmpl-a1: "
    "params: SamplingParams(n=1), lora_request: None.",
    "access-line": '(APIServer pid=7) INFO:     127.0.0.1:40112 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "engine-core-info": "(EngineCore_DP0 pid=5) INFO 11-22 10:01:28 [core.py:1] Batch queue is full",
}


def test_the_base_of_finding_3_is_unknown():
    assert _said("\n".join(WORKER_NCCL) + "\n") == ("unknown", "allocation_failure_unplaced")


@pytest.mark.xfail(
    strict=True,
    reason="a line of another process between an ENGINE_REPORT's exception line and "
    "its further line ends the message (mark_continuations); the engine's 'allocation failed' line is "
    "dropped: unknown -> not_oom other_error",
)
@pytest.mark.parametrize("between", sorted(BETWEEN))
def test_another_processs_line_inside_the_engines_message_does_not_drop_its_further_line(between):
    lines = WORKER_NCCL[:5] + [BETWEEN[between]] + WORKER_NCCL[5:]
    assert _said("\n".join(lines) + "\n") == ("unknown", "allocation_failure_unplaced")


# --- What holds, pinned ---------------------------------------------------------------------------------
KEY = "KeyError: 'model.layers.55.mlp.experts.w2_weight_scale_inv'"


NOTHING_MOVES = {
    "asgi-report-of-a-request": ASGI.replace(
        "jinja2.exceptions.TemplateError: x", "RuntimeError: Failed to allocate memory ZZUSERZZ"
    ),
    "serving-chat-traceback": vllm_log(
        CHAT,
        "Error in preprocessing prompt inputs\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", line 183, in '
        "create_chat_completion\n    x()\njinja2.exceptions.TemplateError: Failed to allocate memory ZZUSERZZ",
    ),
    "grammar-report": vllm_log(
        "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:08 [core.py:710] ",
        "EngineCore encountered a fatal error.\nTraceback (most recent call last):\n"
        '  File "/usr/lib/python3.12/site-packages/vllm/v1/structured_output/backend_xgrammar.py", line 90, in '
        "compile_grammar\n    ctx = self.compiler.compile_json_schema(\n"
        "RuntimeError: [10:00:00] xgrammar/cpp/json_schema_converter.cc:1: unable to allocate ZZUSERZZ",
    ),
    "request-logger": "(APIServer pid=7) INFO 11-22 10:01:28 [logger.py:41] Received request cmpl-a1: prompt: "
    "'RuntimeError: Failed to allocate memory ZZUSERZZ', params: SamplingParams(n=1), lora_request: None.",
    "warning-value": vllm_log(
        "(EngineCore_DP0 pid=2441) WARNING 12-01 04:48:08 [scheduler.py:1763] ",
        "Encoder cache entry for multimodal identifier 'a\nRuntimeError: Failed to allocate memory ZZUSERZZ' "
        "holds 5 embeddings",
    ),
}


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("extra", sorted(NOTHING_MOVES))
def test_a_requests_or_values_allocation_words_do_not_make_the_crash_unknown(extra, where):
    base = startup_failure(KEY)
    log = base + NOTHING_MOVES[extra] + "\n" if where == "after" else NOTHING_MOVES[extra] + "\n" + base
    d = classify(Signals(log=log))
    assert (d.cause, d.subtype) == ("not_oom", "other_error")
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


@pytest.mark.parametrize(
    "message",
    [
        # Ray's placement-group shortage (kuberay#4366): no failed allocation of memory
        ("ValueError: Not enough resources to allocate 2 placement groups, only created 1 placement groups.",),
        # gRPC's message-size limit: RESOURCE_EXHAUSTED on a further line of a type that is no engine report
        (
            "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:",
            "\tstatus = StatusCode.RESOURCE_EXHAUSTED",
            '\tdetails = "Received message larger than max (210771146 vs. 104857600)"',
        ),
        # the same words on a further line of a RuntimeError (not the engine's own report): moves nothing
        (
            "RuntimeError: HCCL function error: HcclCommInitRootInfo, error code is 7",
            "Possible Cause: Failed to allocate memory or the Notify register due to resource insufficiency.",
        ),
    ],
    ids=["ray-placement-group", "grpc-message-size", "hccl-possible-cause"],
)
def test_real_non_memory_failures_with_allocation_words_stay_not_memory(message):
    assert _said(startup_failure(*message)) == ("not_oom", "other_error")


def _engine_report(at: int) -> str:
    further = ["NCCL communicator setup detail line"] * 25
    further[at - 1] = "workspace allocation failed (2147483648 bytes)"
    return startup_failure("torch.distributed.DistBackendError: communicator setup failed", *further)


def test_the_message_window_is_bounded():
    """MESSAGE_LINES further lines are read (the 20th counts), none after them (the 21st does not)."""
    assert _said(_engine_report(20)) == ("unknown", "allocation_failure_unplaced")
    assert _said(_engine_report(21)) == ("not_oom", "other_error")
