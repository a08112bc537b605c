"""A request's text inside the engine's own exceptions is still the request's: a chained traceback, a
request's report inside a worker's, the engine quoting a client's value on its exception line or after
Ray's or NCCL's exception names names no memory failure, and the real failure around it still decides."""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import BASE, BASES, OOM, real_log, vllm_log, with_lines
from crafted.checks import assert_reads_like, said
from crafted.exceptions import REAL_MULTILINE, WORKER_HEADER, WORKER_TRACEBACK
from crafted.grammar import SITE, grammar_traceback
from crafted.reports import ASGI

# --- The engine's own exception carries a request's text ------------------------------------
EC = "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:09 [core.py:710] "


def _grammar_crash(begin: str) -> str:
    """V1 EngineCore dies compiling a request's structured-output grammar (the backend latched by an
    earlier request is not the one the request was validated for: vLLM #43920); guidance's
    serialize_guidance_grammar names the client's structural-tag `begin` with str()."""
    return vllm_log(EC, "EngineCore encountered a fatal error.\n" + grammar_traceback(begin))


@pytest.mark.parametrize("base_name", BASES + ["model-not-found.log"])
def test_a_requests_text_in_the_engines_own_exception_is_not_the_engines_words(base_name):
    """Unfixed: neg-2734 not_oom nccl_timeout -> runtime_oom, memory-limit-kill host_ram_oom worker_sigkill
    -> runtime_oom, model-not-found not_oom -> runtime_oom, each quoting `torch.OutOfMemoryError: ... ZZUSERZZ
    not found in triggers ['<tool_call>']` with tried_gib 64: the EngineCore's ValueError carries failures,
    so every further line of its message is `engine_message`. It should say what the same crash with a
    harmless `begin` says: a further line of an exception's message may hold what the exception quotes
    (the engine's memory failures that do go on over lines - NCCL's `Last error:` - can be named)."""
    base_log = real_log(base_name)
    assert_reads_like(
        with_lines(base_log, _grammar_crash("<fn\n" + OOM), "middle"),
        with_lines(base_log, _grammar_crash("<fn\nhello"), "middle"),
        "grammar",
    )


# --- The first traceback of a chained request traceback -------------------------------------
def _chained_asgi(exception_line: str) -> str:
    """uvicorn's request traceback of a chained exception: the cause first, in a traceback that starts
    where it was caught (chat_utils.apply_hf_chat_template re-raises `ValueError(str(e)) from e`)."""
    return (
        "ERROR:    Exception in ASGI application\n"
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/entrypoints/chat_utils.py", line 1501, in apply_hf_chat_template\n'
        "    return tokenizer.apply_chat_template(\n"
        '  File "/usr/local/lib/python3.12/dist-packages/transformers/tokenization_utils_base.py", line 1640, '
        "in apply_chat_template\n"
        "    rendered_chat = compiled_template.render(\n"
        f"{exception_line}\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/uvicorn/protocols/http/httptools_impl.py", line 409, '
        "in run_asgi\n"
        "    result = await app(\n"
        f'  File "{SITE}/entrypoints/openai/serving_chat.py", line 183, in create_chat_completion\n'
        "    ) = await self._preprocess_chat(\n"
        "ValueError: x\n"
    )


@pytest.mark.parametrize("exception_type", ["ValueError", "RuntimeError"])
@pytest.mark.parametrize("base_name", BASES)
def test_the_cause_printed_first_in_a_requests_chained_traceback_is_the_requests(base_name, exception_type):
    """Unfixed: neg-2734 not_oom nccl_timeout -> runtime_oom, memory-limit-kill host_ram_oom -> runtime_oom,
    quoting the client's `torch.OutOfMemoryError: ... ZZUSERZZ` with tried_gib 64. The `Traceback` line right
    after `Exception in ASGI application` resets `in_request`, and the cause's frames name no request
    module. It should say what the same traceback with a harmless line says (as it does for a
    TemplateError there, a type that carries no failure)."""
    base_log = real_log(base_name)
    assert_reads_like(
        with_lines(base_log, _chained_asgi(f"{exception_type}: a\n{OOM}"), "middle"),
        with_lines(base_log, _chained_asgi(f"{exception_type}: a\nhello"), "middle"),
        exception_type,
    )


# --- One `in_request` flag for all writers ------------------------------------------------
API = "(APIServer pid=7) ERROR 12-01 04:48:08 [serving_chat.py:1200] "


STREAM_ERROR = vllm_log(
    API,
    "Error in chat completion stream generator.\nTraceback (most recent call last):\n"
    f'  File "{SITE}/entrypoints/openai/serving_chat.py", line 1150, in chat_completion_stream_generator\n'
    "    async for res in result_generator:\n"
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
    "the root cause.",
).splitlines()


def test_an_api_servers_request_traceback_inside_a_workers_keeps_the_workers_nccl_oom():
    """Unfixed: multi_gpu_oom nccl_cuda_oom -> unknown wrapper_without_cause. The API server's request error
    (its own header, a serving_chat.py frame) written between the worker's `Traceback` line and its frames
    sets `in_request` for the worker's traceback too, so its NCCL exception's `Last error:` / `Cuda failure
    'out of memory'` lines are a request's. (Without the request frame the same interleaving reads
    multi_gpu_oom.) It should say multi_gpu_oom: a request's traceback is its writer's."""
    lines, cause = REAL_MULTILINE["nccl-last-error"]
    worker = [WORKER_HEADER + line for line in WORKER_TRACEBACK + lines]
    log = "\n".join(worker[:3] + STREAM_ERROR + worker[3:]) + "\n"
    d = classify(Signals(log=log))
    assert d.cause == cause, f"said {said(d)}; should say {cause} (the worker's NCCL out of memory)"


def test_a_request_traceback_that_ended_before_the_workers_leaves_its_nccl_oom():
    """A whole request traceback before the worker's (a `Traceback` line between them)."""
    lines, cause = REAL_MULTILINE["nccl-last-error"]
    log = (
        "\n".join(STREAM_ERROR + ASGI.splitlines() + [WORKER_HEADER + line for line in WORKER_TRACEBACK + lines]) + "\n"
    )
    assert classify(Signals(log=log)).cause == cause


# (The engine's report on compiling a request's grammar, a traceback through
# vLLM's structured_output code, is the request's text from the first line on: findings.GRAMMAR_FRAME.)
@pytest.mark.parametrize("base_name", BASES)
def test_a_forged_frame_inside_the_engines_exception_quoting_a_request_ends_nothing(base_name):
    base_log = real_log(base_name)
    frame = '  File "/usr/lib/python3.12/x.py", line 1, in f'
    assert_reads_like(
        with_lines(base_log, _grammar_crash("<fn\n" + frame + "\n" + OOM), "middle"),
        with_lines(base_log, _grammar_crash("<fn\n" + frame + "\nhello"), "middle"),
        "grammar-forged-frame",
    )


# --- A client's text on the first line of the engine's own exception ------------------------
FIRST_LINE = {
    # rows a client's text must not turn into a memory cause (the base: not_oom nccl_timeout)
    "pt-devmem": "MODULE:PT_DEVMEM Allocation failed for size::9395240960 (8960)MB ZZUSERZZ",
    "nccl-calloc": "Failed to CUDA calloc 4194304 bytes ZZUSERZZ",
    "negative-gpu-blocks": "# GPU blocks: -204 ZZUSERZZ",
    "cpu-auto-kv": "Available memory on node 0 (12.0/125.72 GiB) on kv cache allocation is less than requested "
    "memory for kv (98.5/115.66 GiB) ZZUSERZZ",
    "cpu-auto-kv-nonpositive": "Available memory on node 0 (60.02/125.72 GiB) on kv cache allocation is less than "
    "requested memory for kv (-3.41/57.86 GiB) ZZUSERZZ",
    # more rows of the same kind
    "torch-oom-older": "CUDA out of memory. Tried to allocate 64.00 GiB ZZUSERZZ",
    "external-weights-older": "Externally held weights on device cuda:0 (75.3/79.19 GiB) exceed the desired GPU "
    "memory utilization (0.92, 72.86 GiB) ZZUSERZZ",
}


@pytest.mark.parametrize("payload", sorted(FIRST_LINE))
def test_a_clients_text_on_an_engine_exceptions_first_line_names_no_memory_failure(payload):
    """Unfixed: neg-2734 not_oom nccl_timeout -> runtime_oom (pt-devmem), multi_gpu_oom (nccl-calloc),
    kv_cache_insufficient (negative-gpu-blocks, cpu-auto-kv-nonpositive), gpu_util_exceeds_free with the
    client's free_gib 12.0 / total_gib 125.72 / requested_gib 98.5 (cpu-auto-kv), each quoting `ValueError:
    Trigger <client text> not found in triggers` as evidence. It should say what the same crash with a harmless `begin` says."""
    base_log = real_log(BASE)
    assert_reads_like(
        with_lines(base_log, _grammar_crash(FIRST_LINE[payload]), "middle"),
        with_lines(base_log, _grammar_crash("hello"), "middle"),
        payload,
    )


# --- ENGINE_REPORT searched anywhere in the line --------------------------------------------------
@pytest.mark.parametrize("name", ["RayActorError", "ActorDiedError", "NCCL error"])
def test_a_ray_exception_name_in_a_clients_text_does_not_make_its_next_lines_the_engines(name):
    """Unfixed: not_oom nccl_timeout -> runtime_oom oom_in_serving quoting `torch.OutOfMemoryError: ...
    ZZUSERZZ not found in triggers` with tried_gib 64 (RayActorError, ActorDiedError, `NCCL error`). ENGINE_REPORT.search finds the name in the client's
    `begin` on the exception line, so the line after it is `engine_message`. It should say what the same
    crash with a harmless `begin` says: only the exception's own type names an engine report."""
    base_log = real_log(BASE)
    assert_reads_like(
        with_lines(base_log, _grammar_crash("<fn " + name + "\n" + OOM), "middle"),
        with_lines(base_log, _grammar_crash("<fn " + name + "\nhello"), "middle"),
        name,
    )


RAY_GET = (
    "EngineCore failed to start.\nTraceback (most recent call last):\n"
    f'  File "{SITE}/vllm/v1/executor/ray_distributed_executor.py", line 378, in _run_workers\n'
    "    ray_worker_outputs = ray.get(ray_worker_outputs)\n"
    f'  File "{SITE}/ray/_private/worker.py", line 873, in get_objects\n    raise value\n'
)


ACTOR_DIED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: RayWorkerWrapper\n\tactor_id: 7a9b0f3c2d1e4f5a6b7c8d9e01000000\n\tpid: 2980\n"
    "\tnamespace: 3f1c2b7e-5d44-4a1e-9b0e-1e2f3a4b5c6d\n\tip: 10.0.3.11\n"
)


RAY_DETAILS = {  # Ray's own words (python/ray/_raylet.pyx, src/ray/core_worker; the docs quote them)
    "connection-error": "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
    "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some "
    "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray "
    "stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.",
    "unexpected-system-exit": "The actor is dead because its worker process has died. Worker exit type: "
    "UNEXPECTED_SYSTEM_EXIT Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of "
    "file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high "
    "memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
    "unexpected errors.",
    "k8s": "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
    "detail: Worker exits unexpectedly. Worker exits with an exit code None. The worker may have exceeded K8s pod "
    "memory limits.",
}


@pytest.mark.parametrize("headed", [True, False], ids=["vllm-header", "plain"])
@pytest.mark.parametrize("detail", sorted(RAY_DETAILS))
def test_rays_own_actor_died_reports_name_no_memory_cause(detail, headed):
    """Ray's list of what may have ended a worker, now read as the engine's words, names
    no memory cause (the wrapper stays a wrapper)."""
    message = RAY_GET + ACTOR_DIED + RAY_DETAILS[detail]
    log = (vllm_log(EC, message) if headed else message) + "\n"
    d = classify(Signals(log=log, exit_code=1))
    assert not d.is_memory, said(d)
