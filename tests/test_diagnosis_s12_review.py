"""A hostile review of the session-12 changes, 2bdf267..7610fcf (operator/): vLLM's JSON log records
decoded at stream level (log_records.py: a header `... [module.py:0] ` before every line of a record's
message and exc_info; findings.mark_continuations keeps a decoded line inside a headerless exception
message), request_logger.py as a user file, findings._wrapped joining lines that carry only the same
collector prefix, IPython's notebook frames (placement.FRAME_LINE, markers' QUALIFIED names,
REQUEST_FRAME / GRAMMAR_FRAME), and collector.prefix_of cutting a short paste.

Each finding that reproduced was an xfail(strict=True) test: it FAILED on 7610fcf and says what the
classifier said and what it should say. Severity in brackets; "older" marks a hole that 2bdf267 had too.
All nine are fixed in this session (the tests now guard the fixes); the one form that stays an xfail is
the s9 review's older hole, which the record before it does not change:
1. a decoded record inside a message or report no logger headed is that message's, and opens or ends
   nothing (findings.mark_continuations: `absorbed`);
2. a record too long to print whole keeps its first lines (where its traceback says whose report it is)
   and its last, around a gap; the lines that open a request's report (candidates.OPENERS) are kept from
   the whole tail window;
3. a wrapped memory message joined with a further line of an exception's message counts only when it
   opens where the exception's own message does; a continued line is never the start of a join;
4. a dying report re-printed without a process prefix holds the lines that write one;
5. blank lines are no lines of the raw tail (and 2.'s openers hold the report's opening);
6. each record's header names a line number of its own (0NNNNN), so records are messages of their own;
7. a record after a collector's stamp is decoded, the stamp printed before each of its lines;
8. a process prefix is not a collector's prefix for the wrapped join;
9. a line without a "levelname" key is not parsed (timing: bench/diagnosis_speed.py).

1. [critical, new] A line a client writes that parses as a JSON record is another writer: at a line of a
   headerless request's report (uvicorn's `Exception in ASGI application` traceback, in any text log; a
   JSON-mode engine's prefix-less re-print of a grammar crash, `Process EngineCore_DP0:`), who !=
   request, so mark_continuations sets request = None (and dying = False). The decoded line itself stays
   `continued` (the new rule), but the report is over: the client's next raw line that looks like a
   frame (or a bare vLLM header) ends the continuation, and the client's `torch.OutOfMemoryError` line is
   the engine's. neg-2734 not_oom nccl_timeout -> runtime_oom oom_in_serving, memory-limit-kill
   host_ram_oom -> runtime_oom, the JSON-mode crash not_oom -> weights_load_oom oom_in_load, tried_gib 64,
   quoting ZZUSERZZ. Should: what the same report says with a harmless line there (a decoded line inside
   a request's report is the report's, and does not end it).
   -> test_a_forged_record_does_not_end_a_requests_report[...]
2. [critical, new] log_records.render keeps a record of many short lines as its first line, `[...]` and
   as many of its LAST lines as fit in GROWTH x its size. In the logged copy of the grammar crash
   (`EngineCore encountered a fatal error.` with the traceback in exc_info), 100 short lines in the
   client's `begin` push the Traceback line and every grammar frame out of what is printed: what is left
   is the client's tail under the engine's own header (`ERROR [core.py:0]`), a forged traceback that is
   the engine's. not_oom other_error -> weights_load_oom oom_in_load, quoting ZZUSERZZ. Should: say what a
   harmless begin says (the gap makes every line after it untrusted, or the record keeps its head).
   -> test_a_shortened_record_keeps_the_grammar_report_it_opened[...]
3. [critical; older in a plain log, new under a collector's prefix] findings._wrapped joins the next two
   lines onto an engine line without asking whether they are `continued` (a client's further lines of an
   exception's message). In uvicorn's request traceback (`ValueError: x`, then the client's line) the code
   line `) = await self._preprocess_chat(` or the ValueError line, joined with the client's `Free memory
   on device (1.0/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB)`, is
   a start-up memory failure: not_oom / host_ram_oom -> gpu_util_exceeds_free free_memory_below_requested
   (a LowerGpuMemoryUtilization heal), quoting the engine's code line. 2bdf267 did it in a plain log;
   7610fcf's same-prefix rule makes it work under compose's `svc-1  | ` and kubectl --timestamps too.
   Should: a continued line is never joined. -> test_a_wrapped_join_never_takes_a_clients_line[...]
4. [critical, older; JSON mode makes it every log's] The s11b fix (`dying`: a line of the dying process
   that opens with a logger header goes on with the report) compares writers without their header but
   with their process prefix. A re-print without any prefix (vLLM's CPU engine, and every JSON-mode log:
   tests/fixtures/vllm-cpu/kv-cache-too-small*.log) has writer ('', '', None); a client line that writes
   a process prefix too (`(EngineCore pid=2441) ERROR 12-01 04:48:09 [core.py:710] torch.OutOfMemoryError:
   ...`) is another process: the grammar report ends there and the line is the engine's. not_oom ->
   runtime_oom (text) / weights_load_oom (JSON), quoting ZZUSERZZ. Should: a headed line inside a
   prefix-less re-print of a request's report is the report's.
   -> test_a_forged_process_prefix_in_a_prefixless_reprint_names_nothing[...]
5. [critical, older] scan's raw tail keeps at most RAW_TAIL_LINES (2000) lines, blank ones counted: 3000
   newlines in the client's `begin` push the grammar frames (which are no candidates) out of it, and the
   client's forged traceback after them is read with nothing that makes it a request's. not_oom
   nccl_timeout -> runtime_oom oom_in_serving, quoting ZZUSERZZ (the prefix-less re-print; and the headed
   copy before a prefixed re-print). Should: what a harmless begin says.
   -> test_many_blank_lines_do_not_push_the_grammar_frames_out_of_the_raw_tail[...]
6. [high, new] A decoded header names line 0 for every record, so all the records one module logs at one
   level in one process share one header key (scan._continuations, placement, mark_continuations), where
   the text formatter's file:line tells them apart. V1 core.py logs a client's bad request at ERROR
   (`_handle_request_preproc_error`: "Unexpected error pre-processing request <id>", with its traceback:
   a client can send one at will) and the engine's death at ERROR too ("EngineCore encountered a fatal
   error."): the fatal record is read as the rest of the user-text message. A runtime OOM (weights_load_oom
   on this base) and an illegal memory access (not_oom) -> unknown, nothing quoted. Should: each record is
   a logged message of its own. -> test_a_request_record_before_the_fatal_record_hides_nothing[...]
7. [medium, new] log_records.decoded reads a record only where a line starts with `{"`, before
   collector.py cuts a collector's prefix: under kubectl --timestamps or compose's `svc-1  | ` no record is
   decoded, and a traceback in exc_info is one escaped line. The corpus logs that read right as JSON
   records (as_json_records) read as before log_records.py: 16 of 269 unknown, among them
   local-h200-runtime (runtime_oom) and prof-27508-gptoss120b-sampler (profiling_oom). Should: the label.
   -> test_json_records_under_a_collectors_prefix_are_read[...]
8. [medium, new] _wrapped's "same collector prefix" is everything before the text but a time: the
   writer's process prefix too. In every prefix-only re-print (`(EngineCore_DP0 pid=494)   File ...`,
   the GPU engine's multiprocessing re-print) a frame, its code line and the exception line are joined,
   the memory finding lands on the frame, and the evidence quoted first is `File ".../kv_cache_utils.py",
   line 641, in _check_enough_kv_cache_memory` instead of the ValueError (9 corpus logs changed so:
   kv-xinf4926-qwen3vl-262k, util-club3090-4-097, kv-omni946-..., ...). Should: the message as before.
   -> test_the_evidence_of_a_reprinted_failure_is_its_message_not_a_frame[...]
9. [medium, new] A flood of short lines that open with `{"` costs log_records.decoded a json.loads (and,
   mostly, a raised JSONDecodeError) per line: 4-byte `{"}` lines cost ~20x a normal log per MB, `{"a"}`
   ~14x, `{"":1}` ~6x (the 3x asked). Should: at most 3x (a cheap test, e.g. the record's `"levelname"`
   key, before parsing). -> test_a_flood_of_short_brace_lines_is_not_slow

What found nothing (tests that pass): a forged record alone in the re-print or the ASGI report (the
decoded lines stay continued); a forged frame without a record (the report holds); the request logger's
records (0.32's request_logger name) with a forged text header or a forged exc_info stay user text;
IPython 8 / 7 frames (`File /p/x.py:1, in Cls.fn(self)`, `/p/x.py in fn(self)`, with `Traceback`) in the
grammar crash (headed and re-print), the ASGI report and the JSON-mode crash name nothing; the decisive
record after a line longer than RECORD_MAX (and a 3 MiB one), or split at a 1 MiB chunk boundary, is
still read; a short paste under `> `, `[vllm] ` or journald's header keeps the request logger's lines user
text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis import log_records as lr
from vllm_autoheal.diagnosis.corpus import context, load
from vllm_autoheal.diagnosis.origin import USER
from vllm_autoheal.diagnosis.scan import CHUNK, scan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted_logs import real_log  # noqa: E402
from test_diagnosis_injection import _with  # noqa: E402
from test_diagnosis_json_records import ILLEGAL_ACCESS, REAL_JSON, RUNTIME_OOM, as_json_records, record  # noqa: E402
from test_diagnosis_s9_review import ASGI  # noqa: E402
from test_diagnosis_s10b_review import _check, _said  # noqa: E402
from test_diagnosis_s10c_review import grammar_traceback  # noqa: E402
from test_diagnosis_s11b_review import _grammar_crash  # noqa: E402

HERE = Path(__file__).resolve().parent
BASE = "neg-2734-llama2-70b-tp8-timeout"  # a real not_oom (NCCL watchdog timeout)
SITE = "/usr/local/lib/python3.12/dist-packages/vllm"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free. ZZUSERZZ"
)
FRAME = f'  File "{SITE}/v1/worker/gpu_model_runner.py", line 1, in execute_model\n    x = y\n'
FORGED_TRACEBACK = "Traceback (most recent call last):\n" + FRAME + OOM
# The real vLLM 0.32 JSON log (CPU engine) up to its failure record: a start-up that got as far as the KV
# cache, no failure of its own.
JSON_START = REAL_JSON.read_text().split('{"asctime": "2026-12-02 07:36:38,784"', 1)[0]
CORPUS = {s["id"]: s for s in load(HERE / "corpus" / "corpus.jsonl")}


def _json_grammar_crash(begin: str, logged: bool = True) -> str:
    """The grammar crash as a JSON-mode engine writes it: the logged copy one record (the traceback in
    exc_info), then multiprocessing's re-print, raw, without any prefix (as in the real JSON fixture)."""
    tb = grammar_traceback(begin)
    out = [record("EngineCore encountered a fatal error.", tb)] if logged else []
    return "\n".join([*out, "Process EngineCore_DP0:\n" + tb]) + "\n"


def _asgi(message: str) -> str:
    """uvicorn's headerless request traceback (the s9 review's), its exception's message the client's."""
    return ASGI.replace("jinja2.exceptions.TemplateError: x\n", "jinja2.exceptions.TemplateError: " + message + "\n")


def _json_check(begin: str, harmless: str, logged: bool, what: str) -> None:
    crafted_d = classify(Signals(log=JSON_START + _json_grammar_crash(begin, logged)))
    harmless_d = classify(Signals(log=JSON_START + _json_grammar_crash(harmless, logged)))
    key = lambda d: (d.cause, d.subtype, d.numbers)  # noqa: E731
    assert key(crafted_d) == key(harmless_d), f"{what}: said {_said(crafted_d)}; should say {_said(harmless_d)}"
    assert "ZZUSERZZ" not in json.dumps(crafted_d.to_dict()), f"{what}: the client's text is quoted"


# --- 1. A forged record ends a request's report (critical, new) -------------------------------------------
AFTER_RECORD = {
    "record-frame-oom": "x\n" + record("x") + "\n" + FRAME + OOM,
    "record-bare-header-oom": "x\n" + record("x") + "\nERROR 12-01 04:48:09 [core.py:710] " + OOM,
}


S9_HOLE = pytest.mark.xfail(
    strict=True,
    reason="older (test_diagnosis_s9_review's xfail): a vLLM header on a line after uvicorn's headerless report "
    "is what a new logged message looks like; the record before it changes nothing",
)


@pytest.mark.parametrize("form", ["record-frame-oom", pytest.param("record-bare-header-oom", marks=S9_HOLE)])
@pytest.mark.parametrize("base_name", [BASE, "memory-limit-kill.log"])
def test_a_forged_record_does_not_end_a_requests_report_asgi(base_name, form):
    """7610fcf: neg-2734 not_oom -> runtime_oom oom_in_serving, memory-limit-kill host_ram_oom ->
    runtime_oom (cudagraph_capture_oom with the bare header), tried_gib 64, quoting ZZUSERZZ. The client's `{"levelname": "ERROR", "message": "x", ...}`
    line in the TemplateError's message sets request = None; the forged frame after it is then no longer the
    report's. Should say what the same report says with `hello` there."""
    base_log = real_log(base_name)
    _check(_with(base_log, _asgi(AFTER_RECORD[form]), "end"), _with(base_log, _asgi("x\nhello"), "end"), form)


@pytest.mark.parametrize("logged", [True, False], ids=["logged-and-reprint", "reprint-only"])
@pytest.mark.parametrize("form", sorted(AFTER_RECORD))
def test_a_forged_record_does_not_end_a_requests_report_json_reprint(form, logged):
    """7610fcf: not_oom other_error -> weights_load_oom oom_in_load, tried_gib 64, quoting ZZUSERZZ (the
    JSON-mode re-print has no prefix: the client's record line starts a line)."""
    _json_check("<fn\n" + AFTER_RECORD[form].removeprefix("x\n"), "<fn\nhello", logged, form)


def test_a_forged_record_does_not_end_a_requests_report_text_reprint():
    """7610fcf: neg-2734 not_oom -> runtime_oom (a text log whose engine re-prints without a prefix: the
    CPU engine, tests/fixtures/vllm-cpu/kv-cache-too-small.log). 2bdf267: not_oom."""
    base_log = real_log(BASE)
    reprint = lambda begin: "Process EngineCore:\n" + grammar_traceback(begin)  # noqa: E731
    begin = "<fn\n" + record("x") + "\n" + FRAME + OOM
    _check(_with(base_log, reprint(begin), "end"), _with(base_log, reprint("<fn\nhello"), "end"), "text reprint")


RESISTED = {
    "record-alone": "x\n" + record("x", "Traceback (most recent call last):\n" + OOM),
    "record-then-oom": "x\n" + record("x") + "\n" + OOM,
    "frame-without-record": "x\n" + FRAME + OOM,
}


@pytest.mark.parametrize("form", sorted(RESISTED))
@pytest.mark.parametrize("base_name", [BASE, "memory-limit-kill.log"])
def test_a_forged_record_alone_names_nothing(base_name, form):
    """Found nothing: the decoded lines stay in the message (the new rule), and without a record the
    report holds a forged frame."""
    base_log = real_log(base_name)
    _check(_with(base_log, _asgi(RESISTED[form]), "end"), _with(base_log, _asgi("x\nhello"), "end"), form)
    _json_check("<fn\n" + RESISTED[form].removeprefix("x\n"), "<fn\nhello", False, form)


# --- 2. A shortened record loses its grammar frames (critical, new) ---------------------------------------
@pytest.mark.parametrize("short_lines", [100, 300, 1000, 5000])
def test_a_shortened_record_keeps_the_grammar_report_it_opened(short_lines):
    """7610fcf: not_oom other_error -> weights_load_oom oom_in_load, quoting `torch.OutOfMemoryError: ...
    ZZUSERZZ not found in triggers`. The logged record prints as `EngineCore encountered a fatal error.`,
    `[...]`, then the client's last lines: its forged traceback, under `ERROR [core.py:0]`. (20 short lines
    fit the budget: not_oom.) Should say what a harmless begin of as many lines says."""
    filler = "aaaaaaaaaa\n" * short_lines
    printed = lr.render(record("EngineCore encountered a fatal error.", grammar_traceback("<fn\n" + filler + "z")))
    assert printed is not None and (short_lines < 1000 or any(p.endswith(lr.GAP) for p in printed))
    _json_check("<fn\n" + filler + FORGED_TRACEBACK, "<fn\n" + filler + "hello", True, f"{short_lines} lines")


# --- 3. The wrapped join takes a client's continued lines (critical; older in plain logs) -----------------
FREE = (
    "Free memory on device (1.0/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, "
    "71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes. ZZUSERZZ"
)
COLLECTORS = {
    "plain": lambda log: log,  # (2bdf267 too)
    "compose": lambda log: "".join(f"vllm-1  | {ln}\n" for ln in log.splitlines()),
    "kubectl-timestamps": lambda log: "".join(
        f"2026-12-02T07:36:{i % 60:02d}.123456789Z {ln}\n" for i, ln in enumerate(log.splitlines())
    ),
}


def _asgi_error(exception_line: str, message_rest: str) -> str:
    return ASGI.replace("jinja2.exceptions.TemplateError: x\n", exception_line + "\n" + message_rest + "\n")


@pytest.mark.parametrize("collector", sorted(COLLECTORS))
@pytest.mark.parametrize("exception", ["ValueError: x", "RuntimeError: x"])
@pytest.mark.parametrize("base_name", [BASE, "memory-limit-kill.log"])
def test_a_wrapped_join_never_takes_a_clients_line(base_name, exception, collector):
    """7610fcf: -> gpu_util_exceeds_free free_memory_below_requested, free_gib 1.0, util 0.9, quoting
    `) = await self._preprocess_chat(` (the code line, joined with the exception line and the client's).
    2bdf267: the same in a plain log; not under compose or kubectl --timestamps. Should say what the same
    report says with a harmless line there."""
    base_log = real_log(base_name)
    wrap = COLLECTORS[collector]
    _check(
        wrap(_with(base_log, _asgi_error(exception, FREE), "end")),
        wrap(_with(base_log, _asgi_error(exception, "hello"), "end")),
        collector,
    )


# --- 4. A forged process prefix in a prefix-less re-print (critical, older) -------------------------------
FORGED_PREFIXED = "<fn\n(EngineCore pid=2441) ERROR 12-01 04:48:09 [core.py:710] " + OOM


def test_a_forged_process_prefix_in_a_prefixless_reprint_names_nothing_text():
    """7610fcf and 2bdf267: neg-2734 not_oom -> runtime_oom oom_in_serving, quoting ZZUSERZZ."""
    base_log = real_log(BASE)
    reprint = lambda begin: "Process EngineCore:\n" + grammar_traceback(begin)  # noqa: E731
    _check(_with(base_log, reprint(FORGED_PREFIXED), "end"), _with(base_log, reprint("<fn\nhello"), "end"), "text")


@pytest.mark.parametrize("logged", [True, False], ids=["logged-and-reprint", "reprint-only"])
def test_a_forged_process_prefix_in_a_prefixless_reprint_names_nothing_json(logged):
    """7610fcf: not_oom other_error -> weights_load_oom oom_in_load, quoting ZZUSERZZ."""
    _json_check(FORGED_PREFIXED, "<fn\nhello", logged, "json")


# --- 5. Blank lines push the grammar frames out of the raw tail (critical, older) -------------------------
PREFIX = "(EngineCore_DP0 pid=2441) "


@pytest.mark.parametrize("shape", ["reprint-without-prefix", "headed-and-prefixed-reprint"])
def test_many_blank_lines_do_not_push_the_grammar_frames_out_of_the_raw_tail(shape):
    """7610fcf and 2bdf267: neg-2734 not_oom -> runtime_oom oom_in_serving, quoting ZZUSERZZ. (10 blank
    lines: not_oom.)"""
    base_log = real_log(BASE)

    def crash(begin: str) -> str:
        if shape == "reprint-without-prefix":
            return "Process EngineCore_DP0:\n" + grammar_traceback(begin)
        return _grammar_crash(begin, headed=True)

    blank = "<fn" + "\n" * 3000
    _check(
        _with(base_log, crash(blank + FORGED_TRACEBACK), "end"), _with(base_log, crash(blank + "hello"), "end"), shape
    )


# --- 6. One header key for every record of a module (high, new) ------------------------------------------
PREPROC_ERROR = record(
    "Unexpected error pre-processing request cmpl-abc-0",
    'Traceback (most recent call last):\n  File "/x/vllm/v1/engine/core.py", line 1300, in preprocess_add_request\n'
    "    x\nValueError: bad ZZUSERZZ",
)


@pytest.mark.parametrize("crash", ["runtime-oom", "illegal-access"])
def test_a_request_record_before_the_fatal_record_hides_nothing(crash):
    """7610fcf: weights_load_oom oom_in_load / not_oom illegal_memory_access -> unknown, nothing quoted: the
    fatal record's lines are USER (scan._continuations: same key as the open user-text message). Should
    say what the crash says alone."""
    fatal = RUNTIME_OOM if crash == "runtime-oom" else ILLEGAL_ACCESS
    alone = classify(Signals(log=JSON_START + fatal + "\n"))
    d = classify(Signals(log=JSON_START + PREPROC_ERROR + "\n" + fatal + "\n"))
    assert alone.cause in ("weights_load_oom", "not_oom")
    assert (d.cause, d.subtype) == (alone.cause, alone.subtype), f"said {_said(d)}; should say {_said(alone)}"


# --- 7. JSON records under a collector's prefix (medium, new) ---------------------------------------------
@pytest.mark.parametrize("collector", ["compose", "kubectl-timestamps"])
@pytest.mark.parametrize("sample_id", ["local-h200-runtime", "prof-27508-gptoss120b-sampler"])
def test_json_records_under_a_collectors_prefix_are_read(sample_id, collector):
    """7610fcf: runtime_oom / profiling_oom -> unknown (the same text under the same prefix reads right;
    so do the records without it). Should: the label."""
    s = CORPUS[sample_id]
    ctx = context(s, pod_state=True)
    records = as_json_records(s["log"])
    assert classify(Signals(log=records, **ctx)).cause == s["label"]
    assert classify(Signals(log=COLLECTORS[collector](s["log"]), **ctx)).cause == s["label"]
    d = classify(Signals(log=COLLECTORS[collector](records), **ctx))
    assert d.cause == s["label"], f"said {_said(d)}"


# --- 8. A frame quoted as the evidence of a re-printed failure (medium, new) ------------------------------
@pytest.mark.parametrize("sample_id", ["kv-xinf4926-qwen3vl-262k", "util-club3090-4-097"])
def test_the_evidence_of_a_reprinted_failure_is_its_message_not_a_frame(sample_id):
    """7610fcf: evidence[0] `File ".../kv_cache_utils.py", line 641, in _check_enough_kv_cache_memory` (and
    `File ".../v1/worker/utils.py", line 413, in request_memory`); 2bdf267: the ValueError. The cause is
    right; the line shown as the failure is a frame. Should: the ValueError's line."""
    s = CORPUS[sample_id]
    d = classify(Signals(log=s["log"], **context(s, pod_state=True)))
    assert d.cause == s["label"]
    assert d.evidence and d.evidence[0].startswith("ValueError: "), f"evidence {d.evidence[:2]}"


# --- 9. Short lines that open with `{"` (medium, new) -------------------------------------------------------
# (Fixed: a line without a `"levelname"` key is not parsed. Timing is measured in bench/diagnosis_speed.py,
# not asserted here: "a flood of 4-byte `{\"}` lines" and its neighbours.)


# --- What found nothing -----------------------------------------------------------------------------------
REQUEST_LOGGER = "vllm.entrypoints.serve.utils.request_logger"


@pytest.mark.parametrize(
    "forged",
    [
        record(
            "Received request c: prompt: 'x\nERROR 12-01 04:48:09 [core.py:710] " + OOM + "'",
            level="INFO",
            name=REQUEST_LOGGER,
        ),
        record(
            "Received request c: prompt: 'x'",
            "Traceback (most recent call last):\n" + FRAME + OOM,
            level="INFO",
            name=REQUEST_LOGGER,
        ),
        record(
            "Generated response c: output: 'x\n(EngineCore pid=1) ERROR 12-01 [core.py:1] " + OOM,
            level="INFO",
            name=REQUEST_LOGGER,
        ),
    ],
    ids=["forged-header", "forged-exc-info", "forged-prefix-and-header"],
)
def test_the_request_loggers_records_stay_user_text(forged):
    assert all(ln.origin == USER for ln in scan(forged + "\n").lines)
    alone = classify(Signals(log=JSON_START + ILLEGAL_ACCESS + "\n"))
    d = classify(Signals(log=JSON_START + forged + "\n" + ILLEGAL_ACCESS + "\n"))
    assert (d.cause, d.subtype) == (alone.cause, alone.subtype) and "ZZUSERZZ" not in json.dumps(d.to_dict())


NOTEBOOK_FRAMES = {
    "ipython8": f"File {SITE}/v1/worker/gpu_model_runner.py:1, in GPUModelRunner.execute_model(self)\n    x\n",
    "ipython7": f"{SITE}/v1/worker/gpu_model_runner.py in execute_model(self)\n    x\n",
    "ipython8-init": f"File {SITE}/model_executor/models/llama.py:1, in LlamaModel.__init__(self)\n    x\n",
    "ipython8-traceback": "Traceback (most recent call last):\n"
    f"File {SITE}/v1/worker/gpu_model_runner.py:1, in GPUModelRunner.load_model(self)\n    x\n",
}


@pytest.mark.parametrize("frame", sorted(NOTEBOOK_FRAMES))
def test_a_notebook_frame_in_a_clients_text_names_nothing(frame):
    """Found nothing: in the grammar crash (headed, and the prefixed re-print alone), the ASGI report and
    the JSON-mode crash, a client's notebook-shaped frame does not end the report."""
    base_log = real_log(BASE)
    begin = "<fn\n" + NOTEBOOK_FRAMES[frame] + OOM
    for headed in (True, False):
        _check(
            _with(base_log, _grammar_crash(begin, headed), "end"),
            _with(base_log, _grammar_crash("<fn\nhello", headed), "end"),
            frame,
        )
    _check(
        _with(base_log, _asgi("x\n" + NOTEBOOK_FRAMES[frame] + OOM), "end"), _with(base_log, _asgi("x"), "end"), frame
    )
    _json_check(begin, "<fn\nhello", True, frame)


REAL_TEXT = REAL_JSON.read_text()
FAILURE_AT = REAL_TEXT.index('{"asctime": "2026-12-02 07:36:38,784"')


@pytest.mark.parametrize(
    "log",
    [
        REAL_TEXT[:FAILURE_AT] + "x" * (lr.RECORD_MAX + 5) + "\n" + REAL_TEXT[FAILURE_AT:],
        REAL_TEXT[:FAILURE_AT] + "x" * (3 * 2**20) + "\n" + REAL_TEXT[FAILURE_AT:],
        "y\n" * ((CHUNK - FAILURE_AT - 10) // 2) + REAL_TEXT,  # the failure record across a chunk boundary
        "y\n" * ((CHUNK - FAILURE_AT) // 2) + REAL_TEXT,
    ],
    ids=["after-a-line-over-record-max", "after-a-3-mib-line", "across-a-chunk-boundary", "at-a-chunk-boundary"],
)
def test_the_decisive_record_is_read_wherever_it_lies(log):
    d = classify(Signals(log=log))
    assert d.cause == "kv_cache_insufficient" and d.numbers["estimated_max_model_len"] == 524160


@pytest.mark.parametrize("prefix", ["> ", "[vllm] ", "Dec 01 12:00:00 host vllm[1]: "])
def test_a_short_paste_keeps_the_request_loggers_lines_user_text(prefix):
    paste = (
        f"{prefix}(APIServer pid=1) INFO 12-01 10:00:00 [logger.py:41] Received request c: prompt: 'x'\n"
        f"{prefix}ZZ\n{prefix}(APIServer pid=1) INFO 12-01 10:00:00 [logger.py:41] {OOM}\n"
    )
    lines = scan(paste).lines
    assert [ln.origin for ln in lines if "logger.py" in ln.raw] == [USER, USER]
    d = classify(Signals(log=paste))
    assert not d.is_memory and "ZZUSERZZ" not in json.dumps(d.to_dict())
