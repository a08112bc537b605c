"""What each `vllm-autoheal` subcommand does: a thin shell over the pure core. Each imports what it
needs when it runs, so a command loads only its own dependencies (kopf only for `operator`)."""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import EngineArgs
    from .memory import ModelShape
    from .vllm_release import Release


def run_crd(args: argparse.Namespace) -> int:
    from .crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
MANIFEST_BYTES = 3 * 2**20  # the most the API server takes in one request (etcd keeps at most ~1.5 MiB)


def bundled_examples() -> dict[str, Path]:
    return {p.stem: p for p in sorted(EXAMPLES_DIR.glob("*.log"))}


def run_diagnose(args: argparse.Namespace) -> int:
    from .diagnosis import Signals
    from .diagnosis.classify import classify_stream
    from .log_file import no_log, windows
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
        examples = bundled_examples()
        if args.example not in examples:
            print(f"no example {args.example!r}; bundled: {', '.join(examples)}", file=sys.stderr)
            return 2
        if args.file is not None:
            print(f"vllm-autoheal diagnose: --example and {args.file}: give one log, not two", file=sys.stderr)
            return 2
        args.file = str(examples[args.example])
    try:
        if args.file in (None, "-"):
            if sys.stdin is None:  # (`<&-`)
                print("vllm-autoheal diagnose: no standard input to read the log from", file=sys.stderr)
                return 2
            why = no_log(sys.stdin, "standard input")
            if why:
                print(f"vllm-autoheal diagnose: {why}", file=sys.stderr)
                return 2
            # (read as a FILE is: one byte that is not UTF-8 must not lose the whole log)
            raw = getattr(sys.stdin, "buffer", None)
            stream = (
                io.TextIOWrapper(windows(raw, utf8=True), encoding="utf-8", errors="replace")
                if raw is not None
                else sys.stdin
            )
            diag = classify_stream(stream, **signals)
        else:
            with open(args.file, "rb") as f:
                why = no_log(f, args.file)
                if why:
                    print(f"vllm-autoheal diagnose: {why}", file=sys.stderr)
                    return 2
                opening = f.peek(4)[:4]
                encoding = "utf-16" if opening[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8"  # (a BOM: PowerShell's >)
                read = windows(f, utf8=encoding == "utf-8")
                diag = classify_stream(io.TextIOWrapper(read, encoding=encoding, errors="replace"), **signals)
    except OSError as exc:
        print(f"vllm-autoheal diagnose: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    remedy = None
    if args.engine_args is not None:
        from pydantic import ValidationError

        from .remedy import plan_from_command

        try:
            remedy = plan_from_command(args.engine_args, diag, gpu_memory_gib=args.gpu_memory_gib)
        except ValidationError as exc:  # (a model name the CRD would refuse)
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            print(f"vllm-autoheal diagnose: --engine-args: {where}: {first['msg']}", file=sys.stderr)
            return 2
        except ValueError as exc:  # a flag vLLM would reject, an unclosed quote
            print(f"vllm-autoheal diagnose: --engine-args: {exc}", file=sys.stderr)
            return 2
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
    from .model_files import from_path
    from .model_source import resolve_local

    if args.model_config:
        return to_shape(from_path(args.model_config)), args.model_config
    fields, source = resolve_local(args.model, args.revision, token=os.environ.get("HF_TOKEN") or None)
    return to_shape(fields), source


def run_plan(args: argparse.Namespace) -> int:
    from .api import DEFAULT_IMAGE, VLLMServiceSpec
    from .engine import EngineArgsError, abbreviated_flag, parse_args
    from .gpu_catalog import lookup
    from .lora_slots import lora_problem
    from .model_config import ModelConfigError
    from .plan_options import longer_than_the_model, options, render_bars, render_options
    from .preflight import draft_problem, preflight, unsplittable
    from .report import render_plan
    from .vllm_release import describe

    try:
        shape, source = _plan_shape(args)
    except ModelConfigError as exc:
        print(f"vllm-autoheal plan: {exc}", file=sys.stderr)
        return 2
    try:
        gpu = lookup(args.gpu if args.gpu is not None else "custom", args.gpu_memory_gib)
        engine = parse_args(args.flags).engine
    except (KeyError, EngineArgsError) as exc:
        print(f"vllm-autoheal plan: {exc.args[0]}", file=sys.stderr)
        return 2
    # (an abbreviation vLLM reads as a flag plan sizes from, `--gpu-memory-util 0.5`: plan would size from the
    # default and say the flags name none)
    abbreviated = abbreviated_flag(engine.extra_args)
    if abbreviated:
        spelled, flag = abbreviated
        print(f"vllm-autoheal plan: {spelled!r} is read by vLLM as {flag.cli}: spell it {flag.cli}", file=sys.stderr)
        return 2
    refused = unsplittable(shape, engine.tensor_parallel_size) or lora_problem(engine) or draft_problem(engine)
    if refused:  # (vLLM refuses it at start)
        print(f"vllm-autoheal plan: {refused}", file=sys.stderr)
        return 2
    refused = longer_than_the_model(shape, engine, os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"))
    if refused:
        print(f"vllm-autoheal plan: {refused}", file=sys.stderr)
        return 2
    if args.gpu_free_gib is not None and args.gpu_free_gib > gpu.memory_gib:
        print(
            f"vllm-autoheal plan: --gpu-free-gib {args.gpu_free_gib:g} is more than the GPU's {gpu.memory_gib:g} GiB",
            file=sys.stderr,
        )
        return 2
    version = getattr(args, "vllm_version", None)
    image = f"vllm/vllm-openai:v{version}" if version else DEFAULT_IMAGE
    spec = VLLMServiceSpec(model=source[:512], engine=engine, preflight="Fix" if args.fix else "Warn", image=image)
    release = spec.release()
    vllm = describe(release, "--vllm-version" if version else f"the default image {DEFAULT_IMAGE}")
    result = preflight(spec, gpu, shape, args.gpu_free_gib, entrypoint=args.entrypoint)
    first = preflight(
        spec.model_copy(update={"preflight": "Warn"}), gpu, shape, args.gpu_free_gib, entrypoint=args.entrypoint
    )
    opts = options(shape, engine, gpu, args.gpu_free_gib, args.entrypoint, args.quantized_variant, release)
    if args.json:
        out = {
            **first.estimate.to_dict(),
            "fits": first.fits,
            "reasons": first.reasons,
            "gpu": {"name": gpu.name, "memory_gib": gpu.memory_gib, "source": gpu.source},
            "model": {"architecture": shape.architecture, "params": shape.params(), "source": source},
            "vllm": {"release": str(release) if release else None, "figures": vllm, "share": _share(engine, release)},
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
        print(render_plan(shape, gpu, first, result, vllm, _share(engine, release)))
        print()
        print(render_bars(first.estimate, engine.tensor_parallel_size * engine.pipeline_parallel_size))
        print()
        print(f"options on {gpu.name} at max_model_len {first.estimate.max_model_len:,} (the other flags as given):")
        print(render_options(opts, first.estimate.max_model_len))
    return 0 if first.fits else 1


def _share(engine: EngineArgs, release: Release | None) -> str:
    """The utilization plan sized the budget at, and, where the command line names none, that a plain
    `vllm serve` of the release would take its own default (0.92 from 0.20.0): the operator and `serve`
    always pass the flag, 0.9 unless set."""
    from .vllm_release import default_utilization

    util = engine.gpu_memory_utilization
    if "gpu_memory_utilization" in engine.model_fields_set:
        return f"utilization {util:g}"
    own = default_utilization(release)
    plain = f"; a plain `vllm serve` of {release} takes {own:g}" if own is not None and own != util else ""
    return f"utilization {util:g}, the operator's and serve's default{plain}"


def run_render(args: argparse.Namespace) -> int:
    import yaml
    from pydantic import ValidationError

    from .api import VLLMService
    from .kube.resources import DEFAULT_OPERATOR_IMAGE, render
    from .validation import admit
    from .validation import manifests as documents

    try:
        with open(args.file, "rb") as f:
            data = f.read(MANIFEST_BYTES + 1)
        if len(data) > MANIFEST_BYTES:
            print(
                f"vllm-autoheal render: {args.file} is larger than the {MANIFEST_BYTES // 2**20} MiB "
                "the API server takes in one request",
                file=sys.stderr,
            )
            return 2
        docs = [d for d in documents(data.decode("utf-8")) if d]
    except OSError as exc:
        print(f"vllm-autoheal render: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:
        print(f"vllm-autoheal render: {args.file} is not UTF-8 (byte {exc.start})", file=sys.stderr)
        return 2
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # (nesting past the parser's depth; an int
        # of more digits than Python reads)
        said = str(exc)[:500] if not isinstance(exc, RecursionError) else "nested too deeply"
        print(f"vllm-autoheal render: {args.file} is not valid YAML:\n{said}", file=sys.stderr)
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


def run_operator(args: argparse.Namespace) -> int:
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
        **peering_options(args),
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        memo=kopf.Memo(config=config),
    )
    return 0


def peering_options(args: argparse.Namespace) -> dict[str, Any]:
    """kopf's scope and peering for these arguments. kopf's peering is no leader election: a replica
    that sees a live peer of its own priority pauses, itself included, so replicas of one Deployment
    (one set of arguments) each draw their own priority; the highest live one is active."""
    priority = args.priority
    if priority is None and args.peering:
        priority = secrets.randbelow(2**31 - 2) + 1
    return {
        "clusterwide": not args.namespace,
        "namespaces": args.namespace or (),
        "standalone": not args.peering,
        "peering_name": args.peering or None,
        "priority": priority,
    }
