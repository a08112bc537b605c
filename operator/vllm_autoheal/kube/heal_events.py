"""The Events a recorded crash posts on its VLLMService: OOMDetected, then Healed, NotMemory,
CrashNotHealed or HealExhausted (and TerminationMessageIgnored when the launcher's message was
invalid)."""

from __future__ import annotations

from typing import Any

from .. import metrics
from ..diagnosis import Diagnosis
from ..remedy import GIVE_UP, Remedy
from .writes import event


def post(vsvc: dict[str, Any], diag: Diagnosis, remedy: Remedy, pod_name: str, note: str | None) -> None:
    """The Events of one recorded crash (their text bounded; evidence is the engine's own line)."""
    evidence = diag.evidence[0][:300] if diag.evidence else "no evidence line"
    if note:
        event(vsvc, type="Warning", reason="TerminationMessageIgnored", message=note[:1000])
    if diag.is_memory:
        event(
            vsvc,
            type="Warning",
            reason="OOMDetected",
            message=f"{diag.cause} ({diag.phase}) in {pod_name}: {evidence}",
        )
    if remedy.action == GIVE_UP:
        metrics.EXHAUSTED.inc()
        event(vsvc, type="Warning", reason="HealExhausted", message=remedy.reason[:1000])
    elif diag.cause == "not_oom":
        event(
            vsvc,
            type="Warning",
            reason="NotMemory",
            message=f"{diag.subtype or 'not a memory failure'}: "
            f"{diag.evidence[0][:300] if diag.evidence else ''}; flags left as they are",
        )
    elif remedy.gives_up:
        event(vsvc, type="Warning", reason="CrashNotHealed", message=remedy.reason[:1000])
    else:
        event(vsvc, type="Normal", reason="Healed", message=remedy.summary()[:1000])
