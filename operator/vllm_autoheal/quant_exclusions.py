"""Which of a decoder layer's linear layers a checkpoint leaves unquantized, read from the lists each method's
vLLM config reads and matched as vLLM matches them (a regex, a glob, a substring, an exact name) against the
module names vLLM gives a decoder layer: a list that can skip part of the MLP (or the experts) makes the width
unknown, one that can skip attention keeps attention in the model's dtype, anything else (the head, embeddings,
norms, a vision tower, a MoE router) changes nothing. A list or pattern that cannot be judged cheaply and surely
(too long, a regex naming a layer by number, nested repetition) is "unknown": a wrong guess here under-counts
the weights, and an operator must not promise memory that is not there."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

UNKNOWN, ATTENTION, MLP = "unknown", "attention", "mlp"
MAX_NAMES = 4096
MAX_NAME = 512
# What one config may make the reader run (each against about a hundred names of about 50 characters): a few
# patterns of at most two repetitions and a few alternatives; more is judged "unknown", never run.
MAX_PATTERNS = 8
MAX_REPEATS = 2
MAX_ALTERNATIVES = 4
MAX_GROUPS = 64

# The linear layers of one decoder layer as vLLM names them (and the shards of its fused ones), by what they are,
# in the families vLLM's models use (Llama and most: self_attn/mlp; Llama 4, InternLM2: feed_forward; Falcon,
# GPT-NeoX, GPT-2: their own).
_ATTENTION = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "self_attn.qkv_proj",
    "self_attn.q_a_proj",
    "self_attn.q_b_proj",
    "self_attn.kv_a_proj_with_mqa",
    "self_attn.kv_b_proj",
    "self_attention.query_key_value",
    "self_attention.dense",
    "attention.query_key_value",
    "attention.dense",
    "attention.wqkv",
    "attention.wo",
    "attn.c_attn",
    "attn.c_proj",
)
_DENSE_MLP = tuple(
    f"{block}.{proj}"
    for block in ("mlp", "feed_forward")
    for proj in ("gate_proj", "up_proj", "down_proj", "gate_up_proj", "w1", "w2", "w3")
) + ("mlp.fc1", "mlp.fc2", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h", "mlp.c_fc", "mlp.c_proj")
# A MoE layer's experts are one module to vLLM (FusedMoE, under its prefix): their own names are never tested
_EXPERTS = ("mlp.experts", "block_sparse_moe.experts", "feed_forward.experts")
_SHARED = tuple(
    f"{block}.{shared}.{proj}"
    for block in ("mlp", "feed_forward")
    for shared in ("shared_expert", "shared_experts")
    for proj in ("gate_proj", "up_proj", "down_proj", "gate_up_proj")
)
# Where a layer sits: a text model, and a multimodal model's language model (both spellings vLLM uses).
_PREFIXES = ("model.layers.0.", "language_model.model.layers.0.", "model.language_model.layers.0.")
_INDEX = re.compile(r"\.(layers|experts|h|blocks)\.\d{1,6}(?!\d)")
_REPEATED_GROUP = re.compile(r"\)[*+?{]")


@dataclass(frozen=True)
class Layers:
    """What a model's decoder layers may hold, whose names a skip list may match (any doubt: yes)."""

    dense: bool = True  # dense MLP layers (a model of experts alone has none)
    shared: bool = True  # shared experts beside the routed ones
    experts: bool = True  # routed experts


ANY_LAYERS = Layers()
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
DENSE_LAYER_KEYS = ("first_k_dense_replace", "mlp_only_layers", "moe_layer_freq", "decoder_sparse_step")
# MoE families with routed experts alone (no shared expert beside them), by model_type
NO_SHARED_EXPERT = frozenset({"mixtral", "qwen3_moe", "gpt_oss", "phimoe", "olmoe", "granitemoe", "dbrx"})


def layers_of(config: dict[str, Any]) -> Layers:
    """The layers a (text) config's model has, as far as its keys say."""
    experts = any(isinstance(config.get(k), int) and config[k] > 0 for k in EXPERT_KEYS)
    dense = not experts or any(config.get(k) not in (None, 0, 1, []) for k in DENSE_LAYER_KEYS)
    return Layers(dense, experts and config.get("model_type") not in NO_SHARED_EXPERT, experts)


def _names(parts: tuple[str, ...]) -> list[str]:
    return [prefix + part for prefix in _PREFIXES for part in parts]


def _candidates(layers: Layers) -> dict[str, list[str]]:
    mlp = (
        (_DENSE_MLP if layers.dense else ()) + (_EXPERTS if layers.experts else ()) + (_SHARED if layers.shared else ())
    )
    return {ATTENTION: _names(_ATTENTION), MLP: _names(mlp)}


# The layers whose coverage by a target list is judged: Llama's naming (that of nearly every quantized checkpoint).
_COVERED = {ATTENTION: _ATTENTION[:4], MLP: ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
_COVERED_MOE = {ATTENTION: _ATTENTION[:4], MLP: ("mlp.experts",)}


def _regex(pattern: str) -> re.Pattern[str] | None:
    """A pattern safe to run on our names, compiled; None where it is not (then the list is not judged)."""
    repeats = sum(pattern.count(c) for c in "*+?{") - pattern.count("(?")
    if repeats > MAX_REPEATS or pattern.count("|") >= MAX_ALTERNATIVES or _REPEATED_GROUP.search(pattern):
        return None
    if re.search(r"\d", pattern):  # (a layer named by its number matches only some: which, our names cannot say)
        return None
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None


def _matcher(entry: str, substring: bool) -> Any:
    """A test of a module name for one list entry, as vLLM runs it; None where the entry cannot be judged."""
    if entry.startswith("re:"):
        compiled = _regex(entry[3:])
        return None if compiled is None else (lambda name: compiled.match(name) is not None)
    plain = _INDEX.sub(lambda m: f".{m.group(1)}.0", entry)  # (one layer's name stands for every layer's)
    if any(c in plain for c in "*?["):
        if sum(plain.count(c) for c in "*?[") > MAX_REPEATS + 2:
            return None
        return lambda name: fnmatchcase(name, plain) or (substring and plain.rstrip("*") in name)
    if substring:
        return lambda name: plain in name
    # (a whole name: the module, as vLLM compares it, or any module under it, or it under any prefix)
    return lambda name: name == plain or name.endswith("." + plain) or name.startswith(plain + ".")


def _costly(entries: list[Any]) -> bool:
    """More patterns (regexes, globs) than the reader runs for one list."""
    return sum(1 for e in entries if isinstance(e, str) and (e.startswith("re:") or any(c in e for c in "*?["))) > (
        MAX_PATTERNS
    )


def skipped(entries: Any, substring: bool, layers: Layers) -> str | None:
    """What a skip list leaves unquantized: None (nothing weighed otherwise), ATTENTION, MLP (part of it, or of
    the experts), or UNKNOWN (entries that cannot be judged, or whole layers: everything in the model's dtype)."""
    if entries is None or entries == []:
        return None
    if not isinstance(entries, list) or len(entries) > MAX_NAMES or _costly(entries):
        return UNKNOWN
    candidates, found = _candidates(layers), None
    for entry in entries:
        if not isinstance(entry, str) or not 0 < len(entry) <= MAX_NAME:
            return UNKNOWN
        test = _matcher(entry, substring)
        if test is None:
            return UNKNOWN
        mlp, attention = any(test(n) for n in candidates[MLP]), any(test(n) for n in candidates[ATTENTION])
        if mlp and attention:
            return UNKNOWN
        if mlp:
            found = MLP
        elif attention and found is None:
            found = ATTENTION
    return found


def _coverage(tests: list[Any], layers: Layers) -> str | None:
    """What layers no test covers leave in the model's dtype: None, ATTENTION, MLP, or UNKNOWN (both)."""
    names = _COVERED if layers.dense else _COVERED_MOE
    covered = {part: all(any(t(_PREFIXES[0] + n) for t in tests) for n in parts) for part, parts in names.items()}
    if not covered[MLP]:
        return MLP if covered[ATTENTION] else UNKNOWN  # (neither: every linear layer in the model's dtype)
    return None if covered[ATTENTION] else ATTENTION


def uncovered(targets: list[Any], layers: Layers) -> str | None:
    """compressed-tensors' config_groups targets (each group's list): the layers no group targets stay in the
    model's dtype (get_scheme_dict finds no scheme); a group whose one target names an Attention class is
    dropped (from_config: attention quantization goes with the KV cache's). None: every linear layer targeted."""
    tests: list[Any] = []
    if len(targets) > MAX_GROUPS or _costly([t for g in targets if isinstance(g, list) for t in g]):
        return UNKNOWN
    for group in targets:
        if not isinstance(group, list) or not group or len(group) > MAX_NAMES:
            return UNKNOWN
        if len(group) == 1 and isinstance(group[0], str) and group[0].endswith("Attention"):
            continue
        for target in group:
            if not isinstance(target, str) or not 0 < len(target) <= MAX_NAME:
                return UNKNOWN
            if target == "Linear":
                return None
            if target.startswith("re:"):  # (another class name: no linear layer is one)
                test = _matcher(target, substring=False)
                if test is None:
                    return UNKNOWN
                tests.append(test)
    return _coverage(tests, layers)


def unnamed(names: list[str], layers: Layers) -> str | None:
    """GPTQ's modules_in_block_to_quantize (names within a block): the layers it does not name stay unquantized."""
    if len(names) > MAX_NAMES or not all(0 < len(n) <= MAX_NAME for n in names):
        return UNKNOWN
    plain = [_INDEX.sub(lambda m: f".{m.group(1)}.0", n) for n in names]
    return _coverage([lambda name, n=n: name.endswith("." + n) for n in plain], layers)


# A dense MLP's projections as Llama names them, each a third of its weights (gate_up_proj: gate's and up's)
_THIRDS = {"gate_proj": {"gate"}, "up_proj": {"up"}, "down_proj": {"down"}, "gate_up_proj": {"gate", "up"}}


def mlp_share(lists: list[Any], substring: bool, layers: Layers) -> float:
    """The share of each dense MLP layer's weights the skip lists leave unquantized, for a model of dense MLPs
    named as Llama's: a third for each of gate, up and down they match; all of it for a model of other names or
    with experts, or for a list that matches any other MLP name or cannot be judged."""
    if layers.experts or layers.shared or not layers.dense:
        return 1.0
    canonical = {prefix + "mlp." + proj: part for prefix in _PREFIXES for proj, part in _THIRDS.items()}
    others = [n for n in _candidates(layers)[MLP] if n not in canonical]
    parts: set[str] = set()
    for entries in lists:
        for entry in entries if isinstance(entries, list) else ():
            test = _matcher(entry, substring) if isinstance(entry, str) else None
            if test is None or any(test(n) for n in others):
                return 1.0
            parts |= {p for name, part in canonical.items() if test(name) for p in part}
    return len(parts) / 3 or 1.0
