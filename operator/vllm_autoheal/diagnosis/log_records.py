"""vLLM's JSON log records, read as its text formatter prints them. Standard library only.

With `--logging-config.formatter json` (vLLM 0.32+; earlier through a logging config of one's own
with python-json-logger) every record the engine logs is one JSON object on one line:
`{"asctime": ..., "levelname": ..., "name": "vllm.v1.engine.core", "processName": ...,
"process": ..., "message": ..., "exc_info": "Traceback ...", "vllm_process_name": ...}`. A
traceback is escaped inside `exc_info`, where no line of it is a line of the log. Each record is
printed here as the text formatter prints it (other schemas' records too: python-json-logger's renamed for
Cloud Logging, NVIDIA Dynamo's JSONL; _head): its header (`(Process pid=N) LEVEL MM-DD HH:MM:SS
[module.py:NNNNNNN] `) before every line of its message and traceback, so the rest of the classifier
reads a JSON log as it reads a text one, the logger's name telling the request logger's lines (user
text) as the file name does. Where vLLM's stdout decorator (a GPU deployment's processes) or a
collector put a prefix before the record, it is printed before each of those lines instead.

The 7-digit line number marks a decoded record (RECORD_COUNT, below). A client can write a raw line
that parses as a record (in a request's report, a dying process's re-print): quoted.mark_continuations
keeps such a record's lines in the report. Work is bounded: only lines up to RECORD_MAX holding a
level key are parsed, and what a record prints is at most GROWTH times its own size (a record
of many short lines keeps its first lines and its last, with a gap between).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator

from .collector import PROCESS_WITH_PID

RECORD_MAX = 256 * 2**10  # a longer line is left as it is
GROWTH = 3  # a record prints at most this many times its own length (a traceback's: about 2)
# A decoded record's header names a 7-digit line number (no source file of vLLM's has a million lines):
# its first digit says where the process prefix before it came from (1 or 3: the line's own, as vLLM's
# stdout decorator writes it before the record; 0 or 2: the record's fields, which anyone who writes the
# record chose) and, 2 or 3, that the record's logger is not vLLM's (a JSON formatter on the root logger
# prints the records of a server that runs vLLM in its own process, its request traces and uvicorn's
# words included, with a header as vLLM's: writers.vllms_own); the other six count the records, so each
# record is a logged message of its own, as a text log's file:line tells two apart.
RECORD_COUNT = 10**6
GAP = "[...]"  # scan.GAP_LINE: lines left out here

_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL"})
_NAME = re.compile(r"[\w.-]{1,200}")
_PROCESS = re.compile(r"[\w.:-]{1,60}")
_ASCTIME = re.compile(r"\d{4}-(\d\d-\d\d)[T ](\d\d:\d\d:\d\d)")
_OPENING = '{"'
# Where a record names its level, its logger and its time: vLLM's own formatter and python-json-logger's defaults
# (levelname, name, asctime); python-json-logger renamed for Cloud Logging (severity, logger, timestamp); NVIDIA
# Dynamo's JSONL (level, the Python logger in log.target, time). The first of each that a record fills is read (_head).
MIN_RECORD = len('{"level":"INFO","message":""}')


_DECODED = re.compile(r":([0-3])\d{6}\]$")


def is_decoded(header: str) -> bool:
    """The header (scan.Line.header) is one this module printed for a JSON record."""
    return _DECODED.search(header) is not None


def process_outside(header: str) -> bool:
    """The decoded record's process prefix is the one printed before the record on its line."""
    found = _DECODED.search(header)
    return found is not None and found.group(1) in "13"


def foreign(header: str) -> bool:
    """The decoded record's logger is not one of vLLM's (or the record names none)."""
    found = _DECODED.search(header)
    return found is not None and found.group(1) in "23"


def _vllms(name: str | None) -> bool:
    return name is not None and (name == "vllm" or name.startswith("vllm."))  # (vLLM names its loggers after modules)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _head(record: dict, outside: bool) -> str | None:
    """The header before its line number's last six digits: `(Process pid=N) LEVEL MM-DD HH:MM:SS
    [module.py:F` (without the process when it is printed outside the record; F: RECORD_COUNT's flag
    digit), or None when the record names no level."""
    get = record.get
    pid = get("process")
    return _head_of(
        _text(get("levelname") or get("severity") or get("level")),
        _text(get("name") or get("logger") or get("log.target")),
        _text(get("asctime") or get("timestamp") or get("time")),
        None if outside else _text(get("vllm_process_name")) or _text(get("processName")),
        # (JSON's numbers are int or float exactly, and true is a bool: no subclass of int but bool)
        pid if type(pid) is int and 0 <= pid < 10**10 else None,
        outside,
    )


@functools.lru_cache(maxsize=4096)  # (a log's records share a few heads: a flood of records costs less)
def _head_of(
    level: str | None, name: str | None, asctime: str | None, process: str | None, pid: int | None, outside: bool
) -> str | None:
    level = level.upper() if level is not None and len(level) <= 8 else None  # (Dynamo's and others' may be lower case)
    if level not in _LEVELS:
        return None
    module = name.rsplit(".", 1)[-1] if name and _NAME.fullmatch(name) else "record"
    when = _ASCTIME.match(asctime or "")
    stamp = f"{when.group(1)} {when.group(2)}" if when else "01-01 00:00:00"
    prefix = ""
    if process and _PROCESS.fullmatch(process):
        prefix = f"({process} pid={pid}) " if pid is not None else f"({process}) "
    flag = int(outside) + 2 * (not _vllms(name))
    return f"{prefix}{level} {stamp} [{module}.py:{flag}"


# json.loads's own C scanner, and the blanks loads allows after a value (json.decoder.WHITESPACE)
_scan_value: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_BLANKS = re.compile(r"[ \t\n\r]*")


def _parsed(line: str) -> object:
    """json.loads(line) for a line that opens with `{"`, or None where loads raises: the C scanner called
    directly, without loads's three Python frames (a flood of the smallest records costs its calls)."""
    try:
        value, end = _scan_value(line, 0)
    except (StopIteration, ValueError, RecursionError):  # (a deeply nested value exhausts the recursion)
        return None
    return value if end == len(line) or _BLANKS.fullmatch(line, end) is not None else None


def render(line: str, number: int = 0, outside: bool = False) -> list[str] | None:
    """The text lines a JSON record line prints as (the `number`th record), or None when the line is
    no record. `outside`: a process prefix is printed before the record on its line; the record's own
    process is not printed then."""
    # (cheap tests first: a flood of short lines that open with `{"` costs no parse each)
    if not MIN_RECORD <= len(line) <= RECORD_MAX or not line.startswith(_OPENING):
        return None
    if (line[-1] != "}" and not line.rstrip().endswith("}")) or not _names_a_level(line):
        return None
    record = _parsed(line)
    if not isinstance(record, dict):
        return None
    message = record.get("message")
    head = _head(record, outside) if isinstance(message, str) else None
    if head is None or not isinstance(message, str):
        return None
    header = f"{head}{number % RECORD_COUNT:06d}] "
    if "\n" not in message and "\r" not in message and "exc_info" not in record and "stack_info" not in record:
        return [header + message]  # (the most records: one line, no traceback)
    extras = [e for e in (_text(record.get("exc_info")), _text(record.get("stack_info"))) if e]
    texts = message.split("\n")
    for extra in extras:
        texts += extra.split("\n")
    texts = [t.replace("\r", " ") for t in texts]
    budget = GROWTH * len(line) + len(header)
    cost = [len(header) + len(t) + 1 for t in texts]
    if sum(cost) <= budget:
        return [header + t for t in texts]
    # Too many short lines for what the record holds: as many of its first lines as fill half the
    # budget (where a traceback opens: its frames say whose report it is), a gap, as many of its last.
    first = last = 0
    used = len(header) + len(GAP) + 1
    while first < len(texts) and used + cost[first] <= budget / 2:
        used, first = used + cost[first], first + 1
    while last < len(texts) - first and used + cost[-1 - last] <= budget:
        used, last = used + cost[-1 - last], last + 1
    kept = texts[:first] + [GAP] + texts[len(texts) - last :]
    return [header + t for t in kept]


# A collector's stamp before a record (kubectl logs --timestamps, compose's service tag, stern's pod
# and container, a bracketed tag): printed again before each line the record prints as.
_STAMP = re.compile(
    r"(?:\d{4}-\d\d-\d\d[T ][\d:.,]{1,20}Z?|[\w.-]{1,63}\s{0,8}\||\[[\w./@:-]{1,200}\]:?|[\w.-]{1,63}(?: [\w.-]{1,63})?) "
)
# vLLM's stdout decorator (a worker, the engine core, the API server): `(EngineCore pid=1467) ` before
# each line a process writes, a JSON record included; after a collector's stamp, if any.
_PROCESS_PREFIX = re.compile(r"(?P<stamp>.{0,100}?)(?P<process>" + PROCESS_WITH_PID + r"\) )")
STAMP_MAX = 100


def decoded(chunks: Iterable[str]) -> Iterator[str]:
    """The input with each JSON record line printed as text lines; every other line as it is."""
    pending = ""  # the start of a line not yet ended
    skipping = False  # inside a line longer than RECORD_MAX: no record, handed on as it is
    count = [0]  # records printed so far
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
            yield _decode_lines(whole, count)
        if len(pending) > RECORD_MAX:
            yield pending
            pending, skipping = "", True
    if pending:
        yield _decode_lines(pending, count)


def _names_a_level(text: str) -> bool:
    """The text may name a record's level: `"levelname"`, `"level"` or `"severity"` (two `in` tests: a flood of the
    smallest records costs each)."""
    return '"level' in text or '"severity"' in text


def _decode_lines(text: str, count: list[int]) -> str:
    if not _names_a_level(text):
        return text
    out = []
    number = count[0]
    for line in text.split("\n"):
        at = line.find(_OPENING, 0, STAMP_MAX + len(_OPENING))
        if at < 0:
            out.append(line)
            continue
        if at == 0:  # (the record alone on its line: no stamp, no process outside it)
            rendered, stamp = render(line, number), ""
        else:
            before = line[:at]
            process = _PROCESS_PREFIX.fullmatch(before) if before.endswith(") ") else None
            known = process is not None and (not process["stamp"] or _STAMP.fullmatch(process["stamp"]) is not None)
            stamp = before if known or _STAMP.fullmatch(before) else ""
            rendered = render(line[len(stamp) :], number, known) if stamp else None
        if rendered is None:
            out.append(line)
        else:
            number += 1
            out.append("\n".join([stamp + r for r in rendered] if stamp else rendered))
    count[0] = number
    return "\n".join(out)
