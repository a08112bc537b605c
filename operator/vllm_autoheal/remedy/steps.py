"""The steps a heal plan is made of: each sizes one change for a crash from vLLM's figures or the
memory model, or returns None when it does not apply. Which step serves which cause is plan.py's PLANS."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..diagnosis.units import GIB
from ..extensible_kv import extensible_kv_cache
from ..flag_tokens import switched
from ..memory import (
    CUDA_CONTEXT_GIB,
)
from ..offload_pinned import pinned_gib
from .kv_steps import round_util
from .model import Context, Remedy, Step
from .share_steps import estimate_at, with_context_held


def cpu_offload(ctx: Context) -> Remedy | None:
    """The offload that moves the weights beyond the budget to host memory. What the container's limit holds
    of it (the memory it pins, offload_pinned.py) is the gate's to judge, which says so in a give-up."""
    shape, total = ctx.inv.shape, ctx.total
    if shape is None or not total or ctx.offload_ignored():
        return None  # (the release's V2 runner ignores the flag: plan's give-up says so)
    est = ctx.estimate(free_gib=ctx.inv.gpu_free_gib)
    budget = est.requested_gib - est.activation_gib - est.non_torch_gib - 0.1 * est.requested_gib
    over = est.weights_gib - budget
    if over <= 0 or not math.isfinite(over):
        return None
    gb = math.ceil(over + (ctx.engine.cpu_offload_gb or 0))
    pinned = pinned_gib(shape, ctx.engine, float(gb))
    return Remedy(
        "CpuOffload",
        {"cpu_offload_gb": float(gb)},
        f"the weights exceed the budget by {over:.1f} GiB; {gb} GiB per GPU moves to host RAM (slower; it pins "
        f"about {pinned:.1f} GiB there).",
    )


def halving_short(ctx: Context) -> bool:
    """A halving at best halves the allocation that failed. What was free when it failed is no measure
    (the profile's other tensors, which shrink with it, held the rest), but the whole GPU less the
    weights vLLM printed is: where half the allocation is more than that, a certain second crash."""
    tried, room = ctx.num("tried_gib"), _room_besides_weights(ctx)
    return ctx.diag.cause == "profiling_oom" and tried is not None and room is not None and tried / 2 > room


def _room_besides_weights(ctx: Context) -> float | None:
    """The most a profile's allocation can ever get: the GPU less the weights vLLM printed."""
    total = ctx.total
    return total - (ctx.num("weights_gib") or 0.0) if total else None


def unchunked_floor(ctx: Context) -> int | None:
    """The least batch vLLM starts with: with chunked prefill off it refuses one below max_model_len
    (SchedulerConfig), a refusal no memory heal answers; 0 where chunked; None where the context is unknown."""
    if switched(ctx.engine.extra_args, "--enable-chunked-prefill") is not False:
        return 0
    if ctx.context:
        return ctx.context
    shape = ctx.inv.shape  # (RoPE scaling stretches the positions vLLM takes for max_model_len: unknown here)
    return shape.max_position_embeddings if shape is not None and not shape.positions_scaled else None


def batch_from_allocation(ctx: Context) -> Remedy | None:
    """The profile runs one dummy batch of max_num_batched_tokens tokens, whose activations grow with them.
    Where the batch was set above vLLM's default for this GPU (which the profile is built for) and an
    allocation failed with the free memory printed, size the batch so that allocation takes at most a
    quarter of what was free (a power of two), in one step; not below vLLM's default, the bound or
    max_num_seqs, and not at all where even that leaves the allocation larger than the GPU less the
    weights vLLM printed (halving_short's measure), or than what was free where it printed none: the
    batch is then not what asks for it (an encoder's profile, say)."""
    batch, tried, free = ctx.engine.max_num_batched_tokens, ctx.num("tried_gib"), ctx.num("gpu_free_gib")
    if not batch or not tried or free is None or free <= 0 or ctx.num("dummy_requests"):
        return None  # (a count of dummy requests names the sampler warm-up: seqs_from_allocation's)
    unchunked = unchunked_floor(ctx)
    if unchunked is None:
        return None
    least = max(
        ctx.default_batch(), ctx.policy.bounds.min_max_num_batched_tokens, ctx.engine.max_num_seqs or 0, unchunked
    )
    if batch <= least:
        return None
    fits = max(1, int(batch * free * 0.25 / tried))
    new = max(2 ** int(math.log2(fits)), least)
    # the GPU less the weights where vLLM printed them; else what was free (the GPU's whole size would
    # refuse nothing: a batch cut that scales 1 TiB to 64 GiB with 19 GiB free)
    room = _room_besides_weights(ctx) if ctx.num("weights_gib") else free
    if new >= batch or room is None or tried * new / batch > room:
        return None  # (the batch is not what asks for that memory)
    return Remedy(
        "LowerMaxNumBatchedTokens",
        {"max_num_batched_tokens": new},
        f"the profile's dummy batch of {batch:,} tokens asked for {tried:g} GiB with {free:g} GiB free; "
        f"max_num_batched_tokens {batch:,} -> {new:,} scales that allocation to about {tried * new / batch:.2f} GiB.",
    )


def _halve(
    field_name: str, action: str, floor_of: Callable[[Context], int], default: Callable[[Context], int], why: str
) -> Step:
    def step(ctx: Context) -> Remedy | None:
        if halving_short(ctx):
            return None
        current = getattr(ctx.engine, field_name) or default(ctx)
        new = max(floor_of(ctx), current // 2)
        if field_name == "max_num_batched_tokens" and ctx.engine.max_num_seqs:
            new = max(new, ctx.engine.max_num_seqs)
        if field_name == "max_num_batched_tokens":
            floor = unchunked_floor(ctx)
            if floor is None:
                return None
            new = max(new, floor)
        if new >= current:
            return None
        return Remedy(action, {field_name: new}, why.format(current=current, new=new))

    return step


def _seqs_default(ctx: Context) -> int:
    dummy = ctx.num("dummy_requests")
    return int(dummy) if dummy else ctx.default_seqs()


def _mbt_default(ctx: Context) -> int:
    return ctx.default_batch()


# The sampler warm-up holds a few float32 rows of the vocabulary a request (logits, probabilities, their
# sort); a vocabulary the model does not name is taken as the largest served (about 262,144 tokens).
SAMPLER_ROW_COPIES, LARGEST_VOCAB = 8, 262144


def _vocab(ctx: Context) -> int:
    return (ctx.inv.shape.vocab if ctx.inv.shape is not None else 0) or LARGEST_VOCAB


def seqs_from_allocation(ctx: Context) -> Remedy | None:
    """vLLM warms the sampler up with max_num_seqs dummy requests; the failed allocation is that many
    rows of logits. Size max_num_seqs so the same allocation takes at most a quarter of what was free,
    as a power of two, and no more than vLLM's default for this GPU (which the warm-up is built for)."""
    tried, dummy, free = ctx.num("tried_gib"), ctx.num("dummy_requests"), ctx.num("gpu_free_gib")
    current = ctx.engine.max_num_seqs or (int(dummy) if dummy else None)
    if not dummy and ctx.engine.max_num_seqs and ctx.total and ctx.engine.max_num_seqs > ctx.default_seqs():
        dummy = ctx.engine.max_num_seqs  # the warm-up batch is max_num_seqs requests (vLLM 0.25 prints no count)
    if not tried or not dummy or not current:
        return None
    per_seq = tried / dummy
    if not ctx.num("dummy_requests") and per_seq * GIB > SAMPLER_ROW_COPIES * 4 * _vocab(ctx):
        return None  # (more a request than the warm-up's rows of logits take: the forward batch asked for it)
    room = (free if free is not None else (ctx.total or 0) * 0.5) * 0.25
    if room <= 0:
        return None
    fits = max(1, int(room / per_seq))
    new = 2 ** int(math.log2(fits))
    if ctx.total:
        new = min(new, ctx.default_seqs())
    new = max(new, ctx.policy.bounds.min_max_num_seqs)
    if new >= current:
        return None
    return Remedy(
        "LowerMaxNumSeqs",
        {"max_num_seqs": new},
        f"the sampler warm-up with {int(dummy):,} requests asked for {tried:g} GiB "
        f"({per_seq * 1024:.3g} MiB per request); max_num_seqs {current:,} -> {new:,} keeps it within a "
        f"quarter of the memory that was free.",
    )


lower_seqs = _halve(
    "max_num_seqs",
    "LowerMaxNumSeqs",
    lambda c: c.policy.bounds.min_max_num_seqs,
    _seqs_default,
    "max_num_seqs {current} -> {new}: fewer sequences in the warm-up batch and at runtime.",
)
lower_batched = _halve(
    "max_num_batched_tokens",
    "LowerMaxNumBatchedTokens",
    lambda c: c.policy.bounds.min_max_num_batched_tokens,
    _mbt_default,
    "max_num_batched_tokens {current} -> {new}: the activation peak shrinks with it.",
)


def room_for_graphs(ctx: Context) -> Remedy | None:
    """CUDA graphs are captured outside the budget: leave them room (about 1 GiB, plus what failed to
    allocate and 0.5 GiB) below the budget instead of giving them up. Where the release reserves its
    estimate of them inside the budget, only what overran it lands beside: what failed, and 0.5 GiB."""
    total = ctx.total
    if not total or ctx.engine.enforce_eager or ctx.fixed_kv_gib():
        return None  # (a cache of a fixed size leaves the graphs no more room at a smaller share)
    current = ctx.engine.gpu_memory_utilization
    headroom = (1 - current) * total
    if ctx.inv.gpu_free_gib is not None:  # (beside another process, only what it left is outside the budget;
        # a figure that leaves less than the budget and vLLM's context is stale, as the start reached capture:
        # vLLM's own check would have refused it. The margins below hold the context, as on an idle GPU)
        beside = ctx.inv.gpu_free_gib - current * total
        if beside >= CUDA_CONTEXT_GIB:
            headroom = min(headroom, beside)
    graphs = ctx.graphs_outside()
    need = graphs + (ctx.num("tried_gib") or 0.0) + 0.5
    if headroom >= need + 1.0:
        return None  # the graphs had room already: something else took it; keep the next step
    new = min(round_util(current - (need - max(headroom, 0.0)) / total), ctx.policy.bounds.max_gpu_memory_utilization)
    if (ctx.floor is not None and new < ctx.floor) or new >= current:
        return None
    cut = with_context_held(ctx, new)
    est = estimate_at(ctx, new)
    short = est is not None and est.max_model_len_fit < est.max_model_len  # (whether or not a cut may come)
    if graphs and short:
        # (a leaner room, the graphs and 0.5 GiB without what failed on top, where it keeps the context;
        # where the release reserves them, what failed is what overran: no leaner room. It holds at least
        # the one allocation that failed: a room smaller than that is a certain second capture OOM)
        lean = min(
            round_util(current - (max(graphs, ctx.num("tried_gib") or 0.0) + 0.5 - max(headroom, 0.0)) / total),
            ctx.policy.bounds.max_gpu_memory_utilization,
        )
        held = estimate_at(ctx, lean) if new < lean < current else None
        if (
            held is not None
            and held.max_model_len_fit * 0.97 >= held.max_model_len  # (with the 3% margin)
            and _captures_beside_others(ctx, lean)
        ):
            new, cut = lean, ({"gpu_memory_utilization": lean}, "")
    if cut is None:
        return None  # (the cache left no longer holds the context, and no cut of it may come: the next step)
    changes, why = cut
    return Remedy(
        "LowerGpuMemoryUtilization",
        changes,
        f"CUDA-graph capture ran out of the {headroom:.2f} GiB left outside the budget; utilization "
        f"{current} -> {new} leaves {headroom + (current - new) * total:.2f} GiB for the graphs "
        + (f"(about {graphs:g} GiB)" if graphs else "(what overran vLLM's reserve for them)")
        + f" and keeps them.{why}",
    )


def _captures_beside_others(ctx: Context, util: float) -> bool:
    """Whether, where the launcher saw another process hold memory, the memory model says the graphs
    fit beside it at `util` (the leaner room keeps no margin for what the others left short)."""
    free = ctx.inv.gpu_free_gib
    if free is None or not ctx.total or free >= ctx.total or ctx.inv.shape is None:
        return True
    engine = ctx.engine.model_copy(update={"gpu_memory_utilization": util})
    return ctx.estimate(engine, free).failure != "cudagraph_capture_oom"


def enforce_eager(ctx: Context) -> Remedy | None:
    if ctx.engine.enforce_eager:
        return None
    return Remedy(
        "EnforceEager",
        {"enforce_eager": True},
        "skip CUDA-graph capture and the ~1 GiB it takes (beside the budget, or off the KV cache where the "
        "release reserves it; some decode speed is lost).",
    )


def _below_a_free_sized_cache(ctx: Context, new: float, room_gib: float) -> float:
    """vLLM 0.34's extensible cache holds what was free after warm-up where that is less than the budget (another
    process beside it): a cut frees nothing until the budget comes below it. The utilization (down from `new`, by
    0.01) at which the memory model's cache, beside what the launcher saw free, comes down by `room_gib`; `new`
    where the release sizes the cache by the budget alone, or the model's shape or the free memory is unknown."""
    free = ctx.inv.gpu_free_gib
    if free is None or ctx.inv.shape is None or not ctx.total or not extensible_kv_cache(ctx.engine, ctx.inv.release):
        return new
    want = ctx.estimate(free_gib=free).kv_cache_gib - room_gib
    util = new
    while util >= ctx.floor and util > 0.01:
        if ctx.estimate(ctx.engine.model_copy(update={"gpu_memory_utilization": util}), free).kv_cache_gib <= want:
            return util
        util = round_util(util - 0.01)
    return util


def lower_utilization_step(ctx: Context) -> Remedy | None:
    """Leave headroom sized from what failed to allocate (or ~1 GiB of graphs), at least 0.02."""
    if ctx.diag.cause == "gpu_util_exceeds_free" and (ctx.num("free_gib") is not None or ctx.num("others_gib")):
        return None  # what is free was printed: fit_utilization_to_free sized it; stepping is blind
    if ctx.diag.cause != "gpu_util_exceeds_free" and ctx.fixed_kv_gib():
        return None  # the KV cache's size is fixed: a cut changes nothing vLLM allocates (only its start-up check)
    total = ctx.total
    tried = ctx.num("tried_gib") or 0.0
    step = 0.02 if not total else max(0.02, round_util((tried + 0.5) / total, down=False))
    new = round_util(ctx.engine.gpu_memory_utilization - step)
    stepped = new
    if ctx.diag.cause == "runtime_oom":
        new = _below_a_free_sized_cache(ctx, new, tried + 0.5)
    if new < ctx.floor:
        return None
    basis = f"{tried:g} GiB failed to allocate" if tried else "no allocation size was printed"
    cut = with_context_held(ctx, new)
    if cut is None:
        return None  # (the smaller cache holds no request of the context, which may not be shortened)
    changes, why = cut
    return Remedy(
        "LowerGpuMemoryUtilization",
        changes,
        f"{basis}; utilization {ctx.engine.gpu_memory_utilization} -> {new} leaves that much headroom"
        + (
            " (vLLM's extensible KV cache held what was free beside another process, less than the budget: "
            f"{stepped} would have left it as it was)."
            if new != stepped
            else "."
        )
        + why,
    )
