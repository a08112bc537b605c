"""The vLLM process `serve` runs: stopping it with its workers, reading how it ended, and the signals that
stop `serve` itself (Ctrl-C, SIGTERM, a hangup)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

STOP_GRACE_S = 30.0


def stop_group(child: subprocess.Popen) -> set[int]:
    """Stop vLLM and all its workers: SIGTERM to its process group, SIGKILL after a grace period. Returns the
    signals sent while vLLM itself still ran: how it ended may then be this stop's doing, not the kernel's."""
    sent: set[int] = set()
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        if child.poll() is not None:
            break
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            break
        sent.add(sig)
        try:
            child.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # Workers that outlived vLLM, even one that exited by itself: they hold the GPU memory the
    # next start needs, which would then fail for want of it.
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if child.poll() is None:  # (a vLLM that outlived both waits dies of this kill, serve's)
            sent.add(signal.SIGKILL)
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    return sent


def exit_status(returncode: int, sent: set[int]) -> int:
    """vLLM's exit status as the launcher reports it and the classifier reads it: death by signal N is
    128 + N (a SIGKILL, the kernel's or systemd-oomd's OOM kill, is 137). A signal serve sent itself stays
    as Popen gives it (-N): serve's own SIGKILL of a vLLM that ignored SIGTERM is no host-memory kill."""
    if returncode < 0 and -returncode not in sent:
        return 128 - returncode
    return returncode


def on_stop_signals(handler: Callable[[int, Any], None]) -> None:
    """Call `handler` on Ctrl-C, SIGTERM and a hangup (vLLM runs in a session of its own, so it hears none of
    them), but leave a signal ignored where serve was started to ignore it (`nohup serve ...`)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(timeout=10)


class Mutable:
    """vLLM's output on its way to the terminal, silenced once the result is known."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.muted = sink, False

    def write(self, data: bytes) -> None:
        if not self.muted:
            self.sink.write(data)

    def flush(self) -> None:
        if not self.muted:
            self.sink.flush()
