"""Which process wrote a line, where vLLM's process prefixes say: the API server's lines are no GPU
memory failure of the engine's. Standard library only.

vLLM prefixes every line each of its processes writes with the process's name (`(APIServer
pid=1)`, `(EngineCore_DP0 pid=2)`, `(VllmWorker TP0 pid=3)`), a web framework's report and the
newlines of a client's text in it included; Ray forwards an actor's output through the process
that started Ray, which prefixes it again (`(APIServer pid=1) (DPEngineCoreActor pid=2)`). So a
log shows where the engine runs. Where it runs apart, the API server holds no model: GPU
out-of-memory errors (torch's, NCCL's) are raised in the engine's processes and vLLM's KV-cache
and free-memory checks in its engine core, and printed there; the API server gets only wrappers
(EngineDeadError). A line of the API server's that says one is the text of a request's report,
whose opening the operator's window may have cut, or a client's line under a header it wrote
itself (vLLM's header, or an engine process's prefix, which the API server's own prefix then
precedes where the engine writes directly): a client's words. The API server's not-memory errors
(a bad flag, a busy port) stay its own. The KV-cache checks count as apart only where the log
names an engine core's process (it can run in the API server's, VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import messages as msg
from .collector import PROCESS_WITH_PID
from .findings import Finding
from .scan import Line

_WRITER = re.compile(PROCESS_WITH_PID)
_NAME = re.compile(r"\(([\w.:-]{1,60})")
_API_SERVER = re.compile(r"api_?server(?:_\d{1,4})?", re.IGNORECASE)
_ENGINE_CORE = re.compile(r"enginecore", re.IGNORECASE)
GPU_MEMORY_KINDS = (msg.OOM, msg.NCCL_OOM, msg.MEMORY)
OPENING_CHARS = 400  # prefixes, timestamps and a logger header fit in this


def writers(line: Line) -> list[str]:
    """The names of the process prefixes before the line's text, outermost first."""
    opening = line.header or line.raw[: max(0, line.raw.find(line.text[:40]))]
    found = (_NAME.match(p) for p in _WRITER.findall(opening[:OPENING_CHARS]))
    return [name.group(1) for name in found if name]


def writer(line: Line) -> str:
    """The innermost writer ('EngineCore_DP0'; under Ray the actor's), or ''."""
    names = writers(line)
    return names[-1] if names else ""


def _api_server(name: str) -> bool:
    return bool(_API_SERVER.fullmatch(name))


@dataclass(frozen=True)
class Apart:
    """Which of the engine's parts run apart from the API server, by the writers the log names."""

    model: bool = False  # a worker or an engine core: where GPU memory is allocated
    core: bool = False  # the engine core: where vLLM's KV-cache checks run
    direct: bool = False  # an engine process writes to the log itself, not through the API server (Ray)


def engine_apart(lines: list[Line]) -> Apart:
    model = core = direct = False
    for ln in lines:
        names = writers(ln)
        engines = [n for n in names if not _api_server(n)]
        if not engines:
            continue
        model = True
        core = core or any(_ENGINE_CORE.search(n) for n in engines)
        direct = direct or not _api_server(names[0])
        if core and direct:
            break
    return Apart(model, core, direct)


def api_servers_memory_error(f: Finding, apart: Apart) -> bool:
    """A GPU memory failure the API server wrote, where the part that raises it runs apart."""
    if f.message.kind not in GPU_MEMORY_KINDS or not (apart.core if f.message.kind == msg.MEMORY else apart.model):
        return False
    names = writers(f.line)
    if not names or not _api_server(names[0]):
        return False
    # a further prefix is Ray forwarding an actor's output, unless the engine writes directly
    return len(names) == 1 or apart.direct or all(_api_server(n) for n in names)
