"""classify(signals) -> Diagnosis: why a vLLM server died. Standard library only.

Order of trust: the container's exit state when it is unambiguous (OOMKilled); an
explicit vLLM memory message; host-RAM messages; known non-memory failures; NCCL
out of memory; a generic GPU OOM placed in its phase by traceback frames and
startup milestones; a worker killed by SIGKILL; a traceback cut before its last
line. Generic wrappers (`Engine core initialization failed`, `EngineDeadError`)
never decide. A wrong memory answer is worse than `unknown`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from . import messages as msg
from . import model as m
from .scan import Line, scan

PHASE_PRIORITY = (m.PHASE_CAPTURE, m.PHASE_PROFILE, m.PHASE_KV, m.PHASE_LOAD, m.PHASE_SERVING)
PHASE_ORDER = {p: i for i, p in enumerate((m.PHASE_LOAD, m.PHASE_PROFILE, m.PHASE_KV, m.PHASE_CAPTURE,
                                           m.PHASE_SERVING))}
OOM_CAUSE_BY_PHASE = {
    m.PHASE_LOAD: m.WEIGHTS_LOAD_OOM, m.PHASE_PROFILE: m.PROFILING_OOM,
    m.PHASE_KV: m.GPU_UTIL_EXCEEDS_FREE,  # memory vanished between profiling and allocation
    m.PHASE_CAPTURE: m.CUDAGRAPH_CAPTURE_OOM, m.PHASE_SERVING: m.RUNTIME_OOM,
}
OTHER_PROCESS_GIB = 1.0
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b(?::|\(|$)")
_PROCESS_GIB = re.compile(r"Process \d+ has ([\d.]+) ([GM])iB")


@dataclass
class Finding:
    line: Line
    message: msg.Message
    match: re.Match[str]


def classify(signals: m.Signals) -> m.Diagnosis:
    """Never raises: anything unreadable gives `unknown` with the reason."""
    try:
        return _classify(signals)
    except Exception as exc:  # noqa: BLE001 - a diagnosis must never crash its caller
        return m.Diagnosis(explanation=f"could not read the signals: {type(exc).__name__}: {exc}")


def classify_text(log: str, **kwargs: Any) -> m.Diagnosis:
    return classify(m.Signals(log=log, **kwargs))


def classify_stream(stream: Any, **kwargs: Any) -> m.Diagnosis:
    """Classify a log read from a text stream, in bounded memory, without loading it whole."""
    try:
        return _classify(m.Signals(**kwargs), scan(stream).lines)
    except Exception as exc:  # noqa: BLE001
        return m.Diagnosis(explanation=f"could not read the log: {type(exc).__name__}: {exc}")


def from_termination_message(text: str | None) -> m.Diagnosis | None:
    """The launcher's JSON summary, if that is what the termination message holds."""
    if not text or not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    d = data.get("diagnosis") if isinstance(data, dict) else None
    if not isinstance(d, dict) or d.get("cause") not in m.CAUSES:
        return None
    known = {k: d[k] for k in m.Diagnosis.__dataclass_fields__ if k in d}
    diag = m.Diagnosis(**known)
    diag.source = "termination-message"
    return diag


def _findings(lines: list[Line]) -> list[Finding]:
    out = []
    for line in lines:
        for message in msg.MESSAGES:
            found = message.regex.search(line.text)
            if found:
                out.append(Finding(line, message, found))
    return out


def _numbers(findings: list[Finding], first: Finding | None) -> dict[str, float | int]:
    numbers: dict[str, float | int] = {}
    ordered = ([first] if first else []) + [f for f in findings if f is not first]
    for f in ordered:
        for key, value in f.match.groupdict().items():
            if value is None:
                continue
            if key == "others":
                sizes = [float(v) * (1 if u == "G" else 1 / 1024) for v, u in _PROCESS_GIB.findall(value)]
                numbers.setdefault("process_gib", [round(s, 2) for s in sizes])  # type: ignore[arg-type]
                continue
            key = key.rstrip("2")
            if key.endswith("_gib"):
                numbers.setdefault(key, msg.gib(value))
            elif key in ("util",):
                numbers.setdefault(key, float(value))
            else:
                try:
                    numbers.setdefault(key, int(value.replace(",", "")))
                except ValueError:
                    pass
    return numbers


def _multi_gpu(signals: m.Signals, numbers: dict, lines: list[Line]) -> bool:
    world = (signals.tensor_parallel_size or numbers.get("tp") or 1) * \
            (signals.pipeline_parallel_size or numbers.get("pp") or 1)
    return max(world, signals.gpu_count or 1) > 1 or any((ln.rank or 0) > 0 for ln in lines)


def _other_process_gib(signals: m.Signals, numbers: dict) -> float:
    """GPU memory held by processes other than the engine, from the GPU snapshot or torch's OOM text."""
    if signals.gpu and signals.gpu.processes:
        return signals.gpu.other_process_bytes() / 2**30
    sizes = numbers.get("process_gib") or []
    if isinstance(sizes, list) and sizes:
        if "own_gib" in numbers:  # torch named the failing process "this process": the others are others
            return sum(sizes)
        # In a container torch may list the failing process itself as "Process N": the largest
        # entry is then ours when it covers what PyTorch allocated.
        own = max(sizes)
        if own + 1.0 < float(numbers.get("torch_allocated_gib") or 0):
            return sum(sizes)
        return sum(sizes) - own
    total, initial = numbers.get("total_gib"), numbers.get("initial_usage_gib")
    if total and initial is not None and initial > 0.1 * total:
        return float(initial)
    return 0.0


def _phase_of_failure(findings: list[Finding], failure: Finding | None, ready_before: bool | None) -> str:
    """Where it failed. Frames and markers printed after the last start-up milestone before the
    failure decide (earlier ones belong to steps that completed); else the last milestone reached."""
    end = failure.line.offset if failure else None
    before = [f for f in findings if f.message.kind == msg.MILESTONE and (end is None or f.line.offset < end)]
    window = max((f.line.offset for f in before), default=-1)
    frames = {f.message.phase for f in findings if f.message.kind == msg.FRAME and f.line.offset > window}
    for phase in PHASE_PRIORITY:
        if phase in frames:
            return phase
    reached = [f.message.phase for f in before]
    if ready_before or m.PHASE_SERVING in reached:
        return m.PHASE_SERVING
    if reached:
        last = max(reached, key=lambda p: PHASE_ORDER[p])
        return {m.PHASE_KV: m.PHASE_CAPTURE}.get(last, last)  # after KV sizing comes graph capture
    return m.PHASE_UNKNOWN


def _evidence(*lines: Line | None) -> list[str]:
    out: list[str] = []
    for ln in lines:
        if ln is not None and ln.text not in out:
            out.append(ln.text[:400])
    return out[:4]


def _classify(signals: m.Signals, lines: list[Line] | None = None) -> m.Diagnosis:
    from_launcher = from_termination_message(signals.termination_message)
    if from_launcher is not None:
        return from_launcher
    log = signals.log or ""
    source = "log"
    if lines is None:
        if not log.strip() and signals.termination_message:
            log, source = signals.termination_message, "log-tail-only"
        lines = scan(log).lines
    elif not lines:
        log = ""
    findings = _findings(lines)
    by_kind: dict[str, list[Finding]] = {}
    for f in findings:
        by_kind.setdefault(f.message.kind, []).append(f)
    numbers: dict[str, Any]
    diag = m.Diagnosis(source=source)

    def done(cause: str, phase: str, first: Finding | None, confidence: str, subtype: str | None = None,
             support: Line | None = None, why: str = "") -> m.Diagnosis:
        diag.cause, diag.phase, diag.confidence = cause, phase, confidence
        diag.subtype = subtype or (first.message.subtype if first else None)
        diag.evidence = _evidence(first.line if first else None, support)
        diag.numbers = {k: v for k, v in _numbers(findings, first).items() if k not in ("tp", "pp")}
        if signals.exit_code is not None:
            diag.numbers["exit_code"] = signals.exit_code
        if first and first.line.rank is not None:
            diag.numbers["rank"] = first.line.rank
        diag.explanation = why or EXPLANATIONS.get(cause, "")
        if source == "log-tail-only":
            diag.explanation += " (Read from the log tail in the termination message only.)"
        return diag

    numbers = _numbers(findings, None)
    reason = (signals.reason or "").strip()
    if reason == "OOMKilled":
        return done(m.HOST_RAM_OOM, _phase_of_failure(findings, None, signals.ready_before), None, "high",
                    "container_memory_limit", why="The container hit its memory limit and was OOMKilled.")
    if memory := by_kind.get(msg.MEMORY):
        first = min(memory, key=lambda f: msg.MESSAGES.index(f.message))
        cause = first.message.cause or m.UNKNOWN
        if cause == m.KV_CACHE_INSUFFICIENT:
            if (signals.pipeline_parallel_size or numbers.get("pp") or 1) > 1:
                return done(m.MULTI_GPU_OOM, m.PHASE_KV, first, "medium", "kv_check_fails_on_smallest_stage",
                            why="The KV-cache check failed on one pipeline stage; under pipeline parallelism "
                                "the stage with the least free memory sets the limit.")
            if first.message.subtype == "no_cache_blocks" and \
                    _other_process_gib(signals, numbers) > OTHER_PROCESS_GIB:
                return done(m.GPU_UTIL_EXCEEDS_FREE, m.PHASE_KV, first, "medium", "other_process_holds_gpu")
        return done(cause, first.message.phase or m.PHASE_UNKNOWN, first, "high")
    if host := by_kind.get(msg.HOST):
        return done(m.HOST_RAM_OOM, host[0].message.phase or _phase_of_failure(findings, host[0], None),
                    host[0], "high")
    nccl = by_kind.get(msg.NCCL_OOM)
    oom = by_kind.get(msg.OOM)
    not_oom = by_kind.get(msg.NOT_OOM)
    if not_oom and not oom and not nccl:
        first = not_oom[0]  # the first failure is the root cause; show its exception line if there is one
        shown = next((f for f in not_oom if f.message.subtype == first.message.subtype
                      and _EXCEPTION_LINE.match(f.line.text)), first)
        return done(m.NOT_OOM, _phase_of_failure(findings, first, signals.ready_before), shown, "high")
    if nccl:
        return done(m.MULTI_GPU_OOM, _phase_of_failure(findings, nccl[0], signals.ready_before), nccl[0], "high")
    if oom:
        first = oom[0]
        phase = _phase_of_failure(findings, first, signals.ready_before)
        frame = next((f.line for f in findings if f.message.kind == msg.FRAME and f.message.phase == phase), None)
        if phase in (m.PHASE_LOAD, m.PHASE_PROFILE, m.PHASE_KV, m.PHASE_UNKNOWN) and \
                _other_process_gib(signals, numbers) > OTHER_PROCESS_GIB:
            return done(m.GPU_UTIL_EXCEEDS_FREE, phase, first, "medium", "other_process_holds_gpu", frame)
        if phase == m.PHASE_UNKNOWN:
            if _multi_gpu(signals, numbers, lines):
                return done(m.MULTI_GPU_OOM, phase, first, "low", "oom_on_one_rank")
            guess = m.PROFILING_OOM if signals.ready_before is False else m.RUNTIME_OOM
            return done(guess, phase, first, "low", "oom_phase_unknown",
                        why=EXPLANATIONS[guess] + " The log does not show where; this is a guess.")
        return done(OOM_CAUSE_BY_PHASE[phase], phase, first, "high" if frame else "medium",
                    f"oom_in_{phase.replace('-', '_')}", frame)
    if killed := by_kind.get(msg.KILLED):
        return done(m.HOST_RAM_OOM, _phase_of_failure(findings, killed[0], signals.ready_before), killed[0],
                    "medium", why="A vLLM worker was killed with SIGKILL (exit code -9), which is what the "
                                  "kernel's out-of-memory killer does when host RAM or the container limit runs out.")
    if signals.exit_code == 137 and reason in ("", "OOMKilled"):
        return done(m.HOST_RAM_OOM, m.PHASE_UNKNOWN, None, "low", "sigkill_exit_137",
                    why="The container exited with 137 (SIGKILL) and printed no cause; most often the memory limit.")
    exception = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln.text)
                      and not msg.WRAPPERS.search(ln.text)), None)
    if exception is not None:
        return done(m.NOT_OOM, _phase_of_failure(findings, None, signals.ready_before), None, "low",
                    "other_error", exception, why="vLLM stopped on an error that is not about memory.")
    frames = [f for f in findings if f.message.kind == msg.FRAME and f.message.phase != m.PHASE_SERVING]
    if frames and any("Traceback" in ln.text for ln in lines):
        phase = _phase_of_failure(findings, None, signals.ready_before)
        if phase in OOM_CAUSE_BY_PHASE and phase != m.PHASE_SERVING:
            return done(OOM_CAUSE_BY_PHASE[phase], phase, frames[-1], "low", "traceback_cut_before_error",
                        why=EXPLANATIONS[OOM_CAUSE_BY_PHASE[phase]] + " Inferred from the traceback alone: "
                            "its last line (the error) is missing.")
    return done(m.UNKNOWN, m.PHASE_UNKNOWN, None, "low",
                why="No known failure message was found" + (" (empty log)." if not log.strip() else "."))


EXPLANATIONS = {
    m.KV_CACHE_INSUFFICIENT: "The memory left for the KV cache cannot hold one request of max_model_len.",
    m.GPU_UTIL_EXCEEDS_FREE: "vLLM asked for more memory than was free: something else holds part of it.",
    m.WEIGHTS_LOAD_OOM: "The model weights do not fit in the GPU memory vLLM may use.",
    m.PROFILING_OOM: "Out of memory in the start-up profiling run (the dummy batch or sampler warm-up).",
    m.CUDAGRAPH_CAPTURE_OOM: "Out of memory while capturing CUDA graphs at the end of start-up.",
    m.RUNTIME_OOM: "Out of GPU memory while serving requests, after a successful start.",
    m.MULTI_GPU_OOM: "Out of memory on one GPU of a multi-GPU deployment.",
    m.HOST_RAM_OOM: "The machine or container ran out of host (CPU) RAM.",
    m.NOT_OOM: "The crash is not about memory; memory settings must not be changed for it.",
}
