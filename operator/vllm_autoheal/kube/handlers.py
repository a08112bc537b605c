"""kopf handlers: reconcile VLLMServices into Deployments, watch their pods, heal memory crashes.

State lives in the VLLMService itself: status.baseline (the engine args a person wrote),
status.effective (what is deployed), status.heals, status.observedCrashes (so a restarted
operator never handles a crash twice) and an annotation naming the engine args the
operator itself wrote into the spec (so a person's later edit becomes the new baseline).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import datetime
from typing import Any

import kopf
from pydantic import ValidationError

from .. import metrics, model_source
from ..api import GROUP, PLURAL, VERSION, EngineArgs, VLLMService
from ..diagnosis import Diagnosis, Signals, classify
from ..gpus import lookup
from ..preflight import preflight
from ..quantity import parse_quantity
from ..remedy import Inventory, Remedy, plan
from . import resources
from . import status as st
from .client import Kube

HEALED_ENGINE = f"{GROUP}/healed-engine"      # engine args the operator wrote into spec (PatchSpec)
OPERATOR_IMAGE = os.environ.get("AUTOHEAL_OPERATOR_IMAGE", resources.DEFAULT_OPERATOR_IMAGE)
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf's default keeps progress under status.<handler>, which the real API server prunes
    # (our status schema is closed): keep all of kopf's bookkeeping in annotations instead.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8


def parse(body: dict[str, Any]) -> VLLMService:
    try:
        return VLLMService.model_validate(dict(body))
    except ValidationError as exc:  # the CRD schema should have stopped it; say what is wrong
        raise kopf.PermanentError(f"invalid VLLMService: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}")


def _with_status(obj: VLLMService, status: dict[str, Any]) -> VLLMService:
    merged = {**obj.status.wire(), **status}
    return obj.model_copy(update={"status": type(obj.status).model_validate(merged)})


def _preflight(obj: VLLMService, generation: int | None, conditions: list, status: dict) -> list:
    spec = obj.spec
    if spec.preflight == "Off":
        return conditions
    if not (spec.resources.gpu_product or spec.resources.gpu_memory_gib):
        return st.set_condition(conditions, st.MEMORY_FIT, "Unknown", "NoGpuProduct", "set resources.gpuProduct "
                                "or resources.gpuMemoryGiB to check memory before start", generation)
    model = model_source.for_service(obj, Kube().get)
    if not model.ok:
        return st.set_condition(conditions, st.MEMORY_FIT, "Unknown", "ModelConfigPending" if model.pending else
                                "ModelConfigUnavailable", f"no model config, so no pre-flight: {model.error}",
                                generation)
    try:
        gpu = lookup(spec.resources.gpu_product or "custom", spec.resources.gpu_memory_gib)
        result = preflight(spec, gpu, model.shape)
    except Exception as exc:  # whatever the spec holds, pre-flight costs a condition, never the reconcile
        return st.set_condition(conditions, st.MEMORY_FIT, "Unknown", "PreflightFailed",
                                f"{type(exc).__name__}: {str(exc)[:500]}", generation)
    est = result.estimate
    if result.fits and result.changed:
        status["effective"] = result.engine.wire()
        msg = f"fitted at start: {' '.join(s.flags() for s in result.steps)}; KV {est.kv_cache_gib:.2f} GiB"
        return st.set_condition(conditions, st.MEMORY_FIT, "True", "FittedByPreflight", msg, generation)
    if result.fits:
        msg = f"KV cache {est.kv_cache_gib:.2f} GiB = {est.kv_tokens:,} tokens; weights {est.weights_gib:.2f} GiB/GPU"
        return st.set_condition(conditions, st.MEMORY_FIT, "True", "Fits", msg, generation)
    return st.set_condition(conditions, st.MEMORY_FIT, "False", st.camel(est.failure or "DoesNotFit"),
                            "; ".join(result.reasons), generation)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile(body: kopf.Body, meta: kopf.Meta, logger: logging.Logger, **_: Any) -> None:
    obj = parse(body)
    spec, cur = obj.spec, obj.status
    generation = meta.get("generation")
    new: dict[str, Any] = {}
    engine_wire = spec.engine.wire()
    ours = (meta.get("annotations") or {}).get(HEALED_ENGINE)
    person_edit = cur.baseline is not None and (
        (spec.heal.mode == "StatusOverrides" and cur.baseline != spec.engine) or
        (spec.heal.mode == "PatchSpec" and cur.effective is not None and cur.effective != spec.engine
         and ours != json.dumps(engine_wire, sort_keys=True)))
    if cur.baseline is None or person_edit:
        new.update(baseline=engine_wire, effective=None, effectiveModel=None, attempts=0)
        if person_edit:
            logger.info("spec.engine changed by a person: new baseline, heal attempts reset")
    current = [c.wire() for c in cur.conditions]
    conditions = _preflight(_with_status(obj, new), generation, current, new)
    target = _with_status(obj, new)
    _model, engine, _memory = resources.effective(target)
    kube = Kube()
    # Under the object's lock: a heal applies the same objects itself; waiting for it finds
    # them unchanged instead of writing them a second time.
    with _lock(f"{meta.get('namespace')}/{meta.get('name')}"):
        applied = kube.apply_all(resources.render(target, OPERATOR_IMAGE))
        for manifest, outcome in applied.outcomes:
            if outcome != "unchanged":
                logger.info(f"{manifest['kind']} {manifest['metadata']['name']} {outcome}")
    if applied.conflicts:  # someone else's object has the name: write nothing, say so, look again later
        _name_conflict(kube, body, meta, applied.conflicts, current)
    fit = next((c for c in conditions if c["type"] == st.MEMORY_FIT), None)  # reconcile's own condition
    own_conditions = {st.MEMORY_FIT: fit} if fit is not None and fit not in current else {}
    _write_reconciled(kube, meta.get("namespace"), meta.get("name"), new, own_conditions, person_edit,
                      dict(generation=generation, gpus=spec.gpu_count(), endpoint=resources.endpoint(obj),
                           effective=engine.wire()))
    if fit is not None and fit["reason"] == "ModelConfigPending":  # a slow Hub: check again when it answered
        raise kopf.TemporaryError("the model config is still being fetched", delay=2 * model_source.timeout_s())


def _name_conflict(kube: Kube, body: kopf.Body, meta: kopf.Meta, conflicts: list[str], current: list) -> None:
    message = (f"{', '.join(conflicts)} already exists and is not controlled by this VLLMService; nothing was "
               "written. Rename the VLLMService or remove that object.")
    conditions = st.set_condition(current, st.READY, "False", "NameConflict", message, meta.get("generation"))
    if conditions != current:  # once per conflict, not on every retry
        kopf.event(body, type="Warning", reason="NameConflict", message=message)
        kube.patch_vsvc_status(meta.get("namespace"), meta.get("name"), {"conditions": conditions})
    raise kopf.TemporaryError(message, delay=60)


def _write_reconciled(kube: Kube, namespace: str, name: str, new: dict[str, Any], own: dict[str, dict],
                      person_edit: bool, fields: dict[str, Any]) -> None:
    """Status writes are read-modify-write under the object's lock: a merge patch replaces the
    conditions list whole, so a write from a stale read would drop another handler's condition."""
    with _lock(f"{namespace}/{name}"):
        fresh = kube.get_vsvc(namespace, name)
        if fresh is None:
            return
        status = fresh.get("status") or {}
        conditions = [c for c in status.get("conditions", []) if c.get("type") not in own]
        if person_edit:
            conditions = [c for c in conditions if c.get("type") not in (st.HEAL_EXHAUSTED, st.HEALING)]
        conditions = sorted(conditions + list(own.values()), key=lambda c: st.ORDER.get(c["type"], 9))
        exhausted = any(c["type"] == st.HEAL_EXHAUSTED and c["status"] == "True" for c in conditions)
        phase = status.get("phase") if status.get("phase") in ("Running", "Healing") and not person_edit \
            else "Progressing"
        update = {**new, "phase": "Failed" if exhausted else phase, "observedGeneration": fields["generation"],
                  "gpus": fields["gpus"], "endpoint": fields["endpoint"], "effective": fields["effective"],
                  "conditions": conditions}
        kube.patch_vsvc_status(namespace, name, update)
    metrics.set_phase(f"{namespace}/{name}", update["phase"])


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget(meta: kopf.Meta, **_: Any) -> None:
    metrics.set_phase(f"{meta.get('namespace')}/{meta.get('name')}", None)


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": "vllm-autoheal"})
def deployment_progress(body: kopf.Body, type: str, namespace: str, **_: Any) -> None:
    name = (body.get("metadata", {}).get("labels") or {}).get(resources.SERVICE_LABEL)
    if not name or type == "DELETED":
        return
    want = body.get("spec", {}).get("replicas", 1)
    have = (body.get("status") or {}).get("availableReplicas") or 0
    kube = Kube()
    with _lock(f"{namespace}/{name}"):
        vsvc = kube.get_vsvc(namespace, name)
        if vsvc is None:
            return
        status = vsvc.get("status") or {}
        ready = want > 0 and have >= want
        conditions = st.set_condition(status.get("conditions", []), st.READY, "True" if ready else "False",
                                      "Available" if ready else "Progressing", f"{have}/{want} replicas available",
                                      vsvc["metadata"].get("generation"))
        phase = status.get("phase") or "Progressing"
        if ready and phase in ("Progressing", "Healing", "Pending"):
            phase = "Running"
            if any(c["type"] == st.HEALING and c["status"] == "True" for c in conditions):
                conditions = st.set_condition(conditions, st.HEALING, "False", "Healed",
                                              "serving again with the healed flags", vsvc["metadata"].get("generation"))
        if conditions != status.get("conditions") or phase != status.get("phase"):
            kube.patch_vsvc_status(namespace, name, {"conditions": conditions, "phase": phase})
            metrics.set_phase(f"{namespace}/{name}", phase)


def find_crash(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The vLLM container's failed run, from state.terminated or lastState.terminated."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != resources.CONTAINER:
            continue
        restarts = int(cs.get("restartCount") or 0)
        current = (cs.get("state") or {}).get("terminated")
        if current and (current.get("exitCode") or current.get("reason") == "OOMKilled"):
            return {**current, "restartCount": restarts}
        previous = (cs.get("lastState") or {}).get("terminated")
        if previous and (previous.get("exitCode") or previous.get("reason") == "OOMKilled"):
            return {**previous, "restartCount": max(restarts - 1, 0)}
    return None


@kopf.on.event("", "v1", "pods", labels={resources.SERVICE_LABEL: kopf.PRESENT})
def pod_crashed(body: kopf.Body, type: str, namespace: str, logger: logging.Logger, **_: Any) -> None:
    if type == "DELETED":
        return
    crash = find_crash(dict(body))
    if crash is None:
        return
    name = body["metadata"]["labels"][resources.SERVICE_LABEL]
    with _lock(f"{namespace}/{name}"):
        handle_crash(Kube(), namespace, name, dict(body), crash, logger)


def _diagnose(kube: Kube, namespace: str, pod: dict[str, Any], crash: dict[str, Any], obj: VLLMService) -> Diagnosis:
    signals = dict(exit_code=crash.get("exitCode"), reason=crash.get("reason"),
                   tensor_parallel_size=obj.spec.engine.tensor_parallel_size,
                   pipeline_parallel_size=obj.spec.engine.pipeline_parallel_size, gpu_count=obj.spec.gpu_count())
    diag = classify(Signals(termination_message=crash.get("message"), **signals))
    if diag.source == "termination-message" or (diag.cause not in ("unknown",) and diag.source == "log"):
        return diag
    # The 2 KiB log tail never holds a vLLM root cause: read the crashed container's own log.
    log = kube.previous_log(namespace, pod["metadata"]["name"], resources.CONTAINER)
    if log:
        from_log = classify(Signals(log=log, **signals))
        if from_log.cause != "unknown" or diag.cause == "unknown":
            return from_log
    return diag


def _inventory(obj: VLLMService, memory_limit: str | None) -> Inventory:
    inv = Inventory()
    res = obj.spec.resources
    try:
        if res.gpu_product or res.gpu_memory_gib:
            inv.gpu_total_gib = lookup(res.gpu_product or "custom", res.gpu_memory_gib).memory_gib
    except KeyError:
        pass
    inv.shape = model_source.for_service(obj, Kube().get).shape
    if memory_limit:
        inv.memory_limit_bytes = parse_quantity(memory_limit)
    return inv


def handle_crash(kube: Kube, namespace: str, name: str, pod: dict[str, Any], crash: dict[str, Any],
                 logger: logging.Logger) -> None:
    started = time.monotonic()
    vsvc = kube.get_vsvc(namespace, name)
    if vsvc is None:
        return
    obj = VLLMService.model_validate(vsvc)
    cur = obj.status
    pod_uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
    cid = st.crash_id(pod_uid, resources.CONTAINER, crash["restartCount"])
    if cid in cur.observed_crashes:
        return
    model, engine, memory_limit = resources.effective(obj)
    seen = st.remember_crash(cur.observed_crashes, cid)
    template_hash = (pod["metadata"].get("annotations") or {}).get(resources.ENGINE_HASH)
    if template_hash and template_hash != resources.engine_hash(model, engine, memory_limit):
        logger.info(f"crash of {pod['metadata']['name']} ran flags that were already changed; not healing again")
        kube.patch_vsvc_status(namespace, name, {"observedCrashes": seen})
        return
    heal = obj.spec.heal
    last_real = next((h for h in reversed(cur.heals) if h.action not in ("NoChange", "GiveUp")), None)
    if last_real is not None and heal.backoff_seconds:
        age = time.time() - datetime.fromisoformat(last_real.time.replace("Z", "+00:00")).timestamp()
        if age < heal.backoff_seconds:
            logger.info(f"within the {heal.backoff_seconds}s heal backoff; will look again on the next restart")
            return
    diag = _diagnose(kube, namespace, pod, crash, obj)
    metrics.INCIDENTS.labels(cause=diag.cause).inc()
    recent = [h.wire() for h in cur.heals if h.action not in ("NoChange", "GiveUp")][-cur.attempts:] \
        if cur.attempts else []
    spec = obj.spec
    if os.environ.get("AUTOHEAL_HEAL_ENABLED", "true").lower() == "false":  # the chart's cluster-wide switch
        spec = spec.model_copy(update={"heal": spec.heal.model_copy(update={"enabled": False})})
    remedy = plan(spec, diag, st.history(recent), _inventory(obj, memory_limit), engine)
    before = {**engine.model_dump(), "memory_limit": memory_limit, "model": model}
    record = st.heal_record(pod["metadata"]["name"], pod_uid, resources.CONTAINER, crash["restartCount"], diag,
                            remedy, before)
    generation = vsvc["metadata"].get("generation")
    status: dict[str, Any] = {"observedCrashes": seen, "heals": st.append_heal([h.wire() for h in cur.heals], record),
                              "lastCause": diag.cause}
    if cur.baseline is None:
        status["baseline"] = obj.spec.engine.wire()
    evidence = diag.evidence[0][:300] if diag.evidence else "no evidence line"
    conditions = [c.wire() for c in cur.conditions]
    if diag.is_memory:
        kopf.event(vsvc, type="Warning", reason="OOMDetected",
                   message=f"{diag.cause} ({diag.phase}) in {pod['metadata']['name']}: {evidence}")
    if remedy.gives_up:
        _record_no_heal(kube, vsvc, namespace, name, diag, remedy, status, conditions, generation)
        return
    _apply_heal(kube, obj, vsvc, namespace, name, engine, model, memory_limit, remedy, status, conditions,
                generation, diag)
    metrics.HEALS.labels(action=remedy.action).inc()
    metrics.HEAL_LATENCY.observe(time.monotonic() - started)
    kopf.event(vsvc, type="Normal", reason="Healed", message=f"{remedy.summary()}"[:1000])
    logger.info(f"healed {diag.cause}: {remedy.summary()}")


def _record_no_heal(kube: Kube, vsvc: dict, namespace: str, name: str, diag: Diagnosis, remedy: Remedy,
                    status: dict[str, Any], conditions: list, generation: int | None) -> None:
    if remedy.action == "GiveUp":
        metrics.EXHAUSTED.inc()
        status["conditions"] = st.set_condition(conditions, st.HEAL_EXHAUSTED, "True", st.camel(diag.cause),
                                                remedy.reason, generation)
        status["phase"] = "Failed"
        kopf.event(vsvc, type="Warning", reason="HealExhausted", message=remedy.reason[:1000])
    elif diag.cause == "not_oom":
        kopf.event(vsvc, type="Warning", reason="NotMemory",
                   message=f"{diag.subtype or 'not a memory failure'}: "
                           f"{diag.evidence[0][:300] if diag.evidence else ''}; flags left as they are")
    else:
        kopf.event(vsvc, type="Warning", reason="CrashNotHealed", message=remedy.reason[:1000])
    kube.patch_vsvc_status(namespace, name, status)


def _apply_heal(kube: Kube, obj: VLLMService, vsvc: dict, namespace: str, name: str, engine: EngineArgs,
                model: str, memory_limit: str | None, remedy: Remedy, status: dict[str, Any], conditions: list,
                generation: int | None, diag: Diagnosis) -> None:
    new_engine = remedy.apply(engine)
    new_model = remedy.changes.get("model", model)
    new_memory = remedy.changes.get("memory_limit", memory_limit)
    status.update(attempts=obj.status.attempts + 1, healCount=obj.status.heal_count + 1, phase="Healing",
                  effective=new_engine.wire(),
                  conditions=st.set_condition(conditions, st.HEALING, "True", st.camel(diag.cause),
                                              remedy.summary(), generation))
    if obj.spec.heal.mode == "StatusOverrides":  # the spec is never written; deploy from status
        status.update(effectiveModel=new_model if new_model != obj.spec.model else None,
                      effectiveMemoryLimit=new_memory if new_memory != obj.spec.resources.limits.memory else None)
    # Status first: the spec patch below wakes `reconcile`, which must already see this heal.
    latest = kube.patch_vsvc_status(namespace, name, status)  # a PATCH answers with the whole object
    if obj.spec.heal.mode == "PatchSpec":
        spec_patch: dict[str, Any] = {"engine": new_engine.wire()}
        if new_model != obj.spec.model:
            spec_patch["model"] = new_model
        if new_memory != obj.spec.resources.limits.memory:
            spec_patch["resources"] = {"limits": {"memory": new_memory}}
        latest = kube.patch_vsvc(namespace, name, {
            "metadata": {"annotations": {HEALED_ENGINE: json.dumps(new_engine.wire(), sort_keys=True)}},
            "spec": spec_patch})
    healed = VLLMService.model_validate(latest or vsvc)
    for manifest in resources.render(healed, OPERATOR_IMAGE):
        kube.apply(manifest)
