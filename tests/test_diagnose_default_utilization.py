"""`diagnose --engine-args` on a plain vLLM command line that names no --gpu-memory-utilization: the remedy is
sized from the share that ran, which is vLLM's own default for the logged release (0.92 from 0.20.0, 0.9
before; vllm_release.default_utilization), or the figure vLLM printed; not from the CRD's 0.9. A KV raise
sized from 0.9 where 0.92 ran falls 0.02 short: a certain second crash.

The log is the real H100 run's (tests/fixtures/gpu/h100-runs/l8-kv131k.log, vLLM 0.25) with its KV figures
set to a start at the default share: 15 GiB available where 16 are needed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_autoheal.cli import main
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.remedy import plan_from_command
from vllm_autoheal.vllm_release import default_utilization, parse_version

REAL = (Path(__file__).parent / "fixtures" / "gpu" / "h100-runs" / "l8-kv131k.log").read_text()
AT_DEFAULT = REAL.replace("(7.65 GiB)", "(15.0 GiB)").replace("memory: 7.65 GiB", "memory: 15.0 GiB")
AT_DEFAULT = AT_DEFAULT.replace("estimated maximum model length is 62656", "estimated maximum model length is 122880")
# (a build of one's own names no release: neither the banner's version nor the engine's first line)
NO_RELEASE = re.sub(r"version 0\.25\.0|\(v0\.25\.0\) ", "", AT_DEFAULT)
H100 = 79.18


@pytest.mark.parametrize(
    ("version", "share"), [("0.19.1", 0.9), ("0.20.0", 0.92), ("0.25.0", 0.92), ("0.34.0", 0.92), ("0.35.0", None)]
)
def test_vllms_own_default_by_release(version, share):
    assert default_utilization(parse_version(version)) == share
    assert default_utilization(None) is None


def test_a_kv_raise_is_sized_from_the_default_that_ran():
    diag = classify(Signals(log=AT_DEFAULT, exit_code=1, ready_before=False))
    assert diag.cause == "kv_cache_insufficient" and diag.numbers["available_gib"] == 15.0
    remedy = plan_from_command("--max-model-len 131072", diag, gpu_memory_gib=H100)
    # 0.92 + 1 GiB of 79.18 = 0.933: the raise must reach it (sized from 0.9 it was 0.92, the share that ran)
    assert remedy.action == "RaiseGpuMemoryUtilization"
    grown = 15.0 + (remedy.changes["gpu_memory_utilization"] - 0.92) * H100
    assert grown >= 16.0, remedy.summary()


def test_a_share_the_command_line_names_is_the_one_used():
    diag = classify(Signals(log=AT_DEFAULT, exit_code=1, ready_before=False))
    named = plan_from_command("--max-model-len 131072 --gpu-memory-utilization 0.9", diag, gpu_memory_gib=H100)
    assert named.changes["gpu_memory_utilization"] < 0.933


def test_with_no_release_in_the_log_the_remedy_says_what_it_assumed():
    diag = classify(Signals(log=NO_RELEASE, exit_code=1, ready_before=False))
    assert diag.cause == "kv_cache_insufficient" and "vllm_minor" not in diag.numbers
    remedy = plan_from_command("--max-model-len 131072", diag, gpu_memory_gib=H100)
    assert "taken as 0.9" in remedy.reason and "0.92 from 0.20.0" in remedy.reason


def test_the_printed_share_of_a_free_memory_refusal_is_the_one_that_ran():
    """vLLM 0.25 beside a 30 GiB process, no flag: it printed (0.92, 72.84 GiB)."""
    log = (Path(__file__).parent / "fixtures" / "gpu" / "h100-runs" / "l8-thief30.log").read_text()
    diag = classify(Signals(log=log, exit_code=1, ready_before=False))
    remedy = plan_from_command("--max-model-len 8192 --enforce-eager", diag, gpu_memory_gib=H100)
    assert remedy.action == "LowerGpuMemoryUtilization" and remedy.changes["gpu_memory_utilization"] * H100 <= 48.15


def test_the_cli_plans_from_the_default_that_ran(tmp_path, capsys):
    log = tmp_path / "kv.log"
    log.write_text(AT_DEFAULT)
    assert (
        main(["diagnose", "--json", "--gpu-memory-gib", str(H100), "--engine-args", "--max-model-len 131072", str(log)])
        == 0
    )
    out = capsys.readouterr().out
    share = json.loads(out)["remedy"]["changes"]["gpu_memory_utilization"]
    assert 15.0 + (share - 0.92) * H100 >= 16.0


def test_plan_says_which_share_it_sized_and_what_a_plain_vllm_serve_takes(capsys):
    config = str(Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json")
    argv = ["plan", "--model-config", config, "--gpu", "NVIDIA-H100-80GB-HBM3", "--max-model-len", "8192"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(utilization 0.9, the operator's and serve's default; a plain `vllm serve` of 0.33.0 takes 0.92)" in out
    assert main([*argv, "--vllm-version", "0.19.1"]) == 0
    assert "(utilization 0.9, the operator's and serve's default)" in capsys.readouterr().out
    assert main([*argv, "--gpu-memory-utilization", "0.92", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm"]["share"] == "utilization 0.92"
