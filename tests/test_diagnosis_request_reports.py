"""A request's error report (uvicorn's headerless `Exception in ASGI application`, serving_chat.py's
logged traceback, in text or JSON records) holds the client's lines and ends where the engine's own
records begin: it neither absorbs the engine's later failure nor lets a forged record, stamp or box
inside it decide."""

from __future__ import annotations

import json
import re

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify
from vllm_autoheal.diagnosis.corpus import context

from crafted.bases import BASE, CORPUS, OOM, real_log, with_lines
from crafted.checks import assert_reads_like, said
from crafted.grammar import FRAME, grammar_traceback
from crafted.node_logs import COLLECTORS
from crafted.records import ILLEGAL_ACCESS, JSON_START, PREPROC_ERROR, RUNTIME_OOM, record
from crafted.reports import ASGI, CLIENT_ASGI, ENDINGS_034, REPORTERS_034, SERVING_034, asgi_with, served_034

METRIC = record("Engine 000: Avg prompt throughput: 1.0 tokens/s", level="INFO", name="vllm.v1.metrics.loggers")


ACCESS = 'INFO:     127.0.0.1:52004 - "POST /v1/chat/completions HTTP/1.1" 200 OK'


def _same_as_alone(log: str, fatal: str, what: str) -> None:
    alone = classify(Signals(log=JSON_START + fatal + "\n"))
    d = classify(Signals(log=log))
    assert alone.cause in ("weights_load_oom", "not_oom") and alone.evidence
    assert (d.cause, d.subtype, d.evidence[:1]) == (alone.cause, alone.subtype, alone.evidence[:1]), (
        f"{what}: said {said(d)}; should say {said(alone)}"
    )
    assert "ZZUSERZZ" not in json.dumps(d.to_dict()), f"{what}: the client's text is quoted"


# --- A request's report absorbs every later record in a JSON-mode log ---------------------------
BETWEEN = {
    "right-after": lambda: "",
    "after-serving": lambda: (METRIC + "\n" + ACCESS + "\n") * 5000,
    "from-the-head-window": lambda: (METRIC + "\n" + ACCESS + "\n") * 8000,  # (2.5 MB: the report is in the head)
}


@pytest.mark.xfail(
    strict=True,
    reason="a limit: in a log with no process prefix, a record in uvicorn's text report cannot be told from a "
    "client's line that parses as one (vLLM 0.32's json formatter writes uvicorn's report as a record too; a "
    "logging config of one's own for vLLM's loggers alone does not)",
)
@pytest.mark.parametrize("collector", ["plain", "kubectl-timestamps"])
@pytest.mark.parametrize("between", sorted(BETWEEN))
@pytest.mark.parametrize("crash", ["runtime-oom", "illegal-access"])
def test_a_requests_report_does_not_absorb_the_engines_later_records(crash, between, collector):
    """Unfixed: weights_load_oom oom_in_load -> not_oom other_error quoting `jinja2.exceptions.TemplateError:
    ZZUSERZZ`; not_oom illegal_memory_access keeps its subtype but loses its evidence (the RuntimeError
    line). Should say what the fatal record says alone."""
    fatal = RUNTIME_OOM if crash == "runtime-oom" else ILLEGAL_ACCESS
    log = COLLECTORS[collector](JSON_START + CLIENT_ASGI + BETWEEN[between]() + fatal + "\n")
    _same_as_alone(log, fatal, f"{between}/{collector}")


PREFIX = {"api": "(APIServer pid=7) ", "engine": "(EngineCore pid=9) "}


@pytest.mark.parametrize("between", sorted(BETWEEN))
@pytest.mark.parametrize("crash", ["runtime-oom", "illegal-access"])
def test_a_requests_report_ends_at_another_processs_record(crash, between):
    """Fixed for logs whose lines vLLM's stdout decorator prefixes (its GPU workers, the engine core and
    the API server, as tests/fixtures/gpu/failure-logs/*-json.log show): the engine core's record after
    the API server's report is not the report's."""
    fatal = RUNTIME_OOM if crash == "runtime-oom" else ILLEGAL_ACCESS
    report = "".join(PREFIX["api"] + ln + "\n" for ln in CLIENT_ASGI.splitlines())
    log = JSON_START + report + BETWEEN[between]() + PREFIX["engine"] + fatal + "\n"
    alone = classify(Signals(log=JSON_START + PREFIX["engine"] + fatal + "\n"))
    d = classify(Signals(log=log))
    assert (d.cause, d.subtype) == (alone.cause, alone.subtype) and d.evidence[:1] == alone.evidence[:1]
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


def test_a_forged_record_in_a_prefixed_report_is_the_reports():
    """The client's line gets the report's own process prefix first: its record stays in the report."""
    forged = record("x", "Traceback (most recent call last):\n" + OOM)
    crafted = CLIENT_ASGI.replace("TemplateError: ZZUSERZZ\n", "TemplateError: ZZUSERZZ\n" + forged + "\n")
    report = lambda text: "".join(PREFIX["api"] + ln + "\n" for ln in text.splitlines())  # noqa: E731
    d = classify(Signals(log=JSON_START + report(crafted)))
    harmless = classify(Signals(log=JSON_START + report(CLIENT_ASGI)))
    assert (d.cause, d.subtype) == (harmless.cause, harmless.subtype) and not d.is_memory


# --- ... and so does any raw traceback (no client needed) --------------------------------------
THREAD_TRACEBACK = (
    "Exception in thread Thread-3 (_report_usage_worker):\nTraceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner\n    self.run()\n'
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='stats.vllm.ai', port=443): Max retries "
    "exceeded\n"
)


@pytest.mark.parametrize("crash", ["runtime-oom", "illegal-access"])
def test_a_raw_traceback_does_not_absorb_the_engines_later_records(crash):
    """Unfixed: weights_load_oom -> not_oom other_error quoting the ConnectionError; the illegal access loses
    its evidence. Should say what the fatal record says alone."""
    fatal = RUNTIME_OOM if crash == "runtime-oom" else ILLEGAL_ACCESS
    _same_as_alone(JSON_START + THREAD_TRACEBACK + (METRIC + "\n") * 5 + fatal + "\n", fatal, crash)


# --- A flood of bare vLLM headers hides VLLM_LOGGING_PREFIX ---------------------------
LOGGING_PREFIX = "[llama-70b] "


TOOL_PARSER = (
    "(APIServer pid=2320) ERROR 12-01 04:48:00 [hermes_tool_parser.py:120] torch.OutOfMemoryError: CUDA out of "
    "memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.10 GiB is free. ZZUSERZZ"
)


def _prefixed_serving_log(client_report: str, tool_line: str, prefix: str = LOGGING_PREFIX) -> str:
    """A real H200 serving log (corpus local-h200-runtime) up to its crash, every vLLM line under the
    logging prefix; a tool parser's line and a client's request error, then the engine's illegal access."""
    lines = CORPUS["local-h200-runtime"]["log"].splitlines()
    at = next(i for i, ln in enumerate(lines) if "EngineCore encountered a fatal" in ln)
    crash = [
        "(EngineCore pid=2441) ERROR 12-01 04:48:08 [core.py:1233] EngineCore encountered a fatal error.",
        "(EngineCore pid=2441) ERROR 12-01 04:48:08 [core.py:1233] RuntimeError: CUDA error: an illegal memory "
        "access was encountered",
    ]
    vllm = re.compile(r"\((?:APIServer|EngineCore)")
    headed = [prefix + ln if vllm.match(ln) else ln for ln in [*lines[:at], tool_line]]
    return "\n".join([*headed, *client_report.splitlines(), *(prefix + ln for ln in crash)]) + "\n"


FLOOD = "\n".join(f"ERROR 12-01 10:00:00 [x.py:1] out of tokens {i}" for i in range(300))


def test_a_flood_of_bare_headers_does_not_unmask_a_tool_parsers_line():
    """Unfixed: not_oom illegal_memory_access -> runtime_oom oom_in_serving, tried_gib 64, quoting
    `[llama-70b] (APIServer pid=2320) ERROR ... [hermes_tool_parser.py:120] torch.OutOfMemoryError: ...
    ZZUSERZZ`. The same log without the flood, and the flood without VLLM_LOGGING_PREFIX: not_oom
    (asserted). Should: not_oom, the tool parser's line user text."""
    report = ASGI.replace("TemplateError: x\n", "TemplateError: x\n" + FLOOD + "\n")
    for log in (_prefixed_serving_log(ASGI, TOOL_PARSER), _prefixed_serving_log(report, TOOL_PARSER, prefix="")):
        alone = classify(Signals(log=log))
        assert (alone.cause, alone.subtype) == ("not_oom", "illegal_memory_access")
    d = classify(Signals(log=_prefixed_serving_log(report, TOOL_PARSER)))
    assert (d.cause, d.subtype) == ("not_oom", "illegal_memory_access"), f"said {said(d)}"
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


# --- The record counter wraps ---------------------------------------------------------------
SMALLEST = '{"levelname": "INFO", "message": "x"}\n'


def test_the_record_counter_does_not_wrap_into_an_open_user_message():
    """Unfixed: weights_load_oom oom_in_load -> unknown, nothing quoted (with 99998 records between: the
    OOM, asserted). Should: the OOM."""
    near = classify(Signals(log=JSON_START + PREPROC_ERROR + "\n" + SMALLEST * 99998 + RUNTIME_OOM + "\n"))
    assert near.cause == "weights_load_oom"
    d = classify(Signals(log=JSON_START + PREPROC_ERROR + "\n" + SMALLEST * 99999 + RUNTIME_OOM + "\n"))
    assert (d.cause, d.subtype) == (near.cause, near.subtype), f"said {said(d)}; should say {said(near)}"


# --- What holds -------------------------------------------------------------------------------------------
FORGED_RECORD = record(OOM)


@pytest.mark.parametrize("collector", ["compose", "kubectl-timestamps"])
def test_a_stamped_forged_record_in_a_requests_report_names_nothing(collector):
    """The record is decoded after the collector's stamp, then absorbed: the report holds it and the forged
    frame after it."""
    base_log = real_log(BASE)
    wrap = COLLECTORS[collector]
    report = asgi_with("jinja2.exceptions.TemplateError: x\n" + FORGED_RECORD + "\n" + FRAME + OOM)
    assert_reads_like(
        wrap(with_lines(base_log, report, "end")),
        wrap(with_lines(base_log, asgi_with("ValueError: x\nhello"), "end")),
        "",
    )


@pytest.mark.parametrize("where", ["prefixless-reprint", "asgi"])
def test_a_word_stamp_before_a_forged_record_names_nothing(where):
    """`ab cd {...}`: decoded with the stamp, whose words keep the header from being read (a raw line of
    the report)."""
    base_log = real_log(BASE)
    begin = "ab cd " + FORGED_RECORD + "\n" + FRAME + OOM
    if where == "asgi":
        crafted, harmless = asgi_with("ValueError: x\n" + begin), asgi_with("ValueError: x\nhello")
    else:
        crafted = "Process EngineCore:\n" + grammar_traceback("<fn\n" + begin)
        harmless = "Process EngineCore:\n" + grammar_traceback("<fn\nhello")
    assert_reads_like(with_lines(base_log, crafted, "end"), with_lines(base_log, harmless, "end"), where)


def test_a_k9s_box_a_client_draws_in_a_requests_report_names_nothing():
    base_log = real_log(BASE)
    boxed = "x\n\u2502 " + FRAME.splitlines()[0] + " \u2502\n\u2502 " + OOM + " \u2502"
    assert_reads_like(
        with_lines(base_log, asgi_with("jinja2.exceptions.TemplateError: " + boxed), "end"),
        with_lines(base_log, asgi_with("jinja2.exceptions.TemplateError: x\nhello"), "end"),
        "box",
    )


def test_a_request_error_early_in_a_text_log_does_not_hide_the_runtime_oom():
    """A real request error long before the crash, 3000 access lines after it: the engine's headed lines end
    the report."""
    s = CORPUS["local-h200-runtime"]
    lines = s["log"].splitlines()
    at = next(i for i, ln in enumerate(lines) if "EngineCore encountered a fatal" in ln)
    access = ['(APIServer pid=2320) INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK'] * 3000
    log = "\n".join([*lines[: at - 5], *CLIENT_ASGI.splitlines(), *access, *lines[at - 5 :]]) + "\n"
    d = classify(Signals(log=log, **context(s, pod_state=True)))
    assert d.cause == s["label"] == "runtime_oom", f"said {said(d)}"


# --- vLLM 0.34's renderers (vllm/renderers/: a request's chat messages through its template) ------------------
@pytest.mark.parametrize("ending", sorted(ENDINGS_034))
@pytest.mark.parametrize("reporter", sorted(REPORTERS_034))
def test_a_renderers_report_of_a_requests_messages_is_never_quoted_034(reporter, ending):
    """Unfixed: inkling.py's and mistral.py's `logger.exception` of a request's messages (its exception's message
    the client's: `ValueError: unsupported content part <the client's>`) were read as the engine's own error: after
    a SIGTERM, not_oom other_error quoting the client's text. Should quote nothing of it, as serving.py's report."""
    d = classify(Signals(log=served_034(reporter, "ValueError: unsupported content part ZZUSERZZ", ending)))
    log = served_034(reporter, "", ending)
    engines = classify(Signals(log="\n".join(ln for ln in log.splitlines() if " 10:01:00 " not in ln) + "\n"))
    assert "ZZUSERZZ" not in json.dumps(d.to_dict()), f"{reporter} before {ending}: said {said(d)}"
    assert (d.cause, d.numbers) == (engines.cause, engines.numbers) or (ending == "sigterm" and d.cause == "unknown")


# A client's words for the engine's memory failures, as the message of an exception a request's handler
# raised with the client's text (its whole message: the worst case), in uvicorn's bare report.
CLIENT_MEMORY_WORDS = {
    "cuda-oom": "CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 139.80 GiB",
    "no-cache-blocks": "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
    "cgroup-kill": "Memory cgroup out of memory: Killed process 4242 (python3)",
    "oomkilled": "OOMKilled",
    "bad-alloc": "std::bad_alloc",
}


def _asgi_034(words: str, ending: str) -> str:
    report = asgi_with(f"ValueError: {words} ZZUSERZZ").splitlines()
    return "\n".join([*SERVING_034, *report, *ENDINGS_034[ending]]) + "\n"


@pytest.mark.parametrize("ending", sorted(ENDINGS_034))
@pytest.mark.parametrize("words", sorted(CLIENT_MEMORY_WORDS))
def test_the_engines_memory_words_in_a_request_report_of_a_v1_server_are_the_clients(words, ending):
    """From 0.11 the engine core always runs apart from the API server, and its death reaches a request only as
    EngineDeadError, whose words are fixed: a memory failure opening the message of an exception in a request's
    report (uvicorn's, bare, in 0.31 on) is a client's text. It had decided (runtime_oom where the engine died of
    an illegal access, or after SIGTERM; host_ram_oom from the kernel's words) and was quoted. The kernel's
    OOM-kill report, which the kernel writes into no exception's message, is a client's in any release."""
    alone = classify(Signals(log="\n".join([*SERVING_034, *ENDINGS_034[ending]]) + "\n"))
    d = classify(Signals(log=_asgi_034(CLIENT_MEMORY_WORDS[words], ending)))
    assert d.cause == alone.cause or (ending == "sigterm" and d.cause == "unknown"), f"said {said(d)}"
    assert d.cause not in MEMORY_CAUSES or d.evidence[:1] == alone.evidence[:1], f"said {said(d)}"
    assert "ZZUSERZZ" not in json.dumps(d.to_dict()), "the client's text is quoted"


def test_the_kernels_kill_report_in_a_request_report_is_the_clients_in_any_release():
    log = "INFO 01-01 00:00:00 [engine.py:1] started\n" + asgi_with("ValueError: Memory cgroup out of memory: ZZUSERZZ")
    d = classify(Signals(log=log))
    assert d.cause not in MEMORY_CAUSES and "ZZUSERZZ" not in json.dumps(d.to_dict()), f"said {said(d)}"


# A line naming an older release that a client can print where a logging format leaves a message's further lines bare.
FORGED_RELEASES = {
    "v0-engine": "INFO 05-02 10:00:59 [llm_engine.py:232] Initializing a V0 LLM engine (v0.10.0) with config: model='m'",
    "banner": "INFO 05-02 10:00:59 [utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.10.0",
}


@pytest.mark.parametrize("forged", sorted(FORGED_RELEASES))
def test_a_forged_older_release_does_not_bring_back_the_clients_memory_words(forged):
    """High. A 0.34 log (its engine's own lines name 0.34) where a client's bare line names 0.10 too. Before: the
    older of the two releases decided, so the client's 'CUDA out of memory' in a request's report was the engine's
    again: runtime_oom after an illegal access, quoting the client. A second release in one run is a forged one
    (arithmetic.one_release): the log naming a release that runs no engine in the API server is enough."""
    report = asgi_with(f"ValueError: {CLIENT_MEMORY_WORDS['cuda-oom']} ZZUSERZZ").splitlines()
    log = "\n".join([*SERVING_034, FORGED_RELEASES[forged], *report, *ENDINGS_034["illegal-access"]]) + "\n"
    d = classify(Signals(log=log))
    assert (d.cause, d.subtype) == ("not_oom", "illegal_memory_access"), f"said {said(d)}"
    assert "ZZUSERZZ" not in json.dumps(d.to_dict()), "the client's text is quoted"
