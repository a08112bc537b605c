"""serve_process: how `serve` stops vLLM and reads the way it ended. A SIGKILL serve did not send is read
as the launcher reads it (137, the classifier's host-memory kill); one serve sent itself (a vLLM that ignored
SIGTERM past the grace period) never is."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from vllm_autoheal import serve_process
from vllm_autoheal.serve_process import exit_status, stop_group

from samples import fake_vllm

IGNORES_SIGTERM = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)\n"
)


def test_a_signal_serve_did_not_send_reads_as_128_plus_it():
    assert exit_status(-9, set()) == 137
    assert exit_status(-15, {signal.SIGKILL}) == 143
    assert exit_status(1, set()) == 1 and exit_status(0, {signal.SIGTERM}) == 0


def test_a_signal_serve_sent_stays_as_popen_gives_it():
    assert exit_status(-9, {signal.SIGTERM, signal.SIGKILL}) == -9
    assert exit_status(-15, {signal.SIGTERM}) == -15


def test_stop_group_names_the_kill_of_a_vllm_that_ignored_sigterm(monkeypatch):
    monkeypatch.setattr(serve_process, "STOP_GRACE_S", 0.5)
    child = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, start_new_session=True)
    assert child.stdout is not None and child.stdout.readline() == b"up\n"  # (its handler is in place)
    sent = stop_group(child)
    assert sent == {signal.SIGTERM, signal.SIGKILL}
    assert exit_status(child.wait(), sent) == -9


def test_stop_group_of_a_vllm_that_exited_by_itself_sent_it_nothing():
    child = subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], start_new_session=True)
    child.wait()
    sent = stop_group(child)
    assert sent == set() and exit_status(child.returncode, sent) == 137


# serve as `python -c`, with a short grace period: its startup timeout SIGKILLs a vLLM that ignores SIGTERM.
SHORT_GRACE = """
import sys
from vllm_autoheal import serve_process
from vllm_autoheal.cli import main
serve_process.STOP_GRACE_S = 0.5
sys.exit(main(sys.argv[1:]))
"""


def test_serves_own_kill_after_a_startup_timeout_is_no_host_memory_kill(tmp_path: Path):
    env, port = fake_vllm(tmp_path, IGNORES_SIGTERM)
    argv = ["serve", "m", "--port", str(port), "--fresh", "--history", str(tmp_path / "h.jsonl"),
            "--startup-timeout", "1"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", SHORT_GRACE, *argv], capture_output=True, text=True, timeout=120, env=env
    )
    said = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[vllm-autoheal]"))
    assert "not healthy after 1 s" in said, said
    assert "vLLM exited with -9" in said and "host_ram_oom" not in said, said
    assert proc.returncode == 1, said
