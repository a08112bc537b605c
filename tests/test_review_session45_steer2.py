"""Session 45 hostile review (steer2): a model's user steered the diagnosis through an ERROR line a KV connector
writes in the engine's own process, under vLLM's own formatter (the header on every line). Fixed this session
(scan._SCOPED_MESSAGE: a KV transfer's call to a remote peer a request names is scoped like a request's error);
the tests show a real log diagnosed the same with a harmless value in the client's place and with the client's
text there. The Responses API's tests are formats not covered before that held.

Finding:
- Mooncake's P/D connector (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py,
  vLLM 0.32, MooncakeConnectorWorker._connect_to_prefiller_bootstrap) logs a failed bootstrap query with
  `logger.error("Failed to connect to bootstrap server %s (%s): %s", remote_bootstrap_addr, type(e).__name__, e)`.
  The address is the request's `kv_transfer_params["remote_bootstrap_addr"]` (MooncakeConnectorMetadata,
  `remote_bootstrap_addr=kv_transfer_params["remote_bootstrap_addr"]`), a JSON string any client that reaches
  the decode instance sets, written with %s: spaces and newlines kept. The line is the worker's (the engine
  core's process), ERROR, from a file no rule names as a request's, and it holds none of the request words
  origin.py looks for (`request`, `req_id`, `cmpl-`): so it is the engine's. On its first line the client's
  `torch.OutOfMemoryError: CUDA out of memory ...` counts (placement: an ERROR line that opens a message is
  read whole), and on a further line (a newline in the address) an exception line opens a traceback the
  engine "owns". A real illegal memory access reads runtime_oom; the client's KV-capacity message makes any
  crash kv_cache_insufficient with the client's `estimated maximum model length` among the heal's numbers;
  the client's words are the evidence. (The NIXL connector's report of the same parameters, `NIXL transfer
  failure: ... | Context: {...}`, is held by its `request_id` key: tests/test_diagnosis_kv_transfer.py.)

Held (formats not covered before), each a WARNING whose further lines placement reads as a value:
- the Responses API's harmony parser (vllm/entrypoints/openai/responses/harmony.py, the browser tool call:
  `logger.warning("Invalid JSON in browser tool call, using error placeholder: %s", content.text)`, the
  model's output, which a prompt steers);
- the Responses API's input conversion (vllm/entrypoints/openai/responses/utils.py:
  `"Using summary text as reasoning content for item %s. ..."`, item.id, the client's reasoning item's id).
"""

from __future__ import annotations

import re

import pytest

from crafted.bases import MARKER, PAYLOADS, corpus_log, illegal_access_log
from crafted.checks import assert_reads_like, diagnose

_PROCESS = re.compile(r"(?m)^\([\w.:-]{1,60} pid=\d+\) ")
ENGINE_PROCESS = "(EngineCore pid=2441) "  # the bases' engine core (vLLM 0.25): a single GPU's worker
API_PROCESS = "(APIServer pid=2320) "


def _runtime_oom() -> str:
    return corpus_log("local-h200-runtime")  # a real vLLM 0.25 serving OOM on an H200


def _without_prefixes(log: str) -> str:
    """The same log as vLLM 0.31+ prints it where no process prefix is written (the CPU engine, JSON mode)."""
    return _PROCESS.sub("", log)


def _before_crash(log: str, extra: list[str]) -> str:
    lines = log.splitlines()
    at = next(i for i, ln in enumerate(lines) if "[dump_input.py:" in ln)  # the engine's dump, then its error
    return "\n".join(lines[:at] + extra + lines[at:]) + "\n"


def assert_engine_line_keeps_the_diagnosis(
    base, prefixes: bool, lines_of, harmless: str, hostile: str, what: str
) -> None:
    """A real log (with vLLM 0.25's process prefixes, or none as 0.31+ prints it) with the engine process's lines
    `lines_of(value, process)` before its crash: diagnosed as without them where the value is harmless, and the same
    where the value is the client's hostile text."""
    log = base() if prefixes else _without_prefixes(base())
    process = ENGINE_PROCESS if prefixes else ""
    calm = _before_crash(log, lines_of(harmless, process))
    assert diagnose(calm).cause == diagnose(log).cause
    assert_reads_like(_before_crash(log, lines_of(hostile, process)), calm, what)


def _logged(process: str, level: str, file_line: str, message: str) -> list[str]:
    """vLLM's NewLineFormatter: the header on every line of the message."""
    header = f"{process}{level} 12-01 04:48:07 [{file_line}] "
    return [header + part for part in message.split("\n")]


# --- Mooncake's bootstrap failure: the client's remote_bootstrap_addr on an ERROR line -------------------------
HARMLESS_ADDR = "http://10.0.0.7:8998"


def _bootstrap_failure(addr: str, process: str = ENGINE_PROCESS) -> list[str]:
    """mooncake_connector.py:2483 (vLLM 0.32), the query's error httpx's (a refused connection, or InvalidURL for
    an address with a control character)."""
    error = "ConnectError" if addr == HARMLESS_ADDR else "InvalidURL"
    cause = "All connection attempts failed" if addr == HARMLESS_ADDR else "Invalid port"
    if "\n" in addr:
        cause = "Invalid non-printable ASCII character in URL, '\\n' at position 20."
    return _logged(
        process,
        "ERROR",
        "mooncake_connector.py:2483",
        f"Failed to connect to bootstrap server {addr} ({error}): {cause}",
    )


_ONE_LINE_OOM = HARMLESS_ADDR + " torch.OutOfMemoryError: " + PAYLOADS["cuda-oom"]
_KV_CAPACITY = HARMLESS_ADDR + "\n" + PAYLOADS["kv-capacity"]
_OOM_LINE = HARMLESS_ADDR + "\ntorch.OutOfMemoryError: " + PAYLOADS["cuda-oom"]
_ILLEGAL_LINE = HARMLESS_ADDR + f"\nRuntimeError: CUDA error: an illegal memory access was encountered {MARKER}"


@pytest.mark.parametrize(
    "base, addr",
    [
        (illegal_access_log, _ONE_LINE_OOM),
        (illegal_access_log, _OOM_LINE),
        (illegal_access_log, _KV_CAPACITY),
        (_runtime_oom, _KV_CAPACITY),
        (_runtime_oom, _ILLEGAL_LINE),
    ],
    ids=[
        "illegal-access-oom-same-line",
        "illegal-access-oom-next-line",
        "illegal-access-kv-capacity",
        "serving-oom-kv-capacity",
        "serving-oom-illegal-access",
    ],
)
@pytest.mark.parametrize("prefixes", [True, False], ids=["v0.25-prefixes", "no-prefixes"])
def test_a_mooncake_bootstrap_address_names_no_failure(base, addr, prefixes):
    assert_engine_line_keeps_the_diagnosis(
        base, prefixes, _bootstrap_failure, HARMLESS_ADDR, addr, "a Mooncake bootstrap address"
    )


# The other calls to a remote peer that a request's kv_transfer_params name (vLLM 0.32): MoRIIO's
# (moriio_connector.py:2206 `logger.exception("Handshake with %s failed", eid)`, moriio_engine.py:912
# `"Failed to send notification to %s: %s"`) and NIXL push's (nixl/push_worker.py:372 `"No remote agents for engine
# %s; cannot send registration for %s"`): scoped like a request's error since session 45, as Mooncake's.
_PEER_CALLS = [
    ("moriio_connector.py:2206", "Handshake with {} failed"),
    ("moriio_engine.py:912", "Failed to send notification to {}: timed out"),
    ("push_worker.py:372", "No remote agents for engine {}; cannot send registration for cmpl-1-0"),
]


@pytest.mark.parametrize("file_line, message", _PEER_CALLS, ids=["moriio-handshake", "moriio-notify", "nixl-push"])
@pytest.mark.parametrize("peer", [_OOM_LINE, _KV_CAPACITY], ids=["oom-next-line", "kv-capacity"])
def test_a_kv_peer_named_by_a_request_names_no_failure(file_line, message, peer):
    log = illegal_access_log()
    harmless = _before_crash(log, _logged(ENGINE_PROCESS, "ERROR", file_line, message.format(HARMLESS_ADDR)))
    assert diagnose(harmless).cause == "not_oom"
    crafted = _before_crash(log, _logged(ENGINE_PROCESS, "ERROR", file_line, message.format(peer)))
    assert_reads_like(crafted, harmless, "a KV peer's name")


# --- held: the Responses API's warnings that write a client's or a model's text ------------------------------
_HELD = [
    ("harmony.py:279", 'Invalid JSON in browser tool call, using error placeholder: {{"query": {}'),
    (
        "utils.py:382",
        "Using summary text as reasoning content for item {}. Please use content instead of summary for "
        "reasoning items.",
    ),
]


@pytest.mark.parametrize("file_line, message", _HELD, ids=["harmony-browser-call", "responses-reasoning-item"])
@pytest.mark.parametrize("base", [illegal_access_log, _runtime_oom], ids=["illegal-access", "serving-oom"])
@pytest.mark.parametrize(
    "payload",
    [PAYLOADS["cuda-oom"], PAYLOADS["kv-capacity"], f"model weights take 70.00 GiB {MARKER}"],
    ids=["cuda-oom", "kv-capacity", "weights"],
)
def test_a_responses_warnings_value_names_no_failure(file_line, message, base, payload):
    """Held: a WARNING's further lines are a value (placement.VALUE), its first line counts only where it opens
    with the engine's own words; the API server's process or none (vLLM 0.31+)."""
    for log, process in ((base(), API_PROCESS), (_without_prefixes(base()), "")):
        harmless = _before_crash(log, _logged(process, "WARNING", file_line, message.format("rs_" + MARKER.lower())))
        crafted = _before_crash(log, _logged(process, "WARNING", file_line, message.format("rs_1\n" + payload)))
        assert_reads_like(crafted, harmless, f"a {file_line} warning's value")
