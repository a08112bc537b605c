"""`serve`'s JSON-lines history, read as untrusted input: the file decides the flags of the next start.

Anyone who can write the file (a careless edit, a truncated write, two runs appending at once, a
copy from another machine) must not be able to crash `serve` or start vLLM with flags outside
the bounds given on its command line. So only the end of the file is read, a record counts only
when it is a JSON object with valid flags, and remembered flags are used only when they differ from
the command line's in what a heal may change, each inside the bounds in force.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .api import EngineArgs, HealPolicy
from .engine import redacted
from .remedy_gate import CALLS_FOR, Limits, batch_below_seqs, bounds_problem

READ_BYTES = 1 << 20  # the newest records; a heal record is a few KiB
# The flags some heal may set: any other difference is not a heal's doing.
HEALABLE = frozenset(name for fields in CALLS_FOR.values() for name in fields if name in EngineArgs.model_fields)


def append_record(path: Path, record: dict[str, Any]) -> str | None:
    """Append one record; why not, when it cannot be written (a FIFO or device would block or swallow it)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_file():
            return "not a regular file"
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:
        return str(exc)
    return None


def read_records(path: Path, key: str) -> list[dict[str, Any]]:
    """The records of `key` in the last READ_BYTES of the file, oldest first; anything else is skipped."""
    try:
        if not path.is_file():  # (opening a FIFO waits for a writer; a device may never end)
            return []
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - READ_BYTES))
            data = f.read(READ_BYTES)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > READ_BYTES:
        lines = lines[1:]  # the first line is cut
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and record.get("key") == key:
            out.append(record)
    return out


def recorded(engine: EngineArgs) -> dict[str, Any]:
    """The flags as a record holds them: a credential among extraArgs hidden (engine.redacted)."""
    return {**engine.model_dump(mode="json"), "extra_args": redacted(list(engine.extra_args))}


def remembered(
    records: list[dict[str, Any]], baseline: EngineArgs, limits: Limits
) -> tuple[EngineArgs | None, str | None]:
    """The flags of the newest healthy record, if they may be used: (flags, None), or (None, why not)."""
    healthy = [r for r in records if r.get("event") == "healthy"]
    if not healthy:
        return None, None
    try:
        engine = EngineArgs.model_validate(healthy[-1].get("engine"))
    except ValidationError as exc:
        err = exc.errors()[0]
        return None, f"its flags are not valid ({'.'.join(str(p) for p in err['loc'])}: {err['msg']})"
    # (extraArgs are recorded with credentials hidden: the baseline's own are what run)
    engine = (
        engine.model_copy(update={"extra_args": list(baseline.extra_args)})
        if engine.extra_args == redacted(list(baseline.extra_args))
        else engine
    )
    now, then = baseline.model_dump(), engine.model_dump()
    changes = {k: v for k, v in then.items() if v != now[k]}
    if foreign := sorted(set(changes) - HEALABLE):
        return None, f"it changes {', '.join(foreign)}, which no heal sets"
    if "quantization" in changes:  # (the quantized fallback's switch: with its model, which run_model weighs)
        return None, "it changes the quantization, which a heal changes only with the model"
    if batch_below_seqs(engine):
        return None, "max_num_batched_tokens is below max_num_seqs"
    if problem := bounds_problem(changes, engine, limits):
        return None, problem
    return engine, None


def run_model(
    records: list[dict[str, Any]], model: str, baseline: EngineArgs, policy: HealPolicy
) -> tuple[str, EngineArgs, str | None]:
    """The model the newest healthy record ran, and the flags its own are weighed against: `model` and
    `baseline`, or the quantized fallback a heal switched to with its method (the switch's flags), where the
    policy still names it; else why the record is not used."""
    healthy = [r for r in records if r.get("event") == "healthy"]
    ran = healthy[-1].get("model") if healthy else None
    if ran is None or ran == model:
        return model, baseline, None
    fallback = policy.quantized_fallback
    if not (fallback.allowed and fallback.model and ran == fallback.model):
        return model, baseline, "they ran another model, not the quantized fallback named now"
    engine = healthy[-1].get("engine")
    if not isinstance(engine, dict) or engine.get("quantization") != fallback.method:
        return model, baseline, "they ran the quantized fallback under another method than the one named now"
    return fallback.model, baseline.model_copy(update={"quantization": fallback.method}), None
