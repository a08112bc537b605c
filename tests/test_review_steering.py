"""Hostile review: a client's text that steers the heal. Each test shows the log without the client's
text diagnosed one way, and the same log with it diagnosed another (or quoting it)."""

from __future__ import annotations

import io
import json

import pytest

from vllm_autoheal.launcher import CHUNK_BYTES, OutputKeeper, _crash_summary, pump

from crafted.bases import MARKER, illegal_access_log
from crafted.checks import assert_unchanged

# --- The launcher's kept output: a long line is kept in 64 KiB pieces, and its tail drops whole pieces ------
# `--enable-log-outputs` (vLLM 0.10+, vllm/entrypoints/logger.py RequestLogger.log_outputs) logs each
# response at INFO as `Generated response %s%s: output: %r, output_token_ids: %s, finish_reason: %s`: one
# line (repr escapes newlines), as long as the model's output, which the client steers ("repeat this
# text"). (vLLM 0.4 to 0.9 log each prompt the same way by default: `Received request %s: prompt: %r, ...`.)
# The launcher's pump() reads the child's output with readline(CHUNK_BYTES) and OutputKeeper keeps each
# 64 KiB piece as an element; when its tail overflows it drops the oldest element, so the kept tail may
# open with a piece that starts 64 KiB, 128 KiB... into such a line: the client's words, at a line start
# after the `[...]` gap, with no request logger's header before them. The launcher classifies that text
# and writes the diagnosis into the termination message, which the operator takes for the heal
# (kube/crash.py diagnose: a launcher's cause that is not unknown is returned as it is).

FORGED = (
    "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:08 [core.py:1233] ValueError: No available memory for the "
    f"cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. {MARKER} "
)
FILLER = "the quick brown fox jumps over the lazy dog "


def _long_response(i: int, words: str, pieces: int = 4) -> str:
    """A response line of `pieces` 64 KiB pieces (as the launcher reads it) with `words` at each piece's start."""
    head = f"(APIServer pid=2320) INFO 12-01 04:48:05 [logger.py:72] Generated response cmpl-{i:032x}-0: output: '"
    end = "', output_token_ids: [40, 1079], finish_reason: length\n"
    size = CHUNK_BYTES * pieces - 100
    out = head
    while len(out) < size:
        boundary = (len(out) // CHUNK_BYTES + 1) * CHUNK_BYTES
        out += (FILLER * (CHUNK_BYTES // len(FILLER) + 2))[: boundary - len(out)] + words
    return out[: size - len(end)] + end


def _launchers_diagnosis(words: str) -> dict:
    """What the launcher writes for vLLM 0.25's real serving crash (an illegal memory access: not memory) after
    ten long responses, read through pump() and OutputKeeper as run() reads the child's output."""
    log = illegal_access_log().splitlines(keepends=True)
    crash = next(i for i, ln in enumerate(log) if "[dump_input.py:" in ln)
    output = "".join(log[:crash] + [_long_response(i, words) for i in range(10)] + log[crash:]).encode()
    keeper = OutputKeeper()
    pump(io.BytesIO(output), io.BytesIO(), keeper)
    return _crash_summary(keeper.text(), 1, True, None, False)


def test_a_long_logged_output_cut_by_the_launchers_tail_is_no_engine_line():
    harmless = _launchers_diagnosis("x" * len(FORGED))
    assert harmless["cause"] == "not_oom" and harmless["subtype"] == "illegal_memory_access"
    crafted = _launchers_diagnosis(FORGED)
    assert (crafted["cause"], crafted["subtype"]) == (harmless["cause"], harmless["subtype"])
    assert MARKER not in json.dumps(crafted)


def test_a_stderr_line_between_two_pieces_of_a_long_output_starts_no_engine_line():
    # The two pump() threads of run() add to one keeper as they read: a line of stderr (uvicorn's own
    # logger writes there: `ERROR:    Exception in ASGI application`, which any client can cause) read
    # while vLLM's stdout is midway through a long response line lands between its pieces.
    line = _long_response(0, FORGED, pieces=2)
    log = illegal_access_log().splitlines(keepends=True)
    crash = next(i for i, ln in enumerate(log) if "[dump_input.py:" in ln)

    def kept(piece_two: str) -> dict:
        keeper = OutputKeeper()
        for ln in log[:crash]:
            keeper.add(ln, "stdout")
        keeper.add(line[:CHUNK_BYTES], "stdout")  # the first piece readline(CHUNK_BYTES) returns
        keeper.add("ERROR:    Exception in ASGI application\n", "stderr")  # read meanwhile
        keeper.add(piece_two, "stdout")  # the rest of the line
        for ln in log[crash:]:
            keeper.add(ln, "stdout")
        return _crash_summary(keeper.text(), 1, True, None, False)

    harmless = kept("x" * len(FORGED) + line[CHUNK_BYTES + len(FORGED) :])
    assert harmless["cause"] == "not_oom"
    crafted = kept(line[CHUNK_BYTES:])
    assert crafted["cause"] == harmless["cause"]
    assert MARKER not in json.dumps(crafted)


# --- uvicorn's access line for a request whose method origin.py does not list --------------------------------
# uvicorn (protocols/http/httptools_impl.py and h11_impl.py) logs every request, whatever its method:
# `%s - "%s %s HTTP/%s" %d` with the client's address, scope["method"], get_path_with_query_string(scope)
# (protocols/utils.py: the path quoted, the query string as the client sent it) and the status; vLLM's
# server answers a TRACE or PROPFIND (llhttp parses both) with 405 or 404, and the line is logged as any
# other. origin._ACCESS and _REQUEST_LINE know only GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS, so this access
# line is read as the engine's: its query string says "not memory" where nothing else in the log does, and is
# quoted as the evidence. (vLLM 0.10.1 to 0.30 put the API server's prefix before it; 0.31+ and <= 0.10.0 do not.)


# (uvicorn's WebSocket handshake lines, websockets_impl.py and wsproto_impl.py: `%s - "WebSocket %s" [accepted]`
# and `%s - "WebSocket %s" 403`, the client's address a tuple, its path and query string as above; any
# client reaches them on any path, vLLM 0.11+ serving /v1/realtime. Logged by uvicorn.error, no method at all.)
OTHER_ACCESS_LINES = {
    "trace-0.25": f'(APIServer pid=2320) INFO:     10.0.0.5:40112 - "TRACE /v1/models?{MARKER}=cudaErrorIllegalAddress '
    'HTTP/1.1" 405 Method Not Allowed',
    "propfind-0.32": f'INFO:     10.0.0.5:40112 - "PROPFIND /v1/models?{MARKER}=cudaErrorIllegalAddress HTTP/1.1" '
    "405 Method Not Allowed",
    "websocket-accepted": f"INFO:     ('10.0.0.5', 40112) - \"WebSocket /v1/realtime?{MARKER}=cudaErrorIllegalAddress\" "
    "[accepted]",
    "websocket-403": f'(APIServer pid=2320) INFO:     10.0.0.5:40112 - "WebSocket /x?{MARKER}=cudaErrorIllegalAddress" 403',
}


@pytest.mark.parametrize("fmt", sorted(OTHER_ACCESS_LINES))
def test_an_access_line_of_any_method_is_the_clients(fmt):
    assert_unchanged("rt-3430-lmcache-qwen3-8b-a5000-long-prompts", OTHER_ACCESS_LINES[fmt], "end")


def test_the_same_access_line_as_a_get_changes_nothing():
    line = f'INFO:     10.0.0.5:40112 - "GET /v1/models?{MARKER}=cudaErrorIllegalAddress HTTP/1.1" 404 Not Found'
    assert_unchanged("rt-3430-lmcache-qwen3-8b-a5000-long-prompts", line, "end")
