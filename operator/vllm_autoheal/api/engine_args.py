"""The engine flags the operator understands and may change when healing, with the CRD's ranges for
the sizes a heal may set."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .schema import Model, cel, rule

# The CRD's ranges for the sizes a heal may set: generous, but finite, so an absurd number
# (1e30 from a forged termination message, 1.49e53 from a runaway estimate) is refused.
MAX_TOKENS = 2**24  # 16M tokens of context or batch
MAX_SEQS = 2**20  # vLLM sets no limit; a million sequences is past any GPU
MAX_GPU_BYTES = 2**44  # 16 TiB of KV cache on one GPU
MAX_OFFLOAD_GIB = 4096.0

Quantization = Literal[
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "bitsandbytes",
    "fp8",
    "fbgemm_fp8",
    "compressed-tensors",
    "modelopt",
    "modelopt_fp4",
    "gguf",
    "marlin",
    "experts_int8",
    "mxfp4",
    "ptpc_fp8",
    "torchao",
    "inc",
    "quark",
    "moe_wna16",
]
KVCacheDtype = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"]
ModelDtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


class EngineArgs(Model):
    """vLLM engine flags the operator understands and may change when healing."""

    model_config = cel(
        rule(
            "!has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens >= self.maxNumSeqs",
            "maxNumBatchedTokens must be >= maxNumSeqs (vLLM refuses to start otherwise)",
            ".maxNumBatchedTokens",
        ),
        # extraArgs' rules are generated from engine.py's flag tables (crd.py adds them).
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of each GPU's memory vLLM may use (weights, activations, KV cache)."
    )
    max_model_len: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="Longest request (prompt + output) in tokens; unset = the model's own limit.",
    )
    max_num_seqs: int | None = Field(
        None, ge=1, le=MAX_SEQS, description="Most sequences batched at once; unset = vLLM's per-GPU default."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Most tokens in one scheduler step; sets the activation peak."
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs one model copy is split across.")
    pipeline_parallel_size: int = Field(1, ge=1, le=64, description="Pipeline stages (GPUs in sequence).")
    dtype: ModelDtype | None = Field(None, description="Weight/activation dtype; unset = vLLM's auto.")
    quantization: Quantization | None = Field(
        None, description="Weight quantization method; unset = read from the checkpoint."
    )
    kv_cache_dtype: KVCacheDtype | None = Field(None, description="KV cache dtype; fp8 halves KV memory per token.")
    kv_cache_memory_bytes: int | None = Field(
        None,
        ge=1,
        le=MAX_GPU_BYTES,
        description="Fixed KV cache size per GPU in bytes; overrides gpuMemoryUtilization for KV.",
    )
    cpu_offload_gb: float | None = Field(
        None,
        ge=0,
        le=MAX_OFFLOAD_GIB,
        description="GiB of weights per GPU kept in host RAM (slower, saves GPU memory).",
    )
    enforce_eager: bool | None = Field(
        None, description="Skip CUDA-graph capture (saves its memory, costs some speed)."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Further `vllm serve` arguments, passed in order after the typed ones.",
        json_schema_extra={"items": {"type": "string", "maxLength": 512}},
    )
