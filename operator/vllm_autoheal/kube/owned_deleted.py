"""An object of a VLLMService (its Deployment, Service or model-cache PVC) deleted while the service stays,
by a person or another tool: the service is rendered and applied again, as an edit of the spec would.

Deletions come in bursts (`kubectl delete -l ...`, a namespace cleanup, a tenant's labelled decoys): each is
noted, and one re-apply a service runs once the burst settles, off kopf's shared workers, with its retries
under the same key. Not where the service is gone or going (the garbage collector deletes its objects after
it; a namespace being deleted refuses the re-create), nor for objects it did not control."""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from . import reconcile
from .client import Kube, controller_uid
from .config import OperatorConfig
from .later import Later
from .writes import transient

SETTLE_S = 0.5  # a burst of deletions is one re-apply
# The controllers the deleted objects named since the last re-apply, per service: a few are kept; past
# them the re-apply runs for whichever service is there (its cost is one reconcile a burst all the same).
CONTROLLERS_KEPT = 8
ANY = "*"
_named: dict[str, set[str]] = {}
_named_guard = threading.Lock()


def _key(ns: str, name: str) -> str:
    return f"{ns}/{name}/owned-deleted"


def owned_object_deleted(
    kube: Kube, cfg: OperatorConfig, later: Later, ns: str, name: str, gone: dict[str, Any], logger: kopf.Logger
) -> None:
    """Note a deleted object of service `name` in `ns`; its re-apply runs SETTLE_S after the last one."""
    uid = controller_uid(gone)
    if not uid:
        return
    kind = str(gone.get("kind") or "object")[:64]
    _note(_key(ns, name), {str(uid)})
    later.run(_key(ns, name), SETTLE_S, functools.partial(_reapply, kube, cfg, later, ns, name, kind, logger, 1))


def _note(key: str, uids: set[str]) -> None:
    with _named_guard:
        kept = _named.setdefault(key, set())
        for uid in uids:
            kept.add(uid if len(kept) < CONTROLLERS_KEPT or uid in kept else ANY)


def _reapply(
    kube: Kube, cfg: OperatorConfig, later: Later, ns: str, name: str, kind: str, logger: kopf.Logger, attempt: int
) -> None:
    with _named_guard:
        named = _named.pop(_key(ns, name), set())
    try:
        body = kube.get_vsvc(ns, name)
        meta = (body or {}).get("metadata") or {}
        if body is None or meta.get("deletionTimestamp"):
            return
        if meta.get("uid") not in named and ANY not in named:
            return
        if attempt == 1:
            logger.warning(f"the {kind} of {name} was deleted while the VLLMService stays: applying it again")
        reconcile.reconcile(kube, cfg, body, logger)
    except Exception as exc:
        if _namespace_going(exc):
            logger.info(f"the namespace of {name} is being deleted: nothing is applied again")
            return
        if not isinstance(exc, kopf.TemporaryError) and not transient(exc):
            raise
        if attempt < cfg.write_attempts:
            _note(_key(ns, name), named)  # (a deletion meanwhile joins this retry; a newer one restarts it)
            again = functools.partial(_reapply, kube, cfg, later, ns, name, kind, logger, attempt + 1)
            later.run(_key(ns, name), cfg.retry_delay_s, again)
        else:
            logger.warning(f"the {kind} of {name} is not applied yet ({exc}): the next reconcile applies it")


def _namespace_going(exc: BaseException) -> bool:
    """The API server refuses new objects in a namespace being deleted (403, NamespaceTerminating)."""
    if not isinstance(exc, ApiException) or exc.status != 403:
        return False
    try:
        status = json.loads(str(exc.reason).split(": ", 1)[1])
        causes = (status.get("details") or {}).get("causes") or []
    except (IndexError, ValueError, AttributeError):
        return False
    return any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes)
