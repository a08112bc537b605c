"""A hang warning (shared-memory broadcast, a rank waiting) decides unless the engine went on after it:
only the engine's own milestones count, never one a client writes into a request's line, and another
engine or rank that goes on does not hide the hang."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import real_log, with_lines
from crafted.checks import assert_reads_like
from crafted.exceptions import add_lora_failure
from crafted.node_logs import cri_log
from crafted.reports import CLIENT_ASGI


def _key(d) -> dict:
    return {"cause": d.cause, "subtype": d.subtype, "evidence": d.evidence, "numbers": d.numbers}


# --- A client's milestone drops a real hang (rule 2) -------------------------------------------------
MILESTONES = {
    "startup-complete": "Application startup complete. ZZUSERZZ",
    "kv-figure": "Available KV cache memory: 77.7 GiB ZZUSERZZ",
    "metrics": "Avg prompt throughput: 1.0 tokens/s ZZUSERZZ",
}


CARRIERS = {
    # the headerless ASGI traceback: the client's line goes on the TemplateError's message
    "asgi": lambda line: CLIENT_ASGI + line,
    # POST /v1/load_lora_adapter: a newline in lora_name; the next line is a REQUEST line that opens
    # with an engine exception's name (ENGINE_EXCEPTION), and a marker right after it counts
    "add-lora": lambda line: add_lora_failure("a\nRuntimeError: " + line, "/adapters/a"),
}


HANG_BASES = [
    "neg-27313-shm-broadcast",  # start-up figures, then the hang warning: the only failure
    "notoom-51986-shm-broadcast-mnnvl",  # the hang warning, repeated
    "notoom-13209-prompt-exceeds-2048",  # V0's long-prompt warning, the only failure
]


@pytest.mark.parametrize("payload", sorted(MILESTONES))
@pytest.mark.parametrize("carrier", sorted(CARRIERS))
@pytest.mark.parametrize("base_name", HANG_BASES)
def test_a_clients_milestone_after_a_real_warning_does_not_drop_it(base_name, carrier, payload):
    """Appended after the real hang (or V0's prompt warning), the client's milestone makes rule 2 drop
    it: not_oom worker_hang_shm_broadcast would turn not_oom other_error quoting the client's
    `TemplateError: ZZUSERZZ` (asgi; with the kv-figure payload the client's 77.7 GiB replaces vLLM's
    available_kv_gib in the numbers), or unknown (add-lora). It says what the same log with a harmless line there says: only an engine line that
    is no value, no quoted message line and no request line may say the engine went on."""
    base_log = real_log(base_name)
    harmless = classify(Signals(log=with_lines(base_log, CARRIERS[carrier]("hello"), "end")))
    crafted = classify(Signals(log=with_lines(base_log, CARRIERS[carrier](MILESTONES[payload]), "end")))
    assert harmless.cause == "not_oom" and harmless.subtype in ("worker_hang_shm_broadcast", "prompt_too_long")
    assert _key(crafted) == _key(harmless)
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- Rule 2 against how vLLM really logs -------------------------------------------------------------
def _ts(seconds: int) -> str:
    return f"06-26 22:{40 + seconds // 60:02d}:{seconds % 60:02d}"


def _hang_log(other_engine_serves: bool) -> str:
    """V1 with data parallelism 2: both engines start and serve; then EngineCore_DP0 hangs (its
    workers stopped reading the shm broadcast) and logs the wait every 60 s. The API server logs each
    engine's stats every 10 s (VLLM_LOG_STATS_INTERVAL); Engine 001 still serves, so its line is INFO
    (loggers.py logs at DEBUG only when an engine's throughput was zero twice in a row)."""
    lines = [
        "(EngineCore_DP0 pid=85) INFO 06-26 22:30:01 [gpu_worker.py:466] Available KV cache memory: 10.85 GiB",
        "(EngineCore_DP1 pid=86) INFO 06-26 22:30:01 [gpu_worker.py:466] Available KV cache memory: 10.85 GiB",
        "(APIServer pid=7) INFO 06-26 22:30:09 [launcher.py:37] Application startup complete.",
    ]
    for s in range(10, 400, 10):
        if s % 60 == 0:
            lines.append(
                f"(EngineCore_DP0 pid=85) INFO {_ts(s)} [shm_broadcast.py:698] No available shared memory "
                "broadcast block found in 60 seconds. This typically happens when some processes are hanging "
                "or doing some time-consuming work (e.g. compilation, weight/kv cache quantization)."
            )
        if other_engine_serves:
            lines.append(
                f"(APIServer pid=7) INFO {_ts(s)} [loggers.py:127] Engine 001: Avg prompt throughput: 812.3 "
                "tokens/s, Avg generation throughput: 96.0 tokens/s, Running: 6 reqs, Waiting: 0 reqs, GPU KV "
                "cache usage: 12.1%, Prefix cache hit rate: 0.0%"
            )
    return "\n".join(lines) + "\n"


def test_a_hang_of_one_engine_while_another_serves_is_still_the_hang():
    """The API server's stats line of the engine that still serves follows every hang
    warning, but V1 opens it with `Engine 001: `, so placement keeps no milestone of it (an INFO line
    that opens a message counts only when it opens with a known message) and the hang still decides."""
    alone = classify(Signals(log=_hang_log(other_engine_serves=False)))
    assert (alone.cause, alone.subtype) == ("not_oom", "worker_hang_shm_broadcast")
    d = classify(Signals(log=_hang_log(other_engine_serves=True)))
    assert (d.cause, d.subtype) == ("not_oom", "worker_hang_shm_broadcast")


SHM = (
    "(EngineCore_DP0 pid=85) INFO {} [shm_broadcast.py:698] No available shared memory broadcast block found in "
    "60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. "
    "compilation, weight/kv cache quantization)."
)


def test_a_hang_warning_repeated_after_another_ranks_milestone_still_decides():
    """Rank 1 hangs in start-up, rank 0 finishes loading (its milestone follows the
    first wait), and the wait is logged again after it: the later warning is kept."""
    log = "\n".join(
        [
            "(EngineCore_DP0 pid=85) INFO 06-26 22:40:00 [core.py:1] Initializing a V1 LLM engine (v0.11.0)",
            SHM.format("06-26 22:41:00"),
            "(Worker_TP0 pid=95) INFO 06-26 22:41:10 [gpu_model_runner.py:2653] Model loading took 14.6 GiB",
            SHM.format("06-26 22:42:00"),
            SHM.format("06-26 22:43:00"),
        ]
    )
    d = classify(Signals(log=log + "\n"))
    assert (d.cause, d.subtype) == ("not_oom", "worker_hang_shm_broadcast")


@pytest.mark.parametrize("base_name", HANG_BASES)
def test_a_clients_milestone_on_a_request_line_in_a_cri_file_drops_no_hang(base_name):
    """In a CRI file the add_lora carrier's line is no further line (section 4), but it is
    a REQUEST line, and only the engine's milestones say the engine went on."""
    base_log = real_log(base_name)
    crafted = cri_log(
        with_lines(base_log, add_lora_failure("a\nRuntimeError: Application startup complete. ZZUSERZZ", "/a"), "end")
    )
    harmless = cri_log(with_lines(base_log, add_lora_failure("a\nRuntimeError: hello", "/a"), "end"))
    assert_reads_like(crafted, harmless, "milestone")
