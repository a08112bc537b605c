"""A container runtime's own log files, read as the lines the container wrote. Standard library only.

`kubectl logs` returns what the container wrote, but a log copied from a node is in the runtime's
format: the kubelet's CRI files (`<RFC 3339 time> <stream> <P|F> <text>`) or docker's json-file
records (`{"log": "<text>\\n", "stream": ..., "time": ...}`). Both split a line longer than the
runtime's buffer (16 KiB) into records: partial ones (`P`; a `log` without its newline) and the
last, with the other stream's records (stdout, stderr) in between. Read record by record, the
pieces of a long logged prompt would start lines of the client's choosing, so the pieces are joined
back, within their stream, into the one line the container wrote. The format is told from the
first line, for the whole input: a client cannot switch it halfway.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator

_CRI = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d) (stdout|stderr) ([FP]) ?")
_DOCKER = '{"log":'
FIRST_LINE_MAX = 64 * 2**10  # the first line is looked for within this much
JOINED_MAX = 1 * 2**20  # one joined line keeps at most this much (a never-ending chain of partial records)
_BATCH = 1 * 2**20  # decoded text is handed on in pieces of about this size


# (text, whether more of its line follows, the stream it was written to: stdout and stderr share
# one file, and a line's pieces are joined within their stream)
Record = tuple[str, bool, str]


def _cri(record: str) -> Record:
    found = _CRI.match(record)
    return (record[found.end() :], found.group(2) == "P", found.group(1)) if found else (record, False, "")


def _docker(record: str) -> Record:
    if not record.startswith(_DOCKER):
        return record, False, ""
    try:
        data = json.loads(record)
    except (ValueError, RecursionError):  # (a deeply nested value exhausts the parser's recursion)
        return record, False, ""
    text = data.get("log") if isinstance(data, dict) else None
    if not isinstance(text, str):
        return record, False, ""
    stream = data.get("stream")
    return text.rstrip("\n").replace("\n", " "), not text.endswith("\n"), stream if isinstance(stream, str) else ""


def _records(chunks: Iterable[str]) -> Iterator[str]:
    pending: list[str] = []  # (a line longer than a chunk is kept in pieces: no copy per chunk)
    for chunk in chunks:
        parts = chunk.split("\n")
        if len(parts) == 1:
            pending.append(chunk)
            continue
        yield "".join(pending) + parts[0]
        yield from parts[1:-1]
        pending = [parts[-1]]
    rest = "".join(pending)
    if rest:
        yield rest


def unpacked(chunks: Iterable[str]) -> Iterator[str]:
    """The input as the container wrote it: runtime records decoded and their pieces joined; any
    other input as it is, chunk for chunk."""
    chunks = iter(chunks)
    head = ""
    for chunk in chunks:
        head += chunk
        if "\n" in head.lstrip() or len(head) >= FIRST_LINE_MAX:
            break
    first = head.lstrip().split("\n", 1)[0]
    read = _cri if _CRI.match(first) else _docker if first.startswith(_DOCKER) else None
    if read is None:
        if head:
            yield head
        yield from chunks
        return
    out: list[str] = []
    size = 0
    joined: dict[str, str] = {}  # stream -> its line so far
    for record in _records(itertools.chain((head,), chunks)):
        text, partial, stream = read(record)
        line = joined.pop(stream, "")
        if len(line) < JOINED_MAX:
            line += text[: JOINED_MAX - len(line)]
        if partial:
            joined[stream] = line
            continue
        out.append(line + "\n")
        size += len(line) + 1
        if size >= _BATCH:
            yield "".join(out)
            out, size = [], 0
    out += [line + "\n" for line in joined.values() if line]
    if out:
        yield "".join(out)
