"""What a pod says about its vLLM container and its scheduling. Pure."""

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
            return {**previous, "restartCount": max(restarts - 1, 0)}
    return None


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
            try:
                since = datetime.fromisoformat(str(cond.get("lastTransitionTime")).replace("Z", "+00:00")).timestamp()
            except ValueError:
                return None
            return since, str(cond.get("message") or "the scheduler found no node")[:1000]
    return None
