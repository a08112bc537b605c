"""An exception that wraps another (vLLM's executor, Triton's stub, `Worker failed with error`, an abort
after a peer's kill) is read for the failure it quotes: a memory failure it quotes, over one line or more,
is never called "not memory", and a wrapper quoting nothing of its own names no failure."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify

from crafted.checks import cause_of, diagnose
from crafted.wrappers import KSERVE, TRITON, V1_KILLED

# --- V1's "Worker failed with error '<str(e)>'" row -------------------------------------------
EC = "(EngineCore_DP0 pid=9) ERROR 04-27 05:30:01 [core.py:700] "


def _executor_raises(quoted: str) -> str:
    """The executor's traceback (logged by EngineCore, header on every line) quoting str(e)."""
    message = (
        "EngineCore encountered a fatal error.\nTraceback (most recent call last):\n"
        '  File "/x/vllm/v1/executor/multiproc_executor.py", line 250, in get_response\n    raise RuntimeError(\n'
        f"RuntimeError: Worker failed with error '{quoted}', please check the stack trace above for the root cause"
    )
    return "".join(EC + line + "\n" for line in message.split("\n"))


NCCL_STR = (
    "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
    "Last error:\nCuda failure 'out of memory'"
)


def test_a_workers_multiline_error_that_says_out_of_memory_later_is_not_called_not_oom():
    """str(e) of torch's NCCL error spans lines, the CUDA failure last: the row matched its first line
    and turned multi_gpu_oom into unknown (signals_disagree)."""
    d = classify(Signals(log=_executor_raises(NCCL_STR)))
    assert (d.cause, d.subtype) == ("multi_gpu_oom", "nccl_cuda_oom")


@pytest.mark.parametrize(
    "quoted",
    [
        "Error in model execution: step 3\nCUDA out of memory. Tried to allocate 2.00 GiB.",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY",
        "miopenStatusAllocFailed",
        "rocBLAS error: rocblas_status_memory_error",
        "std::bad_alloc",
        "DefaultCPUAllocator: not enough memory: you tried to allocate 1073741824 bytes.",
    ],
)
def test_a_worker_error_that_may_be_memory_is_never_called_not_oom_by_the_executors_line(quoted):
    d = classify(Signals(log=_executor_raises(quoted)))
    assert d.cause != "not_oom" or d.subtype != "worker_failed_of_other_error"


@pytest.mark.parametrize(
    "quoted", ["NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)", "cu_seqlens_q must be on CUDA"]
)
def test_a_workers_one_line_non_memory_error_is_still_not_oom(quoted):
    d = classify(Signals(log=_executor_raises(quoted)))
    assert (d.cause, d.subtype) == ("not_oom", "worker_failed_of_other_error")


TRITON_AT = "\n\nAt:\n  /opt/tritonserver/backends/vllm/model.py(75): initialize\n"


def test_triton_quoting_vllms_wrapper_over_a_sigkilled_engine_core_keeps_the_kill():
    """The EngineCore, SIGKILLed by the OOM killer while loading, prints nothing; vLLM's wrapper names
    its -9, and Triton's stub quotes the wrapper. The Triton row, unlike KServe's, lets wrappers through:
    host_ram_oom (the wrapper alone) -> not_oom (triton_stub_failed_of_other_error) when unfixed."""
    alone = "RuntimeError: " + V1_KILLED + "\n"
    assert cause_of(alone) == "host_ram_oom"
    old_format = TRITON + "Failed to initialize Python stub: RuntimeError: " + V1_KILLED + TRITON_AT
    quoted = (
        'I1216 02:12:49.624943 179 pb_stub.cc:388] "Failed to initialize Python stub: RuntimeError: '
        + V1_KILLED
        + '\\n\\nAt:\\n  /opt/tritonserver/backends/vllm/model.py(301): _run_llm_engine\\n"\n'
    )
    assert cause_of(old_format) == "host_ram_oom"
    assert cause_of(quoted) == "host_ram_oom"


@pytest.mark.parametrize(
    "line",
    [
        # V1's executor wrapper (WRAPPER_WORDS holds it; the Triton row does not ask)
        TRITON + "Failed to initialize Python stub: RuntimeError: Worker failed with error 'x', please check the "
        "stack trace above for the root cause" + TRITON_AT,
        # Ray's news that an actor died: it lists an OOM kill among what may have killed it
        TRITON + "Failed to initialize Python stub: ray.exceptions.RayActorError: The actor died unexpectedly "
        "before finishing this task." + TRITON_AT,
        # KServe logs str(e): without the type name WRAPPER_WORDS' `RayActorError: The actor died` misses it
        KSERVE + "Failed to start model server: The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: RayWorkerWrapper\n",
    ],
    ids=["triton-worker-failed", "triton-ray-actor-died", "kserve-ray-actor-died"],
)
def test_a_wrapper_quoting_a_generic_wrapper_is_never_not_oom(line):
    """unknown -> not_oom (high confidence) when unfixed: a wrapper names no failure of its own."""
    assert cause_of(line) != "not_oom"


NCCL_OOM = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'"
)


@pytest.mark.parametrize(
    "log",
    [
        TRITON + "Failed to initialize Python stub: torch.distributed.DistBackendError: " + NCCL_OOM + TRITON_AT,
        KSERVE + "Failed to start model server: " + NCCL_OOM + "\n",
    ],
    ids=["triton", "kserve"],
)
def test_a_wrapper_quoting_a_multiline_message_is_read_to_its_end(log):
    """str(e) goes on over more lines (the Worker-failed row's own comment says so: torch's NCCL error
    names 'out of memory' on its last). The first line alone makes a non-memory cause before the OOM:
    multi_gpu_oom (the same lines without the wrapper's words) -> unknown (signals_disagree) when unfixed."""
    assert cause_of(NCCL_OOM + "\n") == "multi_gpu_oom"
    assert cause_of(log) == "multi_gpu_oom"


@pytest.mark.parametrize(
    "log",
    [
        # numpy's host allocation failure (a MemoryError subclass): ALLOCATION_FAILED names neither
        # `MemoryError` nor "Unable to allocate"
        TRITON + "Failed to initialize Python stub: numpy.core._exceptions._ArrayMemoryError: Unable to allocate "
        "12.0 GiB for an array with shape (3, 1073741824) and data type float32" + TRITON_AT,
        KSERVE + "Failed to start model server: Unable to allocate 12.0 GiB for an array with shape (3, 1073741824) "
        "and data type float32\n",
        # Gaudi's device allocation failure
        TRITON + "Failed to initialize Python stub: RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM "
        "Allocation failed for size::268435456 (256)MB" + TRITON_AT,
    ],
    ids=["triton-numpy", "kserve-numpy", "triton-hpu"],
)
def test_a_wrapper_quoting_an_allocation_failure_is_not_not_oom(log):
    """unknown -> not_oom (high confidence) when unfixed: a memory failure worded as ALLOCATION_FAILED
    does not know is called "another failure" by the wrapper rows."""
    assert cause_of(log) != "not_oom"


# --- An abort that follows a peer's SIGKILL is a consequence, not the cause --------------------------
# When one rank is killed (the OOM killer), the others wait in a collective until NCCL's watchdog takes
# the process down with SIGABRT ("To avoid data inconsistency, we are taking the entire process down"):
# the shell then reports `Aborted (core dumped)`, torch elastic `Signal 6 (SIGABRT) received by PID`.
# Those are now process_crash, which is not in CONSEQUENCES, so they outvote the kill.
RAY_KILL_THEN_ABORT = (
    "ERROR 05-01 10:00:00 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 7022 died, exit code: -9\n"
    "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
    "OpType=ALLREDUCE) ran for 600059 milliseconds before timing out.\n"
    "[rank0]:[E ProcessGroupNCCL.cpp:583] [Rank 0] To avoid data inconsistency, we are taking the entire process down.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    "  what():  [PG 2 Rank 0] Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught "
    "collective operation timeout\n"
    "/usr/bin/bash: line 1:    47 Aborted                 (core dumped) python -m vllm.entrypoints.openai.api_server\n"
)


# torch elastic prints the other ranks' failures first, the root cause (the first observed) last.
ELASTIC = (
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    "============================================================\nvllm_launch.py FAILED\n"
    "------------------------------------------------------------\nFailures:\n[1]:\n"
    "  time      : 2025-05-21_15:43:03\n  host      : node\n  rank      : 1 (local_rank: 1)\n"
    "  exitcode  : -6 (pid: 14751)\n  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received by PID 14751\n"
    "------------------------------------------------------------\nRoot Cause (first observed failure):\n[0]:\n"
    "  time      : 2025-05-21_15:43:03\n  host      : node\n  rank      : 0 (local_rank: 0)\n"
    "  exitcode  : -9 (pid: 14750)\n  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 14750\n"
    "============================================================\n"
)


@pytest.mark.parametrize("log", [RAY_KILL_THEN_ABORT, ELASTIC], ids=["watchdog-abort", "elastic-root-cause"])
def test_an_abort_after_a_peers_sigkill_does_not_outvote_the_kill(log):
    """host_ram_oom (before this change) -> not_oom when unfixed (the worst error: a memory failure
    reported as one no memory setting can help)."""
    assert cause_of(log) == "host_ram_oom"


# --- wrapper_without_cause -----------------------------------------------------------------------------
H = "(EngineCore_DP0 pid=7) ERROR 12-01 04:48:08 [core.py:710] "


LOAD_FRAMES = [
    '  File "/usr/lib/python3.12/site-packages/vllm/model_executor/model_loader/default_loader.py", line 1, '
    "in load_weights",
    '    state = torch.load(bin_file, map_location="cpu")',
    '  File "/usr/lib/python3.12/site-packages/torch/serialization.py", line 1, in load',
    "    return _legacy_load(opened_file, map_location, pickle_module, **pickle_load_args)",
    '  File "/usr/lib/python3.12/site-packages/torch/serialization.py", line 2, in _legacy_load',
    "    magic_number = pickle_module.load(f, **pickle_load_args)",
]


def _engine_traceback(last: str) -> str:
    lines = ["EngineCore failed to start.", "Traceback (most recent call last):", *LOAD_FRAMES, last]
    return "\n".join(H + line for line in lines) + "\n"


def test_a_truncated_checkpoints_eoferror_is_not_a_wrapper():
    """(Low.) torch.load of a cut .bin raises `EOFError: Ran out of input` from pickle, under its own
    frames: the failure itself. Neither unknown wrapper_without_cause ("only wraps a failure printed
    elsewhere ... that failure is not in the log") nor unknown traceback_without_error ("the
    traceback ends before its error line") is true. WRAPPER_WORDS takes any EOFError at a line's
    start for a pipe whose other end died. It should read as the KeyError of the same frames does:
    not_oom, other_error, the line as evidence."""
    d = classify(Signals(log=_engine_traceback("EOFError: Ran out of input")))
    assert (d.cause, d.subtype) == ("not_oom", "other_error")


def test_a_wrapper_quoting_the_real_error_on_its_line_is_not_wrapper_without_cause():
    """V1's executor wrapper quoting a worker's KeyError is read by its own row."""
    d = classify(
        Signals(
            log=_engine_traceback(
                "RuntimeError: Worker failed with error 'KeyError: 0', please check the stack trace above for the "
                "root cause"
            )
        )
    )
    assert (d.cause, d.subtype) == ("not_oom", "worker_failed_of_other_error")


@pytest.mark.parametrize(
    "client",
    ["KeyError: 'ZZUSERZZ'", "torch.OutOfMemoryError: CUDA out of memory. ZZUSERZZ", "ZZUSERZZ"],
    ids=["exception-name", "oom", "text"],
)
def test_a_client_line_going_on_a_wrappers_message_is_neither_read_nor_quoted(client):
    """The API server's EngineDeadError (its handler's header: a request's), its message
    going on over a line a client wrote: still wrapper_without_cause, nothing quoted. (A further line of the ENGINE's own exception is read as that exception's message, as NCCL's
    `Last error:` line must be; EngineDeadError's message is vLLM's fixed text, so no client writes one.)"""
    wrapper = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
    api = "(APIServer pid=1) ERROR 12-01 04:48:08 [serving_chat.py:1] "
    d = classify(Signals(log=_engine_traceback("KeyError: 0") + api + wrapper + "for the root cause.\n" + api + client))
    assert (d.cause, d.subtype) == ("not_oom", "other_error")
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


WRAPPED_OOM = {
    "ray": "ray.exceptions.RayTaskError(OutOfMemoryError): ray::RayWorkerWrapper.execute_method() (pid=1, ip=h) "
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "triton": "failed to load 'vllm_model' version 1: Internal: torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 2.00 GiB.",
    "prefixed": "[w0] 12:00 torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
}


@pytest.mark.parametrize("shape", sorted(WRAPPED_OOM))
def test_a_wrapper_quoting_torchs_oom_after_a_carrying_type_still_names_memory(shape):
    assert diagnose(WRAPPED_OOM[shape] + "\n").cause in MEMORY_CAUSES | {"unknown"}
    from vllm_autoheal.diagnosis.quoted import of_another_type
    from vllm_autoheal.diagnosis.scan import make_line

    assert not of_another_type(make_line(0, WRAPPED_OOM[shape]))
