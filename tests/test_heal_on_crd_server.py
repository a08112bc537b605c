"""A real heal, replayed into the real CRD API server, and what a user sees with kubectl.

The operator runs against kmock (which serves the core API the CRD server lacks); the
VLLMService writes its heal made (the spec patch with its annotation, and the status)
are then applied to the real apiextensions-apiserver: they must be accepted and come
back unpruned. `kubectl get vsvc` and `kubectl describe` then show the printer columns
and status as a user would (the README's "How healing works" is this output)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from operator_harness import Cluster, Emulator, running_operator, setup_emulator, wait_for
from samples import KV_TERMINATION, SPEC

pytestmark = [pytest.mark.crdserver, pytest.mark.kmock(cls=Emulator)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kubectl(k8s_tools) -> str:
    return str(k8s_tools / "kubectl")


async def test_real_heal_is_accepted_unpruned_and_readable_with_kubectl(kmock, crd_server, kubectl, tmp_path):
    setup_emulator(kmock)
    async with running_operator():
        cluster = Cluster(kmock)
        await cluster.first_heal("llama-8b", SPEC, "llama-8b-6d9f7c-x2k4q", message=KV_TERMINATION)
        # the heal is recorded in status first, then the spec is patched with its annotation
        healed = await wait_for(
            lambda: (
                (o := cluster.vsvc_now("llama-8b"))
                and "vllm.autoheal.dev/healed-engine" in (o["metadata"].get("annotations") or {})
                and o
            ),
            what="the healed spec",
        )
    from crdserver.discovery_proxy import DiscoveryProxy

    with DiscoveryProxy(crd_server.url, crd_server.workdir / "certs") as proxy:
        env = {**os.environ, "KUBECONFIG": str(proxy.kubeconfig(tmp_path / "kubeconfig"))}
        transcript = _kubectl_session(kubectl, env, healed, tmp_path)
    print(transcript)


def _kubectl_session(kubectl: str, env: dict, healed: dict, tmp_path: Path) -> str:
    def k(*args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [kubectl, "--request-timeout=20s", *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
        )
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    k("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / "vllmservices.vllm.autoheal.dev.yaml"))
    for _ in range(100):  # (kubectl wait watches; the discovery proxy does not stream)
        conditions = json.loads(k("get", "crd", "vllmservices.vllm.autoheal.dev", "-o", "json"))["status"]
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions.get("conditions", [])):
            break
        time.sleep(0.2)
    time.sleep(1)
    user = {
        "apiVersion": healed["apiVersion"],
        "kind": healed["kind"],
        "metadata": {"name": "llama-8b", "namespace": "default"},
        "spec": SPEC,
    }
    k("create", "--validate=false", "-f", "-", stdin=json.dumps(user))  # the server validates
    # the operator's writes, as it made them
    spec_patch = {
        "metadata": {
            "annotations": {
                "vllm.autoheal.dev/healed-engine": healed["metadata"]["annotations"]["vllm.autoheal.dev/healed-engine"]
            }
        },
        "spec": {"engine": healed["spec"]["engine"]},
    }
    k("patch", "vsvc", "llama-8b", "--type=merge", "-p", json.dumps(spec_patch))
    status = copy.deepcopy(healed["status"])
    k("patch", "vsvc", "llama-8b", "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))
    stored = json.loads(k("get", "vsvc", "llama-8b", "-o", "json"))
    assert stored["spec"]["engine"]["maxModelLen"] == 524160
    assert stored["status"] == status, "the real API server pruned or changed part of the operator's status"
    table = k("get", "vsvc", "llama-8b")
    header, row = table.splitlines()[:2]
    assert header.split()[:7] == ["NAME", "MODEL", "PHASE", "GPUS", "HEALS", "LAST", "CAUSE"]
    assert row.split()[:6] == [
        "llama-8b",
        "meta-llama/Llama-3.1-8B-Instruct",
        stored["status"]["phase"],
        "1",
        "1",
        "kv_cache_insufficient",
    ]
    describe = k("describe", "vsvc", "llama-8b")
    assert "Max Model Len:" in describe and "LowerMaxModelLen" in describe
    return f"\n$ kubectl get vsvc llama-8b\n{table}\n$ kubectl describe vsvc llama-8b\n{describe}"
