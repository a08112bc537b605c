"""The parameters of a multimodal model's vision encoder, which vLLM loads beside the language model
(and shards over tensor parallelism as it does the rest): a ViT read from config.json's vision_config
(checked by model_config, or as a file holds it), as vLLM's encoders build it.

Each layer: attention (q, k, v and the output projection, 4 x width^2) and an MLP (up and down, or
gate, up and down where the activation is SiLU: Qwen2.5-VL's and Pixtral's gated MLP); then the
patch embedding and the position table; then the merger of Qwen-VL (the merged patches' MLP into the
language model, once more per deepstack layer of Qwen3-VL) or a projector of two layers (LLaVA).
Counted: Qwen2.5-VL-7B's 0.68 B, SigLIP-400M's 0.42 B, CLIP ViT-L/14's 0.32 B: as their model cards
give them. (memory.py leaves it out where vLLM builds it on the meta device: a text-only serve.)
"""

from __future__ import annotations

from typing import Any


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# vLLM's Glm4vVisionTransformer (glm4_1v.py: GLM-4.1V, GLM-4.5V, GLM-4.6V): each block's MLP is
# out_hidden_size wide, and intermediate_size is the merger's (a gated MLP out -> intermediate -> out,
# after a projection out -> out and a spatial_merge_size convolution from the width to out). Read as the
# blocks' MLP, GLM-4.1V's 13,696 counted 1.81 B parameters for its 0.89 B encoder.
GLM4V_ARCHITECTURES = frozenset({"Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration"})


def vision_params(vision: Any, text_hidden: int, architecture: str = "") -> int:
    """The vision encoder's parameters; 0 where the config names none (or no depth and width)."""
    if not isinstance(vision, dict):
        return 0
    depth = _whole(vision.get("depth")) or _whole(vision.get("num_hidden_layers"))
    # (Qwen2-VL names its width embed_dim, and its output hidden_size)
    width = _whole(vision.get("embed_dim")) or _whole(vision.get("hidden_size"))
    if not depth or not width:
        return 0
    ratio = vision.get("mlp_ratio")
    ratio = ratio if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 64 else 4
    glm = architecture in GLM4V_ARCHITECTURES and _whole(vision.get("out_hidden_size")) > 0
    mlp_width = (
        _whole(vision.get("out_hidden_size")) if glm else _whole(vision.get("intermediate_size")) or int(width * ratio)
    )
    gated = glm or vision.get("hidden_act") == "silu"
    layer = 4 * width * width + (3 if gated else 2) * width * mlp_width + 9 * width  # (biases and norms)
    channels = _whole(vision.get("num_channels")) or _whole(vision.get("in_channels")) or 3
    patch = _whole(vision.get("patch_size")) or 14
    frames = _whole(vision.get("temporal_patch_size")) or 1
    positions = _whole(vision.get("num_position_embeddings")) or (_whole(vision.get("image_size")) // patch) ** 2
    embedding = channels * patch * patch * frames * width + positions * width
    out = _whole(vision.get("out_hidden_size")) or (
        _whole(vision.get("hidden_size")) if _whole(vision.get("embed_dim")) else 0
    )
    merge = _whole(vision.get("spatial_merge_size"))
    if glm:  # the convolution, the projection, and the gated MLP (into the language model's width: out)
        inner = _whole(vision.get("intermediate_size")) or out
        projector = width * out * max(merge, 1) ** 2 + out * out + 3 * out * inner
    elif merge:  # Qwen-VL's merger: the merged patches' width, twice, then into the language model
        merged = width * merge * merge
        stack = vision.get("deepstack_visual_indexes")
        mergers = 1 + (len(stack) if isinstance(stack, list) else 0)
        projector = mergers * (merged * merged + merged * (out or text_hidden))
    else:  # a projector of two layers into the language model (LLaVA; Gemma 3's one is smaller)
        projector = width * text_hidden + text_hidden * text_hidden
    return depth * layer + embedding + projector
