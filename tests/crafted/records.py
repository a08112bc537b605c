"""vLLM's JSON log records (its json formatter's fields), a few real and crafted records, a text log
turned into records (as_json_records), and vLLM's text lines reprinted under a logging format an
operator may configure instead of vLLM's own, or under a wrapper's header (LOGGING_FORMATS)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from crafted.bases import REAL_CPU

# A real vLLM 0.32 CPU run logged with `--logging-config.formatter json`.
REAL_JSON = REAL_CPU / "kv-cache-too-small-json.log"


def record(message: str, exc_info: str | None = None, level: str = "ERROR", name: str = "vllm.v1.engine.core") -> str:
    """A record as vLLM 0.32's json formatter writes it (python-json-logger, vllm/logging_utils/formatter.py)."""
    out = {"asctime": "2026-12-01 10:00:00,123", "levelname": level, "name": name, "processName": "EngineCore_DP0"}
    out |= {"process": 2441, "message": message}
    if exc_info is not None:
        out["exc_info"] = exc_info
    return json.dumps(out | {"vllm_process_name": "EngineCore_DP0"})


TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.00 GiB is free."
)


# The engine's fatal errors as JSON records: an illegal memory access, and a runtime OOM.
ILLEGAL_ACCESS = record(
    "EngineCore encountered a fatal error.",
    'Traceback (most recent call last):\n  File "/x/vllm/v1/engine/core.py", line 900, in run_busy_loop\n'
    "    self._process_engine_step()\nRuntimeError: CUDA error: an illegal memory access was encountered",
)


RUNTIME_OOM = record(
    "EngineCore encountered a fatal error.",
    'Traceback (most recent call last):\n  File "/x/vllm/v1/engine/core.py", line 900, in run_busy_loop\n'
    '    self._process_engine_step()\n  File "/x/vllm/v1/worker/gpu_model_runner.py", line 2000, in execute_model\n'
    "    hidden = self.model(x)\n" + TORCH_OOM.replace("64.00 GiB", "2.00 GiB"),
)


# A request's pre-processing error, its exception's message the client's.
PREPROC_ERROR = record(
    "Unexpected error pre-processing request cmpl-abc-0",
    'Traceback (most recent call last):\n  File "/x/vllm/v1/engine/core.py", line 1300, in preprocess_add_request\n'
    "    x\nValueError: bad ZZUSERZZ",
)


# The real vLLM 0.32 JSON log (CPU engine) up to its failure record: a start-up that got as far as the KV
# cache, no failure of its own.
JSON_START = REAL_JSON.read_text().split('{"asctime": "2026-12-02 07:36:38,784"', 1)[0]


# vLLM's header, taken apart, to print its lines in another logging format
_PARTS = re.compile(
    r"^(?P<process>\([^)]{1,120}pid=\d+\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d "
    r"(?P<time>[\d:]{8})[\d.]* \[?(?P<file>[\w.-]+?)(?:\.py)?:(?P<line>\d+)\]? "
)


def reformatted(fmt: str, every_line: bool = True) -> Callable[[str], str]:
    """vLLM's lines in a logging format of the operator's choosing (`fmt`: a str.format of level,
    name (the logger's: vllm.<module>), file, line, time, i): on every line of a message (vLLM's
    NewLineFormatter with another format), or on its first only (logging.Formatter: a traceback's
    further lines bare)."""

    def shape(log: str) -> str:
        out, previous = [], None
        for i, line in enumerate(log.splitlines()):
            m = _PARTS.match(line)
            if m:
                key = m.group("process", "level", "file", "line")
                fields = {"level": m["level"], "name": "vllm." + m["file"], "file": m["file"] + ".py"}
                fields |= {"line": m["line"], "time": m["time"], "i": i % 1000}
                header = fmt.format(**fields) if every_line or key != previous else ""
                line, previous = (m["process"] or "") + header + line[m.end() :], key
            else:
                previous = None
            out.append(line)
        return "\n".join(out) + "\n"

    return shape


# A logging format an operator may choose (for `reformatted`): time, logger name, level.
CUSTOM = "2026-12-01 {time},{i:03d} - {name} - {level} - "


# vLLM's text header: `(Process pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] message`
TEXT_HEADER = re.compile(
    r"^(?:\((?P<proc>[\w.:-]{1,60}) pid=(?P<pid>\d+)\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d [\d:.]+ \[?(?P<file>[\w.-]+?)(?::\d+)?\] ?(?P<message>.*)$"
)


def as_json_records(log: str) -> str:
    """The log as vLLM's json formatter would have written it: the lines of one logged message (the
    same header on consecutive lines) one record, its traceback in exc_info; other lines as they are."""
    out: list[str] = []
    current: dict | None = None

    def flush() -> None:
        if current is not None:
            texts = current["texts"]
            start = next((i for i, t in enumerate(texts) if t.startswith("Traceback (most recent")), len(texts))
            rec = json.loads(record("\n".join(texts[:start]), "\n".join(texts[start:]) or None, current["level"]))
            rec |= {"name": "vllm." + current["file"].removesuffix(".py"), "processName": current["proc"] or "Main"}
            out.append(json.dumps(rec | {"process": int(current["pid"] or 1), "vllm_process_name": current["proc"]}))

    for line in log.splitlines():
        found = TEXT_HEADER.match(line)
        key = found and (found["proc"], found["level"], found["file"])
        if current is not None and key == current["key"]:
            current["texts"].append(found["message"])
            continue
        flush()
        current = None
        if found is None:
            out.append(line)
        else:
            current = {"key": key, "texts": [found["message"]], **found.groupdict()}
    flush()
    return "\n".join(out) + "\n"


def wrapper(log: str) -> str:
    """A supervisor that logs each line vLLM prints with its own Python logging header."""
    return "".join(
        f"2026-12-01 10:00:{i % 60:02d},{i % 1000:03d} - supervisor - INFO - {line}\n"
        for i, line in enumerate(log.splitlines())
    )


LOGGING_FORMATS: dict[str, Callable[[str], str]] = {
    "asctime-name-levelname": reformatted("2026-12-01 {time},{i:03d} - {name} - {level} - "),
    "the same, first line only": reformatted("2026-12-01 {time},{i:03d} - {name} - {level} - ", every_line=False),
    "basicConfig": reformatted("{level}:{name}:"),
    "loguru": reformatted("2026-12-01 {time}.{i:03d} | {level:<8} | {name}:run:{line} - "),
    "bracketed, with the file": reformatted("[2026-12-01 {time}] [{level}] {file}:{line}: "),
    "a wrapper's header": wrapper,
}
