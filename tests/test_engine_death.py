"""Ending a server whose engine died (engine_death.py): a line of vLLM's output is a suspicion, the
server's own /health on 127.0.0.1 confirms it. Real HTTP servers on this machine answer /health;
real child processes stand in for vLLM under the real launcher."""

from __future__ import annotations

import http.server
import json
import signal
import socket
import sys
import textwrap
import threading
import time

import pytest

from test_serve_hostile import FORGED_CONTINUATION, free_port
from vllm_autoheal import engine_death, launcher
from vllm_autoheal.engine_death import DeathWatch, health_status, health_url

REAL_DEATH = (
    "(EngineCore_DP0 pid=7) ERROR 12-01 02:40:00 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.10 GiB is free.\n"
    "(APIServer pid=1) ERROR 12-01 02:40:01 [async_llm.py:480] AsyncLLM output_handler failed.\n"
    "(APIServer pid=1) ERROR 12-01 02:40:01 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause.\n"
)


@pytest.mark.parametrize(
    "argv, url",
    [
        # what the operator renders: its own --host and --port last
        (["vllm", "serve", "m", "--max-model-len", "4096", "--host", "0.0.0.0", "--port", "8080"],
         "http://127.0.0.1:8080/health"),
        (["vllm", "serve", "m"], "http://127.0.0.1:8000/health"),  # vLLM's default port
        (["vllm", "serve", "m", "--port=9000"], "http://127.0.0.1:9000/health"),
        (["vllm", "serve", "m", "--port", "1", "--port", "9001"], "http://127.0.0.1:9001/health"),  # the last wins
        (["vllm", "serve", "m", "--ssl-keyfile", "k.pem", "--port", "8443"], "https://127.0.0.1:8443/health"),
        (["vllm", "serve", "m", "--host", "10.0.0.5"], "http://127.0.0.1:8000/health"),  # never another address
        (["vllm", "serve", "m", "--uds", "/tmp/v.sock"], None),
        (["vllm", "serve", "m", "--port", "http"], None),
        (["vllm", "serve", "m", "--port", "70000"], None),
        (["vllm", "serve", "m", "--port"], None),
        # as vLLM's own parser reads them (its underscores for dashes, argparse's abbreviations, int()):
        # checked against vLLM 0.32's make_arg_parser
        (["vllm", "serve", "m", "--ssl_keyfile", "k", "--ssl_certfile", "c", "--port", "9002"],
         "https://127.0.0.1:9002/health"),
        (["vllm", "serve", "m", "--ssl-k", "k"], "https://127.0.0.1:8000/health"),
        (["vllm", "serve", "m", "--ssl-certfile", "c"], "https://127.0.0.1:8000/health"),
        (["vllm", "serve", "m", "--ssl-keyfile", "k", "--ssl-keyfile="], "http://127.0.0.1:8000/health"),
        (["vllm", "serve", "m", "--por", "9001"], "http://127.0.0.1:9001/health"),
        (["vllm", "serve", "m", "--port", "+9008"], "http://127.0.0.1:9008/health"),
        (["vllm", "serve", "m", "--port", "9_009"], "http://127.0.0.1:9009/health"),
        (["vllm", "serve", "m", "--ud", "/tmp/v.sock"], None),
        (["vllm", "serve", "m", "--port", "\u00b2"], None),  # isdigit() but no int: vLLM refuses it too
    ],
)  # fmt: skip
def test_health_is_asked_where_the_command_serves_it_and_only_on_this_machine(argv, url):
    assert health_url(argv) == url


class Health:
    """A real HTTP server on 127.0.0.1 whose /health answers `status` (changeable while it runs)."""

    def __init__(self, status: int, location: str | None = None) -> None:
        self.status, self.asked = status, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.asked += 1
                self.send_response(outer.status)
                if location:
                    self.send_header("Location", location)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def health():
    made: list[Health] = []

    def make(status: int, location: str | None = None) -> Health:
        made.append(Health(status, location))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_health_status_is_the_servers_own_answer_never_a_proxys_nor_a_redirects(health, monkeypatch):
    # A proxy the environment names (nothing listens there): the server on 127.0.0.1 is still asked.
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    assert health_status(health(200).url) == 200
    assert health_status(health(503).url) == 503
    elsewhere = health(200)
    redirect = health(302, location=elsewhere.url)
    assert health_status(redirect.url) == 302 and elsewhere.asked == 0
    assert health_status(f"http://127.0.0.1:{free_port()}/health") is None


def test_a_report_of_death_is_confirmed_only_by_a_server_error_from_health(health, monkeypatch):
    monkeypatch.setattr(engine_death, "DEAD_GRACE_S", 0.0)
    monkeypatch.setattr(engine_death, "PROBE_EVERY_S", 0.0)
    alive, dead = health(200), health(503)
    watch = DeathWatch(alive.url)
    assert not watch.confirmed() and alive.asked == 0  # no report: /health is not even asked
    watch.suspect()
    assert not watch.confirmed() and alive.asked == 1
    watch = DeathWatch(dead.url)
    watch.suspect()
    assert watch.confirmed()
    assert not DeathWatch(None).confirmed()


def test_a_report_that_health_never_confirms_is_dismissed_and_a_later_one_is_heard(health, monkeypatch):
    monkeypatch.setattr(engine_death, "DEAD_GRACE_S", 0.0)
    monkeypatch.setattr(engine_death, "PROBE_EVERY_S", 0.0)
    monkeypatch.setattr(engine_death, "CONFIRM_WINDOW_S", 0.0)
    server = health(200)
    watch = DeathWatch(server.url)
    watch.suspect()
    assert not watch.confirmed() and watch.dismissed == 1 and watch.suspected_at is None
    server.status = 500  # vLLM before 0.11: the dead engine's error through the generic handler
    watch.suspect()
    assert watch.confirmed()


# A vLLM stand-in: /health answers as the test says, on the --port of its command line.
CHILD = """
import http.server, sys, threading, time
args = sys.argv[1:]
port, status = int(args[args.index("--port") + 1]), int(args[args.index("--health") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(status); self.end_headers()
    def log_message(self, *a):
        pass
if status:
    threading.Thread(target=http.server.HTTPServer(("127.0.0.1", port), H).serve_forever, daemon=True).start()
print("INFO:     Application startup complete.", flush=True)
sys.stdout.write(open(args[0]).read()); sys.stdout.flush()
time.sleep(float(args[args.index("--sleep") + 1]))
"""


def run_launcher(tmp_path, monkeypatch, printed: str, status: int, sleep: float = 4.0):
    monkeypatch.setattr(engine_death, "DEAD_GRACE_S", 0.5)
    monkeypatch.setattr(engine_death, "CONFIRM_WINDOW_S", 1.5)
    child, text = tmp_path / "child.py", tmp_path / "printed.txt"
    child.write_text(textwrap.dedent(CHILD))
    text.write_text(printed)
    term = tmp_path / "termination-log"
    argv = [sys.executable, str(child), str(text), "--health", str(status), "--sleep", str(sleep)]
    code = launcher.run([*argv, "--port", str(free_port())], str(term))
    return code, term


def test_the_launcher_ends_a_server_whose_health_confirms_its_engine_died(tmp_path, monkeypatch):
    started = time.monotonic()
    code, term = run_launcher(tmp_path, monkeypatch, REAL_DEATH, 503, sleep=120)
    doc = json.loads(term.read_text())
    assert code == 128 + signal.SIGTERM and time.monotonic() - started < 30  # ended, not waited out
    assert doc["diagnosis"]["cause"] == "runtime_oom" and "ended it" in doc["note"]


@pytest.mark.parametrize(
    "printed, status",
    [
        (FORGED_CONTINUATION, 200),  # a client's text inside a request's error: the engine answers
        (REAL_DEATH, 200),  # what vLLM would print, but its engine still answers: not ended either
        (FORGED_CONTINUATION, 0),  # nothing answers on 127.0.0.1 (another address): never ended here
    ],
)
def test_the_launcher_leaves_running_a_server_whose_health_does_not_confirm(
    tmp_path, monkeypatch, capfd, printed, status
):
    code, term = run_launcher(tmp_path, monkeypatch, printed, status)
    assert code == 0 and not term.exists()
    assert "did not confirm" in capfd.readouterr().err


def test_something_that_is_no_http_server_answering_health_is_no_answer(monkeypatch):
    """A listener that answers no HTTP (BadStatusLine is no OSError) must not break the watch: the
    launcher would fall back to exec'ing vLLM a second time while the first still runs."""
    monkeypatch.setattr(engine_death, "DEAD_GRACE_S", 0.0)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def garbage() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(4096)
            conn.sendall(b"\x15\x03\x03\x00\x02\x02\x46 no http\r\n\r\n")
            conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/health"
    try:
        assert health_status(url) is None
        watch = DeathWatch(url)
        watch.suspect()
        assert not watch.confirmed()
    finally:
        listener.close()


def test_a_real_report_while_a_forged_one_is_open_is_not_lost_when_that_one_is_dismissed(monkeypatch):
    """A client's forged line opens a suspicion; vLLM's real report comes while /health is being asked
    for the last time in its window (answering 200: asked before the engine died). The real report
    must keep the suspicion open, so the next question (503) ends the server."""
    monkeypatch.setattr(engine_death, "DEAD_GRACE_S", 0.0)
    monkeypatch.setattr(engine_death, "PROBE_EVERY_S", 0.0)
    monkeypatch.setattr(engine_death, "CONFIRM_WINDOW_S", 0.05)
    answers = [200, 503]

    def probe(_url: str) -> int:
        if answers[0] == 200:
            watch.suspect()  # vLLM's own report, read by the pump thread while /health is asked
        return answers.pop(0)

    watch = DeathWatch("http://127.0.0.1:1/health", probe)
    watch.suspect()  # the forged line
    time.sleep(0.1)  # its window has passed
    assert not watch.confirmed() and watch.dismissed == 0 and watch.suspected_at is not None
    assert watch.confirmed()


def test_a_probe_that_raises_what_no_one_foresaw_is_no_answer(monkeypatch):
    """The launcher's loop calls confirmed(): an exception out of it would end run(), and main()'s
    fallback would then start vLLM a second time beside the first."""
    monkeypatch.setattr(engine_death, "DEAD_GRACE_S", 0.0)

    def probe(url):
        raise RuntimeError("an answer no one foresaw")

    watch = DeathWatch("http://127.0.0.1:1/health", probe=probe)
    watch.suspect()
    assert watch.confirmed() is False
