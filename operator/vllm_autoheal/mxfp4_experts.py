"""The routed experts of an mxfp4 checkpoint (gpt-oss) as vLLM stores them on one GPU. Only they are
mxfp4: vLLM's Mxfp4Config gives every linear layer the UnquantizedLinearMethod (attention, router, shared
experts, embeddings and lm_head stay in the model dtype; the checkpoint's modules_to_not_convert says
the same). Its MoE method (Mxfp4MoEMethod.create_weights) pads the experts' widths to the tile of the
kernel it picks, and allocates a bfloat16 bias for each of their rows. Pure: no I/O.

Sources: vllm/model_executor/layers/quantization/mxfp4.py (0.10.1 to 0.1x), and since the MoE oracle
refactor vllm/model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend and
mxfp4_round_up_hidden_size_and_intermediate_size.
"""

from __future__ import annotations

import math

from .model_shape import ModelShape

# Quantization methods that quantize the FusedMoE experts alone (Mxfp4Config.get_quant_method).
EXPERTS_ONLY = frozenset({"mxfp4"})
EXPERT_BIAS_BYTES = 2  # w13_bias and w2_bias: torch.bfloat16 in create_weights, whatever the model

# CUDA compute capability (major) -> the multiples vLLM pads the experts' hidden width and per-GPU
# intermediate width to. Per backend: Marlin (hidden 256, intermediate 128), FlashInfer TRT-LLM (256,
# 256), FlashInfer CUTLASS (128, 128), Triton (intermediate 64 only). Where more than one backend can
# run, which one does depends on the release, the packages installed (triton_kernels, flashinfer) and
# environment variables the estimate does not see, so the SMALLEST padding of them is counted: an
# estimate above vLLM's figure would refuse a server that fits.
PADDING: dict[int, tuple[int, int]] = {
    # Ampere and Ada: Marlin alone (mxfp4 Marlin since 0.10.1, PR #22428; Triton and FlashInfer
    # need SM90 or later). 0.10.1 on an H100 and 0.19.0 on an A100 loaded gpt-oss with this padding.
    8: (256, 128),
    # Hopper: Marlin without triton_kernels (0.10.1's H100 log: 65.97 GiB for gpt-oss-120b), Triton
    # with it (a default dependency since PR #28788; 0.14.1 loaded 64.38 GiB, its own layout padding
    # not counted: it is triton_kernels' and off under torch < 2.8.1), FlashInfer CUTLASS on request.
    9: (1, 64),
    # Blackwell: FlashInfer TRT-LLM where flashinfer is installed, else Triton or Marlin.
    10: (1, 64),
    # RTX 50: Marlin (PR #29339) or Triton (PR #37826, and 0.10-0.11 where triton_kernels was installed).
    12: (1, 64),
}
NO_PADDING = (1, 1)  # a GPU of unknown architecture (not in the catalog; ROCm and XPU pad otherwise)


def padding(capability: tuple[int, int] | None) -> tuple[int, int]:
    """(hidden, intermediate) multiples of the experts on a GPU of this compute capability."""
    return PADDING.get(capability[0], NO_PADDING) if capability else NO_PADDING


def _round_up(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple


def expert_bytes_per_gpu(
    shape: ModelShape, layers: int, tp: int, weight_bytes: float, capability: tuple[int, int] | None
) -> float:
    """The routed experts of the first `layers` layers on one GPU: each split over TP in the
    intermediate width (FusedMoE's intermediate_size_per_partition), padded, `weight_bytes` a weight
    (mxfp4's 4 bits and a scale a block of 32), and a bfloat16 bias for each row of w13 and w2."""
    moe = shape.moe_layer_count(layers)
    if not moe:
        return 0.0
    hidden_multiple, inter_multiple = padding(capability)
    hidden = _round_up(shape.expert_width, hidden_multiple)
    inter = _round_up(math.ceil(shape.moe_intermediate / tp), inter_multiple)
    fused = 2 if shape.gated_mlp else 1  # w13 holds gate and up
    weights = shape.experts * (fused + 1) * hidden * inter * weight_bytes
    biases = shape.experts * (fused * inter + hidden) * EXPERT_BIAS_BYTES
    return moe * (weights + biases)
