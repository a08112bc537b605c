"""The heal of one crash, built around an Incident (pod, crash, diagnosis, plan).

A heal is planned once and recorded first: one status write (with the object's resourceVersion
as precondition) holds the crash's identity, the heal record, the counters and the intended
change (status.inFlight). Then it is applied: in PatchSpec mode a spec patch, in StatusOverrides
mode nothing more (the status write was the heal). If the process dies or the API fails between
the two, the intent is in status and `complete` finishes it: from a deferred retry, from
`reconcile` on the next start, or from the next event. If the first write fails, nothing was
recorded and the next event plans again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kopf

from .. import metrics
from ..api import Deployed, HealIntent, VLLMService
from ..diagnosis import Diagnosis
from ..gpu_catalog import lookup
from ..model_shape import ModelShape
from ..quantity import parse_quantity
from ..remedy import GIVE_UP, Inventory, Remedy, plan_heal
from ..vllm_release import logged_release
from . import heal_events, pods, resources
from . import status as st
from .client import Kube
from .config import OperatorConfig
from .crash import LogReadsBusy, ModelLookup, diagnose, queue_off_workers, unqueue_off_workers
from .heal_apply import (
    HEALED_ENGINE,
    complete,
    deployed,
    fp,
    healed_spec,
    in_spec,
    parse,
    resized_by_person,
    spec_digest,
    spec_patched,
)
from .later import Later, PerNamespace
from .writes import transient, update_status

EDIT_WAIT_S, EDIT_WAITS = 0.5, 120  # a reconcile writes its baseline right after its apply: wait up to a minute
# Crashes of one namespace waiting at once on a timer of their own (for an edit's baseline, every
# EDIT_WAIT_S; after a failed write, every retry_delay_s): an edit whose reconcile never writes one (a
# name conflict), or writes a tenant makes conflict, and a crash loop of many pods held a thread and
# its reads per crash. Beyond it a crash waits for its pod's next event.
WAITING_CRASHES_PER_NAMESPACE = 16
_waiting = PerNamespace(WAITING_CRASHES_PER_NAMESPACE)  # by crash id, while a look at it is pending


@dataclass
class Incident:
    namespace: str
    name: str
    pod: dict[str, Any]
    crash: dict[str, Any]
    diagnosis: Diagnosis = field(default_factory=Diagnosis)
    note: str | None = None  # why the termination message was not used
    remedy: Remedy | None = None  # the plan, made once when the crash is recorded
    waits: int = 0  # looks deferred until a person's edit had its new baseline written
    model: ModelLookup | None = None  # looked up once per look at the crash, before any lock
    off_workers: bool = False  # looked at from a timer thread, not one of kopf's workers
    gpu_free_gib: float | None = None  # the least free on the pod's GPUs before vLLM started (the launcher's probe)

    @property
    def pod_name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def pod_uid(self) -> str:
        return self.pod["metadata"].get("uid") or self.pod_name

    @property
    def crash_id(self) -> str:
        return st.crash_id(self.pod_uid, resources.CONTAINER, self.crash["restartCount"])


def inventory(
    obj: VLLMService, memory_limit: str | None, shape: ModelShape | None, diag: Diagnosis, free: float | None = None
) -> Inventory:
    inv = Inventory(gpu_free_gib=free)  # (unknown: the GPUs are taken to be the pod's alone)
    res = obj.spec.resources
    try:
        if res.gpu_product or res.gpu_memory_gib:
            gpu = lookup(res.gpu_product or "custom", res.gpu_memory_gib)
            inv.gpu_total_gib, inv.gpu_name = gpu.memory_gib, gpu.name
    except KeyError:
        pass
    inv.shape = shape  # the model's shape sets the utilization floor
    # (its batch defaults and profile, where the image or the engine's log names it)
    inv.release = obj.spec.release(logged_release(diag.numbers))
    if memory_limit:
        inv.memory_limit_bytes = parse_quantity(memory_limit)
    return inv


def _plan_heal(
    obj: VLLMService,
    shape: ModelShape | None,
    cfg: OperatorConfig,
    diag: Diagnosis,
    now: Deployed,
    exclude: frozenset[str] = frozenset(),
    extra_tried: tuple[str, ...] = (),
    free: float | None = None,
) -> Remedy:
    spec, cur = obj.spec, obj.status
    if not cfg.heal_enabled:  # the chart's cluster-wide switch
        spec = spec.model_copy(update={"heal": spec.heal.model_copy(update={"enabled": False})})
    history = st.history([*cur.tried, *extra_tried], [h.wire() for h in cur.heals], now.gpus())
    return plan_heal(
        spec,
        diag,
        history,
        inventory(obj, now.memory_limit, shape, diag, free),
        now.engine,
        attempts=cur.attempts,
        failed=cur.failed_engines,
        model=now.model,
        memory_limit=now.memory_limit,
        exclude=exclude,
    )


def _intent_fields(obj: VLLMService, intent: HealIntent) -> dict[str, Any]:
    """The status fields that start a heal (and, in StatusOverrides mode, are the heal)."""
    out: dict[str, Any] = {"inFlight": intent.wire()}
    if obj.spec.heal.mode == "StatusOverrides":
        target = intent.target
        out.update(
            effective=target.engine.wire(),
            gpus=target.gpus(),
            effectiveModel=target.model if target.model != obj.spec.model else None,
            effectiveMemoryLimit=target.memory_limit
            if target.memory_limit != obj.spec.resources.limits.memory
            else None,
        )
    return out


def record(
    kube: Kube, incident: Incident, fresh: dict[str, Any], cfg: OperatorConfig, expected: str
) -> dict[str, Any] | None:
    """The one status write that records the crash with its plan (None: already recorded). Each try of
    the write plans afresh: a plan of a try the API server refused (409: another replica, in a rolling
    update of the operator, recorded the crash first) is no heal of this one, nor its Events."""
    incident.remedy = None
    obj = parse(fresh)
    cur, cid = obj.status, incident.crash_id
    finished = pods.finished_at(incident.crash)
    if st.crash_seen(cur.observed_crashes, cid, finished):
        return None
    now = deployed(obj)
    update: dict[str, Any] = {"observedCrashes": st.remember_crash(cur.observed_crashes, cid, finished)}
    if fp(now) != expected:  # a heal or an edit landed since the pod was read: not this crash's to heal
        return update
    diag = incident.diagnosis
    shape = (incident.model or ModelLookup.of(kube, obj)).shape_for(kube, obj)
    remedy = incident.remedy = _plan_heal(obj, shape, cfg, diag, now, free=incident.gpu_free_gib)
    before = {**now.engine.model_dump(), "memory_limit": now.memory_limit, "model": now.model}
    heal = st.heal_record(
        incident.pod_name,
        incident.pod_uid,
        resources.CONTAINER,
        incident.crash["restartCount"],
        diag,
        remedy,
        before,
        incident.note,
        now.gpus(),
        incident.gpu_free_gib,
    )
    update.update(heals=st.append_heal([h.wire() for h in cur.heals], heal), lastCause=diag.cause)
    if cur.baseline is None:
        update.update(baseline=obj.spec.engine.wire(), baselineFor=resources.sized_for(obj))
    if diag.is_memory:
        update["failedEngines"] = st.remember_failed(cur.failed_engines, fp(now))
    in_flight = cur.in_flight.wire() if cur.in_flight else None
    if cur.in_flight is not None and cur.in_flight.applied and fp(cur.in_flight.target) == expected:
        in_flight = update["inFlight"] = None  # the heal rolled out, and its pods crashed: it is over
    exhausted = remedy.reason if remedy.action == GIVE_UP else None
    if not remedy.gives_up:
        target = Deployed(
            engine=remedy.apply(now.engine),
            model=remedy.changes.get("model", now.model),
            memory_limit=remedy.changes.get("memory_limit", now.memory_limit),
        )
        intent = HealIntent(
            crash=cid,
            cause=diag.cause,
            action=remedy.action,
            summary=remedy.summary()[:2048],
            target=target,
            previous=now,
            applied=obj.spec.heal.mode == "StatusOverrides",
            time=st.now(),
        )
        update.update(
            _intent_fields(obj, intent),
            attempts=cur.attempts + 1,
            healCount=cur.heal_count + 1,
            tried=st.remember_tried(cur.tried, diag.cause, remedy.action),
        )
        in_flight = update["inFlight"]
    return st.settle(
        update,
        st.Observed(
            [c.wire() for c in cur.conditions],
            obj.metadata.get("generation"),
            in_flight=in_flight,
            exhausted=exhausted,
            exhausted_reason=st.camel(diag.cause),
        ),
    )


def unhealed_since_baseline(obj: VLLMService) -> bool:
    """No heal made or in flight since the baseline: where pre-flight's fitted flags stand."""
    return obj.status.attempts == 0 and obj.status.in_flight is None


def person_edited(obj: VLLMService) -> bool:
    """Did a person change the spec since the baseline? In StatusOverrides mode any change of spec.engine, the
    model, memory limit or GPU (resources.on_baseline). In PatchSpec mode the operator writes its heals into the
    spec: a spec that is neither the baseline (unhealed since) nor what the operator's last spec patch left
    (its HEALED_SPEC annotation; before one, its HEALED_ENGINE and status.effective), nor the heal in flight's
    flags, is a person's. A heal recorded but not yet patched in is no edit."""
    spec, cur = obj.spec, obj.status
    if cur.baseline is None:
        return False
    if spec.heal.mode == "StatusOverrides":
        return not resources.on_baseline(obj)
    if resources.on_baseline(obj) and cur.baseline_for in (None, resources.sized_for(obj)):
        if unhealed_since_baseline(obj):
            return False  # status.effective is pre-flight's fitting flags for this very spec (Fix mode)
    now, intent = fp(in_spec(obj)), cur.in_flight
    # (the heal's own flags; before its spec patch is in, still the flags it heals from. Once it is, those are a
    # person's revert, whether or not its status mark landed: a rollout still under way changes nothing)
    if intent is not None and now == fp(intent.target):
        return False
    if resized_by_person(obj):  # (the model, memory limit or GPU changed, and no patch of the operator's did it)
        return True
    if intent is not None and not intent.applied and not spec_patched(obj, intent):
        if fp(deployed(obj)) == fp(intent.previous):  # (what runs: pre-flight's fitted flags, under Fix)
            return False
    written = healed_spec(obj)
    if written is not None:
        return spec_digest(obj, in_spec(obj)) != written[1]
    ours = (obj.metadata.get("annotations") or {}).get(HEALED_ENGINE)  # (the heals of earlier versions)
    return (
        cur.effective is not None
        and cur.effective != spec.engine
        and ours != json.dumps(spec.engine.wire(), sort_keys=True)
    )


def _recent(crash: dict[str, Any]) -> bool:
    """Within the edit wait of the crash's end: each pod event makes a new Incident, so the count of
    waits alone would start over; the crash's own end time bounds them all."""
    ended = pods.finished_at(crash)
    return ended is None or time.time() - ended < EDIT_WAIT_S * EDIT_WAITS


def _backing_off(obj: VLLMService) -> bool:
    backoff = obj.spec.heal.backoff_seconds
    last = next(
        (h for h in reversed(obj.status.heals) if h.action not in ("NoChange", "GiveUp") and not h.refused), None
    )
    if last is None or not backoff:
        return False
    return time.time() - datetime.fromisoformat(last.time.replace("Z", "+00:00")).timestamp() < backoff


def handle_crash(
    kube: Kube,
    cfg: OperatorConfig,
    later: Later,
    incident: Incident,
    logger: kopf.Logger,
    owned: Callable[[], bool] | None = None,
) -> None:
    """Look at one crash: heal it, or record why not. `owned`: whether the service's own Deployment runs the pod
    (handlers' check, whose reads are part of the look). A transient API error anywhere in the look defers it
    (a kopf event handler is never retried: the crash would wait for its pod's next event)."""
    try:
        if owned is not None and not owned():
            logger.info(f"pod {incident.pod_name} is not run by {incident.name}'s Deployment; its crash is not healed")
            return
        _look(kube, cfg, later, incident, logger)
    except Exception as exc:
        if not transient(exc):
            raise
        # (the look is idempotent: whatever it wrote before the error, the next look finds)
        if _waiting.take(incident.crash_id, incident.namespace):
            again = lambda: handle_crash(kube, cfg, later, incident, logger, owned)  # noqa: E731
            later.run(f"crash/{incident.crash_id}", cfg.retry_delay_s, again)
        logger.warning(f"could not look at the crash of {incident.pod_name} ({exc}); will try again")


def _look(kube: Kube, cfg: OperatorConfig, later: Later, incident: Incident, logger: kopf.Logger) -> None:
    ns, name = incident.namespace, incident.name
    started = time.monotonic()
    _waiting.release(incident.crash_id)  # (a pending look at it, if any, is this one: it may wait again)
    vsvc = kube.get_vsvc(ns, name)
    if vsvc is None:
        return
    obj = parse(vsvc)
    if obj.status.in_flight is not None and not obj.status.in_flight.applied:
        if complete(kube, cfg, later, ns, name, logger) == "deferred":  # finish what was started before deciding
            return
        vsvc = kube.get_vsvc(ns, name)
        if vsvc is None:
            return
        obj = parse(vsvc)
    if st.crash_seen(obj.status.observed_crashes, incident.crash_id, pods.finished_at(incident.crash)):
        return
    if person_edited(obj) and incident.waits < EDIT_WAITS and _recent(incident.crash):
        # The edit's reconcile has applied its flags but not yet written its new baseline: planned
        # now, the heal would start from the old one and that write would then undo it.
        if not _waiting.take(incident.crash_id, ns):
            return  # its namespace has enough crashes waiting: the pod's next event looks again
        incident.waits += 1
        later.run(f"crash/{incident.crash_id}", EDIT_WAIT_S, lambda: handle_crash(kube, cfg, later, incident, logger))
        return
    now = fp(deployed(obj))
    ran = pods.template_hash(incident.pod)
    if ran and ran != now:
        logger.info(f"crash of {incident.pod_name} ran flags that were already changed; not healing again")
        update_status(kube, cfg, ns, name, lambda fresh: record(kube, incident, fresh, cfg, expected=""))
        return
    if _backing_off(obj):
        # (recorded as seen: held back now, it is no heal at a later look, when its pod may long have recovered)
        logger.info(f"within the {obj.spec.heal.backoff_seconds}s heal backoff; not healing this crash")
        update_status(kube, cfg, ns, name, lambda fresh: record(kube, incident, fresh, cfg, expected=""))
        return
    incident.model = ModelLookup.of(kube, obj)
    try:
        incident.diagnosis = diagnose(kube, incident, obj)
    except LogReadsBusy:  # its namespace's log reads hold their share of kopf's workers: wait off them
        incident.off_workers = True
        if queue_off_workers(incident.crash_id, ns):  # (once: the pod's further events find it queued)
            # (its own key: a look at the same crash deferred under `crash/` must not replace it)
            later.run(f"crash-log/{incident.crash_id}", 0, lambda: _off_workers(kube, cfg, later, incident, logger))
        return
    written = update_status(kube, cfg, ns, name, lambda fresh: record(kube, incident, fresh, cfg, expected=now))
    if written is None or incident.remedy is None:
        # Recorded by another writer, or by this one's own write whose answer was lost (a timeout): whoever
        # recorded it, a heal in flight is finished now (idempotent), not at the pod's next event.
        complete(kube, cfg, later, ns, name, logger)
        return
    metrics.INCIDENTS.labels(cause=incident.diagnosis.cause).inc()
    # (a PatchSpec heal is made by its spec patch: the completion whose status mark lands says 'Healed', one that
    # is refused 'HealRefused'; in StatusOverrides mode the record was the heal)
    patch_spec = obj.spec.heal.mode == "PatchSpec"
    heal_events.post(vsvc, incident.diagnosis, incident.remedy, incident.pod_name, incident.note, unmade=patch_spec)
    outcome = "done" if incident.remedy.gives_up else complete(kube, cfg, later, ns, name, logger)
    if not incident.remedy.gives_up and outcome != "dropped":
        metrics.HEALS.labels(action=incident.remedy.action).inc()
        metrics.HEAL_LATENCY.observe(time.monotonic() - started)
        logger.info(f"healed {incident.diagnosis.cause}: {incident.remedy.summary()}")
    metrics.set_phase(f"{ns}/{name}", (written.get("status") or {}).get("phase"))


def _off_workers(kube: Kube, cfg: OperatorConfig, later: Later, incident: Incident, logger: kopf.Logger) -> None:
    try:
        handle_crash(kube, cfg, later, incident, logger)
    finally:
        unqueue_off_workers(incident.crash_id)
