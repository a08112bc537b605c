"""Where in its life the engine failed: the frames of the failure's own traceback, else the
last start-up milestone before it. Standard library only."""

from __future__ import annotations

from . import messages as msg
from . import model as m
from .findings import Finding
from .origin import REQUEST
from .writers import vllms_own

PHASE_PRIORITY = (m.PHASE_CAPTURE, m.PHASE_PROFILE, m.PHASE_KV, m.PHASE_LOAD, m.PHASE_SERVING)
PHASE_ORDER = {
    p: i for i, p in enumerate((m.PHASE_LOAD, m.PHASE_PROFILE, m.PHASE_KV, m.PHASE_CAPTURE, m.PHASE_SERVING))
}
OOM_CAUSE_BY_PHASE = {
    m.PHASE_LOAD: m.WEIGHTS_LOAD_OOM,
    m.PHASE_PROFILE: m.PROFILING_OOM,
    m.PHASE_KV: m.GPU_UTIL_EXCEEDS_FREE,  # memory vanished between profiling and allocation
    m.PHASE_CAPTURE: m.CUDAGRAPH_CAPTURE_OOM,
    m.PHASE_SERVING: m.RUNTIME_OOM,
}
TRACEBACK_START = "Traceback (most recent call last)"


def _own_frames(findings: list[Finding], failure: Finding, window: int) -> set[m.EnginePhase | None]:
    """Phases named by the frames of the failure's own traceback: after its `Traceback` line (or
    the last milestone) and up to the failure line, from the same rank when ranks are known."""
    start = max(
        (
            f.line.offset
            for f in findings
            if f.line.offset < failure.line.offset
            and f.line.text.startswith(TRACEBACK_START)
            and f.line.rank == failure.line.rank
        ),
        default=window,
    )
    return _strongest(
        {
            f
            for f in findings
            if f.message.kind == msg.FRAME
            and f.message.phase
            and max(start, window) < f.line.offset <= failure.line.offset
        }
    )


def _strongest(frames: set[Finding]) -> set[m.EnginePhase | None]:
    """The phases the frames name; frames on several phases' paths count only when alone."""
    strong = {f.message.phase for f in frames if f.message.subtype != msg.WEAK}
    return strong or {f.message.phase for f in frames}


def phase_of_failure(findings: list[Finding], failure: Finding | None, ready_before: bool | None) -> m.EnginePhase:
    """Where it failed: the frames of the failure's own traceback; else frames printed after the
    last start-up milestone before the failure (earlier ones belong to steps that completed);
    else the last milestone reached, unless lines were left out after it (it is then only a
    lower bound)."""
    if failure is not None and failure.line.origin == REQUEST:
        return m.PHASE_SERVING  # the API server's handler of a request logged it: it was serving
    end = failure.line.offset if failure else None
    before = [
        f
        for f in findings
        if f.message.kind == msg.MILESTONE
        and (end is None or f.line.offset < end)
        and (f.message.subtype != msg.WEB_SERVER or vllms_own(f.line))  # (any web server's words: markers.py)
    ]
    window = max((f.line.offset for f in before), default=-1)
    frames = _own_frames(findings, failure, window) if failure else set()
    if not frames:
        frames = _strongest({f for f in findings if f.message.kind == msg.FRAME and f.line.offset > window})
    for phase in PHASE_PRIORITY:
        if phase in frames:
            return phase
    reached = [f.message.phase for f in before if f.message.phase]
    if ready_before or m.PHASE_SERVING in reached:
        return m.PHASE_SERVING
    left_out = any(
        f.message.kind == msg.GAP and window < f.line.offset and (end is None or f.line.offset < end) for f in findings
    )
    if reached and not left_out:
        # (0.34's extensible cache: graphs captured, its blocks committed next; only KV-sizing lines after
        # it, as vLLM prints them before the commit, not a later run's start)
        sized = [f.line.offset for f in before if f.message.subtype == msg.SIZED_AFTER_CAPTURE]
        if sized and all(f.message.phase == m.PHASE_KV for f in before if f.line.offset > max(sized)):
            return m.PHASE_KV
        last = max(reached, key=lambda p: PHASE_ORDER[p])
        return {m.PHASE_KV: m.PHASE_CAPTURE}.get(last, last)  # after KV sizing comes graph capture
    return m.PHASE_UNKNOWN
