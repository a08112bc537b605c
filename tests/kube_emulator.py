"""kmock (the Kubernetes API emulator by kopf's author) with the API-server behaviours the operator relies on
that it lacks, injected faults, and the VLLMService resource served beside the core API."""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
from typing import Any

import attrs
import kmock as kmocklib
import kopf

from api_writes import (
    _SYSTEM_META,
    _UNMANAGED,
    JsonPatchFailed,
    _fields_v1,
    _leaves,
    json_patch,
    merge_diff,
    server_side_apply,
)
from vllm_autoheal import model_source
from vllm_autoheal.api import GROUP, KIND, PLURAL, VERSION
from vllm_autoheal.kube import client as kclient

NS = "default"
HARNESS_AGENT = "vllm-autoheal-test-harness"
VSVC = f"{GROUP}/{VERSION}/{PLURAL}"
# kopf's record of the spec it last handled (its diffbase; handlers.configure keeps it here)
KOPF_HANDLED = f"{GROUP}/last-handled-configuration"
_login_registered: dict[str, Any] = {}


@attrs.frozen
class ApplyInvalid(kmocklib.KubernetesError):
    status: int = 422
    reason: str = "Invalid"
    message: str = 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'


# Fields an apply configuration names that the server does not track as managed fields.
@dataclasses.dataclass
class Fault:
    method: str
    path_suffix: str
    status: int | None
    times: int
    delay: float | None = None
    hits: int = 0
    pending: int = 0  # delayed requests not yet served (the write has not landed)


class Emulator(kmocklib.KubernetesEmulator):
    """kmock, plus the API-server behaviours the operator relies on that it lacks:
    `metadata.generateName` (kopf names its Events that way), and `resourceVersion` and
    `generation` that move on each write. kopf skips a watch event older than its own last
    patch by resourceVersion; with kmock's frozen "1" it re-handles stale events, so a status
    write racing kopf's own patch replays an update handler again and again.

    Server-side apply (PATCH application/apply-patch+yaml, fieldManager, force) is emulated for
    one applier per object, which is how the operator uses it: managed fields are recorded
    per manager, and an apply removes the fields its manager applied before and leaves out now.
    An apply that names a uid is refused where the object has another (422) or is absent (409).
    A create with a fieldManager records its fields as that manager's update; JSON patches
    (application/json-patch+json) are applied, managedFields included, as a real server does.
    Not modelled: conflicts with other managers (force is assumed; a non-forced apply that
    a real server would refuse succeeds here), ownership of fields written by merge patches,
    associative lists merged by key (every list is atomic here: the applied list replaces the
    stored one), and server-side defaulting."""

    async def _server_side_apply(self, request) -> None:
        manager = request.params.get("fieldManager")
        if not manager:
            raise ApplyInvalid()
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            exists = key in self._objects and not self._objects[key].deleted
            live = copy.deepcopy(self._objects[key].raw) if exists else {}
            uid = (request.data.get("metadata") or {}).get("uid")
            if uid and not exists:
                raise kmocklib.KubernetesError(status=409, reason="Conflict", message=f"uid mismatch: {uid}, no object")
            if uid and uid != live["metadata"].get("uid"):
                raise kmocklib.KubernetesError(
                    status=422,
                    reason="Invalid",
                    message=f'{live.get("kind")} "{request.name}" is invalid: '
                    f'metadata.uid: Invalid value: "{uid}": field is immutable',
                )
            new = server_side_apply(live, request.data, manager)
            if not exists:  # an apply creates what is missing
                new["metadata"].update(uid=f"uid-applied-{len(self._requests)}", generation=1)
                if request.namespace:  # the server takes it from the URL
                    new["metadata"].setdefault("namespace", request.namespace)
                if key in self._objects:
                    self._objects[key].create(new)
                else:
                    self._objects[key] = new
                await self._buses[request.resource].put({"type": "ADDED", "object": self._objects[key].raw})
                diff = {}
            else:
                diff = merge_diff(live, new)
        request.data.clear()
        request.data.update(diff)  # kmock's update path stores it

    async def _json_patch(self, request) -> None:
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmocklib.KubernetesError(status=404, reason="NotFound", message=str(key))
            live = copy.deepcopy(self._objects[key].raw)
            try:
                new = json_patch(live, request.data)
            except JsonPatchFailed as exc:
                raise kmocklib.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        object.__setattr__(request, "data", merge_diff(live, new))  # (kmock's update path stores a merge patch)

    faults: list[Fault]

    def fail(
        self, method: str, path_suffix: str, status: int | None = None, times: int = 1, delay: float | None = None
    ) -> Fault:
        """Make the operator's next `times` requests `method path...path_suffix` fail with `status`,
        or answer only after `delay` seconds (the write still happens: a client timeout does not
        mean the server did nothing; `pending` counts those not served yet)."""
        fault = Fault(method.upper(), path_suffix, status, times, delay)
        self.faults = [*getattr(self, "faults", []), fault]
        return fault

    async def _handle(self, request):  # type: ignore[override]
        delayed: list[Fault] = []
        try:
            return await self._handle_faulted(request, delayed)
        finally:
            for fault in delayed:  # served (its write landed), or failed
                fault.pending -= 1

    async def _handle_faulted(self, request, delayed: list[Fault]):
        method = str(getattr(request.method, "value", request.method)).upper()
        for fault in getattr(self, "faults", []):
            if (
                fault.times > 0
                and method == fault.method
                and request.url.path.endswith(fault.path_suffix)
                and request.headers.get("User-Agent", "") != HARNESS_AGENT
            ):
                fault.times -= 1
                fault.hits += 1
                if fault.delay:
                    fault.pending += 1
                    delayed.append(fault)
                    await asyncio.sleep(fault.delay)
                else:
                    raise kmocklib.KubernetesError(
                        status=fault.status or 500,
                        reason="InjectedFault",
                        message=f"injected {fault.status} for {method} {fault.path_suffix}",
                    )
                break
        if request.resource is not None and request.action == kmocklib.action.UPDATE and request.name:
            content_type = request.headers.get("Content-Type", "")
            if "apply-patch" in content_type and isinstance(request.data, dict):
                await self._server_side_apply(request)
            elif "json-patch" in content_type and isinstance(request.data, list):
                await self._json_patch(request)
        if (
            request.resource is not None
            and request.action == kmocklib.action.CREATE
            and isinstance(request.data, dict)
            and request.params.get("fieldManager")
        ):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", f"uid-created-{len(self._requests)}")
            fields = {p for p in _leaves(request.data) if p not in _UNMANAGED and p[:2] not in _SYSTEM_META}
            meta["managedFields"] = [
                {
                    "manager": request.params["fieldManager"],
                    "operation": "Update",
                    "apiVersion": request.data.get("apiVersion"),
                    "fieldsType": "FieldsV1",
                    "fieldsV1": _fields_v1(fields),
                }
            ]
        data = request.data
        if (
            request.resource is not None
            and isinstance(data, dict)
            and request.action in (kmocklib.action.CREATE, kmocklib.action.UPDATE)
        ):
            meta = data.setdefault("metadata", {})
            if request.action == kmocklib.action.CREATE and not meta.get("name") and meta.get("generateName"):
                self._generated = getattr(self, "_generated", 0) + 1
                meta["name"] = f"{meta['generateName']}{self._generated:05d}"
            self._version = getattr(self, "_version", 1) + 1
            meta["resourceVersion"] = str(self._version)
            if request.action == kmocklib.action.UPDATE and "spec" in data and not request.subresource:
                key = (request.resource, request.namespace, request.name)
                current = self._objects[key].raw if key in self._objects else {}
                meta["generation"] = int(current.get("metadata", {}).get("generation") or 1) + 1
        return await super()._handle(request)

    def bound_request_log(self, keep: int = 256) -> None:
        """Keep only the newest requests. kmock logs every request for assertions and matches
        each new one against the whole log once per reaction (14 for discovery): quadratic, so
        a long run (bench/) slows to seconds per request. Tests that assert on requests keep it all."""
        self._requests = collections.deque(self._requests, maxlen=keep)


def setup_emulator(kmock, api_url: str | None = None) -> None:
    """Serve the core API and VLLMService discovery from kmock; the operator and the test talk
    to `api_url` (a proxy in front of kmock and the real CRD server), else to kmock itself."""
    kmock.resources.load_bundled()
    kmock.resources[VSVC] = kmocklib.ResourceInfo(
        kind=KIND,
        namespaced=True,
        singular="vllmservice",
        verbs={"get", "list", "watch", "create", "patch", "delete"},
        subresources={"status"},
    )
    url = api_url or str(kmock.url).rstrip("/")
    model_source.configure(model_source.HubSettings())  # the Hub is off unless a test serves one locally
    kclient.configure(host=url)
    _login_registered["url"] = url
    if not _login_registered.get("done"):

        @kopf.on.login()
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=_login_registered["url"], insecure=True)

        _login_registered["done"] = True
