"""The `vllm-autoheal` command: one subcommand per job, each a thin shell over the pure core."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from . import __version__

Command = Callable[[argparse.Namespace], int]


def _crd(args: argparse.Namespace) -> int:
    from .crd import crd_yaml
    sys.stdout.write(crd_yaml())
    return 0


EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"


def _examples() -> dict[str, Path]:
    return {p.stem: p for p in sorted(EXAMPLES_DIR.glob("*.log"))}


def _diagnose(args: argparse.Namespace) -> int:
    from .diagnosis import Signals
    from .diagnosis.classify import classify_stream
    from .report import render_diagnosis
    signals = dict(exit_code=args.exit_code, reason=args.reason, ready_before=args.ready_before,
                   tensor_parallel_size=args.tensor_parallel_size, pipeline_parallel_size=args.pipeline_parallel_size)
    if args.example:
        examples = _examples()
        if args.example not in examples:
            print(f"no example {args.example!r}; bundled: {', '.join(examples)}", file=sys.stderr)
            return 2
        args.file = str(examples[args.example])
    try:
        if args.file in (None, "-"):
            diag = classify_stream(sys.stdin, **signals)
        else:
            with open(args.file, encoding="utf-8", errors="replace") as f:
                diag = classify_stream(f, **signals)
    except OSError as exc:
        print(f"vllm-autoheal diagnose: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    remedy = None
    if args.engine_args is not None:
        from .remedy import plan_from_command
        remedy = plan_from_command(args.engine_args, diag, gpu_memory_gib=args.gpu_memory_gib)
    if args.json:
        out = {**diag.to_dict(), "signals": {k: v for k, v in Signals(**signals).__dict__.items()
                                              if v not in (None, [], "") and k != "log"}}
        if remedy is not None:
            out["remedy"] = remedy.to_dict()
        print(json.dumps(out, indent=2))
    else:
        print(render_diagnosis(diag, remedy))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-autoheal",
        description="Keep vLLM servers alive through out-of-memory crashes: diagnose, plan, heal.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("crd", help="print the VLLMService CustomResourceDefinition (YAML)",
                       description="Print the CRD generated from the API models; identical to "
                                   "crds/vllmservices.vllm.autoheal.dev.yaml.")
    p.set_defaults(run=_crd)

    p = sub.add_parser("diagnose", help="explain why a vLLM server died, from its log",
                       description="Read a vLLM log (a file, or - for stdin) and name the cause of the crash, "
                                   "the phase, the evidence lines, the numbers vLLM printed, and what to change. "
                                   "Exits 0 whenever the input could be read, whatever the cause.")
    p.add_argument("file", nargs="?", metavar="FILE|-", help="log file; - or nothing reads stdin")
    p.add_argument("--example", metavar="NAME", help="diagnose a bundled real log instead: "
                   + ", ".join(_examples()))
    p.add_argument("--exit-code", type=int, help="the container's or process's exit code")
    p.add_argument("--reason", help="the container's termination reason (OOMKilled, Error, ...)")
    p.add_argument("--ready-before", action="store_true", default=None,
                   help="the server had answered /health before it died")
    p.add_argument("--tensor-parallel-size", type=int, help="TP of the deployment (breaks ties)")
    p.add_argument("--pipeline-parallel-size", type=int, help="PP of the deployment (breaks ties)")
    p.add_argument("--engine-args", metavar="FLAGS",
                   help='the vLLM flags it ran with, e.g. "--max-model-len 131072"; adds the planned remedy')
    p.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU, for the remedy (default: from the log)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_diagnose)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Command = args.run
    try:
        return run(args)
    except BrokenPipeError:  # `vllm-autoheal crd | head` is fine
        return 0


if __name__ == "__main__":
    sys.exit(main())
