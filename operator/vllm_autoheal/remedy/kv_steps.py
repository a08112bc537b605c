"""The KV cache's steps: a larger share of the GPU, a shorter context, an fp8 cache, each sized from
what vLLM printed the cache needs, has and holds, so that the first change already fits; and the
CUDA graphs' share, where the release takes it off the cache."""

from __future__ import annotations

import math

from ..diagnosis.units import GIB
from ..memory import BLOCK_SIZE, CUDA_CONTEXT_GIB, CUDAGRAPH_GIB, KvNeed, kv_need
from ..model_runner import graphs_reserved
from .model import Context, Remedy


def round_util(value: float, down: bool = True) -> float:
    """Round a utilization to 0.01, in the safe direction."""
    return (math.floor if down else math.ceil)(round(value * 100, 6)) / 100


def whole_blocks(value: float) -> int:
    return int(value // BLOCK_SIZE) * BLOCK_SIZE


def on_smallest_stage(ctx: Context, tokens: float) -> float:
    """vLLM's estimate of the tokens its refused stage holds, on the smallest budget a rank or stage printed (a
    smaller one holds that much less; 3% margin: the figures are rounded to 0.01 GiB, and the stage holds a block
    fewer than its share); as it is where none printed less."""
    smallest, refused = smaller_budget(ctx), ctx.num("available_gib")
    return tokens * smallest / refused * 0.97 if smallest and refused else tokens


def less_warmup(ctx: Context, tokens: float, budget: float | None) -> float | None:
    """vLLM's count of the tokens its cache holds, once 0.34's warm-up takes the captured graphs off the budget it
    printed (the smallest stage's, where one printed less): in proportion, 3% margin (a window's layers would make
    it fewer); as it is where warm-up takes nothing or no budget was printed; None where it takes it all."""
    loss, printed = ctx.warmup_loss(), smaller_budget(ctx) or ctx.num("available_gib") or budget
    if not loss or not printed:
        return tokens
    return tokens * (printed - loss) / printed * 0.97 if printed > loss else None


def smaller_budget(ctx: Context) -> float | None:
    """The smallest KV budget a rank or pipeline stage printed, where it is below the refusal's own figure:
    vLLM refuses with the first short one's figures, and another may hold less."""
    smallest, refused = ctx.num("available_kv_gib"), ctx.num("available_gib")
    return smallest if smallest is not None and refused is not None and 0 < smallest < refused else None


def raise_utilization_for_kv(ctx: Context) -> Remedy | None:
    needed, available, total = ctx.num("needed_gib"), ctx.num("available_gib"), ctx.total
    room = ctx.free_for_vllm()
    if needed is None or available is None or not total or room is None or ctx.fixed_kv_gib():
        return None  # (with kv_cache_memory_bytes set, or vLLM saying it fixed the size, no utilization sizes it)
    available = smaller_budget(ctx) or available
    short = needed - available + ctx.warmup_loss()  # (0.34: the cache after warm-up holds less than the budget)
    want = round_util(ctx.engine.gpu_memory_utilization + short / total + 0.01, down=False)
    limit = min(ctx.policy.bounds.max_gpu_memory_utilization, round_util(room / total))
    if want > limit:
        return None
    return Remedy(
        "RaiseGpuMemoryUtilization",
        {"gpu_memory_utilization": want},
        f"the KV cache needs {needed:g} GiB and has {available:g} GiB; the GPU has room for "
        f"utilization {want} (free memory allows up to {limit}), so no context is lost.",
    )


def lower_max_model_len(ctx: Context) -> Remedy | None:
    budget = ctx.kv_budget()
    if budget is not None and budget <= 0:
        return None  # vLLM printed no memory at all for the cache: no context, however short, fits
    estimated = ctx.num("estimated_max_model_len") or ctx.num("kv_tokens")
    source = (
        ("the memory model's estimate (3% margin)" if ctx.diag.source == "memory-model" else "vLLM's own estimate")
        if estimated
        else ""
    )
    smallest = smaller_budget(ctx)
    if estimated and smallest:
        estimated, source = (
            on_smallest_stage(ctx, estimated),
            f"vLLM's estimate, on the smallest stage's {smallest:g} GiB (3% margin)",
        )
    current, loss = ctx.context, ctx.warmup_loss()
    scaled = less_warmup(ctx, estimated, budget) if estimated else estimated
    if estimated and scaled is None:
        return None  # (0.34: the graphs warm-up captures take all the budget vLLM printed: no context holds)
    if estimated and scaled != estimated:
        if ctx.inv.shape is not None and ctx.total and budget is not None:
            estimated = None  # (sized below from the budget warm-up leaves, at the shape's bytes a token)
        else:
            estimated, source = scaled, "vLLM's estimate less the graphs"
    if not estimated and ctx.inv.shape is not None and ctx.total:
        held = context_held(ctx, budget - loss) if budget is not None else None
        if held is not None:  # vLLM's own budget, in the shape's bytes a token
            estimated, current = held[0] * 0.97, held[1]
            source = f"vLLM's KV budget ({budget:g} GiB) at the model's bytes a token (with a 3% margin)"
            source += f", less {loss:g} GiB of graphs warm-up takes off it" if loss else ""
        else:
            est = ctx.estimate(free_gib=ctx.inv.gpu_free_gib)
            estimated, source = est.max_model_len_fit * 0.97, "the memory model (with a 3% margin)"
            current = current or est.max_model_len  # (a cache that holds more than the default is no shorter one)
    if not estimated:
        return None
    new = whole_blocks(estimated)
    if new < ctx.policy.bounds.min_max_model_len or (current is not None and new >= current):
        return None
    return Remedy(
        "LowerMaxModelLen",
        {"max_model_len": new},
        f"the KV cache holds {int(estimated):,} tokens by {source}; max_model_len "
        f"{ctx.context or 'default'} -> {new:,} (a multiple of the {BLOCK_SIZE}-token block).",
    )


def raise_limit(ctx: Context) -> float:
    """The most utilization a raise may set: the bound, and what the GPU's free memory allows."""
    total, room = ctx.total, ctx.free_for_vllm()
    limit = ctx.policy.bounds.max_gpu_memory_utilization
    return min(limit, round_util(room / total)) if total and room is not None else limit


def empty_budget(ctx: Context) -> str:
    """For a give-up where vLLM's KV budget stays empty at the most utilization a raise may set: say so."""
    budget, total, current = ctx.kv_budget(), ctx.total, ctx.engine.gpu_memory_utilization
    if ctx.diag.cause != "kv_cache_insufficient" or budget is None or budget > 0 or not total:
        return ""
    limit, loss = max(raise_limit(ctx), current), ctx.warmup_loss()
    after = f" after the {loss:g} GiB of graphs warm-up takes off it" if loss else ""
    return (
        f"vLLM's KV budget was {budget:g} GiB at utilization {current}; the most the bounds and free memory "
        f"allow ({limit}) leaves it at {budget - loss + (limit - current) * total:.2f} GiB{after}, so no raise was made."
    )


def raise_utilization_blind(ctx: Context) -> Remedy | None:
    """Utilization raised to what the GPU allows, within bounds, where vLLM printed no size for what the
    cache needs. The raise adds exactly (limit - current) x the GPU to vLLM's KV budget; where that
    budget is known (printed, or the tokens the cache held at the shape's bytes a token), the context
    the grown cache holds comes with the raise: a raise that keeps a longer one crashes again."""
    total, limit = ctx.total, raise_limit(ctx)
    current = ctx.engine.gpu_memory_utilization
    if limit <= current or ctx.fixed_kv_gib():
        return None  # (a cache of a fixed size: the utilization does not size it)
    outside = ctx.held_outside()  # (weights another process holds, counted in the share: it must exceed them)
    if outside is not None and total and limit * total <= outside + CUDA_CONTEXT_GIB:
        return None
    needed, available = ctx.num("needed_gib"), ctx.num("available_gib")
    if needed is not None and available is not None:
        return _raise_with_estimate(ctx, needed, available, limit)
    budget, why = _budget_before(ctx)
    # (0.34: the cache after warm-up holds the budget less the graphs captured)
    grown = budget - ctx.warmup_loss() + (limit - current) * total if budget is not None and total else None
    if grown is not None and grown <= 0:
        return None  # vLLM's own budget stays empty at the limit: a certain second crash
    held = (context_held(ctx, grown) or concurrency_held(ctx, grown)) if grown is not None else None
    margin = 0.97  # the memory model's bytes a token, as lower_max_model_len
    holds = ctx.num("estimated_max_model_len") or ctx.num("kv_tokens")
    if held is None and holds and budget is None:
        # no shape to size the tokens with: the cache is at most the whole share, so it grows at
        # least by limit/current (vLLM's own count: a 1 % margin)
        reach, margin = holds * limit / current, 1.0
        why = f"the KV cache holds {int(holds):,} tokens by vLLM's count"
        grown_text = f"utilization {current} -> {limit} grows it to at least {int(reach):,}"
        held = (int(reach * 0.99), ctx.context) if ctx.context else None
    else:
        grown_text = f"utilization {current} -> {limit} grows vLLM's budget to {grown:.2f} GiB" if grown else ""
        if held is not None and holds and ctx.kv_budget() is None:
            # The shape's bytes for vLLM's count are a lower bound that leaves out a window's layers past
            # the window: never less than that count grown in proportion (the shape-free bound above)
            floor = int(holds * limit / current * 0.99 / margin)
            held = (max(held[0], floor), held[1])
    if outside is not None and not why:
        why = f"the {outside:.2f} GiB of weights held outside the engine exceed utilization {current}'s share"
    why = why or "no memory was left for a single KV block"
    if held is None or held[0] >= held[1]:
        tail = (
            f"; {grown_text}." if grown_text else "; utilization raised to the most the bounds and free memory allow."
        )
        return Remedy("RaiseGpuMemoryUtilization", {"gpu_memory_utilization": limit}, why + tail)
    length, context = held
    new = shorter_context(ctx, length * margin)
    if new is None:
        return None  # the grown cache would still refuse the context: a certain second crash
    return Remedy(
        "RaiseGpuMemoryUtilization",
        {"gpu_memory_utilization": limit, "max_model_len": new},
        f"{why}; {grown_text}, which holds one request of about {length:,} tokens, not {context:,}: "
        f"max_model_len -> {new:,}.",
    )


def _budget_before(ctx: Context) -> tuple[float | None, str]:
    """vLLM's KV budget in the run that failed, GiB, and where it comes from: the budget it printed,
    else the tokens it printed the cache holds at the model's bytes a token (a lower bound: full
    attention's bytes for every token, a window's for at most the window, no block rounding)."""
    budget = ctx.kv_budget()
    if budget is not None:
        reserved = ctx.num("mm_reserved_gib")  # (0.32's multimodal decoding: taken out of the budget it printed)
        after = f" once its multimodal decoding took {reserved:g} GiB of it" if reserved else ""
        return budget, (f"vLLM's KV budget was {budget:.2f} GiB{after}" if budget else "")
    holds = ctx.num("estimated_max_model_len") or ctx.num("kv_tokens")
    if not holds or ctx.inv.shape is None or not ctx.total:
        return None, ""  # (the memory model sizes nothing without the GPU's total: ctx.estimate)
    need = _need(ctx)
    gib = (need.full_per_token * holds + need.windowed_per_token * min(holds, need.window)) / GIB
    return (
        gib,
        f"the KV cache holds {int(holds):,} tokens by vLLM's count, at least {gib:.3g} GiB at the model's bytes a token",
    )


def _raise_with_estimate(ctx: Context, needed: float, available: float, limit: float) -> Remedy | None:
    """vLLM printed what the cache needs and has (raise_utilization_for_kv found the raise short): the
    most utilization allowed, with the context its estimate says the grown cache holds."""
    total, estimated = ctx.total, ctx.num("estimated_max_model_len")
    if not total or not estimated or not available:
        return None
    # The cache grows by exactly the memory added; tokens grow at least in proportion (a sliding
    # window's layers need no more past the window), so scaling vLLM's estimate up is safe. Each rank and
    # pipeline stage grows by the same GiB: the smallest one printed (3% margin, as lower_max_model_len's) is
    # the one that must hold the context.
    smallest = smaller_budget(ctx)
    base, margin = (smallest, 0.97) if smallest else (available, 0.99)
    grown = base - ctx.warmup_loss() + (limit - ctx.engine.gpu_memory_utilization) * total
    holds = estimated * grown / available
    new = shorter_context(ctx, holds * margin)
    if new is None:
        return None
    stage = f" on the smallest stage ({smallest:g} GiB)" if smallest else ""
    return Remedy(
        "RaiseGpuMemoryUtilization",
        {"gpu_memory_utilization": limit, "max_model_len": new},
        f"the KV cache needs {needed:g} GiB and has {available:g} GiB; utilization {limit} (the most the bounds "
        f"and free memory allow) gives it {grown:.2f} GiB{stage}, which holds about {int(holds):,} "
        f"tokens by vLLM's estimate: max_model_len -> {new:,}.",
    )


def _need(ctx: Context) -> KvNeed:
    assert ctx.inv.shape is not None
    est = ctx.estimate()
    return kv_need(ctx.inv.shape, ctx.engine, est.max_num_batched_tokens, ctx.inv.release)


def context_held(ctx: Context, kv_gib: float) -> tuple[int, int] | None:
    """(the longest request a KV cache of kv_gib holds, the context that ran) by the memory model,
    where the model's shape is known: vLLM's budget figure with the shape's bytes per token."""
    if ctx.inv.shape is None or not ctx.total:
        return None
    context = ctx.context or ctx.estimate().max_model_len
    return _need(ctx).longest(kv_gib * GIB, context), context


def concurrency_held(ctx: Context, kv_gib: float) -> tuple[int, int] | None:
    """(the longest request a KV cache of kv_gib holds, the context that ran) by vLLM's own figures, where the
    model's shape is not known: the budget it printed held "Maximum concurrency" requests of the context that
    ran (read 0.005 low, its rounding), so one request takes budget / concurrency, and a cache of another size
    holds a context in proportion. Exact for full attention (and within a block for a Mamba hybrid's state); a
    windowed layer's part does not grow with the context, so a larger cache holds more than this says and a
    smaller one may hold much less (gemma-3-1b: 6,000 tokens, not 15,000), which nothing vLLM prints shows (its
    "GPU KV cache size" is the concurrency x max_model_len since 0.25). None where vLLM printed no budget or
    no concurrency, or the shape is known (the memory model sizes it)."""
    budget, times, ran = ctx.kv_budget(), ctx.num("max_concurrency"), ctx.num("max_model_len")
    if not budget or budget <= 0 or times is None or times - 0.005 <= 0 or not ran or ctx.inv.shape is not None:
        return None
    per_request = budget / (times - 0.005)
    return int(ran * max(kv_gib, 0.0) / per_request), int(ctx.context or ran)


def printed_context_after_cut(ctx: Context, cut_gib: float) -> int | None:
    """The context (3% margin) the KV cache vLLM printed for this run (in GiB, or in tokens: V0's "maximum
    number of tokens that can be stored") holds once `cut_gib` less is given to it, at the shape's bytes a
    token; 0 where nothing is left; None where vLLM printed no size for the cache or the shape is not
    known (the memory model's figure alone then)."""
    if ctx.inv.shape is None or not ctx.total:
        return None
    printed = ctx.num("available_gib")
    if printed is None:  # (its budget line, else the tokens it said the cache holds at the shape's bytes)
        printed = _budget_before(ctx)[0]
    if printed is None:
        return None
    left = printed - ctx.warmup_loss() - cut_gib
    held = context_held(ctx, left) if left > 0 else None
    return whole_blocks(held[0] * 0.97) if held else 0


def shorter_context(ctx: Context, tokens: float) -> int | None:
    """A shorter max_model_len that holds in `tokens`, when LowerMaxModelLen is allowed and the bound
    permits; None otherwise."""
    if not math.isfinite(tokens):  # scaled by a forged, vanishing figure (available_gib 1e-320)
        return None
    new = whole_blocks(tokens)
    current = ctx.context
    if "LowerMaxModelLen" not in ctx.policy.allowed_actions or new < ctx.policy.bounds.min_max_model_len:
        return None
    return new if current is None or new < current else None


def kv_quantized(ctx: Context) -> bool:
    """Whether the cache is fp8 already: set so, or the checkpoint's own config names a quantized one for
    `auto` (bfloat16 or float16 set is not)."""
    dtype = ctx.engine.kv_cache_dtype or "auto"
    return dtype.startswith("fp8") or bool(
        dtype == "auto" and ctx.inv.shape is not None and ctx.inv.shape.auto_kv_dtype
    )


def fp8_kv_cache(ctx: Context) -> Remedy | None:
    """An fp8 cache holds twice the tokens. Where vLLM printed what the cache holds, fp8 alone only
    when twice that holds the context; else with the context twice that holds (within the bound)."""
    if kv_quantized(ctx):
        return None
    why = "an fp8 KV cache holds twice the tokens per GiB."
    budget, loss = ctx.kv_budget(), ctx.warmup_loss()
    if budget is not None and budget <= 0:
        return None  # twice nothing: vLLM printed no memory at all for the cache
    holds = ctx.num("estimated_max_model_len") or ctx.num("kv_tokens")
    if holds:
        holds = less_warmup(ctx, on_smallest_stage(ctx, holds), budget)
        if holds is None:
            return None
    elif budget is not None:  # (V1's budget and its concurrency below one request)
        if budget <= loss:
            return None
        held = context_held(ctx, budget - loss) or concurrency_held(ctx, budget - loss)
        holds = held[0] if held else None
    needed, available = ctx.num("needed_gib"), ctx.num("available_gib")
    current = ctx.context
    if holds is None and needed is not None and available is not None and needed / 2 > available * 0.99:
        return None  # vLLM gave no length to size the context from, and fp8 alone is short
    if holds is None or current is None or 2 * holds * 0.99 >= current:
        return Remedy("Fp8KvCache", {"kv_cache_dtype": "fp8"}, why)
    new = shorter_context(ctx, 2 * holds * 0.99)
    if new is None:
        return None
    return Remedy(
        "Fp8KvCache",
        {"kv_cache_dtype": "fp8", "max_model_len": new},
        f"{why[:-1]}: about {int(2 * holds):,} here, short of max_model_len {current:,}; max_model_len -> {new:,}.",
    )


def eager_for_reserved_graphs(ctx: Context) -> Remedy | None:
    """Where the release takes its estimate of the CUDA graphs off the KV cache (model_runner.graphs_reserved),
    --enforce-eager gives that share back to the cache: a KV heal where, with the model's shape, the
    memory model says the eager start holds one request of max_model_len, and where vLLM printed what
    the cache lacks or its budget, the share covers that (its figures for this run outrank the model)."""
    if ctx.inv.shape is None or not ctx.total or not graphs_reserved(ctx.inv.shape, ctx.engine, ctx.inv.release):
        return None
    needed, available = ctx.num("needed_gib"), ctx.num("available_gib")
    share = ctx.printed_graphs() or CUDAGRAPH_GIB  # (vLLM's own estimate where it printed one)
    if needed is not None and available is not None and needed - available > share:
        return None
    budget = ctx.printed_kv_budget()  # (a budget line below zero by more than the share stays empty)
    if budget is not None and budget + share <= 0:
        return None
    if not ctx.estimate(ctx.engine.model_copy(update={"enforce_eager": True}), ctx.inv.gpu_free_gib).fits:
        return None
    return Remedy(
        "EnforceEager",
        {"enforce_eager": True},
        f"vLLM {ctx.inv.release} takes its estimate of the CUDA graphs (about {share:.2f} GiB) off the KV "
        "cache; without graphs that share goes to the cache, which then holds one request of max_model_len "
        "(some decode speed is lost).",
    )


def smaller_fixed_cache(ctx: Context, gib: float, fixed: float) -> tuple[dict[str, float | int], str] | None:
    """--kv-cache-memory-bytes of `gib` (whole MiB) for a cache of `fixed` GiB, with the context the smaller cache
    holds (by the model's shape, else by vLLM's own count of the fixed cache scaled down), in the same change;
    None below the bounds' least cache, or where that context may not be set."""
    new = max(int(gib * GIB) // 2**20, 0) * 2**20
    if new < max(ctx.policy.bounds.min_kv_cache_memory_bytes or 0, 2**20):
        return None
    changes: dict[str, float | int] = {"kv_cache_memory_bytes": new}
    held = context_held(ctx, new / GIB)
    tokens = ctx.num("kv_cache_tokens") or ctx.num("kv_tokens")
    if held is None and tokens and ctx.context:
        held = (int(tokens * new / (fixed * GIB)), ctx.context)
    if held is None or held[0] >= held[1]:
        return changes, ""
    length = shorter_context(ctx, held[0] * 0.97)
    if length is None:
        return None  # (the smaller cache holds no request of the context, which may not be shortened)
    changes["max_model_len"] = length
    return changes, f" It holds one request of about {held[0]:,} tokens: max_model_len -> {length:,}."
