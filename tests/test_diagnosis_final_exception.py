"""The engine's last words where no vLLM message names the failure. An exception no row names says
"not memory" only when its message does not say that an allocation failed; one that does (an
accelerator's or a library's own words for it) is `unknown`, since which memory ran out cannot be
told, and never a memory change. A failed status printed on its own line is the failure itself."""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import Signals, classify

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
    diag = classify(Signals(log=_log(*message)))
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
    diag = classify(Signals(log=_log(*message)))
    assert (diag.cause, diag.subtype) == ("not_oom", "other_error")


def test_a_later_log_line_is_not_part_of_the_exceptions_message():
    """Only the exception's own message counts: the engine's next record (here a shutdown notice
    naming memory) is not a further line of it."""
    log = _log("KeyError: 'model.layers.55.mlp.experts.w2_weight_scale_inv'") + (
        "INFO 11-22 10:01:29 [launcher.py:80] Shutting down: freeing memory; allocation failed callbacks run\n"
    )
    assert classify(Signals(log=log)).cause == "not_oom"


def test_a_further_line_that_may_be_a_clients_does_not_move_the_answer():
    """A RuntimeError's message may carry a client's text over lines (a path, a template): its
    further lines name no failure, not even to turn "not memory" into "unknown"."""
    log = _log("RuntimeError: failed to render template:", "  std::bad_alloc ZZUSERZZ")
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
