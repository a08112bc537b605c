"""Conditions, heal records and the crash identity: how the operator writes what it saw and did.

Conditions follow the Kubernetes API conventions (type, status, CamelCase reason, message
for people, lastTransitionTime that moves only when status changes, observedGeneration).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic.alias_generators import to_camel

from ..api import MAX_HEAL_RECORDS, MAX_OBSERVED_CRASHES, FieldChange, HealRecord
from ..diagnosis import Diagnosis
from ..remedy import Remedy

READY, MEMORY_FIT, HEALING, HEAL_EXHAUSTED = "Ready", "MemoryFit", "Healing", "HealExhausted"
ORDER = {READY: 0, MEMORY_FIT: 1, HEALING: 2, HEAL_EXHAUSTED: 3}


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def camel(cause: str) -> str:
    """kv_cache_insufficient -> KvCacheInsufficient (a condition reason)."""
    return "".join(part.capitalize() for part in cause.split("_")) or "Unknown"


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  generation: int | None) -> list[dict[str, Any]]:
    out = [dict(c) for c in conditions if c.get("type") != type_]
    old = next((c for c in conditions if c.get("type") == type_), None)
    moved = old is None or old.get("status") != status
    out.append({"type": type_, "status": status, "reason": reason, "message": message[:1000],
                "lastTransitionTime": now() if moved else old.get("lastTransitionTime", now()),
                "observedGeneration": generation})
    return sorted(out, key=lambda c: ORDER.get(c["type"], 9))


def crash_id(pod_uid: str, container: str, restart_count: int) -> str:
    return f"{pod_uid}/{container}/{restart_count}"


def remember_crash(observed: list[str], crash: str) -> list[str]:
    return (list(observed) + [crash])[-MAX_OBSERVED_CRASHES:]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def heal_record(pod: str, pod_uid: str, container: str, restart_count: int, diag: Diagnosis, remedy: Remedy,
                before: dict[str, Any]) -> dict[str, Any]:
    changes = [FieldChange(field=to_camel(k), before=_text(before.get(k)), after=_text(v))
               for k, v in remedy.changes.items()]
    numbers = {k: float(v) for k, v in diag.numbers.items() if isinstance(v, (int, float))}
    return HealRecord(time=now(), pod=pod, pod_uid=pod_uid, container=container, restart_count=restart_count,
                      cause=diag.cause, phase=diag.phase, evidence=[e[:500] for e in diag.evidence[:5]],
                      numbers=numbers, action=remedy.action, reason=remedy.reason[:2000],
                      changes=changes).wire()


def append_heal(heals: list[dict[str, Any]], record: dict[str, Any]) -> list[dict[str, Any]]:
    return (list(heals) + [record])[-MAX_HEAL_RECORDS:]


def history(heals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Heal records as the planner's history (cause, action, numbers)."""
    return [{"cause": h.get("cause"), "action": h.get("action"), "numbers": h.get("numbers", {})} for h in heals]
