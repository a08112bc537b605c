"""The findings of a log: which known message each engine line carries. Standard library only.

A line from the engine decides with any message; a request's traceback (an API-server line)
carries the engine's error when the engine died under it, but its other lines can carry the
request's text: there only an error of a type the engine raises, matched from the start of its
message, counts (and any known non-memory failure, which can only ever say "not memory").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import messages as msg
from .scan import ENGINE, MATCH_CHARS, REQUEST, Line

# Kinds that name a failure: only an error the engine reported (not a progress or warning line,
# not a request's own error) decides with them.
FAILURE_KINDS = {msg.MEMORY, msg.HOST, msg.NOT_OOM, msg.NCCL_OOM, msg.OOM, msg.KILLED}
ENGINE_EXCEPTION = re.compile(
    r"^(?:torch\.(?:cuda\.)?OutOfMemoryError|torch\.AcceleratorError|RuntimeError|"
    r"ValueError|MemoryError|torch\.cuda\.CudaError): "
)


@dataclass(eq=False)
class Finding:
    line: Line
    message: msg.Message
    match: re.Match[str]


def findings_of(lines: list[Line]) -> list[Finding]:
    out = []
    for i, line in enumerate(lines):
        if line.origin not in (ENGINE, REQUEST):
            continue
        text = line.match_text
        lowered = text.lower()
        memory = False
        # A request's traceback (an API-server line) carries the engine's error when the engine
        # died under it, but its other lines can carry the request's text: there only an error of
        # a type the engine raises, matched from the start of its message, counts.
        anchor = ENGINE_EXCEPTION.match(text) if line.origin == REQUEST else None
        for message in msg.MESSAGES:
            found = message.search(text, lowered)
            if found and (
                line.origin == ENGINE
                or message.kind == msg.NOT_OOM
                or (anchor is not None and found.start() == anchor.end())
            ):
                out.append(Finding(line, message, found))
                memory = memory or message.kind == msg.MEMORY
        if not memory and line.origin == ENGINE:
            out += _wrapped(line, lines[i + 1 : i + 3])
    return out


def _wrapped(line: Line, following: list[Line]) -> list[Finding]:
    """A memory message a pretty-printer wrapped over the next lines (bare lines, no prefix)."""
    rest = []
    for nxt in following:
        if nxt.origin != ENGINE or nxt.raw != nxt.text or nxt.level:
            break
        rest.append(nxt.text)
    if not rest:
        return []
    text = " ".join([line.text] + rest)[:MATCH_CHARS]
    lowered = text.lower()
    return [
        Finding(line, message, found)
        for message in msg.MESSAGES
        if message.kind == msg.MEMORY and (found := message.search(text, lowered))
    ]
