"""A model's shape read from its config.json (multimodal: its text_config) the way vLLM builds the model.
Pure: no I/O; only model_config's checked fields (or a config.json in tests) reach it."""

from __future__ import annotations

from typing import Any

from .model_config import derived_positions
from .model_layers import (
    config_value,
    mamba_layers_of,
    mlp_of,
    moe_layers,
    nemotron_blocks,
    shared_expert_of,
    sliding_layers,
    state_dtype_of,
    state_layers_of,
    whole,
)
from .model_shape import ModelShape
from .model_sizable import positions_scaled
from .vision_tower import vision_params

# Model types whose attention gates its output (vLLM's Qwen3NextAttention: attn_output_gate, true by
# default), doubling q_proj.
GATED_ATTENTION_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """An HF config.json (multimodal configs: their text_config) -> ModelShape."""
    cfg = dict(config.get("text_config") or {}) or config
    for key in ("quantization_config", "torch_dtype", "architectures", "tie_word_embeddings"):
        if key not in cfg and key in config:
            cfg[key] = config[key]
    hidden = int(config_value(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(config_value(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(config_value(cfg, "num_key_value_heads", default=heads) or heads)
    head_dim = int(config_value(cfg, "head_dim", default=0) or hidden // max(heads, 1))
    arch = (cfg.get("architectures") or [cfg.get("model_type", "unknown")])[0]
    experts = int(config_value(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    quant_config = cfg.get("quantization_config") or {}
    quant = quant_config.get("quant_method")
    period, offset = moe_layers(cfg)
    layers = int(config_value(cfg, "num_hidden_layers", "n_layer"))
    sliding = sliding_layers(cfg, layers)
    mlp = mlp_of(cfg, hidden)
    return ModelShape(
        architecture=arch,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=mlp[0],
        vocab=int(config_value(cfg, "vocab_size")),
        # transformers writes config.json as a diff from PretrainedConfig, whose default is True:
        # a file without the field ties its embeddings (Gemma); untied models say false (Llama).
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        qkv_bias=bool(cfg.get("attention_bias") or cfg.get("model_type", "").startswith("qwen2")),
        experts=experts,
        experts_per_token=int(config_value(cfg, "num_experts_per_tok", default=0) or 0),
        moe_intermediate=int(
            config_value(cfg, "moe_intermediate_size", default=0) or (cfg.get("intermediate_size", 0) if experts else 0)
        ),
        moe_latent=int(config_value(cfg, "moe_latent_size", default=0) or 0) if experts else 0,
        shared_intermediate=shared_expert_of(cfg),
        dense_layers=int(config_value(cfg, "first_k_dense_replace", default=0) or 0),
        kv_lora_rank=int(config_value(cfg, "kv_lora_rank", default=0) or 0),
        q_lora_rank=int(config_value(cfg, "q_lora_rank", default=0) or 0),
        qk_rope_head_dim=int(config_value(cfg, "qk_rope_head_dim", default=0) or 0),
        index_head_dim=int(config_value(cfg, "index_head_dim", default=0) or 0),
        qk_nope_head_dim=int(config_value(cfg, "qk_nope_head_dim", default=0) or 0),
        v_head_dim=int(config_value(cfg, "v_head_dim", default=0) or 0),
        sliding_window=whole(cfg.get("sliding_window")) if sliding else None,
        sliding_layers=sliding,
        state_layers=state_layers_of(cfg, layers),
        max_position_embeddings=derived_positions(cfg),
        positions_scaled=bool(cfg.get("rope_scaled")) or positions_scaled(cfg),
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        quantization=quant,
        quant_bits=whole(quant_config.get("bits")),
        quant_group=-1 if quant_config.get("group_size") == -1 else whole(quant_config.get("group_size")),
        quant_float=quant_config.get("weights_type") == "float",
        quant_act_order=quant_config.get("desc_act") is True,
        auto_kv_dtype=kv if isinstance(kv := quant_config.get("kv_cache_dtype"), str) else None,
        dense_attention=quant_config.get("dense_attention") is True,
        dense_mlp=min(max(float(share), 0.0), 1.0)
        if isinstance(share := quant_config.get("dense_mlp"), (int, float))
        else 0.0,
        dense_mlp_spares_experts=quant_config.get("dense_mlp_spares_experts") is True,
        weight_block=tuple(block) if isinstance(block := quant_config.get("weight_block_size"), list) else None,
        moe_period=period,
        moe_offset=offset,
        blocks=nemotron_blocks(cfg),
        gated_mlp=mlp[1],
        mamba_heads=int(config_value(cfg, "mamba_num_heads", "mamba_n_heads", default=0) or 0),
        mamba_head_dim=int(config_value(cfg, "mamba_head_dim", "mamba_d_head", default=0) or 0),
        mamba_groups=int(config_value(cfg, "mamba_n_groups", "n_groups", default=0) or 0),
        mamba_state=int(config_value(cfg, "ssm_state_size", "mamba_d_state", default=0) or 0),
        mamba_conv=int(config_value(cfg, "conv_kernel", "mamba_d_conv", default=0) or 0),
        mamba_layers=mamba_layers_of(cfg, layers),
        state_dtype=state_dtype_of(cfg),
        gdn_key_heads=whole(cfg.get("linear_num_key_heads")) or 0,
        gdn_value_heads=whole(cfg.get("linear_num_value_heads")) or 0,
        gdn_key_dim=whole(cfg.get("linear_key_head_dim")) or 0,
        gdn_value_dim=whole(cfg.get("linear_value_head_dim")) or 0,
        gdn_conv=whole(cfg.get("linear_conv_kernel_dim")) or 0,
        vision_params=vision_params(config.get("vision_config"), hidden, arch),
        output_gate=cfg.get("attn_output_gate", cfg.get("model_type") in GATED_ATTENTION_TYPES) is True,
    )
