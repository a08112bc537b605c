"""Reconcile a VLLMService into its objects, and follow its Deployment's rollout.

The baseline (the engine args a person wrote) is recorded once; a person's later edit makes a
new baseline and resets the heal state (attempts, tried, HealExhausted). A heal recorded but
not finished (status.inFlight not applied) is finished here first: this is what completes a heal
after an operator restart. A heal recorded while a reconcile runs on the body it read before
(the Deployment exists, so its pods may crash) keeps the heal state it wrote, and its objects are
applied again over the reconcile's. Pre-flight's fitting flags (Fix mode) are where heals start:
they are written with a new baseline, or while no heal has been made, never over a heal.
"""

from __future__ import annotations

from typing import Any, NoReturn

import kopf
from kubernetes.client.rest import ApiException

from .. import metrics, model_source
from ..api import VLLMService
from ..gpu_catalog import lookup
from ..preflight import preflight
from . import heal, resources
from . import status as st
from .client import Kube
from .config import OperatorConfig
from .ownership import controlled_by
from .writes import event, lock, server_says, transient, update_status

# What a heal writes into status; a reconcile that read the object before a heal leaves it alone.
HEAL_STATE = frozenset(
    {
        "baseline",
        "baselineFor",
        "effective",
        "effectiveModel",
        "effectiveMemoryLimit",
        "gpus",
        "attempts",
        "tried",
        "inFlight",
    }
)


def _with_status(obj: VLLMService, status: dict[str, Any]) -> VLLMService:
    merged = {**obj.status.wire(), **status}
    return obj.model_copy(update={"status": type(obj.status).model_validate(merged)})


def memory_fit(
    kube: Kube, obj: VLLMService, generation: int | None, conditions: list, new: dict, may_fix: bool = True
) -> dict | None:
    """Pre-flight's MemoryFit condition (and, in Fix mode, fitting flags in `new`). Without `may_fix`
    (the chart's heal.enabled=false: report only, cluster-wide) Fix only reports, as Warn does."""
    spec = obj.spec
    held_back = spec.preflight == "Fix" and not may_fix
    if spec.preflight == "Off":
        return None
    if not (spec.resources.gpu_product or spec.resources.gpu_memory_gib):
        cond = st.set_condition(
            conditions,
            st.MEMORY_FIT,
            "Unknown",
            "NoGpuProduct",
            "set resources.gpuProduct or resources.gpuMemoryGiB to check memory before start",
            generation,
        )
        return next(c for c in cond if c["type"] == st.MEMORY_FIT)
    model = model_source.for_service(obj, kube.get)
    if not model.ok:
        cond = st.set_condition(
            conditions,
            st.MEMORY_FIT,
            "Unknown",
            "ModelConfigPending" if model.pending else "ModelConfigUnavailable",
            f"no model config, so no pre-flight: {model.error}",
            generation,
        )
        return next(c for c in cond if c["type"] == st.MEMORY_FIT)
    try:
        gpu = lookup(spec.resources.gpu_product or "custom", spec.resources.gpu_memory_gib)
        result = preflight(spec.model_copy(update={"preflight": "Warn"}) if held_back else spec, gpu, model.shape)
    except Exception as exc:  # noqa: BLE001 - whatever the spec holds, pre-flight costs a condition, never the reconcile
        cond = st.set_condition(
            conditions,
            st.MEMORY_FIT,
            "Unknown",
            "PreflightFailed",
            f"{type(exc).__name__}: {str(exc)[:500]}",
            generation,
        )
    else:
        est = result.estimate
        if result.fits and result.changed:
            new["effective"] = result.engine.wire()
            msg = f"fitted at start: {' '.join(s.flags() for s in result.steps)}; KV {est.kv_cache_gib:.2f} GiB"
            cond = st.set_condition(conditions, st.MEMORY_FIT, "True", "FittedByPreflight", msg, generation)
        elif result.unweighed:
            msg = "; ".join(result.reasons)
            cond = st.set_condition(conditions, st.MEMORY_FIT, "Unknown", "NotWeighed", msg, generation)
        elif result.fits:
            msg = (
                f"KV cache {est.kv_cache_gib:.2f} GiB = {est.kv_tokens:,} tokens; weights {est.weights_gib:.2f} GiB/GPU"
            )
            cond = st.set_condition(conditions, st.MEMORY_FIT, "True", "Fits", msg, generation)
        else:
            cond = st.set_condition(
                conditions,
                st.MEMORY_FIT,
                "False",
                st.camel(est.failure or "DoesNotFit"),
                "; ".join(result.reasons)
                + ("; not fitted: the operator only reports (heal.enabled=false)" if held_back else ""),
                generation,
            )
    return next(c for c in cond if c["type"] == st.MEMORY_FIT)


def _healed_since(read: VLLMService, fresh: dict[str, Any]) -> bool:
    """Did a heal write its state after `read` was read? Every heal and every revert of a blocked
    heal writes a new status.inFlight (a revert that finds nothing left to try moves no counter),
    and a heal also moves healCount (its inFlight may be cleared again by a rollout meanwhile).
    A cleared inFlight alone (a rollout, a dropped heal, a crash that gave up) changes no flags."""
    now = heal.parse(fresh).status
    return now.heal_count != read.status.heal_count or (
        now.in_flight is not None and now.in_flight != read.status.in_flight
    )


def reconcile(kube: Kube, cfg: OperatorConfig, body: dict[str, Any], logger: kopf.Logger) -> None:
    obj = heal.parse(body)
    meta = obj.metadata
    ns, name, generation = str(meta.get("namespace")), str(meta.get("name")), meta.get("generation")
    edit = heal.person_edited(obj)
    intent = obj.status.in_flight
    if intent is not None and not intent.applied and not edit:
        if heal.complete(kube, cfg, None, ns, name, logger) == "deferred":
            raise kopf.TemporaryError("the recorded heal is not finished yet", delay=cfg.retry_delay_s)
        fresh = kube.get_vsvc(ns, name)
        if fresh is None:
            return
        obj = heal.parse(fresh)
        generation = obj.metadata.get("generation")
    new: dict[str, Any] = {}
    if obj.status.baseline is None or edit:
        new.update(
            baseline=obj.spec.engine.wire(),
            baselineFor=resources.sized_for(obj),
            effective=None,
            effectiveModel=None,
            effectiveMemoryLimit=None,
            attempts=0,
            tried=[],
            inFlight=None,
        )
        if edit:
            logger.info("the spec was changed by a person: new baseline, heal attempts reset")
    elif obj.status.baseline_for is None:  # a baseline of an older version: what it was taken with is now
        new["baselineFor"] = resources.sized_for(obj)
    current = [c.wire() for c in obj.status.conditions]
    fitted: dict[str, Any] = {}
    fit = memory_fit(kube, _with_status(obj, new), generation, current, fitted, may_fix=cfg.heal_enabled)
    if "baseline" in new or heal.unhealed_since_baseline(obj):
        new.update(fitted)  # pre-flight's flags are where heals start, never over a heal's
    target = _with_status(obj, new)
    if refused := resources.overrides_refused(target):
        logger.warning(f"status overrides not deployed, the spec is: {refused}")
    _model, engine, _memory = resources.effective(target)
    try:  # under the object's lock, one writer at a time; a heal's apply runs apart: re-applied below if it landed
        with lock(ns, name):
            applied = kube.apply_all(resources.render(target, cfg.operator_image))
            for manifest, outcome in applied.outcomes:
                if outcome != "unchanged":
                    logger.info(f"{manifest['kind']} {manifest['metadata']['name']} {outcome}")
    except Exception as exc:
        if transient(exc):
            raise kopf.TemporaryError(f"applying the objects failed: {exc}", delay=cfg.retry_delay_s) from exc
        if isinstance(exc, ApiException) and exc.status in REFUSED:
            _refused(kube, cfg, body, ns, name, generation, exc)  # (raises kopf's PermanentError)
        raise
    if applied.conflicts:  # someone else's object has the name: write nothing, say so, look again later
        _name_conflict(kube, cfg, body, ns, name, generation, applied.conflicts)
    fields = {
        **new,
        "observedGeneration": generation,
        "gpus": resources.gpu_count(target),
        "endpoint": resources.endpoint(obj),
        "effective": engine.wire(),
    }

    healed_since: list[bool] = []

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        status = fresh.get("status") or {}
        in_flight = None if edit else status.get("inFlight")
        own = fields
        if not edit and _healed_since(obj, fresh):
            # A crash was healed (or a blocked heal reverted) since the body was read (the Deployment
            # existed before this write): the heal state it wrote stands; this copy of it is stale.
            own = {k: v for k, v in fields.items() if k not in HEAL_STATE}
            healed_since.append(True)
        out = st.settle(
            own,
            st.Observed(
                status.get("conditions", []), generation, in_flight=in_flight, memory_fit=fit, person_edit=edit
            ),
        )
        return None if st.unchanged(out, status) else out

    written = update_status(kube, cfg, ns, name, change)
    if written is not None:
        metrics.set_phase(f"{ns}/{name}", (written.get("status") or {}).get("phase"))
    if (
        healed_since and heal.complete(kube, cfg, None, ns, name, logger) == "deferred"
    ):  # objects applied above may be stale
        raise kopf.TemporaryError("a heal landed during this reconcile; applying it again", delay=cfg.retry_delay_s)
    if fit is not None and fit["reason"] == "ModelConfigPending":  # a slow Hub: check again when it answered
        raise kopf.TemporaryError("the model config is still being fetched", delay=2 * model_source.timeout_s())


# The API server refused an object as rendered (a node selector key the CRD admits but a pod may not
# carry, say): the same spec is refused again, so it waits for the next edit, said in status.
REFUSED = frozenset({400, 422})


def _refused(
    kube: Kube, cfg: OperatorConfig, body: dict[str, Any], ns: str, name: str, generation: int | None, exc: ApiException
) -> NoReturn:
    message = f"the API server refused the objects rendered from this spec (HTTP {exc.status}): {server_says(exc)}"

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        current = (fresh.get("status") or {}).get("conditions", [])
        conditions = st.set_condition(current, st.READY, "False", "ObjectsRefused", message, generation)
        return None if conditions == current else {"conditions": conditions, "observedGeneration": generation}

    written = update_status(kube, cfg, ns, name, change)
    if written is not None:
        event(body, type="Warning", reason="ObjectsRefused", message=message)
    raise kopf.PermanentError(message)


def _name_conflict(
    kube: Kube,
    cfg: OperatorConfig,
    body: dict[str, Any],
    ns: str,
    name: str,
    generation: int | None,
    conflicts: list[str],
) -> None:
    message = (
        f"{', '.join(conflicts)} already exists and is not controlled by this VLLMService; nothing was "
        "written. Rename the VLLMService or remove that object."
    )

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        current = (fresh.get("status") or {}).get("conditions", [])
        conditions = st.set_condition(current, st.READY, "False", "NameConflict", message, generation)
        return None if conditions == current else {"conditions": conditions}  # once per conflict

    before = (kube.get_vsvc(ns, name) or {}).get("status", {}).get("conditions", [])
    update_status(kube, cfg, ns, name, change)
    if not any(c.get("reason") == "NameConflict" for c in before):
        event(body, type="Warning", reason="NameConflict", message=message)
    raise kopf.TemporaryError(message, delay=60)


def rollout_done(dep: dict[str, Any]) -> tuple[bool, str]:
    """(all replicas of the current template available, "have/want")."""
    want = (dep.get("spec") or {}).get("replicas", 1)
    status = dep.get("status") or {}
    have = status.get("availableReplicas") or 0
    updated = status.get("updatedReplicas")
    observed = status.get("observedGeneration")
    current = observed is None or observed >= (dep.get("metadata") or {}).get("generation", 0)
    ready = want > 0 and have >= want and current and (updated is None or updated >= want)
    return ready, f"{have}/{want}"


def deployment_progress(kube: Kube, cfg: OperatorConfig, ns: str, name: str, dep: dict[str, Any]) -> None:
    ready, replicas = rollout_done(dep)
    template = (
        ((dep.get("spec") or {}).get("template") or {})
        .get("metadata", {})
        .get("annotations", {})
        .get(resources.ENGINE_HASH)
    )

    def change(fresh_body: dict[str, Any]) -> dict[str, Any] | None:
        if not controlled_by(dep, fresh_body) or dep.get("metadata", {}).get("name") != name:
            # (a Deployment that wears the service's labels, or copies its ownerReference, whose uid the API server
            # checks not: only the one named after the service, which the operator applies, is its rollout)
            return None
        fresh = heal.parse(fresh_body)
        status = fresh_body.get("status") or {}
        intent = fresh.status.in_flight
        in_flight = intent.wire() if intent is not None else None
        update: dict[str, Any] = {}
        blocked = None
        if ready and intent is not None and intent.applied and template == heal.fp(intent.target):
            in_flight, blocked = None, ""  # the heal rolled out: serving with it
            update["inFlight"] = None
        elif ready:
            blocked = ""
        out = st.settle(
            update,
            st.Observed(
                status.get("conditions", []),
                fresh.metadata.get("generation"),
                in_flight=in_flight,
                ready=ready,
                replicas=replicas,
                blocked=blocked,
            ),
        )
        return None if st.unchanged(out, status) else out

    written = update_status(kube, cfg, ns, name, change)
    if written is not None:
        metrics.set_phase(f"{ns}/{name}", (written.get("status") or {}).get("phase"))
