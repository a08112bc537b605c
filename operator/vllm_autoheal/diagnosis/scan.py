"""Read a log of any size in bounded memory and keep only the lines that can matter.

A 100 MB serving log is mostly metrics and access lines. The scan looks for a
few literal anchors with str.find (C speed), keeps the first and last candidate
lines plus the raw tail, and normalizes only those: ANSI colours, carriage
returns, docker-compose / `(EngineCore_DP0 pid=…)` / `[rank0]:` prefixes,
timestamps and vLLM's `LEVEL MM-DD hh:mm:ss [file.py:N]` headers.
Standard library only.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Iterable

# A candidate line contains one of these (case-sensitive, chosen so that metrics
# and HTTP access lines, the bulk of a serving log, contain none).
ANCHORS = (
    "rror", "emory", "illed", "died", "xception", "Traceback", "NCCL", "apture", "cudagraph",
    "took", "oading", "startup", "too long", "context length", "divisible", "in use", "Abort",
    "exit code", "Uvicorn", "load_model", "profile", "dummy", "execute_model", "busy_loop",
    "determine_", "kv_cache", "KV cache size", "blocks", "Initializing", "not supported",
    "capability", "Quantization", "quantization method", "max seq len", "max_model_len", "OOM",
    "Killing", "graph", "model_runner", "swap", "shm", "alloc", "Workspace", "serving_",
    "Process ", "Engine", "bad_alloc", "SIGKILL", "Signal", "found", "No such file",
    "Repository", "does not appear", "timed out", "timeout", "allocate", "get_model", "weights",
)
CHUNK = 4 * 2**20
MAX_LINE = 8192
HEAD_LINES = 400
TAIL_LINES = 3000
TAIL_BYTES = 64 * 2**10

_ANSI = re.compile(r"(?:\x1b|\^\[|#033)\[[0-9;]*[A-Za-z]")
_PREFIXES = re.compile(
    r"^(?:"
    r"\s*\[?\d{4}-\d\d-\d\d[T ][\d:.,]+Z?\]?\s*"                       # ISO timestamps
    r"|\s*[\w.-]{0,40}\s*\|\s"                                         # docker compose "svc-1  | "
    r"|\s*\((?P<proc>[\w.-]+)(?:\s+rank=(?P<rank>\d+))?(?:\s+pid=\d+)?(?:\s+ip=[\w.:]+)?\)\s*"
    r"|\s*\[rank(?P<rank2>\d+)\]:\s*"                                  # torchrun "[rank0]:"
    r"|\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+(?:\[[^\]]*\]|[\w.]+:\d+\])\s?"
    r"|\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s*:\s+"            # uvicorn "INFO:     "
    r"|\s*[\w.]+\.py:\d+\]\s"                                          # truncated "[file.py:N] "
    r")"
)
_TP_RANK = re.compile(r"(?:Worker_TP|\[Rank |rank=)(\d+)")


@dataclass
class Line:
    offset: int       # position in the input, for ordering
    text: str         # normalized
    raw: str          # as printed (ANSI removed), for evidence
    rank: int | None  # the worker rank that printed it, when the prefix says


@dataclass
class Scan:
    lines: list[Line] = field(default_factory=list)
    total_bytes: int = 0
    truncated: bool = False  # candidate lines were dropped in the middle

    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)


def normalize(raw: str) -> tuple[str, int | None]:
    text = _ANSI.sub("", raw)
    rank = None
    for _ in range(6):  # prefixes nest: timestamp, service, process, level header
        m = _PREFIXES.match(text)
        if not m or m.end() == 0:
            break
        r = m.group("rank") or m.group("rank2")
        if r is None and m.group("proc"):
            t = _TP_RANK.search(m.group("proc"))
            r = t.group(1) if t else None
        if r is not None:
            rank = int(r)
        text = text[m.end():]
    if rank is None:
        t = _TP_RANK.search(raw[:80])
        rank = int(t.group(1)) if t else None
    return text.strip(), rank


def _chunks(source: str | IO[str] | Iterable[str]) -> Iterable[str]:
    if isinstance(source, str):
        for i in range(0, len(source), CHUNK):
            yield source[i:i + CHUNK]
    elif hasattr(source, "read"):
        while True:
            block = source.read(CHUNK)  # type: ignore[union-attr]
            if not block:
                return
            yield block
    else:
        yield from source


def scan(source: str | IO[str] | Iterable[str]) -> Scan:
    """Candidate lines of the whole input (first HEAD_LINES, last TAIL_LINES) and every line
    of its last TAIL_BYTES, in input order, normalized. Memory is bounded by those limits."""
    head: list[tuple[int, str]] = []
    tail: deque[tuple[int, str]] = deque(maxlen=TAIL_LINES)
    raw_tail = ""
    seen = 0
    carry = ""
    dropped = False
    base = 0
    for chunk in _chunks(source):
        block = (carry + chunk).replace("\r\n", "\n").replace("\r", "\n")
        cut = block.rfind("\n")
        if cut < 0:
            carry = block[-MAX_LINE:] if len(block) > MAX_LINE else block
            continue
        body, carry = block[:cut + 1], block[cut + 1:][-MAX_LINE:]
        starts: set[int] = set()
        for anchor in ANCHORS:
            i = body.find(anchor)
            while i >= 0:
                start = body.rfind("\n", 0, i) + 1
                starts.add(start)
                nxt = body.find("\n", i)
                i = body.find(anchor, nxt + 1) if nxt >= 0 else -1
        for start in sorted(starts):
            end = body.find("\n", start)
            item = (base + start, body[start:end][:MAX_LINE])
            if len(head) < HEAD_LINES:
                head.append(item)
            else:
                if len(tail) == tail.maxlen:
                    dropped = True
                tail.append(item)
        raw_tail = (raw_tail + body[-TAIL_BYTES:])[-TAIL_BYTES:]  # never copy the whole chunk
        base += len(body)
        seen += len(chunk)
    if carry:
        tail.append((base, carry[:MAX_LINE]))
        raw_tail = (raw_tail + carry)[-TAIL_BYTES:]
        base += len(carry)
    # The raw tail: every line, anchors or not (traceback frames, the last words).
    tail_start = base - len(raw_tail)
    merged: dict[int, str] = {off: text for off, text in head}
    merged.update({off: text for off, text in tail})
    pos = tail_start
    for n, piece in enumerate(raw_tail.split("\n")):
        if n > 0 or tail_start == 0:  # the first piece of a cut tail is a partial line
            merged.setdefault(pos, piece[:MAX_LINE])
        pos += len(piece) + 1
    lines = []
    for off in sorted(merged):
        raw = merged[off]
        if not raw.strip():
            continue
        text, rank = normalize(raw)
        if text:
            lines.append(Line(off, text, _ANSI.sub("", raw).strip(), rank))
    return Scan(lines=lines, total_bytes=seen, truncated=dropped)
