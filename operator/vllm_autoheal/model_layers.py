"""Which kind each layer of a model is, read from its config.json as HF's config classes fill it in and
vLLM's models build it: MoE layers, sliding-window layers, layers that keep a state instead of K and V
per token, and the dtype vLLM keeps that state in. shape_reader.shape_from_config uses these; a config
reaches them checked by model_config (bounded lists and strings), so nothing here loops on a count
the config names without a bound."""

from __future__ import annotations

from typing import Any

from .model_config import BY_NAME, LAYER_LISTS


def moe_layers(cfg: dict[str, Any]) -> tuple[int, int]:
    """(period, offset) of the MoE layers: vLLM's llama4.py and qwen2_moe.py make layer i MoE
    when (i + 1) % step == 0; jamba.py where i % expert_layer_period == expert_layer_offset."""
    step = whole(config_value(cfg, "interleave_moe_layer_step", "decoder_sparse_step", default=1)) or 1
    if step > 1:
        return step, step - 1
    period = max(1, whole(config_value(cfg, "expert_layer_period", default=1)) or 1)
    return period, (whole(config_value(cfg, "expert_layer_offset", default=0)) or 0) % period


# HF's config class fills in layer_types where config.json lists none, and vLLM reads that list:
# model_type -> (n, read): layer i attends in full where (i + 1) % n == 0, n from the config's
# sliding_window_pattern where the class reads one (read), else this n (transformers' defaults).
FULL_EVERY: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "vaultgemma": (2, False),
    "gpt_oss": (2, False),
    "gemma3": (6, True),
    "gemma3_text": (6, True),
    "cohere2": (4, True),
    "exaone4": (4, True),
    "olmo3": (4, False),
    "gemma3n": (5, False),
    "gemma3n_text": (5, False),
}
# Config classes that drop the window unless use_sliding_window is true (false by default); with
# it, the layers from max_window_layers on (28 by default) are windowed.
WINDOW_OPT_IN = frozenset(
    {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"}
)


# layer_types / layers_block_type words of layers that keep no K and V per token: a fixed state per
# request (vLLM gives them a MambaSpec: Qwen3-Next/Qwen3.5's Gated DeltaNet, Granite 4's and Jamba's
# Mamba, LFM2's convolution) or no attention at all (Nemotron-H's MLP and MoE layers).
STATE_LAYER_TYPES = frozenset({"linear_attention", "mamba", "conv", "mlp", "moe"})
ATTENTION_LETTER = "*"  # Nemotron-H's hybrid_override_pattern: one letter a layer, "*" attends


def layer_words(cfg: dict[str, Any], layers: int) -> list[Any] | None:
    """Each layer's kind as the first layer list the config holds names it (model_config.LAYER_LISTS:
    layer_types, then layers_block_type), for the first `layers` layers; None where it holds none."""
    for key in LAYER_LISTS:
        words = cfg.get(key)
        if isinstance(words, list) and words:
            return words[:layers]
    return None


def state_layers_of(cfg: dict[str, Any], layers: int) -> int:
    """Layers without a per-token cache, as each family names them (and HF's config classes and vLLM's
    models read them): layer_types or layers_block_type word by word; Nemotron-H's
    hybrid_override_pattern letter by letter; Bamba's attn_layer_indices; Jamba's attn_layer_period
    and attn_layer_offset (layer i attends where i % period == offset); Qwen3-Next's
    full_attention_interval (layer i attends in full where (i + 1) % n == 0)."""
    if (words := layer_words(cfg, layers)) is not None:
        return sum(1 for t in words if t in STATE_LAYER_TYPES)
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return sum(1 for c in pattern[:layers] if c != ATTENTION_LETTER)
    indices = cfg.get("attn_layer_indices")
    if isinstance(indices, list) and indices:
        return layers - len({i for i in indices if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers})
    period = whole(cfg.get("attn_layer_period"))
    if period:
        offset = cfg.get("attn_layer_offset") or 0
        attending = (layers - offset + period - 1) // period if isinstance(offset, int) and offset < period else 0
        return layers - attending
    n = whole(cfg.get("full_attention_interval"))
    return layers - layers // n if n else 0


def _full_by_pattern(pattern: Any, layers: int) -> int | None:
    """Full-attention layers of a sliding_window_pattern: n (every n-th, so 1 is every layer) or
    EXAONE 4's letters ("LLLG": L windowed, G full, repeated); None where it names none."""
    if isinstance(pattern, str) and pattern:
        return sum(1 for i in range(layers) if pattern[i % len(pattern)] in "Gg")
    n = whole(pattern)
    return layers // n if n else None


def sliding_layers(cfg: dict[str, Any], layers: int) -> int:
    """How many layers attend within `sliding_window`, as vLLM builds them: `layer_types[i]` for
    layer i where the config lists them; else the list HF's config class fills in (FULL_EVERY, a
    sliding_window_pattern, Qwen's use_sliding_window and max_window_layers); every layer otherwise
    (Mistral 7B v0.1, where the config names a window). A window the config turns off is none."""
    window = whole(cfg.get("sliding_window"))
    kind = cfg.get("model_type")
    opt_in = cfg.get("use_sliding_window")
    if window is None or opt_in is False or (kind in WINDOW_OPT_IN and opt_in is not True):
        return 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types[:layers] if t == "sliding_attention")
    default, read = FULL_EVERY.get(kind, (0, True)) if isinstance(kind, str) else (0, True)
    full = _full_by_pattern(cfg.get("sliding_window_pattern"), layers) if read else None
    if full is None and default:
        full = layers // default
    if full is not None:
        return layers - full
    if opt_in is True:
        first = cfg.get("max_window_layers", 28 if kind in WINDOW_OPT_IN else 0)
        return max(0, layers - first) if isinstance(first, int) else layers
    return layers


def whole(value: Any) -> int | None:
    """A positive whole number from an unchecked config value, else None (model_config.check has
    already refused it on every path from a VLLMService or the CLI)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def config_value(cfg: dict[str, Any], *names: str, default: Any = 0) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


# vLLM keeps a Mamba-2 state in float32 for these unless their config says otherwise
# (model_executor/models/config.py NemotronHForCausalLMConfig); Qwen3.5 reads its mamba_ssm_dtype.
FLOAT32_STATE_TYPES = frozenset({"nemotron_h"})


def state_dtype_of(cfg: dict[str, Any]) -> str | None:
    named = cfg.get("mamba_ssm_cache_dtype") or cfg.get("mamba_ssm_dtype")
    if isinstance(named, str) and named != "auto":
        return named
    return "float32" if cfg.get("model_type") in FLOAT32_STATE_TYPES else None


# layer-list words of mixers that keep a state page a request, which vLLM sizes from the config's
# dims (Mamba, Gated DeltaNet); LFM2's convolution keeps one too, of dims not read here.
MAMBA_LAYER_TYPES = frozenset({"mamba", "linear_attention"})


# Nemotron-H's layers_block_type words as its pattern's letters (transformers' NemotronHConfig derives
# hybrid_override_pattern, which vLLM's nemotron_h.py reads, from the list: Nemotron-3 Ultra writes only the list)
NEMOTRON_LETTERS = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "moe": "E",
    "mlp": "-",
}


def nemotron_blocks(cfg: dict[str, Any]) -> str:
    """Nemotron-H's block pattern: hybrid_override_pattern, else its layers_block_type word by word ("?", a whole
    layer, for a word it does not name); "" for any other model."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        return pattern
    words = cfg.get("layers_block_type")
    if cfg.get("model_type") == "nemotron_h" and isinstance(words, list):
        return "".join(NEMOTRON_LETTERS.get(word, "?") for word in words)
    return ""


def mamba_layers_of(cfg: dict[str, Any], layers: int) -> int:
    """The Mamba mixers among the state layers (each keeps a state page a request): Nemotron-H's "M"
    letters, "mamba" and "linear_attention" (Gated DeltaNet) words of a layer list; else every layer
    that does not attend (Bamba, Jamba, Qwen3-Next's full_attention_interval)."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern[:layers].count("M")
    if (words := layer_words(cfg, layers)) is not None:
        return sum(1 for word in words if word in MAMBA_LAYER_TYPES)
    return state_layers_of(cfg, layers)


# The MLP as vLLM builds each model type (its model_executor/models/<type>.py). These have two matrices,
# up and down, and no gate (c_fc/c_proj, fc_in/fc_out, dense_h_to_4h/dense_4h_to_h, fc1/fc2), 4 x hidden
# wide where the config leaves the width unset (GPT-2's n_inner null; Falcon, BLOOM). The rest gate
# (gate, up and down), unless their activation is relu2.
PLAIN_MLP_TYPES = frozenset(
    {"gpt2", "gpt_bigcode", "gptj", "gpt_neox", "starcoder2", "falcon", "RefinedWeb", "RefinedWebModel", "bloom"}
    | {"opt", "phi", "persimmon"}
)
# Granite MoE's layers beside their experts run a shared MLP; a Granite-4.0-H without experts runs it alone, as
# its dense MLP (vLLM's granitemoehybrid: intermediate_size is then unused).
SHARED_MLP_ALONE_TYPES = frozenset({"granitemoehybrid", "granitemoeshared"})
# QWen (v1) gives the two gated projections' width together: vLLM's QWenMLP is intermediate_size // 2 wide.
HALVED_MLP_TYPES = frozenset({"qwen"})


def mlp_of(cfg: dict[str, Any], hidden: int) -> tuple[int, bool]:
    """The dense MLP's width and whether it is gated."""
    kind = cfg.get("model_type")
    plain = kind in PLAIN_MLP_TYPES
    width = int(config_value(cfg, "intermediate_size", *BY_NAME["intermediate_size"].aliases) or 0)
    if plain and not width:
        width = 4 * hidden
    if kind in HALVED_MLP_TYPES:
        width //= 2
    if isinstance(kind, str) and kind.startswith("llama4") and cfg.get("intermediate_size_mlp"):
        width = int(cfg["intermediate_size_mlp"])  # (its dense layers; intermediate_size is an expert's)
    if kind in SHARED_MLP_ALONE_TYPES and not config_value(cfg, "num_local_experts", default=0):
        width = int(config_value(cfg, "shared_intermediate_size", default=0) or width)  # (no experts: that MLP alone)
    return width, not plain and cfg.get("mlp_hidden_act", cfg.get("hidden_act")) != "relu2"


def shared_expert_of(cfg: dict[str, Any]) -> int:
    """The shared expert's width in each MoE layer: Qwen-MoE's, Granite's shared MLP, DeepSeek's n_shared_experts
    (ERNIE-4.5's, and Cohere2-MoE's and Aria's of their experts' intermediate_size),
    Nemotron-H's and Bailing's n_shared_experts of moe_shared_expert_intermediate_size (nemotron_h.py, bailing_moe.py:
    one MLP that wide), and Llama 4's one shared expert, as wide as a routed one (vLLM's Llama4MoE)."""
    names = ("shared_expert_intermediate_size", *BY_NAME["shared_expert_intermediate_size"].aliases)
    named = config_value(cfg, *names, default=0)
    if named:
        return int(named)
    count = config_value(cfg, "n_shared_experts", *BY_NAME["n_shared_experts"].aliases, default=None)
    each = config_value(cfg, "moe_shared_expert_intermediate_size", default=0)
    if each:
        return int(each) * int(1 if count is None else count)
    kind = cfg.get("model_type")
    if isinstance(kind, str) and kind.startswith("llama4") and config_value(cfg, "num_local_experts", default=0):
        return int(cfg.get("intermediate_size") or 0)
    # (the routed experts' width: moe_intermediate_size, else intermediate_size, as Cohere2-MoE's and Aria's are)
    return int(count or 0) * int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
