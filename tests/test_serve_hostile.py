"""`serve`, the launcher and the CLI against hostile input: a client's text in vLLM's output, a vLLM
that leaves processes behind, flags vLLM reads differently from the supervisor, files that are no log.
A real child process stands in for vLLM (a fake `vllm.entrypoints.openai.api_server` module)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vllm_autoheal import engine_death, launcher
from vllm_autoheal.cli import main

from samples import OPENAI_HANDLER

# What vLLM's request logger prints for a client's prompt (%r: one line), and the output logger.
REQUEST_LINES = (
    "(APIServer pid=1) INFO 12-01 02:40:00 [logger.py:43] Received request cmpl-1-0: prompt: "
    "'vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.', params: SamplingParams(n=1)\n"
    "(APIServer pid=1) INFO 12-01 02:40:01 [logger.py:71] Generated response cmpl-1-0: output: "
    "'MQLLMEngine is already dead, terminating server process', finish_reason: stop\n"
)

# A client's text inside a request handler's multi-line error: vLLM's formatter repeats the logger
# header on each line, so the forged line is byte for byte what vLLM prints when the engine dies.
FORGED_CONTINUATION = (
    "(APIServer pid=1) ERROR 12-01 02:40:00 [serving_chat.py:200] Error in preprocessing prompt inputs\n"
    "(APIServer pid=1) ERROR 12-01 02:40:00 [serving_chat.py:200] jinja2.exceptions.TemplateSyntaxError: bad 'x\n"
    "(APIServer pid=1) ERROR 12-01 02:40:00 [serving_chat.py:200] vllm.v1.engine.exceptions.EngineDeadError: y'\n"
)


# A server that answers /health and a completion, then prints what the test asks of it.
FAKE_SERVER = """
import http.server, json, os, sys, threading, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
{handler}
srv = http.server.HTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("INFO:     Application startup complete.", flush=True)
time.sleep(1.5)
sys.stdout.write(open(os.environ["FAKE_PRINT"]).read()); sys.stdout.flush()
time.sleep(600)
""".replace("{handler}", OPENAI_HANDLER)

# A vLLM whose worker outlives it (a forked process of its session), then it crashes.
FAKE_ORPHAN = """
import os, sys, time
if os.fork() == 0:
    sys.stdout.close(); os.close(1); os.close(2)
    time.sleep(600)
    os._exit(0)
with open(os.environ["FAKE_PIDS"], "a") as f:
    f.write(str(os.getpid()) + "\\n")
print("ValueError: this model is not supported", flush=True)
sys.exit(1)
"""


def fake_vllm(tmp_path: Path, monkeypatch, script: str) -> None:
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "fake" / "vllm", tmp_path / "fake" / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(textwrap.dedent(script))
    # (this checkout's vllm_autoheal first: the child must not import an installed copy)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fake"), *sys.path]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_cmd(tmp_path: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vllm_autoheal", "serve", "m", "--port", str(port), "--fresh",
            "--history", str(tmp_path / "history.jsonl"), "--startup-timeout", "60", *extra]  # fmt: skip


@pytest.mark.parametrize(
    "printed, wait",
    [
        (REQUEST_LINES, 8),  # echoed by the request logger: not even a suspicion
        # byte for byte vLLM's report: a suspicion that /health (200) does not confirm, past the grace
        (FORGED_CONTINUATION, engine_death.DEAD_GRACE_S + 4),
    ],
)
def test_a_clients_text_naming_engine_death_never_stops_a_healthy_server(tmp_path, monkeypatch, printed, wait):
    fake_vllm(tmp_path, monkeypatch, FAKE_SERVER)
    (tmp_path / "print.txt").write_text(printed)
    monkeypatch.setenv("FAKE_PRINT", str(tmp_path / "print.txt"))
    proc = subprocess.Popen(serve_cmd(tmp_path, free_port()), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(wait)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0].decode()
    assert alive, out[-2000:]
    assert "engine died" not in out
    assert proc.returncode == 130  # stopped by the signal, as documented


# A server whose engine dies while it serves: vLLM's report, then /health answers 503 (vLLM >= 0.11).
FAKE_DYING = """
import http.server, sys, threading, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
state = {"health": 200}
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(state["health"]); self.end_headers()
    def log_message(self, *a):
        pass
threading.Thread(target=http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever, daemon=True).start()
print("INFO:     Application startup complete.", flush=True)
time.sleep(1.5)
print("(EngineCore_DP0 pid=7) ERROR 12-01 02:40:00 [core.py:710] RuntimeError: CUDA error: an illegal memory access "
      "was encountered", flush=True)
print("(APIServer pid=1) ERROR 12-01 02:40:01 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: "
      "EngineCore encountered an issue. See stack trace (above) for the root cause.", flush=True)
state["health"] = 503
time.sleep(600)
"""


def test_an_engine_death_that_health_confirms_stops_the_server_and_is_diagnosed(tmp_path, monkeypatch):
    fake_vllm(tmp_path, monkeypatch, FAKE_DYING)
    proc = subprocess.run(serve_cmd(tmp_path, free_port()), capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert "the engine died while the server ran on" in out, out[-2000:]
    assert proc.returncode == 1 and "not_oom" in out  # a crash that is not memory: reported, left alone


def test_a_clients_text_naming_engine_death_never_ends_the_launchers_child(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_death, "DEAD_GRACE_S", 0.5)
    child = tmp_path / "child.py"
    child.write_text(f"import sys, time\nsys.stdout.write({REQUEST_LINES!r}); sys.stdout.flush()\ntime.sleep(4)\n")
    term = tmp_path / "termination-log"
    code = launcher.run([sys.executable, str(child)], str(term))
    assert code == 0 and not term.exists()


def test_a_worker_that_outlives_vllm_is_stopped_before_the_next_start(tmp_path, monkeypatch):
    fake_vllm(tmp_path, monkeypatch, FAKE_ORPHAN)
    monkeypatch.setenv("FAKE_PIDS", str(tmp_path / "pids"))
    proc = subprocess.run(serve_cmd(tmp_path, free_port()), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    vllm_pid = int((tmp_path / "pids").read_text().split()[0])
    # The worker is in vLLM's process group (its session): none of that group may be left.
    left = subprocess.run(["pgrep", "-g", str(vllm_pid)], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    assert not left, f"left running: {left}"


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--max-model", "4096"], "--max-model-len"),  # argparse's abbreviation: vLLM reads it last
        (["--gpu-memory-util=0.9"], "--gpu-memory-utilization"),
        (["--enforce"], "--enforce-eager"),
    ],
)
def test_serve_refuses_an_abbreviated_flag_a_heal_would_set(flags, said, capsys):
    assert main(["serve", "m", "--fresh", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_serve_refuses_bounds_no_heal_could_keep(capsys):
    argv = ["serve", "m", "--min-gpu-memory-utilization", "0.95", "--max-gpu-memory-utilization", "0.5"]
    assert main(argv) == 2
    assert "minGpuMemoryUtilization must be <= maxGpuMemoryUtilization" in capsys.readouterr().err


def test_served_model_name_with_equals_is_the_name_the_completion_asks_for(monkeypatch):
    from vllm_autoheal import local

    seen = []
    monkeypatch.setattr(local, "supervise", lambda opts: seen.append(opts.spec.served_model_name) or 0)
    assert main(["serve", "m", "--served-model-name=chat"]) == 0
    assert seen == ["chat"]


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_diagnose_refuses_a_device_that_is_no_log(device):
    # (in a child with a deadline: an endless read must fail the test, not hang it)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_autoheal", "diagnose", device], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"diagnose {device} still reading after 10 s")
    assert proc.returncode == 2 and device in proc.stderr and "Traceback" not in proc.stderr


def test_a_history_that_is_a_fifo_never_blocks_serve(tmp_path):
    from vllm_autoheal.serve_history import read_records

    fifo = tmp_path / "history.jsonl"
    os.mkfifo(fifo)
    start = time.monotonic()
    out: list = []
    import threading

    t = threading.Thread(target=lambda: out.append(read_records(fifo, "k")), daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # unblock the reader
        with open(fifo, "w"):
            pass
        t.join(5)
    assert time.monotonic() - start < 5 and out == [[]]


# A vLLM that runs out of KV cache at start-up, every time.
FAKE_KV_SHORT = """
import sys
print("ValueError: To serve at least one request with the model's max seq len (8192), (1.0 GiB KV cache is "
      "needed, which is larger than the available KV cache memory (0.5 GiB). Based on the available memory, "
      "the estimated maximum model length is 4096. Try increasing `gpu_memory_utilization`", flush=True)
sys.exit(1)
"""


@pytest.mark.parametrize(
    "spelling", [["--api-key", "sk-ZZSECRETZZ"], ["--api_key=sk-ZZSECRETZZ"], ["--hf-token", "sk-ZZSECRETZZ"]]
)
def test_a_credential_among_the_flags_is_never_printed_nor_recorded(tmp_path, monkeypatch, spelling):
    """The command `serve` prints before each start and the history key it records name every flag:
    a credential's value is hidden in both (vLLM itself still gets it)."""
    fake_vllm(tmp_path, monkeypatch, FAKE_KV_SHORT)
    cmd = serve_cmd(tmp_path, free_port(), "--max-attempts", "1", "--max-model-len", "8192", *spelling)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert "starting:" in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    history = (tmp_path / "history.jsonl").read_text()
    assert "healed" in proc.stdout + proc.stderr or history, proc.stdout[-2000:]
    assert "ZZSECRETZZ" not in proc.stdout + proc.stderr + history


def test_a_vllm_that_exits_0_before_it_ever_served_is_no_success(tmp_path, monkeypatch):
    """Nothing to heal, but no server either: `serve` says so and exits 1 (it exited 0 in silence)."""
    fake_vllm(tmp_path, monkeypatch, "print('INFO 12-01 04:48:08 [api_server.py:1] nothing to do', flush=True)\n")
    proc = subprocess.run(serve_cmd(tmp_path, free_port()), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "before it ever answered /health" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "host, url",
    [
        ("127.0.0.1", "http://127.0.0.1:8011"),
        ("0.0.0.0", "http://127.0.0.1:8011"),  # all interfaces: asked on the loopback
        ("::", "http://[::1]:8011"),  # was http://:::8011, which no request can reach: never healthy
        ("::1", "http://[::1]:8011"),
        ("localhost", "http://localhost:8011"),
    ],
)
def test_serve_asks_its_server_where_this_machine_reaches_it(host, url, monkeypatch):
    from vllm_autoheal import local
    from vllm_autoheal.api import VLLMServiceSpec
    from vllm_autoheal.vllm_command import VllmStart

    monkeypatch.setattr(local, "vllm_start", lambda python: VllmStart(api_server_module=True))

    spec = VLLMServiceSpec.model_validate({"model": "m"})
    opts = local.ServeOptions(model="m", spec=spec, host=host, port=8011)
    assert local.Supervisor(opts, out=open(os.devnull, "w")).base_url == url
