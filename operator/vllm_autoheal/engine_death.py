"""Owns the decision to end a vLLM server whose engine died while its HTTP server lives on.

A line of vLLM's output that reports the engine dead is only a suspicion: a request handler's
multi-line error repeats vLLM's logger header on every line, so a client's text inside it (a
template, a prompt) can print a line byte for byte like vLLM's own report. Ending the server on
such a line would let any client take it down. The death is confirmed out of band by asking
the server's own /health on 127.0.0.1, which vLLM answers with 503 (500 before 0.11) once its
engine is dead, and which no client's text can change. A server that is never asked (a Unix
socket, another address) is never ended here: the pod's liveness probe still is the backstop.

Standard library only: the in-pod launcher imports it with the vLLM image's own Python.
"""

from __future__ import annotations

import http.client
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

ENGINE_DEAD = re.compile(r"EngineDeadError|AsyncEngineDeadError|MQLLMEngine is already dead|Engine loop has died")
# vLLM's own words for it open the message (after an exception's name, for the last two).
_DEAD_OPENING = re.compile(r"(?:[\w.]{0,200}: )?(?:MQLLMEngine is already dead|Engine loop has died)")
# vLLM since 0.5.3 ends its server itself on engine death: it is given this long to do so.
DEAD_GRACE_S = 10.0
# How long /health is asked after a report of death; a server that answers 200 all along keeps running.
CONFIRM_WINDOW_S = 60.0
PROBE_EVERY_S = 1.0
HEALTH_TIMEOUT_S = 2.0
DEFAULT_PORT = 8000  # vLLM's


def engine_dead(line: str) -> bool:
    """vLLM itself reports its engine dead on this line: the report opens the line's message (after
    vLLM's prefixes and logger header), on a line that is not a client's text. A prompt or output that
    vLLM's request logger echoes, or an access-log path, may name EngineDeadError anywhere."""
    if not ENGINE_DEAD.search(line[:4096]):  # (the cheap test: almost every line stops here)
        return False
    try:
        from .diagnosis.origin import ENGINE, REQUEST
        from .diagnosis.quoted import first_named_exception
        from .diagnosis.scan import make_line

        parsed = make_line(0, line)
        if parsed is None or parsed.origin not in (ENGINE, REQUEST):
            return False
        named = first_named_exception(parsed.text) or ""
        return named.endswith("EngineDeadError") or _DEAD_OPENING.match(parsed.text) is not None
    except Exception:  # noqa: BLE001 - never a reason to end vLLM, nor to stop reading its output
        return False


def _spells(flag: str, name: str, shortest: str) -> bool:
    """`flag` names vLLM's `name` as its parser reads it: underscores for dashes, or a prefix no
    other flag of vLLM's shares (argparse's abbreviations; `shortest` is the shortest such)."""
    flag = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
    return flag.startswith(shortest) and name.startswith(flag)


def health_url(argv: Sequence[str]) -> str | None:
    """Where the server started by `argv` answers /health on this machine, as vLLM's parser reads
    its flags (the last --port wins; 8000 when none; https with --ssl-keyfile or --ssl-certfile;
    `--ssl_keyfile` and `--por` as vLLM reads them); None where it cannot be asked here (a Unix
    socket, a port that does not parse)."""
    port, tls = DEFAULT_PORT, {"key": "", "cert": ""}
    for i, token in enumerate(argv):
        if token == "--":
            break
        flag, eq, value = token.partition("=")
        raw = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if _spells(flag, "--uds", "--ud"):
            return None
        if _spells(flag, "--ssl-keyfile", "--ssl-k"):
            tls["key"] = raw  # (the last wins; an empty one is none, as uvicorn reads it)
        if _spells(flag, "--ssl-certfile", "--ssl-certf"):
            tls["cert"] = raw
        if _spells(flag, "--port", "--por"):
            try:
                port = int(raw)  # as argparse's type=int: " 9000", "+9000" and "9_000" too
            except ValueError:
                return None
            if not 0 < port < 65536:
                return None
    return f"{'https' if any(tls.values()) else 'http'}://127.0.0.1:{port}/health"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003 - urllib's signature
        return None  # a redirect is an answer of its own (3xx), never followed elsewhere


def direct_opener(tls: bool = False) -> urllib.request.OpenerDirector:
    """Asks the local server itself: never through a proxy the environment names (http_proxy does
    not spare 127.0.0.1), never following a redirect elsewhere."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({}), _NoRedirect()]
    if tls:  # the server's own certificate, on this machine: nothing to verify it against
        handlers.append(urllib.request.HTTPSHandler(context=ssl._create_unverified_context()))  # noqa: S323
    return urllib.request.build_opener(*handlers)


def health_status(url: str, timeout: float = HEALTH_TIMEOUT_S) -> int | None:
    """The HTTP status the server answers `url` with; None when nothing answers."""
    try:
        with direct_opener(url.startswith("https:")).open(url, timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (OSError, ValueError, http.client.HTTPException):
        # (HTTPException: something that is no HTTP server answers there, BadStatusLine: never a
        # reason to break the launcher, which would then start vLLM a second time)
        return None


class DeathWatch:
    """A report of the engine's death (`suspect`, from any thread, on every line that reports it),
    confirmed by /health (`confirmed`, from the supervising loop) after a grace, counted from the
    first report, in which vLLM may end its server itself. A suspicion is dismissed only once no
    report came for the whole window: a client's forged lines may keep one open (it still takes a
    server error from /health to end the server), but cannot close it on a real report that came
    while it was open (vLLM reports its engine's death once)."""

    def __init__(self, url: str | None, probe: Callable[[str], int | None] = health_status) -> None:
        self.url = url
        self._probe = probe
        self._lock = threading.Lock()
        self.suspected_at: float | None = None
        self.reported_at = 0.0  # the latest report
        self.dismissed = 0  # reports /health never confirmed
        self._asked_at = 0.0

    def suspect(self) -> None:
        with self._lock:
            self.reported_at = time.monotonic()
            if self.suspected_at is None:
                self.suspected_at = self.reported_at

    def confirmed(self) -> bool:
        """True when /health answers a server error after a report of death: the engine is gone."""
        at, now = self.suspected_at, time.monotonic()
        if at is None or now - at < DEAD_GRACE_S or now - self._asked_at < PROBE_EVERY_S:
            return False
        self._asked_at = now
        try:
            status = self._probe(self.url) if self.url is not None else None
        except Exception:  # noqa: BLE001 - an answer no one foresaw: no answer; the launcher must
            status = None  # never break while vLLM runs (its fallback would start vLLM a second time)
        if status is not None and status >= 500:
            return True
        with self._lock:  # (a report that came while /health was asked keeps the suspicion open)
            if now - self.reported_at > DEAD_GRACE_S + CONFIRM_WINDOW_S:
                self.suspected_at = None  # not vLLM's report (a client's text), or not a server this can ask
                self.dismissed += 1
        return False
