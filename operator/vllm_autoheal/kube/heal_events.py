"""The Events a recorded crash posts on its VLLMService: OOMDetected, then Healed, NotMemory,
CrashNotHealed or HealExhausted (and TerminationMessageIgnored when the launcher's message was
invalid)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from .. import metrics
from ..diagnosis import Diagnosis
from ..remedy import GIVE_UP, Remedy
from .writes import event as post_event

# Kubernetes' own event recorder lets an object post a burst of 25 Events, then one per 5 minutes
# (its spam filter): a tenant whose pods crash as fast as it can create them would otherwise queue
# every other tenant's Events behind its own in kopf's one poster, and spend the API-server share
# of the ServiceAccount every tenant's heals use. The status records every crash all the same.
BURST = 25
REFILL_S = 300.0
OBJECTS = 4096  # objects tracked (the oldest forgotten: a full bucket again)


class EventBudget:
    """A token bucket per (object, reason)."""

    def __init__(self, burst: int = BURST, refill_s: float = REFILL_S, clock: Any = time.monotonic) -> None:
        self.burst, self.refill_s, self.clock = burst, refill_s, clock
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()  # -> (tokens, at)
        self._guard = threading.Lock()

    def take(self, obj: str, reason: str) -> bool:
        with self._guard:
            now = self.clock()
            tokens, at = self._buckets.pop((obj, reason), (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) / self.refill_s)
            allowed = tokens >= 1.0
            self._buckets[(obj, reason)] = (tokens - 1.0 if allowed else tokens, now)
            while len(self._buckets) > OBJECTS:
                self._buckets.popitem(last=False)
            return allowed


# ...and a namespace's services together (many services, or one deleted and made again, a new uid each)
NAMESPACE_BURST = 100
NAMESPACE_REFILL_S = 10.0

_budget = EventBudget()
_namespaces = EventBudget(NAMESPACE_BURST, NAMESPACE_REFILL_S)


def event(vsvc: dict[str, Any], type: str, reason: str, message: str) -> None:
    if allowed(vsvc, reason):
        post_event(vsvc, type=type, reason=reason, message=message)


def allowed(vsvc: dict[str, Any], reason: str) -> bool:
    """Whether the object's and its namespace's Event budgets have room for one more of `reason` (taken if so)."""
    meta = vsvc.get("metadata") or {}
    obj = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
    return _budget.take(obj, reason) and _namespaces.take(str(meta.get("namespace")), "")


def post(
    vsvc: dict[str, Any], diag: Diagnosis, remedy: Remedy, pod_name: str, note: str | None, unmade: bool = False
) -> None:
    """The Events of one recorded crash (their text bounded; evidence is the engine's own line). `unmade`: its heal
    is made later, by its spec patch (the completion whose mark lands says 'Healed'; HealRefused if refused)."""
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
    elif not unmade:
        event(vsvc, type="Normal", reason="Healed", message=remedy.summary()[:1000])
