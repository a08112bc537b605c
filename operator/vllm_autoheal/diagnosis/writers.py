"""Which process wrote a line, where vLLM's process prefixes say: the API server's lines are no GPU
memory failure of the engine's. Standard library only.

vLLM prefixes the lines its OpenAI server writes with the process's name (`(APIServer pid=1)`;
`ApiServer_N` with several, `ExternalLBRankN` / `DPServer-rankN` under an external load balancer),
in some versions uvicorn's reports and the newlines of a client's text in them included. By version
(read from vLLM's sources): up to 0.4.1 no prefixes; 0.4.2 to 0.10.0 wrap the output streams of
multiprocessing workers, data-parallel engine cores and extra API servers only, not the single API
server's; 0.10.1 to 0.30 wrap every process's streams (`decorate_logs`), so uvicorn's reports and raw
tracebacks carry the API server's prefix (seen on 0.25 on the H200); from 0.31 (vLLM PR #57957) the
name is a field of vLLM's own log records, printed by vLLM's formatter only, so uvicorn's lines are
bare (seen on 0.32 on the CPU). This rule reaches a client's raw lines in 0.10.1 to 0.30; elsewhere
they name no writer and the older limits stand. That server always
runs the engine core in processes of its own (AsyncLLM refuses an in-process core), so it holds no
model: GPU out-of-memory errors (torch's, NCCL's) are raised in the engine's processes and vLLM's
KV-cache and free-memory checks in its engine core, and printed there; the API server gets only
wrappers (EngineDeadError). A line of the API server's that says one is the text of a request's
report, whose opening the operator's window may have cut, or a client's line under a header it
wrote itself: a client's words. The API server's not-memory errors (a bad flag, a busy port) stay
its own.

vLLM never nests its own prefixes; Ray does, printing an actor's output in the process that
started it (`(APIServer pid=1) (DPEngineCoreActor pid=2)`, the Ray DP backend), but a client can
write the same inner prefix, byte for byte. Those lines are set aside too: under Ray DP a real GPU
memory failure is then missed (no change), never a client's text made the cause. The writer is the
outermost prefix. (vLLM 0.10's V0 engine run in the API server's own process,
--disable-frontend-multiprocessing, is missed the same way: a known limit.)
"""

from __future__ import annotations

import re

from . import log_records
from . import messages as msg
from .collector import PROCESS_WITH_PID
from .findings import INFERENCE_REQUEST, Finding
from .origin import ACCESS, FORGED, REQUEST, USER
from .scan import Line

_WRITER = re.compile(PROCESS_WITH_PID)
_NAME = re.compile(r"\(([\w.:-]{1,60})")
_API_SERVER = re.compile(r"api_?server(?:_\d{1,4})?|externallbrank\d{1,4}|dpserver-rank\d{1,4}", re.IGNORECASE)
GPU_MEMORY_KINDS = (msg.OOM, msg.NCCL_OOM, msg.MEMORY, msg.BUDGET)
# The figures the API server prints itself (its banner's release, its non-default args); any other figure is
# of the engine's GPU memory (its budget, weights, KV cache, concurrency), which the API server never holds.
_SERVERS_FIGURES = frozenset({"vllm_minor", "vllm_patch", "tp", "pp"})
# The kernel's OOM kill is reported by the kernel, kubectl, systemd or Slurm, never by vLLM's API server.
_NOT_THE_SERVERS = frozenset({"kernel_oom_killer"})
OPENING_CHARS = 400  # prefixes, timestamps and a logger header fit in this


def writers(line: Line) -> list[str]:
    """The names of the process prefixes before the line's text, outermost first."""
    opening = line.header or line.raw[: max(0, line.raw.find(line.text[:40]))]
    found = (_NAME.match(p) for p in _WRITER.findall(opening[:OPENING_CHARS]))
    return [name.group(1) for name in found if name]


def _api_server(name: str) -> bool:
    return bool(_API_SERVER.fullmatch(name))


def _engines_words_of(message: msg.Message) -> bool:
    if message.kind == msg.FIGURE:
        return any(name not in _SERVERS_FIGURES for name in message.regex.groupindex)
    return message.kind in GPU_MEMORY_KINDS or message.subtype in _NOT_THE_SERVERS


_ENGINES_WORDS = {id(m): _engines_words_of(m) for m in msg.MESSAGES}  # (asked once a finding)


def _engines_words(f: Finding) -> bool:
    """A finding only the engine (or the kernel) can write: a GPU memory failure, the KV budget, a GPU memory figure."""
    known = _ENGINES_WORDS.get(id(f.message))
    return _engines_words_of(f.message) if known is None else known


def api_servers_memory_error(f: Finding) -> bool:
    """A GPU memory failure (or another of the engine's memory words: its KV budget, its memory figures; or the
    kernel's report of an OOM kill) on a line the API server wrote (its prefix outermost): a request's text."""
    if not _engines_words(f):
        return False
    names = writers(f.line)
    return bool(names) and _api_server(names[0])


def clients_lines(found: list[Finding], releases: set[tuple[int, int]]) -> set[int]:
    """The lines (by id) a finding of which is a client's words: api_servers_memory_error, or
    requests_memory_words. (Each line's writers are read once: a line dense with the engine's figure
    wordings is 8+ findings.)"""
    out: set[int] = set()
    last: Line | None = None
    server: bool | None = None  # the API server's prefix is the line's outermost (None: not read yet)
    reports = False  # the line is in a request's report (requests_memory_words' first test)
    settled = False  # the line is a client's, or none of its findings can make it one
    for f in found:
        if f.line is not last:  # (a line's findings come together)
            last, server, settled = f.line, None, False
            reports = (last.request_report and not last.grammar_report) or last.origin == REQUEST
        if settled:
            continue
        if _engines_words(f):
            if server is None:
                names = writers(last)
                server = bool(names) and _api_server(names[0])
            if server:
                out.add(id(last))
                settled = True
                continue
        if reports and requests_memory_words(f, releases):
            out.add(id(last))
            settled = True
        settled = settled or (server is False and not reports)
    return out


# From 0.11 vLLM has no V0 engine: its engine core always runs apart from the API server, and its death
# reaches a request only as EngineDeadError, whose words are fixed (v1/engine/exceptions.py).
NO_ENGINE_IN_THE_SERVER = (11, 0)


def requests_memory_words(f: Finding, releases: set[tuple[int, int]]) -> bool:
    """The engine's memory words (as _engines_words) in a request's report (a traceback through the web
    framework or an API handler, whoever wrote it; not the engine's report on compiling a request's
    grammar): a client's text where they cannot be the engine's.
    The kernel's OOM-kill report never is (the kernel writes into no exception's message); any is where
    the log names a release that runs no engine inside the API server (`releases`: the (minor, patch)
    the engine's own lines name). Before 0.11 V0 raised the engine's own error into each request. (One run
    names one release: an older second one is a client's bare line, which must not make its words the
    engine's again; a forged newer one at worst hides a V0 engine's error in a request's report: no change.)"""
    # (the engine's own report on a request's grammar is the engine's process: its OOM is the engine's)
    if not ((f.line.request_report and not f.line.grammar_report) or f.line.origin == REQUEST):
        return False
    if f.message.subtype in _NOT_THE_SERVERS:
        return True
    # (the host's too: a worker's kill or a failed allocation reaches a request only as EngineDeadError,
    # and the API server's own host allocation failing for one request is no crash: a kill says OOMKilled)
    memory = _engines_words(f) or f.message.kind in (msg.HOST, msg.KILLED)
    return memory and bool(releases) and max(releases) >= NO_ENGINE_IN_THE_SERVER


def vllms_own(line: Line) -> bool:
    """vLLM wrote the line: vLLM's logger header names the file that logged it (or a header the log
    taught names a vLLM logger: log_format.py), or vLLM's API server's prefix is its outermost. A
    frontend, router or proxy started next to vLLM writes its own format (Rust's tracing, Go's klog
    or zap, KServe's trace logger; a JSON record of a logger not vLLM's), or uvicorn's bare one, which vLLM's own server prints bare too
    up to vLLM 0.10.0 and from 0.31: such a line is no more vLLM's than that program's."""
    if line.source_file and line.source_file != FORGED and not log_records.foreign(line.header):
        return True
    names = writers(line)
    return bool(names) and _api_server(names[0])


def served_before(lines: list[Line], failure: Line) -> bool:
    """vLLM's API server took an inference request before the failure: its request logger's line or
    its access line was logged (only their presence counts, never their text). vLLM's server listens
    only once the engine has started; a frontend in the same stream answers (503, queued, routed) while
    the engine still starts, so only vLLM's own lines count. Sleep-mode and admin endpoints (/wake_up,
    /sleep, /health) do not count: they are answered around start-up too."""
    return any(
        (ln.origin == USER or (ln.origin == ACCESS and INFERENCE_REQUEST.search(ln.text[:200]))) and vllms_own(ln)
        for ln in lines
        if ln.offset < failure.offset
    )
