"""A multimodal model's vision encoder is weighed with it: vLLM loads it beside the language model, so
a model counted without it leaves a KV cache larger than vLLM's (Qwen2.5-VL-7B: 1.26 GiB of 0.68 B
parameters), and pre-flight and the heals would size on that."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal import model_config
from vllm_autoheal.shape_reader import shape_from_config
from vllm_autoheal.vision_tower import vision_params

from samples import CONFIGS, QWEN25_VL_VISION

# vision_config as each model's config.json holds it (the fields that size the encoder)
QWEN25_VL = QWEN25_VL_VISION
QWEN2_VL = {  # Qwen/Qwen2-VL-7B-Instruct: the width is embed_dim, hidden_size the output
    "depth": 32,
    "embed_dim": 1280,
    "mlp_ratio": 4,
    "num_heads": 16,
    "in_chans": 3,
    "hidden_size": 3584,
    "hidden_act": "quick_gelu",
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
SIGLIP_SO400M = {  # google/gemma-3-4b-it's vision_config
    "hidden_size": 1152,
    "image_size": 896,
    "intermediate_size": 4304,
    "model_type": "siglip_vision_model",
    "num_attention_heads": 16,
    "num_hidden_layers": 27,
    "patch_size": 14,
}
CLIP_L_336 = {  # llava-hf/llava-1.5-7b-hf's vision_config
    "hidden_size": 1024,
    "image_size": 336,
    "intermediate_size": 4096,
    "model_type": "clip_vision_model",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "patch_size": 14,
    "projection_dim": 768,
}


@pytest.mark.parametrize(
    "vision, text_hidden, card",
    [
        (QWEN25_VL, 3584, 0.675e9),  # Qwen2.5-VL-7B: 8.29 B, of which the language model 7.62 B
        (QWEN2_VL, 3584, 0.675e9),  # the same encoder as Qwen2-VL spells it
        (SIGLIP_SO400M, 2560, 0.42e9),  # SigLIP so400m and Gemma 3's projector
        (CLIP_L_336, 4096, 0.325e9),  # CLIP ViT-L/14-336 (0.304 B) and LLaVA's two-layer projector
    ],
)
def test_a_vision_encoder_weighs_what_its_model_card_says(vision, text_hidden, card):
    assert abs(vision_params(vision, text_hidden) - card) / card < 0.03


def test_a_checked_config_keeps_the_vision_config_and_weighs_it_the_same():
    raw = json.loads((CONFIGS / "qwen3.5-0.8b.json").read_text())
    checked = model_config.check(raw)
    assert set(checked["vision_config"]) >= {"depth", "hidden_size", "intermediate_size", "out_hidden_size"}
    assert shape_from_config(checked).vision_params == shape_from_config(raw).vision_params > 0


@pytest.mark.parametrize(
    "vision, field",
    [
        ("a tower", "vision_config"),
        ({"depth": 10**9, "hidden_size": 1024}, "vision_config.depth"),
        ({"depth": 12, "hidden_size": -1}, "vision_config.hidden_size"),
        ({"depth": 12, "embed_dim": 1280, "mlp_ratio": float("inf")}, "vision_config.mlp_ratio"),
        ({"depth": 12, "hidden_size": 64, "hidden_act": "x" * 1000}, "vision_config.hidden_act"),
        ({"depth": 12, "hidden_size": 64, "deepstack_visual_indexes": list(range(10_000))}, "deepstack_visual_indexes"),
    ],
)
def test_a_hostile_vision_config_is_refused_naming_the_field(vision, field):
    raw = {**json.loads((CONFIGS / "llama-3.1-8b.json").read_text()), "vision_config": vision}
    with pytest.raises(model_config.ModelConfigError, match=field.replace(".", r"\.")):
        model_config.check(raw)


def test_a_text_model_has_no_vision_encoder():
    assert shape_from_config(json.loads((CONFIGS / "llama-3.1-8b.json").read_text())).vision_params == 0


# --- review2: what vLLM actually puts on the GPU for the encoder ---------------------------------------

GLM41V = {  # THUDM/GLM-4.1V-9B-Thinking's vision_config (Glm4vVisionConfig's defaults are these too)
    "model_type": "glm4v",
    "depth": 24,
    "hidden_size": 1536,
    "hidden_act": "silu",
    "num_heads": 12,
    "in_channels": 3,
    "image_size": 336,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 4096,
    "intermediate_size": 13696,
}


def _glm41v_as_vllm_builds_it() -> int:
    """vLLM's Glm4vVisionTransformer (glm4_1v.py): each block's MLP is mlp_hidden_dim=out_hidden_size
    (gated, SiLU), and intermediate_size is the merger's context_dim (Glm4vPatchMerger: proj, then a
    gated MLP out -> intermediate -> out), after a spatial_merge_size conv from the width to out."""
    w, out, inter, merge = 1536, 4096, 13696, 2
    blocks = 24 * (4 * w * w + 3 * w * out)
    embed = 3 * 14 * 14 * 2 * w + (336 // 14) ** 2 * w
    merger = out * out + 3 * out * inter + w * out * merge * merge
    return blocks + embed + merger  # 0.89 B


@pytest.mark.parametrize("arch", ["Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration"])
def test_glm41v_encoder_mlp_is_out_hidden_size_not_intermediate_size(arch):
    """GLM-4.1V / GLM-4.5V: vision_config.intermediate_size (13,696) is the merger's width, not the ViT's
    MLP: read as the MLP, 24 layers x 3 x 1536 x 13696 count 1.8 B parameters for a 0.89 B encoder,
    1.7 GiB per model copy that vLLM never allocates (pre-flight's KV cache and the classifier's
    'still loading' threshold both move by it)."""
    raw = {**json.loads((CONFIGS / "llama-3.1-8b.json").read_text()), "architectures": [arch], "vision_config": GLM41V}
    got = shape_from_config(model_config.check(raw)).vision_params
    want = _glm41v_as_vllm_builds_it()
    assert abs(got - want) / want < 0.03, (got / 1e9, want / 1e9)
