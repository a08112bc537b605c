"""Owns heal planning: plan_heal(spec, diagnosis, history, inventory) -> Remedy, the one flag change that should fit.

Pure. Each cause has an ordered list of steps (PLANS, the steps in steps.py); the first one
that is allowed, not already tried for this cause, applicable to what is known, and
let through by the safety gate (remedy_gate.py) wins. Sizes come from the numbers vLLM printed
(estimated maximum model length, free/total GiB, tried-to-allocate) and from the
memory model when it printed none. Blind stepping is the last resort, never the
first: a model load costs minutes on a real GPU.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from ..api import EngineArgs, VLLMServiceSpec
from ..diagnosis import Diagnosis
from ..diagnosis.model import Cause
from ..engine import EngineArgsError, abbreviated_flag, parse_args
from ..flag_tokens import spelled_by
from ..memory import CUDA_CONTEXT_GIB
from ..remedy_gate import Limits, check, refused_gpus, refused_memory_limit, utilization_floor
from ..vllm_release import default_utilization, logged_release
from .advice import allocation_out_of_reach, weights_beyond_free, weights_beyond_gpu, what_would_fit
from .host_steps import lower_cpu_offload, raise_memory_limit, shrink_kv_bytes
from .kv_steps import (
    eager_for_reserved_graphs,
    empty_budget,
    fp8_kv_cache,
    lower_max_model_len,
    printed_context_after_cut,
    raise_utilization_blind,
    raise_utilization_for_kv,
    shorter_context,
)
from .model import (
    GIVE_UP,
    NO_CHANGE,
    Context,
    Inventory,
    Remedy,
    Step,
    device_total,
    printed_figure,
    running_shape,
)
from .resource_steps import (
    more_tensor_parallel,
    offload_ignored_note,
    quantized_model,
    shrink_fixed_kv_cache,
    unsplittable,
)
from .share_steps import fit_kv_bytes_to_free, fit_utilization_to_free
from .state_steps import more_state_blocks, seqs_within_state_blocks
from .steps import (
    batch_from_allocation,
    cpu_offload,
    enforce_eager,
    lower_batched,
    lower_seqs,
    lower_utilization_step,
    room_for_graphs,
    seqs_from_allocation,
)
from .verdict import cannot_fit, expected

# Raising the memory limit again is a new, larger value each time (VPA bumps on every OOM).
REPEATABLE = {"RaiseMemoryLimit"}

# Every cause has a row; an empty one means no change is ever made for it.
PLANS: dict[Cause, list[Step]] = {
    Cause.KV_CACHE_INSUFFICIENT: [
        raise_utilization_for_kv,
        lower_max_model_len,
        raise_utilization_blind,
        fp8_kv_cache,
        eager_for_reserved_graphs,
        more_tensor_parallel,
    ],
    # (a split last: where the weights do not fit beside the others at any share the bounds allow)
    Cause.GPU_UTIL_EXCEEDS_FREE: [
        fit_utilization_to_free,
        fit_kv_bytes_to_free,
        lower_utilization_step,
        more_tensor_parallel,
    ],
    Cause.WEIGHTS_LOAD_OOM: [quantized_model, more_tensor_parallel, cpu_offload],
    Cause.PROFILING_OOM: [
        seqs_from_allocation,
        batch_from_allocation,
        lower_seqs,
        lower_batched,
        lower_utilization_step,
    ],
    Cause.CUDAGRAPH_CAPTURE_OOM: [room_for_graphs, enforce_eager, lower_utilization_step],
    Cause.RUNTIME_OOM: [shrink_fixed_kv_cache, lower_utilization_step, lower_seqs, lower_batched],
    Cause.MULTI_GPU_OOM: [lower_max_model_len, lower_utilization_step, enforce_eager],
    Cause.HOST_RAM_OOM: [raise_memory_limit, lower_cpu_offload, shrink_kv_bytes],
    Cause.NOT_OOM: [],
    Cause.UNKNOWN: [],
}
# Where one cause has a shortage its plan does not fit: the subtype's steps, and the cause whose
# directions the gate holds them to. A Mamba hybrid short of state blocks needs fewer sequences or more
# cache, never a shorter context or another KV dtype (neither adds a block). vLLM's KV check failing on
# the smallest pipeline stage is a KV shortage there: a shorter context or more cache, never the
# multi-GPU plan's lower share, which leaves the stage's cache less still.
SUBTYPE_PLANS: dict[str, tuple[Cause, list[Step]]] = {
    "state_blocks_below_max_num_seqs": (Cause.KV_CACHE_INSUFFICIENT, [seqs_within_state_blocks, more_state_blocks]),
    # vLLM's refusal of a cache with no block while others hold GPU memory: its budget is its share
    # less what it measured in use, which counted theirs (before 0.7, early V1) or their growth while it
    # profiled. A smaller share gives the cache less still (a certain second crash); a larger one room.
    "no_blocks_beside_other_processes": (Cause.KV_CACHE_INSUFFICIENT, [raise_utilization_blind]),
    # Weights another process holds for vLLM (0.32's IPC weight cache) above its share: they are on the GPU
    # already, so the share grows past them where the GPU has room, as for weights that left no cache block.
    "external_weights_exceed_budget": (Cause.KV_CACHE_INSUFFICIENT, [raise_utilization_blind]),
    "kv_check_fails_on_smallest_stage": (
        Cause.KV_CACHE_INSUFFICIENT,
        [lower_max_model_len, raise_utilization_for_kv, raise_utilization_blind, fp8_kv_cache],
    ),
}


def plan_heal(
    spec: VLLMServiceSpec,
    diagnosis: Diagnosis,
    history: list[dict[str, Any]] | None = None,
    inventory: Inventory | None = None,
    engine: EngineArgs | None = None,
    *,
    attempts: int | None = None,
    failed: Collection[str] = (),
    model: str | None = None,
    memory_limit: str | None = None,
    exclude: Collection[str] = (),
) -> Remedy:
    """The next change for this crash. `history`: earlier heals as {cause, action, ...};
    `engine`, `model`, `memory_limit`: what is deployed now (default: the spec's); `attempts`: heals
    so far (default: those in history); `failed`: fingerprints of settings that crashed of memory;
    `exclude`: actions not to take now (e.g. those that need more resources than can be scheduled)."""
    history = history or []
    inv = inventory or Inventory()
    engine = engine or spec.engine
    model = model or spec.model
    memory_limit = memory_limit if memory_limit is not None else spec.resources.limits.memory
    runs, running = running_shape(spec, model, engine, inv.shape)
    if runs and running is not None:
        # (the fallback runs: its heals weigh the width the policy or its own config declares, not the 4
        # bits a method's name would guess)
        inv = Inventory(**{**inv.__dict__, "shape": running})
    if diagnosis.cause == Cause.NOT_OOM:
        return Remedy(
            NO_CHANGE,
            reason=f"not a memory failure ({diagnosis.subtype or 'see evidence'}); memory flags stay as they are.",
        )
    if not PLANS[diagnosis.cause]:
        return Remedy(NO_CHANGE, reason="the cause is unknown; nothing is changed on a guess.")
    if not spec.heal.enabled:
        return Remedy(NO_CHANGE, reason="healing is disabled (spec.heal.enabled=false); diagnosis only.")
    heals = [h for h in history if h.get("action") not in (NO_CHANGE, GIVE_UP, None)]
    done = len(heals) if attempts is None else attempts
    if done >= spec.heal.max_attempts:
        return Remedy(GIVE_UP, reason=f"{done} heals already, the most spec.heal.maxAttempts allows.")
    tried = {h["action"] for h in heals if h.get("cause") == diagnosis.cause} - REPEATABLE
    if inv.gpu_free_gib is None:  # an earlier crash may have printed what was free; remember it
        printed = [
            h["numbers"]["free_gib"]
            for h in history
            if isinstance(h.get("numbers"), dict)
            and h.get("cause") == "gpu_util_exceeds_free"
            and "free_gib" in h["numbers"]
        ]
        if printed:
            inv = Inventory(**{**inv.__dict__, "gpu_free_gib": printed[-1] + CUDA_CONTEXT_GIB})
    total = device_total(diagnosis, inv)
    loaded = printed_figure(diagnosis, "weights_gib")
    ceiling = outside_budget_ceiling(history, engine.tensor_parallel_size * engine.pipeline_parallel_size)
    limits = replace(
        _limits(spec, engine, inv, total, loaded, ceiling),
        refused_memory_limit=_still_refused(refused_memory_limit(history), inv.memory_limit_bytes),
        refused_gpus=_still_refused(refused_gpus(history), engine.tensor_parallel_size * engine.pipeline_parallel_size),
    )
    ctx = Context(spec, engine, diagnosis, inv, limits)
    allowed = set(spec.heal.allowed_actions) - set(exclude)
    refused: list[str] = []
    heal_as, steps = SUBTYPE_PLANS.get(diagnosis.subtype or "", (diagnosis.cause, PLANS[diagnosis.cause]))
    if heal_as == Cause.KV_CACHE_INSUFFICIENT and loaded and weights_leave_no_cache(ctx):
        # vLLM's KV check is what fails when the weights it loaded leave nothing: no cache flag makes
        # them fit (only on its printed figure: an estimate of the weights never turns a KV heal around)
        heal_as, steps = Cause.WEIGHTS_LOAD_OOM, PLANS[Cause.WEIGHTS_LOAD_OOM]
    for step in steps:
        remedy = step(ctx)
        if remedy is None or (remedy.action in tried and not remedy.repeatable) or remedy.action not in allowed:
            continue
        if remedy.changes.get("model") == model:  # (the quantized fallback runs already: status.effectiveModel)
            continue
        if remedy.action in tried and _repeat_below_weights(remedy, history, total):
            refused.append(f"{remedy.action} refused: it would leave less than the weights an earlier crash printed")
            continue
        limits = ctx.limits
        if {"tensor_parallel_size", "quantization"} & set(remedy.changes):  # (their own floor: less weights a GPU)
            # (a share that ran out while serving bounds the same split still: the status history does not
            # say on which split a share ran, so a new split is bounded by its own floor alone)
            ceiling = None if "tensor_parallel_size" in remedy.changes else ctx.limits.ceiling
            weighed = inv  # (a switch of checkpoint: the floor of the fallback's own width, where it is known)
            if "model" in remedy.changes and (shape := ctx.fallback_shape()) is not None:
                weighed = Inventory(**{**inv.__dict__, "shape": shape})
            limits = replace(
                _limits(spec, remedy.apply(engine), weighed, total, None, ceiling),
                refused_memory_limit=ctx.limits.refused_memory_limit,
                refused_gpus=ctx.limits.refused_gpus,
            )
        problem = check(
            heal_as, remedy.changes, engine, model, memory_limit, limits, failed, ctx.inv.shape
        ) or cannot_fit(ctx, remedy)
        if problem is not None:
            refused.append(f"{remedy.action} refused: {problem}")
            continue
        if "LowerGpuMemoryUtilization" in allowed:
            remedy = _with_room_for_graphs(ctx, heal_as, remedy, model, memory_limit, failed)
        remedy.expected = remedy.expected or expected(ctx, remedy.changes)
        return remedy
    if more_tensor_parallel in steps and "IncreaseTensorParallel" in allowed and (unsplit := unsplittable(ctx)):
        refused.append(f"IncreaseTensorParallel refused: {unsplit}")
    if {cpu_offload, lower_cpu_offload} & set(steps) and (ignored := offload_ignored_note(ctx)):
        refused.append(f"CpuOffload and LowerCpuOffload refused: {ignored}")
    refused += [note for note in dict.fromkeys(ctx.declined) if note not in refused]
    why = f"; {'; '.join(refused)}" if refused else ""
    advice = what_would_fit(ctx) or weights_beyond_free(ctx) or allocation_out_of_reach(ctx) or empty_budget(ctx)
    return Remedy(
        GIVE_UP,
        reason=f"no allowed change is left for {diagnosis.cause} within the bounds "
        f"(tried: {', '.join(sorted(tried)) or 'none'}{why})." + (f" {advice}" if advice else ""),
    )


def _still_refused(refused: int | None, running: int | None) -> int | None:
    """What no node could take, unless the pod that crashed now ran with as much (it scheduled since)."""
    return None if refused is None or (running is not None and refused <= running) else refused


# Causes whose memory ran out outside vLLM's budget: a higher utilization leaves them less room.
OUTSIDE_BUDGET = frozenset({Cause.RUNTIME_OOM, Cause.CUDAGRAPH_CAPTURE_OOM})


def outside_budget_ceiling(history: list[dict[str, Any]], gpus: int) -> float | None:
    """The least utilization an earlier crash outside the budget ran at (`ran_util`), or None: a raise back
    to it brings that crash back. Only a crash on the split that runs now (`gpus` a replica), and of a
    cause whose utilization cut was tried since the last edit (history's tried entries, which an edit
    clears; serve's heals are its own run's): an edit (eager mode, another context) may have ended it."""
    cut = {h.get("cause") for h in history if h.get("action") == "LowerGpuMemoryUtilization"}
    ran = [
        float(h["ran_util"])
        for h in history
        if h.get("cause") in OUTSIDE_BUDGET & cut
        and isinstance(h.get("ran_util"), (int, float))
        and not h.get("other_split")
        and not h.get("resplit")
        and h.get("ran_gpus", gpus) == gpus
    ]
    return min(ran, default=None)


def _limits(
    spec: VLLMServiceSpec,
    engine: EngineArgs,
    inv: Inventory,
    total: float | None,
    loaded: float | None,
    ceiling: float | None = None,
) -> Limits:
    """The bounds for flags `engine`: the utilization floor its weights set, and never below the weights
    vLLM printed it loaded (`loaded`, per GPU of that engine's split): less is a certain crash. `ceiling`:
    the least utilization that ran out of memory outside the budget on this split (outside_budget_ceiling)."""
    floor = utilization_floor(spec.heal.bounds, engine, inv.shape, total, inv.entrypoint, inv.gpu_name, inv.release)
    if loaded and total:
        floor = max(floor or 0.0, min(1.0, math.ceil(loaded / total * 100) / 100))
    return Limits(spec.heal.bounds, floor, inv.memory_limit_bytes, ceiling)


def _with_room_for_graphs(
    ctx: Context, heal_as: Cause, remedy: Remedy, model: str, memory_limit: str | None, failed: Collection[str]
) -> Remedy:
    """A change after which the memory model says the start gets as far as CUDA-graph capture and no
    further (a high utilization leaves the graphs too little room outside the budget) comes with the
    utilization that leaves them room, where the model says the two together start and the gate lets
    that through as a capture heal: not a second restart for what the figures already show.
    Never for a cause whose shortage is the budget itself (a KV refusal calls for more utilization, not
    less: the gate refuses a cut there) unless the heal fits the context to the cache: the cut then comes
    with the context the smaller cache holds, as the capture heal after a second crash would set it.
    Nor where the model already says the flags that ran stop at capture: then the change is not what
    brings capture on, and the crash shows the model wrong about those flags (a pod OOM-killed on the
    host, or out of memory while serving, got past capture with them)."""
    if ctx.inv.shape is None or not ctx.total or {"gpu_memory_utilization", "model"} & remedy.changes.keys():
        return remedy  # (another model's shape is not known: the estimate is the current model's)
    if heal_as == Cause.KV_CACHE_INSUFFICIENT and "max_model_len" not in remedy.changes:
        return remedy
    if ctx.estimate(ctx.engine, ctx.inv.gpu_free_gib).failure == "cudagraph_capture_oom":
        return remedy
    after = remedy.apply(ctx.engine)
    if ctx.estimate(after, ctx.inv.gpu_free_gib).failure != "cudagraph_capture_oom":
        return remedy
    capture = Diagnosis(cause=Cause.CUDAGRAPH_CAPTURE_OOM)  # (no figure of this crash sizes the room)
    same_split = (after.tensor_parallel_size, after.pipeline_parallel_size) == (
        ctx.engine.tensor_parallel_size,
        ctx.engine.pipeline_parallel_size,
    )  # (else the weights vLLM printed are another split's)
    limits = _limits(ctx.spec, after, ctx.inv, ctx.total, ctx.num("weights_gib") if same_split else None)
    room = room_for_graphs(Context(ctx.spec, after, capture, ctx.inv, limits))
    if room is None or check(Cause.CUDAGRAPH_CAPTURE_OOM, room.changes, after, model, memory_limit, limits, failed):
        return remedy
    both = {**remedy.changes, **room.changes}
    if not ctx.estimate(room.apply(after), ctx.inv.gpu_free_gib).fits:
        return remedy
    new = room.changes["gpu_memory_utilization"]
    if heal_as == Cause.KV_CACHE_INSUFFICIENT:
        # (the context cut was sized from vLLM's own figures: the cut's context is held to them too,
        # where the memory model's budget is above vLLM's)
        held = printed_context_after_cut(ctx, (ctx.engine.gpu_memory_utilization - new) * ctx.total)
        if held is not None and held < both["max_model_len"]:  # (a KV heal merges here only with a cut)
            fitted = shorter_context(ctx, held)
            if fitted is None:
                return remedy
            both["max_model_len"] = fitted
    return Remedy(
        remedy.action,
        both,
        f"{remedy.reason} With it, the memory model says CUDA-graph capture would run out of the room outside "
        f"the budget at utilization {ctx.engine.gpu_memory_utilization}: {new} in the same change.",
    )


def _repeat_below_weights(remedy: Remedy, history: list[dict[str, Any]], total: float | None) -> bool:
    """A repeated utilization cut sized from a later free figure that leaves less than the weights an
    earlier crash of this service printed (status.heals): a certain crash, where the repeat is meant
    to follow another process's growth only while the model still fits."""
    util = remedy.changes.get("gpu_memory_utilization")
    weights: list[float] = []
    for h in history:
        if h.get("action") == "IncreaseTensorParallel" or h.get("resplit"):
            weights = []  # printed per GPU of the split before this heal: another split's figure
            continue
        if h.get("other_split"):
            continue  # printed under a split one replica no longer runs on (a user's edit of TP or PP)
        if isinstance(h.get("numbers"), dict) and isinstance(h["numbers"].get("weights_gib"), (int, float)):
            weights.append(h["numbers"]["weights_gib"])
    return bool(util and total and weights and util * total < weights[-1])


def weights_leave_no_cache(ctx: Context) -> bool:
    """Whether a KV refusal is the weights' failure: on vLLM's printed KV budget where it printed one
    (still empty at the bounds' highest utilization: no cache flag helps), else on the printed weights
    against the GPU (weights_beyond_gpu), and never where vLLM printed a size its cache does hold
    (an estimated length, a token count, state blocks): a KV flag is sized from those."""
    total, top, budget = ctx.total, ctx.policy.bounds.max_gpu_memory_utilization, ctx.printed_kv_budget()
    if budget is not None and total:
        return budget + (top - ctx.engine.gpu_memory_utilization) * total <= 0
    if any(ctx.num(k) for k in ("estimated_max_model_len", "kv_tokens", "mamba_blocks", "available_gib")):
        return False
    return weights_beyond_gpu(ctx) is not None


def plan_from_command(flags: str, diagnosis: Diagnosis, gpu_memory_gib: float | None = None) -> Remedy:
    """For `diagnose --engine-args`: a remedy for a plain command line, with the CRD's default policy. Where
    the line names no utilization, the one that ran: vLLM's printed figure, else the logged release's
    default (0.92 from 0.20: a KV raise sized from 0.9 fell 0.02 short, a certain second crash). An
    abbreviation of a flag a remedy is sized from (`--gpu-memory-util 0.8`) is refused (EngineArgsError),
    as `plan` and `serve` refuse it: sized as though the line named none, the remedy would be wrong."""
    parsed = parse_args(flags)
    engine, note = parsed.engine, ""
    abbreviated = abbreviated_flag(engine.extra_args)
    if abbreviated:
        raise EngineArgsError(
            f"{abbreviated[0]!r} is read by vLLM as {abbreviated[1].cli}: spell it {abbreviated[1].cli}"
        )
    if "gpu_memory_utilization" not in engine.model_fields_set:
        printed = diagnosis.numbers.get("util")
        ran = printed if isinstance(printed, float) and 0 < printed <= 1 else None
        release = logged_release(diagnosis.numbers)
        if ran is None and any(spelled_by(t, "--config") for t in engine.extra_args):
            note = " (--engine-args names --config, whose file may set another --gpu-memory-utilization: "
            note += f"taken as vLLM's own default, {default_utilization(release) or 0.9:g})"
        ran = ran or default_utilization(release)
        if ran is None:
            named = f"the log names vLLM {release}, newer than those read" if release else "the log names no release"
            note = (
                f" (--engine-args names no --gpu-memory-utilization and {named}: taken as 0.9; "
                "vLLM's own default is 0.92 from 0.20.0)"
            )
        else:
            engine = engine.model_copy(update={"gpu_memory_utilization": ran})
    spec = VLLMServiceSpec(model=parsed.model or "model", engine=engine)
    remedy = plan_heal(spec, diagnosis, inventory=Inventory(gpu_total_gib=gpu_memory_gib))
    if note and "gpu_memory_utilization" in remedy.changes:
        remedy.reason += note
    return remedy
