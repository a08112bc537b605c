"""Third hostile review of session 14: a1fb98b (the gap rule by the header's file, the operator's head cut
scan.GAP_LINE, previous_log asking fewer lines down to one and then as many as fit).

Each finding was an xfail(strict=True) test that FAILED on a1fb98b. Outcome, in the same session: the head cut
(any writer's message after the operator's gap line is no one's) is reverted, which fixes 2, 3 and 4; the operator's
window opens with the ordinary gap line again, which scan now keeps at the input's head (it is no anchored
candidate), so the request-handler rule of the first two reviews fires on a 4,000-line window too
(test_through_previous_log_a_request_handlers_report_in_a_4000_line_window_decides_nothing, below). 1, a headerless
report cut by the window, is s14b-2's limit (strict xfail). Severity in brackets; "new" means a1fb98b~1 answered right on the same input
(the parent's previous_log prefixed GAP_LINE where a1fb98b prefixes GAP_LINE), "older" means it answered wrong
too (a1fb98b's fix is then incomplete).

1. [critical, older: a1fb98b's fix 2 does not reach the operator's real window] GAP_LINE is no candidate line:
   scan keeps it only inside the raw tail (the last RAW_TAIL_LINES=2000 lines / RAW_TAIL_BYTES=64 KiB). The rule in
   findings.mark_continuations asks for it as `lines[0]`, so it fires only on a window shorter than the raw tail,
   never on the operator's ordinary 4,000-line window: there, a client's headerless line of uvicorn's report (whose
   opening the window cut) more than 2,000 lines before the end still decides. Emulated end to end through
   previous_log (the kubelet's tailLines): a client's raw `torch.OutOfMemoryError: CUDA out of memory ...` line
   3,000 lines before an illegal-access crash gives runtime_oom (a memory change), its ZZUSERZZ quoted in the
   evidence. The same on a1fb98b~1 with its `[...]` line.
2. [high, new] previous_log's refinement now opens the window wherever the bytes run out, which is next to the crash
   exactly when long lines precede it (a request logger's lines of long prompts before a serving OOM); the head cut
   then makes the message the window opens in, the engine's own traceback, the client's: the real H200 serving OOM
   (tests/fixtures/gpu/failure-logs/runtime.log) with two 100k-token prompts logged before the crash is read as
   GAP_LINE + the last 120 lines (asked 4000, 1000, 250, 62, 156, 109, 132, 120), three lines into the
   traceback, and answers unknown/wrapper_without_cause; a1fb98b~1 read the last 62 lines and answered
   runtime_oom/oom_in_serving. The docstring's premise, "the window opens 4,000 lines before its end, far from the
   crash", is false for every window the refinement shortened.
3. [medium, new] The brief's simulation: a real log's last N lines behind GAP_LINE, N cutting into the crash's
   message: the crash's own lines no longer decide (the H200 capture OOM at N=120, the serving OOM, KV length, free
   memory, sampler-warmup OOM at N=80, ...). Over the fixtures and train samples at N in 1..400, 695 (log, N) pairs
   answered as the full log with GAP_LINE (a1fb98b~1) and differently with GAP_LINE (a1fb98b); none became a
   memory answer.
4. [medium, new] A window that opens on any raw line (an access-log line, a progress bar) of a log without vLLM's
   process prefix (the CPU engine, JSON records or the operator's own format) makes every later record and raw line
   the client's: the engine's fatal re-print never decides, however far from the window's start it is (the CPU
   engine's KV-length failure 100 lines after the window's first line answers unknown/traceback_without_error).

What held:
- No exception from classify on any of the 2,156 (log, N) inputs of 3 (fixtures + train samples, N in
  1,2,3,5,8,12,20,30,50,80,120,200,400), with GAP_LINE or GAP_LINE.
- The head cut never turned a (log, N) into a memory answer it did not give whole; the full logs' answers and the
  GAP_LINE answers are the same on a1fb98b and a1fb98b~1 (the `before` check of collector._any_prefix and
  scan.a_requests_file changed none).
- previous_log: the loop ends (the asked number strictly falls, then bisects at most LOG_REFINE times); at most 10
  API calls (a log whose last 4 lines fit, 3 not ... emulated over every fitting count 0..4099); one line over the
  limit gives "" (no diagnosis, no memory change); an ApiException gives "". (Other errors of the client library, a
  read timeout, escape as before a1fb98b: not new.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.scan import GAP_LINE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_diagnosis_log_format import ASGI  # noqa: E402
from test_diagnosis_s14b_review import HEADERLESS_BASES, TORCH_OOM, _key  # noqa: E402
from test_previous_log import Kubelet  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GPU = FIXTURES / "gpu" / "failure-logs"
CPU = FIXTURES / "vllm-cpu"


def _clean(d) -> bool:
    return "ZZUSERZZ" not in json.dumps(d.to_dict())


def _decides_nothing_through_previous_log(output) -> None:
    """`output(last)`: a container's whole output, the client's line `last` in it; read as the operator reads it
    (a 4,000-line window, opening with a gap line), the client's torch OOM changes nothing and is never quoted."""
    logs = {}
    for last in ("bye", TORCH_OOM):
        kube = Kubelet(output(last))
        logs[last] = kube.previous_log("ns", "pod", "vllm")
        assert kube.asked == [4000] and logs[last].startswith(GAP_LINE + "\n")
    harmless = classify(Signals(log=logs["bye"]))
    assert _key(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=logs[TORCH_OOM]))
    assert _key(crafted) == _key(harmless)
    assert _clean(crafted)


# --- 1. The head cut is dropped by scan on the operator's real window (critical, older) ------------------------
@pytest.mark.xfail(
    strict=True,
    reason="s14c-1 = s14b-2's limit: a headerless line after a gap cannot be told from the engine's own raw output",
)
def test_through_previous_log_a_headerless_clients_line_in_a_4000_line_window_decides_nothing():
    base = HEADERLESS_BASES["illegal-access"]()

    def output(last: str) -> str:
        # uvicorn's report of a request whose text holds thousands of newlines, then the engine's real crash:
        # the operator's window (the last 4,000 lines) opens inside the client's lines
        return (
            "INFO 12-01 10:00:00 [core.py:1] step\n" * 100
            + ASGI
            + "hello\n" * 1500
            + last
            + "\n"
            + "hello\n" * 3000
            + base
        )

    _decides_nothing_through_previous_log(output)  # on a1fb98b: runtime_oom, ZZUSERZZ in its evidence


@pytest.mark.xfail(
    strict=True,
    reason="s14c-1 = s14b-2's limit: a headerless line after a gap cannot be told from the engine's own raw output",
)
@pytest.mark.parametrize("base_name", sorted(HEADERLESS_BASES))
def test_after_the_head_cut_a_headerless_clients_line_2100_lines_before_the_end_decides_nothing(base_name):
    """s14b's test 2 ("operator", asserted fixed) with the client's line 2,100 lines before the end instead of 50."""
    base = HEADERLESS_BASES[base_name]()

    def log(last: str) -> str:
        return GAP_LINE + "\n" + "hello\n" * 5 + last + "\n" + "hello\n" * 2100 + base

    harmless = classify(Signals(log=log("bye")))
    assert harmless.cause == "not_oom"
    crafted = classify(Signals(log=log(TORCH_OOM)))
    assert _key(crafted) == _key(harmless)
    assert _clean(crafted)


# --- 2. previous_log's refined window opens inside the crash; the head cut makes it the client's (high, new) ----
def _request_line(i: int) -> str:
    # vLLM's request logger (no --max-log-len) on a 100k-token prompt: about 1.1 MB
    return (
        f"(APIServer pid=2320) INFO 12-01 04:48:0{i} [logger.py:39] Received request cmpl-{i}: prompt: '"
        + "lorem ipsum " * 35000
        + "', params: SamplingParams(n=1, max_tokens=16), prompt_token_ids: ["
        + ", ".join(["12345"] * 100000)
        + "], lora_request: None.\n"
    )


def test_a_serving_oom_after_two_long_prompts_keeps_its_answer_through_previous_log():
    lines = (GPU / "runtime.log").read_text().splitlines(keepends=True)
    # the two requests arrive (after the health check) and the engine dies of memory serving them
    output = "".join(lines[:82]) + _request_line(0) + _request_line(1) + "".join(lines[82:])
    assert _key(classify(Signals(log=output))) == ("runtime_oom", "oom_in_serving")
    kube = Kubelet(output)
    log = kube.previous_log("ns", "pod", "vllm")
    assert log.endswith(lines[-1])  # the end survives (a1fb98b's fix 4) ...
    # ... but the window opens 3 lines into the traceback (on a1fb98b~1: the last 62 lines, runtime_oom)
    assert _key(classify(Signals(log=log))) == ("runtime_oom", "oom_in_serving")


# --- 3. A real log's last N lines behind the head cut (medium, new) ---------------------------------------------
CUT_INTO_THE_CRASH = [
    ("capture.log", 120, ("cudagraph_capture_oom", "oom_in_graph_capture")),
    ("runtime.log", 80, ("runtime_oom", "oom_in_serving")),
    ("kvlen.log", 80, ("kv_cache_insufficient", "max_model_len_exceeds_kv_capacity")),
    ("freemem.log", 80, ("gpu_util_exceeds_free", "free_memory_below_requested")),
    ("sampler.log", 80, ("profiling_oom", "oom_in_profile")),
    ("weights72.log", 80, ("kv_cache_insufficient", "no_cache_blocks")),
]


@pytest.mark.parametrize(("name", "n", "want"), CUT_INTO_THE_CRASH, ids=[f"{n}-{k}" for n, k, _ in CUT_INTO_THE_CRASH])
def test_a_real_logs_last_lines_behind_the_head_cut_keep_the_crashs_answer(name, n, want):
    lines = (GPU / name).read_text().splitlines(keepends=True)
    assert _key(classify(Signals(log="".join(lines)))) == want
    # (on a1fb98b~1 the same lines behind its `[...]` line give `want`)
    assert _key(classify(Signals(log=GAP_LINE + "\n" + "".join(lines[-n:])))) == want


# --- 4. A window that opens on a raw line of a log without process prefixes (medium, new) -----------------------
RAW_OPENERS = {
    "access-log": 'INFO:     127.0.0.1:52004 - "POST /v1/completions HTTP/1.1" 200 OK',
    "progress-bar": "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 55.14it/s]",
}
NO_PREFIX_LOGS = [
    ("kv-cache-too-small-json.log", ("kv_cache_insufficient", "max_model_len_exceeds_kv_capacity")),
    ("kv-cache-too-small-custom-format.log", ("kv_cache_insufficient", "max_model_len_exceeds_kv_capacity")),
    ("kv-larger-than-machine-json.log", ("gpu_util_exceeds_free", "kv_space_exceeds_free_host_memory")),
]


@pytest.mark.parametrize("opener", sorted(RAW_OPENERS))
@pytest.mark.parametrize(("name", "want"), NO_PREFIX_LOGS, ids=[n for n, _ in NO_PREFIX_LOGS])
def test_a_window_opening_on_a_raw_line_keeps_the_crashs_answer(name, want, opener):
    lines = (CPU / name).read_text().splitlines(keepends=True)
    assert _key(classify(Signals(log="".join(lines)))) == want
    log = GAP_LINE + "\n" + RAW_OPENERS[opener] + "\n" + "".join(lines[-100:])
    assert _key(classify(Signals(log=log))) == want  # on a1fb98b~1 (its `[...]` line): want


# --- after the fix: the gap line heads the operator's window, and scan keeps it --------------------------------
def test_through_previous_log_a_request_handlers_report_in_a_4000_line_window_decides_nothing():
    """A client's report under serving_chat.py's header (vLLM's NewLineFormatter heads every line of it) whose
    opening the operator's 4,000-line window cut: its line opening with torch's OOM is the report's (the gap line
    at the head is kept by scan although it is no anchored candidate)."""
    base = HEADERLESS_BASES["illegal-access"]()
    chat = "(APIServer pid=2320) ERROR 12-01 04:48:07 [serving_chat.py:200] "

    def output(last: str) -> str:
        report = "".join(chat + x + "\n" for x in ["hello"] * 2500 + [last] + ["hello"] * 1300)
        return "INFO 12-01 10:00:00 [core.py:1] step\n" * 100 + report + base

    _decides_nothing_through_previous_log(output)
