"""Hostile review of `vllm-autoheal serve`: flags in spellings vLLM accepts, a server that needs a key
or TLS, a port another server holds, and a terminal that hangs up. Each test asserts the right behaviour
and is a strict xfail until the defect is fixed. A real child process stands in for vLLM (a fake
`vllm.entrypoints.openai.api_server` module), as in test_serve_hostile.py."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_serve_hostile import fake_vllm, free_port
from vllm_autoheal import local
from vllm_autoheal.cli import main
from vllm_autoheal.vllm_command import VllmStart


def serve_cmd(tmp_path: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vllm_autoheal", "serve", "m", "--port", str(port), "--fresh",
            "--history", str(tmp_path / "history.jsonl"), *extra]  # fmt: skip


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # (a zombie is gone for the GPU: read its state)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def parsed(monkeypatch, argv: list[str]) -> tuple[int, list]:
    seen: list = []
    monkeypatch.setattr(local, "supervise", lambda opts: seen.append(opts) or 0)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, seen


# --- flags as vLLM spells them ------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, field, value",
    [
        (["--trust-remote-code", "-tp", "2"], "tensor_parallel_size", 2),
        (["--enable-prefix-caching", "-q", "awq"], "quantization", "awq"),
    ],
)
def test_a_short_alias_after_an_unknown_switch_is_read_as_its_flag(monkeypatch, capsys, flags, field, value):
    """`vllm serve m --trust-remote-code -tp 2` is a valid vLLM command line (the switch takes no value),
    and `serve m -tp 2 --trust-remote-code` is accepted: the order must not turn it into exit 2 saying
    "'-tp' is read by vLLM as --tensor-parallel-size: spell it --tensor-parallel-size"."""
    code, seen = parsed(monkeypatch, ["serve", "m", *flags])
    assert code == 0, capsys.readouterr().err
    assert getattr(seen[0].spec.engine, field) == value


def test_a_config_file_is_refused_like_the_crd_refuses_it(tmp_path, monkeypatch, capsys):
    """serve always passes --gpu-memory-utilization, --tensor-parallel-size and --pipeline-parallel-size
    on the command line, which vLLM reads over a --config file's: a file's `tensor-parallel-size: 4` runs
    at TP 1 (an OOM serve then "heals"), and the file's flags are hidden from the planner. The CRD refuses
    --config in extraArgs for this reason; serve must too (exit 2, naming it), or read the file."""
    config = tmp_path / "vllm.yaml"
    config.write_text("tensor-parallel-size: 4\ngpu-memory-utilization: 0.7\nmax-model-len: 4096\n")
    monkeypatch.setattr(local, "vllm_start", lambda python: VllmStart(api_server_module=True))
    code, seen = parsed(monkeypatch, ["serve", "m", "--config", str(config)])
    err = capsys.readouterr().err
    if seen:  # what vLLM would run: the file's TP 4 and 0.7 are overridden by the typed flags serve passes
        cmd = local.Supervisor(seen[0], out=open(os.devnull, "w")).command(seen[0].spec.engine)
        assert code == 2, f"accepted and would run: {cmd}"
    assert code == 2 and "--config" in err and "Traceback" not in err


# --- a server that needs a key -------------------------------------------------------------------

# A server that answers /health without a key (as vLLM does) and /v1/* only with it (as vLLM does).
FAKE_KEYED = """
import http.server, json, os, sys, threading, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
key = args[args.index("--api-key") + 1] if "--api-key" in args else os.environ.get("VLLM_API_KEY")
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if key and self.headers.get("Authorization") != "Bearer " + key:
            self.send_response(401); self.end_headers(); self.wfile.write(b'{"error":"Unauthorized"}'); return
        body = json.dumps({"choices": [{"text": " world"}]}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.mark.parametrize("how", ["flag", "env"])
def test_once_with_an_api_key_asks_with_the_key(tmp_path, monkeypatch, how):
    """`serve --once --api-key K` (or VLLM_API_KEY=K, which vLLM reads the same) starts a server that
    answers /v1/completions only with `Authorization: Bearer K`: the completion --once asks for must
    carry it, or every such run reports "the completion failed" and exits 1. The key is never printed."""
    fake_vllm(tmp_path, monkeypatch, FAKE_KEYED)
    extra = ["--once", "--startup-timeout", "15"]
    if how == "flag":
        extra += ["--api-key", "sk-ZZSECRETZZ"]
    else:
        monkeypatch.setenv("VLLM_API_KEY", "sk-ZZSECRETZZ")
    proc = subprocess.run(serve_cmd(tmp_path, free_port(), *extra), capture_output=True, text=True, timeout=60)
    said = proc.stdout + proc.stderr
    assert "ZZSECRETZZ" not in said
    assert proc.returncode == 0, said[-2000:]


# --- TLS --------------------------------------------------------------------------------------------

FAKE_TLS = """
import http.server, json, ssl, sys
args = sys.argv[1:]
def flag(name):
    return args[args.index(name) + 1]
port = int(flag("--port"))
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"choices": [{"text": " world"}]}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(flag("--ssl-certfile"), flag("--ssl-keyfile"))
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("INFO:     Application startup complete.", flush=True)
srv.serve_forever()
"""


def test_a_server_started_with_tls_is_asked_over_tls(tmp_path, monkeypatch):
    """vLLM serves HTTPS with --ssl-keyfile/--ssl-certfile; serve polls http://HOST:PORT/health, which a
    TLS server never answers, so a working server is stopped after --startup-timeout (30 minutes by
    default) and serve exits 1. It must ask over https (the health check already can)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    fake_vllm(tmp_path, monkeypatch, FAKE_TLS)
    extra = ["--once", "--startup-timeout", "10", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert)]
    proc = subprocess.run(serve_cmd(tmp_path, free_port(), *extra), capture_output=True, text=True, timeout=60)
    said = proc.stdout + proc.stderr
    assert "not healthy after" not in said, said[-2000:]
    assert proc.returncode == 0, said[-2000:]


# --- a port another server holds ------------------------------------------------------------------

# vLLM that cannot bind its port (another server has it): what uvicorn prints, then exit 1, after a while.
FAKE_PORT_TAKEN = """
import sys, time
port = sys.argv[sys.argv.index("--port") + 1]
time.sleep(3)
print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use", flush=True)
sys.exit(1)
"""


class _Other(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"choices": [{"text": " from another server"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_a_port_another_server_answers_on_is_not_this_servers_health(tmp_path, monkeypatch):
    """A second `serve` on a port in use (an earlier `serve` still running in another terminal): the
    other server answers /health 200 at once, so serve says "healthy", records the flags as healthy,
    runs its --once completion against the other server and exits 0, while its own vLLM never served
    (it fails to bind and exits 1). It must not claim another process's server as its own."""
    other = http.server.HTTPServer(("127.0.0.1", 0), _Other)
    port = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        fake_vllm(tmp_path, monkeypatch, FAKE_PORT_TAKEN)
        extra = ["--once", "--startup-timeout", "15"]
        proc = subprocess.run(serve_cmd(tmp_path, port, *extra), capture_output=True, text=True, timeout=60)
    finally:
        other.shutdown()
        other.server_close()
    said = proc.stdout + proc.stderr
    history = tmp_path / "history.jsonl"
    events = [json.loads(line).get("event") for line in history.read_text().splitlines()] if history.exists() else []
    assert "healthy" not in events, said[-2000:]
    assert proc.returncode != 0, said[-2000:]


# --- the terminal hangs up ------------------------------------------------------------------------

FAKE_SLOW_START = """
import os, sys, time
with open(os.environ["FAKE_PIDS"], "a") as f:
    f.write(str(os.getpid()) + "\\n")
print("INFO 12-01 02:40:00 [api_server.py:1] vLLM API server version 0.25.0", flush=True)
time.sleep(600)
"""


def serve_waiting(tmp_path: Path, monkeypatch, **popen) -> tuple[subprocess.Popen, Path]:
    """`serve` over a vLLM that never gets ready, and the file its vLLM's pid is written to."""
    fake_vllm(tmp_path, monkeypatch, FAKE_SLOW_START)
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    cmd = serve_cmd(tmp_path, free_port(), "--startup-timeout", "600")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen), pids


def test_a_hangup_stops_vllm_too(tmp_path, monkeypatch):
    """vLLM runs in a session of its own (start_new_session), so the terminal's SIGHUP reaches only
    serve, which has no handler for it and dies without its `finally: stop()`: vLLM (and its GPU
    memory) is orphaned. A hangup must stop vLLM and its workers as SIGTERM does."""
    sup, pids = serve_waiting(tmp_path, monkeypatch)
    vllm_pid = None
    try:
        wait_for(lambda: pids.exists() and pids.read_text().strip(), 20, "vLLM started")
        vllm_pid = int(pids.read_text().split()[0])
        sup.send_signal(signal.SIGHUP)
        sup.wait(15)
        deadline = time.monotonic() + 12
        while alive(vllm_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(vllm_pid), f"vLLM {vllm_pid} left running after serve exited {sup.returncode}"
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        if vllm_pid is not None and alive(vllm_pid):
            os.killpg(vllm_pid, signal.SIGKILL)  # (vLLM leads its own session and group)


# --- its own output gone ------------------------------------------------------------------------------

# A vLLM that runs out of KV cache at start-up, every time.
FAKE_KV_SHORT = """
import sys
print("ValueError: To serve at least one request with the model's max seq len (8192), (1.0 GiB KV cache is "
      "needed, which is larger than the available KV cache memory (0.5 GiB). Based on the available memory, "
      "the estimated maximum model length is 4096. Try increasing `gpu_memory_utilization`", flush=True)
sys.exit(1)
"""


def test_a_closed_output_pipe_neither_ends_supervision_nor_reads_as_success(tmp_path, monkeypatch):
    """`vllm-autoheal serve ... | tee serve.log` where the reader is gone: serve's next line of its own
    (`starting:`, `healed ...`) raises BrokenPipeError, which main() turns into exit 0: here vLLM is never
    started and serve exits 0 in silence; mid-run, a crash is neither healed nor reported and the exit is
    0. The pumps already ignore a closed output; serve's own lines must too (it heals, then gives up: 1)."""
    fake_vllm(tmp_path, monkeypatch, FAKE_KV_SHORT)
    cmd = serve_cmd(tmp_path, free_port(), "--startup-timeout", "15", "--max-model-len", "8192", "--max-attempts", "1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader of its output is gone
    try:
        err = proc.stderr.read().decode(errors="replace")
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    history = tmp_path / "history.jsonl"
    events = [json.loads(line).get("event") for line in history.read_text().splitlines()] if history.exists() else []
    assert events == ["heal", "gave_up"], (code, events, err[-1500:])
    assert code == 1, err[-1500:]
