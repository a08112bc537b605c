"""The split a weights give-up names (remedy/advice.py): the one the heal itself would pick, at the share
that ran or the most a raise may set, one the model's heads divide, with every action it needs named; and
the H100 run script (tests/gpu/h100_runs.sh) that stops only what it started and writes what the replay
(tests/test_memory_h100.py) reads. Found by a hostile review of the session-29 advice change."""

from __future__ import annotations

import re
from pathlib import Path

from test_memory_h100 import H100, LINE, RUNS, SNAPSHOT, V025, engine_of, shape_of
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.remedy import GIVE_UP, Inventory, plan_heal

SCRIPT = Path(__file__).parent / "gpu" / "h100_runs.sh"
RUN_LIB = Path(__file__).parent / "gpu" / "serve_run.sh"  # (the run() that h100_runs.sh and unseen_runs.sh call)


def q72_diag():
    return classify(Signals(log=(RUNS / "q72.log").read_text(), exit_code=1, ready_before=False, gpu=SNAPSHOT))


def test_a_probe_figure_below_the_top_share_does_not_bring_back_the_blind_rule():
    """Another process holds 5 GiB (74 GiB free by the probe). The share that ran, 0.92 (72.85 GiB), still
    fits beside it, and the heal itself picks TP 2 at that share; the advice evaluated every split at the
    bounds' 0.95 (75.22 GiB, more than is free), found none, and fell back to the blind rule's TP 4."""
    shape, engine, diag = shape_of("qwen2.5-72b"), engine_of("q72"), q72_diag()
    inventory = Inventory(gpu_total_gib=H100.memory_gib, gpu_free_gib=74.0, shape=shape, release=V025)
    allowed = {"bounds": {"maxTensorParallelSize": 8}, "allowedActions": ["IncreaseTensorParallel"]}
    healed = plan_heal(VLLMServiceSpec(model="m", engine=engine, heal=allowed), diag, inventory=inventory)
    assert healed.changes == {"tensor_parallel_size": 2}
    gave_up = plan_heal(VLLMServiceSpec(model="m", engine=engine), diag, inventory=inventory)
    assert gave_up.action == GIVE_UP
    assert "What would: tensor parallelism 2 (67.7 GiB of weights per GPU" in gave_up.reason, gave_up.reason


def test_a_split_that_needs_a_raise_outside_the_bounds_says_to_allow_the_raise():
    """At 0.85 TP 2 needs a larger share. With RaiseGpuMemoryUtilization not allowed, the give-up said only
    'allow ... IncreaseTensorParallel ...; its KV cache needs utilization up to 0.95': doing just that gives up
    again (the heal sets the share only where a raise is allowed). The within-bounds wording names the action."""
    shape, diag = shape_of("qwen2.5-72b"), q72_diag()
    engine = engine_of("q72").model_copy(update={"gpu_memory_utilization": 0.85})
    inventory = Inventory(gpu_total_gib=H100.memory_gib, shape=shape, release=V025)
    no_raise = {"allowedActions": ["LowerGpuMemoryUtilization"]}
    gave_up = plan_heal(VLLMServiceSpec(model="m", engine=engine, heal=no_raise), diag, inventory=inventory)
    assert gave_up.action == GIVE_UP and "needs utilization up to 0.95" in gave_up.reason
    assert "RaiseGpuMemoryUtilization" in gave_up.reason, gave_up.reason
    followed = {
        "bounds": {"maxTensorParallelSize": 2},
        "allowedActions": ["LowerGpuMemoryUtilization", "IncreaseTensorParallel"],
    }
    assert (
        plan_heal(VLLMServiceSpec(model="m", engine=engine, heal=followed), diag, inventory=inventory).action == GIVE_UP
    )
    followed["allowedActions"].append("RaiseGpuMemoryUtilization")
    healed = plan_heal(VLLMServiceSpec(model="m", engine=engine, heal=followed), diag, inventory=inventory)
    assert healed.changes["tensor_parallel_size"] == 2


def test_the_split_held_to_the_printed_weights_is_one_the_heads_divide():
    """Qwen2.5-32B (40 heads, 8 KV heads: TP 16 fails at load). The model's TP 2 is doubled until it holds
    the weights vLLM printed, past what the heads divide: the advice must not name a split vLLM refuses."""
    shape, diag = shape_of("qwen2.5-32b"), q72_diag()
    assert not shape.splits(16)
    diag.numbers["weights_gib"] = 600.0
    inventory = Inventory(gpu_total_gib=H100.memory_gib, shape=shape, release=V025)
    remedy = plan_heal(VLLMServiceSpec(model="m", engine=engine_of("q72")), diag, inventory=inventory)
    assert remedy.action == GIVE_UP
    assert "tensor parallelism 16" not in remedy.reason, remedy.reason


def test_the_scripts_own_summary_lines_are_what_the_replay_reads():
    """serve_run.sh (h100_runs.sh's runs) writes 'NAME: STATE in N s: MODEL FLAGS' and logs h100-NAME.log; the fixture summary
    (and LINE) read 'NAME: STATE: MODEL FLAGS' and NAME.log: a fresh run dropped in is not replayed."""
    text = RUN_LIB.read_text()
    echo = re.search(r'echo "(\$name: \$state[^"]*)"', text)[1]
    line = (
        echo.replace("$name", "l8-eager")
        .replace("$state", "started")
        .replace("$((SECONDS - t0))", "95")
        .replace("$model", "llama-3.1-8b")
        .replace("$*", "--max-model-len 8192 --enforce-eager")
    )
    assert LINE.match(line), line
    assert re.search(r'log="\$OUT/\$name\.log"', text), "logs are written as h100-NAME.log, kept as NAME.log"


def test_the_script_kills_only_what_it_started():
    """`nvidia-smi --query-compute-apps=pid | xargs kill -9` kills every GPU process on every GPU of the host,
    whoever owns it (CUDA_VISIBLE_DEVICES does not limit nvidia-smi), and in a container nvidia-smi's PIDs are
    the host's: kill -9 then hits whatever local process has that number."""
    text = SCRIPT.read_text()
    assert not re.search(r"query-compute-apps[^\n]*\|\s*xargs[^\n]*kill", text)


def test_every_summary_name_is_one_the_script_runs_or_says_why():
    """The fixture's q32-095-beside-orphan is the script's q32-095; gemma2-eager is run by default but is
    neither kept nor mentioned."""
    names = set(re.search(r'ALL="([^"]+)"', SCRIPT.read_text())[1].split())
    summary = (RUNS / "summary.txt").read_text()
    assert all(n in summary for n in names), sorted(n for n in names if n not in summary)
