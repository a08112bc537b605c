"""What a pod (or its Deployment) says about its vLLM container and its scheduling. Pure."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from . import resources


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
            return {**previous, "restartCount": _run_of_last_state(cs, previous, restarts)}
    return None


def _run_of_last_state(cs: dict[str, Any], previous: dict[str, Any], restarts: int) -> int:
    """The restartCount of the run in lastState. The kubelet raises the count when it starts the next run, not
    when it moves the dead one to lastState: while it backs off the restart (CrashLoopBackOff) the dead run is
    still the container's latest (its containerID the status's own) and the count is that run's; once the
    next run exists the count is one past it."""
    latest, dead = cs.get("containerID"), previous.get("containerID")
    if latest and dead:
        return restarts if latest == dead else max(restarts - 1, 0)
    # (no ids: a Waiting state with the reason of a restart that failed or waits - CrashLoopBackOff,
    # CreateContainerConfigError, ImagePullBackOff... - leaves the dead run the latest; a newer container shows
    # as Waiting with none, or the kubelet's defaults while it is made)
    reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
    return restarts if reason and reason not in NEWER_CONTAINER_WAITING else max(restarts - 1, 0)


NEWER_CONTAINER_WAITING = frozenset({"ContainerCreating", "PodInitializing"})


# vLLM cannot load a model and answer /health in less; a Ready condition that changed sooner after
# the container started is the pod's initial one, not a transition of this run.
READY_AFTER_START_S = 10.0


def _time(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def finished_at(crash: dict[str, Any]) -> float | None:
    """When the crashed run ended (the kubelet's clock), or None where the pod does not say."""
    return _time(crash.get("finishedAt"))


def ready_before(pod: dict[str, Any], crash: dict[str, Any]) -> bool | None:
    """Had the crashed run answered its readiness probe? The pod's Ready condition flips to False
    when a ready container dies; a run that never became ready leaves it as it was before the run
    started. None when the pod no longer tells (it became ready again since, or times are missing)."""
    started, finished = _time(crash.get("startedAt")), _time(crash.get("finishedAt"))
    ready = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    changed = _time((ready or {}).get("lastTransitionTime"))
    if started is None or finished is None or changed is None or ready is None:
        return None
    if ready.get("status") != "False":
        return None  # ready again (a later run) or not yet updated: this run's readiness is gone
    return started + READY_AFTER_START_S <= changed


def template_hash(pod: dict[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(resources.ENGINE_HASH)


def unschedulable(pod: dict[str, Any]) -> tuple[float, str] | None:
    """(since, the scheduler's message) while the scheduler cannot place the pod."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            since = _time(cond.get("lastTransitionTime"))
            if since is None:
                return None
            return since, str(cond.get("message") or "the scheduler found no node")[:1000]
    return None


def create_refused(dep: dict[str, Any] | None, template: str, service_uid: str | None) -> tuple[float, str] | None:
    """(since, the API server's message) while the service's own Deployment, at the heal's template, cannot
    create its pods: a LimitRange or ResourceQuota refuses them (403), so no pod exists to be Unschedulable;
    the Deployment says ReplicaFailure, reason FailedCreate."""
    meta, spec, status = ((dep or {}).get(k) or {} for k in ("metadata", "spec", "status"))
    ours = any(r.get("uid") == service_uid and r.get("controller") for r in meta.get("ownerReferences") or [])
    annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    if not ours or annotations.get(resources.ENGINE_HASH) != template:
        return None
    if status.get("observedGeneration") != meta.get("generation"):
        return None  # (the controller has not seen this template yet: its conditions are the last one's)
    cond = failed_create(dep)
    since = _time(cond.get("lastTransitionTime")) if cond else None
    return None if cond is None or since is None else (since, str(cond.get("message") or "pods refused")[:1000])


def failed_create(dep: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Deployment's ReplicaFailure condition while its pods cannot be created."""
    for cond in ((dep or {}).get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") == "ReplicaFailure"
            and cond.get("status") == "True"
            and cond.get("reason") == "FailedCreate"
        ):
            return cond
    return None
