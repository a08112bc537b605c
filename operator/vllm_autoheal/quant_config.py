"""What a checkpoint's quantization_config says the memory model needs, as bounded, untrusted input: the
method, the bits a weight, the group a scale serves, whether the weights are a float format, and block-wise
fp8's blocks (GPTQ/AWQ's keys, compressed-tensors' config_groups, ModelOpt's quant_algo)."""

from __future__ import annotations

from typing import Any

from .config_field import ConfigField, ModelConfigError, integer, where

MAX_GROUPS = 64


# ModelOpt's quant_algo (its older exports name no config_groups): the width of each, all float formats
# (one fp8 or e8m0 scale a group or channel, no zero point); MIXED_PRECISION's is per layer, so not known.
MODELOPT_ALGOS = {"FP8": 8, "FP8_PER_CHANNEL_PER_TOKEN": 8, "FP8_PB_WO": 8, "MXFP8": 8, "NVFP4": 4, "W4A16_NVFP4": 4}


def _modelopt_algo(quant: dict[str, Any]) -> str | None:
    """ModelOpt's quant_algo, upper-cased as vLLM reads it (top level, or under `quantization`)."""
    method = quant.get("quant_method")
    if not isinstance(method, str) or not method.lower().startswith("modelopt"):
        return None
    inner = quant.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, dict) else quant.get("quant_algo")
    return algo.upper() if isinstance(algo, str) and len(algo) <= 64 else None


def _weights_args(quant: dict[str, Any]) -> list[dict[str, Any]] | None:
    """compressed-tensors' (and newer ModelOpt exports') config_groups weights arguments, one a group."""
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not 0 < len(groups) <= MAX_GROUPS:
        return None
    return [g["weights"] if isinstance(g, dict) and isinstance(g.get("weights"), dict) else {} for g in groups.values()]


def _float_weights(quant: dict[str, Any]) -> bool:
    """Whether the weights are a float format (NVFP4, MXFP4, FP8): a one-byte scale a group and no zero
    point, where an integer format's group keeps an fp16 scale and zero (quant_width)."""
    weights = _weights_args(quant)
    if weights is not None:
        return all(w.get("type") == "float" for w in weights)
    return _modelopt_algo(quant) in MODELOPT_ALGOS


def _bits(quant: dict[str, Any], source: str) -> int | None:
    """Bits per quantized weight: GPTQ/AWQ's `bits` (`w_bit`), or compressed-tensors' config_groups
    weights num_bits when every group agrees (mixed widths: None, the method's usual width), or what
    ModelOpt's quant_algo names."""
    field = ConfigField("quantization_config.bits", 1, 32, "Bits per weight.")
    for key in ("bits", "w_bit"):
        if quant.get(key) is not None:
            return integer(quant[key], field, f"quantization_config.{key}", source)
    weights = _weights_args(quant)
    if weights is None:
        return MODELOPT_ALGOS.get(_modelopt_algo(quant) or "")
    values = [w.get("num_bits") for w in weights]
    if any(value is None for value in values):
        return None
    widths = {integer(v, field, "quantization_config.config_groups.weights.num_bits", source) for v in values}
    return widths.pop() if len(widths) == 1 else None


# Weights a quantization scale serves: -1 is one per output channel, 0 is no group at all (refused)
GROUP_FIELD = ConfigField("quantization_config.group_size", -1, 65536, "Weights a quantization scale serves.")
GROUP_RULE = "-1 (a scale per output channel) or a positive group"


def _group(quant: dict[str, Any], source: str) -> int | None:
    """Weights a quantization scale serves: GPTQ/AWQ's `group_size` (`q_group_size`), or compressed-tensors'
    config_groups weights group_size when every group agrees; -1 is a scale per output channel."""
    value = next((quant[key] for key in ("group_size", "q_group_size") if quant.get(key) is not None), None)
    weights = _weights_args(quant)
    if value is None and weights is not None:
        sizes = [w.get("group_size") for w in weights]  # (a list: a tenant's value may be unhashable)
        value = sizes[0] if all(size == sizes[0] for size in sizes) else None
    if value is None:
        return None
    group = integer(value, GROUP_FIELD, "quantization_config.group_size", source)
    if group == 0:
        raise ModelConfigError(f"{where('quantization_config.group_size', source)} must be {GROUP_RULE}")
    return group


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
    bits = _bits(quant, source)
    if bits is not None:
        out["bits"] = bits
    group = _group(quant, source)
    if group is not None:
        out["group_size"] = group
    if _float_weights(quant):
        out["weights_type"] = "float"
    block = quant.get("weight_block_size")  # (block-wise fp8: [block_n, block_k]; a split must divide)
    if isinstance(block, list) and len(block) == 2:
        field = ConfigField("quantization_config.weight_block_size[]", 1, 65536, "")
        out["weight_block_size"] = [integer(b, field, "quantization_config.weight_block_size[]", source) for b in block]
    return out
