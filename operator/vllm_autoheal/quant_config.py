"""What a checkpoint's quantization_config says the memory model needs, as bounded, untrusted input: the
method, the bits a weight, the group a scale serves, whether the weights are a float format, and block-wise
fp8's blocks (GPTQ/AWQ's keys, compressed-tensors' config_groups, ModelOpt's quant_algo)."""

from __future__ import annotations

from typing import Any

from .config_field import ConfigField, ModelConfigError, integer, where
from .quant_width import quantized_bytes

MAX_GROUPS = 64

# ModelOpt's quant_algo (its older exports name no config_groups): the width and group of each, all float
# formats (one fp8 or e8m0 scale a group or channel, no zero point); MIXED_PRECISION's is per layer, so not
# known. FP8_PB_WO keeps blocks of 128 x 128 (ModelOptFp8PbWoLinearMethod), which a split must divide.
MODELOPT_ALGOS = {
    "FP8": (8, None),
    "FP8_PER_CHANNEL_PER_TOKEN": (8, None),
    "FP8_PB_WO": (8, None),
    "MXFP8": (8, 32),
    "NVFP4": (4, 16),
    "W4A16_NVFP4": (4, 16),
}
# The algorithms whose group vLLM reads from the config (ModelOptNvFp4Config's group_size: at the top level, or
# under `quantization` where that object is); MXFP8's blocks of 32 are fixed whatever the config says.
MODELOPT_GROUP_READ = frozenset({"NVFP4", "W4A16_NVFP4"})
MODELOPT_BLOCKS = {"FP8_PB_WO": [128, 128]}
# The cache vLLM runs under --kv-cache-dtype auto for a ModelOpt checkpoint that names one
# (torch_utils.get_kv_cache_quant_algo_string): fp8, or NVFP4's 4 bits and an fp8 scale a 16.
MODELOPT_KV = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}

# The layers a checkpoint leaves unquantized (ModelOpt's exclude_modules or ignore, compressed-tensors' ignore),
# as the memory model can count them: attention projections are kept at the model's dtype; names of parts it
# does not weigh as quantized anyway (the head, embeddings, norms, a vision tower, MoE routers) change nothing;
# any other (an MLP, a whole layer) leaves the width unknown, as a mixed-precision checkpoint's.
MAX_EXCLUDED = 4096
UNWEIGHED_PARTS = ("lm_head", "embed", "norm", "vision", "visual", "vit", "mm_projector", "multi_modal", "audio")
ATTENTION_PARTS = ("attn", "attention")

# Weights a quantization scale serves: -1 is one per output channel, 0 is no group at all (refused)
GROUP_FIELD = ConfigField("quantization_config.group_size", -1, 65536, "Weights a quantization scale serves.")
GROUP_RULE = "-1 (a scale per output channel) or a positive group"
BITS_FIELD = ConfigField("quantization_config.bits", 1, 32, "Bits per weight.")


def _canonical(method: Any) -> str | None:
    """A quant_method as vLLM compares it: lower case, compressed_tensors spelled compressed-tensors."""
    return method.lower().replace("compressed_tensors", "compressed-tensors") if isinstance(method, str) else None


def _modelopt(quant: dict[str, Any]) -> dict[str, Any] | None:
    """ModelOpt's settings: its `quantization` object (hf_quant_config.json's nesting) or the config itself."""
    method = quant.get("quant_method")
    if not isinstance(method, str) or not method.lower().startswith("modelopt"):
        return None
    inner = quant.get("quantization")
    return inner if isinstance(inner, dict) else quant


def _modelopt_algo(quant: dict[str, Any]) -> str | None:
    """ModelOpt's quant_algo, upper-cased as vLLM reads it."""
    settings = _modelopt(quant)
    algo = settings.get("quant_algo") if settings is not None else None
    return algo.upper() if isinstance(algo, str) and len(algo) <= 64 else None


def _auto_kv(quant: dict[str, Any]) -> str | None:
    """The cache dtype vLLM runs under `auto` for this checkpoint (None: the model's dtype): a compressed-tensors
    config's kv_cache_scheme is fp8 (attention.py applies it where the cache dtype is auto); ModelOpt's
    kv_cache_scheme or kv_cache_quant_algo, resolved as torch_utils.get_kv_cache_quant_algo_string does."""
    if quant.get("kv_cache_dtype") in MODELOPT_KV.values():  # (what this reader wrote of a config it checked)
        return str(quant["kv_cache_dtype"])
    if _canonical(quant.get("quant_method")) == "compressed-tensors":
        return "fp8_e4m3" if isinstance(quant.get("kv_cache_scheme"), dict) and quant["kv_cache_scheme"] else None
    settings = _modelopt(quant)
    if settings is None:
        return None
    keys = ("kv_cache_scheme", "kv_cache_quant_algo")
    algo = next((v for k in keys for v in (settings.get(k), quant.get(k)) if v), None)  # (vLLM's order)
    if isinstance(algo, dict):
        bits, floats = algo.get("num_bits"), algo.get("type") == "float"
        algo = (
            "fp8"
            if floats and bits == 8 and algo.get("dynamic") is False
            else "nvfp4"
            if floats and bits == 4
            else None
        )
    return MODELOPT_KV.get(algo.lower()) if isinstance(algo, str) and len(algo) <= 64 else None


def _excluded(quant: dict[str, Any]) -> str | None:
    """What the checkpoint leaves unquantized: None (nothing the memory model weighs otherwise),
    "attention" (attention projections in the model dtype), or "unknown"."""
    settings = _modelopt(quant) or quant
    names: Any = next(
        (v for v in (settings.get("exclude_modules"), settings.get("ignore"), quant.get("ignore")) if v), []
    )
    if not isinstance(names, list) or len(names) > MAX_EXCLUDED:
        return "unknown"
    found = None
    for name in names:
        text = name.lower() if isinstance(name, str) and len(name) <= 512 else None
        if text is None:
            return "unknown"
        text = text.rstrip("$")  # (compressed-tensors' "re:" patterns end so)
        if any(part in text for part in UNWEIGHED_PARTS) or text.endswith(("gate", "router")):
            continue
        if not any(part in text for part in ATTENTION_PARTS):
            return "unknown"
        found = "attention"
    return found


def _weights_args(quant: dict[str, Any]) -> list[dict[str, Any]] | None:
    """compressed-tensors' (and newer ModelOpt exports') config_groups weights arguments, one a group."""
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not 0 < len(groups) <= MAX_GROUPS:
        return None
    return [g["weights"] if isinstance(g, dict) and isinstance(g.get("weights"), dict) else {} for g in groups.values()]


def _checked_group(value: Any, source: str) -> int | None:
    if value is None:
        return None
    group = integer(value, GROUP_FIELD, "quantization_config.group_size", source)
    if group == 0:
        raise ModelConfigError(f"{where('quantization_config.group_size', source)} must be {GROUP_RULE}")
    return group


def _weights_format(quant: dict[str, Any], method: str, source: str) -> tuple[int | None, int | None, bool]:
    """(bits a weight, weights a scale serves, float format) of the quantized linear layers, read where vLLM
    reads them: ModelOpt's quant_algo (and NVFP4's group_size); compressed-tensors' config_groups alone, the
    heaviest group where their groups or formats differ (a scheme a target: never under-counted), none where
    their widths do; else GPTQ/AWQ's `bits` (`w_bit`) and `group_size` (`q_group_size`). Bits None: not known
    (a group without num_bits, mixed widths, a mixed-precision algo)."""
    settings = _modelopt(quant)
    algo = _modelopt_algo(quant)
    if settings is not None and (algo is not None or "bits" not in quant):  # (ModelOpt: its quant_algo decides,
        # whatever config_groups a newer export adds; a checked config keeps what it said as bits)
        if algo not in MODELOPT_ALGOS:
            return None, None, False
        width, default = MODELOPT_ALGOS[algo]
        given = settings.get("group_size") if algo in MODELOPT_GROUP_READ else None
        return width, _checked_group(given, source) or default, True
    weights = _weights_args(quant)
    if weights is not None:  # (compressed-tensors builds its schemes from config_groups alone)
        if any(w.get("num_bits") is None for w in weights):
            return None, None, False
        key = "quantization_config.config_groups.weights.num_bits"
        formats = [
            (
                integer(w["num_bits"], BITS_FIELD, key, source),
                _checked_group(w.get("group_size"), source),
                w.get("type") == "float",
            )
            for w in weights
        ]
        if len({f[0] for f in formats}) > 1:  # (mixed widths: the method's usual width, and no weights figure
            return None, None, False  # to place an OOM by, as for any width not known)
        return max(formats, key=lambda f: quantized_bytes(f[0], f[1], method, None, f[2]))
    group = _checked_group(
        next((quant[k] for k in ("group_size", "q_group_size") if quant.get(k) is not None), None), source
    )
    bits_key = next((k for k in ("bits", "w_bit") if quant.get(k) is not None), None)
    if bits_key is None:
        return None, group, False
    floats = quant.get("weights_type") == "float"  # (what this reader wrote of a config it checked before)
    return integer(quant[bits_key], BITS_FIELD, f"quantization_config.{bits_key}", source), group, floats


def quantization(quant: Any, source: str) -> dict[str, Any] | None:
    """The quantization_config's fields the memory model reads, checked; None where it names no method."""
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if not isinstance(quant, dict) or (method is not None and (not isinstance(method, str) or len(method) > 64)):
        raise ModelConfigError(
            f"{where('quantization_config', source)} must be an object whose quant_method is a short string"
        )
    if not method:
        return None
    out: dict[str, Any] = {"quant_method": method}
    bits, group, floats = _weights_format(quant, method, source)
    excluded = "attention" if quant.get("dense_attention") is True else _excluded(quant)
    bits = None if excluded == "unknown" else bits  # (a width only part of the layers has: not one figure)
    out |= {"dense_attention": True} if excluded == "attention" and bits is not None else {}
    out |= {"bits": bits} if bits is not None else {}
    out |= {"group_size": group} if group is not None else {}
    out |= {"weights_type": "float"} if floats and bits is not None else {}
    if kv := _auto_kv(quant):
        out["kv_cache_dtype"] = kv
    # (ModelOpt's FP8_PB_WO blocks are fixed: ModelOptFp8PbWoLinearMethod never reads weight_block_size)
    block = MODELOPT_BLOCKS.get(_modelopt_algo(quant) or "") or quant.get("weight_block_size")
    # (block-wise fp8: [block_n, block_k]; a split must divide)
    if isinstance(block, list) and len(block) == 2:
        field = ConfigField("quantization_config.weight_block_size[]", 1, 65536, "")
        out["weight_block_size"] = [integer(b, field, "quantization_config.weight_block_size[]", source) for b in block]
    return out
