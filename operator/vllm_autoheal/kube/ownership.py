"""Whether a pod is one the VLLMService's own Deployment runs, before its crash may change the service.

A pod carries the service's label and engine hash wherever its spec was copied from: `kubectl debug
--copy-to`, a pod written from the Deployment's template, or one made to look like it by anyone who may
create pods in the namespace (a grant apart from editing VLLMServices). Only a pod whose controller is a
ReplicaSet (by uid) whose controller is the service's Deployment, controlled by the service itself, is
the service's. (An ownerReference a pod's author forges to that ReplicaSet's uid passes: the ReplicaSet
controller then counts that pod among its replicas and removes the surplus.)

A chain once seen is remembered by the ReplicaSet's uid, so a crash-looping pod's events cost no more than
the service's own read; at most REMEMBERED chains, the oldest forgotten first. What is remembered is the
service's uid as well as its name: a service deleted with `--cascade=orphan` and made again under its name
does not inherit the old Deployment's pods.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any, Protocol

from ..api import KIND

REMEMBERED = 4096

# (namespace, ReplicaSet uid) -> (name, uid) of the VLLMService whose Deployment controls that ReplicaSet
# (("", "") where the chain ends at none: a uid forged onto decoys costs one read, not one each look; a
# uid is never reused)
_chains: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()
NONE = ("", "")
_guard = threading.Lock()  # (kopf's workers share it)


class Reader(Protocol):
    def get(self, path: str) -> dict[str, Any] | None: ...

    def get_vsvc(self, namespace: str, name: str) -> dict[str, Any] | None: ...


# An object's name: the API server checks no more of an ownerReference's name than that it is set, and
# the name goes into the path the chain is read by ("../../secrets/x" would read elsewhere).
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def controller(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The object's controlling ownerReference, where it is of this kind and names an object."""
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if isinstance(r, dict) and r.get("controller") is True), None)
    if ref is None or ref.get("kind") != kind or not ref.get("uid"):
        return None
    return ref if isinstance(ref.get("name"), str) and NAME.fullmatch(ref["name"]) else None


def controlled_by(obj: dict[str, Any] | None, service: dict[str, Any] | None) -> bool:
    """The object's controller is this VLLMService, by uid (its labels are anyone's to copy)."""
    ref = controller(obj, KIND)
    return ref is not None and bool(_uid(service)) and ref["uid"] == _uid(service)


def _uid(obj: dict[str, Any] | None) -> Any:
    return ((obj or {}).get("metadata") or {}).get("uid")


def run_by_service(
    kube: Reader, namespace: str, service: str, pod: dict[str, Any], service_uid: str | None = None
) -> bool:
    """The pod's controller chain ends at the VLLMService `service` (ReplicaSet, Deployment, service) as it
    is now: `service_uid` where the caller has just read it, else the service is read to learn it."""
    rs_ref = controller(pod, "ReplicaSet")
    if rs_ref is None:
        return False
    key = (namespace, str(rs_ref["uid"]))
    with _guard:
        known = _chains.get(key)
        if known is not None:
            _chains.move_to_end(key)
    if known is not None:
        if known[0] != service:
            return False
        # (remembered: where the caller did not just read the service, its uid now is read)
        return known[1] == (service_uid if service_uid is not None else _uid(kube.get_vsvc(namespace, service)))
    found = _chain_end(kube, namespace, rs_ref)  # (its end's uid read just now)
    with _guard:
        _chains[key] = found
        while len(_chains) > REMEMBERED:
            _chains.popitem(last=False)
    return found[0] == service and service_uid in (None, found[1])


def _chain_end(kube: Reader, namespace: str, rs_ref: dict[str, Any]) -> tuple[str, str]:
    """The service the ReplicaSet's chain ends at, or NONE (read errors other than 404 are raised, not kept)."""
    rs = kube.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{rs_ref['name']}")
    dep_ref = controller(rs, "Deployment") if _uid(rs) == rs_ref["uid"] else None
    if dep_ref is None:
        return NONE
    dep = kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{dep_ref['name']}")
    svc_ref = controller(dep, KIND) if _uid(dep) == dep_ref["uid"] else None
    # (the service's Deployment is named after it: the API server checks no owner's uid, so an ownerReference
    # copied onto a Deployment of another name makes it no more the service's)
    if svc_ref is None or svc_ref["name"] != dep_ref["name"]:
        return NONE
    if _uid(kube.get_vsvc(namespace, svc_ref["name"])) != svc_ref["uid"]:
        return NONE
    return str(svc_ref["name"]), str(svc_ref["uid"])
