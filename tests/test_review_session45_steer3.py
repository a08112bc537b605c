"""Session 45 hostile review (steer3): vLLM 0.32's engine-process lines that write a value a request chose, and
the stacks that run vLLM in the same pod. The finding's tests (strict xfails until fixed this session:
scan._SCOPED_MESSAGE scopes the eager handshake's wording too) show a real log diagnosed the same with a harmless
value in the client's place and with the client's text there; the others are formats not covered before that held.

Finding:
- MoRIIO's eager handshake (vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_connector.py, vLLM 0.32,
  MoRIIOConnectorWorker._eager_handshake_all_dp_ranks, called from start_load_kv on every decode step that
  receives KV) logs a failed handshake with `logger.exception("Eager MoRIIO handshake failed for %s", eid)`.
  `eid` is `get_engine_name_with_dp(remote_engine_id, dp)`, and remote_engine_id is
  `str(meta.remote_host) + ":" + str(meta.remote_handshake_port)`: meta.remote_host is the request's
  `kv_transfer_params["remote_host"]` as sent (moriio_common.py, ReqMeta built in add_new_req), a JSON string
  (spaces and newlines kept). The line is the worker's (the engine core's process), ERROR, and names no request:
  scan._SCOPED_MESSAGE scopes MoRIIO's lazy `Handshake with ` (moriio_connector.py:2206) and its notification,
  not this wording. A client's `torch.OutOfMemoryError: CUDA out of memory ...` in the host, on the first line or
  a further one, turns a real illegal memory access into runtime_oom with the client's figures (tried 64 GiB);
  a client's KV-capacity message makes any crash kv_cache_insufficient, `estimated_max_model_len` 16 among the
  heal's numbers; the client's words are the evidence.

Held (formats not covered before):
- the same step's fatal error (moriio_connector.py, after the TP vote: `raise HandshakeError(f"Eager MoRIIO
  handshake failed for {remote_engine_id} on at least one TP rank; ...")`, the engine's last word with the
  client's host in it): its message is not read (`may carry a request's text`), with or without a newline;
- its INFO summary (`"Eager MoRIIO handshake: engine=%s dp_size=%d new_ranks=%d ok=%s tp_rank=%d"`, the same
  host): an INFO line that opens with no words of the engine's;
- the scheduler's warning on a client-provided multimodal UUID reused for other content
  (vllm/v1/core/sched/scheduler.py, `"Encoder cache entry for multimodal identifier %r holds %d embeddings, but
  request %s input %d expects %d. A client-provided multimodal UUID may have been reused for different
  content."`, the identifier the client's `multi_modal_uuids` entry, written with %r: one line);
- the GPU video backend's warning (vllm/multimodal/media/video.py, `"Stripping request-level %s=%r: GPU video
  backend not configured at startup."`, the value the request's media_io_kwargs asked for, %r).
"""

from __future__ import annotations

import pytest

from test_review_session45_steer2 import (
    API_PROCESS,
    ENGINE_PROCESS,
    _before_crash,
    _logged,
    _runtime_oom,
    assert_engine_line_keeps_the_diagnosis,
)

from crafted.bases import ILLEGAL, MARKER, PAYLOADS, illegal_access_log
from crafted.checks import assert_reads_like, diagnose

# --- MoRIIO's eager handshake: the client's remote_host on an ERROR line of the engine's process ------------------
HARMLESS_HOST = "10.0.0.7"
_EAGER = "moriio_connector.py:3048"


def _eager_failure(host: str, process: str = ENGINE_PROCESS) -> list[str]:
    """moriio_connector.py:3048 (vLLM 0.32): logger.exception, so the handshake future's traceback follows, each
    line under the same header (vLLM's NewLineFormatter)."""
    message = "\n".join(
        [
            f"Eager MoRIIO handshake failed for {host}:6301_dp0",
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.12/concurrent/futures/_base.py", line 449, in result',
            "    return self.__get_result()",
            "TimeoutError: MoRIIO handshake timed out",
        ]
    )
    return _logged(process, "ERROR", _EAGER, message)


_SAME_LINE_OOM = HARMLESS_HOST + " torch.OutOfMemoryError: " + PAYLOADS["cuda-oom"]
_OOM_LINE = HARMLESS_HOST + "\ntorch.OutOfMemoryError: " + PAYLOADS["cuda-oom"]
_KV_CAPACITY = HARMLESS_HOST + "\n" + PAYLOADS["kv-capacity"]


@pytest.mark.parametrize(
    "base, host",
    [
        (illegal_access_log, _SAME_LINE_OOM),
        (illegal_access_log, _OOM_LINE),
        (illegal_access_log, _KV_CAPACITY),
        (_runtime_oom, _KV_CAPACITY),
    ],
    ids=["illegal-access-oom-same-line", "illegal-access-oom-next-line", "illegal-access-kv-capacity", "oom-kv"],
)
@pytest.mark.parametrize("prefixes", [True, False], ids=["v0.25-prefixes", "no-prefixes"])
def test_a_moriio_eager_handshake_host_names_no_failure(base, host, prefixes):
    assert_engine_line_keeps_the_diagnosis(
        base, prefixes, _eager_failure, HARMLESS_HOST, host, "a MoRIIO eager handshake's host"
    )


# --- held: the client's multimodal UUID and media kwargs, written with %r ----------------------------------------
_HELD = [
    (
        ENGINE_PROCESS,
        "scheduler.py:1763",
        "Encoder cache entry for multimodal identifier {} holds 256 embeddings, but request cmpl-1-0-1a2b3c4d "
        "input 0 expects 1024. A client-provided multimodal UUID may have been reused for different content.",
    ),
    (API_PROCESS, "video.py:63", "Stripping request-level num_frames={}: GPU video backend not configured at startup."),
]


@pytest.mark.parametrize("process, file_line, message", _HELD, ids=["mm-uuid-reused", "video-kwargs-stripped"])
@pytest.mark.parametrize("base", [illegal_access_log, _runtime_oom], ids=["illegal-access", "serving-oom"])
@pytest.mark.parametrize("payload", ["cuda-oom", "kv-capacity"])
def test_a_client_value_written_with_repr_names_no_failure(process, file_line, message, base, payload):
    log = base()
    harmless = _before_crash(log, _logged(process, "WARNING", file_line, message.format(repr("img-" + MARKER))))
    value = repr("img-1 torch.OutOfMemoryError: " + PAYLOADS[payload] + "\n" + PAYLOADS[payload])
    crafted = _before_crash(log, _logged(process, "WARNING", file_line, message.format(value)))
    assert_reads_like(crafted, harmless, f"a {file_line} warning's value")


_HANDSHAKE_ERROR = "vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_common.HandshakeError"


def _handshake_crash(host: str) -> str:
    """illegal_access_log with the engine's fatal error made the eager handshake's HandshakeError, under the same
    header on each of its lines."""
    message = (
        f"{_HANDSHAKE_ERROR}: Eager MoRIIO handshake failed for {host}:6301 on at least one TP rank; failing this "
        "step fast to avoid a TP collective hang"
    )
    out = []
    for line in illegal_access_log().splitlines():
        if line.endswith("[core.py:1233] " + ILLEGAL):
            header = line.split("[core.py:1233] ")[0] + "[core.py:1233] "
            out += [header + part for part in message.split("\n")]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("host", [_SAME_LINE_OOM, _OOM_LINE, _KV_CAPACITY], ids=["oom-same-line", "oom-line", "kv"])
def test_a_moriio_handshake_error_names_no_failure(host):
    harmless = _handshake_crash(HARMLESS_HOST)
    assert diagnose(harmless).cause == "not_oom"
    assert_reads_like(_handshake_crash(host), harmless, "a MoRIIO HandshakeError's host")


@pytest.mark.parametrize("host", [_SAME_LINE_OOM, _OOM_LINE, _KV_CAPACITY], ids=["oom-same-line", "oom-line", "kv"])
@pytest.mark.parametrize("base", [illegal_access_log, _runtime_oom], ids=["illegal-access", "serving-oom"])
def test_a_moriio_eager_handshake_summary_names_no_failure(host, base):
    def summary(value: str) -> list[str]:
        message = f"Eager MoRIIO handshake: engine={value}:6301 dp_size=1 new_ranks=1 ok=False tp_rank=0"
        return _logged(ENGINE_PROCESS, "INFO", "moriio_connector.py:3055", message)

    log = base()
    harmless = _before_crash(log, summary(HARMLESS_HOST))
    assert_reads_like(_before_crash(log, summary(host)), harmless, "a MoRIIO eager handshake summary's host")
