"""Where `diagnose --engine-args` and `plan` take the share that ran (found by a hostile review).

- A command line may name the share in a spelling parse_args leaves in extra_args (an abbreviation vLLM's
  argparse accepts, `--gpu-memory-util 0.95`): refused, naming the spelling, as `serve` refuses it (sized as
  though the line named none, the remedy was a 'raise' to the share that had just failed).
- A log that names a release newer than the last series read does name a release: the note must not say
  it names none.
- The printed share of a free-memory refusal decides a cut that lands between 0.9 and what ran (0.92): a
  test the parent commit fails (the fixture's own test passes there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_diagnose_default_utilization import AT_DEFAULT, H100  # (the same vLLM 0.25 log, at the default share)
from vllm_autoheal.cli import main
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.engine import EngineArgsError
from vllm_autoheal.remedy import plan_from_command

FIXTURES = Path(__file__).parent / "fixtures" / "gpu" / "h100-runs"


def _kv(log: str):
    diag = classify(Signals(log=log, exit_code=1, ready_before=False))
    assert diag.cause == "kv_cache_insufficient" and diag.numbers["available_gib"] == 15.0
    return diag


def test_an_abbreviated_share_on_the_command_line_is_refused_naming_the_flag(tmp_path, capsys):
    """vLLM ran at 0.95 (`--gpu-memory-util 0.95`, argparse's prefix); the cache was 1 GiB short. Sized from
    the release's 0.92, the 'raise' was 0.95, the share that just failed: a certain second crash. Refused
    instead, as plan and serve refuse it: exit 2, naming the spelling to use."""
    diag = _kv(AT_DEFAULT)
    for flags in ("--max-model-len 131072 --gpu-memory-util 0.95", "--max-model-len 131072 --gpu-memory-util=0.5"):
        with pytest.raises(EngineArgsError, match="spell it --gpu-memory-utilization"):
            plan_from_command(flags, diag, gpu_memory_gib=H100)
    log = tmp_path / "kv.log"
    log.write_text(AT_DEFAULT)
    assert main(["diagnose", "--engine-args", "--max-model-len 131072 --gpu-memory-util 0.95", str(log)]) == 2
    err = capsys.readouterr().err
    assert "--gpu-memory-util" in err and "spell it --gpu-memory-utilization" in err and "Traceback" not in err


def test_a_release_newer_than_the_table_is_not_called_no_release():
    log = re.sub(r"0\.25\.0", "0.35.0", AT_DEFAULT)
    diag = _kv(log)
    assert diag.numbers.get("vllm_minor") == 35
    remedy = plan_from_command("--max-model-len 131072", diag, gpu_memory_gib=H100)
    assert "gpu_memory_utilization" in remedy.changes
    assert "names no release" not in remedy.reason, remedy.reason
    assert "0.35.0" in remedy.reason, remedy.reason


def test_the_printed_share_sizes_a_cut_between_0_9_and_what_ran():
    """vLLM 0.25, no flag, printed 0.92 with 73.74 GiB free: the share that leaves the margin is 0.91, below
    what ran (0.92) but above the CRD's 0.9 (the parent, sized from 0.9, never took it)."""
    log = (FIXTURES / "l8-thief30.log").read_text().replace("(48.15/79.18 GiB)", "(73.74/79.18 GiB)")
    diag = classify(Signals(log=log, exit_code=1, ready_before=False))
    assert diag.numbers["util"] == 0.92
    remedy = plan_from_command("--max-model-len 8192 --enforce-eager", diag, gpu_memory_gib=H100)
    assert remedy.action == "LowerGpuMemoryUtilization" and remedy.changes["gpu_memory_utilization"] == 0.91, (
        remedy.summary()
    )


def test_a_config_file_may_name_the_share_and_the_remedy_says_so():
    """`--config FILE` may set gpu-memory-utilization: the release's default is then a guess, said as one."""
    diag = _kv(AT_DEFAULT)
    remedy = plan_from_command("--max-model-len 131072 --config serve.yaml", diag, gpu_memory_gib=H100)
    assert remedy.changes["gpu_memory_utilization"] == 0.95
    assert "--config" in remedy.reason, remedy.reason
    plain = plan_from_command("--max-model-len 131072", diag, gpu_memory_gib=H100)
    assert "--config" not in plain.reason and "taken as" not in plain.reason


def test_plan_does_not_say_the_flags_name_no_share_where_an_abbreviation_names_one(capsys):
    """`plan --gpu-memory-util 0.5`: vLLM reads 0.5, but plan sized at 0.9 and its 'requested' line said the
    flags name none ("the operator's and serve's default"). Refused as `serve` refuses it: exit 2, naming it."""
    config = str(Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json")
    argv = ["plan", "--model-config", config, "--gpu", "NVIDIA-H100-80GB-HBM3", "--max-model-len", "8192"]
    assert main([*argv, "--gpu-memory-util", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-memory-util" in err and "--gpu-memory-utilization" in err
