"""The import contracts (pyproject.toml, checked by lint-imports in .ci/run) name each module of the
package one by one (import-linter has no wildcard for "every other module"): a module added later
and left out of a list would be free to pull kopf or pydantic into diagnosis/ or the launcher."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "vllm_autoheal"
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
MODULES = {
    f"vllm_autoheal.{p.stem if p.is_file() else p.name}"
    for p in PACKAGE.iterdir()
    if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
}


@pytest.mark.parametrize(
    "contract", [c for c in CONTRACTS if "standard library only" in c["name"]], ids=lambda c: c["name"][:40]
)
def test_a_standard_library_contract_names_every_other_module(contract):
    named = set(contract["source_modules"]) | set(contract["forbidden_modules"])
    assert sorted(MODULES - named - {"vllm_autoheal.diagnosis"}) == []  # (which both may import)
    assert "vllm_autoheal.diagnosis" in MODULES and len(MODULES) > 20  # (the walk found the package)
