"""A log collector's own prefix on every line: stern's `pod container `, `kubectl logs --prefix`'s
`[pod/name/container] `, journald's `Dec 01 12:00:00 host unit[pid]: `, a compose or CI tag
`[vllm] `, mpirun's `[1,0]<stdout>:`, srun --label's `  0: `, a quoted paste's `> `. Standard library only.

vLLM's own headers (scan.py) are recognised one by one; a collector's prefix has no fixed form,
but it is the same on (nearly) every line, which the engine's lines never are. So a prefix is a
collector's when it opens at least SHARE of the lines and, once cut, shows the engine's structure
(a logger header, a traceback) on some of them. It is cut only from lines that show no structure
of their own: a line that already opens with a header, a frame or an exception is never changed,
so lines that someone else wrote can hide nothing of the engine's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable

SHARE = 0.8
MIN_LINES = 4
SAMPLE_LINES = 4000  # bounded work: the prefix is judged on at most this many lines

# The shapes a collector's prefix takes: one or two bare tokens (stern: pod then container; a
# host or service name), a bracketed tag (kubectl --prefix, compose, CI), journald's header,
# a quoted paste. A token is a name: it holds no `(`, `"` or `:` but a port's.
_SHAPES = re.compile(
    r"^(?:"
    r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]{1,63} [\w.@/-]{1,100}(?:\[\d{1,10}\])?: "  # journald
    r"|\[[\w./@:-]{1,200}\]:? "  # [pod/name/container], [vllm]:
    r"|\[\d{1,6},\d{1,6}\]<(?:stdout|stderr)>:"  # mpirun --tag-output
    r"|> "  # a quoted paste
    r"|(?P<task>\s{0,6}\d{1,6}: )"  # srun --label: the task's number, padded to the widest
    r"|(?P<pod>[\w.-]{1,63}(?::\d{1,5})? )(?:[\w.-]{1,63} )?"  # stern "pod container ", a host, a service
    r")"
)
_CONTAINER = r"[\w.-]{1,63} "
_TASK = r"\s{0,6}\d{1,6}: "


def prefix_of(
    lines: Iterable[str], structured: Callable[[str], bool], before: list[str] | None = None
) -> re.Pattern[str] | None:
    """The prefix a collector put on the lines (a pattern matching it), or None. `structured(text)`
    says whether a line shows the engine's structure by itself (a header, a frame, a traceback's
    or exception's line). The last SAMPLE_LINES lines are judged: the failure is at the end."""
    sample = [x for x in lines if x.strip()][-SAMPLE_LINES:]
    # A few lines (a pasted excerpt) say too little of a bare token; a shape only a collector writes
    # (journald's header, a tag, a quote) on every one of them is still the collector's.
    short = len(sample) < MIN_LINES
    counts: Counter[str] = Counter()
    for ln in sample:
        found = _SHAPES.match(ln)
        if found is None or (short and found.group("pod") is not None):
            continue
        if found.group("task") is not None:  # (srun: every task's number is the one prefix)
            counts[_TASK] += 1
            continue
        counts[re.escape(found.group(0))] += 1
        if found.group("pod") not in (None, found.group(0)):  # stern's pod, when its containers differ
            counts[re.escape(found.group("pod")) + _CONTAINER] += 1
    for prefix, n in sorted(counts.items(), key=lambda kv: (-kv[1], -len(kv[0]))):
        if n < (len(sample) if short else SHARE * len(sample)):
            break
        pattern = re.compile(prefix)
        if any((m := pattern.match(ln)) and structured(ln[m.end() :]) and not structured(ln) for ln in sample):
            return pattern
    return None if short else _any_prefix(sample[-GENERIC_LINES:], structured, before or [])


# Any other collector or wrapper (a launcher's own logging format, a tool's tag): the same words,
# digits aside (its time, a task's number), end to end before the engine's lines. Judged on the
# last GENERIC_LINES lines, at the places a prefix can end (after a blank, `:`, `]`, `)`, `|`, `>`),
# within its first GENERIC_CHARS characters; only where most lines show no structure of their own.
GENERIC_LINES = 400
GENERIC_CHARS = 80
_DIGITS = re.compile(r"\d+")
_ENDS = re.compile(r"[\s:\]\)|>]")


def _any_prefix(sample: list[str], structured: Callable[[str], bool], before: list[str]) -> re.Pattern[str] | None:
    """`before`: the lines before the log's first error, where no client's text can be: a prefix must
    open most of them too (where there are MIN_LINES), so that a client's lines after it teach none."""
    before = [x for x in before if x.strip()][-GENERIC_LINES:]
    if len(sample) < MIN_LINES or sum(map(structured, sample)) > len(sample) // 2:
        return None  # the engine's lines open with its own structure: no prefix before them
    counts: Counter[str] = Counter()
    for ln in sample:
        shape = _DIGITS.sub("0", ln[:GENERIC_CHARS])  # (each run of digits one 0: its width varies)
        counts.update({shape[: m.end()] for m in _ENDS.finditer(shape) if m.end() < len(shape)})
    for shape, n in sorted(counts.items(), key=lambda kv: (len(kv[0]), -kv[1])):  # (the shortest that shows the engine)
        if n < SHARE * len(sample) or not shape.strip():
            continue
        pattern = re.compile("".join(r"\d+" if part == "0" else re.escape(part) for part in re.split("(0)", shape)))
        if len(before) >= MIN_LINES and sum(pattern.match(ln) is not None for ln in before) < SHARE * len(before):
            continue
        if any((m := pattern.match(ln)) and structured(ln[m.end() :]) and not structured(ln) for ln in sample):
            return pattern
    return None


def cut(line: str, prefix: re.Pattern[str] | None, structured: Callable[[str], bool]) -> str:
    """The line without the collector's prefix; a line with structure of its own is left whole."""
    found = prefix.match(line) if prefix is not None else None
    if found is not None and not structured(line):
        return line[found.end() :]
    return line


# vLLM's own lines open with its process prefix (with a pid) or its logger header; VLLM_LOGGING_PREFIX
# puts a word or two of the operator's choosing before its header ("[llama-70b] "), on vLLM's lines
# only: before the process prefix (vLLM 0.32) or after it (older versions add it to a worker's output).
# vLLM's process prefix with its pid, `(EngineCore_DP0 pid=1)` (without its closing parenthesis): the
# one pattern scan.process_of, log_records and the VLLM_LOGGING_PREFIX rules below share.
# (vLLM 0.10's workers name their parallel rank after a space: `(VllmWorker TP0 pid=1)`, `(VllmWorker PP0_TP1 pid=1)`)
# (SkyPilot names a node's task before its rank: `(node-0, worker1, rank=1, pid=2, ip=h)`)
PROCESS_WITH_PID = (
    r"\([\w.:-]{1,60}(?: \w{1,30})?(?:,\s{0,4}[\w.:-]{1,60}){0,2}(?:,?\s{1,4}rank=\d{1,4})?,?\s{0,4}pid=\d{1,10}"
)
_PROCESS = PROCESS_WITH_PID + r"\)\s{1,8}"
_HEADER = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s{1,8}\d\d-\d\d\s{1,8}[\d:.]{1,20}\s{1,8}\[?[\w.-]{1,80}:\d"
_VLLM_AFTER = rf"(?=(?:{_PROCESS})?{_HEADER})"
_LOGGING_PREFIX = re.compile(rf"^(?P<process>{_PROCESS})?(?P<prefix>(?:[^\s(]\S{{0,39}}\s{{1,4}}){{1,2}}){_VLLM_AFTER}")
_VLLM_LINE = re.compile(rf"^(?:{_PROCESS})?{_HEADER}")


def logging_prefix_of(lines: list[str], first_error: int) -> re.Pattern[str] | None:
    """The VLLM_LOGGING_PREFIX on vLLM's lines (a pattern matching it, after the process prefix where
    there is one), or None: the same word or two on at least SHARE of vLLM's logged lines (those that
    open with its header, with it or without), on MIN_LINES of them. A client's words before a forged header are not that
    prefix, so they are not cut. Judged on the lines before `first_error` (an index of `lines`), else on all."""
    words: dict[int, str | None] = {}  # (each line is matched once, though judged twice)
    return _logging_prefix(lines, first_error, words) or _logging_prefix(lines, len(lines), words)


def _logging_prefix(lines: list[str], end: int, words: dict[int, str | None]) -> re.Pattern[str] | None:
    """logging_prefix_of judged on lines[:end]; `words`: each line's prefix ("" on vLLM's lines without one,
    None on any other), by index, as far as known."""
    counts: Counter[str] = Counter()
    bare = 0
    for i in [i for i in range(end) if lines[i].strip()][-SAMPLE_LINES:]:
        if i not in words:
            # (a line that opens with vLLM's header has no prefix before it: its second and third words are
            # a date and a time, never a header's level; told first, as most of vLLM's lines are bare)
            if _VLLM_LINE.match(lines[i]):
                words[i] = ""
            else:
                found = _LOGGING_PREFIX.match(lines[i])
                words[i] = found.group("prefix") if found is not None else None
        word = words[i]
        if word:
            counts[word] += 1
        elif word is not None:
            bare += 1
    if not counts:
        return None
    prefix, n = counts.most_common(1)[0]
    if n < MIN_LINES or n < SHARE * (sum(counts.values()) + bare):
        return None
    return re.compile(rf"^(?P<process>{_PROCESS})?{re.escape(prefix)}{_VLLM_AFTER}")


def cut_logging_prefix(line: str, prefix: re.Pattern[str] | None) -> str:
    """The line without the VLLM_LOGGING_PREFIX (its process prefix kept)."""
    found = prefix.match(line) if prefix is not None else None
    return line if found is None else (found.group("process") or "") + line[found.end() :]


# A terminal UI's box around each line (k9s's log view: "│ <line><padding> │").
_BOX = "\u2502"


def unframed(text: str) -> str:
    """The line without the box a terminal UI drew around it."""
    if text[:1] != _BOX:
        return text
    body = text.rstrip()
    body = body[1 : -1 if body.endswith(_BOX) and len(body) > 1 else None].rstrip()
    return body[1:] if body[:1] == " " else body
