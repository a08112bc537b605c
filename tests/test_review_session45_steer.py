"""Session 45 hostile review: a model's user steers the diagnosis through two logging set-ups vLLM itself offers,
where the lines of the client's value reach the classifier without the header its defences read. Each test shows
a real log diagnosed the same with a harmless value in the client's place and with the client's text there (a
memory cause, a memory figure, the client's words quoted, before the fix; still, under the first-line-only format).

Fixed this session: scan._PREFIXES reads the DEBUG format's path as vLLM's header, its last part the file. The
first finding stays a limit (strict xfails): a carry of the message's origin over its headerless lines was tried,
escaped three ways and hid real raw OOM lines (test_review_session45_attack.py), and was taken back.

Findings:
- A logging format of the operator's own (`--logging-config.pylogging_config_file` / VLLM_LOGGING_CONFIG_PATH)
  with Python's plain `logging.Formatter` writes the header on a message's FIRST line only (the format
  crafted.records.LOGGING_FORMATS calls "the same, first line only"; vLLM 0.31+ puts no process prefix there:
  its name is a field of vLLM's own format). vLLM's request logger (vllm/entrypoints/serve/utils/request_logger.py,
  RequestLogger.log_inputs, 0.32: `logger.info("Received request %s: params: %s, lora_request: %s.", request_id,
  ...)`, `--enable-log-requests`) writes the request id with %s, and the id is the body's `request_id`
  (serving.py `_base_request_id(raw_request, request.request_id)`, a JSON string: newlines allowed) where no
  X-Request-Id header is sent. The id's further lines are bare: no header, so scan._continuations does not carry
  the message's USER origin over them (it skips headerless lines), and nothing else marks them. A bare
  `To serve at least one request ... estimated maximum model length is 16` turns a real illegal memory access
  (and a real serving OOM) into kv_cache_insufficient, quoted; a bare `model weights take 70.00 GiB` replaces
  the engine's own weights figure (15.0 -> 70.0) in a real serving OOM.
- `VLLM_LOGGING_LEVEL=DEBUG` (vLLM 0.10.2+, PR #23846; 0.32's vllm/logging_utils/formatter.py NewLineFormatter:
  `use_relpath = log_level == "DEBUG"`, `shrink_path`) prints the file as a path: `[v1/engine/core.py:1233]`,
  `[entrypoints/.../utils/request_logger.py:66]` (a real H200 log so printed:
  operator/vllm_autoheal/examples/h200-kv-cache-too-small.log). scan._PREFIXES wants a bare file name
  (`[\\w.-]{1,80}`), so no line of such a log has a header, level or file: origin.py's file rules, quoted.py's
  frame rules (FRAME_LINE and GRAMMAR_FRAME are matched at the text's start, which is now `ERROR 12-01 ...`) and
  placement's informational rule all go blind.
  * The engine's logged copy of a structured-output grammar crash (crafted.grammar: backend_guidance.py's
    `ValueError: Trigger {begin} not found in triggers`, the client's trigger holding a newline) decides
    runtime_oom or kv_cache_insufficient from the client's further line, quoted; in vLLM's INFO format the same
    crash says nothing (tests/test_diagnosis_grammar_reports.py).
  * The request logger's multi-line request id (as above), on the API server: writers.py keeps the client's GPU
    memory words off an APIServer line, but a not-memory failure there still counts: a real serving OOM reads
    `unknown signals_disagree`, the client's `RuntimeError: CUDA error: an illegal memory access` quoted as its
    evidence; on a real illegal access, the client's copy replaces the engine's line as the evidence.

Held (kept as a test, a format not covered before): the same multi-line request id under vLLM's own
NewLineFormatter with the operator's format on every line (custom-logging-every-line.json's shape).
"""

from __future__ import annotations

import re

import pytest

from crafted.bases import CLIENT_OOM, MARKER, PAYLOADS, corpus_log, illegal_access_log
from crafted.checks import assert_reads_like, diagnose
from crafted.grammar import grammar_crash
from crafted.records import CUSTOM, reformatted

# --- the operator's logging format, header on the first line only (logging.Formatter) --------------------------
_PROCESS = re.compile(r"(?m)^\([\w.:-]{1,60} pid=\d+\) ")


def _operators_format(log: str, every_line: bool = False) -> str:
    """A real log as vLLM 0.31+ prints it under `%(asctime)s - %(name)s - %(levelname)s - %(message)s` (the
    operator's config names no process prefix; with logging.Formatter a message's further lines are bare)."""
    return reformatted(CUSTOM, every_line=every_line)(_PROCESS.sub("", log))


def _received(request_id: str, every_line: bool = False) -> str:
    """RequestLogger.log_inputs' INFO line (vllm/entrypoints/serve/utils/request_logger.py:66, vLLM 0.32), the
    request id the body's `request_id` (serving.py: `chatcmpl-{_base_request_id(raw_request, request.request_id)}`)."""
    header = "2026-12-01 04:48:07,500 - vllm.entrypoints.serve.utils.request_logger - INFO - "
    message = (
        f"Received request chatcmpl-{request_id}: params: SamplingParams(n=1, temperature=0.7), lora_request: None."
    )
    parts = message.split("\n")
    return "\n".join([header + parts[0]] + [(header if every_line else "") + p for p in parts[1:]])


def _before_crash(log: str, extra: str) -> str:
    lines = log.splitlines()
    at = next(i for i, ln in enumerate(lines) if "dump_input" in ln)  # the engine's dump of its input, then its error
    return "\n".join(lines[:at] + extra.split("\n") + lines[at:]) + "\n"


HARMLESS_ID = "call-" + MARKER.lower()
WEIGHTS = f"model weights take 70.00 GiB {MARKER}"


def _runtime_oom() -> str:
    return corpus_log("local-h200-runtime")  # a real vLLM 0.25 serving OOM on an H200


FIRST_LINE_ONLY = (
    "a limit (session 45): under a format that heads a message's first line only, with requests logged, a request "
    "id's line without a header cannot be told from the engine's; a carry was tried and taken back "
    "(test_review_session45_attack.py): keep vLLM's formatter, which heads every line"
)


@pytest.mark.parametrize(
    "base, cause",
    [(illegal_access_log, "not_oom"), (_runtime_oom, "runtime_oom")],
    ids=["illegal-access", "serving-oom"],
)
@pytest.mark.xfail(strict=True, reason=FIRST_LINE_ONLY)
def test_a_request_ids_bare_line_under_the_operators_format_names_no_kv_failure(base, cause):
    log = _operators_format(base())
    harmless = _before_crash(log, _received(HARMLESS_ID))
    assert diagnose(harmless).cause == cause
    crafted = _before_crash(log, _received("1\n" + PAYLOADS["kv-capacity"] + "\nend"))
    assert_reads_like(crafted, harmless, "a request id's bare line")


@pytest.mark.xfail(strict=True, reason=FIRST_LINE_ONLY)
def test_a_request_ids_bare_line_under_the_operators_format_sets_no_figure():
    base = _operators_format(_runtime_oom())
    harmless = diagnose(_before_crash(base, _received(HARMLESS_ID)))
    crafted = diagnose(_before_crash(base, _received("1\n" + WEIGHTS + "\nend")))
    assert harmless.numbers["weights_gib"] == 15.0
    assert crafted.numbers.get("weights_gib") == harmless.numbers["weights_gib"], crafted.numbers


def test_a_request_ids_headed_lines_under_the_operators_every_line_format_change_nothing():
    """Held: vLLM's NewLineFormatter under the operator's format repeats the header on the id's further lines
    (custom-logging-every-line.json): the request logger's message is the client's to its end."""
    base = _operators_format(_runtime_oom(), every_line=True)
    assert_reads_like(
        _before_crash(base, _received("1\n" + PAYLOADS["kv-capacity"] + "\nend", every_line=True)),
        _before_crash(base, _received(HARMLESS_ID, every_line=True)),
        "a request id's headed lines",
    )


# --- VLLM_LOGGING_LEVEL=DEBUG: the header names a path (vLLM 0.10.2+, NewLineFormatter.shrink_path) ------------
# Where vLLM 0.32's shrink_path puts each file the bases' headers name (vllm/<path> in its wheel).
_PATHS = {
    "api_server.py": "entrypoints/openai/api_server.py",
    "api_utils.py": "entrypoints/.../utils/api_utils.py",
    "async_llm.py": "v1/engine/async_llm.py",
    "compilation.py": "config/compilation.py",
    "core.py": "v1/engine/core.py",
    "core_client.py": "v1/engine/core_client.py",
    "cuda.py": "platforms/cuda.py",
    "cutedsl_warmup.py": "model_executor/warmup/cutedsl_warmup.py",
    "deep_gemm.py": "model_executor/.../mxfp8/deep_gemm.py",
    "dump_input.py": "logging_utils/dump_input.py",
    "flash_attn.py": "v1/attention/backends/flash_attn.py",
    "gpu_worker.py": "v1/worker/gpu_worker.py",
    "gpu_model_runner.py": "v1/worker/gpu_model_runner.py",
    "jit_monitor.py": "utils/jit_monitor.py",
    "kernel.py": "config/kernel.py",
    "kv_cache_utils.py": "v1/core/kv_cache_utils.py",
    "launcher.py": "entrypoints/launchers/launcher.py",
    "model.py": "config/model.py",
    "parallel_state.py": "distributed/parallel_state.py",
    "scheduler.py": "v1/core/sched/scheduler.py",
    "system_utils.py": "utils/system_utils.py",
    "topk_topp_sampler.py": "v1/sample/ops/topk_topp_sampler.py",
    "utils.py": "v1/engine/utils.py",
    "vllm.py": "config/vllm.py",
}
_VLLM_HEADER = re.compile(
    r"(?m)^((?:\([^)]{1,80}\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:.]+ \[)([\w.-]+?\.py)(:\d+\])"
)


def _debug_format(log: str) -> str:
    """The log as vLLM prints it under VLLM_LOGGING_LEVEL=DEBUG: each header's file as shrink_path writes it."""
    return _VLLM_HEADER.sub(lambda m: m[1] + _PATHS.get(m[2], "model_executor/.../layers/" + m[2]) + m[3], log)


def _start(log: str) -> str:
    """The log up to the engine's crash (its dump of its input): a start-up and some serving."""
    lines = log.splitlines()
    at = next(i for i, ln in enumerate(lines) if "dump_input" in ln)
    return "\n".join(lines[:at]) + "\n"


def test_the_debug_format_itself_reads_the_crash():
    """Control: the bases in the DEBUG format still read as their crash (the evidence then holds the header)."""
    assert diagnose(_debug_format(illegal_access_log())).subtype == "illegal_memory_access"
    assert diagnose(_debug_format(_runtime_oom())).cause == "runtime_oom"


@pytest.mark.parametrize("payload", [CLIENT_OOM, PAYLOADS["kv-capacity"]], ids=["torch-oom", "kv-capacity"])
def test_a_grammar_crash_under_the_debug_format_names_no_memory_failure(payload):
    start = _start(illegal_access_log())
    harmless = _debug_format(start + grammar_crash("<fn\nhello") + "\n")
    assert diagnose(harmless).cause == "unknown"  # as in vLLM's INFO format
    crafted = _debug_format(start + grammar_crash("<fn\n" + payload) + "\n")
    assert_reads_like(crafted, harmless, "a grammar crash, DEBUG format")


def test_the_same_grammar_crash_in_vllms_info_format_names_nothing():
    """Held (the control of the finding above): vLLM's INFO headers, the same crash and client text."""
    start = _start(illegal_access_log())
    assert_reads_like(
        start + grammar_crash("<fn\n" + CLIENT_OOM) + "\n",
        start + grammar_crash("<fn\nhello") + "\n",
        "a grammar crash, INFO format",
    )


_API_REQUEST_LOGGER = "(APIServer pid=2320) INFO 12-01 04:48:07 [entrypoints/.../utils/request_logger.py:66] "
ILLEGAL_WORDS = f"RuntimeError: CUDA error: an illegal memory access was encountered {MARKER}"


def _debug_received(request_id: str) -> str:
    """RequestLogger.log_inputs' line in the DEBUG format: NewLineFormatter repeats the header on each line."""
    message = f"Received request chatcmpl-{request_id}: params: SamplingParams(n=1), lora_request: None."
    return "\n".join(_API_REQUEST_LOGGER + part for part in message.split("\n"))


def test_a_request_id_under_the_debug_format_keeps_a_serving_oom():
    base = _debug_format(_runtime_oom())
    harmless = _before_crash(base, _debug_received(HARMLESS_ID))
    assert diagnose(harmless).cause == "runtime_oom"
    crafted = _before_crash(base, _debug_received("1\n" + ILLEGAL_WORDS + "\nend"))
    assert_reads_like(crafted, harmless, "a request id, DEBUG format, serving OOM")


def test_a_request_id_under_the_debug_format_is_not_quoted():
    base = _debug_format(illegal_access_log())
    harmless = _before_crash(base, _debug_received(HARMLESS_ID))
    crafted = _before_crash(base, _debug_received("1\n" + ILLEGAL_WORDS + "\nend"))
    assert_reads_like(crafted, harmless, "a request id, DEBUG format, illegal access")
