"""Where in a logged message the engine's own words can be. Standard library only.

vLLM writes a value (a request id, a tool call id, an item id, a client's text, a model's
output) into a fixed format, after the format's opening words; a value with a newline goes on
over lines that repeat the message's logger header (NewLineFormatter: same process, time, level
and file:line). No list of formats can name every call that does so, but their shape is one:
the engine's own words open the message, a value follows them. Python's tracebacks have a shape
of their own (frames, code lines, carets, the exception line and its message).

So, on a line with a vLLM logger header:
- a progress or warning line (INFO, DEBUG, WARNING) that opens a message counts only when the
  message opens with a known message or marker; then the whole message is the engine's (its
  figures, its later clauses, its later lines). Otherwise it can say at most "not memory",
  as a last resort (a warning never says more).
- any other line that continues a progress or warning message is a value written into it,
  even one shaped like a traceback (a client's newline can write one);
- elsewhere a traceback's own lines count wherever they are, and the lines that continue an
  exception's message belong to that exception: where its type carries no failure (a
  validation error quoting the client's input), they name none.
A value's lines are no exception of the engine's either (classify's final exception).
An ERROR line is read further: one that opens a message is read as before (the errors vLLM logs
put the exception's text, the failure itself, after their opening words: reading only those words
loses real failures in the corpus), and one that goes on a message is read from its opening words
(the same call may log again within the second: a new message, not a value).
A log cut by its poster may begin inside a traceback: an indented line that opens a message is
a traceback's (vLLM's own messages never start with blanks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .origin import ENGINE
from .scan import Line

# Python's frame line, and IPython's (8+: `File /path/x.py:12, in Class.name(args)`; 7: `/path/x.py in
# name(args)`), as a notebook prints a traceback.
FRAME_LINE = re.compile(
    r'File "[^"]{1,300}", line \d{1,7}, in |File [^\s"]\S{0,300}?\.py:\d{1,7}, in |[/~]\S{0,300}?\.py in \w'
)
EXCEPTION_LINE = re.compile(r"^(?:[\w.]{1,200}\.)?\w{0,80}(?:Error|Exception)\b(?::|\(|$)")
# Any exception, whatever its name (OutOfResources, BackendCompilerFailed, KeyboardInterrupt), as
# the line that ends a traceback prints it: `module.Name(Inner): message` or a bare `Name`.
RAISED = re.compile(r"^[A-Za-z_][\w.]{0,200}(?:\([\w.]{1,80}\))?(?::\s|$)")
CARETS = re.compile(r"^[\s^~]{1,400}$")
EXCEPTION_TYPE = re.compile(r"^([A-Za-z_][\w.]{0,200})(?:\([\w.]{1,80}\))?: ")
# The exception types that carry the failures the classifier names (and generic wrappers).
CARRIES_FAILURES = re.compile(
    # (any *RuntimeError: torch._dynamo's TorchRuntimeError, JAX's XlaRuntimeError/JaxRuntimeError, ...;
    # any *MemoryError: numpy's _ArrayMemoryError)
    r"(?:^|\.)(?:\w{0,40}OutOfMemoryError|\w{0,40}RuntimeError|ValueError|\w{0,40}MemoryError|AssertionError|OSError|"
    r"AcceleratorError|\w{0,40}(?:Cuda|CUDA|Hip|HIP)\w{0,10}Error|DistBackendError|RayTaskError|RayActorError|"
    r"ActorDiedError|\w{0,40}EngineDeadError|ChildFailedError|InductorError|BackendCompilerFailed|Exception|"
    r"ncclUnhandledCudaError|ncclInternalError|"
    r"ProcessExitedException|"  # torch.multiprocessing's news of a child ended by a signal
    # XLA's (absl's) status, printed as `CODE: message` on its own: the status is the failure's name
    r"RESOURCE_EXHAUSTED)$"
)
# Reports whose `name: ` opening is their writer's, not an exception type's: kubectl describe's
# "Reason: ", a systemd unit's, Slurm's step daemon's, the shell's job report ("bash: line 1: ").
REPORTER = re.compile(
    r"^(?:Reason: |[\w@.:-]{1,200}\.(?:service|scope): |slurmstepd(?:-[\w.-]{1,100})?: |\S{1,200}: line \d{1,7}: )"
)
TRACEBACK_TEXT = ("Traceback (most recent call last)", "The above exception", "During handling of the above")
_REPR = re.compile(r"^[A-Za-z_][\w.]{0,200}(?:Error|Exception)\(")  # `OutOfMemoryError('...')`
COLLECTOR_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ][\d:.,]{1,20}Z?")  # a collector stamps each line its own

ANY = "any"  # every finding counts
OPENING = "opening"  # a progress line that opens a message: it must open with the engine's words
VALUE = "value"  # a line of a value written into a message: only a last-resort "not memory"


@dataclass
class LoggedMessage:
    trusted: bool = False  # it opened with the engine's own words
    traceback: bool = False  # a traceback (or an exception line) is being printed in it
    after_frame: bool = False  # the last line was a frame (the next is its code)
    after_code: bool = False  # the last line was a frame's code or its carets (the next may end the traceback)
    carries: bool = True  # the last exception line's type may carry a failure


class Placement:
    """Walk the lines in order; `of(line)` says which of a line's findings may count."""

    def __init__(self) -> None:
        self._open: dict[str, LoggedMessage] = {}  # a message's header (collector stamps removed) -> its state

    def of(self, line: Line) -> tuple[str, LoggedMessage | None]:
        if line.origin != ENGINE or not line.source_file:
            return ANY, None
        key = COLLECTOR_TIME.sub("", line.header)
        message = self._open.get(key)
        first = message is None
        if message is None:
            message = self._open[key] = LoggedMessage()
        text = line.text
        if line.informational and not first and not message.trusted:
            return VALUE, message  # a warning goes on with a value, even one shaped like a traceback
        code, message.after_frame = message.after_frame, FRAME_LINE.match(text) is not None
        ends, message.after_code = message.after_code, False
        if text.startswith(TRACEBACK_TEXT) or message.after_frame:
            message.traceback, message.carries = True, True
        elif CARETS.match(text) or (code and message.traceback) or (first and _indent(line) >= 2):
            message.traceback, message.carries, message.after_code = True, True, True
        # An exception line: a type named like an error, its repr, or (where a traceback ends) any name.
        elif EXCEPTION_LINE.match(text) or _REPR.match(text) or (ends and RAISED.match(text)):
            typed = EXCEPTION_TYPE.match(text)
            message.carries = typed is None or CARRIES_FAILURES.search(typed.group(1)) is not None
            message.traceback = True
        elif first:
            return (OPENING if line.informational else ANY), message
        elif not (message.trusted or (message.traceback and message.carries)):
            if not message.carries or line.informational:
                return VALUE, message  # a value written into the message, or an exception's quoted text
            return OPENING, message  # an error line may be the same call's next message: its opening words count
        message.trusted = message.trusted or (first and message.carries)  # it opens as a traceback: the engine's
        return ANY, message


def _indent(line: Line) -> int:
    """Blanks before the message, after the one that ends the logger header."""
    at = line.raw.find(line.text)
    gap = line.raw[len(line.header) : at] if at >= len(line.header) else ""
    return len(gap) - 1 if gap.strip() == "" else 0
