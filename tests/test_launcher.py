"""The in-pod launcher, with a fake child that prints a real vLLM failure log and exits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from vllm_autoheal.diagnosis import MEMORY_CAUSES
from vllm_autoheal.launcher import OutputKeeper, termination_message

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-cpu"


def launch(tmp_path, script: str, *args: str, env=None, **kw):
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(script))
    term = tmp_path / "termination-log"
    cmd = [
        sys.executable,
        "-m",
        "vllm_autoheal.launcher",
        "--termination-path",
        str(term),
        "--",
        sys.executable,
        str(child),
        *args,
    ]
    return cmd, term


def test_failure_writes_a_small_valid_diagnosis_and_keeps_the_exit_code(tmp_path):
    log = FIXTURES / "kv-cache-too-small.log"
    cmd, term = launch(
        tmp_path,
        """
        import sys
        sys.stdout.buffer.write(open(sys.argv[1], "rb").read()); sys.stdout.flush()
        sys.stderr.write("stderr line\\n")
        sys.exit(3)
    """,
        str(log),
    )
    proc = subprocess.run(cmd, capture_output=True)
    assert proc.returncode == 3
    assert proc.stdout == log.read_bytes()  # passed through unchanged
    assert proc.stderr.endswith(b"stderr line\n")
    doc = json.loads(term.read_text())
    assert len(term.read_bytes()) <= 4096
    assert doc["diagnosis"]["cause"] == "kv_cache_insufficient"
    assert doc["diagnosis"]["numbers"]["estimated_max_model_len"] == 524160
    assert doc["exit_code"] == 3 and "gpu_start" in doc


def test_fifty_megabyte_log_still_fits_in_4096_bytes(tmp_path):
    cmd, term = launch(
        tmp_path,
        """
        import sys
        line = "INFO 01-01 00:00:00 [loggers.py:1] Avg prompt throughput: 1.0 tokens/s, GPU KV cache usage: 1%\\n"
        block = line * 10000
        for _ in range(50_000_000 // len(block)):
            sys.stdout.write(block)
        sys.stdout.write(open(sys.argv[1]).read())
        sys.exit(1)
    """,
        str(FIXTURES / "memory-limit-kill.log"),
    )
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    raw = term.read_bytes()
    assert len(raw) <= 4096
    assert json.loads(raw)["diagnosis"]["cause"] == "host_ram_oom"


def test_signals_reach_the_child_and_a_requested_stop_is_not_a_memory_cause(tmp_path):
    marker = tmp_path / "got-signal"
    cmd, term = launch(
        tmp_path,
        f"""
        import signal, sys, time
        def bye(signum, frame):
            open({str(marker)!r}, "w").write(str(signum)); sys.exit(143)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(60)
    """,
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 143
    assert marker.read_text() == str(int(signal.SIGTERM))
    doc = json.loads(term.read_text())  # the launcher's own message, saying it was a stop
    assert doc["autoheal"] == 1 and doc["exit_code"] == 143 and f"signal {int(signal.SIGTERM)}" in doc["note"]
    assert doc["diagnosis"]["cause"] not in MEMORY_CAUSES


def test_a_forged_message_is_replaced_even_when_the_child_signals_the_launcher(tmp_path):
    """A real child writes its own "diagnosis" into the termination file, signals the launcher
    (which forwards the signal back and kills it), and dies: the launcher's message stands."""
    cmd, term = launch(
        tmp_path,
        """
        import json, os, signal, sys, time
        forged = {"autoheal": 1, "exit_code": 1, "diagnosis": {"cause": "host_ram_oom",
                  "numbers": {"needed_gib": 1e30}, "evidence": ["forged"]}}
        open(sys.argv[1], "w").write(json.dumps(forged))
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(30)
    """,
    )
    cmd.append(str(tmp_path / "termination-log"))
    proc = subprocess.run(cmd, capture_output=True, timeout=60)
    assert proc.returncode == 128 + int(signal.SIGTERM)
    doc = json.loads(term.read_text())
    assert doc["exit_code"] == 143 and "forged" not in json.dumps(doc)
    assert doc["diagnosis"]["cause"] != "host_ram_oom" and "signal" in doc["note"]


def test_a_message_left_by_an_earlier_run_does_not_survive_a_clean_exit(tmp_path):
    cmd, term = launch(tmp_path, "print('hi')")
    term.write_text('{"autoheal": 1, "exit_code": 1, "diagnosis": {"cause": "runtime_oom"}}')
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert term.read_text() == ""


def test_success_writes_nothing(tmp_path):
    cmd, term = launch(tmp_path, "print('hi')")
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert not term.exists()


def test_missing_command_and_unwritable_path_never_hide_the_exit_code(tmp_path):
    assert (
        subprocess.run(
            [sys.executable, "-m", "vllm_autoheal.launcher", "--", "/no/such/binary"], capture_output=True
        ).returncode
        == 127
    )
    child = tmp_path / "c.py"
    child.write_text("import sys; print('Traceback'); sys.exit(5)")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_autoheal.launcher",
            "--termination-path",
            "/proc/forbidden/x",
            "--",
            sys.executable,
            str(child),
        ],
        capture_output=True,
    )
    assert proc.returncode == 5 and b"could not write" in proc.stderr


def test_truncation_keeps_cause_and_numbers():
    diag = {
        "cause": "kv_cache_insufficient",
        "phase": "kv-allocation",
        "evidence": ["x" * 3000] * 4,
        "numbers": {"estimated_max_model_len": 32464},
        "explanation": "y" * 3000,
    }
    text = termination_message(diag, 1, {"gpus": [[0, "H200", 139.8, 1.0]] * 30}, None, limit=1024)
    doc = json.loads(text)
    assert len(text.encode()) <= 1024
    assert doc["diagnosis"]["cause"] == "kv_cache_insufficient"
    assert doc["diagnosis"]["numbers"]["estimated_max_model_len"] == 32464


def test_output_keeper_is_bounded():
    k = OutputKeeper(head=100, tail=1000)
    for i in range(100_000):
        k.add(f"line {i}\n")
    text = k.text()
    assert len(text) < 1300 and text.startswith("line 0\n") and text.endswith("line 99999\n") and "[...]" in text


def test_output_without_newlines_is_read_in_bounded_pieces():
    """A child printing a 300 MB blob with no newline (a progress bar, a binary dump) must not be
    read whole into the launcher's memory, which counts against the container's limit."""
    import io

    from vllm_autoheal.launcher import CHUNK_BYTES, pump

    blob = b"\x00\xff" * (4 * CHUNK_BYTES) + b"tail\n" + b"next line\n"
    sink, pieces, keeper = io.BytesIO(), [], OutputKeeper(head=100, tail=1000)
    pump(io.BytesIO(blob), sink, keeper, pieces.append)
    assert sink.getvalue() == blob  # still passed through byte for byte
    # only the long line's first piece is kept (its later pieces open no line: OutputKeeper)
    assert len(pieces) == 2 and len(pieces[0]) <= CHUNK_BYTES and pieces[1] == "next line\n"
    assert "tail" not in keeper.text() and keeper.text().endswith("\nnext line\n")


def test_a_huge_line_keeps_the_launchers_memory_small(tmp_path):
    cmd, term = launch(
        tmp_path,
        """
        import sys
        chunk = b"A" * (1 << 20)
        for _ in range(200):
            sys.stdout.buffer.write(chunk)
        sys.exit(3)
    """,
    )
    probe = (
        "import resource, subprocess, sys; "
        "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
        "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, timeout=120).stdout
    code, peak_kib = map(int, out.split())
    assert code == 3 and json.loads(term.read_text())["exit_code"] == 3
    assert peak_kib < 150 * 1024, f"launcher peaked at {peak_kib // 1024} MiB for a 200 MiB line"


def test_a_flood_of_short_lines_costs_linear_time():
    """Dropping the oldest kept line must not shift the whole tail: 3 million empty lines took the
    launcher 4.5 minutes of CPU, stalling the child on a full pipe."""
    k = OutputKeeper(head=0, tail=200_000)
    started = time.monotonic()
    for _ in range(400_000):
        k.add("\n")
    assert time.monotonic() - started < 3.0
    assert k.text() == "[...]\n" + "\n" * 200_000


def test_a_stop_before_vllm_starts_starts_nothing(tmp_path):
    """A SIGTERM while the launcher takes its first GPU snapshot: as the container's PID 1 (which
    ignores a signal it has no handler for; set here by SIG_IGN) it once went on to start vLLM, and
    the pod waited out its grace period. Now it starts nothing and exits 128 + 15."""
    mark = tmp_path / "started"
    probe = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "from vllm_autoheal import launcher\n"
        "launcher._snapshot = lambda: os.kill(os.getpid(), signal.SIGTERM)\n"
        f"sys.exit(launcher.run(['sh', '-c', 'touch {mark}'], {str(tmp_path / 'msg')!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert not mark.exists()


def test_a_launcher_that_breaks_after_starting_vllm_waits_for_it_and_starts_no_second(tmp_path, monkeypatch):
    """main() ran the command directly when run() raised, even after run() had started it: two vLLMs
    on one GPU (the second fails for want of its memory, or both do)."""
    from vllm_autoheal import launcher

    class Broken:
        suspected_at, dismissed = None, 0

        def __init__(self, url):
            pass

        def confirmed(self):
            raise RuntimeError("broken")

    monkeypatch.setattr(launcher, "DeathWatch", Broken)
    monkeypatch.setattr(launcher, "_started", [])
    starts = tmp_path / "starts"
    child = tmp_path / "child.py"
    child.write_text(f"import sys, time\nopen({str(starts)!r}, 'a').write('x')\ntime.sleep(1)\nsys.exit(3)\n")
    code = launcher.main(["--termination-path", str(tmp_path / "term"), "--", sys.executable, str(child)])
    assert code == 3 and starts.read_text() == "x"
