"""The `vllm-autoheal` command: one subcommand per job, each a thin shell over the pure core."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from . import __version__

Command = Callable[[argparse.Namespace], int]


def _crd(args: argparse.Namespace) -> int:
    from .crd import crd_yaml
    sys.stdout.write(crd_yaml())
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
