"""Owns the weights' share of the memory model: what a model's weights take on the busiest GPU with
given flags (quantized layers at the checkpoint's or the method's width, embeddings and norms in the
model dtype, a vision encoder where vLLM places it), and the figure the classifier weighs an unplaced
out-of-memory against. Pure: no I/O."""

from __future__ import annotations

import math

from .api import EngineArgs
from .api.heal_policy import WIDTHS
from .diagnosis.units import GIB
from .engine_defaults import encoder_placement
from .gpu_catalog import GpuSpec
from .model_shape import DTYPE_BYTES, QUANT_BYTES, ModelShape
from .mxfp4_experts import EXPERTS_ONLY, expert_bytes_per_gpu
from .quant_width import quantized_bytes

WEIGHT_BUFFERS_GIB = 0.04  # 15.00 GiB reported vs 14.958 GiB of parameters (rotary caches, buffers)


def weights_bytes_per_gpu(
    shape: ModelShape,
    quantization: str | None = None,
    dtype: str | None = None,
    tp: int = 1,
    pp: int = 1,
    encoder: str = "weights",
    capability: tuple[int, int] | None = None,
) -> int:
    """Weights on the busiest GPU: linear layers quantized, embeddings and norms in the model dtype.
    `encoder`: where vLLM puts a vision encoder (encoder_placement): "weights", split over TP as the
    rest; "data", whole on every GPU; "off", not on a GPU at all. `capability`: the GPU's compute
    capability, which sets how vLLM pads mxfp4 experts (mxfp4_experts.py); None counts no padding."""
    dense = DTYPE_BYTES.get(dtype or "auto", 2.0) if dtype not in (None, "auto") else shape.served_bytes
    quant = quantization or shape.quantization
    linear = QUANT_BYTES.get(quant, dense) if quant else dense
    per_stage = math.ceil(shape.layers / pp)
    layers = shape.stack_params(per_stage)
    experts = own_width_adjust = 0.0
    if quant and same_method(quant, shape.quantization) and shape.quant_bits:  # the checkpoint's own width
        bits, group, floats = shape.quant_bits, shape.quant_group, shape.quant_float
        linear = quantized_bytes(bits, group, quant, capability, floats)
        routed = shape.moe_layer_count(per_stage) * shape.routed_expert_params() if shape.experts else 0
        # (the Marlin MoE kernel keeps AWQ's expert zero points packed where Machete widens the dense ones)
        own_width_adjust = (
            routed * (quantized_bytes(bits, group, quant, capability, floats, experts=True) - linear) / tp
        )
    if quant and same_method(quant, shape.quantization) and (shape.dense_attention or shape.dense_mlp):
        # (layers the checkpoint leaves unquantized, in the model's dtype: attention, and a share of all the rest)
        attention = shape.attention_params() * math.ceil(shape.attention_layers / pp)
        rest = layers - attention
        if shape.dense_mlp_spares_experts and shape.experts:  # (the routed experts stay quantized)
            rest -= shape.moe_layer_count(per_stage) * shape.routed_expert_params()
        unquantized = (attention if shape.dense_attention else 0) + max(rest, 0) * shape.dense_mlp
        own_width_adjust += unquantized * (dense - linear) / tp
    if quant in EXPERTS_ONLY and shape.experts:  # only the experts quantized (and padded), the rest dense
        experts = expert_bytes_per_gpu(shape, per_stage, tp, linear, capability)
        layers -= shape.moe_layer_count(per_stage) * shape.routed_expert_params()
        linear = dense
    embed = shape.embedding_params() if pp == 1 else shape.vocab * shape.hidden  # first or last stage
    # (a vision encoder stays in the model dtype in quantized checkpoints, and sits on the first stage)
    vision = 0 if encoder == "off" else shape.vision_params * (tp if encoder == "data" else 1)
    # (but fp8 quantizing a full-width checkpoint as it loads takes the encoder's linear layers too:
    # the Qwen-VL towers get the model's quant_config, and Fp8Config skips only its ignored layers)
    online_fp8 = quant == "fp8" and quant != shape.quantization
    # (a latent MoE's projections are ReplicatedLinear, whole on every rank, and in the model's dtype: ModelOpt's
    # checkpoints leave them unquantized, nemotron_h.py says; weighed so under any method, never under)
    latent = shape.moe_layer_count(per_stage) * shape.latent_projection_params()
    return int(
        ((layers - latent) * linear + embed * dense + vision * (linear if online_fp8 else dense)) / tp
        + latent * dense
        + experts
        + own_width_adjust
        + WEIGHT_BUFFERS_GIB * GIB
    )


def same_method(flag: str | None, checkpoint: str | None) -> bool:
    """Whether --quantization names the checkpoint's own method: a config's gptq or awq runs as vLLM's
    Marlin kernels under either name (a heal's switch writes the kernel's, gptq_marlin)."""
    return (
        flag is not None
        and checkpoint is not None
        and flag.removesuffix("_marlin") == checkpoint.removesuffix("_marlin")
    )


def weights_gib_per_gpu(shape: ModelShape, engine: EngineArgs, gpu: GpuSpec | None = None) -> float:
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    encoder = encoder_placement(engine.extra_args)
    capability = gpu.capability if gpu else None
    return weights_bytes_per_gpu(shape, engine.quantization, engine.dtype, tp, pp, encoder, capability) / GIB


# Methods whose width the method alone does not say (a container for several schemes): without the
# checkpoint's bits their QUANT_BYTES is a guess, too rough to tell loading from later steps.
VARIABLE_WIDTH = frozenset(WIDTHS) | {"modelopt", "quark", "torchao", "inc"}  # (WIDTHS: those a fallback declares)
# Methods whose name fixes a weight's width, the only ones a checkpoint of which the memory model weighs
# before it is loaded (the quantized fallback): any other's is the file's own choice (GGUF's Q2_K to Q8_0,
# GPTQ's and AWQ's 4 or 8 bits, bitsandbytes' 4 or 8, a container's scheme).
FIXED_WIDTH = frozenset({"fp8", "fbgemm_fp8", "ptpc_fp8", "experts_int8", "mxfp4", "modelopt_fp4"})
# Words of extra flags that move weights off a GPU or spread them in ways this model does not
# count (data/expert parallel, offload, another checkpoint format or quantization).
WEIGHT_PLACEMENT_WORDS = ("parallel", "expert", "offload", "quantiz", "load-format", "load_format", "dtype")


def weights_gib_to_diagnose(shape: ModelShape, engine: EngineArgs) -> float | None:
    """The weights these flags put on the busiest GPU, for the classifier to weigh an unplaced
    out-of-memory against (a process holding less had not finished loading them); None where the
    flags may place the weights otherwise than this model counts: an overestimate would call a
    later step's OOM a loading one."""
    if engine.cpu_offload_gb or any(w in arg.lower() for arg in engine.extra_args for w in WEIGHT_PLACEMENT_WORDS):
        return None
    if shape.vision_params and engine.tensor_parallel_size > 1 and encoder_placement(engine.extra_args) == "data":
        return None  # (vLLM falls back to splitting an encoder without data-parallel support: either count)
    quant = engine.quantization or shape.quantization
    if quant in VARIABLE_WIDTH and not (same_method(quant, shape.quantization) and shape.quant_bits):
        return None
    if shape.dense_mlp and same_method(quant, shape.quantization):
        return None  # (a part of the MLP the checkpoint skips, weighed as the whole MLP: an over-count)
    return weights_gib_per_gpu(shape, engine)
