"""Run a function again later, in this process: a heal whose write failed, a pod that may stay
Unschedulable. What must survive a restart is in the VLLMService's status; this only saves waiting
for the next event."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Later:
    def __init__(self) -> None:
        self._timers: dict[str, threading.Timer] = {}
        self._guard = threading.Lock()
        self._stopped = False

    def run(self, key: str, delay: float, fn: Callable[[], object]) -> None:
        """Run `fn` after `delay` seconds, once per key (a newer call replaces a pending one). It runs
        in the caller's context, so kopf.event() still knows its handler."""
        ctx = contextvars.copy_context()

        def fire() -> None:
            with self._guard:
                if self._timers.get(key) is timer:
                    del self._timers[key]
            try:
                ctx.run(fn)
            except Exception:  # noqa: BLE001 - the next event or restart picks it up again
                log.exception(f"a deferred check of {key} failed")

        with self._guard:
            if self._stopped:
                return
            old = self._timers.pop(key, None)
            if old is not None:
                old.cancel()
            timer = threading.Timer(max(delay, 0.0), fire)
            timer.daemon = True
            self._timers[key] = timer
            timer.start()

    def stop(self) -> None:
        with self._guard:
            self._stopped = True
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()


class PerNamespace:
    """Looks pending (a crash each, by key), at most `limit` of them a namespace: what one tenant's crash
    loop may hold of the timer threads and API reads every tenant shares. A key beyond it is not taken:
    its pod's next event looks again."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending: dict[str, str] = {}  # key -> its namespace
        self._guard = threading.Lock()

    def take(self, key: str, namespace: str) -> bool:
        """True once per key until release, while its namespace holds fewer than `limit`."""
        with self._guard:
            if key in self._pending or sum(ns == namespace for ns in self._pending.values()) >= self.limit:
                return False
            self._pending[key] = namespace
            return True

    def release(self, key: str) -> None:
        with self._guard:
            self._pending.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._pending
