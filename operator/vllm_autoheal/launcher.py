"""Owns the in-pod launcher: `python -m vllm_autoheal.launcher -- vllm serve MODEL ...`.

Runs the command, passes its stdout/stderr through unchanged, forwards signals and
exits with the child's code. When the child fails it writes one JSON document of at
most 4096 bytes to the termination-message file (`/dev/termination-log`, or
$AUTOHEAL_TERMINATION_PATH): the diagnosis and a GPU snapshot taken at start and at
failure. Kubernetes keeps at most the last 2 KiB of the log otherwise, which never
holds the root cause of a vLLM crash (it is printed minutes earlier, above the shutdown noise).

It also ends a child whose engine died while its HTTP server lives on (EngineDeadError after
a runtime OOM), so the pod restarts and the operator sees it: once the child's own /health
confirms what its output reported (engine_death.py: a client's text can print the same line).

Standard library only (it runs with the vLLM image's own Python), and it must never
make things worse: if anything in it fails, vLLM still runs and its exit code stands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from .engine_death import DeathWatch, engine_dead, health_url

DEFAULT_TERMINATION_PATH = "/dev/termination-log"
MESSAGE_LIMIT = 4096
HEAD_BYTES = 64 * 1024
TAIL_BYTES = 512 * 1024
# The most read as one piece: output with no newline (a progress bar, a binary dump) would
# otherwise be read whole into memory, in the container's own memory limit.
CHUNK_BYTES = 64 * 1024
STOP_GRACE_S = 30.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class OutputKeeper:
    """The first HEAD_BYTES and last TAIL_BYTES of a process's output, in whole lines: bounded,
    whatever it prints.

    A line longer than CHUNK_BYTES arrives in pieces; only its first is kept, ended there. A later
    piece opens no line of the kept text: it starts wherever the line's 64 KiB fell, often inside a
    logged prompt or model output, whose words a client chooses (a forged engine error placed at each
    64 KiB of a long response was read as the engine's, and healed). Pieces are told apart by stream,
    since stdout's and stderr's pumps add to one keeper as they read."""

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        self._head_limit, self._tail_limit = head, tail
        self._head: list[str] = []
        self._head_size = 0
        self._tail: deque[str] = deque()  # popleft is O(1): a flood of short lines stays linear
        self._tail_size = 0
        self.dropped = False
        self._inside: set[str] = set()  # streams whose last piece ended inside a line
        self._lock = threading.Lock()

    def add(self, piece: str, stream: str = "") -> bool:
        """Keep `piece` of `stream`'s output, unless it goes on a line already begun; returns whether
        it was kept (the first piece of its line)."""
        with self._lock:
            continued = stream in self._inside
            if piece.endswith("\n"):
                self._inside.discard(stream)
            else:
                self._inside.add(stream)
            if continued:
                return False
            line = piece if piece.endswith("\n") else piece + "\n"
            if self._head_size < self._head_limit:
                self._head.append(line)
                self._head_size += len(line)
                return True
            self._tail.append(line)
            self._tail_size += len(line)
            while self._tail_size > self._tail_limit and len(self._tail) > 1:
                self._tail_size -= len(self._tail.popleft())
                self.dropped = True
            return True

    def text(self) -> str:
        with self._lock:
            gap = "[...]\n" if self.dropped else ""
            return "".join(self._head) + gap + "".join(self._tail)


def pump(
    source: IO[bytes],
    sink: IO[bytes],
    keeper: OutputKeeper,
    on_line: Callable[[str], None] | None = None,
    stream: str = "",
) -> None:
    """Copy a child's stream byte for byte, keeping a decoded copy of each line (of a line longer
    than CHUNK_BYTES, its first piece: OutputKeeper says why); `on_line` sees what is kept."""
    for raw in iter(lambda: source.readline(CHUNK_BYTES), b""):
        try:
            sink.write(raw)
            sink.flush()
        except (OSError, ValueError):
            pass  # our own stdout closed: keep draining so the child never blocks
        line = raw.decode("utf-8", "replace")
        if keeper.add(line, stream) and on_line is not None:
            on_line(line)


def termination_message(
    diagnosis: dict,
    exit_code: int,
    gpu_start: dict | None,
    gpu_failure: dict | None,
    note: str | None = None,
    limit: int = MESSAGE_LIMIT,
) -> str:
    """One JSON document of at most `limit` bytes; the cause and numbers survive any truncation."""
    keep = ("cause", "phase", "subtype", "confidence", "source", "numbers", "evidence", "explanation")
    diag: dict[str, Any] = {k: diagnosis.get(k) for k in keep if diagnosis.get(k) not in (None, "", [], {})}
    doc: dict = {"autoheal": 1, "exit_code": exit_code, "diagnosis": diag}
    if note:
        doc["note"] = note
    if gpu_start:
        doc["gpu_start"] = gpu_start
    if gpu_failure:
        doc["gpu_failure"] = gpu_failure

    def size() -> int:
        return len(json.dumps(doc, separators=(",", ":")).encode())

    for width in (400, 200, 120):
        if size() <= limit:
            break
        diag["evidence"] = [e[:width] for e in diag.get("evidence", [])]
    for key in ("explanation", "gpu_start", "evidence", "gpu_failure", "note"):
        if size() <= limit:
            break
        diag.pop(key, None)
        doc.pop(key, None)
    while size() > limit and diag.get("numbers"):
        diag["numbers"].popitem()
    return json.dumps(doc, separators=(",", ":"))


def _snapshot():
    try:
        from .gpu_probe import snapshot

        return snapshot()
    except Exception:  # noqa: BLE001 - the probe is a bonus, never a reason to fail
        return None


def _oom_kills() -> int | None:
    try:
        from .cgroups import oom_kills

        return oom_kills()
    except Exception:  # noqa: BLE001
        return None


def _killed_since(before: int | None) -> bool:
    try:
        from .cgroups import killed_since

        return killed_since(before)
    except Exception:  # noqa: BLE001
        return False


def _compact(snap) -> dict | None:
    try:
        from .gpu_probe import compact

        return compact(snap) if snap is not None else None
    except Exception:  # noqa: BLE001
        return None


def _crash_summary(text: str, exit_code: int, ready: bool, gpu_start, oom_killed: bool) -> dict:
    """The start snapshot, taken before vLLM ran, shows what other processes held."""
    try:
        from .diagnosis import Signals, classify

        gpu = gpu_start if gpu_start is not None and not gpu_start.error else None
        return classify(
            Signals(
                log=text, exit_code=exit_code, ready_before=ready, gpu=gpu, reason="OOMKilled" if oom_killed else None
            )
        ).to_dict()
    except Exception as exc:  # noqa: BLE001
        return {"cause": "unknown", "explanation": f"launcher could not diagnose: {exc}"}


def run(argv: list[str], termination_path: str | None = None) -> int:
    termination_path = termination_path or os.environ.get("AUTOHEAL_TERMINATION_PATH", DEFAULT_TERMINATION_PATH)
    state: dict[str, Any] = {"stopped_by": None, "ready": False, "child": None}
    death = DeathWatch(health_url(argv))

    def forward(signum: int, _frame: object) -> None:
        state["stopped_by"] = signum
        try:
            if state["child"] is not None:
                state["child"].send_signal(signum)
        except OSError:
            pass

    # Before anything that takes time (the GPU snapshot): as the container's PID 1 the launcher
    # ignores a signal it has no handler for, and the pod would wait out its grace period.
    for sig in FORWARDED:
        try:
            signal.signal(sig, forward)
        except (OSError, ValueError):
            pass
    gpu_start = _snapshot()
    kills_before = _oom_kills()
    _clear(termination_path)  # the file is the launcher's: nothing the child leaves there may stand
    if state["stopped_by"] is not None:  # told to stop before vLLM started: start nothing
        return 128 + state["stopped_by"]
    keeper = OutputKeeper()
    child = state["child"] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _started.append(child)
    if state["stopped_by"] is not None:  # (one that came while it was being started)
        child.send_signal(state["stopped_by"])

    def watch(line: str) -> None:
        if "Application startup complete" in line or "Uvicorn running on" in line:
            state["ready"] = True
        if engine_dead(line):  # (every report: one while a suspicion is open must not be lost)
            death.suspect()

    threads = [
        threading.Thread(target=pump, args=(child.stdout, sys.stdout.buffer, keeper, watch, "stdout"), daemon=True),
        threading.Thread(target=pump, args=(child.stderr, sys.stderr.buffer, keeper, watch, "stderr"), daemon=True),
    ]
    for t in threads:
        t.start()
    ended_dead_engine = False
    dismissed = 0
    while child.poll() is None:
        if not ended_dead_engine and death.confirmed():
            # The engine is gone but the API server lives on: end it.
            ended_dead_engine = True
            child.terminate()
            try:
                child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
        if death.dismissed > dismissed:  # (the line is not quoted: it may be a client's text)
            dismissed = death.dismissed
            print("vllm-autoheal launcher: a line reported the engine dead but /health did not confirm it; "
                  "the server keeps running", file=sys.stderr)  # fmt: skip
        time.sleep(0.2)
    for t in threads:
        t.join(timeout=5)
    code = child.returncode
    exit_code = 128 - code if code < 0 else code
    if ended_dead_engine and exit_code == 0:
        exit_code = 1  # a clean exit would read as "Completed", hiding the crash
    if exit_code != 0 or ended_dead_engine:
        # Always our own message on a failure, whatever signals arrived: a child may have written
        # the file itself and then signalled us, hoping we would leave its forgery in place.
        try:
            note = (
                "engine died (its /health answered a server error) while the server ran on; the launcher ended it"
                if ended_dead_engine
                else None
            )
            if state["stopped_by"] is not None and not ended_dead_engine:
                note = f"the launcher received signal {state['stopped_by']} and forwarded it"
            oom_killed = _killed_since(kills_before)
            text = termination_message(
                _crash_summary(keeper.text(), exit_code, bool(state["ready"]), gpu_start, oom_killed),
                exit_code,
                _compact(gpu_start),
                _compact(_snapshot()),
                note,
            )
            with open(termination_path, "w", encoding="utf-8") as f:
                f.write(text)
        except Exception as exc:  # noqa: BLE001 - never worse than no launcher
            print(f"vllm-autoheal launcher: could not write {termination_path}: {exc}", file=sys.stderr)
            _clear(termination_path)
    else:
        _clear(termination_path)
    return exit_code


# The child run() started, for main(): a launcher that breaks after starting vLLM waits for that vLLM
# rather than start a second one beside it.
_started: list[subprocess.Popen] = []


def _clear(path: str) -> None:
    """Empty the file if it is there (in a pod it is a mounted file that cannot be removed)."""
    try:
        if os.path.exists(path):
            with open(path, "w", encoding="utf-8"):
                pass
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    termination_path = None
    if args[:1] == ["--termination-path"] and len(args) >= 2:
        termination_path, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m vllm_autoheal.launcher [--termination-path P] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        return run(args, termination_path)
    except FileNotFoundError as exc:
        print(f"vllm-autoheal launcher: {exc}", file=sys.stderr)
        return 127
    except Exception as exc:  # noqa: BLE001 - the launcher itself broke: run vLLM without it
        if _started:  # (vLLM runs already: its exit code stands, and no second one starts)
            print(f"vllm-autoheal launcher failed ({exc}); waiting for the command it started", file=sys.stderr)
            code = _started[-1].wait()
            return 128 - code if code < 0 else code
        print(f"vllm-autoheal launcher failed ({exc}); running the command directly", file=sys.stderr)
        os.execvp(args[0], args)
        return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
