"""The state blocks of a Mamba or linear-attention hybrid: one per running sequence, from the KV cache's pool,
which vLLM refuses to start short of, printing both counts."""

from __future__ import annotations

import math

from ..memory import default_max_num_seqs
from .kv_steps import raise_utilization_blind
from .model import Context, Remedy


def _state_shortage(ctx: Context) -> tuple[int, int] | None:
    """(blocks, sequences that ran) where vLLM's refusal shows this run short of state blocks, else
    None. vLLM names the max_num_seqs it ran with: set, another figure is another run's refusal;
    unset, it is vLLM's default, which differs by version and GPU, so the printed count is taken up to
    the largest default for the GPU the inventory names (1024 where none is named): a count above it
    is no default (a forged message, or another run's), and 'lowering' to its blocks would set more
    sequences than ran. The printed total is not asked: the message it would come from is the
    suspect one."""
    blocks, printed = ctx.num("mamba_blocks"), ctx.num("max_num_seqs")
    if blocks is None or not printed:
        return None
    largest_default = default_max_num_seqs(ctx.inv.gpu_total_gib or math.inf, ctx.inv.gpu_name, ctx.engine.extra_args)
    ran = ctx.engine.max_num_seqs or (int(printed) if printed <= largest_default else None)
    if ran is None or ran != int(printed):
        return None
    return (int(blocks), ran) if blocks < ran else None


def seqs_within_state_blocks(ctx: Context) -> Remedy | None:
    """A Mamba or linear-attention hybrid keeps one state block per running sequence, from the KV
    cache's pool; vLLM refuses to start with max_num_seqs above the blocks it has, and prints both.
    max_num_seqs := the blocks, as vLLM asks: no context is lost (a shorter one frees no block)."""
    shortage = _state_shortage(ctx)
    if shortage is None or shortage[0] < ctx.policy.bounds.min_max_num_seqs:
        return None
    new, current = shortage
    return Remedy(
        "LowerMaxNumSeqs",
        {"max_num_seqs": new},
        f"the cache pool holds {new:,} state blocks, one per running sequence (by vLLM's own count); "
        f"max_num_seqs {current:,} -> {new:,}, no context lost.",
    )


def more_state_blocks(ctx: Context) -> Remedy | None:
    """vLLM's other way out of a state-block shortage: more memory for the pool. Only where its
    figures show this run short: a refusal that names no shortage grows nothing blind."""
    return raise_utilization_blind(ctx) if _state_shortage(ctx) else None
