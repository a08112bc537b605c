"""Session 42 hostile review: a model's user (who only sends requests) steers the diagnosis through lines the
classifier reads as the engine's. Each xfail test shows a real log diagnosed one way with a harmless value in the
client's place and another way (a memory cause, the client's words quoted) with the client's text there.

Findings:
- vLLM's JSON log records (`--logging-config.formatter json`, vLLM 0.32) longer than log_records.RECORD_MAX
  (256 KiB) are "left as they are": a raw line with no header, so no level (an INFO or WARNING record decides),
  no logger (a request's record is no request's), and its escaped quotes defeat origin.py's access-line test.
  A client makes a record that long at will: a long query string, a long tool-call id.
- The in-pod launcher keeps only the first 64 KiB piece of a longer line (launcher.OutputKeeper): a JSON record
  between 64 KiB and 256 KiB reaches the classifier cut, so no record; the same bypass, at a quarter the size.
- A JSON log whose records do not name their level `levelname` (python-json-logger's `rename_fields` to
  `severity`, as Google Cloud Logging wants) is not decoded at all: a uvicorn access record's request line is
  escaped (`\\"GET ... HTTP/1.1\\"`), origin.py's `_REQUEST_CLOSE` wants a bare `"` after the version, and any GET
  with `?q=torch.OutOfMemoryError...` in its query is read as the engine's failure.
- `ValueError: Loading lora {lora_name} failed: No adapter found for {lora_path}` (vllm/lora/worker_manager.py,
  the wording before vllm.exceptions.LoRAAdapterNotFoundError) carries the adapter name and path a client chose
  (POST /v1/load_lora_adapter with VLLM_ALLOW_RUNTIME_LORA_UPDATING, or the `model` a LoRA resolver resolves): as
  the engine's fatal error its message is read as a CUDA OOM and quoted, where the newer type's is neither.
"""

from __future__ import annotations

import io
import json

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis import log_records as lr
from vllm_autoheal.launcher import CHUNK_BYTES, OutputKeeper, _crash_summary, pump
from vllm_autoheal.remedy import Inventory, plan_heal

from crafted.bases import MARKER, illegal_access_log, real_log
from crafted.checks import assert_reads_like, diagnose
from crafted.records import as_json_records

# A client's CUDA OOM, written where a URL may hold it (uvicorn logs the query string as sent: %20 for blanks).
OOM_WORDS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    f"79.19 GiB of which 1.00 GiB is free. {MARKER}"
)
OOM_QUERY = OOM_WORDS.replace(" ", "%20")
HARMLESS_QUERY = "hello%20world%20" + MARKER.lower()


def _json_base() -> list[str]:
    """The real vLLM 0.25 serving crash (an illegal memory access: not memory), as vLLM 0.32's json formatter
    prints it: one record a logged message."""
    return as_json_records(illegal_access_log()).splitlines()


def _before_crash(lines: list[str], extra: str) -> str:
    at = next(i for i, ln in enumerate(lines) if "dump_input" in ln)  # the engine's dump of its input, then its error
    return "\n".join(lines[:at] + [extra] + lines[at:]) + "\n"


def _record(name: str, level: str, message: str) -> str:
    """A record of vLLM 0.32's json formatter (vllm/logging_utils/formatter.py) from the API server process."""
    fields = {"asctime": "2026-12-01 04:48:07,123", "levelname": level, "name": name, "processName": "APIServer"}
    return json.dumps(fields | {"process": 2320, "message": message, "vllm_process_name": "APIServer"})


def _access_record(query: str, pad: int) -> str:
    # uvicorn's access record (vLLM 0.32's docs: "one JSON object per vLLM and Uvicorn log record"); uvicorn's
    # httptools parser (fastapi[standard], vLLM's default) sets no limit on the request target's length
    return _record("uvicorn.access", "INFO", f'10.0.0.1:52000 - "GET /v1/models?q={query}&p={"x" * pad} HTTP/1.1" 404')


def _tool_call_id_record(value: str, pad: int) -> str:
    # vllm/tokenizers/mistral.py:94 (WARNING): an assistant message's tool call id in the request's history, any
    # length (the body has no size limit), truncated to its last 9 characters for Mistral's tokenizer
    tool_id = value + "x" * pad
    return _record("vllm.tokenizers.mistral", "WARNING", f"Truncating tool call ID: {tool_id} to {tool_id[-9:]}")


LONG = lr.RECORD_MAX + 4096  # a record just longer than log_records decodes


@pytest.mark.parametrize("make", [_access_record, _tool_call_id_record], ids=["access-query", "mistral-tool-call-id"])
def test_a_client_record_under_the_record_limit_changes_nothing(make):
    """Control: the same records under RECORD_MAX are decoded, their level and logger read: nothing changes."""
    base = _json_base()
    assert_reads_like(
        _before_crash(base, make(OOM_QUERY if make is _access_record else OOM_WORDS, 100)),
        _before_crash(base, make(HARMLESS_QUERY, 100)),
        "a short client record",
    )


def test_a_long_access_record_in_vllms_json_log_is_no_engine_failure():
    base = _json_base()
    harmless = _before_crash(base, _access_record(HARMLESS_QUERY, LONG))
    assert diagnose(harmless).cause == "not_oom"
    assert_reads_like(_before_crash(base, _access_record(OOM_QUERY, LONG)), harmless, "a long access record")


def test_a_long_tool_call_id_record_in_vllms_json_log_is_no_engine_failure():
    base = _json_base()
    harmless = _before_crash(base, _tool_call_id_record("call-" + MARKER.lower(), LONG))
    crafted = _before_crash(base, _tool_call_id_record(OOM_WORDS, LONG))
    assert_reads_like(crafted, harmless, "a long tool call id")


def test_a_long_access_record_plans_no_heal():
    crafted = diagnose(_before_crash(_json_base(), _access_record(OOM_QUERY, LONG)))
    spec = VLLMServiceSpec(model="m", engine={"gpuMemoryUtilization": 0.9, "maxModelLen": 8192})
    remedy = plan_heal(spec, crafted, inventory=Inventory(gpu_total_gib=139.8, gpu_name="NVIDIA H200"))
    assert not getattr(remedy, "changes", None), remedy


def _launchers_diagnosis(record: str) -> dict:
    """What the in-pod launcher writes: the JSON log read through pump() and OutputKeeper as run() reads the
    child's output (a line longer than CHUNK_BYTES: its first 64 KiB piece only)."""
    output = _before_crash(_json_base(), record).encode()
    keeper = OutputKeeper()
    pump(io.BytesIO(output), io.BytesIO(), keeper)
    return _crash_summary(keeper.text(), 1, True, None, False)


MIDDLING = 2 * CHUNK_BYTES  # over the launcher's piece, under RECORD_MAX


def test_a_middling_record_read_whole_changes_nothing():
    """Control: classify reads the same 128 KiB record whole (it is under RECORD_MAX): not memory."""
    assert MIDDLING < lr.RECORD_MAX
    d = classify(Signals(log=_before_crash(_json_base(), _access_record(OOM_QUERY, MIDDLING))))
    assert d.cause == "not_oom" and MARKER not in json.dumps(d.to_dict())


def test_the_launcher_reads_no_engine_failure_in_a_cut_client_record():
    harmless = _launchers_diagnosis(_access_record(HARMLESS_QUERY, MIDDLING))
    assert (harmless["cause"], harmless["subtype"]) == ("not_oom", "illegal_memory_access")
    crafted = _launchers_diagnosis(_access_record(OOM_QUERY, MIDDLING))
    assert (crafted["cause"], crafted["subtype"]) == (harmless["cause"], harmless["subtype"])
    assert MARKER not in json.dumps(crafted)


# --- A JSON log whose level key is not `levelname` ---------------------------------------------------------------
# python-json-logger's JsonFormatter(rename_fields={"levelname": "severity", "asctime": "timestamp", "name":
# "logger"}) for Google Cloud Logging, set on vLLM's and uvicorn's loggers through VLLM_LOGGING_CONFIG_PATH.


def _severity_access(query: str) -> str:
    return json.dumps(
        {
            "timestamp": "2026-12-01T04:48:07.123Z",
            "severity": "INFO",
            "logger": "uvicorn.access",
            "message": f'10.0.0.1:52000 - "GET /v1/models?q={query} HTTP/1.1" 404',
        }
    )


def test_an_access_record_of_another_json_schema_is_no_engine_failure():
    lines = illegal_access_log().splitlines()
    harmless = _before_crash(lines, _severity_access(HARMLESS_QUERY))
    assert diagnose(harmless).cause == "not_oom"
    assert_reads_like(_before_crash(lines, _severity_access(OOM_QUERY)), harmless, "a severity-keyed access record")


# --- The engine's LoRA load failure, in the wording before LoRAAdapterNotFoundError --------------------------------
# vllm/lora/worker_manager.py _load_adapter (vLLM 0.6 to 0.12): `raise ValueError(f"Loading lora
# {lora_request.lora_name} failed: No adapter found for {lora_request.lora_path}") from e`; the name and path are
# what POST /v1/load_lora_adapter was sent (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; vLLM 0.6.x did not even try
# the load first) or the `model` a LoRA resolver took. An adapter loaded and then evicted (--max-cpu-loras) is
# loaded again inside execute_model when a request names it: there the failure is the engine core's fatal error.
LORA_FRAMES = [
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 219, in _apply_adapters',
    "    self.add_adapter(lora)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 232, in add_adapter',
    "    lora = self._load_adapter(lora_request)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 138, in _load_adapter',
    "    raise ValueError(",
]


def _lora_crash(name: str) -> str:
    """The real vLLM 0.11 serving crash (corpus rt-27466-busy-loop, EngineCore_DP0) ending in the LoRA load
    failure instead of its OOM."""
    log = real_log("rt-27466-busy-loop")
    oom = next(ln for ln in log.splitlines() if "torch.OutOfMemoryError" in ln)
    header = oom.split("[core.py:710] ")[0] + "[core.py:710] "
    error = f"ValueError: Loading lora {name} failed: No adapter found for /mnt/loras/support-bot"
    return log.replace(oom, "\n".join(header + ln for ln in [*LORA_FRAMES, error]))


def test_the_newer_lora_error_type_is_not_read():
    """Control: the same message as vllm.exceptions.LoRAAdapterNotFoundError is neither read nor quoted."""
    log = _lora_crash(OOM_WORDS).replace(
        "ValueError: Loading lora", "vllm.exceptions.LoRAAdapterNotFoundError: Loading lora"
    )
    d = diagnose(log)
    assert d.cause == "not_oom" and MARKER not in json.dumps(d.to_dict())


def test_a_client_chosen_lora_name_in_the_engines_fatal_error_is_no_oom():
    harmless = _lora_crash("support-bot-" + MARKER.lower())
    assert diagnose(harmless).cause == "not_oom"
    assert_reads_like(_lora_crash(OOM_WORDS), harmless, "a LoRA name")


@pytest.mark.parametrize(
    "before",
    ["(APIServer pid=2320) ", "2026-12-01T04:48:07.123456789Z ", "vllm-0 vllm "],
    ids=["vllms-stdout-prefix", "kubectl-timestamps", "stern-every-line"],
)
def test_a_long_record_behind_a_prefix_is_no_engine_failure(before):
    """A record too long to decode behind vLLM's stdout decorator or a collector's stamp (log_records prints those
    before a decoded record's lines) is no engine line either: its fields are the client's. (stern's pod and
    container name stand before every line of the log, the engine's too.)"""
    base = _json_base()
    if before.startswith("vllm-0"):
        base = [before + line for line in base]

    def log(query: str) -> str:
        return _before_crash(base, before + _access_record(query, LONG))

    assert diagnose(log(HARMLESS_QUERY)).cause == "not_oom"
    assert_reads_like(log(OOM_QUERY), log(HARMLESS_QUERY), "a prefixed record")


def test_a_real_oom_chained_under_the_lora_load_failure_still_decides():
    """The other side of the LoRA rule: vLLM raises `RuntimeError: Loading lora {path} failed` from any other
    error of the load, chained under it (`raise ... from e`): the real CUDA OOM above it is the engine's own line
    and still decides, as it does without the LoRA wrapper."""
    log = real_log("rt-27466-busy-loop")
    oom = next(ln for ln in log.splitlines() if "torch.OutOfMemoryError" in ln)
    header = oom.split("[core.py:710] ")[0] + "[core.py:710] "
    chained = [
        oom.split("[core.py:710] ", 1)[1],
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        *LORA_FRAMES[:-1],
        '    raise RuntimeError(f"Loading lora {lora_path} failed") from e',
        "RuntimeError: Loading lora /mnt/loras/support-bot failed",
    ]
    wrapped = log.replace(oom, "\n".join(header + ln for ln in chained))
    plain = diagnose(log)
    assert plain.cause == "runtime_oom"
    assert diagnose(wrapped).cause == plain.cause
