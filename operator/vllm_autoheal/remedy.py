"""Owns heal planning: plan_heal(spec, diagnosis, history, inventory) -> Remedy, the one flag change that should fit.

Pure. Each cause has an ordered list of actions (PLANS); the first one
that is allowed, not already tried for this cause, applicable to what is known, and
let through by the safety gate (remedy_gate.py) wins. Sizes come from the numbers vLLM printed
(estimated maximum model length, free/total GiB, tried-to-allocate) and from the
memory model when it printed none. Blind stepping is the last resort, never the
first: a model load costs minutes on a real GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from .api import EngineArgs, HealPolicy, VLLMServiceSpec
from .diagnosis import Diagnosis
from .diagnosis.model import Cause
from .diagnosis.units import GIB, MIB
from .engine import BY_FIELD, parse_args
from .gpu_catalog import GpuSpec
from .memory import (
    BLOCK_SIZE,
    CUDA_CONTEXT_GIB,
    CUDAGRAPH_GIB,
    ModelShape,
    default_max_num_batched_tokens,
    default_max_num_seqs,
    estimate,
)
from .quantity import format_bytes, parse_quantity
from .remedy_gate import Limits, check, utilization_floor

# Raising the memory limit again is a new, larger value each time (VPA bumps on every OOM).
REPEATABLE = {"RaiseMemoryLimit"}
NO_CHANGE = "NoChange"
GIVE_UP = "GiveUp"
VPA_RATIO, VPA_MIN_BUMP = 1.2, 100 * MIB  # Kubernetes VPA's OOM bump (DefaultOOMBumpUpRatio/MinBumpUp)


@dataclass
class Inventory:
    """What is known about where the engine runs; every field may be unknown."""

    gpu_total_gib: float | None = None
    gpu_free_gib: float | None = None  # free before vLLM starts (other processes excluded)
    shape: ModelShape | None = None
    memory_limit_bytes: int | None = None  # the container's limit (host RAM)
    entrypoint: str = "server"


@dataclass
class Remedy:
    action: str
    changes: dict[str, Any] = field(default_factory=dict)  # EngineArgs field (or memory_limit/model) -> value
    reason: str = ""
    expected: str = ""

    @property
    def gives_up(self) -> bool:
        return self.action in (NO_CHANGE, GIVE_UP)

    def flags(self) -> str:
        out = []
        for key, value in self.changes.items():
            flag = BY_FIELD.get(key)
            if flag is None:
                out.append(f"{key}={value}")
            elif flag.kind is bool:
                out.append(flag.cli if value else f"--no-{flag.cli[2:]}")
            else:
                out.append(f"{flag.cli} {value}")
        return " ".join(out)

    def summary(self) -> str:
        if self.gives_up:
            return f"{self.action}: {self.reason}"
        text = f"{self.action}: {self.flags()} - {self.reason}"
        return text + (f" Expected: {self.expected}" if self.expected else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def apply(self, engine: EngineArgs) -> EngineArgs:
        return engine.model_copy(update={k: v for k, v in self.changes.items() if k in EngineArgs.model_fields})


@dataclass
class Context:
    spec: VLLMServiceSpec
    engine: EngineArgs
    diag: Diagnosis
    inv: Inventory
    limits: Limits

    @property
    def policy(self) -> HealPolicy:
        return self.spec.heal

    @property
    def floor(self) -> float:
        """The lowest utilization a heal may set (an explicit bound, else the model's need)."""
        return self.limits.floor

    def num(self, key: str) -> float | None:
        return _number(self.diag, key)

    @property
    def total(self) -> float | None:
        # vLLM's own figure first: NVML's total (140.40 GiB on an H200) is not torch's (139.80).
        return self.num("total_gib") or self.num("gpu_total_gib") or self.inv.gpu_total_gib

    def free_for_vllm(self) -> float | None:
        """GPU memory vLLM can ask for: what is free, less its CUDA context and graph headroom."""
        free = self.inv.gpu_free_gib
        if free is None and self.total and self.diag.cause != "gpu_util_exceeds_free":
            free = self.total  # a Kubernetes GPU is the pod's alone
        if free is None:
            return None
        return free - CUDA_CONTEXT_GIB - (0 if self.engine.enforce_eager else CUDAGRAPH_GIB)


Step = Callable[[Context], "Remedy | None"]


def _number(diag: Diagnosis, key: str) -> float | None:
    """A figure vLLM printed, when it is a plausible one (finite, not negative)."""
    value = diag.numbers.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _util(value: float, down: bool = True) -> float:
    """Round a utilization to 0.01, in the safe direction."""
    return (math.floor if down else math.ceil)(round(value * 100, 6)) / 100


def _len(value: float) -> int:
    return int(value // BLOCK_SIZE) * BLOCK_SIZE


def _expect(ctx: Context, changes: dict[str, Any]) -> str:
    """The memory model's verdict on the changed flags, when it knows the model and GPU."""
    if ctx.inv.shape is None or not ctx.total:
        return ""
    after = ctx.engine.model_copy(update={k: v for k, v in changes.items() if k in EngineArgs.model_fields})
    est = estimate(ctx.inv.shape, after, GpuSpec("gpu", ctx.total), ctx.inv.gpu_free_gib, ctx.inv.entrypoint)
    verdict = "fits" if est.fits else f"still fails: {'; '.join(est.reasons)}"
    return (
        f"KV cache {est.kv_cache_gib:.2f} GiB holds {est.kv_tokens:,} tokens for max_model_len "
        f"{est.max_model_len:,} ({verdict})."
    )


def raise_utilization_for_kv(ctx: Context) -> Remedy | None:
    needed, available, total = ctx.num("needed_gib"), ctx.num("available_gib"), ctx.total
    room = ctx.free_for_vllm()
    if needed is None or available is None or not total or room is None:
        return None
    want = _util(ctx.engine.gpu_memory_utilization + (needed - available) / total + 0.01, down=False)
    limit = min(ctx.policy.bounds.max_gpu_memory_utilization, _util(room / total))
    if want > limit:
        return None
    return Remedy(
        "RaiseGpuMemoryUtilization",
        {"gpu_memory_utilization": want},
        f"the KV cache needs {needed:g} GiB and has {available:g} GiB; the GPU has room for "
        f"utilization {want} (free memory allows up to {limit}), so no context is lost.",
    )


def lower_max_model_len(ctx: Context) -> Remedy | None:
    estimated = ctx.num("estimated_max_model_len") or ctx.num("kv_tokens")
    source = (
        ("the memory model's estimate (3% margin)" if ctx.diag.source == "memory-model" else "vLLM's own estimate")
        if estimated
        else ""
    )
    if not estimated and ctx.inv.shape is not None and ctx.total:
        est = estimate(ctx.inv.shape, ctx.engine, GpuSpec("gpu", ctx.total), ctx.inv.gpu_free_gib, ctx.inv.entrypoint)
        estimated, source = est.max_model_len_fit * 0.97, "the memory model (with a 3% margin)"
    if not estimated:
        return None
    new = _len(estimated)
    current = ctx.engine.max_model_len or int(ctx.num("max_seq_len") or 0) or None
    if new < ctx.policy.bounds.min_max_model_len or (current is not None and new >= current):
        return None
    return Remedy(
        "LowerMaxModelLen",
        {"max_model_len": new},
        f"the KV cache holds {int(estimated):,} tokens by {source}; max_model_len "
        f"{current or 'default'} -> {new:,} (a multiple of the {BLOCK_SIZE}-token block).",
    )


def raise_utilization_blind(ctx: Context) -> Remedy | None:
    """No numbers: the cache got no block at all. Give it what the GPU allows, within bounds."""
    total, room = ctx.total, ctx.free_for_vllm()
    limit = ctx.policy.bounds.max_gpu_memory_utilization
    if total and room is not None:
        limit = min(limit, _util(room / total))
    if limit <= ctx.engine.gpu_memory_utilization:
        return None
    return Remedy(
        "RaiseGpuMemoryUtilization",
        {"gpu_memory_utilization": limit},
        "no memory was left for a single KV block; utilization raised to the most the bounds and free memory allow.",
    )


def fp8_kv_cache(ctx: Context) -> Remedy | None:
    if (ctx.engine.kv_cache_dtype or "auto").startswith("fp8"):
        return None
    return Remedy("Fp8KvCache", {"kv_cache_dtype": "fp8"}, "an fp8 KV cache holds twice the tokens per GiB.")


def more_tensor_parallel(ctx: Context) -> Remedy | None:
    tp, limit = ctx.engine.tensor_parallel_size, ctx.policy.bounds.max_tensor_parallel_size
    if not limit or tp * 2 > limit:
        return None
    if ctx.inv.shape is not None and ctx.inv.shape.heads % (tp * 2):
        return None
    return Remedy(
        "IncreaseTensorParallel",
        {"tensor_parallel_size": tp * 2},
        f"split the model over {tp * 2} GPUs: half the weights and KV per GPU.",
    )


def fit_utilization_to_free(ctx: Context) -> Remedy | None:
    if ctx.diag.subtype == "kv_space_exceeds_free_host_memory":
        # (the CPU backend's free figure at KV allocation is what is left after the worker's own
        # memory: sized to it, the worker's whole budget would not hold the worker)
        return None
    free, total = ctx.num("free_gib"), ctx.total
    if free is None and ctx.inv.gpu_free_gib is not None:  # not printed: the probe's figure at start
        free = ctx.inv.gpu_free_gib - CUDA_CONTEXT_GIB
    if free is None or not total or ctx.engine.kv_cache_memory_bytes:
        return None  # with kv_cache_memory_bytes set, utilization does not size the KV cache
    cpu = ctx.diag.subtype == "cpu_memory_share_exceeds_free"
    # The printed free figure already excludes vLLM's own CUDA context. On a GPU keep room for the
    # CUDA graphs (captured outside the budget) plus 0.5 GiB and 1%; free host memory moves between
    # runs (page cache, NUMA accounting), so on the CPU backend keep a quarter back.
    graphs = 0.0 if ctx.engine.enforce_eager else CUDAGRAPH_GIB
    margin = 0.25 * free if cpu else graphs + 0.5 + 0.01 * total
    new = _util((free - margin) / total)
    if new < ctx.floor or new >= ctx.engine.gpu_memory_utilization:
        return None
    return Remedy(
        "LowerGpuMemoryUtilization",
        {"gpu_memory_utilization": new},
        f"only {free:g} of {total:g} GiB was free at start; utilization {new} asks for "
        f"{new * total:.2f} GiB, leaving {free - new * total:.2f} GiB of margin.",
    )


# vLLM's CPU backend sets the KV size from this variable over --kv-cache-memory-bytes (platforms/cpu.py).
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def fit_kv_bytes_to_free(ctx: Context) -> Remedy | None:
    free, requested = ctx.num("free_gib"), ctx.num("requested_gib")
    if free is None or any(e.name == CPU_KV_SPACE_ENV for e in ctx.spec.env):
        return None  # (the variable would override the flag: the change could not take effect)
    explicit = ctx.num("worker_budget_gib") is None  # vLLM was given the KV size, not sizing it itself
    if ctx.diag.subtype == "kv_space_exceeds_free_host_memory" and explicit and not ctx.engine.kv_cache_memory_bytes:
        return None  # a size the spec did not set came from the variable (envFrom, the image): it would win again
    if ctx.diag.subtype == "kv_space_exceeds_free_host_memory":
        new_gib = math.floor((free * 0.75) * 4) / 4  # the KV alone must fit what is free, with margin
    elif ctx.total and ctx.inv.shape is not None:
        est = estimate(ctx.inv.shape, ctx.engine, GpuSpec("gpu", ctx.total), None, ctx.inv.entrypoint)
        new_gib = math.floor((free - est.weights_gib - est.activation_gib - est.non_torch_gib - 1.0) * 4) / 4
    else:
        return None
    if not math.isfinite(new_gib) or new_gib <= 0 or (requested is not None and new_gib >= requested):
        return None
    return Remedy(
        "SetKvCacheMemoryBytes",
        {"kv_cache_memory_bytes": int(new_gib * GIB)},
        f"{free:g} GiB was free; the KV cache is set to {new_gib:g} GiB so that it fits.",
    )


def quantized_model(ctx: Context) -> Remedy | None:
    fb = ctx.policy.quantized_fallback
    if not fb.allowed or not fb.model or ctx.spec.model == fb.model:
        return None
    return Remedy(
        "Quantize",
        {"model": fb.model, "quantization": fb.method},
        f"the weights do not fit; switching to the quantized {fb.model} ({fb.method}) the policy names.",
    )


def cpu_offload(ctx: Context) -> Remedy | None:
    shape, total = ctx.inv.shape, ctx.total
    if shape is None or not total:
        return None
    est = estimate(shape, ctx.engine, GpuSpec("gpu", total), ctx.inv.gpu_free_gib, ctx.inv.entrypoint)
    budget = est.requested_gib - est.activation_gib - est.non_torch_gib - 0.1 * est.requested_gib
    over = est.weights_gib - budget
    if over <= 0:
        return None
    gb = math.ceil(over + (ctx.engine.cpu_offload_gb or 0))
    cap = ctx.limits.max_cpu_offload_gb
    if not math.isfinite(over) or (cap is not None and gb > cap):
        return None
    return Remedy(
        "CpuOffload",
        {"cpu_offload_gb": float(gb)},
        f"the weights exceed the budget by {over:.1f} GiB; {gb} GiB per GPU moves to host RAM (slower).",
    )


def _halve(
    field_name: str, action: str, floor_of: Callable[[Context], int], default: Callable[[Context], int], why: str
) -> Step:
    def step(ctx: Context) -> Remedy | None:
        current = getattr(ctx.engine, field_name) or default(ctx)
        new = max(floor_of(ctx), current // 2)
        if field_name == "max_num_batched_tokens" and ctx.engine.max_num_seqs:
            new = max(new, ctx.engine.max_num_seqs)
        if new >= current:
            return None
        return Remedy(action, {field_name: new}, why.format(current=current, new=new))

    return step


def _seqs_default(ctx: Context) -> int:
    dummy = ctx.num("dummy_requests")
    return int(dummy) if dummy else default_max_num_seqs(ctx.total or 0)


def _mbt_default(ctx: Context) -> int:
    return default_max_num_batched_tokens(ctx.total or 24, ctx.inv.entrypoint)


def seqs_from_allocation(ctx: Context) -> Remedy | None:
    """vLLM warms the sampler up with max_num_seqs dummy requests; the failed allocation is that many
    rows of logits. Size max_num_seqs so the same allocation takes at most a quarter of what was free,
    as a power of two, and no more than vLLM's default for this GPU (which the warm-up is built for)."""
    tried, dummy, free = ctx.num("tried_gib"), ctx.num("dummy_requests"), ctx.num("gpu_free_gib")
    current = ctx.engine.max_num_seqs or (int(dummy) if dummy else None)
    if (
        not dummy
        and ctx.engine.max_num_seqs
        and ctx.total
        and ctx.engine.max_num_seqs > default_max_num_seqs(ctx.total)
    ):
        dummy = ctx.engine.max_num_seqs  # the warm-up batch is max_num_seqs requests (vLLM 0.25 prints no count)
    if not tried or not dummy or not current:
        return None
    per_seq = tried / dummy
    room = (free if free is not None else (ctx.total or 0) * 0.5) * 0.25
    if room <= 0:
        return None
    fits = max(1, int(room / per_seq))
    new = 2 ** int(math.log2(fits))
    if ctx.total:
        new = min(new, default_max_num_seqs(ctx.total))
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
    allocate and 0.5 GiB) below the budget instead of giving them up."""
    total = ctx.total
    if not total or ctx.engine.enforce_eager or ctx.engine.kv_cache_memory_bytes:
        return None
    current = ctx.engine.gpu_memory_utilization
    headroom = (1 - current) * total
    need = CUDAGRAPH_GIB + (ctx.num("tried_gib") or 0.0) + 0.5
    if headroom >= need + 1.0:
        return None  # the graphs had room already: something else took it; keep the next step
    new = min(_util(current - (need - max(headroom, 0.0)) / total), ctx.policy.bounds.max_gpu_memory_utilization)
    if (ctx.floor is not None and new < ctx.floor) or new >= current:
        return None
    return Remedy(
        "LowerGpuMemoryUtilization",
        {"gpu_memory_utilization": new},
        f"CUDA-graph capture ran out of the {headroom:.2f} GiB left outside the budget; utilization "
        f"{current} -> {new} leaves {(1 - new) * total:.2f} GiB for the graphs (about "
        f"{CUDAGRAPH_GIB:g} GiB) and keeps them.",
    )


def enforce_eager(ctx: Context) -> Remedy | None:
    if ctx.engine.enforce_eager:
        return None
    return Remedy(
        "EnforceEager",
        {"enforce_eager": True},
        "skip CUDA-graph capture and the ~1 GiB it takes beyond the budget (some decode speed is lost).",
    )


def lower_utilization_step(ctx: Context) -> Remedy | None:
    """Leave headroom sized from what failed to allocate (or ~1 GiB of graphs), at least 0.02."""
    if ctx.diag.cause == "gpu_util_exceeds_free" and ctx.num("free_gib") is not None:
        return None  # the free figure was printed: fit_utilization_to_free sized it; stepping is blind
    total = ctx.total
    tried = ctx.num("tried_gib") or 0.0
    step = 0.02 if not total else max(0.02, _util((tried + 0.5) / total, down=False))
    new = _util(ctx.engine.gpu_memory_utilization - step)
    if new < ctx.floor:
        return None
    basis = f"{tried:g} GiB failed to allocate" if tried else "no allocation size was printed"
    return Remedy(
        "LowerGpuMemoryUtilization",
        {"gpu_memory_utilization": new},
        f"{basis}; utilization {ctx.engine.gpu_memory_utilization} -> {new} leaves that much headroom.",
    )


def raise_memory_limit(ctx: Context) -> Remedy | None:
    limit_text = ctx.policy.bounds.max_memory_limit
    used = ctx.inv.memory_limit_bytes
    if not limit_text or not used:
        return None
    new = max(int(used * VPA_RATIO), used + VPA_MIN_BUMP)
    cap = parse_quantity(limit_text)
    new = min(new, cap)
    if new <= used:
        return None
    return Remedy(
        "RaiseMemoryLimit",
        {"memory_limit": format_bytes(new)},
        f"the container was killed at its {format_bytes(used)} limit; raised VPA-style to "
        f"max(x1.2, +100Mi) = {format_bytes(new)} (bound {limit_text}).",
    )


def lower_cpu_offload(ctx: Context) -> Remedy | None:
    gb = ctx.engine.cpu_offload_gb
    if not gb:
        return None
    new = math.floor(gb / 2)
    return Remedy(
        "LowerCpuOffload",
        {"cpu_offload_gb": float(new)},
        f"cpu_offload_gb {gb:g} -> {new}: offloaded weights live in host RAM.",
    )


def shrink_kv_bytes(ctx: Context) -> Remedy | None:
    kv = ctx.engine.kv_cache_memory_bytes
    if not kv:
        return None
    new = kv // 2
    if ctx.inv.memory_limit_bytes:
        new = min(new, ctx.inv.memory_limit_bytes // 3)
    new = max(new // MIB, 1) * MIB
    new = max(new, ctx.policy.bounds.min_kv_cache_memory_bytes)
    return Remedy(
        "SetKvCacheMemoryBytes",
        {"kv_cache_memory_bytes": new},
        f"host RAM ran out; the KV cache {format_bytes(kv)} -> {format_bytes(new)}.",
    )


# Every cause has a row; an empty one means no change is ever made for it.
PLANS: dict[Cause, list[Step]] = {
    Cause.KV_CACHE_INSUFFICIENT: [
        raise_utilization_for_kv,
        lower_max_model_len,
        raise_utilization_blind,
        fp8_kv_cache,
        more_tensor_parallel,
    ],
    Cause.GPU_UTIL_EXCEEDS_FREE: [fit_utilization_to_free, fit_kv_bytes_to_free, lower_utilization_step],
    Cause.WEIGHTS_LOAD_OOM: [quantized_model, more_tensor_parallel, cpu_offload],
    Cause.PROFILING_OOM: [seqs_from_allocation, lower_seqs, lower_batched, lower_utilization_step],
    Cause.CUDAGRAPH_CAPTURE_OOM: [room_for_graphs, enforce_eager, lower_utilization_step],
    Cause.RUNTIME_OOM: [lower_utilization_step, lower_seqs, lower_batched],
    Cause.MULTI_GPU_OOM: [lower_max_model_len, lower_utilization_step, enforce_eager],
    Cause.HOST_RAM_OOM: [raise_memory_limit, lower_cpu_offload, shrink_kv_bytes],
    Cause.NOT_OOM: [],
    Cause.UNKNOWN: [],
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
    total = _number(diagnosis, "total_gib") or _number(diagnosis, "gpu_total_gib") or inv.gpu_total_gib
    floor = utilization_floor(spec.heal.bounds, engine, inv.shape, total, inv.entrypoint)
    limits = Limits(spec.heal.bounds, floor, inv.memory_limit_bytes)
    ctx = Context(spec, engine, diagnosis, inv, limits)
    allowed = set(spec.heal.allowed_actions) - set(exclude)
    refused: list[str] = []
    for step in PLANS[diagnosis.cause]:
        remedy = step(ctx)
        if remedy is None or remedy.action in tried or remedy.action not in allowed:
            continue
        problem = check(diagnosis.cause, remedy.changes, engine, model, memory_limit, limits, failed) or _cannot_fit(
            ctx, remedy
        )
        if problem is not None:
            refused.append(f"{remedy.action} refused: {problem}")
            continue
        remedy.expected = remedy.expected or _expect(ctx, remedy.changes)
        return remedy
    why = f"; {'; '.join(refused)}" if refused else ""
    advice = what_would_fit(ctx)
    return Remedy(
        GIVE_UP,
        reason=f"no allowed change is left for {diagnosis.cause} within the bounds "
        f"(tried: {', '.join(sorted(tried)) or 'none'}{why})." + (f" {advice}" if advice else ""),
    )


# Changes to the model or the GPU count are not the memory model's to veto: the estimate is per GPU
# of the current model.
_NOT_VETOED = {"Quantize", "IncreaseTensorParallel", "RaiseMemoryLimit"}
_MEMORY_MODEL_CAUSES = {"kv_cache_insufficient", "weights_load_oom", "gpu_util_exceeds_free"}


def _cannot_fit(ctx: Context, remedy: Remedy) -> str | None:
    """A change the memory model says still cannot start is never tried: a restart costs minutes.
    Only where the model's shape and the GPU are known, and for the causes it predicts well."""
    if (
        ctx.inv.shape is None
        or not ctx.total
        or remedy.action in _NOT_VETOED
        or ctx.diag.cause not in _MEMORY_MODEL_CAUSES
        or _sized_by_vllm(ctx, remedy)
    ):
        return None
    after = ctx.engine.model_copy(update={k: v for k, v in remedy.changes.items() if k in EngineArgs.model_fields})
    est = estimate(ctx.inv.shape, after, GpuSpec("gpu", ctx.total), ctx.inv.gpu_free_gib, ctx.inv.entrypoint)
    if est.fits:
        return None
    return f"the memory model says it still does not fit ({'; '.join(est.reasons)[:200]})"


def _sized_by_vllm(ctx: Context, remedy: Remedy) -> bool:
    """vLLM's own figures for this very run outrank the memory model's estimate."""
    needs = {
        "LowerMaxModelLen": ("estimated_max_model_len", "kv_tokens"),
        "RaiseGpuMemoryUtilization": ("needed_gib",),
        "LowerGpuMemoryUtilization": ("free_gib",),
    }
    return any(ctx.num(key) is not None for key in needs.get(remedy.action, ()))


def what_would_fit(ctx: Context) -> str:
    """For a give-up on weights: what would hold them, sized from vLLM's figures (or the memory model)."""
    if ctx.diag.cause not in ("weights_load_oom", "kv_cache_insufficient"):
        return ""
    weights = ctx.num("weights_gib")
    if weights is None and ctx.inv.shape is not None and ctx.total:
        weights = estimate(ctx.inv.shape, ctx.engine, GpuSpec("gpu", ctx.total), None, ctx.inv.entrypoint).weights_gib
    total = ctx.total
    if not weights or not total:
        return ""
    budget = ctx.policy.bounds.max_gpu_memory_utilization * total - CUDA_CONTEXT_GIB - 2.0  # activations, KV
    if weights <= budget:
        return ""
    tp = ctx.engine.tensor_parallel_size
    need = tp
    while need <= 64 and weights * tp / need > budget * 0.75:  # leave a quarter for the KV cache
        need *= 2
    options = [
        f"tensor parallelism {need} ({weights * tp / need:.1f} GiB of weights per GPU; allow it with "
        f"spec.heal.bounds.maxTensorParallelSize, or serve --max-tensor-parallel-size {need})"
    ]
    if weights / 2 <= budget * 0.75:
        options.append(f"an 8-bit checkpoint (about {weights / 2:.1f} GiB; name it in spec.heal.quantizedFallback)")
    return (
        f"The weights take {weights:.1f} GiB per GPU, more than the {budget:.1f} GiB this GPU can give them: "
        f"no flag on {tp} GPU(s) makes them fit. What would: " + ", or ".join(options) + "."
    )


def plan_from_command(flags: str, diagnosis: Diagnosis, gpu_memory_gib: float | None = None) -> Remedy:
    """For `diagnose --engine-args`: a remedy for a plain command line, with the CRD's default policy."""
    parsed = parse_args(flags)
    spec = VLLMServiceSpec(model=parsed.model or "model", engine=parsed.engine)
    return plan_heal(spec, diagnosis, inventory=Inventory(gpu_total_gib=gpu_memory_gib))
