"""Owns the memory model of vLLM: what a model needs on a GPU, and what fits.

Budget, as vLLM (V1) computes it at start-up:
    requested = total x gpu_memory_utilization            (must be <= free at start)
    kv_cache  = requested - weights - peak_activation - non_torch
    tokens    = floor(kv_cache / (kv_bytes_per_token x block)) x block
and one request of max_model_len must fit in `tokens`. CUDA graphs are captured
outside that budget (about 1 GiB more for a dense 8B model on an H200).
Each constant below names where it came from. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .api import EngineArgs
from .diagnosis.units import GIB
from .gpu_catalog import GpuSpec

BLOCK_SIZE = 16  # vLLM's default KV block (measured: KV tokens = blocks x 16)

# Calibrated on vLLM 0.25.0, Llama-3.1-8B, one H200 (tests/fixtures/gpu/ground-truth-cases.jsonl):
NON_TORCH_GIB_TP1 = 0.22  # "non_torch" in every profiled run
NON_TORCH_GIB_TPN = 0.6  # TP>1 adds NCCL buffers: llm-d's planner constant (not measured here)
CUDA_CONTEXT_GIB = 0.51  # 139.80 total - 139.29 free seen by the engine on an idle GPU
CUDAGRAPH_GIB = 0.99  # "cudagraph_actual" of every graph-mode run
# Peak activation of the profiling run grows linearly with max_num_batched_tokens:
# 0.24 GiB at 2048, 1.72 at 16384, 6.78 at 65536 -> 1.0294e-4 GiB/token + 0.03 GiB.
# Per token that is 1.686 x (hidden + 2 x intermediate) x 2 bytes for that model; other
# shapes scale by their own (hidden + 2 x intermediate / TP).
ACTIVATION_FACTOR = 1.686
ACTIVATION_BASE_GIB = 0.03
WEIGHT_BUFFERS_GIB = 0.04  # 15.00 GiB reported vs 14.958 GiB of parameters (rotary caches, buffers)

DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "auto": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp8_inc": 1.0,
    "fp8_ds_mla": 1.0,
    "int8": 1.0,
}
GROUP_SCALE_BYTES = 0.031  # an fp16 scale and zero per group of 128 weights, below 8 bits
# Bytes per parameter of quantized linear layers, group scales included (4 bits + fp16
# scale/zero per group of 128 = 4.25 bits; bitsandbytes nf4 keeps blockwise absmax: 4.13).
QUANT_BYTES = {
    "awq": 0.531,
    "awq_marlin": 0.531,
    "gptq": 0.531,
    "gptq_marlin": 0.531,
    "marlin": 0.531,
    "bitsandbytes": 0.516,
    "moe_wna16": 0.531,
    "gguf": 0.563,
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "ptpc_fp8": 1.0,
    "modelopt": 1.0,
    "compressed-tensors": 1.0,
    "experts_int8": 1.0,
    "mxfp4": 0.531,
    "modelopt_fp4": 0.563,
    "torchao": 1.0,
    "inc": 0.531,
    "quark": 1.0,
}


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    dense_layers: int = 0  # leading dense layers in an MoE (DeepSeek first_k_dense_replace)
    kv_lora_rank: int = 0  # multi-latent attention (DeepSeek-V2/V3)
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int | None = None
    max_position_embeddings: int = 0
    dtype: str = "bfloat16"
    quantization: str | None = None
    quant_bits: int | None = None  # bits per quantized weight, where the checkpoint's config says
    # MoE in every `moe_period`-th layer only, at index % moe_period == moe_offset (Llama 4's
    # interleave_moe_layer_step, Qwen-MoE's decoder_sparse_step, Jamba's expert_layer_period)
    moe_period: int = 1
    moe_offset: int = 0

    @property
    def served_bytes(self) -> float:
        """Bytes of a weight (or KV element) under --dtype auto: vLLM downcasts a float32
        checkpoint to 16 bits (config/model.py _resolve_auto_dtype; float16 before 0.6)."""
        return min(DTYPE_BYTES.get(self.dtype, 2.0), 2.0)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def attention_params(self) -> int:
        h = self.hidden
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (
                h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.heads * qk
                if self.q_lora_rank
                else h * self.heads * qk
            )
            kv = (
                h * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank
                + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            )
            return q + kv + self.heads * self.v_head_dim * h
        qkv = h * (self.heads + 2 * self.kv_heads) * self.head_dim
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return qkv + bias + self.heads * self.head_dim * h

    def mlp_params(self, moe: bool) -> int:
        h = self.hidden
        if not moe:
            return 3 * h * self.intermediate
        shared = 3 * h * self.shared_intermediate + (h if self.shared_intermediate else 0)
        return self.experts * 3 * h * self.moe_intermediate + h * self.experts + shared

    def layer_params(self, index: int) -> int:
        moe = self.experts > 0 and index >= self.dense_layers and index % self.moe_period == self.moe_offset
        return self._layer(moe=moe)

    def _layer(self, moe: bool) -> int:
        return self.attention_params() + self.mlp_params(moe) + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def stack_params(self, layers: int) -> int:
        """Parameters of the first `layers` layers: counted, never iterated, so the work does not
        grow with a (possibly hostile) layer count."""
        moe_layers = _congruent(self.dense_layers, layers, self.moe_period, self.moe_offset) if self.experts else 0
        return (layers - moe_layers) * self._layer(moe=False) + moe_layers * self._layer(moe=True)

    def params(self) -> int:
        return self.embedding_params() + self.stack_params(self.layers) + self.hidden

    def kv_bytes_per_token(self, kv_dtype: str | None = None, tp: int = 1, pp: int = 1) -> int:
        """K and V of one token on one GPU (MLA keeps one compressed latent, replicated per rank)."""
        width = DTYPE_BYTES.get(kv_dtype or "auto", 2.0) if kv_dtype not in (None, "auto") else self.served_bytes
        layers = math.ceil(self.layers / pp)
        if self.is_mla:
            return int(layers * (self.kv_lora_rank + self.qk_rope_head_dim) * width)
        kv_heads = max(1, math.ceil(self.kv_heads / tp))
        return int(2 * layers * kv_heads * self.head_dim * width)


def _congruent(low: int, high: int, period: int, offset: int) -> int:
    """How many indices in [low, high) are offset modulo period: counted, not iterated."""

    def below(x: int) -> int:
        return (x - offset + period - 1) // period if x > offset else 0

    return max(0, below(high) - below(low))


def _moe_layers(cfg: dict[str, Any]) -> tuple[int, int]:
    """(period, offset) of the MoE layers: vLLM's llama4.py and qwen2_moe.py make layer i MoE
    when (i + 1) % step == 0; jamba.py where i % expert_layer_period == expert_layer_offset."""
    step = _whole(_get(cfg, "interleave_moe_layer_step", "decoder_sparse_step", default=1)) or 1
    if step > 1:
        return step, step - 1
    period = max(1, _whole(_get(cfg, "expert_layer_period", default=1)) or 1)
    return period, (_whole(_get(cfg, "expert_layer_offset", default=0)) or 0) % period


def _whole(value: Any) -> int | None:
    """A positive whole number from an unchecked config value, else None (model_config.check has
    already refused it on every path from a VLLMService or the CLI)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _get(cfg: dict[str, Any], *names: str, default: Any = 0) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """An HF config.json (multimodal configs: their text_config) -> ModelShape."""
    cfg = dict(config.get("text_config") or {}) or config
    for key in ("quantization_config", "torch_dtype", "architectures", "tie_word_embeddings"):
        if key not in cfg and key in config:
            cfg[key] = config[key]
    hidden = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads) or heads)
    head_dim = int(_get(cfg, "head_dim", default=0) or hidden // max(heads, 1))
    arch = (cfg.get("architectures") or [cfg.get("model_type", "unknown")])[0]
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    quant_config = cfg.get("quantization_config") or {}
    quant = quant_config.get("quant_method")
    period, offset = _moe_layers(cfg)
    return ModelShape(
        architecture=arch,
        layers=int(_get(cfg, "num_hidden_layers", "n_layer")),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=int(_get(cfg, "intermediate_size", "ffn_dim")),
        vocab=int(_get(cfg, "vocab_size")),
        # transformers writes config.json as a diff from PretrainedConfig, whose default is True:
        # a file without the field ties its embeddings (Gemma); untied models say false (Llama).
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        qkv_bias=bool(cfg.get("attention_bias") or cfg.get("model_type", "").startswith("qwen2")),
        experts=experts,
        experts_per_token=int(_get(cfg, "num_experts_per_tok", default=0) or 0),
        moe_intermediate=int(
            _get(cfg, "moe_intermediate_size", default=0) or (cfg.get("intermediate_size", 0) if experts else 0)
        ),
        shared_intermediate=int(
            _get(cfg, "shared_expert_intermediate_size", default=0)
            or int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_intermediate_size") or 0)
        ),
        dense_layers=int(_get(cfg, "first_k_dense_replace", default=0) or 0),
        kv_lora_rank=int(_get(cfg, "kv_lora_rank", default=0) or 0),
        q_lora_rank=int(_get(cfg, "q_lora_rank", default=0) or 0),
        qk_rope_head_dim=int(_get(cfg, "qk_rope_head_dim", default=0) or 0),
        qk_nope_head_dim=int(_get(cfg, "qk_nope_head_dim", default=0) or 0),
        v_head_dim=int(_get(cfg, "v_head_dim", default=0) or 0),
        sliding_window=cfg.get("sliding_window"),
        max_position_embeddings=int(_get(cfg, "max_position_embeddings", default=0) or 0),
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        quantization=quant,
        quant_bits=_whole(quant_config.get("bits")),
        moe_period=period,
        moe_offset=offset,
    )


def weights_bytes_per_gpu(
    shape: ModelShape, quantization: str | None = None, dtype: str | None = None, tp: int = 1, pp: int = 1
) -> int:
    """Weights on the busiest GPU: linear layers quantized, embeddings and norms in the model dtype."""
    dense = DTYPE_BYTES.get(dtype or "auto", 2.0) if dtype not in (None, "auto") else shape.served_bytes
    quant = quantization or shape.quantization
    linear = QUANT_BYTES.get(quant, dense) if quant else dense
    if quant and quant == shape.quantization and shape.quant_bits:  # the checkpoint's own width
        linear = shape.quant_bits / 8 + (GROUP_SCALE_BYTES if shape.quant_bits < 8 else 0.0)
    per_stage = math.ceil(shape.layers / pp)
    layers = shape.stack_params(per_stage)
    embed = shape.embedding_params() if pp == 1 else shape.vocab * shape.hidden  # first or last stage
    return int((layers * linear + embed * dense) / tp + WEIGHT_BUFFERS_GIB * GIB)


def weights_gib_per_gpu(shape: ModelShape, engine: EngineArgs) -> float:
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    return weights_bytes_per_gpu(shape, engine.quantization, engine.dtype, tp, pp) / GIB


# Methods whose width the method alone does not say (a container for several schemes): without the
# checkpoint's bits their QUANT_BYTES is a guess, too rough to tell loading from later steps.
VARIABLE_WIDTH = frozenset({"compressed-tensors", "modelopt", "quark", "torchao", "inc", "gptq", "awq"})
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
    quant = engine.quantization or shape.quantization
    if quant in VARIABLE_WIDTH and not (quant == shape.quantization and shape.quant_bits):
        return None
    return weights_gib_per_gpu(shape, engine)


def default_max_num_batched_tokens(gpu_total_gib: float, entrypoint: str = "server") -> int:
    """vLLM's per-GPU defaults (arg_utils, 0.2x-0.33): the OpenAI server and the LLM class differ."""
    if entrypoint == "llm":
        return 16384 if gpu_total_gib >= 70 else 8192
    return 16384 if gpu_total_gib >= 160 else 8192 if gpu_total_gib >= 70 else 2048


def default_max_num_seqs(gpu_total_gib: float) -> int:
    return 1024 if gpu_total_gib >= 70 else 256


def activation_bytes(shape: ModelShape, max_num_batched_tokens: int, tp: int = 1) -> int:
    inter = max(
        shape.intermediate if shape.experts == 0 or shape.dense_layers else 0,
        shape.experts_per_token * shape.moe_intermediate,
    )
    per_token = ACTIVATION_FACTOR * (shape.hidden + 2 * inter / tp) * 2
    return int(per_token * max_num_batched_tokens + ACTIVATION_BASE_GIB * GIB)


@dataclass
class Estimate:
    gpu_total_gib: float
    gpu_free_gib: float
    requested_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cudagraph_gib: float
    kv_cache_gib: float
    kv_bytes_per_token: int
    kv_tokens: int
    max_model_len: int
    max_model_len_fit: int
    max_concurrency: float
    max_num_batched_tokens: int
    fits: bool
    failure: str | None = None  # the cause vLLM would report, when it does not fit
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _tokens(kv_bytes: float, per_token: int, block: int = BLOCK_SIZE) -> int:
    if kv_bytes <= 0 or per_token <= 0:
        return 0
    return int(kv_bytes // (per_token * block)) * block


def estimate(
    shape: ModelShape, engine: EngineArgs, gpu: GpuSpec, free_gib: float | None = None, entrypoint: str = "server"
) -> Estimate:
    """What vLLM will do with these flags on this GPU. `free_gib`: free before vLLM starts
    (default: all of it); the engine's own CUDA context takes CUDA_CONTEXT_GIB of that."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    total = gpu.memory_gib
    free = (total if free_gib is None else free_gib) - CUDA_CONTEXT_GIB
    mbt = engine.max_num_batched_tokens or default_max_num_batched_tokens(total, entrypoint)
    max_len = engine.max_model_len or shape.max_position_embeddings or 4096
    weights = weights_gib_per_gpu(shape, engine)
    act = activation_bytes(shape, mbt, tp) / GIB
    non_torch = NON_TORCH_GIB_TP1 if tp * pp == 1 else NON_TORCH_GIB_TPN
    graphs = 0.0 if engine.enforce_eager else CUDAGRAPH_GIB
    per_token = shape.kv_bytes_per_token(engine.kv_cache_dtype, tp, pp)
    reasons: list[str] = []
    failure = None
    if engine.kv_cache_memory_bytes:
        requested = weights + act + non_torch + engine.kv_cache_memory_bytes / GIB
        kv = engine.kv_cache_memory_bytes / GIB
        if requested + graphs > free:
            failure = "gpu_util_exceeds_free"
            reasons.append(
                f"kv_cache_memory_bytes {kv:.2f} GiB + weights and overheads {requested - kv:.2f} GiB "
                f"exceed the {free:.2f} GiB free"
            )
    else:
        requested = math.ceil(total * engine.gpu_memory_utilization * GIB) / GIB
        kv = requested - weights - act - non_torch
        if requested > free:
            failure = "gpu_util_exceeds_free"
            reasons.append(
                f"gpu_memory_utilization {engine.gpu_memory_utilization} asks for {requested:.2f} GiB "
                f"but only {free:.2f} GiB is free"
            )
    if failure is None and weights > free:
        failure = "weights_load_oom"
        reasons.append(f"weights need {weights:.2f} GiB per GPU, only {free:.2f} GiB is free")
    tokens = _tokens(kv * GIB, per_token)
    fit_len = tokens
    if failure is None and tokens <= 0:
        failure = "kv_cache_insufficient"
        reasons.append(
            f"no memory left for the KV cache: {requested:.2f} GiB requested, weights {weights:.2f} + "
            f"activation {act:.2f} + non-torch {non_torch:.2f} GiB"
        )
    elif failure is None and tokens < max_len:
        failure = "kv_cache_insufficient"
        reasons.append(f"KV cache {kv:.2f} GiB holds {tokens:,} tokens < max_model_len {max_len:,}")
    if failure is None and not engine.enforce_eager and requested + graphs > free:
        failure = "cudagraph_capture_oom"
        reasons.append(
            f"CUDA graphs need about {graphs:.2f} GiB beyond the {requested:.2f} GiB requested; {free:.2f} GiB is free"
        )
    return Estimate(
        gpu_total_gib=total,
        gpu_free_gib=free + CUDA_CONTEXT_GIB,
        requested_gib=requested,
        weights_gib=weights,
        activation_gib=act,
        non_torch_gib=non_torch,
        cudagraph_gib=graphs,
        kv_cache_gib=max(kv, 0.0),
        kv_bytes_per_token=per_token,
        kv_tokens=tokens,
        max_model_len=max_len,
        max_model_len_fit=fit_len,
        max_concurrency=round(tokens / max_len, 2) if max_len else 0.0,
        max_num_batched_tokens=mbt,
        fits=failure is None,
        failure=failure,
        reasons=reasons,
    )
