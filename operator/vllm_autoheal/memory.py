"""Owns the memory model of vLLM: what a model needs on a GPU, and what fits.

Budget, as vLLM (V1) computes it at start-up:
    requested = total x gpu_memory_utilization            (must be <= free at start)
    kv_cache  = requested - weights - peak_activation - non_torch
    tokens    = floor(kv_cache / (kv_bytes_per_token x block)) x block
and one request of max_model_len must fit in `tokens`. CUDA graphs (about 1 GiB for a dense 8B
model on an H200) are captured outside that budget, except where the release reserves its estimate
of them inside it (the V1 runner from 0.20, every runner from 0.29: vllm_release.graphs_in_budget),
taking it off the KV cache. 0.34's extensible cache refuses no budget above the free memory, and holds
less than its budget after warm-up, which it checks again (extensible_kv.py): the memory model
checks that.
Each constant below names where it came from. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .api import EngineArgs
from .diagnosis.units import GIB
from .engine_defaults import (
    captures_graphs,
    default_max_num_batched_tokens,
    default_max_num_seqs,
    pool_foreseen,
    state_pages,
    steps_in_flight,
)
from .extensible_kv import extensible_kv_cache, held_after_warmup_gib
from .flag_tokens import switched
from .gpu_catalog import GpuSpec
from .lora_slots import lora_slots_gib
from .model_runner import graphs_reserved, offload_ignored, release_sampler
from .model_shape import ModelShape, layer_group, padded_layers
from .model_weights import WEIGHT_BUFFERS_GIB, weights_gib_per_gpu
from .offload_pinned import offloaded_gib
from .sampler_peak import sampler_peak_bytes
from .vllm_release import Release, facts

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


def activation_bytes(
    shape: ModelShape, max_num_batched_tokens: int, tp: int = 1, max_num_seqs: int = 0, sampler: str = "v2"
) -> int:
    """The profile run's peak: the forward pass over max_num_batched_tokens, or the dummy sampler run
    after it over max_num_seqs rows of the vocabulary, whichever holds more (sampler_peak.py; the
    sampler outweighs the forward pass for MoE models of a narrow hidden size and a wide vocabulary)."""
    inter = max(
        shape.intermediate if shape.experts == 0 or shape.dense_layers else 0,
        shape.experts_per_token * shape.moe_intermediate,
    )
    per_token = ACTIVATION_FACTOR * (shape.hidden + 2 * inter / tp) * 2
    forward = per_token * max_num_batched_tokens
    sampling = sampler_peak_bytes(shape.vocab, shape.hidden, max_num_seqs, max_num_batched_tokens, sampler)
    return int(max(forward, sampling if max_num_seqs else 0) + ACTIVATION_BASE_GIB * GIB)


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
    kv_needed_gib: float  # what one request of max_model_len holds, as vLLM's check counts it
    max_concurrency: float
    max_num_batched_tokens: int
    fits: bool
    failure: str | None = None  # the cause vLLM would report, when it does not fit
    max_num_seqs: int = 0  # the flag, else vLLM's default for this GPU
    state_blocks: int | None = None  # a Mamba hybrid's pool blocks: at most this many sequences run
    reasons: list[str] = field(default_factory=list)
    graphs_in_budget: bool = False  # the release reserves the CUDA graphs inside the budget (off the cache)
    # what the budget leaves the cache, unclamped (vLLM's budget line; for 0.34's extensible cache, what
    # it holds after warm-up, which its second check reads: extensible_kv.py)
    kv_budget_gib: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _tokens(kv_bytes: float, per_token: int, block: int = BLOCK_SIZE) -> int:
    if kv_bytes <= 0 or per_token <= 0:
        return 0
    return int(kv_bytes // (per_token * block)) * block


@dataclass(frozen=True)
class KvNeed:
    """What one request holds in the KV cache, as vLLM sizes it before it starts (v1/core/
    kv_cache_utils.py check_enough_kv_cache_memory, the sum of each layer spec's
    max_memory_usage_bytes): a full-attention layer keeps every token, in whole blocks; a sliding
    window's layer keeps the window less one plus the tokens in flight (one scheduler step; from
    vLLM 0.26 every concurrent batch's, engine_defaults.steps_in_flight), and one block more, since a window need not start at a block's edge (SlidingWindowSpec)."""

    full_per_token: float  # bytes per token of the full-attention layers, on one GPU
    windowed_per_token: float  # and of the sliding-window layers
    window: int
    in_flight: int  # max_num_batched_tokens, times the steps in flight the release counts
    block: int = BLOCK_SIZE  # tokens a block: a Mamba hybrid's attention block is widened to its state page
    state_bytes: float = 0.0  # a Mamba hybrid's state pages, one per Mamba layer, whatever the length
    pool_block_bytes: float = 0.0  # a Mamba hybrid's pool block: a page for each layer of a group

    def bytes_for(self, length: int) -> float:
        need = self.full_per_token * math.ceil(length / self.block) * self.block + self.state_bytes
        if self.windowed_per_token:
            held = min(self.window - 1 + self.in_flight, length)
            need += self.windowed_per_token * (math.ceil(held / self.block) + 1) * self.block
        return need

    def longest(self, kv_bytes: float, limit: int) -> int:
        """The longest request (at most `limit` tokens) whose cache fits in kv_bytes: vLLM's
        "estimated maximum model length" (a binary search there too)."""
        if kv_bytes <= 0 or self.bytes_for(1) > kv_bytes:
            return 0
        low, high = 1, max(limit, 1)
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self.bytes_for(mid) <= kv_bytes else (low, mid - 1)
        return low


def kv_cache_dtype(engine: EngineArgs, shape: ModelShape | None = None) -> str | None:
    """The cache's element type: kv_cache_dtype auto is the cache the checkpoint's config names (vLLM's
    resolve_kv_cache_dtype_string, whatever --dtype says), else the dtype the model is served in (vLLM's
    kv_cache_dtype_str_to_dtype), so --dtype float32 keeps 4 bytes an element."""
    if engine.kv_cache_dtype not in (None, "auto"):
        return engine.kv_cache_dtype
    return shape.auto_kv_dtype if shape is not None and shape.auto_kv_dtype else engine.dtype


def kv_need(
    shape: ModelShape, engine: EngineArgs, max_num_batched_tokens: int, release: Release | None = None
) -> KvNeed:
    """`release`: the vLLM release that sizes it (vllm_release.py); None: one scheduler step in flight
    and windows kept, as from 0.9.1 to 0.25."""
    per_token = shape.kv_bytes_per_token(
        kv_cache_dtype(engine, shape), engine.tensor_parallel_size, engine.pipeline_parallel_size
    )
    full, windowed = shape.kv_layers()
    row = facts(release)
    window = row.window if row else None
    # (vLLM also turns the hybrid manager off for KV connectors without support for it; that is not
    # assumed here, as counting the window in full would cut contexts that fit)
    if full and windowed and switched(engine.extra_args, "--disable-hybrid-kv-cache-manager"):
        # vLLM then counts windowed layers as full ones (unify_hybrid_kv_cache_specs)
        full, windowed = shape.attention_layers, 0
    pp = engine.pipeline_parallel_size
    per_layer = per_token / max(shape.attention_layers, 1)  # (per_token is one stage's: spread over all)
    layer_bytes = per_token / max(math.ceil(shape.attention_layers / pp), 1)  # one attending layer's
    block, state_bytes, pool_block = BLOCK_SIZE, 0.0, 0.0
    page = shape.state_page_bytes(engine.tensor_parallel_size, engine.dtype)
    if page and per_layer:
        # vLLM widens the attention block until its page holds a state page, then pads the state page
        # to it (Platform.update_block_size_for_backend); each Mamba layer keeps one for a request.
        block = BLOCK_SIZE * math.ceil(page / (BLOCK_SIZE * layer_bytes))
        mamba = math.ceil(shape.mamba_layers / pp)
        state_bytes = padded_layers(mamba, full + windowed) * block * layer_bytes * state_pages(engine.extra_args)
        # vLLM groups the layers of all stages, and a GPU's pool block holds a page for each of its
        # stage's layers of a group (_project_kv_cache_groups_to_worker; a group's layers interleave
        # over the stages): at least a pp-th of the group, so a shortage counted is one vLLM has.
        group = layer_group(shape.mamba_layers, full + windowed)
        pool_block = math.ceil(group / pp) * block * layer_bytes
    return KvNeed(
        per_layer * full,
        per_layer * windowed,
        shape.sliding_window or 0,
        max_num_batched_tokens
        * steps_in_flight(window, engine.extra_args, engine.pipeline_parallel_size, shape.architecture),
        block,
        state_bytes,
        pool_block,
    )


def state_blocks(need: KvNeed, kv_bytes: float) -> int | None:
    """A Mamba hybrid's pool blocks (vLLM's num_blocks: the cache over a block's pages); each running
    sequence holds one for its state. None for a model without state pages."""
    if not need.pool_block_bytes:
        return None
    return max(int(kv_bytes // need.pool_block_bytes), 0)


def _concurrency(tokens: int, kv_bytes: float, need: KvNeed, max_len: int) -> float:
    """Requests of max_model_len the cache holds at once, as vLLM logs it ("Maximum concurrency"); a
    hybrid's: the pool's blocks over the blocks one request holds (its attention blocks and a state
    block a group of Mamba layers)."""
    if not max_len or kv_bytes <= 0:
        return 0.0
    if need.pool_block_bytes:
        return round((state_blocks(need, kv_bytes) or 0) / (need.bytes_for(max_len) / need.pool_block_bytes), 2)
    return round(kv_bytes / need.bytes_for(max_len) if need.windowed_per_token else tokens / max_len, 2)


def graphs_beside_budget(shape: ModelShape | None, engine: EngineArgs, release: Release | None) -> float:
    """GiB the CUDA graphs take beside the budget: none where vLLM captures none, or where the release
    reserves them inside it (model_runner.graphs_reserved)."""
    if not captures_graphs(engine.enforce_eager, engine.extra_args) or graphs_reserved(shape, engine, release):
        return 0.0
    return CUDAGRAPH_GIB


def estimate(
    shape: ModelShape,
    engine: EngineArgs,
    gpu: GpuSpec,
    free_gib: float | None = None,
    entrypoint: str = "server",
    release: Release | None = None,
) -> Estimate:
    """What vLLM will do with these flags on this GPU. `free_gib`: free before vLLM starts
    (default: all of it); the engine's own CUDA context takes CUDA_CONTEXT_GIB of that. `release`: the
    vLLM release that runs (vllm_release.py): its batch defaults, dummy sampler and windowed layers;
    None (or one the table does not describe): 0.28-0.34's defaults, the sampler's floor, one step."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    total = gpu.memory_gib
    free = (total if free_gib is None else free_gib) - CUDA_CONTEXT_GIB
    row = facts(release)
    tier = row.batch if row else "160gib"
    mbt = engine.max_num_batched_tokens or default_max_num_batched_tokens(total, entrypoint, gpu.name, tier)
    max_len = engine.max_model_len or shape.max_position_embeddings or 2048  # (vLLM's where the config names none)
    # (vLLM moves up to cpu_offload_gb of each GPU's weights to pinned host memory as it loads them; not the V2
    # runner of 0.22-0.27, which ignores the flag)
    offload = 0.0 if offload_ignored(shape, release, engine.extra_args) else offloaded_gib(shape, engine)
    weights = max(weights_gib_per_gpu(shape, engine, gpu) - offload, WEIGHT_BUFFERS_GIB)
    weights += lora_slots_gib(shape, engine) or 0.0  # (allocated with the weights; None: not laid out, preflight's)
    seqs = engine.max_num_seqs or default_max_num_seqs(total, gpu.name, engine.extra_args, tier)
    act = activation_bytes(shape, mbt, tp, seqs, release_sampler(shape, release, engine.extra_args)) / GIB
    non_torch = NON_TORCH_GIB_TP1 if tp * pp == 1 else NON_TORCH_GIB_TPN
    graphs = CUDAGRAPH_GIB if captures_graphs(engine.enforce_eager, engine.extra_args) else 0.0
    # (where the release reserves them, the graphs come off the KV budget and are captured inside it)
    reserved = graphs_reserved(shape, engine, release)
    per_token = shape.kv_bytes_per_token(kv_cache_dtype(engine, shape), tp, pp)
    reasons: list[str] = []
    failure = None
    share = math.ceil(total * engine.gpu_memory_utilization * GIB) / GIB
    if engine.kv_cache_memory_bytes:
        requested = weights + act + non_torch + engine.kv_cache_memory_bytes / GIB
        kv = engine.kv_cache_memory_bytes / GIB
        if requested + graphs > free:
            failure = "gpu_util_exceeds_free"
            reasons.append(
                f"kv_cache_memory_bytes {kv:.2f} GiB + weights and overheads {requested - kv:.2f} GiB "
                f"exceed the {free:.2f} GiB free"
            )
        elif share > free:  # (vLLM checks the share against what is free first, whatever the KV size)
            failure = "gpu_util_exceeds_free"
            reasons.append(
                f"gpu_memory_utilization {engine.gpu_memory_utilization} asks for {share:.2f} GiB "
                f"but only {free:.2f} GiB is free (checked even where the KV size is given)"
            )
    else:
        requested = share
        kv = requested - weights - act - non_torch - (graphs if reserved else 0.0)
        if extensible_kv_cache(engine, release):  # (a budget above the free memory is no refusal there)
            kv = held_after_warmup_gib(release, requested, free, weights + non_torch, act, graphs)
        elif requested > free:
            failure = "gpu_util_exceeds_free"
            reasons.append(
                f"gpu_memory_utilization {engine.gpu_memory_utilization} asks for {requested:.2f} GiB "
                f"but only {free:.2f} GiB is free"
            )
    if failure is None and weights > free:
        failure = "weights_load_oom"
        reasons.append(f"weights need {weights:.2f} GiB per GPU, only {free:.2f} GiB is free")
    tokens = _tokens(kv * GIB, per_token)
    need = kv_need(shape, engine, mbt, release)
    # (a request longer than the cache holds in full-attention tokens never fits: that is the limit;
    # a hybrid's request also holds its state pages, in blocks widened to them)
    counted = need.windowed_per_token or need.state_bytes
    fit_len = need.longest(kv * GIB, max(tokens, max_len)) if counted else tokens
    if failure is None and tokens <= 0:
        failure = "kv_cache_insufficient"
        reasons.append(
            f"no memory left for the KV cache: {requested:.2f} GiB requested, weights {weights:.2f} + "
            f"activation {act:.2f} + non-torch {non_torch:.2f} GiB"
        )
    elif failure is None and fit_len < max_len:
        failure = "kv_cache_insufficient"
        reasons.append(
            f"KV cache {kv:.2f} GiB holds one request of {fit_len:,} tokens < max_model_len {max_len:,}"
            + f" ({need.bytes_for(max_len) / GIB:.2f} GiB needed)"  # (vLLM's own figure in its refusal)
        )
    blocks = state_blocks(need, kv * GIB) if pool_foreseen(engine.extra_args) else None
    if failure is None and blocks is not None and not engine.enforce_eager and seqs > blocks:
        # vLLM refuses to capture full CUDA graphs (its default) for more sequences than state blocks
        failure = "kv_cache_insufficient"
        reasons.append(
            f"KV cache {kv:.2f} GiB holds {blocks:,} Mamba state blocks, one a running sequence, "
            f"< max_num_seqs {seqs:,}"
        )
    outside = graphs_beside_budget(shape, engine, release)
    if failure is None and outside and requested + outside > free:
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
        graphs_in_budget=reserved,
        kv_budget_gib=kv,
        kv_cache_gib=max(kv, 0.0),
        kv_bytes_per_token=per_token,
        kv_tokens=tokens,
        max_model_len=max_len,
        max_model_len_fit=fit_len,
        kv_needed_gib=need.bytes_for(max_len) / GIB,
        max_concurrency=_concurrency(tokens, kv * GIB, need, max_len),
        max_num_batched_tokens=mbt,
        fits=failure is None,
        failure=failure,
        reasons=reasons,
        max_num_seqs=seqs,
        state_blocks=blocks,
    )
