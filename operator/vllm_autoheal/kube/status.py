"""Status as a pure function of what was observed: conditions, the phase, heal records, crash identity.

Conditions follow the Kubernetes API conventions (type, status, CamelCase reason, message
for people, lastTransitionTime that moves only when status changes, observedGeneration).
Every status write computes the phase and conditions with `phase_and_conditions`, so there is
one idea of the phase: Running when the pods are ready, Healing while a heal rolls out, Failed
only while not ready with the heals spent, else Progressing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic.alias_generators import to_camel

from ..api import MAX_FAILED_ENGINES, MAX_HEAL_RECORDS, MAX_OBSERVED_CRASHES, MAX_TRIED, FieldChange, HealRecord
from ..diagnosis import Diagnosis
from ..diagnosis.figures import MAX_GIB
from ..quantity import parse_quantity
from ..remedy import Remedy

READY, MEMORY_FIT, HEALING, HEAL_BLOCKED, HEAL_EXHAUSTED = (
    "Ready",
    "MemoryFit",
    "Healing",
    "HealBlocked",
    "HealExhausted",
)
ORDER = {READY: 0, MEMORY_FIT: 1, HEALING: 2, HEAL_BLOCKED: 3, HEAL_EXHAUSTED: 4}
RUNNING, HEALING_PHASE, FAILED, PROGRESSING = "Running", "Healing", "Failed", "Progressing"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def camel(cause: str) -> str:
    """kv_cache_insufficient -> KvCacheInsufficient (a condition reason)."""
    return "".join(part.capitalize() for part in cause.split("_")) or "Unknown"


def set_condition(
    conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, generation: int | None
) -> list[dict[str, Any]]:
    out = [dict(c) for c in conditions if c.get("type") != type_]
    old: dict[str, Any] = next((c for c in conditions if c.get("type") == type_), {})
    moved = not old or old.get("status") != status
    out.append(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message[:1000],
            "lastTransitionTime": now() if moved else old.get("lastTransitionTime", now()),
            "observedGeneration": generation,
        }
    )
    return sorted(out, key=lambda c: ORDER.get(c["type"], 9))


def is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True)
class Observed:
    """What one handler saw; None means "not observed now: keep what the status says"."""

    conditions: list[dict[str, Any]]  # as stored
    generation: int | None = None
    in_flight: dict[str, Any] | None = None  # status.inFlight after this write
    ready: bool | None = None  # the Deployment has its replicas available
    replicas: str = ""  # "1/1", for the Ready message
    exhausted: str | None = None  # a GiveUp's reason: HealExhausted until a person's edit
    exhausted_reason: str = "NoHealLeft"
    blocked: str | None = None  # the scheduler's message; "" = scheduled again
    memory_fit: dict[str, Any] | None = None  # pre-flight's condition
    person_edit: bool = False  # a person changed the spec: heal state starts over


def phase_and_conditions(obs: Observed) -> tuple[str, list[dict[str, Any]]]:
    gen = obs.generation
    conditions = [dict(c) for c in obs.conditions]
    if obs.person_edit:
        conditions = [c for c in conditions if c.get("type") not in (HEALING, HEAL_BLOCKED, HEAL_EXHAUSTED)]
    if obs.memory_fit is not None:
        conditions = [c for c in conditions if c.get("type") != MEMORY_FIT] + [obs.memory_fit]
    if obs.ready is not None:
        conditions = set_condition(
            conditions,
            READY,
            "True" if obs.ready else "False",
            "Available" if obs.ready else "Progressing",
            f"{obs.replicas} replicas available" if obs.replicas else "",
            gen,
        )
    if obs.exhausted is not None:
        conditions = set_condition(conditions, HEAL_EXHAUSTED, "True", obs.exhausted_reason, obs.exhausted, gen)
    if obs.blocked:
        conditions = set_condition(conditions, HEAL_BLOCKED, "True", "Unschedulable", obs.blocked, gen)
    elif obs.blocked == "" and is_true(conditions, HEAL_BLOCKED):
        conditions = set_condition(conditions, HEAL_BLOCKED, "False", "Scheduled", "the pods are scheduled", gen)
    if obs.in_flight is not None:
        conditions = set_condition(
            conditions, HEALING, "True", camel(obs.in_flight.get("cause", "")), obs.in_flight.get("summary", ""), gen
        )
    elif is_true(conditions, HEALING):
        ready = is_true(conditions, READY)
        conditions = set_condition(
            conditions,
            HEALING,
            "False",
            "Healed" if ready else "RolledOut",
            "serving again with the healed flags" if ready else "the healed flags are deployed",
            gen,
        )
    ready = is_true(conditions, READY)
    if obs.in_flight is not None:
        phase = HEALING_PHASE
    elif ready:
        phase = RUNNING
    elif is_true(conditions, HEAL_EXHAUSTED):
        phase = FAILED
    else:
        phase = PROGRESSING
    return phase, sorted(conditions, key=lambda c: ORDER.get(c.get("type", ""), 9))


def settle(update: dict[str, Any], obs: Observed) -> dict[str, Any]:
    """`update` with the phase and conditions that follow from it (status fields, camelCase)."""
    phase, conditions = phase_and_conditions(obs)
    return dict(update, phase=phase, conditions=conditions)


def unchanged(update: dict[str, Any], current: dict[str, Any]) -> bool:
    """Writing `update` would change nothing (so it is not written: no update storm)."""
    return all(current.get(k) == v or (v is None and k not in current) for k, v in update.items())


def crash_id(pod_uid: str, container: str, restart_count: int) -> str:
    return f"{pod_uid}/{container}/{restart_count}"


def remember(items: list[str], item: str, limit: int) -> list[str]:
    return (list(items) + ([item] if item not in items else []))[-limit:]


def remember_crash(observed: list[str], crash: str, finished: float | None) -> list[str]:
    """`observed` with `crash` (its id, and when it ended: `id@epoch-seconds`), the oldest let go."""
    entry = crash if finished is None else f"{crash}@{int(finished)}"
    return remember(observed, entry, MAX_OBSERVED_CRASHES)


def crash_seen(observed: list[str], crash: str, finished: float | None) -> bool:
    """The crash was handled already: it is remembered, or the list is full and every crash it holds
    ended after this one. (A crash pushed out of the list would otherwise be handled again on any
    later event of its pod: a tenant with more crashed pods than the list holds replayed its crashes,
    diagnoses, heal records and Events, at the cost of annotating its pods.)"""
    times, container = [], crash.rpartition("/")[0]
    for entry in observed:
        ident, _, when = entry.partition("@")
        ended = int(when) if when.isdigit() else None
        if ident == crash:
            return True
        # (one run, whatever count a view of the pod gave it: a container's run that ended the same second)
        if ended is not None and finished is not None and ended == int(finished) and ident.startswith(container + "/"):
            return True
        if ended is not None:
            times.append(ended)
    full = len(observed) >= MAX_OBSERVED_CRASHES
    return full and finished is not None and bool(times) and int(finished) < min(times)


def remember_tried(tried: list[str], cause: str, action: str) -> list[str]:
    return remember(tried, f"{cause}/{action}", MAX_TRIED)


def remember_failed(failed: list[str], fingerprint: str) -> list[str]:
    return remember(failed, fingerprint, MAX_FAILED_ENGINES)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def heal_record(
    pod: str,
    pod_uid: str,
    container: str,
    restart_count: int,
    diag: Diagnosis,
    remedy: Remedy,
    before: dict[str, Any],
    note: str | None = None,
    gpus: int | None = None,
    gpu_free_gib: float | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    changes = [
        FieldChange(field=to_camel(k), before=_text(before.get(k)), after=_text(v)) for k, v in remedy.changes.items()
    ]
    numbers = {k: float(v) for k, v in diag.numbers.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    reason = f"{remedy.reason} ({note})" if note else remedy.reason
    return HealRecord(
        time=now(),
        pod=pod,
        pod_uid=pod_uid,
        container=container,
        restart_count=restart_count,
        cause=diag.cause,
        phase=diag.phase,
        evidence=[e[:500] for e in diag.evidence[:5]],
        numbers=numbers,
        action=remedy.action,
        reason=reason[:2000],
        changes=changes,
        gpus=gpus,
        gpu_free_gib=gpu_free_gib if gpu_free_gib is not None and 0 <= gpu_free_gib <= MAX_GIB else None,
        unschedulable=unschedulable or None,
    ).wire()


def append_heal(heals: list[dict[str, Any]], record: dict[str, Any]) -> list[dict[str, Any]]:
    return (list(heals) + [record])[-MAX_HEAL_RECORDS:]


def history(tried: list[str], heals: list[dict[str, Any]], gpus: int | None = None) -> list[dict[str, Any]]:
    """The planner's history: what was tried since the last edit (status.tried, never cut short by
    other records), and the figures earlier crashes printed (status.heals). `gpus`: the split one
    replica runs on now; a crash recorded under another split (a heal's, or a user's edit of TP or
    PP) printed its per-GPU figures for that split."""
    out: list[dict[str, Any]] = [{"cause": t.split("/", 1)[0], "action": t.split("/", 1)[-1]} for t in tried]
    out += [
        {
            "cause": h.get("cause"),
            "action": None,
            "numbers": h.get("numbers", {}),
            # (a heal that changed the split: the weights its crash printed are per GPU of the split before)
            "resplit": any(
                isinstance(c, dict) and c.get("field") in ("tensorParallelSize", "pipelineParallelSize")
                for c in h.get("changes") or []
            ),
            "other_split": gpus is not None and h.get("gpus") is not None and h.get("gpus") != gpus,
            "ran_util": _before(h, "gpuMemoryUtilization"),  # (where the heal changed it: what the crash ran)
            # (a revert of a heal no node could take: the memory limit it had raised to)
            "refused_memory_limit": _refused_limit(h),
            "refused_gpus": _refused_gpus(h),
        }
        for h in heals
    ]
    return out


def _reverts_unschedulable(heal: dict[str, Any]) -> bool:
    """Whether the record answers a heal no node could take: its changes' `before` is what the scheduler refused
    (a revert to the flags that last scheduled, or to the next remedy that asks for no more)."""
    return heal.get("unschedulable") is True or heal.get("action") == "RevertUnschedulable"


def _refused_gpus(heal: dict[str, Any]) -> int | None:
    """The GPUs a pod asked for that no node could take, where the record's revert took a split back."""
    gpus = heal.get("gpus")
    if not _reverts_unschedulable(heal) or not isinstance(gpus, int) or isinstance(gpus, bool):
        return None
    for change in heal.get("changes") or []:
        if isinstance(change, dict) and change.get("field") in ("tensorParallelSize", "pipelineParallelSize"):
            try:
                if int(str(change.get("before"))) > int(str(change.get("after"))):
                    return gpus
            except ValueError:
                return None
    return None


def _refused_limit(heal: dict[str, Any]) -> str | None:
    if not _reverts_unschedulable(heal):
        return None
    for change in heal.get("changes") or []:
        if isinstance(change, dict) and change.get("field") == "memoryLimit":
            try:
                if parse_quantity(str(change.get("before"))) > parse_quantity(str(change.get("after"))):
                    return str(change.get("before"))
            except ValueError:
                return None
    return None


def _before(heal: dict[str, Any], field: str) -> float | None:
    """The value `field` had before the recorded heal changed it, where it did and it was a number."""
    for change in heal.get("changes") or []:
        if isinstance(change, dict) and change.get("field") == field:
            try:
                value = float(str(change.get("before")))
            except ValueError:
                return None
            return value if math.isfinite(value) else None
    return None
