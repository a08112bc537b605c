"""A second hostile review of 51785c1..287c2db (operator/): the fixes after the s10 review (findings.py's
`continues_message` findings as `last_resort` only, a REQUEST line anchored at an engine exception's name
yielding only failure kinds, `_quoted` gone; classify.py's "went on" rule on ENGINE milestones and the
last one's offset; not_memory.py's bare EOFError) and the two new log formats in scan.py (the kubelet's
CRI prefix `<RFC3339> stderr F `, docker's json-file records read by `_unwrapped`).

What the review found (each test below that pins a problem FAILS on 287c2db and says what the classifier
said and what it should say):
1. (critical, older than this change) `continues_message` looks at the one line before: only the FIRST
   further line of an exception's message is the message's. A client's message with two newlines puts
   its third line after a plain line, and that line decides: not_oom -> runtime_oom, host_ram_oom ->
   runtime_oom, the client's text as evidence and its 64 GiB in the numbers. Every carrier the s9/s10
   reviews closed for one newline opens again (uvicorn's headerless ASGI traceback, the add_lora failure,
   the Hub download error, serving_chat's template and ValueError lines). Same on 51785c1 and f8a3c1a.
2. (high, new) A line longer than the runtime's 16 KiB is split into records (CRI `P` then `F`, docker
   json-file records without the trailing "\\n"). scan.py reads each record as a line of its own, so a
   long prompt (request logger), output or template text puts the client's words at the start of a
   headerless engine line: not_oom -> runtime_oom quoting ZZUSERZZ. (`kubectl logs` joins the records.)
3. (high, new) A docker record longer than MAX_LINE (8 KiB) is cut before `_unwrapped` reads it, so its
   JSON does not parse and the line stays `{"log": "<header> ...`: no prefix, no header, no file. What
   only the header tells (serving_chat.py's per-request errors, the tool and reasoning parsers' user
   text, FORGED, continuations) is lost: not_oom -> runtime_oom with the raw JSON as evidence.
4. (high; older for `kubectl logs --timestamps`, new for CRI files) `continues_message` compares the
   headers as printed, the collector's or kubelet's own time included, which differs on every line
   (Placement and `_continuations` remove it first). In a CRI file no further line of a vLLM-headed
   exception message is one: the add_lora / Hub download newline carriers decide a memory cause again.
5. (medium, new) `_unwrapped` calls json.loads on any kept line that opens with `{"log":`: a client's
   headerless line (a further line of its exception message) of `{"log":` and 1000+ `[` raises
   RecursionError (not a ValueError), and classify answers `unknown: could not read the signals` for a
   log whose real runtime OOM it read before. No wrong change, but any real diagnosis is voided.
6. (medium-low, new) The CRI time is RFC3339Nano in the node's zone: `...123456789+01:00 stderr F ` is
   not a known prefix (the ISO alternative has no offset), so no line of such a file has its header
   read: a serving_chat.py template error quoting a client's OOM decides runtime_oom.
7. (low, this change) The further-line rule also takes another writer's line for the exception's message
   when both lack vLLM's header (their process prefixes are not compared): tqdm's "Loading safetensors
   checkpoint shards" bar printed after a weight-loading OOM no longer places it (weights_load_oom ->
   unknown oom_phase_unknown), an EngineDeadError after a CUDA error loses its phase. Corpus: the one test
   sample lost (weights-31273, weights_load_oom -> unknown) and two train phase changes are this shape.
8. (low, older) A further line's last-resort "not memory" is quoted as evidence: on a log with no other
   failure, the client's `CUDA error: ... ZZUSERZZ` line is the evidence of not_oom cuda_error.

What found nothing (tests that pass): a docker-json-spelled line inside a client's message is still the
message's (with vLLM's header inside it, it is one more spelling of s9's known xfail limit); single-line
client formats (prompt, grammar, error stack, template, request ValueError, the id formats) change
nothing in CRI (UTC) or docker json files; a CRI prefix after vLLM's header is a second header (FORGED);
a client's milestone on an add_lora REQUEST line in a CRI file does not drop a hang; malformed, truncated,
non-dict or surrogate-escaped `{"log":` lines raise nothing; NCCL's `Last error:` / `Cuda failure 'out of
memory'`, Ray's OutOfMemoryError and V1's `Worker failed with error 'CUDA out of memory` still read as
memory with vLLM's header on every line; the engine's own OOM right after a client's ASGI exception line
(with its header) still decides. Not found: a practical way for a client to make a real engine failure
a further line of its own exception line (it needs the engine's bare exception line to be written right
after the client's, an interleaving of two processes' writes).

Measured, not asserted (bench/diagnosis_accuracy.py's corpus, per-sample on 51785c1 vs 287c2db; nothing
tuned): log alone train 261/370 both, test 187 -> 186/312; with the pod's state train 271 both, test
199 -> 198 (weights-31273: item 7); 5 of 1364 classifications changed (3 phases). The same corpus as
CRI files: train 257, test 183 (log alone; -4 / -3 against plain text, the same as with `kubectl logs
--timestamps` on both commits: a collector's per-line time breaks `_wrapped`'s bare lines); as docker
json files: identical to plain text. Timings are in the review's report, not here.

Fixed after the review (53d1e94): a node's log file is told by its first line and decoded as a stream,
partial records joined back (diagnosis/container_log.py: 2, 3, 5, 6); a further line of an exception's
message chains to the message's end, by writer (logger header with a collector's time removed, process
prefix, rank: 1, 4, 7); it is the engine's own words only for an engine exception of a failure-carrying
type outside a request's traceback (NCCL's `Last error:` line), else it says "not memory" only as a
last resort and is never quoted (8). The docker record with vLLM's header inside a client's message,
a strict xfail here, now passes: inside a plain-text log a record is text like any other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted_logs import real_log  # noqa: E402
from test_diagnosis_injection import (  # noqa: E402
    ABORTED,
    _add_lora_failure,
    _hf_download_failure,
    _preprocess_error,
    _vllm_log,
    _with,
)
from test_diagnosis_s9_review import ASGI  # noqa: E402
from test_diagnosis_s10_review import CLIENT_FORMATS, HANG_BASES  # noqa: E402

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free. ZZUSERZZ"
)


def _key(d) -> dict:
    return {"cause": d.cause, "subtype": d.subtype, "phase": d.phase, "evidence": d.evidence, "numbers": d.numbers}


def _said(d) -> str:
    return f"{d.cause} {d.subtype} evidence={d.evidence[:1]} numbers={d.numbers}"


def _cri(log: str, zone: str = "Z", record: int | None = None) -> str:
    """The kubelet's CRI log file: `<RFC3339Nano> <stream> <F|P> <text>`, each line its own time; a line
    longer than `record` characters is split into P records and an F record (containerd: 16 KiB)."""
    out = []
    for i, line in enumerate(log.splitlines()):
        time = f"2025-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.{123456789 + i * 1000:09d}{zone}"
        parts = [line[k : k + record] for k in range(0, len(line), record)] if record and line else [line]
        out += [f"{time} stderr {'F' if j == len(parts) - 1 else 'P'} {p}" for j, p in enumerate(parts)]
    return "\n".join(out) + "\n"


def _docker(log: str, record: int | None = None) -> str:
    """docker's json-file log: one JSON record a line; a line longer than `record` characters is split
    into records whose "log" has no trailing newline but the last (docker: 16 KiB)."""
    out = []
    for i, line in enumerate(log.splitlines()):
        text = line + "\n"
        parts = [text[k : k + record] for k in range(0, len(text), record)] if record else [text]
        out += [
            json.dumps({"log": p, "stream": "stderr", "time": f"2025-01-01T00:00:{i % 60:02d}.{i:09d}Z"}) for p in parts
        ]
    return "\n".join(out) + "\n"


def _timestamps(log: str) -> str:
    """`kubectl logs --timestamps`: each line its own RFC 3339 time."""
    return (
        "\n".join(f"2025-01-01T00:00:00.{123456789 + i:09d}Z {line}" for i, line in enumerate(log.splitlines())) + "\n"
    )


def _check(crafted_log: str, harmless_log: str, what: str) -> None:
    crafted, harmless = classify(Signals(log=crafted_log)), classify(Signals(log=harmless_log))
    assert _key(crafted) == _key(harmless), f"{what}: said {_said(crafted)}; should say {_said(harmless)}"
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict()), f"{what}: the client's text is quoted"


# --- 1. The third line of a client's exception message (critical, older) ------------------------------------
THIRD_LINE_CARRIERS = {
    # uvicorn's headerless request traceback (the s9 review's), the client's message over three lines
    "asgi": lambda p: ASGI.replace("TemplateError: x\n", "TemplateError: " + p + "\n"),
    # POST /v1/load_lora_adapter: lora_name in LoRAAdapterNotFoundError's message (engine, REQUEST-scoped)
    "add-lora": lambda p: _add_lora_failure(p, "/adapters/a"),
    # a lora_path taken for a Hub repo: HFValidationError names it (engine, REQUEST-scoped)
    "hub-download": _hf_download_failure,
    # serving_chat.py's per-request errors (REQUEST): a template's raise_exception, a request ValueError
    "template": lambda p: _preprocess_error("jinja2.exceptions.TemplateError: " + p),
    "request-valueerror": lambda p: _preprocess_error("ValueError: " + p),
}


@pytest.mark.parametrize("carrier", sorted(THIRD_LINE_CARRIERS))
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "memory-limit-kill.log"])
def test_the_third_line_of_a_clients_exception_message_is_still_the_clients(base_name, carrier):
    """287c2db (and 51785c1, f8a3c1a): neg-2734 not_oom nccl_timeout -> runtime_oom oom_in_serving,
    memory-limit-kill host_ram_oom worker_sigkill -> runtime_oom, each quoting `torch.OutOfMemoryError:
    ... ZZUSERZZ` with tried_gib 64. `continues_message` asks only whether the line just before is an
    exception line: the message's second line ("a") is, its third line is not. It should say what the
    same carrier with a harmless message says: every further line of the message, up to a frame, a
    traceback line or a new logged message, is the message's."""
    carry = THIRD_LINE_CARRIERS[carrier]
    base_log = real_log(base_name)
    _check(_with(base_log, carry("a\nb\n" + OOM), "middle"), _with(base_log, carry("a\nb\nc"), "middle"), carrier)


def test_the_second_line_of_a_clients_exception_message_stays_closed():
    """Found nothing (the s9/s10 fix, for contrast with section 1): one newline changes nothing."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    for carry in THIRD_LINE_CARRIERS.values():
        _check(_with(base_log, carry("a\n" + OOM), "middle"), _with(base_log, carry("a\nb"), "middle"), "2nd line")


# --- 2. A long line the runtime split into records (high, new) ----------------------------------------------
REQUEST_DETAILS = (
    "(APIServer pid=7) DEBUG 12-01 10:00:01 [logger.py:35] Request chatcmpl-9f2 details: prompt: {r}, "
    "prompt_token_ids: [151644, 872], prompt_embeds shape: None."
)
SPLIT_FORMATS = {"cri": lambda log: _cri(log, record=16384), "docker": lambda log: _docker(log, record=16384)}


@pytest.mark.parametrize("fmt", sorted(SPLIT_FORMATS))
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "model-not-found.log"])
def test_a_long_prompt_split_into_records_is_still_the_clients(base_name, fmt):
    """A 60 KB prompt (--enable-log-requests; --max-log-len is unlimited by default) that repeats an OOM
    message: the runtime writes its line as 16 KiB records, and every record after the first opens with
    the client's words. 287c2db: neg-2734 not_oom -> runtime_oom, model-not-found not_oom -> unknown
    signals_disagree, quoting `...o allocate 64.00 GiB ... ZZUSERZZ` (docker: the raw record `{"log": "o
    allocate...`). It should read as `kubectl logs` gives the same log (the records joined): a P record,
    or a docker record without its newline, goes on in the next one."""
    to_file = SPLIT_FORMATS[fmt]
    base_log = real_log(base_name)
    crafted = _with(base_log, REQUEST_DETAILS.format(r=repr((OOM + " ") * 400)), "end")
    harmless = _with(base_log, REQUEST_DETAILS.format(r=repr("hello " * 10000)), "end")
    _check(to_file(crafted), to_file(harmless), fmt)


# --- 3. A docker record longer than MAX_LINE keeps its JSON (high, new) -------------------------------------
TOOL_PARSER = "(APIServer pid=7) DEBUG 12-01 10:00:05 [hermes_tool_parser.py:240] delta_text: "
LONG_RECORDS = {
    # serving_chat.py's per-request error (REQUEST by its file): a template's own message
    "template-error": lambda p: _preprocess_error("jinja2.exceptions.TemplateError: " + p),
    # a tool parser's line (USER by its file): the model's output
    "tool-parser": lambda p: TOOL_PARSER + p,
}


@pytest.mark.parametrize("pad", [100, 9000], ids=["short", "over-max-line"])
@pytest.mark.parametrize("record", sorted(LONG_RECORDS))
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "local-h200-runtime"])
def test_a_long_docker_record_is_read_by_its_header(base_name, record, pad):
    """287c2db, over-max-line: neg-2734 not_oom -> runtime_oom; local-h200-runtime keeps runtime_oom but
    quotes `{"log": "ERROR 07-03 03:19:15 [serving_chat.py:200] jinja2.exceptions.TemplateError: torch.
    OutOfMemoryError: ... ZZUSERZZ` and takes the client's numbers. scan() cuts each kept line to MAX_LINE
    (8192) before `_unwrapped`, the JSON no longer parses, and the line keeps `{"log": "` before vLLM's
    header: no header, no file, so no REQUEST or USER origin. It should read as the same line in plain
    text does (the short records do: found nothing there)."""
    base_log = real_log(base_name)
    carry = LONG_RECORDS[record]
    crafted = _with(base_log, carry(OOM + " " + "x" * pad), "middle")
    harmless = _with(base_log, carry("hello " + "x" * pad), "middle")
    _check(_docker(crafted), _docker(harmless), record)


# --- 4. A per-line time is no new message (high; older for --timestamps, new for CRI) ------------------------
NEWLINE_CARRIERS = {
    "add-lora": lambda p: _add_lora_failure("a\n" + p, "/adapters/a"),
    "hub-download": lambda p: _hf_download_failure("a\n" + p),
}
STAMPED = {"cri": _cri, "kubectl-timestamps": _timestamps}


@pytest.mark.parametrize("fmt", sorted(STAMPED))
@pytest.mark.parametrize("carrier", sorted(NEWLINE_CARRIERS))
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "local-h200-runtime"])
def test_a_per_line_time_does_not_end_an_exceptions_message(base_name, carrier, fmt):
    """The s10 review's one-newline carriers, in a log whose every line has its own time. 287c2db: neg-2734
    not_oom -> runtime_oom quoting `torch.OutOfMemoryError: ... ZZUSERZZ failed: No adapter found ...`;
    local-h200-runtime's evidence and numbers become the client's (tried_gib 64). `continues_message`
    compares `header` as printed, time included (Placement and `_continuations` remove a collector's time
    first). It should read as the same log without the times does."""
    stamp = STAMPED[fmt]
    base_log = real_log(base_name)
    carry = NEWLINE_CARRIERS[carrier]
    _check(stamp(_with(base_log, carry(OOM), "middle")), stamp(_with(base_log, carry("hello"), "middle")), carrier)


# --- 5. json.loads on a client's line (medium, new) ----------------------------------------------------------
@pytest.mark.parametrize("depth", [1200, 5000])
@pytest.mark.parametrize("base_name", ["local-h200-runtime", "kv-cache-too-small.log"])
def test_a_deeply_nested_json_line_does_not_void_the_diagnosis(base_name, depth):
    """A further line of a client's ASGI exception message (a plain-text log, `kubectl logs`) that opens
    with `{"log":` and `depth` brackets. 287c2db: runtime_oom / kv_cache_insufficient -> unknown (no
    subtype), `could not read the signals: RecursionError`: `_unwrapped` catches ValueError only. It
    should read as the same traceback with a harmless line there (json.loads may fail in any way: the
    line is then what it is)."""
    base_log = real_log(base_name)
    crafted = classify(Signals(log=_with(base_log, ASGI + '{"log":' + "[" * depth, "end")))
    harmless = classify(Signals(log=_with(base_log, ASGI + "hello", "end")))
    assert harmless.cause in MEMORY_CAUSES
    assert _key(crafted) == _key(harmless), f"said {_said(crafted)} ({crafted.explanation})"


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
    """Found nothing: each is a plain line (or the text it holds) and classify raises nothing."""
    base_log = real_log("local-h200-runtime")
    d = classify(Signals(log=_with(base_log, ASGI + line, "end")))
    assert (d.cause, d.subtype) == ("runtime_oom", "oom_in_serving"), d.explanation


# --- 6. The node's zone in a CRI time (medium-low, new) ------------------------------------------------------
def test_a_cri_time_with_a_zone_offset_is_a_known_prefix():
    """containerd and CRI-O write time.Now() in RFC3339Nano, in the node's zone: `...+01:00` on a node not
    kept in UTC. 287c2db: `+01:00 stderr F ` stays on every line, no header is read, and serving_chat.py's
    template error quoting a client's OOM is the engine's: not_oom -> runtime_oom quoting `+01:00 stderr F
    ERROR 07-03 03:19:15 [serving_chat.py:200] jinja2.exceptions.TemplateError: torch.OutOfMemoryError:
    ... ZZUSERZZ`. It should read as the same file in UTC does (not_oom nccl_timeout)."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    crafted = _with(base_log, _preprocess_error("jinja2.exceptions.TemplateError: " + OOM), "middle")
    utc = classify(Signals(log=_cri(crafted)))
    zoned = classify(Signals(log=_cri(crafted, zone="+01:00")))
    assert (utc.cause, utc.subtype) == ("not_oom", "nccl_timeout")
    assert (zoned.cause, zoned.subtype) == (utc.cause, utc.subtype), f"said {_said(zoned)}"
    assert "ZZUSERZZ" not in json.dumps(zoned.to_dict())


# --- 7. Another writer's line after an exception (low, this change) -----------------------------------------
WEIGHTS_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 MiB. GPU 0 has a total capacity of 79.19 "
    "GiB of which 60.69 MiB is free. Process 4242 has 79.10 GiB memory in use. Of the allocated memory 78.2 GiB is "
    "allocated by PyTorch, and 12.81 MiB is reserved by PyTorch but unallocated."
)
BAR = "Loading safetensors checkpoint shards:   3% Completed | 1/37 [00:02<01:39,  2.77s/it]"
NCCL_EXIT = (
    "[rank0]:[W1224 08:50:36.247935068 ProcessGroupNCCL.cpp:1524] Warning: WARNING: destroy_process_group() was "
    "not called before program exit, which can leak resources."
)


@pytest.mark.parametrize("prefix", ["(EngineCore_DP0 pid=7) ", ""], ids=["process-prefix", "bare"])
def test_tqdms_loading_bar_after_a_weight_loading_oom_still_places_it(prefix):
    """A cut log: the engine's OOM while loading weights, then tqdm's bar, closed at exit (the shape of two
    corpus samples). 51785c1: weights_load_oom oom_in_load. 287c2db: unknown oom_phase_unknown (the
    remedy is lost): the bar is taken for a further line of the OOM's message, so its marker places
    nothing. It should stay weights_load_oom: a line that is not the exception's writer's (no header on
    either, another prefix or none) is no further line of its message."""
    d = classify(Signals(log="\n".join([prefix + WEIGHTS_OOM, "", BAR, "", NCCL_EXIT]) + "\n"))
    assert (d.cause, d.subtype, d.phase) == ("weights_load_oom", "oom_in_load", "load"), f"said {_said(d)}"


# --- 8. A further line's last resort is quoted (low, older) --------------------------------------------------
def test_a_further_lines_last_resort_quotes_no_client_text():
    """A log that shows no failure (rt-3430, cut before its OOM) and a client's ASGI traceback whose
    message goes on over `CUDA error: bad ZZUSERZZ`. 287c2db (and 51785c1): not_oom cuda_error with
    evidence ['CUDA error: bad ZZUSERZZ']. A not-memory last resort may stand, but the line is the
    client's: its text should not be quoted."""
    base_log = real_log("rt-3430-lmcache-qwen3-8b-a5000-long-prompts")
    d = classify(Signals(log=_with(base_log, ASGI + "CUDA error: bad ZZUSERZZ", "end")))
    assert d.cause not in MEMORY_CAUSES
    assert "ZZUSERZZ" not in json.dumps(d.to_dict()), f"said {_said(d)}"


# --- What found nothing ---------------------------------------------------------------------------------------
def test_a_docker_json_spelled_line_in_a_clients_message_is_still_the_message():
    """A further line of the client's ASGI message written as a docker record of a bare OOM: unwrapped, it
    is still a further line (no header), as in plain text."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    record = json.dumps({"log": OOM + "\n", "stream": "stderr", "time": "2025-01-01T00:00:00Z"})
    _check(_with(base_log, ASGI + record, "end"), _with(base_log, ASGI + "hello", "end"), "json-spelled")


def test_a_docker_record_with_vllms_header_in_a_clients_message():
    """Was a strict xfail on 785d0ec (one more spelling of the s9 review's VLLM_HEADER_IN_A_MESSAGE):
    a docker record inside a plain-text log is no longer unwrapped line by line (a node's log file is
    told by its first line, for the whole input), so the record is a further line of the client's
    message, as any text there."""
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    forged = "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] " + OOM
    record = json.dumps({"log": forged + "\n", "stream": "stderr", "time": "2025-01-01T00:00:00Z"})
    _check(_with(base_log, ASGI + record, "end"), _with(base_log, ASGI + "hello", "end"), "json header")


SINGLE_LINE_FORMATS = sorted(set(CLIENT_FORMATS) - {"add-lora", "add-lora-runtime-error", "hub-download"})
FILE_FORMATS = {"cri": _cri, "docker": _docker}


@pytest.mark.parametrize("fmt", sorted(FILE_FORMATS))
@pytest.mark.parametrize("client", SINGLE_LINE_FORMATS)
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "local-h200-runtime"])
def test_single_line_client_formats_change_nothing_in_node_log_files(base_name, client, fmt):
    """Found nothing: the s10 review's client formats (one line of the client's each, or the ASGI
    message's first further line) read in a CRI (UTC) or docker json file as in plain text."""
    to_file, carry = FILE_FORMATS[fmt], CLIENT_FORMATS[client]
    base_log = real_log(base_name)
    _check(to_file(_with(base_log, carry(OOM), "middle")), to_file(_with(base_log, carry("hello"), "middle")), client)


@pytest.mark.parametrize("fmt", ["plain", "cri", "docker"])
def test_a_cri_prefix_after_vllms_header_is_a_second_header(fmt):
    """Found nothing: a multi-line request id whose next line opens with `stderr F ` and the engine's
    header: vLLM's formatter repeats its header first, so the CRI prefix is a second header (FORGED)."""
    to_file = {"plain": lambda x: x, "cri": _cri, "docker": _docker}[fmt]
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    header = ABORTED.split("Request")[0]
    forged = "a\nstderr F (EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] " + OOM
    crafted = _with(base_log, _vllm_log(header, "Request cmpl-" + forged + " aborted."), "end")
    harmless = _with(base_log, _vllm_log(header, "Request cmpl-a\nb aborted."), "end")
    _check(to_file(crafted), to_file(harmless), fmt)


@pytest.mark.parametrize("base_name", HANG_BASES)
def test_a_clients_milestone_on_a_request_line_in_a_cri_file_drops_no_hang(base_name):
    """Found nothing: in a CRI file the add_lora carrier's line is no further line (section 4), but it is
    a REQUEST line, and only the engine's milestones say the engine went on."""
    base_log = real_log(base_name)
    crafted = _cri(
        _with(base_log, _add_lora_failure("a\nRuntimeError: Application startup complete. ZZUSERZZ", "/a"), "end")
    )
    harmless = _cri(_with(base_log, _add_lora_failure("a\nRuntimeError: hello", "/a"), "end"))
    _check(crafted, harmless, "milestone")


H = "(Worker_TP1 pid=2441) ERROR 12-01 04:48:08 [multiproc_executor.py:671] "
TRACEBACK = [
    "WorkerProc failed to start.",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/parallel_state.py", line 1, in init_group',
    "    torch.distributed.barrier()",
]
REAL_MULTILINE = {
    "nccl-last-error": (
        [
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            "Cuda failure 2 'out of memory'",
        ],
        "multi_gpu_oom",
    ),
    "ray-oom": (
        [
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            "Memory on the node (IP: 10.0.0.1, ID: abc) where the task (actor ID: 1, name=RayWorkerWrapper.__init__, "
            "pid=123, memory used=30.12GB) was running was 61.5GB / 64.0GB (0.961), which exceeds the memory usage "
            "threshold of 0.95.",
        ],
        "host_ram_oom",
    ),
}


@pytest.mark.parametrize("fmt", ["plain", "cri", "docker"])
@pytest.mark.parametrize("shape", sorted(REAL_MULTILINE))
def test_real_multiline_memory_failures_still_read_as_memory(shape, fmt):
    """Found nothing: the memory failure NCCL and Ray print over further lines of an exception's message
    (vLLM's header on every line) is still read, in each file format."""
    lines, cause = REAL_MULTILINE[shape]
    log = "".join(H + line + "\n" for line in TRACEBACK + lines)
    to_file = {"plain": lambda x: x, "cri": _cri, "docker": _docker}[fmt]
    assert classify(Signals(log=to_file(log))).cause == cause


def test_the_engines_own_oom_right_after_a_clients_exception_line_still_decides():
    """Found nothing: a client's ASGI traceback written just before the engine's OOM line (vLLM's header on
    it): the OOM is no further line of the client's message."""
    base_log = real_log("local-h200-runtime")
    lines = base_log.splitlines()
    at = next(i for i, line in enumerate(lines) if "torch.OutOfMemoryError" in line)
    crafted = "\n".join(
        lines[:at] + ASGI.replace("TemplateError: x", "TemplateError: ZZUSERZZ").splitlines() + lines[at:]
    )
    d = classify(Signals(log=crafted + "\n"))
    base = classify(Signals(log=base_log))
    assert (d.cause, d.subtype, d.numbers) == (base.cause, base.subtype, base.numbers)
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())
