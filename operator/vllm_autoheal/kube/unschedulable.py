"""Heals whose pods cannot be scheduled (more GPUs or memory than any node has).

When the new pods of a heal stay Unschedulable (or the API server refuses to create them: a LimitRange,
a ResourceQuota) for spec.heal.unschedulableSeconds, the heal is
blocked: a HealBlocked condition and a Warning Event carry the scheduler's message, and the
policy decides. Revert (the default) goes back to the flags that last scheduled (the ones that
ran and crashed) and takes the next remedy that needs no more resources; Wait only reports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kopf

from ..api import Deployed, HealIntent, VLLMService
from ..diagnosis import Diagnosis
from ..quantity import parse_quantity
from ..remedy import Remedy
from ..remedy_gate import NEEDS_MORE_RESOURCES
from . import heal_events, ownership, pods, resources
from . import status as st
from .client import Kube
from .config import OperatorConfig
from .crash import ModelLookup
from .heal import _intent_fields, _plan_heal
from .heal_apply import REVERT, _same, complete, fp, parse
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


def stuck_since(
    items: list[dict[str, Any]], name: str, template: str, owned: Callable[[dict[str, Any]], bool] = lambda p: True
) -> tuple[float, str] | None:
    """The longest-waiting Unschedulable pod of this service that runs the heal's template (and that its
    own Deployment runs, `owned`: a decoy with its label and hash reverts no heal)."""
    waiting = [
        u
        for p in items
        if ((p.get("metadata") or {}).get("labels") or {}).get(resources.SERVICE_LABEL) == name
        and pods.template_hash(p) == template
        and (u := pods.unschedulable(p)) is not None
        and owned(p)
    ]
    return min(waiting) if waiting else None


# A look GETs the service and LISTs its pods. Pending pods' events come in bursts (the scheduler's
# retries; a tenant annotating N pods it keeps Pending, free as they hold no node): N events read N x N
# pods. Looks within READ_FOR_S of a read share it. The burst's first event still reads fresh, a look
# that would act reads again first, and one the shared read cannot explain asks a fresh look when it
# expires: a stale read delays nothing that acts and loses no event.
READ_FOR_S = 1.0
RECENT_READS = 1024  # services read within READ_FOR_S, every tenant's together


@dataclass
class Read:
    """What one look read of a service, as the looks sharing it need it (not the object: kept for a
    second, by up to RECENT_READS services, a large spec would weigh)."""

    at: float  # on the RecentReads clock
    wall: float  # time.time() then: when it expires, as a look is scheduled
    intent: HealIntent | None  # applied and in flight, else None
    template: str | None  # fp(intent.target): the hash the heal's pods carry
    stuck: tuple[float, str] | None
    stuck_for_s: int = 0  # spec.heal.unschedulableSeconds
    look_at: float | None = None  # (wall) when the look this read asked for is due
    settled: bool = False  # deciding on this read changed nothing: the looks sharing it need not decide again
    applying: bool = False  # a heal in flight, not yet applied: its pods may come before it is
    service_uid: str | None = None  # the service's, as read: a pod its chain once tied to a namesake is not its


class RecentReads:
    """The last read of each service, shared by the looks within `fresh_for_s` of it; at most `limit`
    services (the oldest go first), so one tenant's many services cannot grow it."""

    def __init__(
        self, fresh_for_s: float = READ_FOR_S, limit: int = RECENT_READS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.fresh_for_s, self.limit, self.clock = fresh_for_s, limit, clock
        self._reads: dict[str, Read] = {}  # oldest first
        self._guard = threading.Lock()

    def get(self, key: str) -> Read | None:
        with self._guard:
            read = self._reads.get(key)
            return read if read is not None and self.clock() - read.at < self.fresh_for_s else None

    def put(self, key: str, read: Read) -> None:
        with self._guard:
            now = self.clock()
            while self._reads and (
                len(self._reads) >= self.limit or now - next(iter(self._reads.values())).at >= self.fresh_for_s
            ):
                del self._reads[next(iter(self._reads))]
            current = self._reads.pop(key, None)
            self._reads[key] = current if current is not None and current.at > read.at else read  # (a slower read)

    def drop(self, key: str) -> None:
        with self._guard:
            self._reads.pop(key, None)

    def ask_look(self, read: Read, at: float, ask: Callable[[], None]) -> None:
        """`ask()` for a look due at `at` (wall), unless `read` asked for one due by then: a burst sharing
        it starts one timer, not one per event. (Under the guard: a later look asked meanwhile by another
        event cannot replace it.)"""
        with self._guard:
            if read.look_at is None or at < read.look_at:
                read.look_at = at
                ask()

    def __len__(self) -> int:
        return len(self._reads)


_recent = RecentReads()


class NamespaceLooks:
    """The looks due later, on one timer a namespace (at its earliest look): a tenant whose many services
    each wait a day for a heal's pods to be placed (unschedulableSeconds) holds one thread, not one each.
    A service's newer look replaces its pending one, as Later.run does."""

    def __init__(self) -> None:
        self._due: dict[str, dict[str, tuple[float, Callable[[], None]]]] = {}  # ns -> name -> (at, look)
        self._guard = threading.Lock()

    def add(self, later: Later, ns: str, name: str, at: float, look: Callable[[], None]) -> None:
        with self._guard:
            self._due.setdefault(ns, {})[name] = (at, look)
            self._arm(later, ns)

    def _arm(self, later: Later, ns: str) -> None:  # (under the guard: a look added meanwhile is seen)
        looks = self._due.get(ns)
        if looks:
            earliest = min(at for at, _ in looks.values())
            later.run(f"blocked/{ns}", earliest - time.time(), lambda: self._fire(later, ns))

    def _fire(self, later: Later, ns: str) -> None:
        """The namespace's timer: its earliest look is due, and any other whose time came."""
        with self._guard:
            looks = self._due.get(ns, {})
            first = min((at for at, _ in looks.values()), default=0.0)
            due = [name for name, (at, _) in looks.items() if at <= max(first, time.time())]
            run = [looks.pop(name)[1] for name in due]
            if not looks:
                self._due.pop(ns, None)
        for look in run:  # (each reads fresh, and asks again where it must)
            try:
                look()
            except Exception:  # noqa: BLE001 - the service's next pod event looks again
                logging.getLogger(__name__).exception(f"a look at {ns}'s unschedulable heals failed")
        with self._guard:
            self._arm(later, ns)

    def __len__(self) -> int:
        return sum(len(looks) for looks in self._due.values())


_looks = NamespaceLooks()


def _read(kube: Kube, ns: str, name: str) -> tuple[Read, dict[str, Any] | None]:
    """The service (its object too) and, while a heal is applied, its pods."""
    at, wall = _recent.clock(), time.time()  # (before the requests: its age errs on the old side)
    vsvc = kube.get_vsvc(ns, name)
    obj = parse(vsvc) if vsvc is not None else None
    intent = obj.status.in_flight if obj is not None else None
    if obj is None or intent is None or not intent.applied:
        return Read(at, wall, None, None, None, applying=intent is not None), vsvc
    items = kube.request(
        "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", f"{resources.SERVICE_LABEL}={name}")]
    ).get("items", [])
    template, uid = fp(intent.target), str(((vsvc or {}).get("metadata") or {}).get("uid"))
    stuck = stuck_since(items, name, template, lambda p: ownership.run_by_service(kube, ns, name, p, uid))
    dep = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")  # (pods the API server refused)
    stuck = _earliest(stuck, pods.create_refused(dep, template, uid))
    return Read(at, wall, intent, template, stuck, obj.spec.heal.unschedulable_seconds, service_uid=uid), vsvc


def _earliest(a: tuple[float, str] | None, b: tuple[float, str] | None) -> tuple[float, str] | None:
    return b if a is None else a if b is None else min(a, b)


def check(
    kube: Kube,
    cfg: OperatorConfig,
    later: Later,
    ns: str,
    name: str,
    logger: kopf.Logger,
    pod: dict[str, Any] | None = None,
    fresh: bool = False,
) -> None:
    """Look at the heal's pods; act once they have waited long enough, else look again then. `pod` is
    the Pending pod whose event asks (newer than a shared read); `fresh` reads anew whatever was read."""
    key = f"{ns}/{name}"
    cached = None if fresh else _recent.get(key)
    read, vsvc = (cached, None) if cached is not None else _read(kube, ns, name)
    shared = cached is not None
    if not shared:
        _recent.put(key, read)

    def look_by(at: float) -> None:  # (wall) one pending look a service, reading fresh
        def ask() -> None:
            _looks.add(later, ns, name, at, lambda: check(kube, cfg, later, ns, name, logger, fresh=True))

        _recent.ask_look(read, at, ask)

    found = read.stuck
    if shared and pod is not None:  # the event's pod, as the read's heal sees it
        owned = lambda p: ownership.run_by_service(kube, ns, name, p, read.service_uid)  # noqa: E731
        own = stuck_since([pod], name, read.template, owned) if read.template is not None else None
        found = _earliest(found, own) if own is not None else None
    if found is None:
        # A heal, pod or template newer than the read may be stuck: look fresh when it expires. So too
        # while a heal is being applied (a pod of its template may have come first, and shows no more
        # events once Pending), until it is.
        if shared or read.applying:
            look_by(read.wall + _recent.fresh_for_s)
        return
    since, message = found
    deadline = since + read.stuck_for_s
    if deadline > time.time():
        look_by(deadline)
        return
    if shared:  # act only on a fresh read: the pod may be placed by now, the heal moved on
        if not read.settled:
            check(kube, cfg, later, ns, name, logger, pod, fresh=True)
        return
    if vsvc is None or read.intent is None:  # (a fresh read that found a pod stuck has both)
        return
    if blocked(kube, cfg, later, parse(vsvc), vsvc, read.intent, message, logger):
        _recent.drop(key)  # the status changed: the next look must see it
    else:
        read.settled = True


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
        unschedulable=True,
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
) -> bool:
    """Report the heal as blocked, and revert it where the policy says; True when the status changed."""
    ns, name = obj.metadata["namespace"], obj.metadata["name"]
    revert = obj.spec.heal.on_unschedulable == "Revert" and needs_more(intent)
    acted: list[bool] = []
    model = ModelLookup.of(kube, obj) if revert else None

    def change(fresh_body: dict[str, Any]) -> dict[str, Any] | None:
        acted.clear()  # (a try the API server refused acted on nothing: another replica may have reported it)
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
        return False
    event(vsvc, type="Warning", reason="HealBlocked", message=f"{intent.action} cannot be scheduled: {message}"[:1000])
    if acted[-1]:
        logger.info(f"{intent.action} could not be scheduled; back to the flags that last scheduled")
        # (StatusOverrides: the record is the heal, as a crash's is; in PatchSpec mode its status mark announces it)
        made = parse(written).status.in_flight
        if made is not None and made.applied and made.action != REVERT and heal_events.allowed(vsvc, "Healed"):
            event(vsvc, type="Normal", reason="Healed", message=made.summary[:1000])
        complete(kube, cfg, later, ns, name, logger)
    return True
