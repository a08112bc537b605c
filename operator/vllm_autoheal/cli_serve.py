"""`vllm-autoheal serve`: its options checked into the VLLMService spec the operator would run (bounds, the
quantized fallback, vLLM's flags), refused with exit 2 naming the option, then the local supervisor."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

FALLBACK_OPTIONS = {"model": "quantized_fallback", "method": "quantized_fallback_method"}
FALLBACK_OPTIONS |= {"bits": "quantized_fallback_bits", "groupSize": "quantized_fallback_group_size"}
FALLBACK_OPTIONS |= {"weightType": "quantized_fallback_weight_type"}


def fallback_option(key: str) -> str:
    """serve's option for a quantizedFallback field (its wire name)."""
    option = FALLBACK_OPTIONS.get(key)
    return "--" + option.replace("_", "-") if option else f"--quantized-fallback ({key})"


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two --model values name one checkpoint: the same text, the same local folder however
    spelled (`/m/`, `/m`, `./m`, a link to it), or the same Hub id but for a trailing slash."""
    if a.rstrip("/") == b.rstrip("/"):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # (not both local paths: a Hub id, or a name with a NUL)
        return False


def quantized_fallback(args: argparse.Namespace) -> dict[str, object] | None:
    """spec.heal.quantizedFallback from serve's options (None where none is named): naming it is the
    consent to switch to it, as allowed: true is in a VLLMService."""
    given = {key: value for key, option in FALLBACK_OPTIONS.items() if (value := getattr(args, option)) is not None}
    if not given:
        return None
    if "model" not in given or "method" not in given:
        raise ValueError(
            "--quantized-fallback and --quantized-fallback-method go together (the checkpoint and its method)"
        )
    if same_checkpoint(str(given["model"]), args.model):  # (the planner skips a fallback that is the model)
        raise ValueError(
            "--quantized-fallback names the model being served: a fallback is another checkpoint "
            "(vLLM's online fp8 of this one is --quantization fp8)"
        )
    return {"allowed": True, **given}


def flag_before_model(tokens: list[str], args: argparse.Namespace) -> str | None:
    """The first option of serve's command line (`tokens`, after `serve`) that serve does not know and that
    comes before MODEL, if any. argparse cannot know whether such a flag takes a value, so a vLLM flag before
    MODEL (`--tokenizer org/tok meta-llama/X`) would make its value the model; serve's own options may still
    come anywhere."""
    takes_value: dict[str, bool] = args.serve_options
    at = 0
    while at < len(tokens):
        token = tokens[at]
        if token == "--" or not token.startswith("-") or token == "-":
            return None  # MODEL (or `--`, after which every token is vLLM's)
        name, joined, _ = token.partition("=")
        if name not in takes_value:
            return name
        at += 2 if takes_value[name] and not joined else 1
    return None


def run_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from .api import HealBounds, HealPolicy, VLLMServiceSpec
    from .api.heal_policy import QuantizedFallback
    from .engine import EngineArgsError, abbreviated_flag, forbidden, parse_args
    from .flag_tokens import flag_name
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
        if fallback := quantized_fallback(args):
            try:
                policy.quantized_fallback = QuantizedFallback.model_validate(fallback)
            except ValidationError as exc:
                err = exc.errors()[0]
                print(f"vllm-autoheal serve: {fallback_option(str(err['loc'][0]))}: {err['msg']}", file=sys.stderr)
                return 2
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
    # The CRD's own rules across the bounds (min <= max): pydantic checks each bound alone.
    from .crd import openapi_schema
    from .validation import cel_problems

    if problems := cel_problems(policy.wire(), openapi_schema()["properties"]["spec"]["properties"]["heal"], "heal"):
        where, _, why = problems[0].partition(": ")
        if where.startswith("heal.quantizedFallback."):  # (named as serve's option)
            where = fallback_option(where.rpartition(".")[2])
        why = why.removeprefix('Invalid value: "object": ')  # (the API server's wording, for a resource)
        print(f"vllm-autoheal serve: {where}: {why}", file=sys.stderr)
        return 2
    extra = parsed.engine.extra_args
    # An abbreviation (`--max-model 4096`) comes after the typed flags in vLLM's command line, so vLLM would
    # read it over every heal's change: each restart the same crash.
    if abbreviated := abbreviated_flag(extra):
        spelled, flag = abbreviated
        print(
            f"vllm-autoheal serve: {spelled!r} is read by vLLM as {flag.cli}: spell it {flag.cli}, the flag a heal changes",
            file=sys.stderr,
        )
        return 2
    # A flags file: vLLM reads the command line over it, so the flags serve always passes (utilization, the
    # split) would override the file's, and the planner would not see them.
    if config := next((t for t in extra if (e := forbidden(t)) is not None and e.cli == "--config"), None):
        print(
            f"vllm-autoheal serve: {config.split('=', 1)[0]!r}: a flags file hides its flags from the heal and "
            "the flags serve passes override it: give each flag on the command line",
            file=sys.stderr,
        )
        return 2
    for i, token in enumerate(extra):
        if flag_name(token) == "--served-model-name":  # (the name the --once completion asks for)
            name = token.partition("=")[2] if "=" in token else extra[i + 1] if i + 1 < len(extra) else ""
            spec.served_model_name = name or spec.served_model_name
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
