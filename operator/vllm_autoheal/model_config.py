"""A model's config.json as bounded, untrusted input: one table of the fields the memory model
reads, with the range real models have, used by the CRD schema (`spec.modelConfig.inline`)
and by the check every resolved config goes through (ConfigMap, Hub, local file, annotation).

Pure and cheap: parsing is capped in size, every number is checked for type and range before
the memory model sees it, and a failure is a ModelConfigError whose message names the field.
"""

from __future__ import annotations

import json
from typing import Any

from .config_field import ConfigField, ModelConfigError, NonFinite, integer, where
from .quant_config import quantization
from .quant_exclusions import layers_of

MAX_CONFIG_BYTES = 1 << 20  # real config.json files are a few KiB; a ConfigMap holds at most 1 MiB


# Ranges: wide enough for every published model (layers: Llama-3.1-405B 126; hidden: 16384 and
# up; heads: DeepSeek-V3 128; experts: Kimi-K2 384; vocabulary: Gemma 3 262,144; context: Llama 4
# Scout 10M), narrow enough that no number makes the arithmetic absurd.
FIELDS: tuple[ConfigField, ...] = (
    ConfigField("num_hidden_layers", 1, 1024, "Transformer layers.", ("n_layer",), required=True),
    ConfigField("hidden_size", 1, 65536, "Width of the residual stream.", ("n_embd", "d_model"), required=True),
    ConfigField("num_attention_heads", 1, 1024, "Query heads per layer.", ("n_head",), required=True),
    # (vLLM's get_total_num_kv_heads also reads Falcon's and ChatGLM's names for the count)
    ConfigField(
        "num_key_value_heads",
        1,
        1024,
        "Key/value heads per layer (GQA); unset = the query heads.",
        ("n_head_kv", "num_kv_heads", "multi_query_group_num"),
    ),
    ConfigField("head_dim", 1, 4096, "Width of one head; unset = hidden_size / num_attention_heads."),
    ConfigField(
        "intermediate_size",
        0,
        1 << 18,
        "Width of the dense MLP.",
        ("ffn_dim", "n_inner", "ffn_hidden_size", "ff_intermediate_size"),  # (the last: Phi-3-small's)
    ),
    ConfigField("intermediate_size_mlp", 0, 1 << 18, "Width of a dense layer's MLP beside MoE layers (Llama 4)."),
    ConfigField("vocab_size", 1, 1 << 21, "Tokens in the vocabulary.", required=True),
    # (vLLM's longest context: model_max_length where the config has it, else the smallest of these
    # names: derived_positions, as vLLM's _get_and_verify_max_len)
    ConfigField(
        "max_position_embeddings",
        1,
        1 << 25,
        "Longest context the model was trained for.",
        ("n_positions", "max_seq_len", "seq_length", "model_max_length", "max_target_positions")
        + ("max_sequence_length", "max_seq_length", "seq_len"),
    ),
    ConfigField(
        "num_local_experts",
        0,
        4096,
        "Routed experts per MoE layer.",
        ("num_experts", "n_routed_experts", "moe_num_experts"),  # (the last: ERNIE-4.5's, Aria's)
    ),
    ConfigField("num_experts_per_tok", 0, 4096, "Experts each token is routed to.", ("moe_k", "moe_topk")),
    ConfigField("moe_intermediate_size", 0, 1 << 18, "Width of one expert's MLP."),
    ConfigField(
        "moe_latent_size", 0, 65536, "Width a latent MoE's routed experts run at (Nemotron-3 Super); unset = hidden."
    ),
    ConfigField(
        "shared_expert_intermediate_size",
        0,
        1 << 18,
        "Width of the shared expert's MLP.",
        ("shared_intermediate_size",),  # (Granite's shared MLP)
    ),
    ConfigField(
        "moe_shared_expert_intermediate_size",
        0,
        1 << 18,
        "Width of each shared expert, n_shared_experts of them in one MLP (Nemotron-H, Bailing).",
    ),
    ConfigField(
        "n_shared_experts",
        0,
        64,
        "Shared experts per MoE layer (DeepSeek, Nemotron-H, Bailing, ERNIE-4.5, Aria, Cohere2-MoE).",
        ("num_shared_experts", "moe_num_shared_experts"),
    ),
    ConfigField(
        "first_k_dense_replace", 0, 1024, "Leading dense layers of an MoE (DeepSeek).", ("moe_layer_start_index",)
    ),
    ConfigField(
        "interleave_moe_layer_step",
        0,
        1024,
        "MoE in every n-th layer only (Llama 4).",
        ("decoder_sparse_step", "moe_layer_interval"),
    ),
    ConfigField("expert_layer_period", 0, 1024, "MoE in every n-th layer only (Jamba)."),
    ConfigField("expert_layer_offset", 0, 1024, "The first MoE layer's index (Jamba)."),
    ConfigField("kv_lora_rank", 0, 65536, "Compressed KV width of multi-latent attention."),
    ConfigField("q_lora_rank", 0, 65536, "Compressed query width of multi-latent attention."),
    ConfigField("qk_rope_head_dim", 0, 4096, "Rotary part of an MLA head."),
    ConfigField("qk_nope_head_dim", 0, 4096, "Non-rotary part of an MLA head."),
    ConfigField("v_head_dim", 0, 4096, "Value width of an MLA head."),
    ConfigField("index_head_dim", 0, 4096, "Key width of the sparse-attention indexer beside MLA (DeepSeek-V3.2)."),
    ConfigField("sliding_window", 0, 1 << 25, "Sliding attention window, when the model has one."),
    ConfigField("max_window_layers", 0, 1024, "Layers before the first windowed one (Qwen2 with use_sliding_window)."),
    ConfigField(
        "full_attention_interval", 0, 1024, "Every n-th layer attends in full, the rest linearly (Qwen3-Next)."
    ),
    ConfigField("attn_layer_period", 0, 1024, "Every n-th layer attends, the rest are Mamba layers (Jamba)."),
    ConfigField("attn_layer_offset", 0, 1023, "The first attending layer of attn_layer_period (Jamba)."),
    ConfigField("mamba_num_heads", 0, 4096, "A Mamba-2 mixer's heads (Nemotron-H).", ("mamba_n_heads",)),
    ConfigField("mamba_head_dim", 0, 4096, "Width of a Mamba-2 head.", ("mamba_d_head",)),
    ConfigField("mamba_n_groups", 0, 1024, "B and C groups of a Mamba-2 mixer.", ("n_groups",)),
    ConfigField("ssm_state_size", 0, 4096, "A Mamba mixer's state per head channel.", ("mamba_d_state",)),
    ConfigField("conv_kernel", 0, 64, "A Mamba mixer's convolution width.", ("mamba_d_conv",)),
    ConfigField("linear_num_key_heads", 0, 4096, "A Gated DeltaNet layer's key heads (Qwen3-Next, Qwen3.5)."),
    ConfigField("linear_num_value_heads", 0, 4096, "A Gated DeltaNet layer's value heads."),
    ConfigField("linear_key_head_dim", 0, 4096, "Width of a Gated DeltaNet key head."),
    ConfigField("linear_value_head_dim", 0, 4096, "Width of a Gated DeltaNet value head."),
    ConfigField("linear_conv_kernel_dim", 0, 64, "A Gated DeltaNet layer's convolution width."),
)
BY_NAME = {f.name: f for f in FIELDS}
# A multimodal model's vision encoder (config.json's vision_config), which vLLM loads beside the
# language model: its depth and width, its MLP, its patches and position table, and the merger or
# projector into the language model (vision_tower.py weighs it).
VISION_FIELDS: tuple[ConfigField, ...] = (
    ConfigField("depth", 0, 256, "Vision encoder layers.", ("num_hidden_layers",)),
    ConfigField("embed_dim", 0, 16384, "Width of the vision encoder (Qwen2-VL; there hidden_size is its output)."),
    ConfigField("hidden_size", 0, 65536, "Width of the vision encoder."),
    ConfigField("intermediate_size", 0, 1 << 17, "Width of a vision layer's MLP."),
    ConfigField("out_hidden_size", 0, 65536, "Width the vision merger projects to (Qwen2.5-VL and later)."),
    ConfigField("spatial_merge_size", 0, 16, "Patches merged per side before the merger (Qwen-VL)."),
    ConfigField("patch_size", 0, 1024, "Pixels per side of a patch."),
    ConfigField("temporal_patch_size", 0, 16, "Frames per patch (Qwen-VL)."),
    ConfigField("num_channels", 0, 16, "Input channels.", ("in_channels", "in_chans")),
    ConfigField("image_size", 0, 16384, "Image side the position table covers (CLIP, SigLIP)."),
    ConfigField("num_position_embeddings", 0, 1 << 20, "Learned position embeddings (Qwen3-VL)."),
)
MAX_MLP_RATIO = 64  # Qwen2-VL's mlp_ratio (4): the MLP's width over the encoder's
MAX_DEEPSTACK = 64  # Qwen3-VL's deepstack_visual_indexes: one more merger each
# A whole number (Gemma 3, Cohere2) or letters (EXAONE 4's "LLLG"), so outside the table.
PATTERN = ConfigField(
    "sliding_window_pattern", 0, 1024, "Every n-th layer attends in full (Gemma 3: 6), or letters (EXAONE 4: LLLG)."
)
# Text fields the memory model reads, with their longest sane value.
STRINGS = {
    "model_type": 64,
    "torch_dtype": 32,
    "dtype": 32,
    "hybrid_override_pattern": 1024,
    "mlp_hidden_act": 64,
    "hidden_act": 64,
    "mamba_ssm_cache_dtype": 32,
    "mamba_ssm_dtype": 32,
}
MAX_ARCHITECTURES, MAX_NAME = 8, 128
MAX_LAYER_TYPES = 1024  # one per layer (num_hidden_layers' own bound)
# Each layer's kind, word by word (layer_types: Gemma, Qwen3-Next; layers_block_type: Nemotron-H,
# Zamba2), and Bamba's attending layers by index.
LAYER_LISTS = {
    "layer_types": "Each layer's attention (sliding_attention: within sliding_window; full_attention; "
    "linear_attention, mamba, conv: a fixed state per request, no per-token cache).",
    "layers_block_type": "Each layer's block (Nemotron-H, Zamba2): attention keeps K and V per token; "
    "mamba, mlp and moe do not.",
}
BOOLEANS = {
    "tie_word_embeddings": "Input and output embeddings shared.",
    "attention_bias": "q/k/v projections carry a bias.",
    "use_sliding_window": "false: the sliding_window named is not used (Qwen2).",
    "multi_query": "One KV head for all query heads (StarCoder, Falcon-7B).",
    "new_decoder_architecture": "Falcon-40B's decoder: multi_query is not read, num_kv_heads is.",
    "attn_output_gate": "Attention gates its output, doubling the query projection (Qwen3-Next, Qwen3.5).",
}
ATTENTION_INDICES = "Bamba's attending layers, by index (the rest are Mamba layers)."
# Falcon's new decoder architecture ignores multi_query (vLLM's get_total_num_kv_heads).
FALCON_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel"})


def derived_positions(config: dict[str, Any]) -> int:
    """The longest context vLLM derives from a config (before RoPE scaling): model_max_length where it is
    set (Command-R, Cohere 2, Aya Vision), else the smallest of its names; 0 where none is."""
    field = BY_NAME["max_position_embeddings"]
    found = [config[k] for k in (field.name, *field.aliases) if isinstance(config.get(k), (int, float))]
    given = config.get("model_max_length")
    return int(given if isinstance(given, (int, float)) and given else min(found, default=0))


def _text(config: dict[str, Any], source: str, declared: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, limit in STRINGS.items():
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > limit:
            raise ModelConfigError(f"{where(key, source)} must be a string of at most {limit} characters")
        out[key] = value
    archs = config.get("architectures")
    if archs is not None:
        if (
            not isinstance(archs, list)
            or len(archs) > MAX_ARCHITECTURES
            or not all(isinstance(a, str) and 0 < len(a) <= MAX_NAME for a in archs)
        ):
            raise ModelConfigError(
                f"{where('architectures', source)} must be a list of at most {MAX_ARCHITECTURES} names"
            )
        out["architectures"] = list(archs)
    for key in BOOLEANS:
        if config.get(key) is not None:
            if not isinstance(config[key], bool):
                raise ModelConfigError(f"{where(key, source)} must be true or false")
            out[key] = config[key]
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, str):
        if len(pattern) > MAX_NAME:
            raise ModelConfigError(f"{where(PATTERN.name, source)} must be at most {MAX_NAME} letters")
        out[PATTERN.name] = pattern
    elif pattern is not None:
        out[PATTERN.name] = integer(pattern, PATTERN, PATTERN.name, source)
    for key in LAYER_LISTS:
        types = config.get(key)
        if types is None:
            continue
        if (
            not isinstance(types, list)
            or len(types) > MAX_LAYER_TYPES
            or not all(isinstance(t, str) and len(t) <= MAX_NAME for t in types)
        ):
            raise ModelConfigError(f"{where(key, source)} must be a list of at most {MAX_LAYER_TYPES} names")
        out[key] = list(types)
    indices = config.get("attn_layer_indices")
    if indices is not None:
        index = ConfigField("attn_layer_indices[]", 0, MAX_LAYER_TYPES - 1, "")
        if not isinstance(indices, list) or len(indices) > MAX_LAYER_TYPES:
            raise ModelConfigError(
                f"{where('attn_layer_indices', source)} must be a list of at most {MAX_LAYER_TYPES} layers"
            )
        out["attn_layer_indices"] = [integer(i, index, "attn_layer_indices[]", source) for i in indices]
    quant = quantization(config.get("quantization_config"), source, declared, layers_of(config))
    if quant:
        out["quantization_config"] = quant
    return out


def check(config: Any, source: str = "", config_file: bool = False, declared: bool = False) -> dict[str, Any]:
    """The fields the memory model reads, type- and range-checked; everything else dropped.
    A multimodal config's text_config is what counts (as vLLM reads it), but for the quantization_config:
    the top level's, else text_config's, else compressed-tensors' older compression_config. `config_file`: a
    whole config.json (parse's), not an inline description of some fields (model_sizable.refuse_unsized).
    `declared`: a description in spec.modelConfig's fields, or a config this reader checked, whose
    quantization fields say the format (quant_config.quantization); a config.json's are read as vLLM reads it."""
    if not isinstance(config, dict):
        raise ModelConfigError(f"{source or 'the model config'} must be a JSON object")
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ModelConfigError(f"{where('text_config', source)} must be an object")
    merged = {**{k: v for k, v in config.items() if k != "text_config"}, **(text or {})}
    quant_keys = ("quantization_config", "compression_config")
    merged["quantization_config"] = next(
        (c.get(k) for c in (config, text or {}) for k in quant_keys if c.get(k) is not None), None
    )
    words = merged.get("layers_block_type")
    if merged.get("num_hidden_layers") is None and merged.get("model_type") == "nemotron_h" and isinstance(words, list):
        merged["num_hidden_layers"] = len(words)  # (as transformers' NemotronHConfig derives it: Nemotron-3 Ultra)
    out = _text(merged, source, declared)
    if text is not None and "tie_word_embeddings" not in out and not str(out.get("model_type", "")).startswith("gemma"):
        # vLLM builds the language model from text_config, which without the field takes its class's default: False
        # but for Gemma's (Magistral's head is a weight of its own: 671 M parameters were counted tied)
        out["tie_word_embeddings"] = False
    quant = out.get("quantization_config")
    if quant and "kv_cache_dtype" in quant and quant["quant_method"].lower().startswith("modelopt"):
        if not isinstance(config.get("quantization_config"), dict):  # (vLLM resolves ModelOpt's cache from the
            del quant["kv_cache_dtype"]  # top level only: one in text_config alone leaves auto the dtype)
    for field in FIELDS:
        for key in (field.name, *field.aliases):
            if merged.get(key) is not None:
                out[field.name] = integer(merged[key], field, key, source)
                break
        else:
            if field.required:
                raise ModelConfigError(f"{where(field.name, source)} is missing; it is needed to size the model")
    positions = BY_NAME["max_position_embeddings"]
    lengths = {k: merged[k] for k in (positions.name, *positions.aliases) if merged.get(k) is not None}
    for key, value in lengths.items():  # (each name vLLM reads, checked: it may be the one it takes)
        integer(value, positions, key, source)
    if lengths:
        out["max_position_embeddings"] = derived_positions(lengths)
    if _multi_query(out):
        out["num_key_value_heads"] = 1
    heads, kv_heads = out["num_attention_heads"], out.get("num_key_value_heads")
    if kv_heads is not None and kv_heads > heads:
        raise ModelConfigError(
            f"{where('num_key_value_heads', source)} ({kv_heads}) exceeds num_attention_heads ({heads})"
        )
    if "head_dim" not in out and out["hidden_size"] < heads:
        raise ModelConfigError(
            f"{where('hidden_size', source)} ({out['hidden_size']}) is smaller than "
            f"num_attention_heads ({heads}) and no head_dim is given"
        )
    if out.get("num_experts_per_tok", 0) > out.get("num_local_experts", 0) > 0:
        raise ModelConfigError(f"{where('num_experts_per_tok', source)} exceeds num_local_experts")
    period = out.get("expert_layer_period") or 1
    if out.get("expert_layer_offset", 0) >= period > 1:
        raise ModelConfigError(f"{where('expert_layer_offset', source)} must be below expert_layer_period")
    if out.get("first_k_dense_replace", 0) > out["num_hidden_layers"]:
        raise ModelConfigError(f"{where('first_k_dense_replace', source)} exceeds num_hidden_layers")
    last = merged.get("moe_layer_end_index")  # (ERNIE-4.5's last MoE layer: the memory model places none after it)
    if last is not None and last != out["num_hidden_layers"] - 1:
        raise ModelConfigError(
            f"{where('moe_layer_end_index', source)} must be num_hidden_layers - 1: MoE layers that stop before the "
            "last layer cannot be placed"
        )
    from .model_sizable import positions_scaled, refuse_unsized  # (it reads this module's tables)

    refuse_unsized(merged, config, source, config_file)
    if positions_scaled(merged):
        out["rope_scaled"] = True
    vision = config.get("vision_config")
    if vision is not None:
        out["vision_config"] = _vision(vision, source)
    return out


def _vision(vision: Any, source: str) -> dict[str, Any]:
    """vision_config's fields, checked as the text model's are (VISION_FIELDS)."""
    if not isinstance(vision, dict):
        raise ModelConfigError(f"{where('vision_config', source)} must be an object")
    out: dict[str, Any] = {}
    for field in VISION_FIELDS:
        for key in (field.name, *field.aliases):
            if vision.get(key) is not None:
                out[field.name] = integer(vision[key], field, f"vision_config.{key}", source)
                break
    act = vision.get("hidden_act")
    if act is not None:
        if not isinstance(act, str) or len(act) > STRINGS["hidden_act"]:
            raise ModelConfigError(f"{where('vision_config.hidden_act', source)} must be a short string")
        out["hidden_act"] = act
    ratio = vision.get("mlp_ratio")
    if ratio is not None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= MAX_MLP_RATIO:
            raise ModelConfigError(
                f"{where('vision_config.mlp_ratio', source)} must be a number in (0, {MAX_MLP_RATIO}]"
            )
        out["mlp_ratio"] = float(ratio)
    stack = vision.get("deepstack_visual_indexes")
    if stack is not None:
        if not isinstance(stack, list) or len(stack) > MAX_DEEPSTACK:
            raise ModelConfigError(
                f"{where('vision_config.deepstack_visual_indexes', source)} must be a list of at most {MAX_DEEPSTACK}"
            )
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in stack):  # (one merger an entry)
            raise ModelConfigError(f"{where('vision_config.deepstack_visual_indexes', source)} must list layer numbers")
        out["deepstack_visual_indexes"] = list(stack)
    return out


def _multi_query(config: dict[str, Any]) -> bool:
    """One KV head for all queries (StarCoder, Falcon-7B), as vLLM reads the flag (both flags are
    already checked to be booleans)."""
    new_falcon = config.get("model_type") in FALCON_TYPES and config.get("new_decoder_architecture") is True
    return config.get("multi_query") is True and not new_falcon


def parse(raw: str | bytes, source: str = "", quant_raw: str | bytes | None = None) -> dict[str, Any]:
    """config.json text -> checked fields. Size-capped before parsing; NaN and Infinity refused where a field read
    holds one (NonFinite).
    `quant_raw`: an hf_quant_config.json beside it, the quantization_config where config.json has none
    (quant_method modelopt where its producer is ModelOpt, as vLLM reads it)."""
    config = _load(raw, source)
    if quant_raw is not None and isinstance(config, dict) and config.get("quantization_config") is None:
        quant = _load(quant_raw, f"{source}: hf_quant_config.json")
        producer = quant.get("producer") if isinstance(quant, dict) else None
        if isinstance(quant, dict) and isinstance(producer, dict) and producer.get("name") == "modelopt":
            config = {**config, "quantization_config": {**quant, "quant_method": "modelopt"}}
    return check(config, source, config_file=True)


def _load(raw: str | bytes, source: str) -> Any:
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelConfigError(
            f"{source or 'the model config'} is {len(raw):,} bytes; at most {MAX_CONFIG_BYTES:,} are read"
        )

    try:
        config = json.loads(raw, parse_constant=NonFinite)
    except RecursionError:
        raise ModelConfigError(f"{source or 'the model config'} is nested too deeply") from None
    except ValueError as exc:
        if isinstance(exc, ModelConfigError):
            raise
        raise ModelConfigError(f"{source or 'the model config'} is not JSON: {exc}") from None
    try:  # (JSON lets a string hold half a surrogate pair: no text, so no name that can be printed)
        json.dumps(config, ensure_ascii=False, default=repr).encode()
    except UnicodeEncodeError:
        raise ModelConfigError(
            f"{source or 'the model config'} holds a string that is not text (a lone surrogate)"
        ) from None
    except RecursionError:
        raise ModelConfigError(f"{source or 'the model config'} is nested too deeply") from None
    return config


def to_shape(fields: dict[str, Any]) -> Any:
    """Checked fields -> the memory model's ModelShape."""
    from .shape_reader import shape_from_config

    return shape_from_config(fields)
