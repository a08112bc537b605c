"""Which process wrote a line, where vLLM's process prefixes say: the API server's raw lines are
no GPU memory failure of the engine's. Standard library only.

Since vLLM prefixes each process's output with its name (`(APIServer pid=1)`, `(EngineCore_DP0
pid=2)`, `(VllmWorker TP0 pid=3)`; Ray nests the actor's after the driver's), a log shows where the
engine runs. Where it runs in a process of its own, the API server holds no model: a GPU
out-of-memory error, NCCL's, or vLLM's KV-cache and free-memory checks are raised in the engine's
processes and printed there (the API server re-raises them only as wrappers). A raw line of the
API server's (no logger header) saying one is the text of a request's report printed by its web
framework, whose opening the operator's window may have cut: a client's words. Its not-memory
lines (a bad flag, a busy port) stay the server's own. vLLM's KV-cache and free-memory checks run
in the engine core: they count as apart only where the log names an engine core's process.
"""

from __future__ import annotations

import re

from . import messages as msg
from .collector import PROCESS_WITH_PID
from .findings import Finding
from .scan import Line

_WRITER = re.compile(PROCESS_WITH_PID)
_NAME = re.compile(r"\(([\w.:-]{1,60})")
_API_SERVER = re.compile(r"api_?server(?:_\d{1,4})?", re.IGNORECASE)
_ENGINE_CORE = re.compile(r"enginecore", re.IGNORECASE)
GPU_MEMORY_KINDS = (msg.OOM, msg.NCCL_OOM, msg.MEMORY)


def writer(line: Line) -> str:
    """The name of the innermost process prefix before the line's text ('EngineCore_DP0'), or ''."""
    opening = line.header or line.raw[: max(0, line.raw.find(line.text[:40]))]
    found = _WRITER.findall(opening[:400])
    name = _NAME.match(found[-1]) if found else None
    return name.group(1) if name else ""


def engine_apart(lines: list[Line]) -> frozenset[str]:
    """Which of the engine's parts run apart from the API server, by the writers the log names:
    `model` (a worker or engine core: where GPU memory is allocated) and `core` (the engine core,
    where vLLM's KV-cache checks run; with it in the API server's process, only workers apart,
    those checks are raised there)."""
    parts: set[str] = set()
    for ln in lines:
        name = writer(ln)
        if name and not _API_SERVER.fullmatch(name):
            parts.add("model")
            if _ENGINE_CORE.search(name):
                parts.add("core")
                break
    return frozenset(parts)


def api_servers_raw_memory_error(f: Finding, apart: frozenset[str]) -> bool:
    """A GPU memory failure on a raw line of the API server's, where the part that raises it runs apart."""
    line = f.line
    part = "core" if f.message.kind == msg.MEMORY else "model"
    return (
        part in apart
        and f.message.kind in GPU_MEMORY_KINDS
        and line.source_file is None
        and not line.learned_header
        and bool(_API_SERVER.fullmatch(writer(line)))
    )
