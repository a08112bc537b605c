"""Read a log of any size in bounded time and memory, and keep only the lines that can matter,
each tagged with who wrote it. Standard library only.

Bounded work: candidate lines (lines holding a literal anchor, found with str.find at C speed)
are taken only from the first HEAD_BYTES and the last TAIL_BYTES of the input; the bytes in
between are read and dropped. A crash's root cause sits within a few KiB of the end
(DESIGN.md, "Where the cause is in the output") and the start-up figures at the start, so the
windows lose nothing that decides, while a crafted log cannot make the scan do more than a
fixed amount of per-line work. Each line is matched on at most MATCH_CHARS characters.

Who wrote a line (its origin: the engine, user text, access, a request's) is origin.py's; the
further lines of a logged message that opened as user text, or as a failed call that did not
stop the engine, take that message's origin here (_continuations).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

from . import collector, container_log, log_format, log_records
from .candidates import MAX_LINE, head_candidates, tail_candidates
from .origin import ENGINE, FORGED, MATCH_CHARS, REQUEST, USER, origin_of

CHUNK = 1 * 2**20
HEAD_BYTES = 256 * 2**10
TAIL_BYTES = 1 * 2**20
RAW_TAIL_BYTES = 64 * 2**10  # every line here is kept, anchor or not (traceback frames)
GAP_LINE = "[...]"  # stands for the middle of a long log, left unread (markers.py: a gap)
RAW_TAIL_LINES = 2000  # ... up to this many (a normal 64 KiB tail has a few hundred)

# (a colour code as a tool wrote it escaped, `\u001b[` / `\033[`, or with its ESC byte dropped: then only a
# colour's `[0;36m` form is taken, never a bracket a line may open with)
_ANSI = re.compile(r"(?:\x1b|\^\[|#033|\\u001b|\\033|\\x1b)\[[0-9;]{0,20}[A-Za-z]|\[\d{1,3}(?:;\d{1,3}){0,4}m")
_BRACKET_DIGIT = re.compile(r"\[\d")


def _without_ansi(text: str) -> str:
    """The text without its colour codes. (_ANSI tried at every character cost ~13 us a 300-character line;
    every code holds an introducer above, or else `[` and a digit, which str `in` and a regex led by a
    literal find at C speed.)"""
    introduced = "\x1b" in text or "^[" in text or "#033" in text or "\\" in text
    return _ANSI.sub("", text) if introduced or _BRACKET_DIGIT.search(text) else text


_TIMESTAMP = r"\s{0,8}\[?\d{4}-\d\d-\d\d[T ][\d:.,]{1,20}Z?\]?\s{0,8}"  # ISO timestamps
_PREFIXES = re.compile(
    r"^(?:"
    + _TIMESTAMP  # (ISO timestamps)
    + r"|\s{0,8}[\w.-]{0,40}\s{0,8}\|\s"  # docker compose "svc-1  | "
    r"|\s{0,8}\((?:(?P<proc>[\w.:-]{1,60}(?: \w{1,30}(?= pid=))?)(?:,\s{0,4}[\w.:-]{1,60}){0,2}"
    r"(?:,?\s{1,4}rank=(?P<rank>\d{1,4}))?)?(?:,?\s{0,4}pid=\d{1,10})?(?:,?\s{1,4}ip=[\w.:]{1,60})?\)\s{0,8}"
    # (EngineCore_DP0 pid=1), vLLM 0.10's (VllmWorker TP0 pid=1), Ray's (Name pid=1, ip=h), (pid=1),
    # SkyPilot's (node-0, worker1, rank=1, pid=2, ip=h)
    # torch.distributed's "[rank0]:", torchrun --tee's "[default0]:" (its role's name, then the local rank)
    r"|\s{0,8}\[(?:rank|[A-Za-z_][A-Za-z_]{0,29})(?P<rank2>\d{1,4})\]:\s{0,8}"
    r"|\s{0,8}(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s{1,8}\d\d-\d\d\s{1,8}[\d:.]{1,20}\s{1,8}"
    # (a decoded JSON record's line number has 7 digits: log_records.py)
    # (under VLLM_LOGGING_LEVEL=DEBUG, 0.10.2+, the file is a path, shortened: [v1/engine/core.py:1233],
    # [entrypoints/.../utils/api_utils.py:92]; its last part is the file)
    r"(?:\[(?:[\w.-]{1,80}/){0,12}(?P<file>[\w.-]{1,80}?)(?::\d{1,7})?\]|(?P<file2>[\w.-]{1,80}):\d{1,6}\])\s?"
    r"|\s{0,8}(?P<level2>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s{0,8}:\s+"  # uvicorn "INFO:     "
    r"|\s{0,8}(?P<file3>[\w.-]{1,80}\.py):\d{1,6}\]\s"  # truncated "[file.py:N] "
    # glog's (Triton's C++ core, absl): "E1115 02:58:51.162611 1 backend_model.cc:634] " (its level
    # letter is not kept: Triton logs a model's failed initialize() at I)
    r"|\s{0,8}(?P<glog>[IWEF])\d{4}\s\d\d:\d\d:\d\d\.\d{1,9}\s{1,8}\d{1,10}\s[\w.-]{1,80}:\d{1,6}\]\s"
    # KServe's, after its timestamp: "1 kserve ERROR [__main__.py:<module>():254] "
    r"|\s{0,8}\d{1,10}\s[\w.-]{1,60}\s(?P<level3>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s"
    r"\[[\w.-]{1,80}:[\w<>.]{1,80}\(\):\d{1,6}\]\s"
    r")"
)
# (glog's and KServe's file names are not kept: a header is what tells a new logged message from a
# further line of an exception's message, and a client can write either into that message)
_FILES = ("file", "file2", "file3")
_HEADERS = ("level", "level2", "level3", "file3", "glog")  # a logger's header: the message follows
_TP_RANK = re.compile(r"(?:[_ ]TP|\[Rank |rank=)(\d{1,4})")  # Worker_TP0, VllmWorker TP0, PP0_TP1


@dataclass(slots=True)  # (its attributes are read on every pass over the lines and the findings)
class Line:
    offset: int  # position in the input, for ordering
    text: str  # normalized: prefixes and headers removed
    raw: str  # as printed (ANSI removed), for evidence
    rank: int | None  # the worker rank that printed it, when the prefix says
    origin: str = ENGINE
    source_file: str | None = None  # the file named in vLLM's logger header, when there is one
    level: str | None = None  # the logger level in the header (INFO, WARNING, ERROR, ...)
    header: str = ""  # the prefixes and logger header as printed, before `text`
    value: bool = False  # a value written into a message (placement.py): no exception nor frame of the engine's
    continued: bool = False  # goes on the message of an exception line above it (quoted.mark_continuations)
    engine_message: bool = False  # ... of an exception that is the engine's own (not a request's, not quoted)
    grammar_report: bool = False  # in the report of a request's grammar the engine compiled: the request's words
    request_report: bool = False  # in a request's report (its grammar's, the web framework's, an API handler's)
    learned_header: bool = False  # its header is the log's own learned one (log_format.py), not vLLM's

    @property
    def informational(self) -> bool:
        """An INFO/DEBUG/WARNING line reports progress or a warning, never the failure itself."""
        return self.level in ("DEBUG", "INFO", "WARNING", "WARN")

    @property
    def match_text(self) -> str:
        return self.text[:MATCH_CHARS]


@dataclass
class Scan:
    lines: list[Line] = field(default_factory=list)
    total_bytes: int = 0
    truncated: bool = False  # candidate lines were left out between the head and the tail

    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)


def normalize(raw: str) -> tuple[str, int | None]:
    text, rank, *_ = _strip_clean(_without_ansi(raw))
    return text, rank


def _strip_clean(
    text: str, own: log_format.Header | None = None
) -> tuple[str, int | None, str | None, str | None, bool]:
    """The message, the rank, the file and level the logger header names, and whether that header
    is the log's own learned one (`own`, where it is not vLLM's: log_format.py)."""
    # A line pasted as Markdown code opens with backticks (no logger's line does): they are the paste's.
    text = text.lstrip(" `") if text[:1] == "`" else text
    raw = text
    rank = None
    source_file = level = None
    learned = False
    for _ in range(6):  # prefixes nest: timestamp, service, process, level header
        if own is not None and (custom := own.pattern.match(text)):
            text = text[custom.end() :]
            if own.wraps_vllm:
                continue  # a wrapper's header: vLLM's own follows
            after = _PREFIXES.match(text)  # (another prefix after the header came in with user text, as below)
            source_file = FORGED if after is not None and after.end() > 0 else log_format.source_of(custom)
            level, learned = custom["level"], True
            break
        m = _PREFIXES.match(text)
        if not m or m.end() == 0:
            break
        r = m.group("rank") or m.group("rank2")
        if r is None and m.group("proc"):
            t = _TP_RANK.search(m.group("proc"))
            r = t.group(1) if t else None
        if r is not None:
            rank = int(r)
        source_file = source_file or m["file"] or m["file2"] or m["file3"]  # (_FILES: no generator a prefix)
        level = level or m.group("level") or m.group("level2") or m.group("level3")
        text = text[m.end() :]
        if m["level"] or m["level2"] or m["level3"] or m["file3"] or m["glog"]:  # (_HEADERS)
            # The logger's header comes last: what follows is the message. Another prefix there (a
            # second header, or "[rank0]: " in a request id) came in with user text.
            after = _PREFIXES.match(text)
            if after is not None and after.end() > 0:
                return text.strip(), rank, FORGED, level, False
            break
    if rank is None:
        t = _TP_RANK.search(raw[:80])
        rank = int(t.group(1)) if t else None
    return text.strip(), rank, source_file, level, learned


_ERROR_TEXT = re.compile(r"Traceback \(most recent|Exception in ASGI|\w(?:Error|Exception)\b")


def _shows_error(text: str) -> bool:
    """_ERROR_TEXT is in the text. (Its `\\w` tried at every character cost ~20 us a 300-character line,
    twice a line: every match holds `Error`, `Exception` or `Traceback`, which str `in` finds at C speed.)"""
    hinted = "Error" in text or "Exception" in text or "Traceback" in text
    return hinted and _ERROR_TEXT.search(text) is not None


_OWN_STRUCTURE = re.compile(r'\s{0,16}File "|Traceback \(most recent|[\w.]{0,200}(?:Error|Exception)\b')


_STAMP = re.compile(_TIMESTAMP)


def structured(text: str) -> bool:
    """The line opens with a structure of its own: a prefix or header this module knows, a
    traceback's first line or frame, or an exception's name (collector.py cuts no such line). A
    timestamp is none: a collector writes it (journald's, Loki's, CloudWatch's before their tags)."""
    stamp = _STAMP.match(text)
    text = text[stamp.end() :] if stamp else text
    found = _PREFIXES.match(text)
    return (found is not None and found.end() > 0) or _OWN_STRUCTURE.match(text) is not None


def make_line(offset: int, raw: str) -> Line | None:
    return _line_of(offset, _without_ansi(raw))


def _line_of(offset: int, clean: str, own: log_format.Header | None = None) -> Line | None:
    """The Line of a line whose ANSI codes are already removed."""
    if not clean.strip():
        return None
    text, rank, source_file, level, learned = _strip_clean(clean, own)
    if not text:
        return None
    body = clean.rstrip()
    header = body[: len(body) - len(text)].strip() if source_file and body.endswith(text) else ""
    line = Line(offset, text, clean.strip(), rank, origin_of(text, source_file), source_file, level, header)
    line.learned_header = learned
    return line


# A message that reports a call that failed without stopping the engine (a utility RPC such as
# add_lora, an adapter's download; a KV transfer's call to the remote peer a request's kv_transfer_params
# name, written as the client sent it: Mooncake's bootstrap server, MoRIIO's handshakes (its eager one too) and
# notification, NIXL push's remote engine, vLLM 0.32): what it holds is scoped like a request's error.
_SCOPED_MESSAGE = re.compile(
    r"^(?:Invocation of \w{1,60} method failed|Error downloading the HuggingFace model|"
    r"Failed to connect to bootstrap server |Handshake with |Eager MoRIIO handshake failed for |"
    r"Failed to send notification to |No remote agents for engine )"
)
_TIMES = re.compile(r"\d{4}-\d\d-\d\d[T ][\d:.,]{1,20}Z?|\b\d\d-\d\d\s{1,8}[\d:.]{1,20}")


def _without_times(header: str) -> str:
    """The header without its times and blanks. (The blanks by str.split, which takes what `\\s` takes: as
    an alternative of _TIMES, `\\s+` was tried at every character, ~5 us a header.)"""
    return "".join(_TIMES.sub("", header).split())


def _continuations(lines: list[Line]) -> None:
    """The lines of one logged message that began with a request's id or text are user text too,
    and those of a failed call that did not stop the engine are scoped like a request's error:
    the same process, level and file:line in their header (timestamps aside: a collector may stamp
    each line), up to the next line of that process with another header."""
    # A process has at most one message open: its header (times removed) and the origin of the rest of
    # that message, by process (a line of another header of that process ends it). (Keyed by process,
    # not filtered over all the open messages on each line: a log of many processes, each with one
    # open, must cost a lookup a line, not the count of processes.)
    still_open: dict[str, tuple[str, str]] = {}
    previous = ""
    for line in lines:
        key = _without_times(line.header)
        if not key:
            continue  # a line without a header (another process's stderr) ends nothing
        starts_message, previous = key != previous, key
        process = process_of(key)
        opened = still_open.get(process)
        if opened is not None and opened[0] == key:
            line.origin = opened[1] if line.origin == ENGINE else line.origin
            continue
        still_open.pop(process, None)
        # A message that starts as user text opens; a user-text line inside a message (a
        # traceback's code line naming a request) does not make the rest of it user text.
        if line.origin == USER and starts_message:
            still_open[process] = (key, USER)
        elif line.origin == ENGINE and _SCOPED_MESSAGE.match(line.text):
            line.origin = REQUEST
            still_open[process] = (key, REQUEST)


_PROCESS = re.compile(collector.PROCESS_WITH_PID)


def _opens_with_vllm_header(text: str) -> bool:
    """After any prefixes scan knows, the line opens with vLLM's own logger header (its file)."""
    return _strip_clean(text)[2] is not None  # (a second header after it too: that is the client's, not a format)


def process_of(header: str) -> str:
    """The process prefix a header names ('(EngineCore_DP0 pid=1'), or ''."""
    found = _PROCESS.search(header)
    return found.group(0) if found else ""


def _chunks(source: str | IO[str] | Iterable[str]) -> Iterable[str]:
    if isinstance(source, str):
        for i in range(0, len(source), CHUNK):
            yield source[i : i + CHUNK]
    elif hasattr(source, "read"):
        while True:
            block = source.read(CHUNK)
            if not block:
                return
            yield block
    else:
        yield from source


def scan(source: str | IO[str] | Iterable[str]) -> Scan:
    """Candidate lines of the head and tail windows and every line of the last RAW_TAIL_BYTES,
    in input order, normalized and tagged with their origin."""
    head_text = ""
    tail: deque[str] = deque()  # the last TAIL_BYTES (or a little more), as read
    tail_len = 0
    seen = 0
    # (a node's log file: the lines it holds; vLLM's JSON records: the lines its text formatter prints)
    for chunk in log_records.decoded(container_log.unpacked(_chunks(source))):
        # A bare "\r" ends no line: vLLM's formatter writes a header after each "\n" of a message
        # (as "\r\n" + header), never after a "\r", so a "\r" inside a message (a client's JSON
        # request_id) would start a headerless line of the client's choosing. (A progress bar
        # redrawn after each "\r" stays one line.) Same length: offsets do not move.
        chunk = chunk.replace("\r\n", "\n").replace("\r", " ")
        if len(head_text) < HEAD_BYTES:
            take = HEAD_BYTES - len(head_text)
            head_text += chunk[:take]
        tail.append(chunk)
        tail_len += len(chunk)
        seen += len(chunk)
        while tail and tail_len - len(tail[0]) >= TAIL_BYTES:
            tail_len -= len(tail.popleft())
    tail_text = "".join(tail)
    tail_base = seen - len(tail_text)
    if len(tail_text) > TAIL_BYTES:
        tail_base += len(tail_text) - TAIL_BYTES
        tail_text = tail_text[-TAIL_BYTES:]
    merged: dict[int, str] = {}
    # Head window: whole lines only (the last one may be cut by the window).
    cut = head_text.rfind("\n") + 1 if len(head_text) >= HEAD_BYTES else len(head_text)
    for off, text in head_candidates(head_text[:cut]):
        merged[off] = text
    if head_text.startswith(GAP_LINE + "\n"):  # (the operator's window on a long log: kube/client.previous_log)
        merged[0] = GAP_LINE
    # Tail window: skip its first (partial) line unless it starts the input.
    start = 0 if tail_base == 0 else tail_text.find("\n") + 1
    tail_body = tail_text[start:]
    tail_lines, left_out = tail_candidates(tail_body, tail_base + start)
    truncated = tail_base > cut or left_out
    if tail_base > cut:  # bytes never looked at: how far the engine got in them is not known
        merged[cut] = GAP_LINE
    for off, text in tail_lines:
        merged[off] = text
    # The raw tail: every line, anchors or not (traceback frames, the last words).
    # Lines naming a request are user text (and anchored candidates anyway): a busy server's
    # in-flight requests, each logged once more after the crash, must not push the engine's
    # traceback out of it.
    end, kept, size = len(tail_body), 0, 0
    while end > 0 and kept < RAW_TAIL_LINES and size < RAW_TAIL_BYTES:
        begin = tail_body.rfind("\n", 0, end - 1) + 1
        piece = tail_body[begin : end - 1 if tail_body[end - 1 : end] == "\n" else end]
        partial = begin == 0 and start == 0 and tail_base > 0  # a tail window without a line start
        # (a blank line is no line: a flood of them must not push a traceback's frames out)
        if not partial and "equest" not in piece:
            if piece.strip():
                merged.setdefault(tail_base + start + begin, piece[:MAX_LINE])
                kept += 1
            size += len(piece) + 1
        end = begin
    clean = {off: collector.unframed(_without_ansi(merged[off])) for off in sorted(merged)}
    raw_texts = list(clean.values())
    raw_error = next((i for i, t in enumerate(raw_texts) if _shows_error(t)), len(raw_texts))
    prefix = collector.prefix_of(raw_texts, structured, raw_texts[:raw_error])
    no_collector = {off: collector.cut(text, prefix, structured) for off, text in clean.items()}
    # (judged on the lines before the first exception, where a client's text cannot be (it is in an
    # exception's message, or a request line that carries the prefix too), and else on all: a
    # client's lines in a request's error may outnumber the engine's near the end)
    texts = list(no_collector.values())
    first_error = next((i for i, t in enumerate(texts) if _shows_error(t)), len(texts))
    logging_prefix = collector.logging_prefix_of(texts, first_error)
    texts = [collector.cut_logging_prefix(text, logging_prefix) for text in texts]
    # (confirmed on the lines before the first error, where no client's text can be: log_format.py)
    own = log_format.header_of(texts, first_error, _opens_with_vllm_header, structured)
    lines = [line for off, text in zip(no_collector, texts, strict=True) if (line := _line_of(off, text, own))]
    _continuations(lines)
    return Scan(lines=lines, total_bytes=seen, truncated=truncated)
