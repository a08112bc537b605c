"""What vLLM's flags and per-GPU defaults decide for the memory model, read off a command line:
its batch defaults (arg_utils get_batch_defaults), where a multimodal model's vision encoder goes,
whether the Mamba state pool is the one a config's pages make, how many state pages a request
holds, and whether CUDA graphs are captured. Pure: no I/O."""

from __future__ import annotations

import json
from typing import Any

from .flag_tokens import flag_name, flag_value, spelled_by, switched


def _large(tier: str, gpu_total_gib: float, gpu_name: str) -> bool:
    """Whether a batch-default tier (vllm_release.py's RELEASES) gives this GPU the large defaults."""
    if tier == "160gib" and gpu_total_gib >= 160:  # 0.28 on
        return True
    return gpu_total_gib >= 70 and "a100" not in gpu_name.lower()  # 0.9.0 on (PR #17885)


def default_max_num_batched_tokens(
    gpu_total_gib: float, entrypoint: str = "server", gpu_name: str = "", tier: str = "160gib"
) -> int:
    """vLLM's per-GPU defaults (arg_utils get_batch_defaults; `tier`: the release's, vllm_release.py;
    the default is 0.28-0.34's): the OpenAI server and the LLM class differ, and from 0.9.0 an A100 of
    80 GB gets the small GPUs' (as default_max_num_seqs)."""
    large = _large(tier, gpu_total_gib, gpu_name)
    if entrypoint == "llm":
        return 16384 if large else 8192
    return 16384 if tier == "160gib" and gpu_total_gib >= 160 else 8192 if large else 2048


def default_max_num_seqs(
    gpu_total_gib: float, gpu_name: str = "", extra_args: list[str] | None = None, tier: str = "160gib"
) -> int:
    """vLLM's default (arg_utils get_batch_defaults): 1024 from 70 GiB but on an A100 ("a100" not in
    device_name, PR #17885), else 256; twice that under
    --performance-mode throughput."""
    seqs = 1024 if _large(tier, gpu_total_gib, gpu_name) else 256
    return 2 * seqs if flag_value(extra_args or [], "--performance-mode") == "throughput" else seqs


# Architectures vLLM runs as generative models by default (config _get_default_runner_type): others may
# be pooling models, for which 0.26 turns async scheduling off.
GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def steps_in_flight(window: str | None, extra_args: list[str], pp: int = 1, architecture: str = "") -> int:
    """Scheduler steps whose tokens a sliding window's layer holds beside the window, as the release's KV
    check counts them (vllm_release.py's `window`): one before 0.26; from 0.26 max_concurrent_batches
    (config/vllm.py): 2 with async scheduling (its default) at PP 1, else the PP stages (the V2 runner's
    one more under async scheduling is not counted: not every model runs on it). Where the flags may
    turn async scheduling off (a speculative method or executor that lacks it), or the model may be a
    pooling one (`architecture` named and not a generative one), the fewer."""
    if window != "in-flight":
        return 1
    if pp > 1:
        return pp
    asked = switched(extra_args, "--async-scheduling")
    if asked is not None:
        return 2 if asked else 1
    unsure = ("--speculative-config", "--distributed-executor-backend", "--runner", "--convert")
    if architecture and not architecture.endswith(GENERATIVE_SUFFIXES):
        return 1
    return 1 if any(spelled_by(t, f) for t in extra_args for f in unsure) else 2


# extraArgs with which vLLM's state-block check is off (no full CUDA graphs: -O0, a cudagraph_mode) or
# its pool is not the one the config's page makes (another state dtype or block, a draft model's
# layers and state rows, prefix caching's chunk-aligned block, a fixed block count): the blocks are
# not foreseen, and vLLM's own refusal, if any, is healed by its figures.
POOL_FLAGS = (
    "--compilation-config",
    "-cc",
    "--optimization-level",
    "-O",
    "--mamba-cache-dtype",
    "--mamba-ssm-cache-dtype",
    "--block-size",
    "--speculative-config",
    "--enable-prefix-caching",
    "--mamba-cache-mode",
    "--mamba-block-size",
    "--num-gpu-blocks-override",
    "--kv-cache-dtype-skip-layers",
)


def pool_foreseen(extra_args: list[str]) -> bool:
    return not any(spelled_by(token, flag) for token in extra_args for flag in POOL_FLAGS)


# The modalities a vision tower serves (Qwen-VL, LLaVA-OneVision: image and video; LLaVA: image alone).
VISION_MODALITIES = ("image", "video")


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # (a deeply nested value is no config vLLM would take either)
        return value


def _names(name: str, spellings: tuple[str, ...]) -> bool:
    """Whether a flag's name is one of these spellings: a long one as argparse abbreviates it, a short
    one (`-cc`) exactly."""
    return any(spelled_by(name, s) if s.startswith("--") else name == s for s in spellings)


def config_flag(extra_args: list[str], *spellings: str) -> dict[str, Any]:
    """The object a JSON-valued flag gives vLLM: the last whole value of any of its spellings
    (`--flag '{"key": 1}'`), unless keys are given in vLLM's dotted spelling (`--flag.key 1`,
    `--flag.key=NONE`): its parser (FlexibleArgumentParser.parse_args) gathers those into one object it
    passes after everything else, one per spelling as written in the order each first appears, which
    replaces any whole value (argparse keeps the last). A value that is no JSON stays a string."""
    whole: dict[str, Any] = {}
    dotted: dict[str, dict[str, Any]] = {}
    for i, token in enumerate(extra_args):
        head, dot, key = (flag_name(token) or "").partition(".")
        if not head or not _names(head, spellings):
            continue
        value = token.partition("=")[2] if "=" in token else extra_args[i + 1] if i + 1 < len(extra_args) else ""
        if dot:
            dotted.setdefault(head, {})[key] = _json_or_text(value)
        else:
            parsed = _json_or_text(value)
            whole = parsed if isinstance(parsed, dict) else {}
    return list(dotted.values())[-1] if dotted else whole


def _limit_is_zero(value: Any) -> bool:
    count = value.get("count") if isinstance(value, dict) else value
    return isinstance(count, int) and not isinstance(count, bool) and count == 0


def encoder_placement(extra_args: list[str]) -> str:
    """Where vLLM puts a multimodal model's vision encoder under these flags: "off" where every
    modality a tower may serve is limited to 0 (--language-model-only, or --limit-mm-per-prompt's
    image and video: vLLM builds the tower on the meta device, interfaces.py _mark_tower_model); "data"
    under --mm-encoder-tp-mode data (the full weights on each TP rank); else "weights", split over TP.
    A limit on the image alone keeps the count (a tower serving video too is still built)."""
    if switched(extra_args, "--language-model-only"):
        return "off"
    limits = config_flag(extra_args, "--limit-mm-per-prompt")
    if all(_limit_is_zero(limits.get(m)) for m in VISION_MODALITIES):
        return "off"
    return "data" if (flag_value(extra_args, "--mm-encoder-tp-mode") or "").strip() == "data" else "weights"


def state_pages(extra_args: list[str]) -> int:
    """The state pages one request holds in each Mamba layer, at least, as vLLM's check counts them
    (MambaSpec.max_memory_usage_bytes): one; two and more in mamba_cache_mode align, which prefix
    caching turns on for a hybrid where the mode is not named (MambaModelConfig: 2 + speculative
    blocks + prefill checkpoint blocks - Mamba-2's one more is not counted, so a need stays a floor)."""
    mode = (flag_value(extra_args, "--mamba-cache-mode") or "none").strip()
    caching = switched(extra_args, "--enable-prefix-caching") is True
    return 2 if caching and mode in ("none", "align") else 1


def optimization_level(extra_args: list[str]) -> str | None:
    """The level `-O<n>`, `-O=<n>`, `-O <n>` or `--optimization-level <n>` names (vLLM turns each -O
    spelling into --optimization-level; the last wins), or None."""
    level = None
    for i, token in enumerate(extra_args):
        if token.startswith("-O") and not token.startswith("-O.") and token != "-O":
            level = token[3:] if token[2:3] == "=" else token[2:]
        elif token == "-O" and i + 1 < len(extra_args) and extra_args[i + 1] in ("0", "1", "2", "3"):
            level = extra_args[i + 1]
        elif spelled_by(token, "--optimization-level"):
            level = flag_value([token, *extra_args[i + 1 : i + 2]], "--optimization-level")
    return level.strip() if level is not None else None


def captures_graphs(enforce_eager: bool | None, extra_args: list[str]) -> bool:
    """Whether vLLM captures CUDA graphs under these flags: not under --enforce-eager, nor where the
    compilation config's cudagraph_mode is NONE (`--compilation-config`/`-cc '{"cudagraph_mode": "NONE"}'`,
    its dotted spelling, the enum's value 0), nor at optimization level 0 where it names no mode
    (config/vllm.py OPTIMIZATION_LEVEL_00); the worker's graph estimate skips them too (gpu_worker
    determine_available_memory: only when cudagraph_mode != NONE)."""
    if enforce_eager:
        return False
    # (-O named the compilation config before the optimization levels: a whole object there is one)
    config = config_flag(extra_args, "--compilation-config", "-cc", "-O")
    level = optimization_level(extra_args)
    # (each level's default mode: config/vllm.py OPTIMIZATION_LEVEL_0N; 2, the default, and 3 both kinds)
    default = {"0": "NONE", "1": "PIECEWISE"}.get(level or "", "FULL_AND_PIECEWISE")
    mode = _enum_name(config.get("cudagraph_mode", default), ("NONE", "PIECEWISE", "FULL"))
    # (piecewise graphs need vLLM's own compilation, the default above level 0: without it vLLM
    # falls back to none, config/vllm.py _normalize_piecewise_cudagraph_mode)
    compiled = _enum_name(config.get("mode", 0 if level == "0" else 3), COMPILATION_MODES)
    return mode != "NONE" and not (mode == "PIECEWISE" and compiled != "VLLM_COMPILE")


COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")


def _enum_name(value: Any, names: tuple[str, ...]) -> str:
    """An enum setting of vLLM's config by its name (any case) or its value (`names` in value order)."""
    if isinstance(value, bool):
        return ""
    if isinstance(value, int):
        return names[value] if 0 <= value < len(names) else ""
    return str(value).strip().upper()


def speculative_method(extra_args: list[str]) -> str | None:
    """The speculative decoding method the flags name (`--speculative-config`/`-sc` '{"method": ...}',
    its dotted spelling, `--spec-method`); "" where they ask for a draft without naming its method;
    None where they ask for none."""
    config = config_flag(extra_args, "--speculative-config", "-sc")
    method = flag_value(extra_args, "--spec-method") or config.get("method")
    if method is not None:
        return str(method).strip().lower()
    asked = config or any(_names(flag_name(t) or "", ("--speculative-config", "-sc")) for t in extra_args)
    return "" if asked else None
