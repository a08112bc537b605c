"""vLLM 0.32 can hold a model's weights in another process (its IPC weight cache, model_loader/
weight_cache/ipc_loader.py) and counts them in the utilization: utils.request_memory raises, with the
line's own figures, "Free memory on device D (free/total GiB) on startup is less than the engine's budget
after excluding external process's weights (utilization, budget GiB)", where budget = ceil(total x
utilization) - the weights held. A cut sized from the free figure alone would leave less than the weights
held ("Externally held weights ... exceed the desired GPU memory utilization" on the next start): the cut
counts the weights held beside what was free, from the same line."""

from __future__ import annotations

import math

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.remedy import plan_heal

PREFIX = "(EngineCore_DP0 pid=211) ERROR 12-01 10:00:00 [core.py:1100] "
TRACEBACK = [
    "EngineCore failed to start.",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 535, in init_device',
    "    self.requested_memory = request_memory(",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/utils.py", line 741, in request_memory',
    "    raise ValueError(",
]
BUDGET = (
    "ValueError: Free memory on device cuda:0 ({free}/{total} GiB) on startup is less than the engine's budget "
    "after excluding external process's weights ({util}, {budget} GiB). Decrease GPU memory utilization or "
    "reduce GPU memory used by other processes."
)


def _log(message: str) -> str:
    return "".join(PREFIX + line + "\n" for line in [*TRACEBACK, message])


def _spec(util: float) -> VLLMServiceSpec:
    return VLLMServiceSpec.model_validate(
        {
            "model": "org/m",
            "engine": {"gpuMemoryUtilization": util},
            "heal": {"bounds": {"minGpuMemoryUtilization": 0.1}},
        }
    )


def _request_memory(total: float, util: float, held: float, free: float) -> str | None:
    """vLLM 0.32's utils.request_memory, in GiB: the refusal it raises, or None where it starts."""
    engine = math.ceil(total * util * 2**30) / 2**30 - held
    if engine <= 0:
        return "Externally held weights exceed the desired GPU memory utilization"
    return "Free memory is less than the engine's budget" if free < engine else None


@pytest.mark.parametrize(
    ("total", "util", "held", "free"),
    [(79.19, 0.9, 16.0, 10.5), (139.8, 0.92, 60.0, 50.0), (79.19, 0.95, 30.0, 40.0), (23.65, 0.9, 4.0, 12.0)],
)
def test_the_cut_counts_the_weights_held_outside_and_starts(total, util, held, free):
    budget = round(total * util - held, 2)
    assert _request_memory(total, util, held, free) is not None  # (the crash being healed)
    log = _log(BUDGET.format(free=free, total=total, util=util, budget=budget))
    diag = classify(Signals(log=log))
    assert (diag.cause, diag.subtype) == ("gpu_util_exceeds_free", "free_memory_below_engine_budget")
    assert diag.numbers["engine_budget_gib"] == pytest.approx(budget)
    remedy = plan_heal(_spec(util), diag)
    new = remedy.changes["gpu_memory_utilization"]
    assert new < util
    assert _request_memory(total, new, held, free) is None, (new, remedy.reason)
    assert "held outside" in remedy.reason


def test_a_line_without_its_figures_is_not_cut_from_the_free_figure_alone():
    """The free figure alone (10.5 of 79.19 GiB: utilization 0.12) would leave less than the 16 GiB held."""
    message = BUDGET.format(free=10.5, total=79.19, util=0.9, budget=55.27).replace(" (0.9, 55.27 GiB)", "")
    diag = classify(Signals(log=_log(message)))
    assert diag.subtype == "free_memory_below_engine_budget" and "engine_budget_gib" not in diag.numbers
    new = plan_heal(_spec(0.9), diag).changes.get("gpu_memory_utilization")
    assert new is None or _request_memory(79.19, new, 16.0, 10.5) != (
        "Externally held weights exceed the desired GPU memory utilization"
    )


def test_a_budget_larger_than_the_device_is_dropped_with_a_note():
    diag = classify(Signals(log=_log(BUDGET.format(free=10.5, total=79.19, util=0.9, budget=500.0))))
    assert "engine_budget_gib" not in diag.numbers
    assert any(n.startswith("ignored engine_budget_gib=") for n in diag.notes)
    new = plan_heal(_spec(0.9), diag).changes.get("gpu_memory_utilization")
    assert new is None or new >= 0.2  # (never sized from the free figure alone: 10.5 / 79.19)


def test_no_cut_leaves_the_engine_too_little_beside_the_weights_held():
    """3.2 GiB free beside 15 GiB held on an 80 GB GPU: the share that fits what was free (0.2: 15.84 GiB)
    passes vLLM's check, but leaves the engine 0.84 GiB beside the weights held: its CUDA context (0.51 GiB), the
    profiling run's activations and a KV block do not fit, a certain second crash. No such cut is made."""
    total, util, held, free = 79.19, 0.9, 15.0, 3.2
    budget = round(total * util - held, 2)
    diag = classify(Signals(log=_log(BUDGET.format(free=free, total=total, util=util, budget=budget))))
    assert diag.subtype == "free_memory_below_engine_budget"
    remedy = plan_heal(_spec(util), diag)
    new = remedy.changes.get("gpu_memory_utilization")
    assert new is None or new * total - held >= 1.0, (remedy.action, remedy.changes, remedy.reason)
