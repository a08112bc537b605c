"""What a weight of a quantized linear layer weighs on the GPU, where the checkpoint's width is known: the
packed weight and each group's scale and zero point as vLLM loads them (pure; memory.py and the quantized
fallback's weighing read it)."""

from __future__ import annotations

GROUP_SCALE_BYTES = 0.031  # an fp16 scale and zero per group of 128 weights, below 8 bits
# The group a declared width is weighed at where none is declared: 128, the default of AutoGPTQ, AutoAWQ,
# GPTQModel and llm-compressor's W4A16. (Not the smallest, 32: it over-counts an 8-bit 70B by 5 GiB, and
# refuses a switch that fits; a checkpoint in groups of 32 declares them.) Where the method's common layout
# at that width has no groups: a scale per output channel or row (llm-compressor's W8A8 and FP8-dynamic,
# bitsandbytes' LLM.int8), or bitsandbytes nf4's blocks of 64.
DEFAULT_GROUP = 128
FLOAT_GROUP = 16  # NVFP4's group (MXFP4's is 32): the heavier of the float 4-bit formats' scales
DEFAULT_GROUPS = {("compressed-tensors", 8): -1, ("bitsandbytes", 8): -1, ("bitsandbytes", 4): 64}


def default_group(method: str, bits: int, float_weights: bool = False) -> int:
    """The group a fallback's declared width is weighed at where its groupSize is not declared."""
    if float_weights:
        return FLOAT_GROUP if bits < 8 else -1
    return DEFAULT_GROUPS.get((method, bits), DEFAULT_GROUP)


def quantized_bytes(
    bits: int,
    group: int | None,
    method: str | None = None,
    capability: tuple[int, int] | None = None,
    float_weights: bool = False,
    experts: bool = False,
) -> float:
    """Bytes a weight of a linear layer quantized to `bits` in groups of `group` weights: the packed weight,
    and a group's fp16 scale and zero point, which vLLM loads at any width (gptq_marlin's scales [in/group,
    out]); AWQ's zero points, asymmetric, are kept in fp16 beside the scales on a Hopper GPU (Machete's group
    zeros, capability 9.0; counted so where the GPU is not known), packed elsewhere (Marlin). Measured
    on an H100, tests/fixtures/gpu/quantized-runs/: GPTQ 4 bits in groups of 128, 0.52 B; 8 bits, 1.03 B; 4 bits
    in groups of 32, 0.57 B; AWQ 4 bits in groups of 128, 0.54 B. `group` -1: a scale per output channel, a
    negligible share; None (the config does not say): the scales of groups of 128 below 8 bits.
    `float_weights`: a float format (NVFP4, MXFP4, FP8), whose group keeps a one-byte scale (fp8 e4m3 or
    e8m0, kept so by the Marlin fp4 path) and no zero point; below 8 bits with no group, NVFP4's 16.
    `experts`: an MoE's routed experts, which the Marlin MoE kernel runs at any capability (AWQ's zero
    points stay packed: auto_awq.AutoAWQMoEMethod's w13_qzeros and w2_qzeros, int32)."""
    if float_weights:
        group = group or default_group(method or "", bits, float_weights)
        return bits / 8 + (1 / group if group > 0 else 0.0)
    if group is None:
        return bits / 8 + (GROUP_SCALE_BYTES if bits < 8 else 0.0)
    machete = capability in (None, (9, 0)) and not experts
    zero = 2 if method is not None and method.startswith("awq") and machete else bits / 8
    return bits / 8 + ((2 + zero) / group if group > 0 else 0.0)
