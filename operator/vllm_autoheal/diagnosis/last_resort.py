"""The engine's last words, where no message row names its failure (classify.py's last resort):
the last exception it printed is "not memory" unless its own message says an allocation failed;
a wrapper alone, or a traceback cut before its error line, says nothing of what failed. Only the
engine's own words count: an exception in a request's report (which a client can cause at will,
and which V0 prints for each stream it drops after the engine died) is passed over. Standard
library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import takewhile

from . import messages as msg
from . import model as m
from .findings import FRAME_LINE, final_exception, wrapped_only
from .phase import TRACEBACK_START
from .quoted import of_another_type
from .scan import Line

MESSAGE_LINES = 20  # of an exception's message, read for a failed allocation


@dataclass(frozen=True)
class LastWords:
    cause: m.Cause
    subtype: str
    line: Line | None  # the evidence
    why: str


def last_words(own: list[Line]) -> LastWords | None:
    """What the engine's own lines (`own`: not values written into a message) say last, or None
    when they hold no exception nor traceback at all."""
    unreported = [ln for ln in own if not (ln.request_report or ln.grammar_report)]
    exception = final_exception(unreported)
    if exception is not None:
        allocation = _allocation_failure(unreported, exception)
        if allocation is not None:
            return LastWords(
                m.UNKNOWN,
                "allocation_failure_unplaced",
                allocation,
                "vLLM stopped on an error whose message says an allocation failed, in words that do not tell "
                "which memory ran out: it is not called 'not memory', and no memory setting is changed.",
            )
        return LastWords(m.NOT_OOM, "other_error", exception, "vLLM stopped on an error that is not about memory.")
    if wrapped_only(own):
        return LastWords(
            m.UNKNOWN,
            "wrapper_without_cause",
            None,
            "The log's last error only wraps a failure printed elsewhere (its words point to a root cause "
            "above or in another process), and that failure is not in the log: what failed cannot be told "
            "and no memory setting is changed.",
        )
    # A traceback whose error line is missing (a cut log, a process killed mid-write) names a
    # phase but no failure: an illegal access there looks the same as an OOM. No memory change.
    if any(FRAME_LINE.match(ln.text) or ln.text.startswith(TRACEBACK_START) for ln in own):
        return LastWords(
            m.UNKNOWN,
            "traceback_without_error",
            None,
            "No known failure message was found: the traceback ends before its error line, "
            "so what failed cannot be told and no memory setting is changed.",
        )
    return None


def _allocation_failure(engine: list[Line], exception: Line) -> Line | None:
    """The line of the engine's last exception that names a failed allocation: the exception's line or
    one of the lines that go on its message, or None. `engine`: the engine's own lines outside any
    request's report; `exception`: the last exception among them. An exception of a type that carries
    no failure (its message is what it was given: a request's id, a path) and a further line a client
    may have written are passed over, so that no client's text moves the answer, even from "not
    memory" to "unknown"."""
    if of_another_type(exception):
        return None
    at = engine.index(exception)
    further = takewhile(lambda ln: ln.continued, engine[at + 1 : at + 1 + MESSAGE_LINES])
    return next(
        (ln for ln in (exception, *(f for f in further if f.engine_message)) if msg.ALLOCATION.search(ln.match_text)),
        None,
    )
