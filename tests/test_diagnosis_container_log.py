"""The node's container log files (CRI's `<time> stderr F|P `, docker's json-file records;
diagnosis/container_log.py) are read as the lines the container wrote: split records are joined within
their stream, a per-line time ends no exception's message, and malformed or hostile records raise
nothing and hand a client's text no line of the engine's."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify
from vllm_autoheal.diagnosis.container_log import JOINED_MAX, unpacked

from crafted.bases import BASES, OOM, real_log, with_lines
from crafted.checks import assert_reads_like, diagnosis_fields, said
from crafted.exceptions import CLIENT_FORMATS, add_lora_failure, hf_download_failure, preprocess_error
from crafted.node_logs import cri_log, docker_log
from crafted.reports import ASGI


def _timestamps(log: str) -> str:
    """`kubectl logs --timestamps`: each line its own RFC 3339 time."""
    return (
        "\n".join(f"2025-01-01T00:00:00.{123456789 + i:09d}Z {line}" for i, line in enumerate(log.splitlines())) + "\n"
    )


# --- A long line the runtime split into records ----------------------------------------------
REQUEST_DETAILS = (
    "(APIServer pid=7) DEBUG 12-01 10:00:01 [logger.py:35] Request chatcmpl-9f2 details: prompt: {r}, "
    "prompt_token_ids: [151644, 872], prompt_embeds shape: None."
)


SPLIT_FORMATS = {"cri": lambda log: cri_log(log, record=16384), "docker": lambda log: docker_log(log, record=16384)}


@pytest.mark.parametrize("fmt", sorted(SPLIT_FORMATS))
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "model-not-found.log"])
def test_a_long_prompt_split_into_records_is_still_the_clients(base_name, fmt):
    """A 60 KB prompt (--enable-log-requests; --max-log-len is unlimited by default) that repeats an OOM
    message: the runtime writes its line as 16 KiB records, and every record after the first opens with
    the client's words. Read record by record, neg-2734 not_oom would turn runtime_oom, model-not-found not_oom -> unknown
    signals_disagree, quoting `...o allocate 64.00 GiB ... ZZUSERZZ` (docker: the raw record `{"log": "o
    allocate...`). It should read as `kubectl logs` gives the same log (the records joined): a P record,
    or a docker record without its newline, goes on in the next one."""
    to_file = SPLIT_FORMATS[fmt]
    base_log = real_log(base_name)
    crafted = with_lines(base_log, REQUEST_DETAILS.format(r=repr((OOM + " ") * 400)), "end")
    harmless = with_lines(base_log, REQUEST_DETAILS.format(r=repr("hello " * 10000)), "end")
    assert_reads_like(to_file(crafted), to_file(harmless), fmt)


# --- A docker record longer than MAX_LINE keeps its JSON -------------------------------------
TOOL_PARSER = "(APIServer pid=7) DEBUG 12-01 10:00:05 [hermes_tool_parser.py:240] delta_text: "


LONG_RECORDS = {
    # serving_chat.py's per-request error (REQUEST by its file): a template's own message
    "template-error": lambda p: preprocess_error("jinja2.exceptions.TemplateError: " + p),
    # a tool parser's line (USER by its file): the model's output
    "tool-parser": lambda p: TOOL_PARSER + p,
}


@pytest.mark.parametrize("pad", [100, 9000], ids=["short", "over-max-line"])
@pytest.mark.parametrize("record", sorted(LONG_RECORDS))
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "local-h200-runtime"])
def test_a_long_docker_record_is_read_by_its_header(base_name, record, pad):
    """Unfixed, over-max-line: neg-2734 not_oom -> runtime_oom; local-h200-runtime keeps runtime_oom but
    quotes `{"log": "ERROR 07-03 03:19:15 [serving_chat.py:200] jinja2.exceptions.TemplateError: torch.
    OutOfMemoryError: ... ZZUSERZZ` and takes the client's numbers. scan() cuts each kept line to MAX_LINE
    (8192) before `_unwrapped`, the JSON no longer parses, and the line keeps `{"log": "` before vLLM's
    header: no header, no file, so no REQUEST or USER origin. It should read as the same line in plain
    text does (the short records do: found nothing there)."""
    base_log = real_log(base_name)
    carry = LONG_RECORDS[record]
    crafted = with_lines(base_log, carry(OOM + " " + "x" * pad), "middle")
    harmless = with_lines(base_log, carry("hello " + "x" * pad), "middle")
    assert_reads_like(docker_log(crafted), docker_log(harmless), record)


# --- A per-line time is no new message ------------------------
NEWLINE_CARRIERS = {
    "add-lora": lambda p: add_lora_failure("a\n" + p, "/adapters/a"),
    "hub-download": lambda p: hf_download_failure("a\n" + p),
}


STAMPED = {"cri": cri_log, "kubectl-timestamps": _timestamps}


@pytest.mark.parametrize("fmt", sorted(STAMPED))
@pytest.mark.parametrize("carrier", sorted(NEWLINE_CARRIERS))
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "local-h200-runtime"])
def test_a_per_line_time_does_not_end_an_exceptions_message(base_name, carrier, fmt):
    """The one-newline carriers, in a log whose every line has its own time. Were the time a new message, neg-2734
    not_oom would turn runtime_oom quoting `torch.OutOfMemoryError: ... ZZUSERZZ failed: No adapter found ...`;
    local-h200-runtime's evidence and numbers become the client's (tried_gib 64). `continues_message`
    compares `header` as printed, time included (Placement and `_continuations` remove a collector's time
    first). It should read as the same log without the times does."""
    stamp = STAMPED[fmt]
    base_log = real_log(base_name)
    carry = NEWLINE_CARRIERS[carrier]
    assert_reads_like(
        stamp(with_lines(base_log, carry(OOM), "middle")),
        stamp(with_lines(base_log, carry("hello"), "middle")),
        carrier,
    )


# --- json.loads on a client's line ----------------------------------------------------------
@pytest.mark.parametrize("depth", [1200, 5000])
@pytest.mark.parametrize("base_name", ["local-h200-runtime", "kv-cache-too-small.log"])
def test_a_deeply_nested_json_line_does_not_void_the_diagnosis(base_name, depth):
    """A further line of a client's ASGI exception message (a plain-text log, `kubectl logs`) that opens
    with `{"log":` and `depth` brackets. Were json.loads' RecursionError not caught, runtime_oom / kv_cache_insufficient would turn unknown (no
    subtype), `could not read the signals: RecursionError`: catching ValueError only is not enough. It
    reads as the same traceback with a harmless line there (json.loads may fail in any way: the
    line is then what it is)."""
    base_log = real_log(base_name)
    crafted = classify(Signals(log=with_lines(base_log, ASGI + '{"log":' + "[" * depth, "end")))
    harmless = classify(Signals(log=with_lines(base_log, ASGI + "hello", "end")))
    assert harmless.cause in MEMORY_CAUSES
    assert diagnosis_fields(crafted) == diagnosis_fields(harmless), f"said {said(crafted)} ({crafted.explanation})"


@pytest.mark.parametrize(
    "line",
    [
        '{"log":"(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] x',  # cut
        '{"log":"\\ud800 \\udfff rror\\n","stream":"stderr"}',  # lone surrogates
        '{"log":["rror"]}',  # log not a string
        '{"log":"rror\\n"} trailing',  # extra data
        '{"log":"rror", "a": ' + "1" * 5000 + "}",  # past int's digit limit
        '{"log":' + "[" * 900 + "]" * 900 + "}",  # nested, under the recursion limit
        '{"log":"' + "\\u0041" * 1300 + ' rror\\n"}',  # escapes
    ],
    ids=["cut", "surrogates", "not-a-string", "extra-data", "long-int", "nested-900", "escapes"],
)
def test_malformed_docker_records_are_read_as_they_are(line):
    """Each is a plain line (or the text it holds) and classify raises nothing."""
    base_log = real_log("local-h200-runtime")
    d = classify(Signals(log=with_lines(base_log, ASGI + line, "end")))
    assert (d.cause, d.subtype) == ("runtime_oom", "oom_in_serving"), d.explanation


# --- The node's zone in a CRI time ------------------------------------------------------
def test_a_cri_time_with_a_zone_offset_is_a_known_prefix():
    """containerd and CRI-O write time.Now() in RFC3339Nano, in the node's zone: `...+01:00` on a node not
    kept in UTC. Unless the zone is read as part of the time, `+01:00 stderr F ` stays on every line, no header is read, and serving_chat.py's
    template error quoting a client's OOM is the engine's: not_oom would turn runtime_oom quoting `+01:00 stderr F
    ERROR 07-03 03:19:15 [serving_chat.py:200] jinja2.exceptions.TemplateError: torch.OutOfMemoryError:
    ... ZZUSERZZ`. It reads as the same file in UTC does (not_oom nccl_timeout)."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    crafted = with_lines(base_log, preprocess_error("jinja2.exceptions.TemplateError: " + OOM), "middle")
    utc = classify(Signals(log=cri_log(crafted)))
    zoned = classify(Signals(log=cri_log(crafted, zone="+01:00")))
    assert (utc.cause, utc.subtype) == ("not_oom", "nccl_timeout")
    assert (zoned.cause, zoned.subtype) == (utc.cause, utc.subtype), f"said {said(zoned)}"
    assert "ZZUSERZZ" not in json.dumps(zoned.to_dict())


# --- What holds -----------------------------------------------------------------------------------------------
def test_a_docker_json_spelled_line_in_a_clients_message_is_still_the_message():
    """A further line of the client's ASGI message written as a docker record of a bare OOM: unwrapped, it
    is still a further line (no header), as in plain text."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    record = json.dumps({"log": OOM + "\n", "stream": "stderr", "time": "2025-01-01T00:00:00Z"})
    assert_reads_like(
        with_lines(base_log, ASGI + record, "end"), with_lines(base_log, ASGI + "hello", "end"), "json-spelled"
    )


def test_a_docker_record_with_vllms_header_in_a_clients_message():
    """Once a strict xfail (one more spelling of VLLM_HEADER_IN_A_MESSAGE):
    a docker record inside a plain-text log is no longer unwrapped line by line (a node's log file is
    told by its first line, for the whole input), so the record is a further line of the client's
    message, as any text there."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    forged = "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] " + OOM
    record = json.dumps({"log": forged + "\n", "stream": "stderr", "time": "2025-01-01T00:00:00Z"})
    assert_reads_like(
        with_lines(base_log, ASGI + record, "end"), with_lines(base_log, ASGI + "hello", "end"), "json header"
    )


SINGLE_LINE_FORMATS = sorted(set(CLIENT_FORMATS) - {"add-lora", "add-lora-runtime-error", "hub-download"})


FILE_FORMATS = {"cri": cri_log, "docker": docker_log}


@pytest.mark.parametrize("fmt", sorted(FILE_FORMATS))
@pytest.mark.parametrize("client", SINGLE_LINE_FORMATS)
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "local-h200-runtime"])
def test_single_line_client_formats_change_nothing_in_node_log_files(base_name, client, fmt):
    """The client formats (one line of the client's each, or the ASGI
    message's first further line) read in a CRI (UTC) or docker json file as in plain text."""
    to_file, carry = FILE_FORMATS[fmt], CLIENT_FORMATS[client]
    base_log = real_log(base_name)
    assert_reads_like(
        to_file(with_lines(base_log, carry(OOM), "middle")),
        to_file(with_lines(base_log, carry("hello"), "middle")),
        client,
    )


# --- Partial records joined across streams -------------------------------------------------------
PROMPT_HEAD = "(APIServer pid=7) INFO 12-01 10:00:01 [logger.py:41] Received request chatcmpl-9f2: prompt: '"


STDERR_LINE = "INFO 12-01 10:00:01 [metrics.py:1] Avg prompt throughput: 1.0 tokens/s"


def _cri_records(records: list[tuple[str, str, str]]) -> str:
    return "".join(f"2025-01-01T00:00:{i % 60:02d}.{i:09d}Z {s} {f} {t}\n" for i, (s, f, t) in enumerate(records))


def _interleaved(base_log: str, tail: str, fmt: str) -> str:
    """The base log on stderr, then a 16 KiB prompt line on stdout whose F record comes after a stderr
    record (two goroutines copy the two pipes into one file)."""
    first, last = PROMPT_HEAD + "x" * 16000, tail + "', params: SamplingParams(n=1)"
    if fmt == "cri":
        records = [("stderr", "F", line) for line in base_log.splitlines()]
        return _cri_records(records + [("stdout", "P", first), ("stderr", "F", STDERR_LINE), ("stdout", "F", last)])
    records = [(line + "\n", "stderr") for line in base_log.splitlines()]
    records += [(first, "stdout"), (STDERR_LINE + "\n", "stderr"), (last + "\n", "stdout")]
    return "".join(json.dumps({"log": text, "stream": s, "time": "2025-01-01T00:00:00Z"}) + "\n" for text, s in records)


@pytest.mark.parametrize("fmt", ["cri", "docker"])
@pytest.mark.parametrize("base_name", BASES)
def test_a_long_prompts_records_are_joined_within_their_stream(base_name, fmt):
    """Unfixed: neg-2734 not_oom nccl_timeout -> runtime_oom, memory-limit-kill host_ram_oom ->
    cudagraph_capture_oom, quoting `torch.OutOfMemoryError: ... ZZUSERZZ', params: ...`: the stdout P record is
    joined with the stderr record after it, and the prompt's last piece starts a headerless line. It should
    say what the same records with a harmless tail say: a P record goes on in the next record of its stream."""
    base_log = real_log(base_name)
    assert_reads_like(_interleaved(base_log, OOM, fmt), _interleaved(base_log, "hello", fmt), fmt)


# --- container_log.py -------------------------------------------------------------------------------------
def _one_docker(text: str) -> str:
    return json.dumps({"log": text, "stream": "stderr", "time": "2025-01-01T00:00:00Z"}) + "\n"


def test_an_endless_partial_chain_is_one_capped_line():
    """40 MiB of partial records (CRI and docker) give one line of at most JOINED_MAX
    characters, and nothing raises."""
    piece = "y" * 16384
    cri = "2025-01-01T00:00:00Z stderr F first\n" + f"2025-01-01T00:00:00Z stdout P {piece}\n" * 2500
    docker = _one_docker("first\n") + _one_docker(piece) * 2500
    for log in (cri, docker):
        out = "".join(unpacked([log[i : i + 2**20] for i in range(0, len(log), 2**20)]))
        lines = out.split("\n")
        assert lines[0] == "first" and len(lines[1]) == JOINED_MAX and lines[2:] == [""]
        classify(Signals(log=log))


PROMPT = "(APIServer pid=7) INFO 12-01 10:00:01 [logger.py:41] Received request chatcmpl-9f2: prompt: 'a"


USER_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ"


JSON_TRICKS = {  # the request logger's line (user text) as docker writes it, a client's character in its prompt
    "line-separator": _one_docker(PROMPT + "\u2028" + USER_OOM + "'\n"),
    "next-line": _one_docker(PROMPT + "\x85" + USER_OOM + "'\n"),
    "vertical-tab": _one_docker(PROMPT + "\x0b\x0c\x1c" + USER_OOM + "'\n"),
    "carriage-return": _one_docker(PROMPT + "\r" + USER_OOM + "'\n"),
    "escaped-escape": _one_docker(PROMPT + "\\n" + USER_OOM + "'\n"),
    # (no docker writes these: a newline inside a record's log, a lone surrogate, a record cut or not JSON)
    "inner-newline": _one_docker(PROMPT + "\n" + USER_OOM + "'\n"),
    "lone-surrogate": '{"log": "' + PROMPT + " \\ud800 " + USER_OOM + '\\n"}\n',
    "truncated": '{"log": "' + PROMPT + " " + USER_OOM + "\n",
    "nested": '{"log": ' + "[" * 5000 + "]" * 5000 + "}\n",
}


@pytest.mark.parametrize("trick", sorted(JSON_TRICKS))
def test_docker_json_escapes_start_no_line_and_raise_nothing(trick):
    """In a docker json file, a character of the client's in a request log line that some
    readers take for a line break (U+2028, NEL, VT/FF/FS, CR, an escaped backslash-n), a newline inside a
    record's log (replaced by a blank), or a record that does not decode (kept as its raw text, user text
    by its words) starts no engine line and raises nothing."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    head = docker_log(base_log)
    crafted = head + JSON_TRICKS[trick]
    harmless = head + _one_docker(PROMPT + "'\n")
    d, want = classify(Signals(log=crafted)), classify(Signals(log=harmless))
    assert (d.cause, d.subtype) == (want.cause, want.subtype), f"said {said(d)}; should say {said(want)}"
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


@pytest.mark.parametrize("record", ["cri", "docker"])
def test_records_in_a_plain_text_log_are_text(record):
    """A plain-text log (first line plain) is read as it is; a client's record-shaped line
    in its ASGI message is a further line of that message."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    line = "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] " + OOM
    shaped = _cri_records([("stderr", "F", line)]) if record == "cri" else _one_docker(line + "\n")
    assert_reads_like(with_lines(base_log, ASGI + shaped, "end"), with_lines(base_log, ASGI + "hello", "end"), record)


@pytest.mark.parametrize("first", ["zone", "blank-lines"])
def test_a_cri_file_is_told_by_its_first_real_line(first):
    """A zone offset, or blank lines before the first record, still read as CRI."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    cri = cri_log(base_log, zone="+01:00") if first == "zone" else "\n\n" + cri_log(base_log)
    assert classify(Signals(log=cri)).cause == classify(Signals(log=base_log)).cause
