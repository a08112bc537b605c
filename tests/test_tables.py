"""One table per concept: every cause has an explanation, advice and a plan row; every action the
planner can emit is a HealAction users can allow or refuse; records take only known names."""
from __future__ import annotations

import ast
import inspect
from typing import get_args

import pytest
from pydantic import ValidationError

from vllm_autoheal import remedy
from vllm_autoheal.api import ALL_ACTIONS, HealRecord, NoHeal, OperatorAction, RecordedAction
from vllm_autoheal.diagnosis.classify import EXPLANATIONS
from vllm_autoheal.diagnosis.model import CAUSES, Cause, Diagnosis, EnginePhase
from vllm_autoheal.report import ADVICE


@pytest.mark.parametrize("table", [EXPLANATIONS, ADVICE, remedy.PLANS], ids=["explanations", "advice", "plans"])
def test_every_cause_has_an_entry_and_nothing_else(table):
    assert set(table) == set(Cause) == set(CAUSES)


def _emitted_actions() -> set[str]:
    """Every action name a Remedy is built with in remedy.py (the first argument of Remedy(...),
    or the `action` argument of a _halve(...) step), read from the source so a new step is seen."""
    tree = ast.parse(inspect.getsource(remedy))
    names: set[str] = set()
    for node in ast.walk(tree):
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
    from vllm_autoheal.kube.heal import REVERT
    assert {REVERT} == set(get_args(OperatorAction))
    assert set(get_args(RecordedAction)) == set(ALL_ACTIONS) | {remedy.NO_CHANGE, remedy.GIVE_UP, REVERT}


def _record(**over):
    return {"time": "2026-01-01T00:00:00Z", "pod": "p", "cause": "profiling_oom", "action": "LowerMaxNumSeqs",
            **over}


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
