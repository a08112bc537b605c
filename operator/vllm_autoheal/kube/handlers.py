"""kopf glue: register the handlers and translate kopf's arguments; the work is elsewhere.

reconcile.py renders a VLLMService into its objects and follows the rollout; heal.py heals a
crash (an Incident); unschedulable.py handles heals whose pods cannot be scheduled; status.py
computes the phase and conditions. The settings come from the CLI in kopf's memo (OperatorConfig).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from .. import metrics
from ..api import GROUP, PLURAL, VERSION
from . import heal, owned_deleted, ownership, pods, reconcile, resources, unschedulable
from .client import Kube
from .config import OperatorConfig
from .diffbase import DigestedDiffBaseStorage
from .later import Later


def _config(memo: kopf.Memo) -> OperatorConfig:
    return memo.get("config") or OperatorConfig()


def _kube(memo: kopf.Memo) -> Kube:
    return Kube(timeout=_config(memo).request_timeout_s)


def _later(memo: kopf.Memo) -> Later:
    return memo.setdefault("later", Later())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's default keeps progress under status.<handler>, which the real API server prunes
    # (our status schema is closed): keep all of kopf's bookkeeping in annotations instead.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    # (its large values as digests: the API server takes 256 KiB of annotations per object, see diffbase.py)
    settings.persistence.diffbase_storage = DigestedDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8
    # The API server sends only the objects the operator watches for (kopf's `labels=` filters are its
    # own, after every Service, PVC, Deployment and pod of the cluster reached it).
    for group, version, plural in (
        ("apps", "v1", "deployments"),
        ("", "v1", "services"),
        ("", "v1", "persistentvolumeclaims"),
    ):
        settings.watching.label_selectors[group, version, plural] = f"{resources.MANAGED_BY}={resources.MANAGER}"
    settings.watching.label_selectors["", "v1", "pods"] = resources.SERVICE_LABEL
    memo.setdefault("config", OperatorConfig())
    memo["later"] = Later()


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    _later(memo).stop()


def _changes_what_reconcile_reads(old: Any, new: Any, **_: Any) -> bool:
    """Whether an update changes what a reconcile reads: all of kopf's essence of a VLLMService but its
    metadata (labels, and annotations: kopf's essence holds none of the operator's group, whose own and
    the deprecated model config's are read at the next reconcile). Another tool's annotation alone (a GitOps
    sync stamp on every sync) renders nothing: it costs kopf's one PATCH of its record, no reads."""

    def read(essence: Any) -> Any:
        return {k: v for k, v in essence.items() if k != "metadata"} if isinstance(essence, dict) else essence

    return read(old) != read(new)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, when=_changes_what_reconcile_reads)
def reconcile_service(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    reconcile.reconcile(_kube(memo), _config(memo), dict(body), logger)


# (kopf runs no delete handler for an object it put no finalizer on, which an optional one does not ask
# for: a plain delete shows only as this DELETED event)
@kopf.on.event(GROUP, VERSION, PLURAL)
def forget(type: str, meta: kopf.Meta, **_: Any) -> None:
    if type == "DELETED":
        metrics.set_phase(f"{meta.get('namespace')}/{meta.get('name')}", None)


@kopf.on.event("apps", "v1", "deployments", labels={resources.MANAGED_BY: resources.MANAGER})
def deployment_progress(
    body: kopf.Body, type: str, namespace: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    name = (body.get("metadata", {}).get("labels") or {}).get(resources.SERVICE_LABEL)
    if type == "DELETED":
        _gone(body, namespace, memo, logger)
    elif name and namespace:
        reconcile.deployment_progress(_kube(memo), _config(memo), namespace, name, dict(body))
        if pods.failed_create(dict(body)) is not None:  # (pods the API server refused: no pod event comes)
            unschedulable.check(_kube(memo), _config(memo), _later(memo), namespace, name, logger, fresh=True)


# A VLLMService's Service and model-cache PVC deleted by hand: applied again once the burst of deletions
# settles (kube/owned_deleted.py; nothing else would: the operator has no periodic resync, so the endpoint
# stayed gone until the next edit).
@kopf.on.event("", "v1", "services", labels={resources.MANAGED_BY: resources.MANAGER})
@kopf.on.event("", "v1", "persistentvolumeclaims", labels={resources.MANAGED_BY: resources.MANAGER})
def owned_object_gone(
    body: kopf.Body, type: str, namespace: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    if type == "DELETED":
        _gone(body, namespace, memo, logger)


def _gone(body: kopf.Body, namespace: str | None, memo: kopf.Memo, logger: kopf.Logger) -> None:
    name = (body.get("metadata", {}).get("labels") or {}).get(resources.SERVICE_LABEL)
    if name and namespace:
        owned_deleted.owned_object_deleted(
            _kube(memo), _config(memo), _later(memo), namespace, name, dict(body), logger
        )


@kopf.on.event("", "v1", "pods", labels={resources.SERVICE_LABEL: kopf.PRESENT})
def pod_changed(
    body: kopf.Body, type: str, namespace: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    pod = dict(body)
    name = pod["metadata"]["labels"][resources.SERVICE_LABEL]
    if type == "DELETED" or not namespace or not name:  # (a label's value may be empty)
        return
    kube, cfg, later = _kube(memo), _config(memo), _later(memo)
    crash = pods.find_crash(pod)
    if crash is not None:  # (a pod not run by the service's Deployment: a copy of its template, a decoy)
        owned = lambda: ownership.run_by_service(kube, namespace, name, pod)  # noqa: E731
        heal.handle_crash(kube, cfg, later, heal.Incident(namespace, name, pod, crash), logger, owned)
    elif pods.unschedulable(pod) is not None:
        unschedulable.check(kube, cfg, later, namespace, name, logger, pod)
