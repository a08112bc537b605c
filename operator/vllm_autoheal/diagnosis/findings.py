"""The findings of a log: which known message each engine line carries. Standard library only.

A line from the engine decides with any message; a request's traceback (an API-server line)
carries the engine's error when the engine died under it, but its other lines can carry the
request's text: there only an error of a type the engine raises, matched from the start of its
message, counts (and any known non-memory failure, which can only ever say "not memory").
Where in its logged message a line is (the engine's opening words, a traceback, a value written
into the message) is placement.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from . import log_records
from . import messages as msg
from .needles import finder
from .placement import (
    ANY,
    CARETS,
    CARRIES_FAILURES,
    COLLECTOR_TIME,
    EXCEPTION_LINE,
    EXCEPTION_TYPE,
    FRAME_LINE,
    OPENING,
    RAISED,
    REPORTER,
    TRACEBACK_TEXT,
    VALUE,
    LoggedMessage,
    Placement,
)
from .scan import ACCESS, ENGINE, GAP_LINE, MATCH_CHARS, REQUEST, USER, Line, a_requests_file, process_of

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


@dataclass(eq=False)
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


def _present(text: str, lowered: str) -> set[str]:
    return {"c:" + n for n in _CASED(text)} | {"i:" + n for n in _NEEDLES_LOWER if n in lowered}


# A failure quoted inside an exception of another type is that exception's text (a LoRA path, a
# tool name, a template's message), not the failure: on a line `Type: message`, a memory, host or
# kill finding counts only for the types that carry those failures (and generic wrappers).
DECIDING = (FAILURE_KINDS - {msg.NOT_OOM}) | {msg.BUDGET}  # what may name a memory cause


# The first exception named like an error in a line's opening, after whatever prefix the line still
# has (a launcher's or collector's that no rule cut: srun's padded "  0: ", a wrapper's own logging
# format): the client's text in that exception's message comes after it, so the first one is the
# engine's. Found from where its name ends (a literal), then back to where the name starts: linear.
_NAMED_END = re.compile(r"(?:Error|Exception)(?:\([\w.]{1,80}\))?: ")
_NAME = re.compile(r"[A-Za-z_][\w.]{0,120}")
_BEFORE_NAME = frozenset(" \t])>|:")
TYPED_WITHIN = 160  # characters of a line's opening where that exception may start
NAME_CHARS = 120


def first_named_exception(text: str) -> str | None:
    """The name of the first exception named like an error (`...Error: `, `...Exception: `) that starts
    within the line's first TYPED_WITHIN characters, at the line's start or after a blank or a
    separator; None if there is none."""
    head = text[: TYPED_WITHIN + NAME_CHARS + 20]
    for end in _NAMED_END.finditer(head):
        word_end = end.start() + (5 if head.startswith("Error", end.start()) else 9)
        start = word_end
        while start > 0 and word_end - start <= NAME_CHARS and (head[start - 1].isalnum() or head[start - 1] in "._"):
            start -= 1
        if start > TYPED_WITHIN:
            return None
        name = _NAME.match(head, start)
        # (a bare `Error: ` or `Exception: ` is a word of the message, "failed with Error: ...", no type)
        if name is None or name.end() != word_end or name.group(0) in ("Error", "Exception"):
            continue
        if start == 0 or head[start - 1] in _BEFORE_NAME:
            return name.group(0)
    return None


def exception_of_another_type(line: Line, named_like_an_error: bool = False) -> str | None:
    """The name of the exception the line opens with (or names first in its opening, after a prefix no
    rule knows), when that type carries none of the failures the classifier names; else None. With
    `named_like_an_error`, only an exception named `...Error`/`...Exception` counts: a `name: ` opening
    that names no error (argparse's `main.py: error: ...`, `Failed: Cuda error ...`) is the engine's
    own words, which evidence may quote."""
    if REPORTER.match(line.text):
        return None
    typed = None if named_like_an_error else EXCEPTION_TYPE.match(line.text)
    name = typed.group(1) if typed else first_named_exception(line.text)
    return name if name is not None and not CARRIES_FAILURES.search(name) else None


def of_another_type(line: Line) -> bool:
    """An exception of a type that carries none of the failures the classifier names: its message is
    what it was given (a key, a path, a template's text), which names no failure."""
    return exception_of_another_type(line) is not None


# A traceback that runs through the web framework or an API handler is a request's: its exception
# may carry the request's text, over as many lines as the client likes. (Its first line may also
# carry the engine's failure, which the API server reports to the request: EngineDeadError's
# "original error".)
# (Python's frame line, and a notebook's: FRAME_LINE)
_REQUEST_CODE = r"(?:/starlette/|/fastapi/|/uvicorn/|/serving_\w{1,40}\.py\b)"
REQUEST_FRAME = re.compile(rf'File "[^"]{{0,300}}{_REQUEST_CODE}|(?:File |^)[^"\s]{{0,300}}{_REQUEST_CODE}')
# The engine compiling a request's structured-output grammar (vLLM's structured_output and
# guided_decoding, the grammar libraries): no failure of the engine's reaches that code, so the
# exception it raises is about the request, its text the request's from its first line on.
_GRAMMAR_CODE = (
    r"(?:/structured_output/|/guided_decoding/|/xgrammar/|/llguidance/|/outlines(?:_core)?/|/lmformatenforcer/)"
)
GRAMMAR_FRAME = re.compile(rf'File "[^"]{{0,300}}{_GRAMMAR_CODE}|(?:File |^)[^"\s]{{0,300}}{_GRAMMAR_CODE}')


Writer = tuple[str, str, int | None]  # a line's logger header (times aside), process prefix and rank


def _writer(line: Line) -> Writer:
    """Who printed the line: vLLM's logger header (a collector's per-line time aside), the process
    prefix and the rank. (glog's and KServe's headers, backticks, are no writer of their own.)"""
    prefix = line.raw[: len(line.raw) - len(line.text)] if line.raw.endswith(line.text) else ""
    return COLLECTOR_TIME.sub("", line.header), process_of(prefix), line.rank


# The exceptions whose text the library composes from its own state, never from what it was given:
# NCCL's (its `Last error:` line names the CUDA call's failure), torch elastic's report of its
# children (their exit codes and signals), torch's OOM (sizes only: what follows it is the engine's
# output, a loading bar), Ray's news that an actor died (its worker's exit type and detail, the
# memory monitor's report). Any other message may quote a request's grammar or a LoRA name, over
# as many lines as that holds.
# (Matched at the start of the exception line, by its type or torch's `NCCL error` opening, also as
# vLLM V1's executor quotes a worker's error: a name anywhere else in the line may be the text the
# exception quotes.)
ENGINE_REPORT = re.compile(
    r"^(?:[\w.]{0,200}\.)?(?:DistBackendError|ChildFailedError|\w{0,40}OutOfMemoryError|ActorDiedError|RayActorError|"
    r"ncclUnhandledCudaError)\b|^(?:[\w.]{0,200}\.)?\w{0,40}Error: (?:Worker failed with error ')?NCCL error\b"
)


def mark_continuations(lines: list[Line]) -> None:
    """Mark each line that goes on the message of an exception line above it (a newline in a
    client's id, path, template or grammar; NCCL's `Last error:`): the same writer, with no frame
    or traceback line in between (a real traceback goes on with one, a new logged message with a
    header of its own). A request's report (uvicorn's `Exception in ASGI application`, a traceback
    through the web framework or an API handler, an API-server line) holds the client's text
    wherever it is, so no line of its writer ends it: only another writer does. The engine's report
    on compiling a request's grammar (GRAMMAR_FRAME) is the request's from its first line on
    (`grammar_report`); any request's report is the request's (`request_report`), where only a failure
    that opens an exception's message counts (findings_of). A JSON record's lines inside a request's
    report are the report's (`absorbed`, below). Only an ENGINE_REPORT of the engine's, in no request's
    report, goes on in the engine's own words (`engine_message`)."""
    writer: Writer | None = None  # who wrote the open exception line
    request: Writer | None = None  # who is writing a request's report
    engines = compiling = False  # ... the exception is the engine's own report; the report is a grammar's
    # A grammar's report printed without vLLM's logger header is a dying engine process re-printing its
    # fatal exception (multiprocessing's `Process EngineCore_DP0:`): that process logs nothing after it,
    # so a line of it that opens with a logger header is the client's text (the grammar's newlines).
    dying = False
    after_gap = False  # the line before was a gap (`[...]`): lines were left out there

    def same(a: tuple | None, b: tuple | None) -> bool:
        # (a re-print without any process prefix, the CPU engine's and every JSON-mode log's, names no
        # process: a line of the client's that writes one is still the dying process's)
        return a == b or (dying and a is not None and b is not None and (a[1:] == b[1:] or not a[1] or not b[1]))

    for line in lines:
        text = line.text
        if after_gap and (line.origin == REQUEST or a_requests_file(line.source_file)):
            # After a gap (the operator's window on a long log, the launcher's kept head and tail) a request's
            # report may go on whose opening and exception line were left out: its lines, up to another writer's,
            # are that exception's further lines (a client's), whatever they look like (the first one too: its
            # header is the request handler's, its words may be a client's). (Any writer's message cut there is
            # not: the window can open in the engine's own traceback, and the engine's lines must decide.)
            writer = request = _writer(line)
        after_gap = text == GAP_LINE
        # A JSON record's lines inside a request's report that no logger headed: a raw line that parsed as
        # a record, as the client can write one there. They are the report's, and open or end nothing,
        # unless vLLM's stdout decorator put another process's prefix before the record (a client's line
        # in the report gets the report's own process prefix first). (In any other message a record is a
        # new logged message, as a headed line is in a text log: a thread's traceback must not hide the
        # engine's records after it.)
        absorbed = (
            request is not None
            and not request[0]
            and log_records.is_decoded(line.header)
            and not (request[1] and log_records.process_outside(line.header) and _writer(line)[1] != request[1])
        )
        framing = not absorbed and (FRAME_LINE.match(text) is not None or text.startswith(TRACEBACK_TEXT))
        grammar = framing and GRAMMAR_FRAME.search(text) is not None
        opens = not absorbed and (
            text.startswith("Exception in ASGI application")
            or grammar
            or (framing and REQUEST_FRAME.search(text) is not None)
        )
        if absorbed:
            who = request
        elif writer is not None or request is not None or opens or EXCEPTION_LINE.match(text):
            who = _writer(line)
            open_without_header = next((w for w in (writer, request) if w is not None and not w[0]), None)
            if line.learned_header and open_without_header is not None and who[1:] == open_without_header[1:]:
                # A header learned from the log (log_format.py) is no writer of its own inside an exception's
                # message or a request's report printed without one, as glog's and KServe's are not: a client's
                # line may open with it there (vLLM's own header there is s9's known limit).
                who = open_without_header
        else:
            who = None
        if request is not None and not same(who, request):
            request = None  # another writer: the request's report is over
        if opens or (not absorbed and line.origin == REQUEST and EXCEPTION_LINE.match(text)):
            if not (compiling and same(request, who)):  # (a report goes on: it keeps its writer)
                compiling, request = grammar, who
                dying = grammar and not line.level
        elif request is None:
            compiling = dying = False
        # (a request's report ends only with its writer: a line its client wrote may look like a frame)
        line.continued = absorbed or (
            writer is not None and same(who, writer) and (not framing or same(request, writer))
        )
        line.engine_message = line.continued and engines and not absorbed
        line.grammar_report = request is not None and compiling
        line.request_report = request is not None
        if not line.continued:
            writer = who if EXCEPTION_LINE.match(text) else None
            engines = (
                writer is not None
                and line.origin == ENGINE
                and request is None
                and ENGINE_REPORT.match(text) is not None
            )


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
        present = _present(text, lowered)
        if not present:
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
        rows = sorted({i for key in present for i in _GATED[key]})
        # The regex work is rows x length. A real line gates at most ~10 rows (the corpus: <= 8 KiB
        # of work); a crafted one holding every row's needle would cost 20x a normal line, so past
        # the budget each row sees only its share of the line, from the start.
        hay = text[: max(ROW_SHARE_MIN, ROW_CHAR_BUDGET // len(rows))]
        carried = False  # the line is the engine's failure a request's report carries (from its start)
        for index in rows:  # (table order: the failures' rows come before the figures')
            message = msg.MESSAGES[index]
            found = message.regex.search(hay)
            anchored = anchor is not None and found is not None and found.start() == anchor.end()
            if (
                found
                and not (quoted and message.kind in DECIDING)
                and not (untrusted and message.kind != msg.NOT_OOM)
                and (
                    (line.origin == ENGINE and not requests)
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
    # (a flood of short bare lines calls this on every line: one pass over the needles first)
    if not any(n in text for n in _MEMORY_NEEDLES) and not any(n in lowered for n in _MEMORY_NEEDLES_LOWER):
        return []
    found = [Finding(line, message, match) for message in _MEMORY if (match := message.search(text, lowered))]
    # A further line of an exception's message may be a client's: joined with one, only a message
    # that opens where the exception's own message does is the engine's (its wording, wrapped).
    if any(nxt.continued and not nxt.engine_message for nxt in rest):
        typed = EXCEPTION_TYPE.match(line.text)
        found = [f for f in found if typed is not None and f.match.start() == typed.end()]
    return found


def served_before(lines: list[Line], failure: Line) -> bool:
    """An inference request reached the server before the failure: its access line or its echo
    was logged (only their presence counts, never their text). Sleep-mode and admin endpoints
    (/wake_up, /sleep, /health) do not count: they are answered around start-up too."""
    return any(
        (ln.origin == USER or (ln.origin == ACCESS and INFERENCE_REQUEST.search(ln.text[:200])))
        for ln in lines
        if ln.offset < failure.offset
    )


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
