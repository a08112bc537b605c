"""Heals whose pods cannot be scheduled (more GPUs or memory than any node has).

When the new pods of a heal stay Unschedulable for spec.heal.unschedulableSeconds, the heal is
blocked: a HealBlocked condition and a Warning Event carry the scheduler's message, and the
policy decides. Revert (the default) goes back to the flags that last scheduled (the ones that
ran and crashed) and takes the next remedy that needs no more resources; Wait only reports.
"""

from __future__ import annotations

import time
from typing import Any

import kopf

from ..api import Deployed, HealIntent, VLLMService
from ..diagnosis import Diagnosis
from ..quantity import parse_quantity
from ..remedy import Remedy
from ..remedy_gate import NEEDS_MORE_RESOURCES
from . import pods, resources
from . import status as st
from .client import Kube
from .config import OperatorConfig
from .crash import ModelLookup
from .heal import REVERT, _intent_fields, _plan_heal
from .heal_apply import _same, complete, fp, parse
from .later import Later
from .writes import event, update_status


def _bytes(quantity: str | None) -> float:
    return float(parse_quantity(quantity)) if quantity else float("inf")


def needs_more(intent: HealIntent) -> bool:
    """The heal asks the scheduler for more than what ran before it."""
    return (
        intent.action in NEEDS_MORE_RESOURCES
        or intent.target.gpus() > intent.previous.gpus()
        or _bytes(intent.target.memory_limit) > _bytes(intent.previous.memory_limit)
    )


def stuck_since(items: list[dict[str, Any]], name: str, template: str) -> tuple[float, str] | None:
    """The longest-waiting Unschedulable pod of this service that runs the heal's template."""
    waiting = [
        u
        for p in items
        if ((p.get("metadata") or {}).get("labels") or {}).get(resources.SERVICE_LABEL) == name
        and pods.template_hash(p) == template
        and (u := pods.unschedulable(p)) is not None
    ]
    return min(waiting) if waiting else None


def check(kube: Kube, cfg: OperatorConfig, later: Later, ns: str, name: str, logger: kopf.Logger) -> None:
    """Look at the heal's pods; act once they have waited long enough, else look again then."""
    vsvc = kube.get_vsvc(ns, name)
    if vsvc is None:
        return
    obj = parse(vsvc)
    intent = obj.status.in_flight
    if intent is None or not intent.applied:
        return
    items = kube.request(
        "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", f"{resources.SERVICE_LABEL}={name}")]
    ).get("items", [])
    found = stuck_since(items, name, fp(intent.target))
    if found is None:
        return
    since, message = found
    wait = obj.spec.heal.unschedulable_seconds - (time.time() - since)
    if wait > 0:
        later.run(f"blocked/{ns}/{name}", wait, lambda: check(kube, cfg, later, ns, name, logger))
        return
    blocked(kube, cfg, later, obj, vsvc, intent, message, logger)


def _changes(before: Deployed, after: Deployed) -> dict[str, Any]:
    a, b = before.engine.model_dump(), after.engine.model_dump()
    out = {k: v for k, v in b.items() if a.get(k) != v}
    if after.model != before.model:
        out["model"] = after.model
    if after.memory_limit != before.memory_limit:
        out["memory_limit"] = after.memory_limit
    return out


def _diagnosis(obj: VLLMService, intent: HealIntent) -> tuple[Diagnosis, float | None]:
    """The crash the blocked heal was for, from its record (the figures vLLM printed), and the least free
    memory the launcher saw before it, which sized the heal."""
    rec = next((h for h in reversed(obj.status.heals) if h.cause == intent.cause), None)
    if rec is None:
        return Diagnosis(cause=intent.cause), None
    return Diagnosis(
        cause=rec.cause,
        phase=rec.phase,
        numbers=dict(rec.numbers),
        evidence=list(rec.evidence),
        source="termination-message",
    ), rec.gpu_free_gib


def _revert(
    kube: Kube,
    fresh: VLLMService,
    model: ModelLookup,
    cfg: OperatorConfig,
    intent: HealIntent,
    message: str,
    pod: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    cur = fresh.status
    last_good = intent.previous
    diag, free = _diagnosis(fresh, intent)
    remedy = _plan_heal(
        fresh,
        model.shape_for(kube, fresh),
        cfg,
        diag,
        last_good,
        exclude=NEEDS_MORE_RESOURCES,
        extra_tried=(f"{intent.cause}/{intent.action}",),
        free=free,
    )
    update: dict[str, Any] = {}
    if remedy.gives_up:
        target, action = last_good, REVERT
        summary = f"{REVERT}: back to the flags that last scheduled; {remedy.reason}"
    else:
        target = Deployed(
            engine=remedy.apply(last_good.engine),
            model=remedy.changes.get("model", last_good.model),
            memory_limit=remedy.changes.get("memory_limit", last_good.memory_limit),
        )
        action, summary = remedy.action, f"{remedy.summary()} ({intent.action} could not be scheduled)"
        update.update(
            attempts=cur.attempts + 1,
            healCount=cur.heal_count + 1,
            tried=st.remember_tried(cur.tried, intent.cause, remedy.action),
        )
    new = HealIntent(
        crash=intent.crash,
        cause=intent.cause,
        action=action,
        summary=summary[:2048],
        target=target,
        previous=intent.target,
        applied=fresh.spec.heal.mode == "StatusOverrides",
        time=st.now(),
    )
    update.update(_intent_fields(fresh, new))
    before = {
        **intent.target.engine.model_dump(),
        "memory_limit": intent.target.memory_limit,
        "model": intent.target.model,
    }
    record = st.heal_record(
        pod,
        "",
        resources.CONTAINER,
        0,
        diag,
        Remedy(action, _changes(intent.target, target), f"{summary} Scheduler: {message}"),
        before,
        gpus=intent.target.gpus(),
    )
    update["heals"] = st.append_heal([h.wire() for h in cur.heals], record)
    return update, update["inFlight"]


def blocked(
    kube: Kube,
    cfg: OperatorConfig,
    later: Later,
    obj: VLLMService,
    vsvc: dict[str, Any],
    intent: HealIntent,
    message: str,
    logger: kopf.Logger,
) -> None:
    ns, name = obj.metadata["namespace"], obj.metadata["name"]
    revert = obj.spec.heal.on_unschedulable == "Revert" and needs_more(intent)
    acted: list[bool] = []
    model = ModelLookup.of(kube, obj) if revert else None

    def change(fresh_body: dict[str, Any]) -> dict[str, Any] | None:
        fresh = parse(fresh_body)
        if not _same(fresh, intent):
            return None
        conditions = [c.wire() for c in fresh.status.conditions]
        gen = fresh.metadata.get("generation")
        if not revert:
            out = st.settle({}, st.Observed(conditions, gen, in_flight=intent.wire(), blocked=message))
            if st.unchanged(out, fresh_body.get("status") or {}):
                return None
            acted.append(False)
            return out
        update, in_flight = _revert(
            kube, fresh, model or ModelLookup.of(kube, fresh), cfg, intent, message, f"{name} (unschedulable)"
        )
        acted.append(True)
        return st.settle(update, st.Observed(conditions, gen, in_flight=in_flight, blocked=message))

    written = update_status(kube, cfg, ns, name, change)
    if written is None or not acted:  # gone, or already reported
        return
    event(vsvc, type="Warning", reason="HealBlocked", message=f"{intent.action} cannot be scheduled: {message}"[:1000])
    if acted[-1]:
        logger.info(f"{intent.action} could not be scheduled; back to the flags that last scheduled")
        complete(kube, cfg, later, ns, name, logger)
