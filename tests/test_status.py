"""The phase and conditions as one pure function of what was observed (a table, as KAITO tests its
status functions)."""

from __future__ import annotations

import pytest

from vllm_autoheal.kube import status as st

INTENT = {"cause": "runtime_oom", "summary": "LowerGpuMemoryUtilization: --gpu-memory-utilization 0.88"}


def cond(type_: str, status: str, reason: str = "R") -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": "t",
        "observedGeneration": 1,
    }


READY, NOT_READY = cond("Ready", "True", "Available"), cond("Ready", "False", "Progressing")
EXHAUSTED, HEALING = cond("HealExhausted", "True", "RuntimeOom"), cond("Healing", "True", "RuntimeOom")
BLOCKED = cond("HealBlocked", "True", "Unschedulable")


@pytest.mark.parametrize(
    "name, observed, phase, expect",
    [
        ("new service", st.Observed([]), "Progressing", {}),
        ("pods ready", st.Observed([], ready=True, replicas="1/1"), "Running", {"Ready": "True"}),
        ("ready from the stored condition", st.Observed([READY]), "Running", {"Ready": "True"}),
        ("heal rolling out", st.Observed([READY], in_flight=INTENT), "Healing", {"Healing": "True"}),
        (
            "heal rolled out and ready",
            st.Observed([READY, HEALING], ready=True),
            "Running",
            {"Healing": "False", "Ready": "True"},
        ),
        ("healed pods crashed, not ready yet", st.Observed([NOT_READY, HEALING]), "Progressing", {"Healing": "False"}),
        (
            "gave up, not ready",
            st.Observed([NOT_READY], exhausted="no change left"),
            "Failed",
            {"HealExhausted": "True"},
        ),
        (
            "gave up earlier, ready again: Running, the condition stays",
            st.Observed([NOT_READY, EXHAUSTED], ready=True),
            "Running",
            {"HealExhausted": "True", "Ready": "True"},
        ),
        (
            "gave up earlier, still not ready",
            st.Observed([NOT_READY, EXHAUSTED], ready=False),
            "Failed",
            {"HealExhausted": "True"},
        ),
        (
            "a person's edit clears the heal state",
            st.Observed([NOT_READY, EXHAUSTED, HEALING, BLOCKED], person_edit=True),
            "Progressing",
            {"HealExhausted": None, "Healing": None, "HealBlocked": None},
        ),
        (
            "blocked heal",
            st.Observed([NOT_READY], in_flight=INTENT, blocked="0/3 nodes are available"),
            "Healing",
            {"HealBlocked": "True", "Healing": "True"},
        ),
        ("scheduled again", st.Observed([READY, BLOCKED], blocked=""), "Running", {"HealBlocked": "False"}),
        (
            "pre-flight's condition is kept",
            st.Observed([], memory_fit=cond("MemoryFit", "False", "WeightsLoadOom")),
            "Progressing",
            {"MemoryFit": "False"},
        ),
    ],
)
def test_phase_and_conditions(name, observed, phase, expect):
    got_phase, conditions = st.phase_and_conditions(observed)
    by_type = {c["type"]: c["status"] for c in conditions}
    assert got_phase == phase, name
    for type_, status in expect.items():
        assert by_type.get(type_) == status, (name, type_, by_type)
    assert [c["type"] for c in conditions] == sorted(by_type, key=lambda t: st.ORDER.get(t, 9))


def test_last_transition_time_moves_only_when_the_status_does():
    _, first = st.phase_and_conditions(st.Observed([READY], ready=True))
    assert next(c for c in first if c["type"] == "Ready")["lastTransitionTime"] == "t"
    _, flipped = st.phase_and_conditions(st.Observed([READY], ready=False))
    assert next(c for c in flipped if c["type"] == "Ready")["lastTransitionTime"] != "t"


def test_history_keeps_what_was_tried_beyond_the_record_cap():
    heals = [{"cause": "not_oom", "action": "NoChange", "numbers": {}}] * 20
    hist = st.history(["runtime_oom/LowerGpuMemoryUtilization"], heals)
    assert {"cause": "runtime_oom", "action": "LowerGpuMemoryUtilization"} in hist


def test_history_says_the_utilization_a_recorded_heal_cut_from():
    """What a runtime OOM ran at (the planner's ceiling for later raises: plan.outside_budget_ceiling), from
    the record's change; nothing where the heal did not change it or the record's value is no number."""
    cut = {"field": "gpuMemoryUtilization", "before": "0.9", "after": "0.85"}
    heals = [
        {"cause": "runtime_oom", "changes": [cut]},
        {"cause": "runtime_oom", "changes": [{"field": "maxNumSeqs", "before": "256", "after": "128"}]},
        {"cause": "runtime_oom", "changes": [{**cut, "before": "nan"}]},
        {"cause": "runtime_oom", "changes": [{**cut, "before": None}]},
    ]
    assert [h["ran_util"] for h in st.history([], heals)] == [0.9, None, None, None]


def test_every_setting_that_crashed_is_remembered_however_many_heals_are_allowed():
    """A heal never goes back to settings that crashed of memory (status.failedEngines): with the most heals
    allowed (heal.maxAttempts), each crash adds one, and the first start one more; none may fall out."""
    from vllm_autoheal.api.heal_policy import MAX_ATTEMPTS
    from vllm_autoheal.api.status import MAX_FAILED_ENGINES
    from vllm_autoheal.kube.status import remember_failed

    failed: list[str] = []
    for n in range(MAX_ATTEMPTS + 1):
        failed = remember_failed(failed, f"engine-{n}")
    assert MAX_FAILED_ENGINES > MAX_ATTEMPTS and failed[0] == "engine-0" and len(failed) == MAX_ATTEMPTS + 1


def test_a_full_list_of_crashes_takes_an_older_crash_for_handled_and_a_newer_one_for_new():
    from vllm_autoheal.api import MAX_OBSERVED_CRASHES
    from vllm_autoheal.kube.status import crash_seen, remember_crash

    observed: list[str] = []
    for i in range(MAX_OBSERVED_CRASHES + 10):
        observed = remember_crash(observed, f"u{i}/vllm/0", 1_000 + i)
    assert (
        len(observed) == MAX_OBSERVED_CRASHES
        and observed[-1] == f"u{MAX_OBSERVED_CRASHES + 9}/vllm/0@{1_009 + MAX_OBSERVED_CRASHES}"
    )
    assert crash_seen(observed, "u0/vllm/0", 1_000)  # pushed out: ended before every remembered one
    assert crash_seen(observed, "u59/vllm/0", 1_059)  # remembered
    assert not crash_seen(observed, "new/vllm/0", 2_000)  # a new crash
    assert not crash_seen(observed, "new/vllm/0", None)  # (no time: only the list decides)
    assert not crash_seen(observed[:-1], "u0/vllm/0", 1_000)  # not full: nothing was let go
    legacy = [f"u{i}/vllm/0" for i in range(MAX_OBSERVED_CRASHES)]  # (entries written before times were kept)
    assert crash_seen(legacy, "u3/vllm/0", 5) and not crash_seen(legacy, "x/vllm/0", 5)
