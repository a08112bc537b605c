"""RBAC is tested, not guessed: record every request the running operator makes in a scenario that
exercises each of its code paths, and check the chart's rules grant exactly those."""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_autoheal import model_source
from vllm_autoheal.model_source import HubSettings

from hub_server import CONFIGS, GATED_TOKEN, hub  # noqa: F401 - the fixture
from operator_harness import (
    HARNESS_AGENT,
    Cluster,
    Emulator,
    running_operator,
    setup_emulator,
    wait_for,
)
from samples import KV_LOG, SPEC

CHART = Path(__file__).resolve().parents[1] / "charts" / "vllm-autoheal"

pytestmark = pytest.mark.kmock(cls=Emulator)
DISCOVERY = re.compile(r"^/(api|apis)(/[^/]+(/v[^/]+)?)?/?$")


def owner_blocking(body: object) -> set[tuple[str, str, str]]:
    """A write that sets blockOwnerDeletion on an owner reference: where the OwnerReferencesPermissionEnforcement
    admission plugin is on (OpenShift's default), the writer must be allowed to update the owner's finalizers."""
    refs = ((body or {}).get("metadata") or {}).get("ownerReferences") or [] if isinstance(body, dict) else []
    plurals = {"VLLMService": "vllmservices"}
    return {
        (
            r["apiVersion"].rsplit("/", 1)[0] if "/" in r["apiVersion"] else "",
            f"{plurals[r['kind']]}/finalizers",
            "update",
        )
        for r in refs
        if r.get("blockOwnerDeletion")
    }


def permissions(method: str, path: str, params: dict, content_type: str = "") -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) an API request needs; none for discovery. A
    server-side apply is a patch that creates the object when it is missing: the API server
    then authorizes it as a create too."""
    if DISCOVERY.match(path):
        return set()
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "get" if name else ("watch" if str(params.get("watch", "")).lower() in ("true", "1") else "list")
    what = f"{resource}/{sub}" if sub else resource
    if verb == "patch" and content_type.startswith("application/apply-patch"):
        return {(group, what, "patch"), (group, what, "create")}
    return {(group, what, verb)}


async def test_chart_grants_exactly_what_the_operator_uses(kmock, helm, hub, tmp_path):  # noqa: F811
    setup_emulator(kmock)
    model_source.configure(HubSettings(endpoint=hub.url, cache_dir=hub.cache))  # as the chart's hub.endpoint
    async with running_operator():
        c = Cluster(kmock)
        # pre-flight reads a ConfigMap, and a gated model's token from the service's Secret
        await c.call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            {"metadata": {"name": "cfg"}, "data": {"config.json": (CONFIGS / "llama-3.1-8b.json").read_text()}},
        )
        await c.call(
            "POST",
            "/api/v1/namespaces/default/secrets",
            {"metadata": {"name": "hf"}, "data": {"token": base64.b64encode(GATED_TOKEN.encode()).decode()}},
        )
        await c.create_vsvc("rbac-cm", {**SPEC, "modelConfig": {"configMapRef": {"name": "cfg"}}})
        await c.create_vsvc(
            "rbac-hub",
            {**SPEC, "model": "meta-llama/Llama-3.1-70B-Instruct", "hfTokenSecretRef": {"name": "hf", "key": "token"}},
        )
        for name in ("rbac-cm", "rbac-hub"):
            await wait_for(
                lambda: any(
                    x["type"] == "MemoryFit" and x["status"] != "Unknown"
                    for x in (c.vsvc_now(name).get("status") or {}).get("conditions", [])
                ),
                what=f"pre-flight of {name}",
            )
        spec = {**SPEC, "launcher": False, "modelCache": {"enabled": True, "size": "50Gi"}}
        await c.create_vsvc("rbac", spec)
        await wait_for(lambda: c.deployment_now("rbac"), what="deployment")
        # a person edits the spec: the Deployment, Service and PVC are applied again
        await c.call(
            "PATCH",
            "/apis/vllm.autoheal.dev/v1alpha1/namespaces/default/vllmservices/rbac",
            {"spec": {"port": 8001, "modelCache": {"size": "60Gi"}}},
            "application/merge-patch+json",
        )
        await wait_for(
            lambda: (
                (c.kube.get("/api/v1/namespaces/default/persistentvolumeclaims/rbac-model-cache") or {})
                .get("spec", {})
                .get("resources", {})
                .get("requests", {})
                .get("storage")
                == "60Gi"
            ),
            what="PVC patched",
        )
        # a crash whose cause is only in the previous log: pods/log, heal, events
        kmock["get /api/v1/namespaces/default/pods/rbac-a/log"] << KV_LOG.encode()
        await c.crash_pod("rbac", "rbac-a", message=KV_LOG[-2048:])
        await wait_for(lambda: c.events_now("Healed"), what="heal")
        await asyncio.sleep(1)
    used = set()
    for request in kmock._requests:  # kmock 0.8 keeps the log here (the DSL: kmock[:])
        if request.headers.get("User-Agent", "") == HARNESS_AGENT:
            continue
        method = request.method.value if hasattr(request.method, "value") else str(request.method)
        used |= permissions(method, request.url.path, dict(request.params), request.headers.get("Content-Type", ""))
        if method in ("POST", "PATCH", "PUT"):
            used |= owner_blocking(request.data)
    docs = [
        d
        for d in yaml.safe_load_all(
            subprocess.run([helm, "template", "rel", str(CHART)], capture_output=True, text=True, check=True).stdout
        )
        if d
    ]
    granted = {
        (g, r, v)
        for role in docs
        if role["kind"] == "ClusterRole"
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert used - granted == set(), f"the operator needs more than the chart grants: {sorted(used - granted)}"
    assert granted - used == set(), f"the chart grants more than the operator uses: {sorted(granted - used)}"
    model_source.configure(HubSettings())
