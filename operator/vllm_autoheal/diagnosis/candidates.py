"""Candidate lines: the lines of a window that hold a literal anchor (found with str.find at C
speed), at most HEAD_LINES from the head window and TAIL_LINES from the tail window (scan.py).
Standard library only."""

from __future__ import annotations

import re

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
    "exit code",
    "Uvicorn",
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
)
MAX_LINE = 8192  # kept per line (evidence is cut far shorter)
HEAD_LINES = 400
TAIL_LINES = 3000
_REQUEST_HINT = re.compile(r"APIServer|\[serving|serving_\w{1,30}\.py:|api_server\.py:")


def candidates(body: str, base: int, limit: int | None = None) -> list[tuple[int, str]]:
    """Lines of `body` holding an anchor, in order; at most `limit` of them (from the start)."""
    starts: set[int] = set()
    for anchor in ANCHORS:
        i = body.find(anchor)
        while i >= 0:
            start = body.rfind("\n", 0, i) + 1
            starts.add(start)
            nxt = body.find("\n", i)
            i = body.find(anchor, nxt + 1) if nxt >= 0 else -1
    out = []
    for start in sorted(starts):
        end = body.find("\n", start)
        out.append((base + start, body[start : end if end >= 0 else len(body)][:MAX_LINE]))
        if limit is not None and len(out) >= limit:
            break
    return out


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
    if len(found) <= TAIL_LINES:
        return found, False
    kept = [item for item in found if not _REQUEST_HINT.search(item[1][:200])][-TAIL_LINES:]
    room = TAIL_LINES - len(kept)
    if room > 0:
        kept += [item for item in found if _REQUEST_HINT.search(item[1][:200])][-room:]
    return kept, True
