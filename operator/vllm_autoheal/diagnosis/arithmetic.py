"""Arithmetic on the engine's own figures: the device size, the numbers of a failure, memory
held by other processes, and the shapes that say "not a shortage" or "the weights cannot fit".
Every number passes figures.check first. Standard library only."""

from __future__ import annotations

from typing import Any

from . import figures
from . import messages as msg
from . import model as m
from .findings import Finding
from .units import GIB

OTHER_PROCESS_GIB = 1.0
# What a process holds outside PyTorch's allocator: its CUDA context, the math libraries'
# workspaces, NCCL's buffers. Torch before 2.2 (and torch_npu) reports only what PyTorch reserved,
# so the rest of the used memory includes this much of the failing process's own.
OWN_NON_TORCH_GIB = 2.0
WEIGHTS_SHARE_OF_GPU = 0.95  # weights above this share of the whole GPU cannot fit at any utilization


def device_gib(signals: m.Signals, findings: list[Finding]) -> float | None:
    if signals.gpu and signals.gpu.gpus:
        return max(g.total_bytes for g in signals.gpu.gpus) / GIB or None
    for f in findings:
        groups = f.message.regex.groupindex  # (a finding of a message without them has none: no groupdict)
        for key in ("total_gib", "gpu_total_gib"):
            value = f.match.group(key) if key in groups else None
            if value:
                size = figures.gib(value)
                if figures.check("total_gib", size, None) is None and size > 0:
                    return size
    return None


# Figures each worker prints of its own GPU: the smallest decides (the pipeline stage, or the rank,
# whose cache got no block), whichever printed last.
SMALLEST_OF_RANKS = frozenset({"available_kv_gib", "kv_reserved_gib"})


def numbers(
    findings: list[Finding], first: Finding | None, device_gib: float | None, notes: list[str]
) -> dict[str, Any]:
    """The decisive finding's numbers, then each other figure from the one line nearest before
    the failure (a KV budget: the smallest any worker printed). Every number passes figures.check; a
    dropped one leaves a note."""
    numbers: dict[str, Any] = {}
    end = first.line.offset if first else None
    # The figures printed before the failure, and the out-of-memory error it was raised from (vLLM
    # wraps torch's OOM in its own message: "The above exception was the direct cause ...").
    others = [
        f
        for f in findings
        if f is not first
        and (
            f.message.kind in (msg.FIGURE, msg.MILESTONE, msg.BUDGET)
            or (first is not None and f.line is first.line)
            or (first is not None and first.message.kind == msg.MEMORY and f.message.kind == msg.OOM)
        )
        and (end is None or f.line.offset <= end)
    ]
    ordered = ([first] if first else []) + sorted(others, key=lambda f: -f.line.offset)
    for f in ordered:
        groups = f.match.groupdict()
        for key, text in groups.items():
            if text is None:
                continue
            if key == "others":
                numbers.setdefault("process_gib", figures.process_sizes(text))
                continue
            key = key.rstrip("23")
            if key in numbers and key not in SMALLEST_OF_RANKS:
                continue
            value = figures.parse(key, text)
            if value is None:
                continue
            why = implausible(key, value, text, groups, device_gib)
            if why:
                # one note per kind of number: a log that repeats a figure must not grow the diagnosis
                if not any(n.startswith(f"ignored {key}=") for n in notes):
                    notes.append(f"ignored {key}={text[:40]}: {why}")
                continue
            numbers[key] = min(numbers[key], value) if key in numbers else value
    return numbers


def implausible(
    key: str, value: float | int, text: str, groups: dict[str, str | None], device_gib: float | None
) -> str | None:
    """figures.check, and what the figure's own line says of it: a size on the device is no larger
    than the total the same line gives; figures the message orders (figures.ORDERED) contradict it
    when they are the other way round; digits are ASCII's (vLLM prints no others, float() reads them)."""
    if not text.isascii():
        return "not in the digits vLLM prints"
    if key in figures.DEVICE_BOUNDED:
        for total_key in ("total_gib", "gpu_total_gib"):
            total = _own(total_key, groups)
            if total is not None:
                device_gib = min(device_gib, total) if device_gib else total
    why = figures.check(key, value, device_gib)
    for above, below in figures.ORDERED:
        if why is None and key in (above, below):
            high, low = _own(above, groups), _own(below, groups)
            if high is not None and low is not None and figures.contradicts(high, low):
                why = f"{above} is not above {below} on a line that says it is"
    return why


def _own(key: str, groups: dict[str, str | None]) -> float | None:
    """A plausible figure the same finding gives under `key`, else None."""
    text = groups.get(key)
    value = figures.parse(key, text) if text else None
    return value if value is not None and figures.check(key, value, None) is None else None


RELEASE_KEYS = ("vllm_minor", "vllm_patch")


def releases_named(findings: list[Finding]) -> set[tuple[int, int]]:
    """The (minor, patch) releases the release lines among `findings` name."""
    named = set()
    for f in findings:
        if "vllm_minor" not in f.message.regex.groupindex:  # (most findings: no groupdict)
            continue
        groups = f.match.groupdict()
        if groups.get("vllm_minor") is not None and groups.get("vllm_patch") is not None:
            named.add((int(groups["vllm_minor"]), int(groups["vllm_patch"])))
    return named


def one_release(findings: list[Finding], numbers: dict[str, Any], notes: list[str]) -> None:
    """Keep the release the log's release lines name (the engine's first line, the banner) only where they
    name one. One run names one release on every line that names it: a second is another run's, or a
    line a client wrote where a logging format leaves a message's further lines bare (a request id's
    newline): none of them is read (the release-independent figures stand)."""
    named = releases_named(findings)
    if len(named) > 1:
        for key in RELEASE_KEYS:
            numbers.pop(key, None)
        notes.append("the log names more than one vLLM release: none is read from it")


def other_process_gib(signals: m.Signals, numbers: dict) -> float:
    """GPU memory held by processes other than the engine. Torch's OOM text, when it accounts for the
    whole GPU at the failure (its total, what was free, what this process held), says it; else the
    more of that and the GPU snapshot (taken before the start: it does not see a process that came
    later, and lists one that may have gone since)."""
    torch = _torch_others_gib(numbers)
    if all(numbers.get(k) is not None for k in ("gpu_total_gib", "gpu_free_gib")) and numbers.get("own_gib"):
        return torch
    return max(_snapshot_others_gib(signals.gpu, numbers.get("oom_gpu")), torch)


def _snapshot_others_gib(snap: m.GpuSnapshot | None, oom_gpu: Any) -> float:
    """Others' memory on the GPU torch's OOM names, else on the GPU where others hold the most
    (other GPUs' processes do not take this one's memory)."""
    if snap is None or not snap.processes:
        return 0.0
    if isinstance(oom_gpu, int) and any(p.gpu_index == oom_gpu for p in snap.processes):
        return snap.other_process_bytes(oom_gpu) / GIB
    if isinstance(oom_gpu, int) and any(g.index == oom_gpu for g in snap.gpus):
        return 0.0  # the snapshot lists that GPU, and nothing else on it
    return max(snap.other_process_bytes(i) for i in {p.gpu_index for p in snap.processes}) / GIB


def _torch_others_gib(numbers: dict) -> float:
    """Others' memory by torch's OOM message (or the start-up figures)."""
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
    # torch's OOM message: what the device has, minus what is free, minus what this process holds.
    device, free = numbers.get("gpu_total_gib"), numbers.get("gpu_free_gib")
    own = numbers.get("own_gib") or None  # (torch in a container may see "0 bytes" of its own: unknown)
    if own is None and numbers.get("reserved_gib") is not None:
        own = float(numbers["reserved_gib"]) + OWN_NON_TORCH_GIB  # PyTorch's share only: add the rest
    if device and free is not None and own is not None:
        return max(0.0, float(device) - float(free) - float(own))
    total, initial = numbers.get("total_gib"), numbers.get("initial_usage_gib")
    if total and initial is not None and initial > 0.1 * total:
        return float(initial)
    return 0.0


def not_a_shortage(numbers: dict) -> bool:
    """torch reported an out-of-memory while far more was free than the allocation asked for:
    an allocator or driver error worded as OOM, not a shortage that a memory flag can fix."""
    tried, free = numbers.get("tried_gib"), numbers.get("gpu_free_gib")
    return tried is not None and free is not None and free > 1.0 and tried * 4 < free


def weights_exceed_gpu(numbers: dict, device_gib: float | None) -> bool:
    """The engine's own figures say that what it holds besides the KV cache (the weights, and the
    activation peak and non-torch memory when its budget line shows them) takes nearly the whole
    GPU: no utilization leaves room for a KV cache."""
    weights = numbers.get("weights_gib")
    total = numbers.get("total_gib") or numbers.get("gpu_total_gib") or device_gib
    if not weights or not total:
        return False
    return weights + (besides_weights(numbers) or 0.0) >= WEIGHTS_SHARE_OF_GPU * total


def besides_weights(numbers: dict) -> float | None:
    """What the engine held beside its weights and KV cache (the activation peak and non-torch memory),
    where its budget line shows all three figures: its share less the weights less the KV budget."""
    weights, requested = numbers.get("weights_gib"), numbers.get("requested_gib")
    kv = numbers.get("available_kv_gib", numbers.get("kv_reserved_gib"))
    if weights is None or requested is None or kv is None:
        return None
    return max(0.0, requested - weights - kv)
