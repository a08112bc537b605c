"""vLLM's JSON log records (`--logging-config.formatter json`) are read as its text formatter
prints them (diagnosis/log_records.py): the same failures, the request logger's records still user
text, and a record a client writes where a raw line can go decides nothing."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis import log_records as lr
from vllm_autoheal.diagnosis.corpus import context, load
from vllm_autoheal.diagnosis.origin import USER
from vllm_autoheal.diagnosis.scan import CHUNK, scan

from crafted.bases import BASE, CORPUS, FIXTURES, OOM, REAL_CPU, ROOT, real_log, with_lines
from crafted.checks import assert_reads_like, said
from crafted.grammar import FRAME, assert_json_reads_like, grammar_traceback
from crafted.node_logs import COLLECTORS
from crafted.records import (
    ILLEGAL_ACCESS,
    JSON_START,
    PREPROC_ERROR,
    REAL_JSON,
    RUNTIME_OOM,
    TORCH_OOM,
    as_json_records,
    record,
)
from crafted.reports import asgi


@pytest.mark.parametrize("name", ["kv-cache-too-small", "kv-larger-than-machine", "memory-share-exceeds-free"])
def test_a_real_vllm_json_log_is_read_as_its_text_twin(name):
    """The real CPU engine (vLLM 0.32) with --logging-config.formatter json, started as for the text
    log of the same name (tests/test_serve_real_vllm.py's cases): the same cause, subtype and figures
    (the machine's sizes aside), and the engine's own line as evidence, not its JSON."""
    d = classify(Signals(log=(REAL_CPU / f"{name}-json.log").read_text()))
    text = classify(Signals(log=(REAL_CPU / f"{name}.log").read_text()))
    assert (d.cause, d.subtype, sorted(d.numbers)) == (text.cause, text.subtype, sorted(text.numbers))
    assert d.is_memory and d.evidence[0].startswith("ValueError: ")
    if name == "kv-cache-too-small":
        assert d.numbers["estimated_max_model_len"] == 524160


def test_a_record_prints_its_header_before_every_line_of_its_message_and_traceback():
    lines = lr.render(record("EngineCore failed to start.", "Traceback (most recent call last):\nValueError: x"))
    assert lines == [
        "(EngineCore_DP0 pid=2441) ERROR 12-01 10:00:00 [core.py:0000000] EngineCore failed to start.",
        "(EngineCore_DP0 pid=2441) ERROR 12-01 10:00:00 [core.py:0000000] Traceback (most recent call last):",
        "(EngineCore_DP0 pid=2441) ERROR 12-01 10:00:00 [core.py:0000000] ValueError: x",
    ]
    assert lr.render(record("x"), 7)[0].endswith("[core.py:0000007] x")  # (each record a message of its own)
    scanned = scan("\n".join(lines) + "\n").lines
    assert [ln.text for ln in scanned][-1] == "ValueError: x" and scanned[0].source_file == "core.py"
    assert lr.is_decoded(scanned[0].header)


@pytest.mark.parametrize(
    "line",
    [
        '{"log": "x\\n", "stream": "stderr"}',  # no logger's record (docker's: container_log.py)
        '{"levelname": "LOUD", "message": "x"}',  # not a level
        '{"levelname": "ERROR", "message": 3}',
        '{"levelname": "ERROR", "message": "x"',  # cut
        "[" * 100000,
        '{"levelname": "ERROR", "message": "' + "x" * lr.RECORD_MAX + '"}',  # longer than a record may be
    ],
)
def test_anything_else_is_left_as_it_is(line):
    assert lr.render(line) is None
    assert "".join(lr.decoded([line + "\n"])) == line + "\n"


@pytest.mark.parametrize(
    "line",
    [
        '{"levelname": "INFO", "message": "x"} \t\r',  # blanks loads allows after the value
        '{"levelname": "INFO", "message": "x"}\x0b',  # ... and one it does not
        '{"levelname": "INFO", "message": "x"} }',  # extra data
        '{"levelname": "INFO", "message": "x", "process": NaN}',  # a constant loads reads
        '{"levelname": "INFO", "message": "x", "processName": "P", "process": true}',  # a bool is no pid
        '{"levelname": "INFO", "message": "x", "processName": "P", "process": 7.0}',
        '{"levelname": "INFO", "message": "x", "processName": "P", "process": 7}',
        '{"levelname": "INFO", "message": "x", "exc_info": null, "stack_info": ""}',  # no traceback after all
        '{"levelname": "INFO", "message": "x", "name": ["vllm"]}',  # a value no cache can key on
        '{"levelname": "INFO", "message": "\\u0078", "x": ' + "[" * 5000 + "]" * 5000 + "}",  # deeply nested
        '{"levelname": "INFO", "message" x}',
        '{"levelname": "INFO", "message": "x\u0000"}',  # (loads is strict: a control character is refused)
    ],
)
def test_a_record_is_read_as_json_loads_reads_it(line):
    """render parses with json.loads's C scanner, called directly (a flood of the smallest records
    costs its calls): it takes exactly the lines loads takes, and reads them as loads does."""
    try:
        loaded = json.loads(line)
    except (ValueError, RecursionError):
        loaded = None
    printed = lr.render(line, 3)
    assert (printed is not None) == (loaded is not None)
    if printed is not None:
        assert printed[-1].endswith("3] " + loaded["message"].replace("\n", " "))
        expected = "(P pid=7) " if line.endswith('"process": 7}') else "(P) " if "processName" in line else ""
        assert printed[0].startswith(expected + "INFO 01-01 00:00:00 [record.py:")


def test_a_record_of_many_short_lines_prints_at_most_three_times_its_size_and_keeps_both_ends():
    line = record("opening\n" + "x\n" * 5000 + "ValueError: the end")
    printed = lr.render(line)
    assert sum(len(p) + 1 for p in printed) <= lr.GROWTH * len(line) + len(printed[0])
    assert printed[0].endswith("opening") and printed[-1].endswith("ValueError: the end")
    assert sum(p.endswith(lr.GAP) for p in printed) == 1


def test_a_line_longer_than_a_record_hides_no_record_in_its_next_chunk():
    long = "x" * (lr.RECORD_MAX + 10)
    forged = record("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB.")
    out = "".join(lr.decoded([long, forged + "\n", "tail\n"]))
    assert out == long + forged + "\ntail\n"


KV_CHECK = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (1.0 GiB). Based on the available memory, the "
    "estimated maximum model length is 2048."
)


REQUEST_LOGGER = "vllm.entrypoints.serve.utils.request_logger"  # vLLM 0.32; vllm.entrypoints.logger before


USER_RECORDS = {
    "output, repr in double quotes": lambda f: record(
        f"Generated response cmpl-1: output: {repr(chr(39) + f)}, finish_reason: stop",
        level="INFO",
        name=REQUEST_LOGGER,
    ),
    "prompt over lines": lambda f: record(
        f"Request cmpl-3 details: prompt: 'hi'\n{f}, prompt_token_ids: [1]", level="DEBUG", name=REQUEST_LOGGER
    ),
    "request body": lambda f: record(
        "Request cmpl-4 JSON body: " + json.dumps({"prompt": f}), level="DEBUG", name=REQUEST_LOGGER
    ),
    "older request logger": lambda f: record(
        f"Received request cmpl-5: prompt: 'x\n{f}'", level="INFO", name="vllm.entrypoints.logger"
    ),
}


@pytest.mark.parametrize("quoted", ["kv", "torch-oom"])
@pytest.mark.parametrize("kind", sorted(USER_RECORDS))
@pytest.mark.parametrize("crash", ["illegal-access", "runtime-oom"])
def test_a_clients_text_in_the_request_loggers_records_decides_nothing(kind, quoted, crash):
    start = REAL_JSON.read_text().split('{"asctime"', 1)[0]
    forged = USER_RECORDS[kind](KV_CHECK if quoted == "kv" else TORCH_OOM)
    base = ILLEGAL_ACCESS if crash == "illegal-access" else RUNTIME_OOM
    d = classify(Signals(log=start + forged + "\n" + base + "\n"))
    alone = classify(Signals(log=start + base + "\n"))
    assert (d.cause, d.subtype, d.numbers) == (alone.cause, alone.subtype, alone.numbers)
    assert d.cause == ("not_oom" if crash == "illegal-access" else "runtime_oom")
    assert not any("cmpl-" in e or "64.00" in e or "131072" in e for e in d.evidence)
    assert all(ln.origin == USER for ln in scan(forged + "\n").lines)


def test_a_record_a_client_writes_into_a_re_printed_exception_decides_nothing():
    """A text log: a dying engine re-prints its exception without a header, and the exception's
    message is a client's (a grammar's trigger). A line of it that parses as a record stays in it."""
    forged = record("x", "Traceback (most recent call last):\n" + TORCH_OOM)
    reprint = (
        "Process EngineCore_DP0:\nTraceback (most recent call last):\n"
        '  File "/x/vllm/v1/engine/core.py", line 900, in run_busy_loop\n    self._process_engine_step()\n'
        '  File "/x/vllm/v1/structured_output/backend_xgrammar.py", line 129, in compile_grammar\n'
        "    ctx = self.compiler.compile_structural_tag(tags, triggers)\n"
        "ValueError: Trigger <fn\n"
    )
    log = "(EngineCore_DP0 pid=1) INFO 12-01 10:00:00 [core.py:1] serving\n"
    d = classify(Signals(log=log + reprint + forged + "\nhello\n"))
    harmless = classify(Signals(log=log + reprint + "hello\n"))
    assert (d.cause, d.subtype) == (harmless.cause, harmless.subtype) and not d.is_memory


def test_the_corpus_read_right_in_text_reads_the_same_as_json_records():
    """Every train-split log the classifier reads right reads the same with each vLLM logged message
    written as a JSON record (16 of 270 did not, before log_records.py)."""
    samples = [
        s for s in load(ROOT / "tests" / "corpus" / "corpus.jsonl") if s["split"] == "train" and s.get("failure_shown")
    ]
    changed, converted = [], 0
    for s in samples:
        ctx = context(s, pod_state=True)
        if classify(Signals(log=s["log"], **ctx)).cause != s["label"]:
            continue
        as_json = as_json_records(s["log"])
        converted += as_json != s["log"]
        if classify(Signals(log=as_json, **ctx)).cause != s["label"]:
            changed.append(s["id"])
    assert converted > 150 and changed == []


GPU_LOGS = FIXTURES / "gpu" / "failure-logs"


H200_JSON = {  # the scenario (tests/gpu/failure_logs.sh, JSON_LOGS=1) -> its cause, by construction
    "kvlen": "kv_cache_insufficient",
    "capture": "cudagraph_capture_oom",
    "profile": "profiling_oom",
    "runtime": "runtime_oom",
    "freemem": "gpu_util_exceeds_free",
}


@pytest.mark.parametrize("name", sorted(H200_JSON))
def test_real_h200_failures_logged_as_json_records_read_as_their_cause(name):
    """vLLM 0.25 on an H200, each line of its processes `(EngineCore pid=N) {record}` (the stdout
    decorator's prefix before the record): the cause the scenario made, the same as its text log's,
    and the engine's own line as evidence. (Before the prefix was read, 4 of the 5: the runtime OOM,
    logged only as a record, read as unknown.)"""
    log = (GPU_LOGS / f"{name}-json.log").read_text()
    assert log.count('{"asctime"') > 15 and "exc_info" in log
    d = classify(Signals(log=log, ready_before=name == "runtime"))
    text = classify(Signals(log=(GPU_LOGS / f"{name}.log").read_text(), ready_before=name == "runtime"))
    assert d.cause == H200_JSON[name] == text.cause and d.subtype == text.subtype
    assert d.evidence and not d.evidence[0].startswith("{") and '"asctime"' not in " ".join(d.evidence)


# --- A forged record ends a request's report -------------------------------------------
AFTER_RECORD = {
    "record-frame-oom": "x\n" + record("x") + "\n" + FRAME + OOM,
    "record-bare-header-oom": "x\n" + record("x") + "\nERROR 12-01 04:48:09 [core.py:710] " + OOM,
}


S9_HOLE = pytest.mark.xfail(
    strict=True,
    reason="older (test_diagnosis_exception_messages.py's xfail): a vLLM header on a line after uvicorn's headerless report "
    "is what a new logged message looks like; the record before it changes nothing",
)


@pytest.mark.parametrize("form", ["record-frame-oom", pytest.param("record-bare-header-oom", marks=S9_HOLE)])
@pytest.mark.parametrize("base_name", [BASE, "memory-limit-kill.log"])
def test_a_forged_record_does_not_end_a_requests_report_asgi(base_name, form):
    """Unfixed: neg-2734 not_oom -> runtime_oom oom_in_serving, memory-limit-kill host_ram_oom ->
    runtime_oom (cudagraph_capture_oom with the bare header), tried_gib 64, quoting ZZUSERZZ. The client's `{"levelname": "ERROR", "message": "x", ...}`
    line in the TemplateError's message sets request = None; the forged frame after it is then no longer the
    report's. Should say what the same report says with `hello` there."""
    base_log = real_log(base_name)
    assert_reads_like(
        with_lines(base_log, asgi(AFTER_RECORD[form]), "end"), with_lines(base_log, asgi("x\nhello"), "end"), form
    )


@pytest.mark.parametrize("logged", [True, False], ids=["logged-and-reprint", "reprint-only"])
@pytest.mark.parametrize("form", sorted(AFTER_RECORD))
def test_a_forged_record_does_not_end_a_requests_report_json_reprint(form, logged):
    """Unfixed: not_oom other_error -> weights_load_oom oom_in_load, tried_gib 64, quoting ZZUSERZZ (the
    JSON-mode re-print has no prefix: the client's record line starts a line)."""
    assert_json_reads_like("<fn\n" + AFTER_RECORD[form].removeprefix("x\n"), "<fn\nhello", logged, form)


def test_a_forged_record_does_not_end_a_requests_report_text_reprint():
    """Unfixed: neg-2734 not_oom -> runtime_oom (a text log whose engine re-prints without a prefix: the
    CPU engine, tests/fixtures/vllm-cpu/kv-cache-too-small.log). Should: not_oom."""
    base_log = real_log(BASE)
    reprint = lambda begin: "Process EngineCore:\n" + grammar_traceback(begin)  # noqa: E731
    begin = "<fn\n" + record("x") + "\n" + FRAME + OOM
    assert_reads_like(
        with_lines(base_log, reprint(begin), "end"), with_lines(base_log, reprint("<fn\nhello"), "end"), "text reprint"
    )


RESISTED = {
    "record-alone": "x\n" + record("x", "Traceback (most recent call last):\n" + OOM),
    "record-then-oom": "x\n" + record("x") + "\n" + OOM,
    "frame-without-record": "x\n" + FRAME + OOM,
}


@pytest.mark.parametrize("form", sorted(RESISTED))
@pytest.mark.parametrize("base_name", [BASE, "memory-limit-kill.log"])
def test_a_forged_record_alone_names_nothing(base_name, form):
    """The decoded lines stay in the message (the new rule), and without a record the
    report holds a forged frame."""
    base_log = real_log(base_name)
    assert_reads_like(
        with_lines(base_log, asgi(RESISTED[form]), "end"), with_lines(base_log, asgi("x\nhello"), "end"), form
    )
    assert_json_reads_like("<fn\n" + RESISTED[form].removeprefix("x\n"), "<fn\nhello", False, form)


@pytest.mark.parametrize("crash", ["runtime-oom", "illegal-access"])
def test_a_request_record_before_the_fatal_record_hides_nothing(crash):
    """Unfixed: weights_load_oom oom_in_load / not_oom illegal_memory_access -> unknown, nothing quoted: the
    fatal record's lines are USER (scan._continuations: same key as the open user-text message). Should
    say what the crash says alone."""
    fatal = RUNTIME_OOM if crash == "runtime-oom" else ILLEGAL_ACCESS
    alone = classify(Signals(log=JSON_START + fatal + "\n"))
    d = classify(Signals(log=JSON_START + PREPROC_ERROR + "\n" + fatal + "\n"))
    assert alone.cause in ("weights_load_oom", "not_oom")
    assert (d.cause, d.subtype) == (alone.cause, alone.subtype), f"said {said(d)}; should say {said(alone)}"


# --- JSON records under a collector's prefix ---------------------------------------------
@pytest.mark.parametrize("collector", ["compose", "kubectl-timestamps"])
@pytest.mark.parametrize("sample_id", ["local-h200-runtime", "prof-27508-gptoss120b-sampler"])
def test_json_records_under_a_collectors_prefix_are_read(sample_id, collector):
    """Unfixed: runtime_oom / profiling_oom -> unknown (the same text under the same prefix reads right;
    so do the records without it). Should: the label."""
    s = CORPUS[sample_id]
    ctx = context(s, pod_state=True)
    records = as_json_records(s["log"])
    assert classify(Signals(log=records, **ctx)).cause == s["label"]
    assert classify(Signals(log=COLLECTORS[collector](s["log"]), **ctx)).cause == s["label"]
    d = classify(Signals(log=COLLECTORS[collector](records), **ctx))
    assert d.cause == s["label"], f"said {said(d)}"


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
