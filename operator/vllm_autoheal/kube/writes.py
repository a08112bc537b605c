"""Writes to a VLLMService that survive conflicts and transient API errors.

A status write is read-modify-write with the object's resourceVersion as a precondition: a
merge patch replaces the conditions list whole, so a write from a stale read would drop another
writer's condition; the API server answers 409 instead and we read again. 409, 5xx and timeouts
are tried again at once, a few times; 429 and anything else is raised. Never with a pause: the
writes run on kopf's worker threads, which every tenant shares, and a tenant that makes its own
object's writes conflict (a script writing it) held them asleep, 3.5 s a write. What still fails
is deferred by the caller (Later, kopf.TemporaryError), off the workers.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from typing import Any

import kopf
import urllib3
from kubernetes.client.rest import ApiException

from .client import MERGE, Kube
from .config import OperatorConfig

RETRYABLE = {409, 429, 500, 502, 503, 504}
# Held weakly: a lock lives while a writer holds it, so the table does not grow with every name a
# tenant ever created (one service created and deleted a million times kept a million locks).
_locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_locks_guard = threading.Lock()


def lock(namespace: str, name: str) -> threading.Lock:
    """One writer per VLLMService in this process (a heal and a reconcile apply the same objects)."""
    key = f"{namespace}/{name}"
    with _locks_guard:
        found = _locks.get(key)
        if found is None:
            found = _locks[key] = threading.Lock()
        return found


def transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in RETRYABLE
    return isinstance(exc, (urllib3.exceptions.HTTPError, TimeoutError, ConnectionError))


def server_says(exc: ApiException) -> str:
    """The API server's refusal in a line, bounded: the message of the Status the client keeps after its reason
    (an invalid field's, an admission policy's naming its rule), else the reason."""
    said = str(exc.reason or "")
    try:
        said = str(json.loads(said.split(": ", 1)[1]).get("message") or said)
    except (IndexError, ValueError, AttributeError):
        pass
    return said[:800]


def retried(cfg: OperatorConfig, fn: Callable[[], Any]) -> Any:
    for attempt in range(cfg.write_attempts):
        try:
            return fn()
        except Exception as exc:
            throttled = isinstance(exc, ApiException) and exc.status == 429  # (asked to wait: the caller defers)
            if throttled or not transient(exc) or attempt == cfg.write_attempts - 1:
                raise
    raise AssertionError("unreachable")


def update_status(
    kube: Kube,
    cfg: OperatorConfig,
    namespace: str,
    name: str,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> dict[str, Any] | None:
    """Read the object, let `change(obj)` say which status fields to write (None or {}: nothing),
    and write them only if the object did not move meanwhile. Returns the object as written (or as
    read, when there was nothing to write; None when it is gone)."""

    def status_patch(fresh: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
        current = fresh.get("status") or {}
        return {"status": {k: replacing(current.get(k), v) for k, v in update.items()}}  # (fields not named stay)

    return _read_modify_write(kube, cfg, namespace, name, change, "/status", status_patch)


def update_object(
    kube: Kube,
    cfg: OperatorConfig,
    namespace: str,
    name: str,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> dict[str, Any] | None:
    """As update_status, for the object itself: `change(obj)` gives the merge patch (metadata,
    spec) to make, decided on the object as it is now; a person's edit that lands between the read
    and the write is not overwritten (409, read again, decide again)."""
    return _read_modify_write(kube, cfg, namespace, name, change, "", lambda fresh, update: update)


def _read_modify_write(
    kube: Kube,
    cfg: OperatorConfig,
    namespace: str,
    name: str,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
    subresource: str,
    patch_of: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
) -> dict[str, Any] | None:
    def once() -> dict[str, Any] | None:
        with lock(namespace, name):
            fresh = kube.get_vsvc(namespace, name)
            if fresh is None:
                return None
            update = change(fresh)
            if not update:
                return fresh
            body = patch_of(fresh, update)
            version = {"resourceVersion": fresh["metadata"].get("resourceVersion")}
            body = {**body, "metadata": {**(body.get("metadata") or {}), **version}}
            return kube.request("PATCH", kube.vsvc_path(namespace, name) + subresource, body, MERGE)

    return retried(cfg, once)


def replacing(old: Any, new: Any) -> Any:
    """The merge patch that makes `new` the whole value of a field now `old`: a merge patch keeps
    every key it leaves out, so a flag missing from a new status.effective (or baseline, or
    inFlight) would stay and be deployed again."""
    if not isinstance(new, dict) or not isinstance(old, dict):
        return new
    return {**{k: None for k in old}, **{k: replacing(old.get(k), v) for k, v in new.items()}}


def event(body: dict[str, Any], type: str, reason: str, message: str) -> None:
    """kopf.event for the plain dicts the operator holds (kopf reads only their metadata)."""
    kopf.event(body, type=type, reason=reason, message=message)  # type: ignore[arg-type]  # kopf annotates Body
