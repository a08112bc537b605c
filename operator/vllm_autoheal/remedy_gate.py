"""The one safety gate every remedy passes, in the operator, in `serve` and in `diagnose`. Pure.

A remedy gets through only when every value it sets is finite, inside the CRD's ranges and
`spec.heal.bounds`, moves in the direction its cause calls for, actually changes something,
and does not go back to settings that already crashed of memory. Otherwise the planner tries
its next remedy, or gives up with the gate's reason.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .api import EngineArgs, HealBounds
from .gpu_catalog import lookup
from .memory import ModelShape, estimate
from .offload_pinned import held_beside_offload_gib, most_offload_gib, offload_host_gib, pinned_gib
from .quantity import parse_quantity
from .vllm_release import Release

UP, DOWN, ANY = 1, -1, 0
# What each cause calls for: the fields a remedy for it may touch, and which way they may move.
CALLS_FOR: dict[str, dict[str, int]] = {
    "kv_cache_insufficient": {
        "gpu_memory_utilization": UP,
        "max_model_len": DOWN,
        "kv_cache_dtype": ANY,
        "tensor_parallel_size": UP,
        "max_num_seqs": DOWN,  # a Mamba hybrid's state blocks: one per running sequence
        "enforce_eager": UP,  # where the release takes the CUDA graphs' estimate off the cache
    },
    "gpu_util_exceeds_free": {
        "gpu_memory_utilization": DOWN,
        "kv_cache_memory_bytes": DOWN,
        "max_model_len": DOWN,
        "kv_cache_dtype": ANY,  # (fp8, only with the cut, where the context may not be shortened: ONLY_WITH)
        "tensor_parallel_size": UP,  # where the weights do not fit beside the others at any share
    },
    "weights_load_oom": {
        "model": ANY,
        "quantization": ANY,
        "tensor_parallel_size": UP,
        "cpu_offload_gb": UP,
        # only with more TP (ONLY_WITH): where no split within the bound keeps the context at the share that ran,
        # a larger share (within what is free), else a shorter context
        "gpu_memory_utilization": UP,
        "max_model_len": DOWN,
    },
    # (a utilization cut with the context the smaller cache holds, where it leaves it too small:
    # share_steps.with_context_held; only with the cut, ONLY_WITH)
    "profiling_oom": {
        "max_num_seqs": DOWN,
        "max_num_batched_tokens": DOWN,
        "gpu_memory_utilization": DOWN,
        "max_model_len": DOWN,
    },
    "cudagraph_capture_oom": {"enforce_eager": UP, "gpu_memory_utilization": DOWN, "max_model_len": DOWN},
    "runtime_oom": {
        "kv_cache_memory_bytes": DOWN,  # where it, not the utilization, sizes the cache
        "gpu_memory_utilization": DOWN,
        "max_num_seqs": DOWN,
        "max_num_batched_tokens": DOWN,
        "max_model_len": DOWN,
    },
    "multi_gpu_oom": {"max_model_len": DOWN, "gpu_memory_utilization": DOWN, "enforce_eager": UP},
    "host_ram_oom": {"memory_limit": UP, "cpu_offload_gb": DOWN, "kv_cache_memory_bytes": DOWN},
}
# (cause, field) -> the fields one of which must change with it: these moves only go with a split or the
# quantized checkpoint (whose weights leave a share too small, or its context too long), or a split only
# with a share of what was free.
ONLY_WITH: dict[tuple[str, str], tuple[str, ...]] = {
    ("weights_load_oom", "gpu_memory_utilization"): ("tensor_parallel_size", "model"),
    ("weights_load_oom", "max_model_len"): ("tensor_parallel_size", "model"),
    ("gpu_util_exceeds_free", "tensor_parallel_size"): ("gpu_memory_utilization",),
    ("profiling_oom", "max_model_len"): ("gpu_memory_utilization",),
    ("runtime_oom", "max_model_len"): ("gpu_memory_utilization", "kv_cache_memory_bytes"),
    # (an fp8 cache with the cut to what is free, whose smaller cache holds the context only so: with_context_held)
    ("gpu_util_exceeds_free", "kv_cache_dtype"): ("gpu_memory_utilization",),
}
# Figures vLLM takes per GPU that a split may lower, whatever its cause: each of the more ranks holds its
# share of what one did (cpu_offload_gb: the host memory that ran, over more ranks).
PER_RANK_WITH_SPLIT = frozenset({"cpu_offload_gb"})
# Actions whose pods ask the scheduler for more than before (more GPUs, more memory).
NEEDS_MORE_RESOURCES = frozenset({"IncreaseTensorParallel", "RaiseMemoryLimit"})
MIN_UTILIZATION = 0.01


def fingerprint(model: str, engine: EngineArgs, memory_limit: str | None) -> str:
    """The identity of what a pod template runs (also the template's engine-hash annotation)."""
    blob = json.dumps([model, engine.model_dump(mode="json"), memory_limit], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Limits:
    """The bounds in force for one decision: spec.heal.bounds, with the utilization floor made concrete."""

    bounds: HealBounds
    utilization_floor: float | None = None  # None: no known need; vLLM's own figures decide
    memory_limit_bytes: int | None = None  # the container's limit now (caps CPU offload when unbounded)
    # the least utilization that ran out of memory outside the budget (while serving, or capturing graphs):
    # no raise goes back to it (a KV heal after a runtime cut would bring the runtime OOM back)
    ceiling: float | None = None
    # the least memory limit a heal raised to that no node could take (reverted): no raise goes back to it
    refused_memory_limit: int | None = None
    # the fewest GPUs a pod that a heal split to asked for and no node could take (reverted): no split goes back
    refused_gpus: int | None = None

    @property
    def floor(self) -> float:
        return self.utilization_floor or self.bounds.min_gpu_memory_utilization or MIN_UTILIZATION

    def max_cpu_offload_gb(self, engine: EngineArgs, shape: ModelShape | None) -> float:
        """The most cpu_offload_gb: the bound, else what the container's limit holds, else none (the host
        memory it would take is unknown)."""
        if self.bounds.max_cpu_offload_gb is not None:
            return self.bounds.max_cpu_offload_gb
        held = self.offload_the_limit_holds(engine, shape)
        return 0.0 if held is None else held

    def offload_the_limit_holds(self, engine: EngineArgs, shape: ModelShape | None) -> float | None:
        """The most cpu_offload_gb the container's limit holds on every rank (vLLM's flag is per GPU, and each
        rank pins it rounded up block by block: offload_pinned.py), whatever the bound; None without a limit, or where
        what vLLM holds beside the offload cannot be told (a connector's buffer, ranks not said plainly)."""
        if self.memory_limit_bytes is None or held_beside_offload_gib(engine) is None:
            return None
        return most_offload_gib(shape, engine, offload_host_gib(self.memory_limit_bytes, engine))


def utilization_floor(
    bounds: HealBounds,
    engine: EngineArgs,
    shape: ModelShape | None,
    total_gib: float | None,
    entrypoint: str = "server",
    gpu_name: str = "",
    release: Release | None = None,
) -> float | None:
    """An explicit bound wins; with the model's shape, what holds the weights, the activation peak, the
    CUDA graphs where the release reserves them inside the budget and a KV cache of minMaxModelLen;
    without it, None (the numbers vLLM printed decide)."""
    if bounds.min_gpu_memory_utilization is not None:
        return bounds.min_gpu_memory_utilization
    if shape is None or not total_gib:
        return None
    need_len = engine.model_copy(update={"max_model_len": bounds.min_max_model_len, "kv_cache_memory_bytes": None})
    est = estimate(shape, need_len, lookup(gpu_name or "gpu", total_gib), None, entrypoint, release)
    need = est.weights_gib + est.activation_gib + est.non_torch_gib + est.kv_needed_gib
    need += est.cudagraph_gib if est.graphs_in_budget else 0.0  # (the release takes them off the cache)
    return min(1.0, math.ceil(need / total_gib * 100) / 100)


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _as_number(field: str, value: Any) -> float | None:
    if value is None:
        return None
    if field == "memory_limit":
        return float(parse_quantity(value))
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def bounds_problem(changes: dict[str, Any], after: EngineArgs, limits: Limits) -> str | None:
    """Why `after` is outside the bounds in the fields `changes` names, or None."""
    b = limits.bounds
    checks: list[tuple[str, Any, float | None, float | None]] = [
        ("gpu_memory_utilization", after.gpu_memory_utilization, limits.floor, b.max_gpu_memory_utilization),
        ("max_model_len", after.max_model_len, b.min_max_model_len, None),
        ("max_num_seqs", after.max_num_seqs, b.min_max_num_seqs, None),
        ("max_num_batched_tokens", after.max_num_batched_tokens, b.min_max_num_batched_tokens, None),
        ("kv_cache_memory_bytes", after.kv_cache_memory_bytes, b.min_kv_cache_memory_bytes, None),
        ("cpu_offload_gb", after.cpu_offload_gb, 0, b.max_cpu_offload_gb),
        ("tensor_parallel_size", after.tensor_parallel_size, 1, b.max_tensor_parallel_size or 1),
    ]
    for name, value, low, high in checks:
        if name not in changes or value is None:
            continue
        if low is not None and value < low:
            return f"{name} {value} is below its bound {low}"
        if high is not None and value > high:
            return f"{name} {value} is above its bound {high}"
    gpus = after.tensor_parallel_size * after.pipeline_parallel_size
    if limits.refused_gpus is not None and {"tensor_parallel_size", "pipeline_parallel_size"} & set(changes):
        if gpus >= limits.refused_gpus:
            return f"{gpus} GPUs a pod is at or above the {limits.refused_gpus} no node could take"
    if "memory_limit" in changes:
        if not b.max_memory_limit:
            return "raising the memory limit needs heal.bounds.maxMemoryLimit"
        if parse_quantity(changes["memory_limit"]) > parse_quantity(b.max_memory_limit):
            return f"memory limit {changes['memory_limit']} is above its bound {b.max_memory_limit}"
        if (
            limits.refused_memory_limit is not None
            and parse_quantity(changes["memory_limit"]) >= limits.refused_memory_limit
        ):
            return f"memory limit {changes['memory_limit']} is at or above one no node could take"
    return None


def refused_memory_limit(history: list[dict[str, Any]]) -> int | None:
    """The least memory limit a heal raised to whose pods could not be scheduled (kube.status.history's
    `refused_memory_limit`, from the records of their reverts), or None."""
    refused = []
    for h in history:
        try:
            refused.append(parse_quantity(str(h["refused_memory_limit"])))
        except (KeyError, ValueError):
            continue
    return min(refused, default=None)


def refused_gpus(history: list[dict[str, Any]]) -> int | None:
    """The fewest GPUs a pod asked for, after a heal's split, that no node could take (kube.status.history's
    `refused_gpus`, from the records of their reverts), or None."""
    refused = [h["refused_gpus"] for h in history if isinstance(h.get("refused_gpus"), int) and h["refused_gpus"] > 1]
    return min(refused, default=None)


def batch_below_seqs(engine: EngineArgs) -> bool:
    """The CRD's rule on EngineArgs (maxNumBatchedTokens >= maxNumSeqs, vLLM refuses to start
    otherwise) as Python reads it: CEL rules are checked by the API server, not by pydantic."""
    seqs, batched = engine.max_num_seqs, engine.max_num_batched_tokens
    return bool(seqs and batched and batched < seqs)


def _splits(changes: dict[str, Any], engine: EngineArgs) -> bool:
    """Whether `changes` split the model over more GPUs than `engine` ran on."""
    tp = changes.get("tensor_parallel_size")
    return isinstance(tp, int) and not isinstance(tp, bool) and tp > engine.tensor_parallel_size


def _moves(name: str, changes: dict[str, Any], engine: EngineArgs, model: str) -> bool:
    """Whether `changes` moves `name` off what is deployed (a companion set to its own value moves nothing)."""
    if name not in changes:
        return False
    return changes[name] != (model if name == "model" else getattr(engine, name, None))


def _offload_problem(
    offload: float, ranks: int, cap: float, after: EngineArgs, shape: ModelShape | None, limits: Limits
) -> str:
    what = f"cpu_offload_gb {offload:g} on each of {ranks} GPU(s)"
    if limits.bounds.max_cpu_offload_gb is not None:
        return f"{what} is above its bound {cap:g}"
    if limits.memory_limit_bytes is None:
        return (
            f"{what}: no memory limit says how much host memory it may pin (set maxCpuOffloadGb in spec.heal.bounds, "
            "or serve's --max-cpu-offload-gb)"
        )
    return (
        f"{what} pins about {pinned_gib(shape, after, offload):.1f} GiB each, more than the container's memory limit "
        f"holds beside vLLM's processes (at most {cap:.1f} GiB offloaded a GPU)"
    )


def check(
    cause: str,
    changes: dict[str, Any],
    engine: EngineArgs,
    model: str,
    memory_limit: str | None,
    limits: Limits,
    failed: Collection[str] = (),
    shape: ModelShape | None = None,
) -> str | None:
    """None when the remedy may be applied; else why not, for people. `shape`: the model's, which sizes the
    host memory an offload pins."""
    if not changes:
        return "it changes nothing"
    calls_for = dict(CALLS_FOR.get(cause, {}))
    if _splits(changes, engine):
        calls_for.update({name: ANY if name in calls_for else DOWN for name in PER_RANK_WITH_SPLIT})
    for name, value in changes.items():
        if not _finite(value):
            return f"{name} {value!r} is not a finite number"
        if name not in calls_for:
            return f"{name} is not what {cause} calls for"
        if (companions := ONLY_WITH.get((cause, name))) and not any(
            _moves(c, changes, engine, model) for c in companions
        ):
            return f"{name} moves for {cause} only with {' or '.join(companions)}"
    engine_changes = {k: v for k, v in changes.items() if k in EngineArgs.model_fields}
    try:  # the CRD's ranges and rules, from the same models that generate it
        after = EngineArgs.model_validate({**engine.model_dump(), **engine_changes})
    except ValidationError as exc:
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    if batch_below_seqs(after):
        return "max_num_batched_tokens would be below max_num_seqs"
    try:
        if problem := bounds_problem(changes, after, limits):
            return problem
        # (vLLM's figure is per GPU: a split that keeps it pins it on each new rank too; one that keeps
        # the host memory that ran, spread over more ranks, asks for no more of it)
        offload, ranks = after.cpu_offload_gb or 0.0, after.tensor_parallel_size * after.pipeline_parallel_size
        more = (
            offload * ranks
            > (engine.cpu_offload_gb or 0.0) * engine.tensor_parallel_size * engine.pipeline_parallel_size
        )
        if more and offload > (cap := limits.max_cpu_offload_gb(after, shape)):
            return _offload_problem(offload, ranks, cap, after, shape, limits)
        if limits.ceiling is not None and after.gpu_memory_utilization > engine.gpu_memory_utilization:
            if after.gpu_memory_utilization >= limits.ceiling:
                return (
                    f"gpu_memory_utilization {after.gpu_memory_utilization} is at or above "
                    f"{limits.ceiling}, which already ran out of memory outside the budget"
                )
        now = {**engine.model_dump(), "model": model, "memory_limit": memory_limit}
        for name, direction in ((k, calls_for[k]) for k in changes):
            before, new = _as_number(name, now.get(name)), _as_number(name, changes[name])
            if direction == ANY or new is None:
                continue
            if before is None:  # unset: a vLLM default. Setting a cap where none was is "down";
                if direction == DOWN:  # raising from unset only counts from zero (offload)
                    continue
                before = 0.0
            if (new - before) * direction <= 0:
                return f"{name} {now.get(name)} -> {changes[name]} does not move the way {cause} calls for"
    except ValueError as exc:  # an unreadable quantity
        return str(exc)
    new_model = changes.get("model", model)
    new_memory = changes.get("memory_limit", memory_limit)
    if fingerprint(new_model, after, new_memory) == fingerprint(model, engine, memory_limit):
        return "it changes nothing"
    if fingerprint(new_model, after, new_memory) in failed:
        return "these settings already crashed of memory"
    return None
