"""A container runtime's own log files, read as the lines the container wrote. Standard library only.

`kubectl logs` returns what the container wrote, but a log copied from a node is in the runtime's
format: the kubelet's CRI files (`<RFC 3339 time> <stream> <P|F> <text>`) or docker's json-file
records (`{"log": "<text>\\n", "stream": ..., "time": ...}`). Both split a line longer than the
runtime's buffer (16 KiB) into records: partial ones (`P`; a `log` without its newline) and the
last. Read record by record, the pieces of a long logged prompt would start lines of the client's
choosing, so the pieces are joined back into the one line the container wrote. The format is told
from the first line, for the whole input: a client cannot switch it halfway.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

_CRI = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d) (?:stdout|stderr) ([FP]) ?")
_DOCKER = '{"log":'
FIRST_LINE_MAX = 64 * 2**10  # the first line is looked for within this much
JOINED_MAX = 1 * 2**20  # one joined line keeps at most this much (a never-ending chain of partial records)
_BATCH = 1 * 2**20  # decoded text is handed on in pieces of about this size


def _cri(record: str) -> tuple[str, bool]:
    found = _CRI.match(record)
    return (record[found.end() :], found.group(1) == "P") if found else (record, False)


def _docker(record: str) -> tuple[str, bool]:
    if not record.startswith(_DOCKER):
        return record, False
    try:
        data = json.loads(record)
    except (ValueError, RecursionError):  # (a deeply nested value exhausts the parser's recursion)
        return record, False
    text = data.get("log") if isinstance(data, dict) else None
    if not isinstance(text, str):
        return record, False
    return text.rstrip("\n").replace("\n", " "), not text.endswith("\n")


def _records(chunks: Iterable[str]) -> Iterator[str]:
    rest = ""
    for chunk in chunks:
        parts = (rest + chunk).split("\n")
        rest = parts.pop()
        yield from parts
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
    joined = ""
    for record in _records(_chain(head, chunks)):
        text, partial = read(record)
        if len(joined) < JOINED_MAX:
            joined += text[: JOINED_MAX - len(joined)]
        if partial:
            continue
        out.append(joined + "\n")
        size += len(joined) + 1
        joined = ""
        if size >= _BATCH:
            yield "".join(out)
            out, size = [], 0
    if joined:
        out.append(joined + "\n")
    if out:
        yield "".join(out)


def _chain(head: str, chunks: Iterator[str]) -> Iterator[str]:
    yield head
    yield from chunks
