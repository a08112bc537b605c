"""How many engine ranks vLLM starts on this machine, as its flags say: tensor x pipeline x prefill-context
parallel ranks for each local data-parallel engine (each holds its own GPU and its own host memory). Pure."""

from __future__ import annotations

from .api import EngineArgs
from .flag_tokens import flag_name, spelled_by

_DP_LOCAL = ("--data-parallel-size-local", "--data_parallel_size_local", "-dpl")
_DP = ("--data-parallel-size", "--data_parallel_size", "-dp")
_PCP = ("--prefill-context-parallel-size", "-pcp")
# An external load balancer's rank: vLLM runs one engine here whatever the size (arg_utils create_engine_config:
# data_parallel_size_local = 1; it refuses another local size beside it)
_DP_EXTERNAL = (
    "--data-parallel-rank",
    "--data_parallel_rank",
    "-dpn",
    "--data-parallel-external-lb",
    "--data_parallel_external_lb",
    "-dpe",
)
# Several nodes: vLLM infers the local size from the node count (local_world_size // TP x PP), not said plainly
_NODES = ("--nnodes", "-n")


def data_parallel_here(extra_args: list[str]) -> int | None:
    """The data-parallel ranks vLLM starts on this machine (each takes its own TP x PP GPUs): one under an external
    load balancer's rank, else the local size where given, else the size, else 1; None where the flags do not say
    plainly (a value that is no count, an abbreviation argparse would have to resolve, several nodes)."""
    given: dict[str, str] = {}
    external = nodes = False
    for i, token in enumerate(extra_args):
        name, eq, value = token.partition("=")
        for key, names in (("local", _DP_LOCAL), ("size", _DP)):
            if name in names:
                given[key] = value if eq else _next(extra_args, i)
        external = external or name in _DP_EXTERNAL
        nodes = nodes or name in _NODES
        if name.startswith(("--data-parallel-s", "--data_parallel_s")) and name not in _DP_LOCAL + _DP:
            if not name.startswith(("--data-parallel-start", "--data_parallel_start")):
                return None
    if external:
        return 1
    if nodes and "local" not in given:
        return None
    return _count(given.get("local", given.get("size", "1")))


def prefill_context_ranks(extra_args: list[str]) -> int | None:
    """vLLM's prefill context parallelism (its world is TP x PP x PCP): the size given, else 1; None where the
    flags do not say plainly (an abbreviation, in any spelling the CRD refuses as it: flag_tokens.spelled_by)."""
    text = "1"
    for i, token in enumerate(extra_args):
        if not any(spelled_by(token, spelling) for spelling in _PCP):
            continue
        if flag_name(token) not in _PCP:
            return None
        text = token.partition("=")[2] if "=" in token else _next(extra_args, i)
    return _count(text)


def _next(extra_args: list[str], i: int) -> str:
    """The value after the flag at i (none: empty, which is no count)."""
    return extra_args[i + 1] if i + 1 < len(extra_args) else ""


def _count(text: str) -> int | None:
    """A count of ranks as a flag's value gives it plainly (ASCII digits, 1 to 64), else None."""
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) <= 64 else None


def ranks_here(engine: EngineArgs, tensor_parallel_size: int | None = None) -> int | None:
    """Every rank vLLM starts here with these flags (ParallelConfig.world_size for each local data-parallel
    engine), at `tensor_parallel_size` where given (a TP heal being sized); None where the flags do not say
    plainly."""
    ranks, pcp = data_parallel_here(engine.extra_args or []), prefill_context_ranks(engine.extra_args or [])
    if ranks is None or pcp is None:
        return None
    tp = tensor_parallel_size or engine.tensor_parallel_size
    return tp * engine.pipeline_parallel_size * pcp * ranks
