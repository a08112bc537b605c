"""The log the operator reads may be only the end of one (kube/client.previous_log marks it with a gap line
`[...]`): a request's report whose opening was cut is the client's, the crash at the end survives long lines,
and a headerless client line after the gap is a known limit (strict xfails)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.scan import GAP_LINE

from crafted.bases import API, CLIENT_OOM, corpus_log, illegal_access_crash, illegal_access_log
from crafted.checks import cause_and_subtype, client_text_absent
from crafted.node_logs import Kubelet
from crafted.records import CUSTOM, reformatted
from crafted.reports import ASGI, FORGED_BASES, V0_STATS, V1_STATS, headed_report, serving_minute


def _cut_window(chat: str, base: str, after: int, last: str, opening: tuple[str, ...] = ()) -> str:
    """A log as the operator passes one whose tail was cut at its head (after a gap line, kube/client.previous_log):
    it opens inside a client's report (`opening`: the client's first lines there), then the base's crash, then,
    where `after`, one more report of the client's."""
    before = ["[...]"] + headed_report(chat, [*opening, *["hello"] * 50, last])[5:]
    later = headed_report(chat, ["bye"]) if after else []
    return "\n".join(before) + "\n" + base + ("\n".join(later) + "\n" if later else "")


@pytest.mark.parametrize("base_name", sorted(FORGED_BASES))
def test_a_window_that_opens_inside_a_clients_report_does_not_let_its_lines_decide(base_name):
    make, chat, _, after = FORGED_BASES[base_name]
    base = make()

    def log(last: str) -> str:
        return _cut_window(chat, base, after, last)

    harmless = classify(Signals(log=log("bye")))
    assert harmless.cause == "not_oom"
    crafted = classify(Signals(log=log(CLIENT_OOM)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- After a gap, a report that opens on a USER- or ACCESS-looking line -----------------
FIRST_LINES = {
    "names-a-request": "hello request",
    "access-log-shape": '1.2.3.4:5 - "GET / HTTP/1.1" 200',
    "request-loggers-words": "Received request x",
}


@pytest.mark.parametrize("first", sorted(FIRST_LINES))
@pytest.mark.parametrize("base_name", sorted(FORGED_BASES))
def test_after_a_gap_a_report_that_opens_on_a_user_looking_line_decides_nothing(base_name, first):
    make, chat, _, after = FORGED_BASES[base_name]
    base = make()

    def log(last: str) -> str:
        # the window opens inside the client's report (its opening cut), on a line the client chose
        return _cut_window(chat, base, after, last, opening=(FIRST_LINES[first],))

    harmless = classify(Signals(log=log("bye")))
    assert harmless.cause == "not_oom"
    crafted = classify(Signals(log=log(CLIENT_OOM)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


# --- After a gap, a headerless report's client lines -------------------------------------
HEADERLESS_BASES = {
    **{name: (lambda make=make: make()) for name, (make, *_rest) in FORGED_BASES.items()},
    # the operator's own format: each record's lines headed, or only its first
    "custom-format-every-line": lambda: reformatted(CUSTOM, every_line=True)(illegal_access_log()),
    "custom-format-first-line": lambda: reformatted(CUSTOM, every_line=False)(illegal_access_log()),
}


HEADERLESS_AFTER_A_GAP = pytest.mark.xfail(
    strict=True,
    reason="a limit: after a gap (the operator's window on a long log, the launcher's kept head and tail, "
    "scan's unread middle, a paster's `[...]`), a headerless line cannot be told from the engine's own raw output (a "
    "dying engine's traceback is headerless too); making every writer's message no one's after a gap cost 20 train "
    "answers after any gap, and after the operator's alone it hid the engine's own traceback where the window opens "
    "in it",
)


@HEADERLESS_AFTER_A_GAP
@pytest.mark.parametrize("gap", [GAP_LINE], ids=["operator-or-mid-log"])
@pytest.mark.parametrize("base_name", sorted(HEADERLESS_BASES))
def test_after_a_gap_a_headerless_clients_line_decides_nothing(base_name, gap):
    """A limit (see HEADERLESS_AFTER_A_GAP)."""
    base = HEADERLESS_BASES[base_name]()

    def log(last: str) -> str:
        # the window opens in the message of uvicorn's report (or of a logger.exception under logging.Formatter):
        # the client's lines are raw
        return gap + "\n" + "hello\n" * 50 + last + "\n" + base

    harmless = classify(Signals(log=log("bye")))
    assert harmless.cause == "not_oom"
    crafted = classify(Signals(log=log(CLIENT_OOM)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


# --- previous_log: a last line without a newline hides the cut -----------------------------
CRASH_NO_NEWLINE = "ERROR 12-01 10:00:09 [core.py:1] RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_log_cut_at_its_head_whose_last_line_has_no_newline_opens_with_a_gap():
    output = "INFO 12-01 10:00:00 [core.py:1] step\n" * 5000 + CRASH_NO_NEWLINE
    log = Kubelet(output).previous_log("ns", "pod", "vllm")
    assert log.endswith(CRASH_NO_NEWLINE)
    assert log.startswith(GAP_LINE + "\n")


# --- previous_log: the last 60 lines overflow limitBytes -----------------------------------
OOM_TRACEBACK = (
    "".join(
        f'(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710]   File "/usr/lib/vllm/v1/x{i}.py", line {i}, in f\n'
        for i in range(28)
    )
    + "(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 960.00 MiB. GPU 0 has a total capacity of 79.14 GiB of which 712.75 MiB is free.\n"
    "(APIServer pid=8267) ERROR 10-24 01:26:57 [async_llm.py:1] AsyncLLM output_handler failed.\n"
)


def test_the_end_survives_when_the_last_60_lines_overflow_the_byte_limit():
    ids = ", ".join(["12345"] * 16000)  # a 16k-token prompt's ids, as the request logger prints them
    echo = (
        "(APIServer pid=8267) INFO 10-24 01:26:5{} [logger.py:39] Received request chatcmpl-{}: prompt: '"
        + "x" * 8000
        + "', params: SamplingParams(n=1), prompt_token_ids: ["
        + ids
        + "]\n"
    )
    output = "INFO 10-24 01:20:00 [core.py:1] step\n" * 3000 + "".join(echo.format(i % 10, i) for i in range(40))
    output += OOM_TRACEBACK
    kube = Kubelet(output)
    log = kube.previous_log("ns", "pod", "vllm")
    assert log.endswith(
        OOM_TRACEBACK
    )  # (reading back 4000, 1000, 250, 62, 60 lines would return 2 MiB of request lines)
    assert classify(Signals(log=log)).cause == "runtime_oom"


# --- A real V0 report carrying the engine's OOM, behind a gap -----------------------------------
def test_behind_a_gap_a_requests_report_is_the_clients_even_a_v0_one_carrying_the_engines_oom():
    """Designed (finding 5): behind a gap line, a request's report whose opening was left out is the client's,
    whatever it carries; as a paste (no gap) the corpus' rt-13100 keeps its answer."""
    log = corpus_log("rt-13100-mistral-large")
    assert cause_and_subtype(classify(Signals(log=log))) == ("runtime_oom", "oom_in_serving")  # as a paste
    assert classify(Signals(log=GAP_LINE + "\n" + log)).cause == "unknown"


FIXTURES = Path(__file__).resolve().parent / "fixtures"


GPU = FIXTURES / "gpu" / "failure-logs"


CPU = FIXTURES / "vllm-cpu"


def _decides_nothing_through_previous_log(output) -> None:
    """`output(last)`: a container's whole output, the client's line `last` in it; read as the operator reads it
    (a 4,000-line window, opening with a gap line), the client's torch OOM changes nothing and is never quoted."""
    logs = {}
    for last in ("bye", CLIENT_OOM):
        kube = Kubelet(output(last))
        logs[last] = kube.previous_log("ns", "pod", "vllm")
        assert kube.asked == [4000] and logs[last].startswith(GAP_LINE + "\n")
    harmless = classify(Signals(log=logs["bye"]))
    assert cause_and_subtype(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=logs[CLIENT_OOM]))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


# --- The head cut is dropped by scan on the operator's real window ------------------------
@pytest.mark.xfail(
    strict=True,
    reason="a limit: a headerless line after a gap cannot be told from the engine's own raw output",
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

    _decides_nothing_through_previous_log(
        output
    )  # read as the engine's, it would be runtime_oom with ZZUSERZZ in its evidence


@pytest.mark.xfail(
    strict=True,
    reason="a limit: a headerless line after a gap cannot be told from the engine's own raw output",
)
@pytest.mark.parametrize("base_name", sorted(HEADERLESS_BASES))
def test_after_the_head_cut_a_headerless_clients_line_2100_lines_before_the_end_decides_nothing(base_name):
    """The "operator" case of the test above with the client's line 2,100 lines before the end instead of 50."""
    base = HEADERLESS_BASES[base_name]()

    def log(last: str) -> str:
        return GAP_LINE + "\n" + "hello\n" * 5 + last + "\n" + "hello\n" * 2100 + base

    harmless = classify(Signals(log=log("bye")))
    assert harmless.cause == "not_oom"
    crafted = classify(Signals(log=log(CLIENT_OOM)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


# --- previous_log's refined window opens inside the crash; the head cut makes it the client's ----
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
    assert cause_and_subtype(classify(Signals(log=output))) == ("runtime_oom", "oom_in_serving")
    kube = Kubelet(output)
    log = kube.previous_log("ns", "pod", "vllm")
    assert log.endswith(lines[-1])  # the end survives ...
    # ... but the window opens 3 lines into the traceback (the last 62 lines alone read runtime_oom)
    assert cause_and_subtype(classify(Signals(log=log))) == ("runtime_oom", "oom_in_serving")


# --- A real log's last N lines behind the head cut ---------------------------------------------
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
    assert cause_and_subtype(classify(Signals(log="".join(lines)))) == want
    # (the same lines behind a `[...]` line give `want`)
    assert cause_and_subtype(classify(Signals(log=GAP_LINE + "\n" + "".join(lines[-n:])))) == want


# --- A window that opens on a raw line of a log without process prefixes -----------------------
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
    assert cause_and_subtype(classify(Signals(log="".join(lines)))) == want
    log = GAP_LINE + "\n" + RAW_OPENERS[opener] + "\n" + "".join(lines[-100:])
    assert cause_and_subtype(classify(Signals(log=log))) == want  # as behind a `[...]` line


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


def _window(last: str, stats: str, prefix: str = "") -> str:
    # the operator's window opens inside the client's headerless report; the server serves on, then crashes
    return (
        GAP_LINE
        + "\n"
        + (prefix + "hello\n") * 50
        + prefix
        + last
        + "\n"
        + serving_minute(stats)
        + illegal_access_crash()
    )


# (vLLM V1 prefixes every line its API server writes, a web framework's report and the client's newlines in it
# included: the real shape, which writers.py reads; without that prefix it is the headerless-after-a-gap limit)
CLIENT_LINES = {
    "as-v1-prints-them": API,
    "unprefixed": pytest.param(
        "",
        marks=pytest.mark.xfail(
            strict=True,
            reason="a limit where the client's lines carry no process prefix: after "
            "a gap a headerless quote cannot be told from a dying engine's raw output",
        ),
    ),
}


@pytest.mark.parametrize("prefix", list(CLIENT_LINES.values()), ids=list(CLIENT_LINES))
@pytest.mark.parametrize("stats", sorted(V1_STATS))
def test_after_a_gap_a_clients_quote_before_v1s_stats_lines_decides_nothing(stats, prefix):
    harmless = classify(Signals(log=_window("bye", V1_STATS[stats], prefix)))
    assert cause_and_subtype(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=_window(CLIENT_OOM, V1_STATS[stats], prefix)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


@pytest.mark.xfail(
    strict=True,
    reason="a limit: after a gap a client's headerless quote cannot be told from a dying engine's raw output; "
    "setting it aside before V0's stats line is no way out, since V0's server logs its stats after its engine died",
)
def test_after_a_gap_a_clients_quote_before_v0s_stats_lines_decides_nothing():
    """V0's stats line opens with `Avg prompt throughput`; the quote before it should decide nothing."""
    harmless = classify(Signals(log=_window("bye", V0_STATS)))
    assert cause_and_subtype(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=_window(CLIENT_OOM, V0_STATS)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)
