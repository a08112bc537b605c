"""The vocabulary of the message tables: the kinds of message, a `Message` (a regex with the
cause, phase and subtype it means), and how a table row is made. Standard library only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from . import model as m
from .needles import needles_of

# Kinds of message, strongest first.
MEMORY = "memory"  # an explicit vLLM memory message: decides the cause
HOST = "host"  # host RAM exhausted: decides host_ram_oom
NOT_OOM = "not_oom"  # a known non-memory failure (subtype)
NCCL_OOM = "nccl_oom"  # NCCL's CUDA call failed for lack of memory
OOM = "oom"  # a generic GPU out-of-memory: the phase decides the cause
KILLED = "killed"  # a worker died of SIGKILL: host RAM unless something stronger
FRAME = "frame"  # a traceback frame or marker that names the phase of a failure
MILESTONE = "milestone"  # startup progress: the phase reached so far
STARTING = "starting"  # the engine failed while starting (it never served)
GAP = "gap"  # lines left out here (an excerpt's "[...]"): how far the engine got after it is not known
BUDGET = "budget"  # start-up figures showing no room for any KV cache: decide kv_cache_insufficient
FIGURE = "figure"  # numbers only
WEAK = "weak"  # a FRAME subtype: on more than one phase's path
WEB_SERVER = "web_server"  # a MILESTONE subtype: a web server's words, any web server's
SIZED_AFTER_CAPTURE = "sized_after_capture"  # a MILESTONE subtype: graphs captured, the KV cache is committed next


@dataclass(frozen=True)
class Message:
    kind: str
    regex: re.Pattern[str]
    cause: m.Cause | None = None
    phase: m.EnginePhase | None = None
    subtype: str | None = None
    needles: tuple[str, ...] = ()  # one of these literals is in every match; empty: always try

    @cached_property  # read on every line: RegexFlag arithmetic is slow Python (enum) code
    def ignores_case(self) -> bool:
        return bool(self.regex.flags & re.IGNORECASE)

    def search(self, text: str, lowered: str) -> re.Match[str] | None:
        """The regex runs only on lines holding one of its literal needles (str `in`, C speed)."""
        if self.needles:
            hay = lowered if self.ignores_case else text
            if not any(n in hay for n in self.needles):
                return None
        return self.regex.search(text)


def row(
    kind: str,
    pattern: str,
    cause: m.Cause | None = None,
    phase: m.EnginePhase | None = None,
    subtype: str | None = None,
    flags: int = 0,
    needles: tuple[str, ...] | None = None,
) -> Message:
    """`needles` overrides the literals read off the pattern, where the pattern starts with a group."""
    return Message(
        kind,
        re.compile(pattern, flags),
        cause,
        phase,
        subtype,
        needles if needles is not None else needles_of(pattern, flags),
    )


SIZE = r"[\d.,]{1,30}\s{0,4}(?:[KMGT]i?B|bytes)?"
# `\b` before a word character, written after that character: "in" + WB is `\bin` for a regex
# whose alternatives then all start with a literal, which the regex engine skips ahead to (an
# alternative led by `\b` or a group makes it try every position of a 2 KiB line).
WB = r"(?<!\w.)"
NUM = r"[\d,]+"
# The shell's report of a job a signal ended ("bash: line 1:     2 Killed  vllm serve ..."; bash pads
# the pid to 5 columns), and journalctl's opening of a systemd line ("Jun 05 10:00:00 host systemd[1]: ").
JOB_REPORT = r"^(?:\S{1,200}: )?line \d{1,7}: {1,8}\d{1,10} "
SYSTEMD_UNIT = r"^(?:\w{3} [ \d]\d \d\d:\d\d:\d\d \S{1,100} systemd\[\d{1,10}\]: )?[\w@.:-]{1,200}\."
I = re.IGNORECASE  # noqa: E741 - short, as the flag tables below are wide
