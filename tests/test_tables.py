"""One table per concept: every cause has an explanation, advice and a plan row; every action the
planner can emit is a HealAction users can allow or refuse; records take only known names."""

from __future__ import annotations

import ast
import inspect
from typing import get_args

import pytest
from pydantic import ValidationError

import vllm_autoheal
from vllm_autoheal import remedy
from vllm_autoheal.api import (
    ALL_ACTIONS,
    HealRecord,
    NoHeal,
    OperatorAction,
    RecordedAction,
)
from vllm_autoheal.diagnosis.model import CAUSES, EXPLANATIONS, Cause, Diagnosis, EnginePhase
from vllm_autoheal.remedy import host_steps, kv_steps, resource_steps, steps
from vllm_autoheal.report import ADVICE


@pytest.mark.parametrize("table", [EXPLANATIONS, ADVICE, remedy.PLANS], ids=["explanations", "advice", "plans"])
def test_every_cause_has_an_entry_and_nothing_else(table):
    assert set(table) == set(Cause) == set(CAUSES)


def _emitted_actions() -> set[str]:
    """Every action name a Remedy is built with in remedy/'s step modules (the first argument of
    Remedy(...), or the `action` argument of a _halve(...) step), read from the source so a new step is seen."""
    trees = [ast.parse(inspect.getsource(module)) for module in (steps, kv_steps, resource_steps, host_steps)]
    names: set[str] = set()
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "Remedy" and node.args and isinstance(node.args[0], ast.Constant):
                names.add(node.args[0].value)
            if node.func.id == "_halve" and isinstance(node.args[1], ast.Constant):
                names.add(node.args[1].value)
    return names


def test_every_emitted_action_is_a_heal_action():
    emitted = _emitted_actions()
    assert "Quantize" in emitted and "LowerMaxNumSeqs" in emitted  # the scan sees both kinds of step
    assert emitted <= set(ALL_ACTIONS), emitted - set(ALL_ACTIONS)
    # and every HealAction is one some step can emit: no promise the planner never keeps
    assert set(ALL_ACTIONS) <= emitted, set(ALL_ACTIONS) - emitted


def test_outcomes_and_operator_actions_are_recordable():
    assert {remedy.NO_CHANGE, remedy.GIVE_UP} == set(get_args(NoHeal))
    from vllm_autoheal.kube.heal_apply import REVERT

    assert {REVERT} == set(get_args(OperatorAction))
    assert set(get_args(RecordedAction)) == set(ALL_ACTIONS) | {remedy.NO_CHANGE, remedy.GIVE_UP, REVERT}


def _record(**over):
    return {"time": "2026-01-01T00:00:00Z", "pod": "p", "cause": "profiling_oom", "action": "LowerMaxNumSeqs", **over}


def test_heal_record_fields_are_typed():
    rec = HealRecord.model_validate(_record(phase="profile"))
    assert rec.cause is Cause.PROFILING_OOM and rec.phase is EnginePhase.PROFILE
    assert rec.wire()["cause"] == "profiling_oom" and type(rec.wire()["cause"]) is str
    for bad in ({"cause": "oom"}, {"action": "Reboot"}, {"phase": "warmup"}):
        with pytest.raises(ValidationError):
            HealRecord.model_validate(_record(**bad))


def test_a_diagnosis_takes_only_known_names():
    assert Diagnosis(cause="host_ram_oom").cause is Cause.HOST_RAM_OOM
    with pytest.raises(ValueError):
        Diagnosis(cause="out_of_memory")


def test_one_set_of_byte_units():
    """GIB and friends are defined in diagnosis/units.py only; nothing else spells 2**30 or defines a GIB."""
    import pathlib
    import re

    package = pathlib.Path(vllm_autoheal.__file__).parent
    offenders = [
        f"{p.relative_to(package)}:{n}"
        for p in package.rglob("*.py")
        if p.name != "units.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"2\s*\*\*\s*30|1024\s*\*\*\s*3|^\s*GIB\s*=", line)
    ]
    assert not offenders


@pytest.mark.parametrize(
    "text, value",
    [
        ("8Gi", 8 * 2**30),
        ("8gib", 8 * 2**30),
        ("8G", 8 * 10**9),
        ("1.5g", 1_500_000_000),
        ("512MiB", 512 * 2**20),
        ("1024", 1024),
    ],
)
def test_vllm_sizes_share_the_quantity_grammar(text, value):
    from vllm_autoheal.quantity import parse_quantity, parse_size

    assert parse_size(text) == value
    if text[-1] not in "bBg":
        assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "8x", "-1G", "1e3", "G", "inf", "8 Gi Gi"])
def test_a_bad_size_names_itself(text):
    from vllm_autoheal.engine import EngineArgsError, parse_args
    from vllm_autoheal.quantity import parse_size

    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)
    with pytest.raises(EngineArgsError, match="kv-cache-memory-bytes"):
        parse_args(["--kv-cache-memory-bytes", text or "''"])
