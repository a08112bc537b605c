"""Which of a decoder layer's linear layers a checkpoint leaves unquantized, read from the lists each method's
vLLM config reads and matched as vLLM matches them (a regex, a glob, a substring, an exact name) against the
module names vLLM gives a decoder layer: a list that can skip part of the MLP (or the experts) makes the width
unknown, one that can skip attention keeps attention in the model's dtype, anything else (the head, embeddings,
norms, a vision tower, a MoE router) changes nothing. A list or pattern that cannot be judged cheaply and surely
(too long, a regex naming a layer by number, nested repetition) is "unknown": a wrong guess here under-counts
the weights, and an operator must not promise memory that is not there."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any

UNKNOWN, ATTENTION, MLP = "unknown", "attention", "mlp"
MAX_NAMES = 4096
MAX_NAME = 512
MAX_REGEXES = 64  # evaluated per list, each against a few dozen short names
MAX_REPEATS = 3  # quantifiers a regex may hold: its cost on a name of about 50 characters stays polynomial

# The linear layers of one decoder layer as vLLM names them (and the shards of its fused ones), by what they are.
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
    "attn.c_attn",
    "attn.c_proj",
)
_DENSE_MLP = (
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "mlp.gate_up_proj",
    "mlp.fc1",
    "mlp.fc2",
    "mlp.dense_h_to_4h",
    "mlp.dense_4h_to_h",
    "mlp.c_fc",
    "mlp.c_proj",
)
_EXPERTS = (
    "mlp.experts.0.gate_proj",
    "mlp.experts.0.up_proj",
    "mlp.experts.0.down_proj",
    "mlp.experts.w13_weight",
    "mlp.experts.w2_weight",
    "mlp.shared_expert.gate_proj",
    "mlp.shared_expert.down_proj",
    "mlp.shared_experts.gate_up_proj",
    "mlp.shared_experts.down_proj",
    "block_sparse_moe.experts.0.w1",
    "block_sparse_moe.experts.0.w2",
    "block_sparse_moe.experts.0.w3",
)
# Where a layer sits: a text model, and a multimodal model's language model (both spellings vLLM uses).
_PREFIXES = ("model.layers.0.", "language_model.model.layers.0.", "model.language_model.layers.0.")
_INDEX = re.compile(r"\.(layers|experts|h|blocks)\.\d{1,6}\.")
_REPEATED_GROUP = re.compile(r"\)[*+?{]")


def _names(parts: tuple[str, ...]) -> list[str]:
    return [prefix + part for prefix in _PREFIXES for part in parts]


def _candidates(dense_mlp: bool) -> dict[str, list[str]]:
    return {ATTENTION: _names(_ATTENTION), MLP: _names((_DENSE_MLP if dense_mlp else ()) + _EXPERTS)}


# The layers whose coverage by a target list is judged: Llama's naming (that of nearly every quantized checkpoint).
_COVERED = {ATTENTION: _ATTENTION[:4], MLP: ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
_COVERED_MOE = {
    ATTENTION: _ATTENTION[:4],
    MLP: ("mlp.experts.0.gate_proj", "mlp.experts.0.up_proj", "mlp.experts.0.down_proj"),
}


def _regex(pattern: str) -> re.Pattern[str] | None:
    """A pattern safe to run on our names, compiled; None where it is not (then the list is not judged)."""
    repeats = sum(pattern.count(c) for c in "*+?{") - pattern.count("(?")
    if repeats > MAX_REPEATS or _REPEATED_GROUP.search(pattern) or re.search(r"\\\d|\d", pattern):
        return None  # (a layer named by its number matches only some layers: which, the names here cannot say)
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None


def _matcher(entry: str, substring: bool) -> Any:
    """A test of a module name for one list entry, as vLLM runs it; None where the entry cannot be judged."""
    if entry.startswith("re:"):
        compiled = _regex(entry[3:])
        return None if compiled is None else (lambda name: compiled.match(name) is not None)
    plain = _INDEX.sub(lambda m: f".{m.group(1)}.0.", entry)  # (one layer's name stands for every layer's)
    if any(c in plain for c in "*?["):
        return lambda name: fnmatchcase(name, plain) or (substring and plain.rstrip("*") in name)
    if substring:
        return lambda name: plain in name
    # (a whole name: the module, as vLLM compares it, or any module under it, or it under any prefix)
    return lambda name: name == plain or name.endswith("." + plain) or name.startswith(plain + ".")


def skipped(entries: Any, substring: bool, dense_mlp: bool) -> str | None:
    """What a skip list leaves unquantized: None (nothing weighed otherwise), ATTENTION, MLP (part of it, or
    of the experts; attention too, perhaps) or UNKNOWN (entries that cannot be judged)."""
    if entries is None or entries == []:
        return None
    if not isinstance(entries, list) or len(entries) > MAX_NAMES:
        return UNKNOWN
    if sum(1 for e in entries if isinstance(e, str) and e.startswith("re:")) > MAX_REGEXES:
        return UNKNOWN
    candidates, found = _candidates(dense_mlp), None
    for entry in entries:
        if not isinstance(entry, str) or not 0 < len(entry) <= MAX_NAME:
            return UNKNOWN
        test = _matcher(entry, substring)
        if test is None:
            return UNKNOWN
        if any(test(name) for name in candidates[MLP]):
            found = MLP
        elif found is None and any(test(name) for name in candidates[ATTENTION]):
            found = ATTENTION
    return found


def _coverage(tests: list[Any], dense_mlp: bool) -> str | None:
    """What layers no test covers leave in the model's dtype: None, ATTENTION, MLP, or UNKNOWN (both)."""
    names = _COVERED if dense_mlp else _COVERED_MOE
    covered = {part: all(any(t(_PREFIXES[0] + n) for t in tests) for n in parts) for part, parts in names.items()}
    if not covered[MLP]:
        return MLP if covered[ATTENTION] else UNKNOWN  # (neither: every linear layer in the model's dtype)
    return None if covered[ATTENTION] else ATTENTION


def uncovered(targets: list[Any], dense_mlp: bool) -> str | None:
    """compressed-tensors' config_groups targets (each group's list): the layers no group targets stay in the
    model's dtype (get_scheme_dict finds no scheme); a group whose one target names an Attention class is
    dropped (from_config: attention quantization goes with the KV cache's). None: every linear layer targeted."""
    tests: list[Any] = []
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
    return _coverage(tests, dense_mlp)


def unnamed(names: list[str], dense_mlp: bool) -> str | None:
    """GPTQ's modules_in_block_to_quantize (names within a block): the layers it does not name stay unquantized."""
    if len(names) > MAX_NAMES or not all(0 < len(n) <= MAX_NAME for n in names):
        return UNKNOWN
    plain = [_INDEX.sub(lambda m: f".{m.group(1)}.0.", n) for n in names]
    return _coverage([lambda name, n=n: name.endswith("." + n) for n in plain], dense_mlp)
