"""The labelled failure-log corpus format (tests/corpus/): one JSON object per
line with `id`, `source_url`, `label`, `log`, and what the thread says of the deployment
(`engine_args`, `gpu`, `vllm_version`, ...). Standard library only.

`context(sample)` reads the deployment facts an operator knows from a VLLMService's spec
(tensor/pipeline parallel size, GPU count) out of a sample's free-text fields, so the corpus
is classified with the same signals the operator has.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def _int(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text, re.IGNORECASE)
    return int(found.group(1)) if found else None


def context(sample: dict[str, Any]) -> dict[str, Any]:
    """Signals keyword arguments: the deployment context a sample's metadata states."""
    args, gpu = sample.get("engine_args") or "", sample.get("gpu") or ""
    names = [n.strip() for n in gpu.split("+")] if "+" in gpu else []
    count = _int(r"^(\d+)\s*x\s", gpu) or _int(r"(\d+) GPUs", gpu) or (len(names) or None)
    pp = _int(r"(?:pipeline[_-]parallel[_-]size|-pp|\bPP)\s*[=\s]?\s*(\d+)", args)
    if pp is None and re.search(r"pipeline[ _-]parallel", args, re.IGNORECASE):
        pp = 2  # the thread says pipeline parallel (or "> 1") without the size: all that is used is > 1
    return {
        "tensor_parallel_size": _int(r"(?:tensor[_-]parallel[_-]size|-tp|\bTP)\s*[=\s]?\s*(\d+)", args),
        "pipeline_parallel_size": pp,
        "gpu_count": count,
    }


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
