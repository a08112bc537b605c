"""vLLM's JSON log records, read as its text formatter prints them. Standard library only.

With `--logging-config.formatter json` (vLLM 0.32+; earlier through a logging config of one's own
with python-json-logger) every record the engine logs is one JSON object on one line:
`{"asctime": ..., "levelname": ..., "name": "vllm.v1.engine.core", "processName": ...,
"process": ..., "message": ..., "exc_info": "Traceback ...", "vllm_process_name": ...}`. A
traceback is escaped inside `exc_info`, where no line of it is a line of the log. Each record is
printed here as the text formatter prints it: its header (`(Process pid=N) LEVEL MM-DD HH:MM:SS
[file.py:0] `) before every line of its message and traceback, so the rest of the classifier reads
a JSON log as it reads a text one, the logger's name telling the request logger's lines (user text)
as the file name does.

Line 0 in the header marks a decoded record (no logger prints line 0). A text log's client can
write a raw line that parses as a record (in an exception message that a dying process re-prints
without a header): findings.mark_continuations keeps such a record's lines in the open message,
as the raw line was. Work is bounded: only lines up to RECORD_MAX are parsed, and what a record
prints is at most GROWTH times its own size (a record of many short lines keeps its first and
last lines, with a gap between).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

RECORD_MAX = 256 * 2**10  # a longer line is left as it is
GROWTH = 2  # a record prints at most this many times its own length (and a header's worth)
DECODED_LINE = 0  # the line number a decoded record's header names
GAP = "[...]"  # scan.GAP_LINE: lines left out here

_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL"})
_NAME = re.compile(r"[\w.-]{1,200}")
_PROCESS = re.compile(r"[\w.:-]{1,60}")
_ASCTIME = re.compile(r"\d{4}-(\d\d-\d\d)[T ](\d\d:\d\d:\d\d)")
_OPENING = '{"'


def is_decoded(header: str) -> bool:
    """The header (scan.Line.header) is one this module printed for a JSON record."""
    return header.endswith(f":{DECODED_LINE}]")


def _field(record: dict, key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) else None


def _header(record: dict) -> str | None:
    level = _field(record, "levelname")
    if level is None or level not in _LEVELS:
        return None
    name = _field(record, "name") or ""
    module = name.rsplit(".", 1)[-1] if _NAME.fullmatch(name) else "record"
    when = _ASCTIME.match(_field(record, "asctime") or "")
    stamp = f"{when.group(1)} {when.group(2)}" if when else "01-01 00:00:00"
    process = _field(record, "vllm_process_name") or _field(record, "processName") or ""
    pid = record.get("process")
    prefix = ""
    if _PROCESS.fullmatch(process):
        prefix = f"({process} pid={pid}) " if isinstance(pid, int) and 0 <= pid < 10**10 else f"({process}) "
    return f"{prefix}{level} {stamp} [{module}.py:{DECODED_LINE}] "


def render(line: str) -> list[str] | None:
    """The text lines a JSON record line prints as, or None when the line is no record."""
    if not line.startswith(_OPENING) or len(line) > RECORD_MAX or not line.rstrip().endswith("}"):
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # (a deeply nested value exhausts the parser's recursion)
        return None
    message = _field(record, "message") if isinstance(record, dict) else None
    header = _header(record) if message is not None else None
    if header is None or message is None:
        return None
    texts = message.split("\n")
    for key in ("exc_info", "stack_info"):
        extra = _field(record, key)
        if extra:
            texts += extra.split("\n")
    texts = [t.replace("\r", " ") for t in texts]
    budget = GROWTH * len(line) + len(header)
    if sum(len(header) + len(t) + 1 for t in texts) <= budget:
        return [header + t for t in texts]
    # Too many short lines for what the record holds: its first line and as many of its last as fit.
    kept: list[str] = []
    used = 2 * (len(header) + 1) + len(texts[0]) + len(GAP)
    for t in reversed(texts[1:]):
        used += len(header) + len(t) + 1
        if used > budget:
            break
        kept.append(header + t)
    return [header + texts[0], header + GAP, *reversed(kept)]


def decoded(chunks: Iterable[str]) -> Iterator[str]:
    """The input with each JSON record line printed as text lines; every other line as it is."""
    pending = ""  # the start of a line not yet ended
    skipping = False  # inside a line longer than RECORD_MAX: no record, handed on as it is
    for chunk in chunks:
        if skipping:
            end = chunk.find("\n")
            if end < 0:
                yield chunk
                continue
            yield chunk[: end + 1]
            chunk, skipping = chunk[end + 1 :], False
        text = pending + chunk
        cut = text.rfind("\n") + 1
        whole, pending = text[:cut], text[cut:]
        if whole:
            yield _decode_lines(whole)
        if len(pending) > RECORD_MAX:
            yield pending
            pending, skipping = "", True
    if pending:
        yield _decode_lines(pending)


def _decode_lines(text: str) -> str:
    if _OPENING not in text:
        return text
    out = []
    for line in text.split("\n"):
        rendered = render(line) if line.startswith(_OPENING) else None
        out.append(line if rendered is None else "\n".join(rendered))
    return "\n".join(out)
