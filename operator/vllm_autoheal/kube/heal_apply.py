"""Finishing a recorded heal (status.inFlight): in PatchSpec mode the spec patch, decided on the
object as it is at the write (a person's edit that lands first wins), then the in-flight mark and
the rollout. Idempotent: a deferred retry, the next start's reconcile and the next event may each
call `complete`.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, Literal

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from ..api import GROUP, Deployed, HealIntent, HealRecord, VLLMService
from ..remedy_gate import fingerprint
from . import heal_events, resources
from . import status as st
from .client import Kube
from .config import OperatorConfig
from .later import Later
from .writes import event, lock, replacing, server_says, transient, update_object, update_status

REVERT = "RevertUnschedulable"  # the operator's own action: an unschedulable heal taken back
HEALED_ENGINE = f"{GROUP}/healed-engine"  # engine args the operator wrote into spec (PatchSpec)
# What the operator's last spec patch wrote (PatchSpec), whole: which crash's heal, and a digest of the model,
# engine args, memory limit and GPU it left the spec at. A spec that differs from it is a person's.
HEALED_SPEC = f"{GROUP}/healed-spec"


def parse(body: dict[str, Any]) -> VLLMService:
    try:
        return VLLMService.model_validate(dict(body))
    except ValidationError as exc:  # the CRD schema should have stopped it; say what is wrong
        raise kopf.PermanentError(f"invalid VLLMService: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None


def deployed(obj: VLLMService) -> Deployed:
    model, engine, memory = resources.effective(obj)
    return Deployed(engine=engine, model=model, memory_limit=memory)


def in_spec(obj: VLLMService) -> Deployed:
    return Deployed(engine=obj.spec.engine, model=obj.spec.model, memory_limit=obj.spec.resources.limits.memory)


def fp(d: Deployed) -> str:
    return fingerprint(d.model, d.engine, d.memory_limit)


def spec_digest(obj: VLLMService, d: Deployed) -> str:
    """What HEALED_SPEC compares: `d` (model, engine args, memory limit) with the spec's GPU (resources.sized_for's
    other facts)."""
    gpu = [obj.spec.resources.gpu_product, obj.spec.resources.gpu_memory_gib]
    return hashlib.sha256(json.dumps([fp(d), gpu]).encode()).hexdigest()[:16]


def healed_spec(obj: VLLMService) -> tuple[str, str] | None:
    """(the heal the operator's last spec patch wrote (heal_key), the digest it left the spec at), or None."""
    crash, _, digest = str((obj.metadata.get("annotations") or {}).get(HEALED_SPEC) or "").rpartition("@")
    return (crash, digest) if crash and digest else None


def spec_patch(
    obj: VLLMService, target: Deployed, written_engine: dict[str, Any], heal: str | None = None
) -> dict[str, Any]:
    """PatchSpec: the engine args, and with them what must follow (model, memory limit, GPU count).
    The engine is replaced whole: a flag the target leaves unset is removed from `written_engine`
    (the spec's engine as stored), where a plain merge patch would keep it (a revert to flags
    without a max_model_len kept the one the reverted heal set)."""
    spec: dict[str, Any] = {"engine": replacing(written_engine, target.engine.wire())}
    if target.model != obj.spec.model:
        spec["model"] = target.model
    res: dict[str, Any] = {}
    if target.memory_limit != obj.spec.resources.limits.memory:
        res["limits"] = {"memory": target.memory_limit}
    if obj.spec.resources.gpus is not None and obj.spec.resources.gpus != target.gpus():
        res["gpus"] = target.gpus()  # the CRD requires resources.gpus == TP x PP
    if res:
        spec["resources"] = res
    annotations = {HEALED_ENGINE: json.dumps(target.engine.wire(), sort_keys=True)}
    if heal is not None:
        annotations[HEALED_SPEC] = f"{heal}@{spec_digest(obj, target)}"
    return {"metadata": {"annotations": annotations}, "spec": spec}


def _heal_lock(ns: str, name: str):  # one completion at a time per object (writes take their own lock)
    return lock(f"heal:{ns}", name)


Completion = Literal["done", "deferred", "dropped"]
# What the API server answers a spec patch it will never take (a field invalid, an admission policy's or
# webhook's denial, the operator's own grant missing): the same patch is refused again.
SPEC_PATCH_REFUSED = frozenset({400, 403, 422})


def complete(
    kube: Kube,
    cfg: OperatorConfig,
    later: Later | None,
    ns: str,
    name: str,
    logger: kopf.Logger,
) -> Completion:
    """Finish the recorded heal, whatever was already done of it; idempotent. "deferred" on a transient
    API error: then it tries again later (without `later`, the caller retries: reconcile raises
    kopf.TemporaryError); "dropped" where the heal was refused (its spec patch, or a heal status holds that
    the spec's policy does not allow, or a person's edit that landed first). The next event and the next start
    also call it. The call whose status mark lands posts the PatchSpec heal's 'Healed' Event."""
    try:
        with _heal_lock(ns, name):
            return _complete(kube, cfg, ns, name, logger)
    except Exception as exc:
        if not transient(exc):
            raise
        logger.warning(f"the heal of {ns}/{name} is recorded but not finished ({exc}); will finish it")
        if later is not None:
            later.run(f"complete/{ns}/{name}", cfg.retry_delay_s, lambda: complete(kube, cfg, later, ns, name, logger))
        return "deferred"


def _complete(kube: Kube, cfg: OperatorConfig, ns: str, name: str, logger: kopf.Logger) -> Completion:
    vsvc = kube.get_vsvc(ns, name)
    if vsvc is None:
        return "done"
    obj = parse(vsvc)
    intent = obj.status.in_flight
    if intent is None:
        return "done"
    if not intent.applied:
        refused = _in_flight_refused(obj, intent)
        if refused is None and obj.spec.heal.mode == "PatchSpec":
            try:
                written = update_object(kube, cfg, ns, name, lambda fresh: _spec_change(fresh, intent))
            except ApiException as exc:
                if exc.status not in SPEC_PATCH_REFUSED:
                    raise
                refused = f"the API server refused its spec patch (HTTP {exc.status}): {server_says(exc)}"
            else:
                if written is None:
                    return "done"
                vsvc = written
                if fp(in_spec(parse(vsvc))) != fp(intent.target):  # a person changed the spec meanwhile: it wins
                    logger.info("the spec changed before the heal was applied; the heal is dropped")
                    update_status(kube, cfg, ns, name, lambda fresh: _drop(fresh, intent))
                    return "dropped"
        if refused is not None:  # (status is no proof of who wrote it: only the operator's own heals pass)
            logger.warning(f"the heal recorded for {ns}/{name} is dropped: {refused}")
            if update_status(kube, cfg, ns, name, lambda fresh: _drop(fresh, intent, refused=True)) is not None:
                message = f"The heal in flight is dropped: {refused}"[:1000]
                event(vsvc, type="Warning", reason="HealRefused", message=message)
            return "dropped"
        marked: list[bool] = []
        token = uuid.uuid4().hex[:16]
        vsvc = update_status(kube, cfg, ns, name, lambda fresh: _mark_applied(fresh, intent, marked, token)) or vsvc
        if marked and intent.action != REVERT:  # (made now, whatever becomes of the rollout below)
            if heal_events.allowed(vsvc, "Healed"):  # (the crash Events' budgets)
                event(vsvc, type="Normal", reason="Healed", message=intent.summary[:1000])
    healed = parse(vsvc)
    if healed.status.in_flight is not None and fp(deployed(healed)) == fp(healed.status.in_flight.target):
        kube.apply_all(resources.render(healed, cfg.operator_image))  # (a name conflict is reconcile's to report)
    return "done"


IN_FLIGHT_FIELDS = (
    "status.inFlight.target.model",
    "status.inFlight.target.engine",
    "status.inFlight.target.memoryLimit",
)


def _in_flight_refused(obj: VLLMService, intent: HealIntent) -> str | None:
    """Why a heal recorded in status is past the spec's policy (resources.past_policy), or leaves out the memory
    limit the spec sets (PatchSpec would write that absence over it: no limit at all); None for the heals the
    planner makes."""
    if intent.target.memory_limit is None and obj.spec.resources.limits.memory is not None:
        return f"{IN_FLIGHT_FIELDS[2]} is unset where the spec sets a memory limit"
    return resources.past_policy(obj.spec, intent.target, IN_FLIGHT_FIELDS)


def _spec_change(fresh_body: dict[str, Any], intent: HealIntent) -> dict[str, Any] | None:
    """The heal's spec patch, where what runs is still what the heal was planned from and the
    status still holds the heal, unapplied; None where the spec holds the heal already, or a person's
    edit (which wins), or the heal was dropped meanwhile (a person's edit, then its revert: the 409
    retry reads the reverted spec, and a check of the spec alone wrote the dropped heal)."""
    fresh = parse(fresh_body)
    # (what runs, not the spec: under pre-flight Fix the spec is the person's and what runs its fitted flags, the
    # heal's previous; a person's edit moves what runs off them, or the GPU from under them)
    if fp(deployed(fresh)) != fp(intent.previous) or not _same(fresh, intent) or resized_by_person(fresh):
        return None
    if fresh.status.in_flight is not None and fresh.status.in_flight.applied:
        return None
    if spec_patched(fresh, intent):
        return None  # (its patch is in, and the spec back at the flags it healed from: a person's revert)
    return spec_patch(fresh, intent.target, (fresh_body.get("spec") or {}).get("engine") or {}, heal_key(intent))


def resized_by_person(obj: VLLMService) -> bool:
    """Has a person changed what the flags are sized for (model, memory limit, GPU: resources.sized_for) since the
    baseline? In PatchSpec mode heals write the model and memory limit too: a spec where the operator's last patch
    left it is none of a person's."""
    if obj.status.baseline_for in (None, resources.sized_for(obj)):
        return False
    written = healed_spec(obj)
    if written is None:  # (the heals of versions before healed-spec: their engine annotation, where it still holds)
        ours = (obj.metadata.get("annotations") or {}).get(HEALED_ENGINE)
        return ours != json.dumps(obj.spec.engine.wire(), sort_keys=True)
    return written[1] != spec_digest(obj, in_spec(obj))


def spec_patched(obj: VLLMService, intent: HealIntent) -> bool:
    """Has this heal's own spec patch landed (whatever the spec holds now)?"""
    written = healed_spec(obj)
    return written is not None and written[0] == heal_key(intent)


def heal_key(intent: HealIntent) -> str:
    """One heal: its crash, when it was recorded and where it goes (an unschedulable heal's revert shares its crash
    and may share its second)."""
    return f"{intent.crash}#{intent.time}#{fp(intent.previous)}>{fp(intent.target)}"


def _same(fresh: VLLMService, intent: HealIntent) -> bool:
    cur = fresh.status.in_flight
    return cur is not None and cur.crash == intent.crash and fp(cur.target) == fp(intent.target)


def _mark_applied(
    fresh_body: dict[str, Any], intent: HealIntent, marked: list[bool], token: str
) -> dict[str, Any] | None:
    """Mark the heal applied, signed with this completion's token; `marked` says whether this completion's mark is
    the one that landed (a try refused with 409 is tried again; one whose answer was lost finds its own token)."""
    marked.clear()
    fresh = parse(fresh_body)
    cur = fresh.status.in_flight
    if cur is None or not _same(fresh, intent):
        return None
    if cur.applied:
        if cur.marked_by == token:  # (this completion's own write, whose answer was lost)
            marked.append(True)
        return None
    marked.append(True)
    in_flight = {**intent.wire(), "applied": True, "markedBy": token}
    return st.settle(
        {"inFlight": in_flight, "effective": intent.target.engine.wire(), "gpus": intent.target.gpus()},
        st.Observed([c.wire() for c in fresh.status.conditions], fresh.metadata.get("generation"), in_flight=in_flight),
    )


def _drop(fresh_body: dict[str, Any], intent: HealIntent, refused: bool = False) -> dict[str, Any] | None:
    """Clear the heal in flight. `refused`: nothing of it was made (its spec patch or its policy refused it), so
    its record says so and its attempt and count are given back (it starts no backoff, spends no budget); its
    action stays in `tried`, so the same refused change is not planned again."""
    fresh = parse(fresh_body)
    if not _same(fresh, intent):
        return None
    update: dict[str, Any] = {"inFlight": None}
    mine = [i for i, h in enumerate(fresh.status.heals) if _records(h, intent)] if refused else []
    if mine:
        heals = [h.wire() for h in fresh.status.heals]
        heals[mine[-1]] = {**heals[mine[-1]], "refused": True}
        update["heals"] = heals
        if intent.action != REVERT:  # (a revert to the flags that scheduled took no attempt to give back)
            update.update(attempts=max(fresh.status.attempts - 1, 0), healCount=max(fresh.status.heal_count - 1, 0))
    return st.settle(update, st.Observed([c.wire() for c in fresh.status.conditions], fresh.metadata.get("generation")))


def _records(heal: HealRecord, intent: HealIntent) -> bool:
    """Is `heal` the record of the heal in flight (its crash and action, not refused yet)? An unschedulable heal's
    revert is recorded under no crash of its own (its intent keeps the crash it reverts)."""
    crash = st.crash_id(heal.pod_uid or heal.pod, heal.container, heal.restart_count)
    ours = crash == intent.crash or (heal.unschedulable is True and not heal.pod_uid)
    return ours and heal.action == intent.action and not heal.refused
