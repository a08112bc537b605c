"""The findings of a log: which known message each engine line carries. Standard library only.

A line from the engine decides with any message; a request's traceback (an API-server line)
carries the engine's error when the engine died under it, but its other lines can carry the
request's text: there only an error of a type the engine raises, matched from the start of its
message, counts (and any known non-memory failure, which can only ever say "not memory").
Where in its logged message a line is (the engine's opening words, a traceback, a value written
into the message) is placement.py's; whose words an exception's message holds (a further line of it,
a request's report, an exception of a type that carries no failure) is quoted.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from . import messages as msg
from .needles import any_of, finder
from .origin import ENGINE, MATCH_CHARS, REQUEST
from .placement import (
    ANY,
    CARETS,
    COLLECTOR_TIME,
    EXCEPTION_LINE,
    EXCEPTION_TYPE,
    FRAME_LINE,
    OPENING,
    RAISED,
    VALUE,
    LoggedMessage,
    Placement,
)
from .quoted import mark_continuations, of_another_type
from .scan import Line, process_of

# Kinds that name a failure: only an error the engine reported (not a progress or warning line,
# not a request's own error) decides with them.
FAILURE_KINDS = {msg.MEMORY, msg.HOST, msg.NOT_OOM, msg.NCCL_OOM, msg.OOM, msg.KILLED}
INFERENCE_REQUEST = re.compile(r'"POST /(?:v1/|v2/|generate|invocations|pooling|score|classify|rerank|embed)')
REQUEST_ERROR = re.compile(
    r"^(?:ValueError|TypeError|OverflowError|NotImplementedError|vllm\.[\w.]{1,80}Error|"
    r"(?:pydantic_core\._pydantic_core\.|pydantic\.|fastapi\.exceptions\.)?(?:Request)?ValidationError|"
    r"[\w.]{0,80}BadRequestError): "
)
ENGINE_EXCEPTION = re.compile(
    r"^(?:torch\.(?:cuda\.)?OutOfMemoryError|torch\.AcceleratorError|RuntimeError|"
    r"ValueError|MemoryError|torch\.cuda\.CudaError): "
)

# A C++ exception that ended the process (what() carries its text on the next line).
CPP_ABORT = re.compile(r"^terminate called after throwing an instance of ")


@dataclass(eq=False, slots=True)  # (~30,000 of them in a log dense with figure wordings: made and read fast)
class Finding:
    line: Line
    message: msg.Message
    match: re.Match[str]
    last_resort: bool = False  # decides only when nothing else does (a further line of a message)


# Each distinct needle of all the messages is looked for once a line (str `in`, C speed), and
# only the messages whose needles are there run their regex; a line that holds none is skipped.
_NEEDLES = sorted({n for m in msg.MESSAGES if not m.ignores_case for n in m.needles})
_NEEDLES_LOWER = sorted({n for m in msg.MESSAGES if m.ignores_case for n in m.needles})
_KEYS = {id(m): frozenset(("i:" if m.ignores_case else "c:") + n for n in m.needles) for m in msg.MESSAGES}
# needle key -> the positions in MESSAGES of the messages it gates: a line tries only those
# (in table order), not all of them (on short lines the loop over the table cost most).
_GATED: dict[str, list[int]] = {}
for _i, _m in enumerate(msg.MESSAGES):
    for _k in _KEYS[id(_m)]:
        _GATED.setdefault(_k, []).append(_i)
_MEMORY = [m for m in msg.MESSAGES if m.kind == msg.MEMORY]
_MEMORY_NEEDLES = [n for m in _MEMORY if not m.ignores_case for n in m.needles]
_MEMORY_NEEDLES_LOWER = [n for m in _MEMORY if m.ignores_case for n in m.needles]


_CASED = finder(_NEEDLES)


def _gated(text: str, lowered: str) -> list[int]:
    """The rows (positions in MESSAGES, in table order) whose needles the line holds."""
    rows: set[int] = set()
    for n in _CASED(text):
        rows.update(_GATED["c:" + n])
    for n in _NEEDLES_LOWER:
        if n in lowered:
            rows.update(_GATED["i:" + n])
    return sorted(rows)


# A failure quoted inside an exception of another type is that exception's text (a LoRA path, a
# tool name, a template's message), not the failure: on a line `Type: message`, a memory, host or
# kill finding counts only for the types that carry those failures (and generic wrappers).
DECIDING = (FAILURE_KINDS - {msg.NOT_OOM}) | {msg.BUDGET}  # what may name a memory cause


ROW_CHAR_BUDGET = 16 * 1024  # characters of regex search a line may cost, over all its rows
ROW_SHARE_MIN = 256


def findings_of(lines: list[Line]) -> list[Finding]:
    out = []
    placement = Placement()
    mark_continuations(lines)
    for i, line in enumerate(lines):
        if line.origin not in (ENGINE, REQUEST):
            continue
        where, opened = placement.of(line)  # where in its message the line is (placement.py)
        # a value written into a message (an opening progress line is one until it shows the engine's words)
        line.value = where == VALUE or (where == OPENING and line.informational)
        # A further line of an exception's message is that message's text: the engine's own failure
        # (NCCL's `Last error:` line), or else a client's (a request's traceback), which names no phase,
        # no figure and no memory failure, and may say "not memory" only as a last resort. An
        # exception of a type that carries no failure names no memory failure.
        continued = line.continued
        untrusted = continued and not line.engine_message
        quoted = of_another_type(line)
        text = line.match_text
        lowered = text.lower()
        rows = _gated(text, lowered)
        if not rows:
            trusted = not line.continued or line.engine_message
            if line.origin == ENGINE and where == ANY and not quoted and not line.request_report and trusted:
                out += _wrapped(line, lines[i + 1 : i + 3])
            continue
        memory = False
        mark = len(out)
        # A request's traceback (an API-server line) carries the engine's error when the engine
        # died under it, but its other lines can carry the request's text: there only an error of
        # a type the engine raises, matched from the start of its message, counts.
        # So does any line of a request's report (the web framework's, an API handler's, the engine's
        # report on compiling a request's grammar: GRAMMAR_FRAME).
        requests = line.origin == REQUEST or line.request_report
        anchor = ENGINE_EXCEPTION.match(text) if requests else None
        # ... and a non-memory finding only from the errors vLLM raises for a request (a template's
        # own exception carries whatever its author, or the request, put in it).
        request_error = requests and REQUEST_ERROR.match(text) is not None
        # The regex work is rows x length. A real line gates at most ~10 rows (the corpus: <= 8 KiB
        # of work); a crafted one holding every row's needle would cost 20x a normal line, so past
        # the budget each row sees only its share of the line, from the start.
        hay = text[: max(ROW_SHARE_MIN, ROW_CHAR_BUDGET // len(rows))]
        if len(hay) < len(text):
            rows = _rows_seeing_a_needle(rows, hay)
        carried = False  # the line is the engine's failure a request's report carries (from its start)
        engines = line.origin == ENGINE and not requests
        for index in rows:  # (table order: the failures' rows come before the figures')
            message = msg.MESSAGES[index]
            found = message.regex.search(hay)
            if found is None:
                continue
            anchored = anchor is not None and found.start() == anchor.end()
            if (
                not (quoted and message.kind in DECIDING)
                and not (untrusted and message.kind != msg.NOT_OOM)
                and (
                    engines
                    or (message.kind == msg.NOT_OOM and request_error)
                    # (the engine's failure a request's traceback carries: no marker of the client's,
                    # but the figures of that message, which it composed from its own state)
                    or (anchored and message.kind in FAILURE_KINDS)
                    or (carried and message.kind == msg.FIGURE)
                )
            ):
                out.append(Finding(line, message, found, last_resort=untrusted))
                memory = memory or message.kind == msg.MEMORY
                carried = carried or (anchored and message.kind in FAILURE_KINDS)
        if where != ANY:
            out[mark:] = _placed(out[mark:], where, opened)
            continue
        if not memory and line.origin == ENGINE and not quoted and not continued and not requests:
            out += _wrapped(line, lines[i + 1 : i + 3])
    return out


# Rows whose needles are matched regardless of case: a match of theirs may hold a needle only as
# str.lower() spells it (Unicode's case folding is not lower()'s), so they run wherever gated.
_CASE_BLIND = frozenset(i for i, m in enumerate(msg.MESSAGES) if m.ignores_case)


def _rows_seeing_a_needle(rows: list[int], hay: str) -> list[int]:
    """The rows that can match in the hay, a line's start: every match of a row holds one of its
    needles, so a row none of whose needles is in the hay cannot (on a line holding every row's
    needle, 84 regex searches of 256 characters cost ~370 us; one pass of the needle finder, ~30)."""
    seeing = _CASE_BLIND.union(*(_GATED["c:" + n] for n in _CASED(hay)))
    return [i for i in rows if i in seeing]


def _placed(found: list[Finding], where: str, opened: LoggedMessage | None) -> list[Finding]:
    """The findings that count on a line whose words are not all the engine's (placement.py): an
    opening line's, when it opens with a known message or marker; else only "not memory"."""
    if where == OPENING and opened is not None and any(f.match.start() == 0 for f in found):
        opened.trusted = True  # the message opens with the engine's words: all of it is the engine's
        found[0].line.value = False
        return found
    return [f for f in found if f.message.kind == msg.NOT_OOM]  # a warning's last resort, never more


def _collector_prefix(line: Line) -> str:
    """What a collector put before the line's text (a per-line time aside: `kubectl logs
    --timestamps`, compose's service tag), when the line has no logger header of its own nor a
    process prefix (a process's re-print goes on with frames and code lines under it: no wrapping)."""
    if line.level or line.source_file or not line.raw.endswith(line.text):
        return "<header>"
    prefix = line.raw[: len(line.raw) - len(line.text)]
    return "<header>" if process_of(prefix) else COLLECTOR_TIME.sub("", prefix).strip()


def _wrapped(line: Line, following: list[Line]) -> list[Finding]:
    """A memory message a pretty-printer wrapped over the next lines: bare lines, or lines with
    only the prefix a collector put on the first one too (a collector stamps every line)."""
    # (a flood of short bare lines calls this on every line: the needle test first, on all that may
    # be joined, of which the joined text is a prefix, before the tests of which lines join; but a
    # next line with a header of its own, or not the engine's, joins none: two attribute reads)
    if not following or following[0].level or following[0].origin != ENGINE:
        return []
    if not _holds_memory_needle(" ".join([line.text] + [nxt.text for nxt in following])[:MATCH_CHARS]):
        return []
    rest: list[Line] = []
    prefix = _collector_prefix(line)
    for nxt in following:
        # (an exception of another type ends it: what follows is that exception's message)
        bare = nxt.raw == nxt.text or (prefix != "<header>" and _collector_prefix(nxt) == prefix)
        if nxt.origin != ENGINE or not bare or nxt.level or of_another_type(nxt):
            break
        rest.append(nxt)
    if not rest:
        return []
    text = " ".join([line.text] + [nxt.text for nxt in rest])[:MATCH_CHARS]
    lowered = text.lower()
    if not _holds_memory_needle(text, lowered):
        return []
    found = [Finding(line, message, match) for message in _MEMORY if (match := message.search(text, lowered))]
    # A further line of an exception's message may be a client's: joined with one, only a message
    # that opens where the exception's own message does is the engine's (its wording, wrapped).
    if any(nxt.continued and not nxt.engine_message for nxt in rest):
        typed = EXCEPTION_TYPE.match(line.text)
        found = [f for f in found if typed is not None and f.match.start() == typed.end()]
    return found


_HOLDS_MEMORY_NEEDLE, _HOLDS_MEMORY_NEEDLE_LOWER = any_of(_MEMORY_NEEDLES), any_of(_MEMORY_NEEDLES_LOWER)


def _holds_memory_needle(text: str, lowered: str | None = None) -> bool:
    return _HOLDS_MEMORY_NEEDLE(text) or _HOLDS_MEMORY_NEEDLE_LOWER(text.lower() if lowered is None else lowered)


def _exceptions(engine_lines: list[Line]) -> Iterator[Line]:
    """Each exception line the engine printed: a line named like an error, a C++ terminate, or any
    `Name: message` line where a Python traceback ends (after a frame, its code line and its carets)."""
    since_frame = 99
    for ln in engine_lines:
        text = ln.match_text
        ends_traceback = 2 <= since_frame <= 3 and RAISED.match(text) is not None
        # (a further line of an exception's message is that message, whatever it looks like)
        if (ends_traceback or EXCEPTION_LINE.match(text) or CPP_ABORT.match(text)) and not ln.continued:
            yield ln
        if FRAME_LINE.match(ln.text):
            since_frame = 1
        elif since_frame == 1 or (since_frame == 2 and CARETS.match(ln.text)):
            since_frame += 1  # the frame's code line, then its carets
        else:
            since_frame = 99


def final_exception(engine_lines: list[Line]) -> Line | None:
    """The last exception the engine printed that is not a generic wrapper."""
    found = None
    for ln in _exceptions(engine_lines):
        if not msg.WRAPPERS.search(ln.match_text):
            found = ln
    return found


def wrapped_only(engine_lines: list[Line]) -> bool:
    """The engine printed a generic wrapper (`See root cause above`, EngineDeadError, ...) and no
    other exception: the failure it wraps is not in the log."""
    wrappers = [msg.WRAPPERS.search(ln.match_text) is not None for ln in _exceptions(engine_lines)]
    return bool(wrappers) and all(wrappers)
