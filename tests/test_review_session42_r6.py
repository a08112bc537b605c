"""Session 42, round 6: hostile review of c414038 (quoted.mark_continuations' `valued` re-print), 50a30b7/2fba9d5
(quoted._VALUED) and 476567b/2fba9d5/fac76f0 (origin.py's undecoded JSON object and member lines).

Findings:
- `valued` holds from any exception line without a logger header that opens `...Error: Loading lora ` to the
  next writer, and in a log without process prefixes (vLLM 0.31 on, the CPU engine, every JSON-mode log) or on
  the same process's lines every later line is that writer's. A raw traceback of a LoRA load failure that is not
  the process's last word (a caught failure printed with traceback.print_exc(), a line ahead of the engine's
  own crash) makes the engine's later, headed CUDA OOM traceback a continuation of the LoRA message: runtime_oom
  before c414038, not_oom now.

Held: a real OOM chained under `RuntimeError: Loading lora {path} failed` (raise ... from e) decides in the
logged copy, in the raw re-print alone, with or without prefixes, and as JSON records; no train corpus log
changes its cause with the JSON-object/member rules or _VALUED off; a log opening with a valued line, or
a flood of valued lines with JSON objects and member lines, costs well under 3x a normal log per byte.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from vllm_autoheal.diagnosis import Signals, classify, origin, quoted

from crafted.bases import BACKTRACKING, ROOT, cost_to_normal, real_log
from crafted.checks import diagnose, said
from crafted.records import as_json_records

BASE = "rt-27466-busy-loop"  # a real vLLM 0.11 serving crash: the engine core's CUDA OOM, then the API server's
ENGINE = "(EngineCore_DP0 pid=8402) "
API = "(APIServer pid=8267) "
LORA_FRAMES = [
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 232, in add_adapter',
    "    lora = self._load_adapter(lora_request)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 138, in _load_adapter',
]


def _unprefixed(line: str) -> str:
    return line.split(") ", 1)[1] if line.startswith("(") else line


def _lines() -> list[str]:
    return real_log(BASE).splitlines()


def _oom_line() -> str:
    return next(ln for ln in _lines() if "torch.OutOfMemoryError" in ln)


# --- (a) a raw LoRA load failure ahead of the engine's own crash ----------------------------------------------------

RAW_LORA = [
    "Traceback (most recent call last):",
    *LORA_FRAMES,
    "    raise ValueError(",
    "ValueError: Loading lora support-bot failed: No adapter found for /mnt/loras/support-bot",
]


def _raw_traceback_before_the_crash(raw: list[str], prefix: str, prefixes: bool, json_mode: bool) -> str:
    """The real crash with a raw (no logger header) traceback printed ahead of the engine's headed OOM traceback."""
    lines = _lines()
    first_error = next(i for i, ln in enumerate(lines) if " ERROR " in ln)
    out = lines[:first_error] + [prefix + ln for ln in raw] + lines[first_error:]
    if not prefixes:
        out = [_unprefixed(ln) for ln in out]
    log = "\n".join(out) + "\n"
    return as_json_records(log) if json_mode else log


CASES = [
    pytest.param(API, False, False, id="api-server-no-prefixes"),
    pytest.param(API, False, True, id="api-server-json-mode"),
    pytest.param(ENGINE, True, False, id="engine-core-prefixed"),
    pytest.param("", True, False, id="unprefixed-line-in-prefixed-log"),
]


@pytest.mark.parametrize(("prefix", "prefixes", "json_mode"), CASES)
def test_the_same_raw_traceback_without_a_lora_name_leaves_the_oom_deciding(prefix, prefixes, json_mode):
    """Control: the same raw traceback ending `ValueError: No adapter found ...` (no `Loading lora `)."""
    control = [*RAW_LORA[:-1], "ValueError: No adapter found for /mnt/loras/support-bot"]
    d = diagnose(_raw_traceback_before_the_crash(control, prefix, prefixes, json_mode))
    assert d.cause == "runtime_oom", said(d)


@pytest.mark.parametrize(("prefix", "prefixes", "json_mode"), CASES)
def test_a_raw_lora_load_failure_before_the_engines_oom_does_not_hide_it(prefix, prefixes, json_mode):
    d = diagnose(_raw_traceback_before_the_crash(RAW_LORA, prefix, prefixes, json_mode))
    assert d.cause == "runtime_oom", said(d)


# --- (a) a real OOM chained under the LoRA load failure, re-printed (held) -----------------------------------------


def _chained_lora_oom(prefixes: bool, logged: bool, reprint: bool) -> str:
    """The real crash's OOM raised inside the LoRA load and wrapped (`raise RuntimeError(f"Loading lora {lora_path}
    failed") from e`): logged by the engine core, and/or re-printed raw by multiprocessing as it dies, then the API
    server's lines."""
    oom = _oom_line()
    header = oom.split("[core.py:710] ")[0] + "[core.py:710] "
    chain = [
        "Traceback (most recent call last):",
        *LORA_FRAMES,
        "    tensors = load_file(path, device=device)",
        oom.split("[core.py:710] ", 1)[1],
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        *LORA_FRAMES,
        '    raise RuntimeError(f"Loading lora {lora_path} failed") from e',
        "RuntimeError: Loading lora /mnt/loras/support-bot failed",
    ]
    out: list[str] = []
    for ln in _lines():
        if ln == oom:
            out += [header + c for c in chain] if logged else []
        elif not ln.startswith(API):
            out.append(ln)
    if reprint:
        out += [ENGINE + c for c in ["Process EngineCore_DP0:", *chain]]
    out += [ln for ln in _lines() if ln.startswith(API)]
    if not prefixes:
        out = [_unprefixed(ln) for ln in out]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("prefixes", [True, False], ids=["prefixed", "no-prefixes"])
@pytest.mark.parametrize(
    ("logged", "reprint"), [(True, True), (False, True), (True, False)], ids=["both", "reprint-only", "logged-only"]
)
def test_an_oom_chained_under_the_lora_load_failure_decides(prefixes, logged, reprint, json_mode):
    log = _chained_lora_oom(prefixes, logged, reprint)
    d = diagnose(as_json_records(log) if json_mode else log)
    assert d.cause == "runtime_oom", said(d)
    assert d.numbers.get("tried_gib") == 0.9375


# --- (b) the corpus's training logs: the new rules change nothing --------------------------------------------------


def test_no_training_log_changes_cause_with_the_json_and_lora_rules(monkeypatch):
    rows = [json.loads(ln) for ln in (ROOT / "tests/corpus/corpus.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    now = {r["id"]: classify(Signals(log=r["log"])).cause for r in train}
    monkeypatch.setattr(quoted, "_VALUED", re.compile(r"(?!)"))
    monkeypatch.setattr(origin, "_RECORD_OPENING", "\x00never")
    monkeypatch.setattr(origin, "_RECORD_MEMBER", re.compile(r"(?!)"))
    without = {r["id"]: classify(Signals(log=r["log"])).cause for r in train}
    assert {k: (now[k], without[k]) for k in now if now[k] != without[k]} == {}


# --- (c) cost ------------------------------------------------------------------------------------------------------


def test_valued_lines_and_json_members_cost_about_what_a_normal_log_does():
    sys.path.insert(0, str(ROOT / "bench"))
    from diagnosis_speed import BODY, HEAD, TAIL

    normal = HEAD + "".join(BODY.format(s=i % 60, p=40000 + i % 20000) for i in range(3000)) + TAIL
    opened = "Process EngineCore_DP0:\nValueError: Loading lora x failed: No adapter found for /y\n"
    unprefixed = opened + "".join(_unprefixed(ln) + "\n" for ln in normal.splitlines())
    flood = ("ValueError: Loading lora x failed\n" + '{"a": 1}\n  "k": 2\n') * 10000
    for log in (opened + normal, unprefixed, flood):
        assert cost_to_normal(log, normal) < BACKTRACKING
