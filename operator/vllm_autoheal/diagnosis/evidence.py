"""What of the lines that decided a diagnosis it may quote as evidence (status, Events): the engine's own
words, never a client's text. Standard library only."""

from __future__ import annotations

from .findings import ENGINE_EXCEPTION
from .origin import ENGINE, REQUEST
from .quoted import exception_of_another_type
from .scan import Line

EVIDENCE_CHARS = 400
WITHHELD = "(message not quoted: an exception of this type may carry a request's text)"


def quotable_evidence(*lines: Line | None, engine_error: bool = False) -> list[str]:
    """The lines a diagnosis may quote (at most four, each cut to EVIDENCE_CHARS): the engine's own,
    never a client's; a request's traceback only where it ends in the engine's own memory error."""
    out: list[str] = []
    for ln in lines:
        quotable = ln is not None and (
            (ln.origin == ENGINE and not ln.request_report)
            or (engine_error and ln.origin in (ENGINE, REQUEST) and ENGINE_EXCEPTION.match(ln.text))
        )
        if ln is None or not quotable:
            continue
        # An exception of a type that carries no failure holds what it was given (a request's id, a
        # key, a path): its type is the engine's word, its message may be a client's.
        withheld = exception_of_another_type(ln, named_like_an_error=True)
        text = f"{withheld}: {WITHHELD}" if withheld else ln.text
        if text not in out:
            out.append(text[:EVIDENCE_CHARS])
    return out[:4]
