"""Which model configs the memory model can size, and which it refuses rather than guess: each refusal
names the field, so `plan` exits 2 and pre-flight and heals fall back to what they do without a config."""

from __future__ import annotations

from typing import Any

from .config_field import ModelConfigError, where
from .model_config import BY_NAME
from .model_layers import mamba_layers_of, mlp_of

# Encoder-only models (embeddings, classifiers): vLLM keeps no KV cache for them, and the memory model
# sizes decoders (it gave BERT a 69 GiB cache).
ENCODER_ONLY_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "nomic_bert", "modernbert", "electra", "deberta", "deberta-v2"}
)
# Where a config describes a vision encoder other than under vision_config, which alone is counted
# (Phi-3-vision's img_processor, LLaVA-1.5's original mm_vision_tower, Qwen-VL's visual).
UNREAD_VISION_KEYS = ("img_processor", "mm_vision_tower", "visual")
# A Mamba mixer's dimensions: where a config names them and no field says which layers are Mamba layers, the
# memory model would count none of them (Falcon-H1's parallel mixers: 0.34 B of its 0.52 B, and no state).
MAMBA_DIMS = ("mamba_d_state", "mamba_n_heads", "mamba_d_ssm")
# Layers the memory model does not size, by the key that describes them: it would count them as the attention
# they replace (Kimi-Linear's 20 KDA layers as MLA, 31,104 B a token where vLLM keeps 8,064 and a state page)
# or weigh what vLLM loads otherwise (DeepSeek-V4's fp8 checkpoint: 272 GiB counted, its experts loaded as
# MXFP4 in 145 GiB).
UNSIZED_LAYERS = {
    "linear_attn_config": "Kimi Delta Attention layers, which keep a state the memory model does not size",
    "compress_ratios": "DeepSeek-V4's compressed attention, whose experts vLLM loads as MXFP4",
    "moe_layers_enum": "MoE layers by number (Step-3), which the memory model does not place",
    "share_expert_dim": "a shared expert of a width of its own (Step-3)",
}

# Fields that give some layers' attention (or V alone) heads of their own, beside those the memory model gives
# every layer (head_dim, num_key_value_heads): it would size those layers' KV cache wrong (Gemma 4's full layers:
# 983,040 B a token where vLLM keeps 901,120; MiMo-V2.5's sliding layers and V heads: 147,456 where it keeps
# 222,720, cache promised that is not there). MLA's v_head_dim sizes no cache: its latent does.
OWN_HEADS = {
    "global_head_dim": "head_dim",
    "num_global_key_value_heads": "num_key_value_heads",
    "swa_head_dim": "head_dim",
    "swa_num_key_value_heads": "num_key_value_heads",
    "swa_v_head_dim": "head_dim",
    "v_head_dim": "head_dim",
}


def positions_scaled(config: dict[str, Any]) -> bool:
    """Whether RoPE scaling stretches the model's positions, so that vLLM's longest context is not
    max_position_embeddings alone (it multiplies it by the factor for most kinds)."""
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    return isinstance(rope, dict) and str(rope.get("rope_type") or rope.get("type") or "default") != "default"


def refuse_unsized(merged: dict[str, Any], config: dict[str, Any], source: str, config_file: bool) -> None:
    """Refuse a model the memory model would size wrong without knowing it."""
    kind = merged.get("model_type")
    if kind in ENCODER_ONLY_TYPES:
        raise ModelConfigError(
            f"{source or 'the model config'}: {kind} is an encoder-only model; vLLM keeps no KV cache for it "
            "and the memory model sizes decoder models only"
        )
    hidden = merged.get("hidden_size") or merged.get("n_embd") or merged.get("d_model") or 0
    experts_field = BY_NAME["num_local_experts"]  # (every name the table reads the expert count under)
    experts = any(merged.get(k) for k in (experts_field.name, *experts_field.aliases))
    layers = merged.get("num_hidden_layers") or merged.get("n_layer") or 0
    mambas = mamba_layers_of(merged, layers) if isinstance(layers, int) else 0
    # (a whole config.json names its MLP's width; an inline description of some fields may leave it out)
    if config_file and not mlp_of(merged, hidden)[0] and not experts and not mambas:
        raise ModelConfigError(
            f"{where('intermediate_size', source)} is missing or 0 for a {kind} model, whose MLP the memory model "
            "then cannot size"
        )
    mamba2 = merged.get("mamba_num_heads") or merged.get("mamba_n_heads")
    if isinstance(kind, str) and mambas and not mamba2 and not merged.get("linear_num_value_heads"):  # (a type named)
        raise ModelConfigError(
            f"{where('mamba_num_heads', source)} is missing: the model's {mambas} Mamba layers are not Mamba-2 or "
            "Gated DeltaNet, whose state alone the memory model sizes"
        )
    placed = next((k for k in MAMBA_DIMS if merged.get(k)), None)
    if placed and isinstance(kind, str) and not mambas:  # (Falcon-H1 runs a Mamba mixer beside every attention)
        raise ModelConfigError(
            f"{where(placed, source)} describes Mamba mixers that no field places in the layers (a {kind} model): "
            "the model cannot be sized"
        )
    for key, what in UNSIZED_LAYERS.items():
        if merged.get(key) is not None or config.get(key) is not None:
            raise ModelConfigError(f"{where(key, source)} describes {what}: the model cannot be sized")
    for key, base in OWN_HEADS.items():
        value = merged.get(key)
        if value is None or value == merged.get(base) or (key == "v_head_dim" and merged.get("kv_lora_rank")):
            continue
        raise ModelConfigError(
            f"{where(key, source)} ({str(value)[:20]}) sizes some layers' attention heads apart from {base}, which "
            "the memory model applies to every layer: their KV cache cannot be sized"
        )
    unread = next((k for k in UNREAD_VISION_KEYS if config.get(k) is not None), None)
    if unread is not None and config.get("vision_config") is None:
        raise ModelConfigError(
            f"{where(unread, source)} describes a vision encoder the memory model does not read "
            "(only vision_config is counted): the model cannot be sized"
        )
