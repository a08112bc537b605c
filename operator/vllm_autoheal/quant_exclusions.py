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
# (with MLP, in a model of experts: no entry names the routed experts, which stay quantized: the share is of the rest)
SPARES_EXPERTS = "spares routed experts"
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
    # Nemotron-H's blocks name every layer `mixer` (nemotron_h.py: attention, Mamba-2, MLP and MoE blocks alike)
    "mixer.q_proj",
    "mixer.k_proj",
    "mixer.v_proj",
    "mixer.o_proj",
)
_DENSE_MLP = tuple(
    f"{block}.{proj}"
    for block in ("mlp", "feed_forward")
    for proj in ("gate_proj", "up_proj", "down_proj", "gate_up_proj", "w1", "w2", "w3")
) + ("mlp.fc1", "mlp.fc2", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h", "mlp.c_fc", "mlp.c_proj")
# Nemotron-H's Mamba-2 mixers and MLP blocks: weighed with the MLP (all that is not attention), in any model of them
_MIXERS = ("mixer.in_proj", "mixer.out_proj", "mixer.up_proj", "mixer.down_proj")
# Gated DeltaNet's projections (qwen3_next.py, qwen3_5.py): weighed with the MLP (all that is not attention)
_LINEAR = tuple(
    f"linear_attn.{proj}"
    for proj in ("in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
)
# Granite-4.0's MLP beside (or instead of) its experts
_SHARED_MLP = ("shared_mlp.input_linear", "shared_mlp.output_linear")
# A MoE layer's experts are one module to vLLM (FusedMoE, under its prefix), but compressed-tensors tests one
# expert's projections under it (get_moe_method: `<prefix>.0.gate_proj`, `.0.up_proj`, `.0.down_proj`)
_EXPERTS = ("mlp.experts", "block_sparse_moe.experts", "feed_forward.experts", "mixer.experts")
_ONE_EXPERT = tuple(f"{e}.0.{proj}" for e in _EXPERTS for proj in ("gate_proj", "up_proj", "down_proj"))
_SHARED = tuple(
    f"{block}.{shared}.{proj}"
    for block in ("mlp", "feed_forward", "mixer", "block_sparse_moe")
    for shared in ("shared_expert", "shared_experts")
    for proj in ("gate_proj", "up_proj", "down_proj", "gate_up_proj")
)
# Where a layer sits: a text model, and a multimodal model's language model (both spellings vLLM uses).
_PREFIXES = ("model.layers.0.", "language_model.model.layers.0.", "model.language_model.layers.0.")
_BACKBONE = "backbone.layers.0."
_INDEX = re.compile(r"\.(layers|experts|h|blocks)\.\d{1,6}(?!\d)")
_REPEATED_GROUP = re.compile(r"\)[*+?{]")


@dataclass(frozen=True)
class Layers:
    """What a model's decoder layers may hold, whose names a skip list may match (any doubt: yes)."""

    dense: bool = True  # dense MLP layers (a model of experts alone has none)
    shared: bool = True  # shared experts beside the routed ones
    experts: bool = True  # routed experts
    gated: bool = True  # a dense MLP of gate, up and down (relu2's, Nemotron's and Arcee's: up and down alone)
    mixers: bool = True  # Mamba-2 layers named `mixer` (Nemotron-H names every block so: attention, MLP, MoE too)
    linear: bool = True  # Gated DeltaNet layers (`linear_attn`: Qwen3-Next, Qwen3.5)


ANY_LAYERS = Layers()
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
# Keys saying some layers are dense beside the MoE ones: a period above 1 (every n-th layer MoE), a list of
# dense layers, or any first dense layers (DeepSeek's first_k_dense_replace: 1 is one dense layer)
PERIOD_KEYS = ("moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", "expert_layer_period")
# Models of Mamba-2 mixers named `mixer`, by model_type (or Nemotron-H's hybrid_override_pattern)
MIXER_TYPES = frozenset({"nemotron_h", "granitemoehybrid", "bamba", "falcon_h1", "zamba2"})
# MoE families with routed experts alone (no shared expert beside them), by model_type
NO_SHARED_EXPERT = frozenset({"mixtral", "qwen3_moe", "gpt_oss", "phimoe", "olmoe", "granitemoe", "dbrx"})


def layers_of(config: dict[str, Any]) -> Layers:
    """The layers a (text) config's model has, as far as its keys say."""
    experts = any(isinstance(config.get(k), int) and config[k] > 0 for k in EXPERT_KEYS)
    dense = (
        not experts
        or any(config.get(k) not in (None, 0, 1, []) for k in PERIOD_KEYS)
        or config.get("mlp_only_layers") not in (None, [])
        or config.get("first_k_dense_replace") not in (None, 0)
    )
    from .model_layers import PLAIN_MLP_TYPES  # (model_layers reads model_config, which reads this module)

    kind = config.get("model_type")
    gated = kind not in PLAIN_MLP_TYPES and config.get("mlp_hidden_act", config.get("hidden_act")) != "relu2"
    # (vLLM's MambaMixer2 is `mixer` in Nemotron-H, Granite-4.0-H, Bamba, Falcon-H1 and Zamba2; Qwen3.5's
    # `mamba_ssm_dtype` is no mixer)
    mixers = kind in MIXER_TYPES or "hybrid_override_pattern" in config
    types = config.get("layer_types")
    linear = (isinstance(types, list) and "linear_attention" in types) or "linear_num_value_heads" in config
    return Layers(dense, experts and kind not in NO_SHARED_EXPERT, experts, gated, mixers, linear)


def _names(parts: tuple[str, ...], layers: Layers = ANY_LAYERS) -> list[str]:
    # (Nemotron-H's checkpoint calls its stack `backbone`, which vLLM maps to `model` in the skip lists too:
    # hf_to_vllm_mapper, applied to ModelOpt's and compressed-tensors' lists)
    prefixes = _PREFIXES + (_BACKBONE,) if layers.mixers else _PREFIXES
    return [prefix + part for prefix in prefixes for part in parts]


def _candidates(layers: Layers, one_expert: bool = False) -> dict[str, list[str]]:
    """The names an entry is tested on; `one_expert`: a routed expert's projections too, for the method that tests
    them (compressed-tensors; the others test the FusedMoE prefix alone)."""
    mlp = (
        (_DENSE_MLP if layers.dense else ())
        + (_SHARED_MLP if layers.dense or layers.shared else ())
        + (_MIXERS if layers.mixers else ())
        + (_LINEAR if layers.linear else ())
        + (_EXPERTS if layers.experts else ())
        + (_ONE_EXPERT if layers.experts and one_expert else ())
        + (_SHARED if layers.shared else ())
    )
    names = {ATTENTION: _names(_ATTENTION, layers), MLP: _names(mlp, layers)}
    return names if layers.mixers else {k: [n for n in v if ".mixer." not in n] for k, v in names.items()}


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
    """A test of a module name for a pattern entry (a regex, a glob), as vLLM runs it; None where it cannot be
    judged. (A plain name is looked up in _Names: the module, as vLLM compares it, any module under it, or it under
    any prefix; a substring of one where the method matches substrings.)"""
    if entry.startswith("re:"):
        compiled = _regex(entry[3:])
        return None if compiled is None else (lambda name: compiled.match(name) is not None)
    glob = _INDEX.sub(lambda m: f".{m.group(1)}.0", entry)  # (one layer's name stands for every layer's)
    if sum(glob.count(c) for c in "*?[") > MAX_REPEATS + 2:
        return None
    return lambda name: fnmatchcase(name, glob) or (substring and glob.rstrip("*") in name)


def _costly(entries: list[Any]) -> bool:
    """More patterns (regexes, globs) than the reader runs for one list."""
    return sum(1 for e in entries if isinstance(e, str) and (e.startswith("re:") or any(c in e for c in "*?["))) > (
        MAX_PATTERNS
    )


class _Names:
    """Candidate names, looked up by a plain entry at the cost of one dictionary lookup (whole names: each dotted
    suffix and prefix of every name) or one substring search (substrings): a list of 4,096 entries costs what
    4,096 lookups do, however many names a model has."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.joined = names, "\n".join(names)
        self.whole: dict[str, list[str]] = {}
        for name in names:
            cuts = [i for i, c in enumerate(name) if c == "."]
            # (name == plain; name.endswith("." + plain); name.startswith(plain + "."))
            for key in {name, *(name[i + 1 :] for i in cuts), *(name[:i] for i in cuts)}:
                self.whole.setdefault(key, []).append(name)

    def matching(self, plain: str, substring: bool) -> list[str]:
        if substring:
            return [n for n in self.names if plain in n] if plain in self.joined else []
        return self.whole.get(plain, [])


def _plain(entry: str) -> str | None:
    """An entry that is a name (no regex, no glob), one layer's standing for every layer's; None for a pattern."""
    if entry.startswith("re:"):
        return None
    plain = _INDEX.sub(lambda m: f".{m.group(1)}.0", entry)
    return None if any(c in plain for c in "*?[") else plain


def skipped(entries: Any, substring: bool, layers: Layers, one_expert: bool = False) -> tuple[frozenset[str], float]:
    """What a skip list leaves unquantized: ATTENTION, MLP (part of it, or of the experts), both where its entries
    name both, or UNKNOWN (entries that cannot be judged, or whole layers: everything in the model's dtype); none
    where nothing is weighed otherwise; and the share of each MLP's weights it skips (_share). SPARES_EXPERTS
    beside MLP: in a model of experts no entry names them (by the names vLLM tests for a layer's routed experts:
    its FusedMoE prefix, and one expert's projections under it), so they stay quantized and the share is of the
    rest of the MLP."""
    if entries is None or entries == []:
        return frozenset(), 1.0
    if not isinstance(entries, list) or len(entries) > MAX_NAMES or _costly(entries):
        return frozenset({UNKNOWN}), 1.0
    candidates, found, parts, routed = _candidates(layers, one_expert), set(), set(), False
    indexed = {kind: _Names(names) for kind, names in candidates.items()}
    fused = [n for n in candidates[MLP] if n.endswith(_EXPERTS)]  # (the FusedMoE prefixes)
    for entry in entries:
        if not isinstance(entry, str) or not 0 < len(entry) <= MAX_NAME:
            return frozenset({UNKNOWN}), 1.0
        # (an entry naming experts other than the shared ones may mean them by a name vLLM does not test, one
        # expert's: not judged to spare them)
        routed |= "expert" in entry.replace("shared_expert", "")
        plain = _plain(entry)
        if plain is not None:
            mlp = indexed[MLP].matching(plain, substring)
            attention = bool(indexed[ATTENTION].matching(plain, substring))
        else:
            test = _matcher(entry, substring)
            if test is None:
                return frozenset({UNKNOWN}), 1.0
            mlp = [n for n in candidates[MLP] if test(n)]
            attention = any(test(n) for n in candidates[ATTENTION])
        # (fp8's and ModelOpt's is_layer_skipped: a FusedMoE whose prefix is inside an entry naming experts, one
        # expert's projection or `<prefix>.*`, loads unquantized)
        if not entry.startswith("re:") and "experts" in entry:
            named = _INDEX.sub(lambda m: f".{m.group(1)}.0", entry)
            mlp = mlp + [n for n in fused if n in named]
        if mlp and attention:
            return frozenset({UNKNOWN}), 1.0
        if mlp:
            found.add(MLP)
            parts |= _parts(mlp, layers)
            routed |= any(n.endswith(_EXPERTS) or ".experts.0." in n for n in mlp)
        elif attention:  # (another entry of the same list may name the MLP: each is weighed so)
            found.add(ATTENTION)
    spares = MLP in found and layers.experts and not routed
    return frozenset(found | ({SPARES_EXPERTS} if spares else set())), _share(parts, layers)


# A dense MLP's projections, each an equal share of its weights where their names tell them apart: Llama's gate,
# up and down a third each (gate_up_proj: gate's and up's), up and down a half each where there is no gate.
_GATED_PARTS = {"gate_proj": {"gate"}, "up_proj": {"up"}, "down_proj": {"down"}, "gate_up_proj": {"gate", "up"}}
_PLAIN_PARTS = {"up_proj": {"up"}, "down_proj": {"down"}}


def _parts(matched: list[str], layers: Layers) -> set[str]:
    """The projections of a dense MLP the names matched name ("all": any other name, or a model of experts)."""
    if layers.experts or layers.shared or not layers.dense:
        return {"all"}
    known = _GATED_PARTS if layers.gated else _PLAIN_PARTS
    parts: set[str] = set()
    for name in matched:
        head, _, proj = name.rpartition(".")
        parts |= known.get(proj, {"all"}) if head.endswith(".layers.0.mlp") else {"all"}
    return parts


def _share(parts: set[str], layers: Layers) -> float:
    if not parts or "all" in parts:
        return 1.0
    return len(parts) / (3 if layers.gated else 2)


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
