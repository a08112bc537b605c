"""vLLM's lines under a logging format that is not vLLM's own. Standard library only.

Two cases, both common in production, both learned from the log itself as collector.py learns a
collector's prefix:
- the operator chose the format of vLLM's loggers (`--logging-config.pylogging_config_file`,
  VLLM_LOGGING_CONFIG_PATH, or an application that runs vLLM in-process under its own
  `logging.basicConfig`): `2026-12-01 10:00:00,123 - vllm.v1.engine.core - ERROR - ...`,
  `ERROR:vllm.worker.worker:...`. The header gives the line its level and its logger (vLLM's loggers
  are named after their modules, so `vllm.entrypoints.logger` is the request logger's);
- a wrapper logs each of vLLM's lines with a header of its own, level and all:
  `2026-12-01 10:00:00,123 - supervisor - INFO - INFO 12-01 10:00:00 [core.py:1] ...`. That header
  is cut like a collector's prefix and vLLM's own header read after it.

A header is the same shape (digits, the level word, vLLM's logger and file names aside) on at
least SHARE of the lines that carry one, and it names a vLLM logger or a vLLM file, or vLLM's own
header (or the engine's traceback) follows it (so NCCL's `NCCL INFO` lines are no logger header).
A line that opens with vLLM's own header counts against it, also where a second header follows
(a client's line in a request's report). It must also open most of the lines before the log's
first error: a client's text can sit in an exception's message, never there, so no client can
teach the reader a header (a wrapper's is taken without that only from a log pasted from its error
on, which has no such lines: cutting it gives no line a header it did not have). Inside a message
printed without a header, a learned header is no writer of its own (quoted.mark_continuations).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .collector import PROCESS_WITH_PID

SHARE = 0.8
MIN_LINES = 4
SAMPLE_LINES = 400  # the last lines before the first error, at most
HEADER_CHARS = 100  # a header's level word is within a line's first HEADER_CHARS characters

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # Python's level names (NCCL's WARN is not one)
# One token of a line's opening: placeholders for what varies from line to line (the level, a vLLM
# logger's name, a file name, digits), and any other character as itself.
_TOKEN = re.compile(
    rf"(?P<level>(?<![\w.])(?:{'|'.join(LEVELS)})(?![\w.]))"
    r"|(?P<logger>(?<![\w.])vllm(?:\.\w{1,60}){1,8}(?::[\w<>]{1,60}:\d{1,7})?)"  # %(name)s, loguru's name:function:line
    r"|(?P<file>(?<![\w.])[\w-]{1,80}\.py(?::\d{1,7})?)"
    r"|(?P<digits>\d{1,20})"
    r"|(?P<space>\s{1,12})"
    r"|(?P<other>.)",
    re.S,
)
_PLACEHOLDER = {"level": "\x01", "logger": "\x02", "file": "\x03", "digits": "0", "space": " "}
_PATTERN = {
    "\x01": rf"(?P<level>{'|'.join(LEVELS)})",
    "\x02": r"(?P<logger>vllm(?:\.\w{1,60}){1,8}(?::[\w<>]{1,60}:\d{1,7})?)",
    "\x03": r"(?P<file>[\w-]{1,80}\.py)(?::\d{1,7})?",
    "0": rf"\d{{1,{HEADER_CHARS}}}",
    " ": rf"\s{{1,{HEADER_CHARS}}}",
}
# After the level word a header goes on only with separators and placeholders: the first letter
# (or other character) begins the message.
_SEPARATORS = set("-|:[]()<>,")


# Each process prints its own prefix before any header (vLLM's, Ray's, torch.distributed's rank).
_PROCESS_PREFIX = re.compile(
    r"^(?:\s{0,8}" + PROCESS_WITH_PID + r"[^()]{0,80}\)\s{1,8}|\s{0,8}\[rank\d{1,4}\]:\s{0,8})+"
)


def _without_process(text: str) -> str:
    found = _PROCESS_PREFIX.match(text)
    return text[found.end() :] if found else text


@dataclass(frozen=True)
class Header:
    pattern: re.Pattern[str]
    wraps_vllm: bool  # a wrapper's header before vLLM's own: cut it, read vLLM's after it


def shape_of(text: str) -> str | None:
    """The line's opening up to the end of a header holding a level word, with what varies put as
    placeholders; None when no level word opens it."""
    out: list[str] = []
    level_seen = False
    for token in _TOKEN.finditer(text, 0, HEADER_CHARS):
        kind = token.lastgroup or "other"
        if kind in ("space", "digits") and out and out[-1] == _PLACEHOLDER[kind]:
            continue  # (one group for a run: adjacent groups of one class would backtrack through every split)
        if kind == "level" and not level_seen:
            level_seen = True
        elif level_seen and kind == "level":
            break  # (a second level word is the message's: vLLM's own header after a wrapper's)
        elif level_seen and kind == "other" and token.group(0) not in _SEPARATORS:
            break
        out.append(_PLACEHOLDER.get(kind, token.group(0)))
    if not level_seen:
        return None
    after = len(out) - out[::-1].index("\x01")
    if " " in out[after:]:  # (an opening bracket after the last blank is the message's: `(EngineCore pid=1)`)
        out = out[: len(out) - out[::-1].index(" ")]
    shape = "".join(out).rstrip(" ")  # (the blank before the message: _compile's)
    return shape if not shape.endswith("\x01") else None  # (no separator after the level: a word of a message)


def _compile(shape: str) -> re.Pattern[str]:
    parts: list[str] = []
    named: set[str] = set()
    for ch in shape:
        piece = _PATTERN.get(ch)
        if piece is None:
            parts.append(re.escape(ch))
            continue
        if "(?P<" in piece:
            name = piece[4 : piece.index(">")]
            piece = piece if name not in named else piece.replace(f"?P<{name}>", "?:")
            named.add(name)
        parts.append(piece)
    # (the blank that ends a header is one character, if any: a code line's indent is the message's)
    return re.compile("".join(parts) + r"\s?")


def _shapes(lines: list[str], vllm_header: Callable[[str], bool]) -> tuple[Counter[str], int]:
    """Each shape's count, and how many lines open with vLLM's own header."""
    counts: Counter[str] = Counter()
    own = 0
    for ln in lines:
        if vllm_header(ln):
            own += 1
        elif (shape := shape_of(ln)) is not None:
            counts[shape] += 1
    return counts, own


def header_of(
    lines: list[str], first_error: int, vllm_header: Callable[[str], bool], structured: Callable[[str], bool]
) -> Header | None:
    """The log's own header, or None. `lines`: the log's lines (what follows their process prefixes is judged);
    `first_error`: the index of the first that shows an error; `vllm_header(text)`: the text opens
    with vLLM's own header; `structured(text)`: it opens with the engine's structure (a header,
    a frame, an exception). The header must open most of the lines that carry one over the last
    SAMPLE_LINES, and most of those before the first error (where no client's text can be: so a
    client's lines in an exception's message can never make a header of their own); a wrapper's is
    also taken from a log that has no line before its first error (a paste from the error on)."""
    lines = [_without_process(ln) for ln in lines]
    counts, own = _shapes([ln for ln in lines if ln.strip()][-SAMPLE_LINES:], vllm_header)
    if not counts:
        return None
    shape, n = counts.most_common(1)[0]
    if n < MIN_LINES or n < SHARE * (sum(counts.values()) + own):
        return None
    # Before the first error no client's text can be: there the header must open most lines too
    # (a log pasted from its error on has no such lines: a wrapper's header is then judged on the rest).
    pre_error = [ln for ln in lines[:first_error] if ln.strip()][-SAMPLE_LINES:]
    before, own_before = _shapes(pre_error, vllm_header)
    confirmed = before[shape] > 0 and before[shape] >= SHARE * (sum(before.values()) + own_before)
    pattern = _compile(shape)
    wrapped = [ln[m.end() :] for ln in lines[-SAMPLE_LINES:] if (m := pattern.match(ln))]
    named = "\x02" in shape or "\x03" in shape  # it names vLLM's loggers or files: vLLM's own format
    if (confirmed or not pre_error) and (
        any(map(vllm_header, wrapped)) or (not named and any(map(structured, wrapped)))
    ):
        # A wrapper's header, before vLLM's lines or the engine's traceback: cut, and what follows
        # read as if it were not there. No line gets a header it did not have.
        return Header(pattern, wraps_vllm=True)
    # A header of the log's own gives its lines a level and a logger: only where vLLM's loggers are
    # named in it, and only where the lines before the first error confirm it.
    return Header(pattern, wraps_vllm=False) if named and confirmed else None


def source_of(found: re.Match[str]) -> str | None:
    """The file a header names: `%(filename)s`, or the module of a vLLM logger's name (vLLM names
    its loggers after their modules: vllm.entrypoints.logger is logger.py)."""
    groups = found.groupdict()
    if groups.get("file"):
        return groups["file"]
    logger = groups.get("logger")
    return logger.split(":", 1)[0].rsplit(".", 1)[-1] + ".py" if logger else None
