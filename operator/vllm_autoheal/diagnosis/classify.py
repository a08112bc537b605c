"""classify(signals) -> Diagnosis: why a vLLM server died. Standard library only.

What decides, in order of trust:
1. the container's exit state when it is unambiguous (the kubelet's OOMKilled);
2. the engine's own lines only: request and response echoes and access lines carry user
   text and never decide nor appear as evidence (origin.py tells each line's origin);
3. the failure kind: an explicit vLLM memory message; start-up figures that leave no room for
   the KV cache; host-RAM messages; known non-memory failures; NCCL out of memory; a generic
   GPU out-of-memory placed in its phase by the frames of its own traceback and the last
   start-up milestone before it; a worker killed by SIGKILL; an unrecognised exception;
4. arithmetic on the engine's figures: weights larger than the whole GPU are a weights
   problem whatever the last line says;
5. the deployment context (TP/PP, GPU count, other processes on the GPU).
Generic wrappers (`Engine core initialization failed`, `EngineDeadError`) never decide. Where
the signals disagree the answer is `unknown`, with the reason. A wrong memory answer is worse
than `unknown`.
"""

from __future__ import annotations

from typing import Any

from . import arithmetic as ar
from . import messages as msg
from . import model as m
from . import termination, unplaced
from .evidence import quotable_evidence
from .findings import EXCEPTION_LINE, FAILURE_KINDS, Finding, findings_of
from .last_resort import last_words
from .nearest import Figures
from .origin import ENGINE, MATCH_CHARS
from .phase import OOM_CAUSE_BY_PHASE, phase_of_failure
from .scan import Line, scan
from .termination import from_termination_message
from .writers import clients_lines, served_before

# Failures that never outvote one named elsewhere in the log: what the other ranks report when one
# died (NCCL timing out or aborting them), and a wrapper's quote of a message that may go on over
# lines it does not read (Triton's, KServe's).
CONSEQUENCES = {
    "nccl_timeout",
    "nccl_error",
    "worker_hang_shm_broadcast",
    "process_abort",
    "triton_stub_failed_of_other_error",
    "model_server_failed_of_other_error",
}


def classify(signals: m.Signals) -> m.Diagnosis:
    """Never raises: anything unreadable gives `unknown` with the reason."""
    try:
        return _classify(signals)
    except Exception as exc:  # noqa: BLE001 - a diagnosis must never crash its caller
        return m.Diagnosis(explanation=f"could not read the signals: {type(exc).__name__}")


def classify_stream(stream: Any, **kwargs: Any) -> m.Diagnosis:
    """Classify a log read from a text stream, in bounded memory, without loading it whole."""
    try:
        return _classify(m.Signals(**kwargs), scan(stream).lines)
    except Exception as exc:  # noqa: BLE001
        return m.Diagnosis(explanation=f"could not read the log: {type(exc).__name__}")


def _classify(signals: m.Signals, lines: list[Line] | None = None) -> m.Diagnosis:
    from_launcher = from_termination_message(signals.termination_message)
    if from_launcher is not None:
        return from_launcher
    log = signals.log or ""
    source = "log"
    if lines is None:
        if (
            not log.strip()
            and signals.termination_message
            and not termination.looks_like_ours(signals.termination_message)
        ):
            log, source = signals.termination_message, "log-tail-only"
        lines = scan(log).lines
    elif not lines:
        log = ""
    engine_lines = [ln for ln in lines if ln.origin == ENGINE]
    ignored = len(lines) - len(engine_lines)
    found = findings_of(lines)
    # What may decide: the engine's own lines; failure kinds only where it reported an error.
    # A warning, or a request's own error (a 400), is a last resort: it may say "not memory" when
    # nothing else in the log says anything, never more.
    # (a GPU memory failure the API server wrote is a client's text: writers.py)
    # (and the engine's memory words in a request's report, where they cannot be the engine's: writers.py)
    releases = ar.releases_named([f for f in found if f.line.origin == ENGINE and not f.line.request_report])
    clients = clients_lines(found, releases)
    findings = [
        f
        for f in found
        if not (f.message.kind in FAILURE_KINDS and (f.line.informational or f.last_resort))
        and (f.line.origin == ENGINE or f.message.kind != msg.NOT_OOM)
        and id(f.line) not in clients
    ]
    kept = {id(f) for f in findings}
    # A warning after which the engine reached a further milestone was not what stopped it (vLLM's
    # "No available shared memory broadcast block found in 60 seconds" during a long compile).
    went_on = max(
        (f.line.offset for f in found if f.message.kind == msg.MILESTONE and f.line.origin == ENGINE),
        default=-1,
    )
    last_resort = [f for f in found if f.message.kind == msg.NOT_OOM and id(f) not in kept and f.line.offset > went_on]
    by_kind: dict[str, list[Finding]] = {}
    for f in findings:
        by_kind.setdefault(f.message.kind, []).append(f)
    diag = m.Diagnosis(source=source)
    if ignored:
        diag.notes.append(f"{ignored} request/response or access line(s) ignored: they carry user text")
    device_gib = ar.device_gib(signals, findings)
    figs = Figures(findings, device_gib)  # (the figures nearest each failure asked about, indexed once)

    def done(
        cause: m.Cause,
        phase: m.EnginePhase,
        first: Finding | None,
        confidence: str,
        subtype: str | None = None,
        support: Line | None = None,
        why: str = "",
    ) -> m.Diagnosis:
        diag.cause, diag.phase, diag.confidence = cause, phase, confidence
        diag.subtype = subtype or (first.message.subtype if first else None)
        # (a further line of an exception's message may be a client's: it decides "not memory" as a
        # last resort, and is never quoted)
        cited = first.line if first and not first.last_resort else None
        diag.evidence = quotable_evidence(
            cited, support, engine_error=first is not None and first.message.kind != msg.NOT_OOM
        )
        figures = figs.numbers(first, diag.notes)
        diag.numbers = {k: v for k, v in figures.items() if k not in ("tp", "pp")}
        ar.one_release(findings, diag.numbers, diag.notes)
        if diag.subtype in ("other_process_holds_gpu", "no_blocks_beside_other_processes"):  # (what they hold)
            diag.numbers["others_gib"] = round(ar.other_process_gib(signals, figures), 2)
        per_process: Any = diag.numbers.get("process_gib")
        if isinstance(per_process, list):  # numbers are scalars: the others' total
            diag.numbers["process_gib"] = round(sum(per_process), 2)
        if signals.exit_code is not None:
            diag.numbers["exit_code"] = signals.exit_code
        if first and first.line.rank is not None:
            diag.numbers["rank"] = first.line.rank
        diag.explanation = why or m.EXPLANATIONS.get(cause, "")
        if source == "log-tail-only":
            diag.explanation += " (Read from the log tail in the termination message only.)"
        return diag

    numbers = figs.numbers(None, [])
    reason = (signals.reason or "").strip()
    if reason == "OOMKilled":
        return done(
            m.HOST_RAM_OOM,
            phase_of_failure(findings, None, signals.ready_before),
            None,
            "high",
            "container_memory_limit",
            why="The container hit its memory limit and was OOMKilled.",
        )
    memory = by_kind.get(msg.MEMORY) or by_kind.get(msg.BUDGET)
    if memory:
        first = min(memory, key=lambda f: (msg.MESSAGES.index(f.message), f.line.offset))
        cause = first.message.cause or m.UNKNOWN
        if first.message.subtype == "other_process_changed_memory_during_profiling":
            nums = figs.numbers(first, [])
            if nums.get("current_free_gib", -1.0) >= nums.get("initial_free_gib", float("inf")):
                return done(
                    m.NOT_OOM,
                    m.PHASE_PROFILE,
                    first,
                    "medium",
                    "profiling_check_without_shortage",
                    why="vLLM's profiling check failed while free memory did not shrink (it stayed or "
                    "grew): nothing took memory from vLLM, so no memory setting helps.",
                )
        if cause == m.KV_CACHE_INSUFFICIENT:
            nums = figs.numbers(first, [])
            if ar.weights_exceed_gpu(nums, device_gib):
                return done(
                    m.WEIGHTS_LOAD_OOM,
                    m.PHASE_LOAD,
                    first,
                    "high",
                    "weights_exceed_gpu",
                    why="The weights alone take nearly the whole GPU (by vLLM's own figures): no "
                    "utilization leaves room for a KV cache. A quantized checkpoint or more GPUs "
                    "would fit.",
                )
            if (signals.pipeline_parallel_size or numbers.get("pp") or 1) > 1:
                return done(
                    m.MULTI_GPU_OOM,
                    m.PHASE_KV,
                    first,
                    "medium",
                    "kv_check_fails_on_smallest_stage",
                    why="The KV-cache check failed on one pipeline stage; under pipeline parallelism "
                    "the stage with the least free memory sets the limit.",
                )
            if (
                first.message.subtype == "no_cache_blocks"
                and ar.other_process_gib(signals, numbers) > ar.OTHER_PROCESS_GIB
            ):
                return done(
                    m.GPU_UTIL_EXCEEDS_FREE,
                    m.PHASE_KV,
                    first,
                    "medium",
                    "no_blocks_beside_other_processes",
                    why="vLLM found no memory for a single KV block while other processes hold part of the GPU. "
                    "Its budget is its share of the whole GPU less what it measured in use (up to 0.6, and in "
                    "early V1, every process's memory; later, memory that grew while it profiled): a smaller "
                    "share leaves the cache less still, a larger one room.",
                )
        return done(
            cause,
            first.message.phase or m.PHASE_UNKNOWN,
            first,
            "high" if first.message.kind == msg.MEMORY else "medium",
        )
    if host := by_kind.get(msg.HOST):
        return done(m.HOST_RAM_OOM, host[0].message.phase or phase_of_failure(findings, host[0], None), host[0], "high")
    nccl = by_kind.get(msg.NCCL_OOM)
    oom = by_kind.get(msg.OOM)
    not_oom = by_kind.get(msg.NOT_OOM, [])
    gpu_oom = (nccl or []) + (oom or [])
    if not_oom:
        causes = [f for f in not_oom if f.message.subtype not in CONSEQUENCES]
        # The first failure is the root cause; among consequences alone, an abort says least (the
        # watchdog's timeout that caused it says why).
        telling = causes or [f for f in not_oom if f.message.subtype != "process_abort"] or not_oom
        first = min(telling, key=lambda f: f.line.offset)
        shown = next(
            (f for f in not_oom if f.message.subtype == first.message.subtype and EXCEPTION_LINE.match(f.line.text)),
            first,
        )
        # A rank killed by the kernel leaves the others timing out in NCCL or the shm broadcast:
        # those consequences never outvote the kill.
        if not gpu_oom:
            if causes or msg.KILLED not in by_kind:
                return done(m.NOT_OOM, phase_of_failure(findings, first, signals.ready_before), shown, "high")
        elif causes and min(f.line.offset for f in causes) < min(f.line.offset for f in gpu_oom):
            first_oom = min(gpu_oom, key=lambda f: f.line.offset)
            diag.notes.append(f"an out-of-memory error follows a {causes[0].message.subtype} failure")
            return done(
                m.UNKNOWN,
                phase_of_failure(findings, first, signals.ready_before),
                causes[0],
                "low",
                "signals_disagree",
                first_oom.line,
                why=f"The engine reported a non-memory failure ({causes[0].message.subtype}) before an "
                "out-of-memory error; which one is the root cause cannot be told from the log, so no "
                "memory setting is changed.",
            )
    if nccl:
        return done(m.MULTI_GPU_OOM, phase_of_failure(findings, nccl[0], signals.ready_before), nccl[0], "high")
    if oom:
        first = oom[0]
        if _named_only(oom) and any(msg.RAY_RUNS_WORKERS.search(ln.raw[:MATCH_CHARS]) for ln in engine_lines):
            return done(
                m.UNKNOWN,
                phase_of_failure(findings, None, signals.ready_before),
                first,
                "low",
                "oom_of_torch_or_ray",
                why="The log names an OutOfMemoryError only by its class's bare name, and Ray runs the "
                "workers: Ray's memory monitor (host RAM) raises an error of that name too, and its message, "
                "which would tell, is not in the log. No memory setting is changed.",
            )
        phase = phase_of_failure(findings, first, signals.ready_before)
        # (a request line is only a sign that it served: the engine's own word that it failed while
        # starting outranks it)
        said_starting = any(not f.line.informational for f in by_kind.get(msg.STARTING, []))
        if (
            phase == m.PHASE_UNKNOWN
            and signals.ready_before is None
            and not said_starting
            and served_before(lines, first.line)
        ):
            phase = m.PHASE_SERVING
        frame = next((f.line for f in findings if f.message.kind == msg.FRAME and f.message.phase == phase), None)
        if phase == m.PHASE_SERVING and signals.ready_before is False:
            phase = m.PHASE_PROFILE  # it never answered /health: a start-up warm-up ran the model, not a request
        nums = figs.numbers(first, [])
        if ar.not_a_shortage(nums):
            return done(
                m.NOT_OOM,
                phase,
                first,
                "medium",
                "oom_error_with_memory_free",
                why=f"torch reported out of memory for {nums['tried_gib']:g} GiB while "
                f"{nums['gpu_free_gib']:g} GiB was free: an allocator or driver error, not a shortage. "
                "Memory settings are left alone.",
            )
        if (
            phase in (m.PHASE_LOAD, m.PHASE_PROFILE, m.PHASE_KV, m.PHASE_UNKNOWN)
            and ar.other_process_gib(signals, nums) > ar.OTHER_PROCESS_GIB
        ):
            return done(m.GPU_UTIL_EXCEEDS_FREE, phase, first, "medium", "other_process_holds_gpu", frame)
        if phase == m.PHASE_UNKNOWN:
            # No frame or milestone places the OOM. If the server had served, phase_of_failure says
            # serving; a start-up failure (the pod never Ready, or the engine's start-up wrappers)
            # may be in loading, profiling, KV sizing or graph capture, each wanting another change:
            # only torch's figures and the model's size can still tell (unplaced.py); else none.
            # (Guessing profiling was wrong on 3 of the 4 train logs it decided.)
            starting = signals.ready_before is False or said_starting
            # Only torch's own message places it: figures of other lines (a prompt's line of a
            # multi-line log, an earlier run) never do.
            told = ar.numbers([f for f in findings if f.line is first.line], first, device_gib, [])
            snapshot = ar.device_gib(signals, []) if signals.gpu else None
            slept = any(unplaced.SLEPT.search(ln.match_text) for ln in engine_lines)
            device = told.get("gpu_total_gib") or snapshot
            placed = unplaced.place(told, starting, signals.weights_gib_per_gpu, device, slept)
            if placed is not None:
                done(placed.cause, placed.phase, first, "medium", placed.subtype, why=placed.why)
                if placed.cause == m.WEIGHTS_LOAD_OOM:
                    diag.numbers["weights_gib_per_gpu"] = signals.weights_gib_per_gpu or 0.0
                return diag
            where = (
                "while the server was starting, but the log does not show in which step"
                if starting
                else "but the log shows neither where nor whether the server had started"
            )
            return done(
                m.UNKNOWN,
                phase,
                first,
                "low",
                "oom_phase_unknown",
                why=f"The GPU ran out of memory {where}: which setting to change cannot be told, so none is changed.",
            )
        return done(
            OOM_CAUSE_BY_PHASE[phase],
            phase,
            first,
            "high" if frame else "medium",
            f"oom_in_{phase.replace('-', '_')}",
            frame,
        )
    if killed := by_kind.get(msg.KILLED):
        return done(
            m.HOST_RAM_OOM,
            phase_of_failure(findings, killed[0], signals.ready_before),
            killed[0],
            "medium",
            why="A vLLM worker was killed with SIGKILL (exit code -9), which is what the "
            "kernel's out-of-memory killer does when host RAM or the container limit runs out.",
        )
    if signals.exit_code == 137 and reason in ("", "OOMKilled"):
        return done(
            m.HOST_RAM_OOM,
            m.PHASE_UNKNOWN,
            None,
            "low",
            "sigkill_exit_137",
            why="The container exited with 137 (SIGKILL) and printed no cause; most often the memory limit.",
        )
    if last_resort:  # a hang the engine logged as a warning, or a request's error, and nothing else
        first = min(last_resort, key=lambda f: f.line.offset)
        return done(
            m.NOT_OOM,
            phase_of_failure(findings, None, signals.ready_before),
            first,
            "low",
            why="The only failure in the log is a warning or a request's own error, not a memory failure.",
        )
    own = [ln for ln in engine_lines if not ln.value and id(ln) not in clients]  # (nor a client's)
    words = last_words(own)
    if words is not None:
        phase = phase_of_failure(findings, None, signals.ready_before)
        return done(words.cause, phase, None, "low", words.subtype, words.line, why=words.why)
    return done(
        m.UNKNOWN,
        m.PHASE_UNKNOWN,
        None,
        "low",
        why="No known failure message was found" + (" (empty log)." if not lines else "."),
    )


def _named_only(oom: list[Finding]) -> bool:
    """Every out-of-memory error of the log is known only by its class's bare name (no `torch.`
    before it, no other out-of-memory wording): torch's and Ray's share that name."""
    return all(
        f.match.group(0) == msg.BARE_OOM_TYPE and f.match.string[max(0, f.match.start() - 1) : f.match.start()] != "."
        for f in oom
    )
