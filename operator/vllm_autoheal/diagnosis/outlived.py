"""Failures the server outlived: a failure after which the whole server came up, or served, did not
stop it. It is an earlier run's, a request's the engine survived, or a client's text that no header
marks (after a gap, a client's raw line looks like a dying engine's traceback). Standard library only.

vLLM prints the SERVER_UP milestones only once every rank's start-up succeeded, or while it serves
(its stats): one rank's graph capture is no such line. Such a line under vLLM's header (with its
file) or the log's own learned header sets aside every failure before it; one with only a level
(uvicorn's `INFO:` is raw text a client can write) does only where a failure follows it, so that a
client's line after the crash can never leave the log without its failure.
"""

from __future__ import annotations

from . import messages as msg
from .findings import FAILURE_KINDS, Finding
from .scan import ENGINE, Line


def _server_up(f: Finding) -> bool:
    return (
        f.message.kind == msg.MILESTONE
        and f.message.subtype == msg.SERVER_UP
        and f.line.origin == ENGINE
        and f.line.level is not None
        and not f.line.value
    )


def _headed(line: Line) -> bool:
    return line.source_file is not None or line.learned_header


def went_up(found: list[Finding], deciding: list[Finding]) -> int:
    """The offset of the last line saying the server came up or served that may set failures
    aside (-1: none); `deciding` are the findings that may decide."""
    last_failure = max((f.line.offset for f in deciding if f.message.kind in FAILURE_KINDS), default=-1)
    return max(
        (f.line.offset for f in found if _server_up(f) and (_headed(f.line) or f.line.offset < last_failure)),
        default=-1,
    )


def outlived(found: list[Finding], deciding: list[Finding]) -> tuple[list[Finding], int]:
    """`deciding` without the failures the server outlived, and how many those were."""
    up = went_up(found, deciding)
    kept = [f for f in deciding if not (f.message.kind in FAILURE_KINDS and f.line.offset < up)]
    return kept, len(deciding) - len(kept)
