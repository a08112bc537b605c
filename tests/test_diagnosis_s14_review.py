"""A hostile review of 2293a10 (Ray's OutOfMemoryError is host memory; a bare OutOfMemoryError under Ray is
`unknown`) and 2b6048c (log_format.py: a logging header that is not vLLM's own, learned from the log's lines,
gives lines a level and a source file, or is cut as a wrapper's).

Each finding that reproduced was an xfail(strict=True) test that FAILED on 2b6048c and said what the classifier
said and what it should say. All four are fixed in the same session; the tests now guard the fixes:
1. a line with a second header (FORGED) counts as one of vLLM's own, never as a sample of another format;
2. the operator marks a log it read only in part with a gap line at its head (kube/client.previous_log), and
   after a gap a request's report whose opening was left out is that report's further lines, up to another
   writer's (a paste without a gap is read as a paste: the corpus' rt-13100 opens inside a real report);
3. a learned header is no writer of its own inside a message or report printed without a header (as glog's and
   KServe's are not): a client's line that opens with it there stays a further line;
4. a run of blanks or digits is one group of a learned header (its cost is measured in bench/diagnosis_speed.py). Severity in brackets; "new" means the parent 8fb0ed9 answered right on the same
input, "older" means 8fb0ed9 already answered wrong. The operator fetches a crashed pod's log with
tailLines=4000 (kube/client.py), so the log it reads opens wherever the last 4000 lines begin: a client who
keeps the server logging its requests' errors decides what that first line is.

1. [critical, new] A client's lines teach the reader vLLM's OWN header as a wrapper's. vLLM's
   NewLineFormatter puts `ERROR .. [serving_chat.py:N] ` before every line of a request's error report,
   the client's lines of the exception's message included (a template's raise_exception text, as in the
   s9/s13 reviews). A client line that opens with vLLM's header again is FORGED (user text) for scan.py,
   and so has no vLLM header for log_format._shapes: its shape `LEVEL 0-0 0:0:0 [file]` is counted as a
   header of another format, and what follows it is vLLM's header, so it is a wrapper's. It is "confirmed"
   when the log opens inside that report: the client's lines are then the lines before the first error
   (_ERROR_TEXT only knows `xError`/Traceback; the client's lines need hold neither), or there are none.
   From then on every line's vLLM header is cut as a wrapper's, twice on the client's lines: no line has
   a level or a source file any more, serving_chat.py's report lines are the engine's, and the client's line
   (any memory wording, no exception type needed) decides with high confidence and is quoted in evidence.
   On 8fb0ed9 the same log gave the base's answer (the client's lines were FORGED / REQUEST, and an
   unanchored memory wording in a request's line decides nothing).
   Seen: not_oom illegal_memory_access / nccl_timeout / other_error -> runtime_oom oom_in_serving,
   kv_cache_insufficient max_model_len_exceeds_kv_capacity, host_ram_oom kernel_oom_killer (high), with
   the client's ZZUSERZZ in evidence. With an NCCL watchdog crash (torch's C++ lines: no header, no shape)
   no flood after the crash is needed; with a long EngineCore traceback (about 100 headed lines) the client's
   reports after the crash (s13's AFTER_THE_CRASH) make up the last 400 lines.
   Should: a line that is FORGED (or USER, or a request's) is not a sample of the log's own header; and vLLM's
   own header (what _opens_with_vllm_header recognizes when it is not followed by another) is never learned
   as a wrapper's.
   -> test_a_clients_lines_in_a_headed_report_do_not_teach_vllms_own_header_as_a_wrappers[...]
2. [critical, older: 8fb0ed9 already, found in passing] The same window, without any forged header: when the
   log opens inside a client's request report, the report's exception line (`jinja2...TemplateError: ...`)
   is not in the log, so the client's further line `torch.OutOfMemoryError: CUDA out of memory ...` under
   serving_chat.py's header is no continuation: findings_of reads it as "the engine's failure a request's
   traceback carries" (an ENGINE_EXCEPTION at the start of a REQUEST line) and it decides. not_oom
   (illegal_memory_access, nccl_timeout, cuda_error, other_error) -> runtime_oom oom_in_serving, high,
   quoting the client's text. Should: a REQUEST line before the first line of its report that the log holds
   is the report's (its opening was cut), not the engine's.
   -> test_a_window_that_opens_inside_a_clients_report_does_not_let_its_lines_decide[...]
3. [medium, new] The pinned s9 limit (a line that opens with the log's own header after an exception printed
   without one is a new logged message) now holds for the log's LEARNED header too. Under the operator's
   own format (`%(asctime)s - %(name)s - %(levelname)s - %(message)s`, the format the commit supports, via
   --logging-config), a request's uvicorn report (`ERROR:    Exception in ASGI application`, headerless)
   whose message goes on with one client line `2026-.. - vllm.v1.core.kv_cache_utils - ERROR - To serve at
   least one request ...` turns not_oom illegal_memory_access (high) into kv_cache_insufficient (a
   max-model-len change) or, with a torch OOM line, into unknown signals_disagree quoting the client's text.
   On 8fb0ed9 such a deployment was not exposed (no header of its format was read). The commit's test
   (test_a_clients_lines_cannot_teach_the_reader_a_header) only tried bases in vLLM's default format.
   Should: the base's answer (as for glog's/KServe's headers in s9: a learned header is no writer of its own
   after a headerless exception), or a documented, pinned limit.
   -> test_a_client_line_with_the_learned_header_after_a_headerless_report_decides_nothing[...]
4. [medium, new] Cost. A learned header is compiled from its shape: a run of blanks (or digits) is split into
   tokens of at most 12 (20) characters, each `\\s{1,12}` (`\\d{1,20}`), so a header that opens with 60 blanks
   compiles to five adjacent `\\s{1,12}`. The pattern is tried on every line before anything else
   (scan._strip_clean), and on a line that opens with blanks but goes on otherwise the match backtracks
   through every split: 3 ms a line for five groups, 47 ms for six, 0.5 s for seven (84 blanks + `ERROR -`,
   still within HEADER_CHARS). A log whose lines teach it (ten lines `<60 blanks>ERROR - (x) y`, before and
   after) and whose other lines open with 59 blanks costs over 100x a normal log per MB (bench: 3x); with
   seven groups, 3000 tail lines would take 25 minutes. Should: adjacent placeholders of one class merge
   into one group (`\\s{1,60}`), or a shape with such a run is no header.
   -> test_a_learned_header_costs_no_more_than_3x_per_mb

What held (no finding):
- Real logs: the train corpus (plain, with kubectl --timestamps, with a stern prefix, with its first 1 or 3
  lines cut) gives the same (cause, subtype) on 2b6048c as on 8fb0ed9; no shape of a real line (uvicorn's
  `INFO:`, NCCL INFO floods, Ray's `INFO worker.py:N --`, LMCache's, QUARK's, Ray Serve's) was learned to a
  different answer. NCCL's `NCCL INFO` lines have no separator after the level: no shape.
- The request logger's one-line %r prompt cannot open a line: its lines open with vLLM's header (own), and
  under a custom named format `vllm.entrypoints.logger` gives logger.py (USER).
- 2293a10: a Ray log whose worker prints `OutOfMemoryError: CUDA out of memory. Tried to allocate ...`
  (bare name, torch's message) stays profiling_oom (the figures' rows still place it); nothing a client writes
  into a request's line turns a torch OOM into Ray's host row.
- classify never raised on 3000 random logs built from level words, separators, vLLM logger and file names,
  control characters \\x01-\\x03 (the shape's own placeholders), process prefixes, boxes and JSON records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.corpus import load
from vllm_autoheal.diagnosis.log_format import header_of, shape_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_diagnosis_log_format import ASGI, reformatted  # noqa: E402

from conftest import ROOT  # noqa: E402

CORPUS = {s["id"]: s for s in load(ROOT / "tests" / "corpus" / "corpus.jsonl")}


def _corpus(name: str) -> str:
    sample = CORPUS[name]
    assert sample["split"] == "train"
    return sample["log"].rstrip("\n") + "\n"


def _key(d) -> tuple:
    return d.cause, d.subtype


ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"


def _illegal_access() -> str:
    """A real V1 serving crash (corpus local-h200-runtime, vLLM 0.25 on an H200) whose final error is
    made an illegal memory access: about 100 lines of EngineCore's headed traceback, then the API
    server's. Not memory: a memory change there is wrong."""
    lines = _corpus("local-h200-runtime").splitlines()
    out = []
    for ln in lines:
        if "torch.OutOfMemoryError" in ln:
            ln = ln.split("[core.py:1233] ")[0] + "[core.py:1233] " + ILLEGAL
        out.append(ln)
    return "\n".join(out) + "\n"


PAYLOADS = {
    "cuda-oom": "CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
    "1.00 GiB is free. ZZUSERZZ",
    "kv-capacity": "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, the "
    "estimated maximum model length is 16. ZZUSERZZ",
    "cgroup-kill": "Memory cgroup out of memory: Killed process 1 (python3) ZZUSERZZ",
}


def _report(header: str, further: list[str]) -> list[str]:
    """A request's error report as vLLM's NewLineFormatter prints it (serving_chat.py's logger.exception):
    the header on every line, the client's lines of the exception's message after the exception line."""
    opening = [
        "Error in preprocessing prompt inputs",
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", line 183, in '
        "create_chat_completion",
        "    ) = await self._preprocess_chat(",
        "jinja2.exceptions.TemplateError: x",
    ]
    return [header + ln for ln in opening + further]


# --- 1. A client's lines teach vLLM's own header as a wrapper's (critical, new) ------------------------------
# (base, the report's header, the forged header the client writes, the client's reports after the crash)
V1_CHAT = "(APIServer pid=2320) ERROR 12-01 04:48:07 [serving_chat.py:200] "
V1_FORGED = "ERROR 12-01 04:48:07 [core.py:1233] "
V0_CHAT = "ERROR 02-03 13:14:04 serving_chat.py:200] "
V0_FORGED = "ERROR 02-03 13:14:04 llm_engine.py:1] "
FORGED_BASES = {
    # an engine that died on a shm broadcast timeout while serving (corpus, vLLM V1)
    "shm-timeout": (lambda: _corpus("notoom-33802-ci-2xh100-shm-timeout"), V1_CHAT, V1_FORGED, 0),
    # an NCCL watchdog timeout under Ray while serving (corpus, vLLM V0's header without brackets)
    "nccl-watchdog": (lambda: _corpus("neg-2734-llama2-70b-tp8-timeout"), V0_CHAT, V0_FORGED, 0),
    # an illegal memory access with EngineCore's whole headed traceback; the client's reports go on after it
    "illegal-access": (_illegal_access, V1_CHAT, V1_FORGED, 500),
}


def _forged_window(base: str, chat: str, forged: str, after: int, last: str) -> str:
    # The last 4000 lines open inside a client's report: its opening lines are cut, its further lines
    # (each under serving_chat.py's header, each opening with vLLM's header again) are the log's first.
    before = _report(chat, [forged + "hello"] * 400 + [forged + last])[5:]
    later = _report(chat, [forged + "hello"] * after + [forged + "bye"]) if after else []
    return "\n".join(before) + "\n" + base + ("\n".join(later) + "\n" if later else "")


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
@pytest.mark.parametrize("base_name", sorted(FORGED_BASES))
def test_a_clients_lines_in_a_headed_report_do_not_teach_vllms_own_header_as_a_wrappers(base_name, payload):
    make, chat, forged, after = FORGED_BASES[base_name]
    base = make()
    harmless = classify(Signals(log=_forged_window(base, chat, forged, after, "bye")))
    assert harmless.cause == "not_oom"  # the base: no memory cause
    crafted = classify(Signals(log=_forged_window(base, chat, forged, after, PAYLOADS[payload])))
    assert _key(crafted) == _key(harmless)
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- 2. A window that opens inside a client's report (critical, older) ---------------------------------------
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 1.00 GiB is free. ZZUSERZZ"
)


def _cut_window(chat: str, base: str, after: int, last: str, opening: tuple[str, ...] = ()) -> str:
    """A log as the operator passes one whose tail was cut at its head (after a gap line, kube/client.previous_log):
    it opens inside a client's report (`opening`: the client's first lines there), then the base's crash, then,
    where `after`, one more report of the client's."""
    before = ["[...]"] + _report(chat, [*opening, *["hello"] * 50, last])[5:]
    later = _report(chat, ["bye"]) if after else []
    return "\n".join(before) + "\n" + base + ("\n".join(later) + "\n" if later else "")


@pytest.mark.parametrize("base_name", sorted(FORGED_BASES))
def test_a_window_that_opens_inside_a_clients_report_does_not_let_its_lines_decide(base_name):
    make, chat, _, after = FORGED_BASES[base_name]
    base = make()

    def log(last: str) -> str:
        return _cut_window(chat, base, after, last)

    harmless = classify(Signals(log=log("bye")))
    assert harmless.cause == "not_oom"
    crafted = classify(Signals(log=log(TORCH_OOM)))
    assert _key(crafted) == _key(harmless)
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- 3. The learned header after a headerless report (medium, new) -------------------------------------------
CUSTOM = "2026-12-01 {time},{i:03d} - {name} - {level} - "
CLIENT_CUSTOM = {
    "kv-capacity": "2026-12-01 04:48:09,000 - vllm.v1.core.kv_cache_utils - ERROR - " + PAYLOADS["kv-capacity"],
    "torch-oom": "2026-12-01 04:48:09,000 - vllm.v1.engine.core - ERROR - " + TORCH_OOM,
}


@pytest.mark.parametrize("every_line", [True, False], ids=["NewLineFormatter", "logging.Formatter"])
@pytest.mark.parametrize("client", sorted(CLIENT_CUSTOM))
def test_a_client_line_with_the_learned_header_after_a_headerless_report_decides_nothing(client, every_line):
    base = reformatted(CUSTOM, every_line=every_line)(_illegal_access())
    assert " - vllm.core - ERROR - " in base  # the engine logged under the operator's format
    harmless = classify(Signals(log=base + ASGI + "hello\n"))
    assert _key(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=base + ASGI + CLIENT_CUSTOM[client] + "\n"))
    assert _key(crafted) == _key(harmless)
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- 4. A learned header of adjacent blank groups backtracked (medium, new) ---------------------------------
# (its cost is measured in bench/diagnosis_speed.py, "a learned header of a run of blanks", not asserted here)
def test_a_run_of_blanks_or_digits_is_one_group_of_a_learned_header():
    teach = " " * 84 + "ERROR - (x) y"  # seven groups of blanks on 2b6048c
    assert shape_of(teach) == " \x01 -"
    lines = [teach] * 10 + [" " * 83 + "X rror"] * 400 + [teach] * 10
    header = header_of(lines, len(lines), lambda _: False, lambda _: True)
    assert header is not None and header.pattern.pattern.count("\\s{1,") == 2  # the run, the blank after `-`
    assert shape_of("2026120112000000001 ERROR - x") == "0 \x01 -"


# --- What held ---------------------------------------------------------------------------------------------
def test_control_characters_that_are_the_shapes_placeholders_raise_nothing():
    lines = [f"\x01 \x02 \x03 {i} - ERROR - (x) y" for i in range(10)] + ["\x03.py ERROR: [\x02] KeyError: x"] * 5
    classify(Signals(log="\n".join(lines) + "\n"))


def test_a_ray_workers_bare_named_torch_oom_with_its_message_stays_a_gpu_oom():
    w = "(RayWorkerWrapper pid=1234, ip=10.0.0.2) ERROR 12-01 10:00:05 [worker_base.py:620] "
    log = (
        "INFO 12-01 10:00:00 [ray_distributed_executor.py:100] Using Ray for the workers\n"
        + w
        + "Error executing method 'determine_available_memory'. This might cause deadlock in distributed execution.\n"
        + w
        + "Traceback (most recent call last):\n"
        + w
        + '  File "/usr/local/lib/python3.12/dist-packages/vllm/worker/worker_base.py", line 612, in execute_method\n'
        + w
        + "    return run_method(self, method, args, kwargs)\n"
        + w
        + "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB "
        "of which 1.10 GiB is free.\n"
    )
    assert classify(Signals(log=log)).cause == "profiling_oom"
