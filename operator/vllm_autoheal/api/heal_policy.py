"""How, how often and how far a heal may change the engine: the HealAction table, the bounds no heal
may cross, and the quantized fallback."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from ..quant_config import GROUP_FIELD, GROUP_RULE
from .engine_args import MAX_GPU_BYTES, MAX_OFFLOAD_GIB, MAX_SEQS, MAX_TOKENS, Quantization
from .schema import NOT_A_FLAG, QUANTITY_PATTERN, Model, cel, nested, rule

MAX_ATTEMPTS = 50  # heal.maxAttempts' highest

HealMode = Literal["PatchSpec", "StatusOverrides"]
UnschedulablePolicy = Literal["Revert", "Wait"]
HealAction = Literal[
    "RaiseGpuMemoryUtilization",
    "LowerGpuMemoryUtilization",
    "LowerMaxModelLen",
    "LowerMaxNumSeqs",
    "LowerMaxNumBatchedTokens",
    "EnforceEager",
    "Fp8KvCache",
    "SetKvCacheMemoryBytes",
    "IncreaseTensorParallel",
    "CpuOffload",
    "LowerCpuOffload",
    "RaiseMemoryLimit",
    "Quantize",
]
ALL_ACTIONS: list[str] = list(get_args(HealAction))


class HealBounds(Model):
    """The limits no heal may cross; the operator gives up rather than leave them."""

    model_config = cel(
        rule(
            "!has(self.minGpuMemoryUtilization) || self.minGpuMemoryUtilization <= self.maxGpuMemoryUtilization",
            "minGpuMemoryUtilization must be <= maxGpuMemoryUtilization",
            ".minGpuMemoryUtilization",
        ),
    )
    min_gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "Lowest utilization a heal may set; unset = what the weights, activation peak and a KV cache of "
            "minMaxModelLen need when the model's shape is known, else vLLM's own figures decide."
        ),
    )
    max_gpu_memory_utilization: float = Field(0.95, gt=0, le=1, description="Highest utilization a heal may set.")
    min_max_model_len: int = Field(2048, ge=1, le=MAX_TOKENS, description="Shortest maxModelLen a heal may set.")
    min_max_num_seqs: int = Field(8, ge=1, le=MAX_SEQS, description="Fewest maxNumSeqs a heal may set.")
    min_max_num_batched_tokens: int = Field(
        512, ge=1, le=MAX_TOKENS, description=("Fewest maxNumBatchedTokens a heal may set.")
    )
    min_kv_cache_memory_bytes: int = Field(
        2**28, ge=1, le=MAX_GPU_BYTES, description=("Smallest kvCacheMemoryBytes a heal may set.")
    )
    max_cpu_offload_gb: float | None = Field(
        None,
        ge=0,
        le=MAX_OFFLOAD_GIB,
        description=(
            "Most cpuOffloadGb a heal may set (per GPU, as vLLM's flag); unset = what the container's memory limit holds on every tensor x pipeline parallel rank (vLLM pins each layer's weights rounded up to powers of two, beside its own processes), none without a limit."
        ),
    )
    max_tensor_parallel_size: int | None = Field(
        None, ge=1, le=64, description=("Largest tensorParallelSize a heal may set; unset = never raise it.")
    )
    max_memory_limit: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description=("Largest container memory limit a host-RAM heal may set; unset = never raise it."),
    )


# Methods whose checkpoints quantize the linear layers to one width that the name leaves open, and the widths
# their vLLM kernels load (over the releases served: GPTQ's exllama kernels took 2 and 3 bits, Marlin's
# take 4 and 8; vLLM's AWQ 4; bitsandbytes load_in_4bit or 8bit; compressed-tensors WNA16 and W8A8): a
# declared `bits` lets a heal weigh such a fallback before switching to it. Not GGUF (one file mixes widths
# and quantizes the embeddings too), nor the containers of several schemes; a method whose name fixes the
# width needs none.
WIDTHS = {
    "awq": (4,),
    "awq_marlin": (4, 8),
    "gptq": (2, 3, 4, 8),
    "gptq_marlin": (4, 8),
    "marlin": (4,),
    "moe_wna16": (4, 8),
    "bitsandbytes": (4, 8),
    "compressed-tensors": (4, 8),
}
# Methods whose checkpoints may hold float weights (NVFP4 and MXFP4 at 4 bits, FP8 and MXFP8 at 8): a
# one-byte scale a group and no zero point, lighter than an integer format's group of the same size.
FLOAT_WEIGHTS = ("compressed-tensors",)


class QuantizedFallback(Model):
    """A quantized checkpoint to switch to when the weights do not fit."""

    model_config = cel(
        rule("!self.allowed || (has(self.model) && has(self.method))", "allowed needs both model and method", ".model"),
        rule(
            "!has(self.bits) || (has(self.method) && ("
            + " || ".join(f"(self.method == '{m}' && self.bits in {list(w)})" for m, w in WIDTHS.items())
            + "))",
            "bits must be a width the method's kernels load: "
            + "; ".join(f"{m} {', '.join(map(str, w))}" for m, w in WIDTHS.items())
            + " (a method whose name fixes the width, or gguf, takes none)",
            ".bits",
        ),
        rule("!has(self.groupSize) || has(self.bits)", "groupSize goes with bits", ".groupSize"),
        rule("!has(self.groupSize) || self.groupSize != 0", f"groupSize must be {GROUP_RULE}", ".groupSize"),
        rule(
            "!has(self.weightType) || self.weightType == 'int' || (has(self.bits) && ("
            + " || ".join(f"self.method == '{m}'" for m in FLOAT_WEIGHTS)
            + "))",
            f"weightType float goes with bits, and only {', '.join(FLOAT_WEIGHTS)} checkpoints hold float weights "
            "of a declared width",
            ".weightType",
        ),
    )
    allowed: bool = Field(False, description="May a heal switch to the quantized model?")
    model: str | None = Field(
        None, min_length=1, max_length=512, pattern=NOT_A_FLAG, description="The quantized model (HF id or path)."
    )
    method: Quantization | None = Field(None, description="Its quantization method.")
    bits: int | None = Field(
        None,
        ge=2,
        le=8,
        description=(
            "Bits per quantized weight of the checkpoint (its config's quantization_config.bits), for a method "
            "whose name leaves the width open (awq, gptq, bitsandbytes, ...): a heal then weighs the "
            "checkpoint before switching to it, and brings the share or context its KV cache needs. "
            "Unset, such a checkpoint is tried unweighed."
        ),
    )
    group_size: int | None = Field(
        None,
        ge=GROUP_FIELD.low,
        le=GROUP_FIELD.high,
        description=(
            "Weights each quantization scale of the checkpoint serves (its quantization_config.group_size; "
            "-1: one per output channel), with bits. Unset: 128, the default of AutoGPTQ, AutoAWQ, GPTQModel "
            "and llm-compressor's W4A16; one scale per channel for compressed-tensors and bitsandbytes at 8 "
            "bits; blocks of 64 for bitsandbytes at 4. A checkpoint in other groups (gptq-4bit-32g) must say "
            "so, or its scales are under-counted."
        ),
    )
    weight_type: Literal["int", "float"] | None = Field(
        None,
        description=(
            "The number format of the checkpoint's weights (its config's config_groups weights type), with "
            "bits: float for NVFP4 and MXFP4 (a one-byte scale a group of 16 or 32, no zero point) or FP8. "
            "Unset: int. Unset groupSize for float: 16 (NVFP4) at 4 bits, one scale per channel at 8."
        ),
    )


class HealPolicy(Model):
    """How, how often and how far the operator may change the engine flags."""

    enabled: bool = Field(True, description="Heal memory crashes; false = only diagnose and report.")
    mode: HealMode = Field(
        "PatchSpec",
        description=(
            "PatchSpec: write the healed flags into spec.engine. "
            "StatusOverrides: keep spec untouched (GitOps) and deploy from status.effective."
        ),
    )
    max_attempts: int = Field(5, ge=1, le=MAX_ATTEMPTS, description="Heals allowed before giving up (HealExhausted).")
    backoff_seconds: int = Field(30, ge=0, le=3600, description="Least time between two heals.")
    unschedulable_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description=("How long a healed pod may stay Unschedulable before the heal counts as blocked (HealBlocked)."),
    )
    on_unschedulable: UnschedulablePolicy = Field(
        "Revert",
        description=(
            "When a heal's pods cannot be scheduled: Revert = go back to the last flags that scheduled and try the "
            "next remedy that needs no more resources; Wait = only report (HealBlocked condition and Event)."
        ),
    )
    allowed_actions: list[HealAction] = Field(
        default_factory=lambda: [a for a in get_args(HealAction) if a != "IncreaseTensorParallel"],
        max_length=len(ALL_ACTIONS),
        description="Changes a heal may make.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    bounds: HealBounds = nested(HealBounds, "Limits no heal may cross.")
    quantized_fallback: QuantizedFallback = nested(QuantizedFallback, "Quantized model to switch to.")
