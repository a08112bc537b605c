"""Whose words an exception's message holds. Standard library only.

An exception of a type that carries none of the failures the classifier names holds what it was
given (a key, a path, a template's text): a failure it quotes is no failure of the engine's. A
further line of an exception's message (a newline in a client's id, path or grammar; NCCL's `Last
error:`) is that message's text; a request's report (the web framework's, an API handler's, the
engine's on compiling a request's grammar) holds the client's words wherever they are. Only the
engine's own report (ENGINE_REPORT) goes on in the engine's words. What each line then carries is
findings.py's.
"""

from __future__ import annotations

import re

from . import log_records
from .origin import ENGINE, REQUEST, a_requests_file
from .placement import (
    CARRIES_FAILURES,
    COLLECTOR_TIME,
    EXCEPTION_LINE,
    EXCEPTION_TYPE,
    FRAME_LINE,
    REPORTER,
    TRACEBACK_TEXT,
)
from .scan import GAP_LINE, Line, process_of

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
    if name is not None and CARRIES_FAILURES.search(name) and _VALUED.match(line.text) is None:
        return None
    return name


# multiprocessing's banner before a process's fatal exception, printed raw as the process dies (BaseProcess._bootstrap)
_BANNER = re.compile(r"Process [\w.-]{1,80}:$")
# vLLM's messages that open with the engine's words and go on with what a request named: the LoRA adapter's
# name and path (lora/worker_manager.py, 0.6 on: `Loading lora {name} failed: No adapter found for {path}`, and
# `Loading lora {path} failed` over any other error, the real one chained above it), which a client chooses
# (/v1/load_lora_adapter, a resolver's `model`). Whatever the type, such a message names no failure.
# (also as vLLM V1's executor quotes a worker's error: `Worker failed with error '...'`, as ENGINE_REPORT reads it)
_VALUED = re.compile(r"^(?:[\w.]{0,200}\.)?\w{0,80}(?:Error|Exception): (?:Worker failed with error ')?Loading lora ")


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
    # The same for the open exception line when it ends such a re-print (after multiprocessing's `Process <name>:`
    # banner, no logger header since) of a message holding what a request named (_VALUED: a LoRA adapter's name,
    # which may hold newlines): its further lines are the client's, a logger header or a record on them too. (A raw
    # traceback with no banner may come from a process that goes on logging: its later lines are its own.)
    valued = reprint = False
    after_gap = False  # the line before was a gap (`[...]`): lines were left out there

    def same(a: tuple | None, b: tuple | None) -> bool:
        # (a re-print without any process prefix, the CPU engine's and every JSON-mode log's, names no
        # process: a line of the client's that writes one is still the dying process's)
        relaxed = dying or valued
        return a == b or (relaxed and a is not None and b is not None and (a[1:] == b[1:] or not a[1] or not b[1]))

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
        # (a request's report ends only with its writer: a line its client wrote may look like a frame; so does a
        # valued re-print's message, after which its dead process prints no traceback)
        line.continued = absorbed or (
            writer is not None and same(who, writer) and (not framing or valued or same(request, writer))
        )
        line.engine_message = line.continued and engines and not absorbed
        line.grammar_report = request is not None and compiling
        line.request_report = request is not None
        if not line.continued:
            writer = who if EXCEPTION_LINE.match(text) else None
            valued = writer is not None and reprint and not line.level and _VALUED.match(text) is not None
            engines = (
                writer is not None
                and line.origin == ENGINE
                and request is None
                and ENGINE_REPORT.match(text) is not None
            )
        reprint = (reprint or _BANNER.match(text) is not None) and not line.level
