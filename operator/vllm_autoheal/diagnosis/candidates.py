"""Candidate lines: the lines of a window that hold a literal anchor (found with str.find at C
speed), at most HEAD_LINES from the head window and TAIL_LINES from the tail window (scan.py).
Standard library only."""

from __future__ import annotations

import functools
import re

from .needles import trie

# A candidate line contains one of these (case-sensitive, chosen so that metrics
# and HTTP access lines, the bulk of a serving log, contain none).
ANCHORS = (
    "rror",
    "emory",
    "illed",
    "died",
    "xception",
    "Traceback",
    "NCCL",
    "apture",
    "cudagraph",
    "took",
    "oading",
    "startup",
    "too long",
    "context length",
    "divisible",
    "in use",
    "Abort",
    "egfault",  # tvm_ffi's "Segfault encountered"
    "Segmentation fault",
    "received by PID",  # torch elastic's report of a signal
    "Python stub",  # Triton's Python backend
    "model server",  # KServe's
    "oom_kill",  # Slurm's
    "exit code",
    "Uvicorn",
    "AllocFailed",  # MIOpen's
    "load_model",
    "profile",
    "dummy",
    "execute_model",
    "busy_loop",
    "determine_",
    "kv_cache",
    "KV cache size",
    "blocks",
    "Initializing",
    "not supported",
    "capability",
    "Quantization",
    "quantization method",
    "max seq len",
    "max_model_len",
    "OOM",
    "Killing",
    "graph",
    "model_runner",
    "swap",
    "shm",
    "alloc",
    "Workspace",
    "serving_",
    "Process ",
    "Engine",
    "bad_alloc",
    "SIGKILL",
    "Signal",
    "found",
    "No such file",
    "Repository",
    "does not appear",
    "timed out",
    "timeout",
    "allocate",
    "get_model",
    "weights",
    "concurrency",
    "Received request",
    "Generated response",
    "details: prompt",
    "equest",  # a line naming a request is user text: keep it, so what continues it is known too
    # (below: so that every message's needles hold an anchor; tests/test_diagnosis.py checks it)
    "aptur",
    "Starting to load",
    "Encoder cache",
    "API server",
    "\u2588  version",  # the API server's banner (its release)
    "egmentation fault",
    "SIGSEGV",
    "Caught signal",
    "EADDRINUSE",
    "Errno",
    "maximum model length",
    "reduce the length",
    "max_num_seqs",
    "model identifier",
    "configuration of",
    "repository",
    "does not exist",
    "connect to",
    "driver",
    "CUDA-capable",
    "device type",
    "uda failure",
    "Failed:",
    "ssert",
    "cannot find -l",
    "ld returned",
    "nccl",
    "OUT_OF",
    "ALLOC",  # the math libraries' failed allocations (CUBLAS_STATUS_ALLOC_FAILED, ...)
    "RESOURCE_EXHAUSTED",
    "PT_DEVMEM",  # Gaudi's failed device allocation
    "Failed core",
    "signal 9",
    "exitcode",
    "exited with code",
    "cache_engine",
    "initialize_",
    "make_layers",
    "warmup_kernels",
    "kernel_warmup",
    "load_state_dict",
    "ailed to create",
    "engine_step",
    "step_with_batch_queue",
    "create_c",
    "_run_workers",
    "sample_tokens",
    "step_async",
    "get_logprobs",
    "_log_task_completion",
    "background task",
    "output_handler",
    "failed to start",
    "initialization failed",
    "build_async_engine_client",
    "_init_executor",
    "from_engine_args",
    "from_vllm_config",
    "ray-oom-prevention",
    "oom-kill",
    "DefaultCPUAllocator",
    "excluding",
    "decoding reserves",
    "stored in KV cache",
    "for KV cache",
    "HSA_STATUS",
    "architecture",
    "model module",
    "parallel",
    "out of",
    "warm_up",
    "_init_model",
    "model_executor/",
)
# (an anchor holding another one finds no line the other does not)
_SEARCHED = tuple(a for a in ANCHORS if not any(b != a and b in a for b in ANCHORS))
# Needles that hold no anchor, and why their lines are found anyway.
UNANCHORED_NEEDLES = {
    "Avg prompt throughput": "a metrics line, the bulk of a serving log: serving is told by the startup lines",
    "generate": "a serving frame; every metrics line says 'generation': the failure's frames are in the raw tail",
    "...": "an excerpt's gap; the unread middle of a long log gets its own gap line (scan.GAP_LINE)",
    "…": "as '...'",
    "load_": "stands for frame names that each hold an anchor (load_model, load_weights, load_state_dict)",
    "_model": "stands for frame names that each hold an anchor (_init_model, initialize_model, get_model)",
    "from_": "stands for from_engine_args and from_vllm_config, both anchors",
    "OutOfResources": "Triton's exception: with its module (triton.runtime.errors) it holds 'rror'; a failure, in the raw tail",
}
MAX_LINE = 8192  # kept per line (evidence is cut far shorter)
HEAD_LINES = 400
TAIL_LINES = 3000
_REQUEST_HINT = re.compile(r"APIServer|\[serving|serving_\w{1,30}\.py:|api_server\.py:")


# The words of a frame that opens a request's report (quoted.REQUEST_FRAME, GRAMMAR_FRAME): what
# follows is a client's text, however long. The last OPENERS_MAX such lines of the tail window are
# kept whatever else it holds, so a client's text cannot push out the line that says it is one.
OPENERS = (
    "structured_output",
    "guided_decoding",
    "xgrammar",
    "llguidance",
    "outlines",
    "lmformatenforcer",
    "starlette",
    "fastapi",
    "uvicorn",
    "serving_",
    "ASGI",
)
OPENERS_MAX = 200


def candidates(
    body: str, base: int, limit: int | None = None, anchors: tuple[str, ...] | None = None
) -> list[tuple[int, str]]:
    """Lines of `body` holding an anchor (of `anchors`, else ANCHORS), in order; at most `limit` of
    them (from the start)."""
    # One pass of a trie of the anchors: the first anchor of a line makes it a candidate, and the
    # search goes on from the next line. (A pass of str.find per anchor cost up to a step per
    # character per anchor: its skip table takes '%' for 'e', and a line of 'a's holds many
    # anchors' characters, 2.5x a normal window's time for a 1 MiB tail of such lines.)
    out: list[tuple[int, str]] = []
    found = _finder(_SEARCHED if anchors is None else anchors).search
    hit = found(body)
    while hit is not None and (limit is None or len(out) < limit):
        start = body.rfind("\n", 0, hit.start()) + 1
        end = body.find("\n", hit.end())
        out.append((base + start, body[start : end if end >= 0 else len(body)][:MAX_LINE]))
        hit = found(body, end + 1) if end >= 0 else None
    return out


@functools.cache
def _finder(anchors: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(trie(sorted(set(anchors))))


# A window holding a flood of short candidate lines (a million in 1 MiB) is read in slices of
# whole lines, from the end that is kept, up to what the window keeps: only those lines cost.
SLICE = 64 * 2**10


def head_candidates(body: str) -> list[tuple[int, str]]:
    """The first HEAD_LINES candidate lines of the head window."""
    out: list[tuple[int, str]] = []
    begin, size = 0, SLICE // 4
    while begin < len(body) and len(out) < HEAD_LINES:
        end = body.find("\n", begin + size) + 1 or len(body)
        out += candidates(body[begin:end], begin, HEAD_LINES - len(out))
        begin, size = end, size * 2
    return out


def tail_candidates(body: str, base: int) -> tuple[list[tuple[int, str]], bool]:
    """The candidate lines of the tail window that are kept, and whether any were left out: at
    most TAIL_LINES, where a flood of per-request tracebacks after a crash must not push the
    engine's own lines out (the API server's lines give way first)."""
    found: list[tuple[int, str]] = []
    engine = 0
    end, size = len(body), SLICE
    while end > 0 and engine <= TAIL_LINES:  # more than TAIL_LINES engine lines: none before count
        begin = body.rfind("\n", 0, max(0, end - size)) + 1
        part = candidates(body[begin:end], base + begin)
        engine += sum(1 for item in part if not _REQUEST_HINT.search(item[1][:200]))
        found[:0] = part
        end, size = begin, size * 2
    openers = candidates(body, base, anchors=OPENERS)[-OPENERS_MAX:]
    if len(found) <= TAIL_LINES:
        return _with_openers(found, openers), False
    kept = [item for item in found if not _REQUEST_HINT.search(item[1][:200])][-TAIL_LINES:]
    room = TAIL_LINES - len(kept)
    if room > 0:
        kept += [item for item in found if _REQUEST_HINT.search(item[1][:200])][-room:]
    return _with_openers(kept, openers), True


def _with_openers(kept: list[tuple[int, str]], openers: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return sorted({**dict(openers), **dict(kept)}.items())
