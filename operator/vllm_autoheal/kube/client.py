"""The few Kubernetes API calls the operator makes, over the official client's transport.

Plain JSON in and out (no generated models). The objects a VLLMService owns are written by
server-side apply under the operator's own field manager, so a field left out of the manifest
is removed from the object; an object of the same name that this VLLMService does not control
is never written. A resync whose manifest is what was last applied, and still in place, writes nothing.

Every write carries what the look before it saw, as the API server checks it: an object that was
absent is created (POST: refused where the name was taken meanwhile, where an apply would create or
take over), and one that was the service's is applied with its uid (refused where it was replaced
meanwhile). Either refusal is a 409, read again on the retry, which then sees whose object it is.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .. import __version__
from ..api import GROUP, PLURAL, VERSION
from ..diagnosis.scan import GAP_LINE

MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "vllm-autoheal"
APPLIED_HASH = f"{GROUP}/applied-hash"  # the manifest last applied, to skip a resync's no-op apply
# A crashed container's log: its last lines, bounded in bytes (the kubelet may return a little more or less).
LOG_TAIL_LINES = 4000
LOG_REFINE = 4  # calls that look for the most lines that fit, once fewer did
LOG_LIMIT_BYTES = 2 * 2**20
LOG_LIMIT_SLACK = 64 * 2**10
# All the calls of one log read, in seconds: it holds one of kopf's few worker threads, which every
# tenant's handlers share, and a kubelet that stalls must not keep it (the heal goes on without the log).
LOG_BUDGET_S = 10.0
_CONFIGURED: dict[str, Any] = {}


def configure(host: str | None = None) -> None:
    """In-cluster config, else kubeconfig; `host` points the client at a test server."""
    if host:
        cfg = client.Configuration()
        cfg.host = host
        client.Configuration.set_default(cfg)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    _CONFIGURED["done"] = True
    _CONFIGURED.pop("api", None)  # a new target: a new connection pool


def _plural_path(api_version: str, kind_plural: str, namespace: str | None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{kind_plural}"


PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Pod": "pods",
    "Event": "events",
}


class Kube:
    timeout: float | None = None  # seconds per request; None waits as long as the connection lives

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout
        if not _CONFIGURED:
            configure()
        if "api" not in _CONFIGURED:  # one client, one connection pool (urllib3's is thread-safe)
            _CONFIGURED["api"] = client.ApiClient()
            _CONFIGURED["api"].user_agent = f"vllm-autoheal/{__version__}"
        self.api = _CONFIGURED["api"]

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, Any]] | None = None,
        raw: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """One API call. `timeout`: a shorter limit for this call, in seconds, tried once (the
        client's own retries would repeat a read that timed out three more times)."""
        method, url, headers, payload, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            body=body,
            header_params={"Content-Type": content_type, "Accept": "application/json, */*"},
            auth_settings=["BearerToken"],
        )
        if timeout is None:
            resp = self.api.call_api(method, url, header_params=headers, body=payload, _request_timeout=self.timeout)
            resp.read()
        else:
            resp = self.api.rest_client.pool_manager.request(
                method, url, headers=headers, body=payload, timeout=urllib3.Timeout(total=timeout), retries=False
            )
        data = resp.data.decode("utf-8", "replace") if isinstance(resp.data, bytes) else (resp.data or "")
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=f"{resp.reason}: {data[:2000]}")
        if raw:
            return data
        return json.loads(data) if data else {}

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # --- owned objects ---------------------------------------------------------------
    def apply_all(self, manifests: list[dict[str, Any]]) -> ApplyResult:
        """Apply every manifest, or none when one of them names an object this VLLMService does
        not control (a Service of another team, say): that is a conflict for a person to settle."""
        live = [self.get(_object_path(m)) for m in manifests]
        result = ApplyResult(
            conflicts=[
                describe(m)
                for m, have in zip(manifests, live, strict=True)
                if have is not None and not controlled_by_owner(have, m)
            ]
        )
        if not result.conflicts:
            result.outcomes = [(m, self._apply(m, have)) for m, have in zip(manifests, live, strict=True)]
        return result

    def apply(self, manifest: dict[str, Any]) -> str:
        """Server-side apply of one object: created, applied, unchanged, or conflict (not written)."""
        live = self.get(_object_path(manifest))
        if live is not None and not controlled_by_owner(live, manifest):
            return "conflict"
        return self._apply(manifest, live)

    def _apply(self, manifest: dict[str, Any], live: dict[str, Any] | None) -> str:
        body = with_applied_hash(manifest)
        meta = body["metadata"]
        path = _object_path(manifest)
        if live is None:
            made = self.request("POST", path.rsplit("/", 1)[0], body, query=[("fieldManager", FIELD_MANAGER)])
            self._own_by_apply(path, made)
            return "created"
        if (
            not self._own_by_apply(path, live)
            and (live["metadata"].get("annotations") or {}).get(APPLIED_HASH) == meta["annotations"][APPLIED_HASH]
            and is_subset(
                {
                    "metadata": {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta},
                    "spec": body.get("spec", {}),
                },
                live,
            )
        ):
            return "unchanged"
        uid = meta["uid"] = live["metadata"].get("uid")  # the object looked at, not one made since under its name
        try:
            self.request("PATCH", path, body, APPLY, query=[("fieldManager", FIELD_MANAGER), ("force", "true")])
        except ApiException as exc:
            if exc.status == 422 and _uid_refused(exc, uid):  # (replaced meanwhile: not the manifest refused)
                raise ApiException(status=409, reason=f"replaced since it was read: {exc.reason}") from exc
            raise
        return "applied"

    def _own_by_apply(self, path: str, obj: dict[str, Any]) -> bool:
        """Where the operator created the object (a create records its fields as an update's, which a later
        apply does not remove: a field the service drops would stay forever), make them an apply's, or drop
        the update's entry where an apply's is there already. True where it was the create's (then the
        caller applies, whether or not this landed: a later pass tries again). The JSON patch tests what it
        changes, so another writer's entry, or another object under the name, is never touched."""
        entries = (obj.get("metadata") or {}).get("managedFields") or []
        mine = [(i, e) for i, e in enumerate(entries) if e.get("manager") == FIELD_MANAGER and not e.get("subresource")]
        created = [i for i, e in mine if e.get("operation") == "Update"]
        if len(created) != 1:
            return False
        at = f"/metadata/managedFields/{created[0]}"
        applied = any(e.get("operation") == "Apply" for _, e in mine)
        ops = [
            {"op": "test", "path": "/metadata/uid", "value": obj["metadata"].get("uid")},
            {"op": "test", "path": f"{at}/manager", "value": FIELD_MANAGER},
            {"op": "test", "path": f"{at}/operation", "value": "Update"},
            {"op": "remove", "path": at} if applied else {"op": "replace", "path": f"{at}/operation", "value": "Apply"},
        ]
        try:
            self.request("PATCH", path, ops, JSON_PATCH, query=[("fieldManager", FIELD_MANAGER)])
        except ApiException as exc:
            if exc.status not in (404, 409, 422):  # (gone, or changed meanwhile: the next pass looks again)
                raise
        return True

    # --- VLLMServices ------------------------------------------------------------------
    def vsvc_path(self, namespace: str, name: str) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"

    def get_vsvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        if not name:  # (a pod's service label may be empty: that path is the namespace's list)
            return None
        return self.get(self.vsvc_path(namespace, name))

    def patch_vsvc(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", self.vsvc_path(namespace, name), body, MERGE)

    def patch_vsvc_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", self.vsvc_path(namespace, name) + "/status", {"status": status}, MERGE)

    def previous_log(self, namespace: str, pod: str, container: str) -> str:
        """The crashed container's own output (bounded), its end always: where the root cause of a vLLM
        crash is. The kubelet keeps the first `limitBytes` of the last `tailLines`, so where those lines
        overflow the limit (long request lines), fewer are asked for, then as many as fit (a few more
        calls, at most LOG_REFINE). A log that is not whole opens with a gap
        line (`[...]`): a request's report that follows it may have lost its opening (diagnosis reads it so).
        All of it within LOG_BUDGET_S; a log that cannot be had in time, or at all, is "" (never raises)."""
        deadline = time.monotonic() + min(LOG_BUDGET_S, self.timeout or LOG_BUDGET_S)

        def tail(lines: int) -> str | None:  # the last `lines` lines, or None where they overflow the limit
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the log read's time is spent")
            text = self.request(
                "GET",
                f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
                query=[
                    ("container", container),
                    ("previous", "true"),
                    ("tailLines", lines),
                    ("limitBytes", LOG_LIMIT_BYTES),
                ],
                raw=True,
                timeout=left,
            )
            return None if len(text.encode()) >= LOG_LIMIT_BYTES - LOG_LIMIT_SLACK else text

        try:
            lines, text, overflowing = LOG_TAIL_LINES, tail(LOG_TAIL_LINES), None
            while text is None and lines > 1:
                overflowing, lines = lines, max(1, lines // 4)
                text = tail(lines)
            above = overflowing or 0  # (the fewest lines known to overflow, once fewer were asked for)
            for _ in range(LOG_REFINE if text is not None and above else 0):
                middle = (lines + above) // 2
                if middle <= lines:
                    break
                try:
                    more = tail(middle)
                except (urllib3.exceptions.HTTPError, OSError):
                    break  # (out of time: the fewer lines already read do)
                if more is None:
                    above = middle
                else:
                    lines, text = middle, more
        except (ApiException, urllib3.exceptions.HTTPError, OSError):  # (TimeoutError is an OSError)
            return ""
        if text is None:
            return ""  # (one line over the limit: nothing whole to read)
        # (a process killed mid-line leaves its last line without a newline)
        cut = overflowing is not None or text.count("\n") + (not text.endswith("\n")) >= lines
        return GAP_LINE + "\n" + text if cut and text else text


@dataclass
class ApplyResult:
    conflicts: list[str] = field(default_factory=list)  # "Service default/payments", not written
    outcomes: list[tuple[dict[str, Any], str]] = field(default_factory=list)


def _object_path(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    collection = _plural_path(manifest["apiVersion"], PLURALS[manifest["kind"]], meta.get("namespace"))
    return f"{collection}/{meta['name']}"


def _uid_refused(exc: ApiException, uid: Any) -> bool:
    """The server's refusal is that of the uid sent, itself: its first cause, right after the object's
    name (the rest of a refusal may echo what a tenant wrote, "metadata.uid" included)."""
    try:
        message = str(json.loads(str(exc.reason).split(": ", 1)[1]).get("message") or "")
    except (IndexError, ValueError, AttributeError):
        return False
    first_cause = message.split(" is invalid: ", 1)[-1]
    return first_cause.startswith(f'metadata.uid: Invalid value: "{uid}": field is immutable')


def describe(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    return f"{manifest['kind']} {meta.get('namespace', '')}/{meta['name']}".replace(" /", " ")


def controller_uid(obj: dict[str, Any]) -> str | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)


def controlled_by_owner(live: dict[str, Any], manifest: dict[str, Any]) -> bool:
    """The live object's controller is the VLLMService the manifest is rendered for."""
    want = controller_uid(manifest)
    return want is not None and controller_uid(live) == want


def with_applied_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    meta = manifest["metadata"]
    return {**manifest, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), APPLIED_HASH: digest}}}


def is_subset(want: Any, have: Any) -> bool:
    """Every field we set is in the live object with the same value (the server adds defaults)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            is_subset(v, have.get(k)) for k, v in want.items() if v not in ({}, [], None) or k in have
        )
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    if isinstance(want, (int, float)) and isinstance(have, str):
        return str(want) == have
    return want == have
