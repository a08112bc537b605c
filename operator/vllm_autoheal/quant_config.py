"""What a checkpoint's quantization_config says the memory model needs, as bounded, untrusted input: the
method, the bits a weight, the group a scale serves, whether the weights are a float format, and block-wise
fp8's blocks (GPTQ/AWQ's keys, compressed-tensors' config_groups, ModelOpt's quant_algo)."""

from __future__ import annotations

from typing import Any

from . import quant_exclusions as qx
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

# Weights a quantization scale serves: -1 is one per output channel, 0 is no group at all (refused)
GROUP_FIELD = ConfigField("quantization_config.group_size", -1, 65536, "Weights a quantization scale serves.")
GROUP_RULE = "-1 (a scale per output channel) or a positive group"
BITS_FIELD = ConfigField("quantization_config.bits", 1, 32, "Bits per weight.")


def _canonical(method: Any) -> str | None:
    """A quant_method as vLLM compares it: lower case, compressed_tensors spelled compressed-tensors."""
    return method.lower().replace("compressed_tensors", "compressed-tensors") if isinstance(method, str) else None


def _modelopt(quant: dict[str, Any]) -> dict[str, Any] | None:
    """ModelOpt's settings: its `quantization` object (hf_quant_config.json's nesting) or the config itself."""
    method = _normalized_method(quant)
    if not isinstance(method, str) or not method.lower().startswith("modelopt"):
        return None
    inner = quant.get("quantization")
    return inner if isinstance(inner, dict) else quant


def _modelopt_algo(quant: dict[str, Any]) -> str | None:
    """ModelOpt's quant_algo, upper-cased as vLLM reads it."""
    settings = _modelopt(quant)
    algo = settings.get("quant_algo") if settings is not None else None
    return algo.upper() if isinstance(algo, str) and len(algo) <= 64 else None


def _auto_kv(quant: dict[str, Any], declared: bool) -> str | None:
    """The cache dtype vLLM runs under `auto` for this checkpoint (None: the model's dtype): a compressed-tensors
    config's kv_cache_scheme is fp8 (attention.py applies it where the cache dtype is auto); ModelOpt's
    kv_cache_scheme or kv_cache_quant_algo, resolved as torch_utils.get_kv_cache_quant_algo_string does."""
    if declared and quant.get("kv_cache_dtype") in MODELOPT_KV.values():  # (what this reader wrote of a config)
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


# Each method's lists of layers it leaves unquantized, where its vLLM config reads them, and whether vLLM matches
# their entries as substrings (ModelOpt, AWQ, bitsandbytes) or as whole names and "re:" patterns.
SKIP_LISTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "compressed-tensors": (("ignore",), False),
    "awq": (("modules_to_not_convert",), True),
    "awq_marlin": (("modules_to_not_convert",), True),
    "fp8": (("ignored_layers", "modules_to_not_convert"), False),
    "fbgemm_fp8": (("modules_to_not_convert",), False),
    "ptpc_fp8": (("ignored_layers",), False),
    "bitsandbytes": (("llm_int8_skip_modules",), True),
    "gptq": ((), False),
    "gptq_marlin": ((), False),
}
ANY_SKIP_LIST = ("exclude_modules", "ignore", "ignored_layers", "modules_to_not_convert", "llm_int8_skip_modules")


def _excluded(quant: dict[str, Any], method: str, layers: qx.Layers) -> dict[str, float]:
    """What the checkpoint leaves unquantized: "attention" (attention projections in the model dtype), "mlp" (with
    the share of the MLP's weights, quant_exclusions.skipped), "unknown" (lists that cannot be judged, whole
    layers); empty where nothing is."""
    settings = _modelopt(quant)
    if settings is not None:  # (nested: the quantization object's exclude_modules; flat: config.json's ignore)
        lists, substring = [settings.get("exclude_modules") if settings is not quant else quant.get("ignore")], True
    elif method in SKIP_LISTS:
        keys, substring = SKIP_LISTS[method]
        lists = [quant.get(k) for k in keys]
    else:  # (another method: any list it may read, matched the widest way)
        lists, substring = [quant.get(k) for k in ANY_SKIP_LIST], True
    if sum(len(names) for names in lists if isinstance(names, list)) > qx.MAX_NAMES:
        return {qx.UNKNOWN: 1.0}  # (more names than are judged for one config)
    judged = [qx.skipped(names, substring, layers, one_expert=method == "compressed-tensors") for names in lists]
    # (the routed experts stay quantized only where no list that skips some of the MLP names them)
    spares = all(qx.SPARES_EXPERTS in kinds for kinds, _ in judged if qx.MLP in kinds)
    found = {kind for kinds, _ in judged for kind in kinds if kind != qx.SPARES_EXPERTS}
    shares = [part for kinds, part in judged if qx.MLP in kinds]  # (each list's share of the MLP: they add up)
    more: set[str | None] = set()
    if method.startswith("gptq"):
        more |= _gptq_skips(quant, layers)
    if method == "compressed-tensors" and isinstance(groups := quant.get("config_groups"), dict):
        # (a group naming no targets is no config vLLM loads: its targets are not judged)
        targets = [g["targets"] for g in groups.values() if isinstance(g, dict) and "targets" in g]
        more.add(qx.uncovered(targets, layers) if targets else None)
    shares += [1.0] if qx.MLP in more else []  # (layers no target or block names: all of the MLP)
    share = min(1.0, sum(shares))
    excluded = {f: share if f == qx.MLP else 1.0 for f in found | more if f is not None}
    if qx.MLP in found and qx.MLP not in more and qx.UNKNOWN not in excluded and spares:
        excluded[qx.SPARES_EXPERTS] = 1.0
    return excluded


def _gptq_skips(quant: dict[str, Any], layers: qx.Layers) -> set[str | None]:
    """GPTQModel's `dynamic` ("-:" patterns: unquantized; others override bits or groups: another width) and
    modules_in_block_to_quantize (the layers it names; the rest unquantized)."""
    dynamic = quant.get("dynamic")
    if dynamic:
        if not isinstance(dynamic, dict) or len(dynamic) > qx.MAX_PATTERNS:
            return {qx.UNKNOWN}
        negative = [k[2:] for k in dynamic if isinstance(k, str) and k.startswith("-:")]
        base = {k: quant.get(k) for k in ("bits", "group_size")}
        if any(
            not isinstance(v, dict) or any(v.get(k, base[k]) != base[k] for k in base)
            for k_, v in dynamic.items()
            if not (isinstance(k_, str) and k_.startswith("-:"))
        ):
            return {qx.UNKNOWN}  # (a layer at another width or group: no one figure)
        if negative and (found := qx.skipped([f"re:{p}" for p in negative], False, layers)[0]):
            return {kind for kind in found if kind != qx.SPARES_EXPERTS}  # (a share of the whole MLP: no sparing)
    block = quant.get("modules_in_block_to_quantize")
    if block:
        names = (
            [n for part in block for n in (part if isinstance(part, list) else [part])]
            if isinstance(block, list)
            else None
        )
        if not names or not all(isinstance(n, str) for n in names):
            return {qx.UNKNOWN}
        return {qx.unnamed(names, layers)}
    return set()


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


# Where each method's vLLM config reads a weight's bits and group (the first key present wins: AutoAWQ's
# w_bit and q_group_size before bits and group_size); a method not named reads no bits (fp8, bitsandbytes', ...).
BITS_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    method: (("w_bit", "bits"), ("q_group_size", "group_size")) for method in ("awq", "awq_marlin")
} | {
    method: (("bits",), ("group_size",))
    for method in ("gptq", "gptq_marlin", "gptq_bitblas", "auto-round", "auto_round", "moe_wna16", "inc")
}
DECLARED_KEYS = (("bits", "w_bit"), ("group_size", "q_group_size"))  # (spec.modelConfig's own fields)


def _weights_format(
    quant: dict[str, Any], method: str, source: str, declared: bool
) -> tuple[int | None, int | None, bool]:
    """(bits a weight, weights a scale serves, float format) of the quantized linear layers, read where vLLM
    reads them: ModelOpt's quant_algo (and NVFP4's group_size); compressed-tensors' config_groups alone, the
    heaviest group where their groups or formats differ (a scheme a target: never under-counted), none where
    their widths do; else the method's own keys (BITS_KEYS; bitsandbytes' load_in_8bit/4bit). Bits None: not
    known (a group without num_bits, mixed widths, a mixed-precision algo, a method that reads no bits).
    `declared`: a description in spec.modelConfig's fields (or a config this reader checked), whose bits and
    group_size say the width whatever the method."""
    settings = _modelopt(quant)
    algo = _modelopt_algo(quant)
    if settings is not None and (algo is not None or not declared or "bits" not in quant):
        if algo not in MODELOPT_ALGOS:  # (ModelOpt: its quant_algo decides, whatever else a config adds)
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
    if not declared and method == "bitsandbytes":  # (its 4 bits are the method's own nf4 blocks: no bits said)
        return (8 if quant.get("load_in_8bit") is True else None), None, False
    if not declared and (method == "compressed-tensors" or method not in BITS_KEYS):
        return None, None, False  # (compressed-tensors without groups it reads; a method that reads no bits)
    bits_keys, group_keys = DECLARED_KEYS if declared else BITS_KEYS[method]
    group = _checked_group(next((quant[k] for k in group_keys if quant.get(k) is not None), None), source)
    bits_key = next((k for k in bits_keys if quant.get(k) is not None), None)
    if bits_key is None:
        return None, group, False
    floats = declared and quant.get("weights_type") == "float"
    return integer(quant[bits_key], BITS_FIELD, f"quantization_config.{bits_key}", source), group, floats


def _normalized_method(quant: dict[str, Any]) -> Any:
    """quant_method as vLLM reads it (_normalize_quantization_config): ModelOpt's producer with a quant_algo
    under `quantization` makes it modelopt (modelopt_fp4 for NVFP4) whatever it says; lower case,
    compressed_tensors spelled compressed-tensors."""
    method = quant.get("quant_method")
    producer, inner = quant.get("producer"), quant.get("quantization")
    if isinstance(producer, dict) and producer.get("name") == "modelopt" and isinstance(inner, dict):
        algo = inner.get("quant_algo")
        if isinstance(algo, str) and len(algo) <= 64:
            method = "modelopt_fp4" if algo.upper() == "NVFP4" else "modelopt"
    return _canonical(method) if isinstance(method, str) else method


def quantization(
    quant: Any, source: str, declared: bool = True, layers: qx.Layers = qx.ANY_LAYERS
) -> dict[str, Any] | None:
    """The quantization_config's fields the memory model reads, checked; None where it names no method.
    `declared`: spec.modelConfig's description (or a config this reader checked): its own fields (bits,
    group_size, and what this reader writes: weights_type, kv_cache_dtype, dense_attention/dense_mlp) say
    the format; a config.json's are read only where vLLM reads them. `layers`: what the model's layers hold,
    whose names a skip list may match."""
    if quant is None:
        return None
    method = _normalized_method(quant) if isinstance(quant, dict) else None
    if not isinstance(quant, dict) or (method is not None and (not isinstance(method, str) or len(method) > 64)):
        raise ModelConfigError(
            f"{where('quantization_config', source)} must be an object whose quant_method is a short string"
        )
    if not method:
        return None
    out: dict[str, Any] = {"quant_method": method}
    bits, group, floats = _weights_format(quant, method, source, declared)
    excluded = _excluded(quant, method, layers)
    listed_mlp = "mlp" in excluded
    if declared and quant.get("dense_attention") is True:
        excluded["attention"] = 1.0
    own = quant.get("dense_mlp") if declared else None  # (a share this reader wrote: True is all of it)
    if isinstance(own, (int, float)) and 0 < own <= 1:
        excluded["mlp"] = max(excluded.get("mlp", 0.0), float(own))
    # What it skips, or might skip, weighed in the model's dtype: attention exactly; the MLP's projections it
    # matches (Llama's thirds), or all of it where they cannot be told apart, and a list that cannot be judged as
    # everything (an over-count, never an under-count: the classifier takes no weights figure from the MLP's)
    unknown = "unknown" in excluded
    out |= {"dense_attention": True} if unknown or "attention" in excluded else {}
    out |= {"dense_mlp": 1.0 if unknown else round(excluded["mlp"], 4)} if unknown or "mlp" in excluded else {}
    # (the share is of the MLP but its routed experts: where every skip list that names some of the MLP names
    # none of them, and a share declared beside says so too)
    spares = not unknown and "mlp" in excluded and (not listed_mlp or qx.SPARES_EXPERTS in excluded)
    spares &= own is None or (declared and quant.get("dense_mlp_spares_experts") is True)
    out |= {"dense_mlp_spares_experts": True} if spares else {}
    out |= {"bits": bits} if bits is not None else {}
    out |= {"group_size": group} if group is not None else {}
    out |= {"weights_type": "float"} if floats and bits is not None else {}
    # (GPTQ's act order: Marlin then takes a row-parallel slice only in multiples of 128 inputs)
    out |= {"desc_act": True} if method.startswith("gptq") and quant.get("desc_act") is True else {}
    if kv := _auto_kv(quant, declared):
        out["kv_cache_dtype"] = kv
    # (ModelOpt's FP8_PB_WO blocks are fixed: ModelOptFp8PbWoLinearMethod never reads weight_block_size)
    block = MODELOPT_BLOCKS.get(_modelopt_algo(quant) or "") or quant.get("weight_block_size")
    # (block-wise fp8: [block_n, block_k]; a split must divide)
    if isinstance(block, list) and len(block) == 2:
        field = ConfigField("quantization_config.weight_block_size[]", 1, 65536, "")
        out["weight_block_size"] = [integer(b, field, "quantization_config.weight_block_size[]", source) for b in block]
    return out
