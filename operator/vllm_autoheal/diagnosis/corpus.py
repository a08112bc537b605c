"""The labelled failure-log corpus format (tests/corpus/): one JSON object per
line with `id`, `source_url`, `label`, `log`, and what the thread says of the deployment
(`engine_args`, `gpu`, `vllm_version`, ...). Standard library only.

`context(sample)` reads the deployment facts an operator knows from a VLLMService's spec
(tensor/pipeline parallel size, GPU count) out of a sample's free-text fields; with
`pod_state=True` it adds what the operator also knows of the crashed run, from the pod: whether
it had been Ready (`ready_before`) and how the container ended (`exit`), as a blind reviewer
read them from the thread. So the corpus is classified with the same signals the operator has.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def _int(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text, re.IGNORECASE)
    return int(found.group(1)) if found else None


# How a thread words the end of a container, as the kubelet would report it: (exit code, reason).
SIGKILL_EXIT = 137
EXITS: dict[Any, tuple[int, str | None]] = {
    "OOMKilled": (SIGKILL_EXIT, "OOMKilled"),
    "Killed": (SIGKILL_EXIT, None),  # the shell's word for its child's SIGKILL: the container's exit
}


def _pod_state(sample: dict[str, Any]) -> dict[str, Any]:
    """Signals keyword arguments: the crashed run's Ready condition and exit, where known."""
    out: dict[str, Any] = {}
    if isinstance(sample.get("ready_before"), bool):
        out["ready_before"] = sample["ready_before"]
    end = sample.get("exit")
    if end in EXITS:
        out["exit_code"], out["reason"] = EXITS[end]
    elif isinstance(end, int) and not isinstance(end, bool) and end >= 0:
        out["exit_code"] = end  # a negative code is a worker process's, not the container's
    return out


def context(sample: dict[str, Any], pod_state: bool = False) -> dict[str, Any]:
    """Signals keyword arguments: the deployment context a sample's metadata states, and with
    `pod_state` the run's Ready condition and exit."""
    args, gpu = sample.get("engine_args") or "", sample.get("gpu") or ""
    names = [n.strip() for n in gpu.split("+")] if "+" in gpu else []
    count = _int(r"^(\d+)\s*x\s", gpu) or _int(r"(\d+) GPUs", gpu) or (len(names) or None)
    pp = _int(r"(?:pipeline[_-]parallel[_-]size|-pp|\bPP)\s*[=\s]?\s*(\d+)", args)
    if pp is None and re.search(r"pipeline[ _-]parallel", args, re.IGNORECASE):
        pp = 2  # the thread says pipeline parallel (or "> 1") without the size: all that is used is > 1
    deployment = {
        "tensor_parallel_size": _int(r"(?:tensor[_-]parallel[_-]size|-tp|\bTP)\s*[=\s]?\s*(\d+)", args),
        "pipeline_parallel_size": pp,
        "gpu_count": count,
        # The model's weights on one GPU, which the operator's memory model knows from the spec:
        # judged for the corpus from the thread's model, quantization and TP/PP, blind to the label.
        "weights_gib_per_gpu": sample.get("weights_gib_per_gpu"),
    }
    return {**deployment, **(_pod_state(sample) if pod_state else {})}


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
