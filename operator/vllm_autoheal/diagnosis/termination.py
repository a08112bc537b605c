"""The launcher's termination message: its versioned schema, validated on read. Standard library only.

Whatever is in the termination-message file was written inside the tenant's container, so it is
untrusted: a document is used only when every field has the type, size and range the schema
gives it; anything else is ignored with a note (and the operator reads the previous log instead).

Version 1:
  {"autoheal": 1, "exit_code": int (optional), "diagnosis": {"cause": CAUSE, "phase": str, "subtype": str,
   "confidence": "high"|"medium"|"low", "source": str, "numbers": {name: finite number, or a list of up to 16},
   "evidence": [str], "explanation": str}, "note": str, "gpu_start": GPU, "gpu_failure": {...}}
  GPU (gpu_probe.compact, what NVML showed before vLLM started): {"error": str, "gpus": [[index,
  name, total GiB, free GiB]], "other_processes": [[pid, gpu index, GiB]]}. Only gpu_start is read
  (it tells the memory other processes held); gpu_failure is kept for people.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from . import figures
from . import model as m
from .units import GIB

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 16 * 1024  # the kubelet keeps 4 KiB; anything much larger is not ours
MAX_NUMBERS = 32
MAX_EVIDENCE = 8
MAX_LIST = 16
MAX_TEXT = 2048
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
CONFIDENCE = ("high", "medium", "low")
SOURCES = ("log", "exit-state", "termination-message", "log-tail-only", "memory-model")
# Plausible ranges of the figures vLLM prints; a number outside them is a forgery or a parse error.
RANGES: dict[str, tuple[float, float]] = {
    "util": (0.0, 1.0),
    "exit_code": (-255, 255),
    "rank": (0, 65536),
}
DEFAULT_RANGE = (0.0, 1e9)  # GiB, tokens, requests: none of them reaches a billion
GIB_RANGE = (0.0, 1e5)  # 100 TiB: more than any GPU or host


MAX_GPUS = 64
MAX_PROCESSES = 8  # what the launcher writes at most


class InvalidMessage(ValueError):
    """The termination message claims to be the launcher's but breaks the schema."""


def _text(value: Any, where: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(f"{where} is not a string")
    if len(value) > limit:
        raise InvalidMessage(f"{where} is longer than {limit} characters")
    return value


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidMessage(f"diagnosis.numbers.{name} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidMessage(f"diagnosis.numbers.{name} is not finite")
    if name in figures.KIND:  # the classifier's own table of what each figure can be
        problem = figures.check(name, value, None)
        if problem:
            raise InvalidMessage(f"diagnosis.numbers.{name} {value} is outside what vLLM prints ({problem})")
        return value
    low, high = RANGES.get(name, GIB_RANGE if name.endswith("_gib") else DEFAULT_RANGE)
    if not low <= value <= high:
        raise InvalidMessage(f"diagnosis.numbers.{name} {value} is outside {low:g}..{high:g}")
    return value


def _diagnosis(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise InvalidMessage("diagnosis is not an object")
    out: dict[str, Any] = {}
    if d.get("cause") not in m.CAUSES:
        raise InvalidMessage(f"diagnosis.cause {str(d.get('cause'))[:40]!r} is not a known cause")
    out["cause"] = d["cause"]
    if "phase" in d:
        phase = _text(d["phase"], "diagnosis.phase", 32)
        if phase not in m.PHASES:
            raise InvalidMessage(f"diagnosis.phase {phase[:32]!r} is not a known phase")
        out["phase"] = phase
    if d.get("subtype") is not None:
        subtype = _text(d["subtype"], "diagnosis.subtype", 64)
        if not NAME.match(subtype):
            raise InvalidMessage("diagnosis.subtype is not a name")
        out["subtype"] = subtype
    if "confidence" in d:
        if d["confidence"] not in CONFIDENCE:
            raise InvalidMessage("diagnosis.confidence is not high, medium or low")
        out["confidence"] = d["confidence"]
    numbers = d.get("numbers", {})
    if not isinstance(numbers, dict) or len(numbers) > MAX_NUMBERS:
        raise InvalidMessage(f"diagnosis.numbers is not an object of at most {MAX_NUMBERS} numbers")
    numbers = dict(numbers)
    for name, value in numbers.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise InvalidMessage("diagnosis.numbers has a key that is not a name")
        if isinstance(value, list):  # one figure per process or rank, e.g. process_gib
            if len(value) > MAX_LIST:
                raise InvalidMessage(f"diagnosis.numbers.{name} has more than {MAX_LIST} items")
            for item in value:
                _number(name, item)
        else:
            _number(name, value)
    out["numbers"] = dict(numbers)
    evidence = d.get("evidence", [])
    if not isinstance(evidence, list) or len(evidence) > MAX_EVIDENCE:
        raise InvalidMessage(f"diagnosis.evidence is not a list of at most {MAX_EVIDENCE} lines")
    out["evidence"] = [_text(e, "diagnosis.evidence[]", 1024) for e in evidence]
    if "explanation" in d:
        out["explanation"] = _text(d["explanation"], "diagnosis.explanation")
    return out


def _int(value: Any, where: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise InvalidMessage(f"{where} is not an integer in 0..{high}")
    return value


def _gib(value: Any, where: str, high: float = GIB_RANGE[1]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
        raise InvalidMessage(f"{where} is not a size in 0..{high:g} GiB")
    return float(value)


def _rows(value: Any, where: str, width: int, limit: int) -> list[list[Any]]:
    if not isinstance(value, list) or len(value) > limit:
        raise InvalidMessage(f"{where} is not a list of at most {limit} rows")
    if not all(isinstance(row, list) and len(row) == width for row in value):
        raise InvalidMessage(f"{where}[] is not a row of {width} fields")
    return value


def _gpu_snapshot(g: Any) -> dict[str, Any]:
    """gpu_probe.compact's form, field by field: what the GPUs held before vLLM started."""
    if not isinstance(g, dict):
        raise InvalidMessage("gpu_start is not an object")
    out: dict[str, Any] = {}
    if "error" in g:
        out["error"] = _text(g["error"], "gpu_start.error", 160)
    gpus: list[list[Any]] = []
    totals: dict[int, float] = {}  # GPU index -> its total GiB
    for index, name, total, free in _rows(g.get("gpus", []), "gpu_start.gpus", 4, MAX_GPUS):
        index, total = _int(index, "gpu_start.gpus[].index", MAX_GPUS), _gib(total, "gpu_start.gpus[].total")
        gpus.append(
            [index, _text(name, "gpu_start.gpus[].name", 40), total, _gib(free, "gpu_start.gpus[].free", total)]
        )
        totals[index] = total
    out["gpus"] = gpus
    if len(totals) != len(gpus):
        raise InvalidMessage("gpu_start.gpus lists one index twice")
    others = []
    for pid, index, used in _rows(g.get("other_processes", []), "gpu_start.other_processes", 3, MAX_PROCESSES):
        index = _int(index, "gpu_start.other_processes[].gpu", MAX_GPUS)
        if index not in totals:  # (the probe lists the processes of the GPUs it lists)
            raise InvalidMessage("gpu_start.other_processes[].gpu is not a GPU gpu_start lists")
        others.append(
            [
                _int(pid, "gpu_start.other_processes[].pid", 2**31),
                index,
                _gib(used, "gpu_start.other_processes[].gib", totals[index]),
            ]
        )
    out["other_processes"] = others
    return out


def gpu_snapshot(doc: dict[str, Any] | None) -> m.GpuSnapshot | None:
    """The validated gpu_start of a launcher's message as a snapshot the classifier reads (the
    processes it lists are all others': vLLM had not started), or None without a usable one."""
    g = (doc or {}).get("gpu_start")
    if not g or g.get("error") or not g.get("gpus"):
        return None
    return m.GpuSnapshot(
        gpus=[
            m.GpuInfo(i, name, int(total * GIB), int(free * GIB), int((total - free) * GIB))
            for i, name, total, free in g["gpus"]
        ],
        processes=[m.GpuProcess(pid, index, int(used * GIB)) for pid, index, used in g["other_processes"]],
    )


def looks_like_ours(text: str | None) -> bool:
    """A JSON object: the launcher's, or a forgery of it; never to be read as a log tail."""
    return bool(text) and text.lstrip().startswith("{")  # type: ignore[union-attr]


def validate(text: str) -> dict[str, Any]:
    """The validated document (only the fields the schema names); InvalidMessage says what is wrong."""
    if len(text.encode("utf-8", "replace")) > MAX_MESSAGE_BYTES:
        raise InvalidMessage(f"larger than {MAX_MESSAGE_BYTES} bytes")
    try:
        doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(InvalidMessage(f"{c} is not JSON")))
    except InvalidMessage:
        raise
    except ValueError as exc:
        raise InvalidMessage(f"not JSON ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise InvalidMessage("not a JSON object")
    version = doc.get("autoheal")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise InvalidMessage(f"schema version {str(version)[:16]!r} is not {SCHEMA_VERSION}")
    code = doc.get("exit_code", 0)
    if isinstance(code, bool) or not isinstance(code, int) or not -255 <= code <= 255:
        raise InvalidMessage("exit_code is not an integer exit status")
    out: dict[str, Any] = {"autoheal": SCHEMA_VERSION, "exit_code": code, "diagnosis": _diagnosis(doc.get("diagnosis"))}
    if "note" in doc:
        out["note"] = _text(doc["note"], "note")
    if "gpu_start" in doc:
        out["gpu_start"] = _gpu_snapshot(doc["gpu_start"])
    return out


def read(text: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(document, None) for a valid launcher message; (None, note) for an invalid one; (None, None)
    when the message is not JSON at all (a plain log tail)."""
    if not looks_like_ours(text):
        return None, None
    try:
        return validate(text), None  # type: ignore[arg-type]
    except InvalidMessage as exc:
        return None, f"termination message ignored: {exc}"
    except OverflowError:  # an integer too large for a float (JSON allows any number of digits)
        return None, "termination message ignored: a number too large"
    except RecursionError:
        return None, "termination message ignored: nested too deeply"


def from_termination_message(text: str | None) -> m.Diagnosis | None:
    """The launcher's JSON summary as a Diagnosis, if that is what the termination message holds and
    it passes the schema; anything else is None."""
    doc, _note = read(text)
    if doc is None:
        return None
    d = doc["diagnosis"]
    known = {k: d[k] for k in m.Diagnosis.__dataclass_fields__ if k in d}
    diag = m.Diagnosis(**known)
    diag.source = "termination-message"
    return diag
