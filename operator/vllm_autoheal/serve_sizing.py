"""How `serve` sizes a heal by this machine's GPUs: the free memory NVML saw on the GPUs vLLM takes, before
the start that crashed (the launcher's probe does the same in Kubernetes), and their size as CUDA counts it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from . import cgroups
from .api import EngineArgs, VLLMServiceSpec
from .diagnosis import Diagnosis, GpuSnapshot
from .gpu_catalog import gpu_total_gib, least_cuda_free_gib
from .gpu_probe import gpus_for, visible_count
from .local_ranks import ranks_here
from .model_shape import ModelShape
from .remedy import Inventory, Remedy
from .remedy.model import running_shape
from .vllm_release import env_keeps_release, logged_release


def gpus_taken(engine: EngineArgs, tensor_parallel_size: int | None = None) -> int | None:
    """How many of this machine's GPUs vLLM takes with these flags: one for each rank it starts here."""
    return ranks_here(engine, tensor_parallel_size)


def inventory(
    at_start: GpuSnapshot,
    after: GpuSnapshot,
    engine: EngineArgs,
    shape: ModelShape | None,
    diag: Diagnosis,
    env: Mapping[str, str],
) -> Inventory:
    """What the planner may count on for `engine` (the flags it heals): the least free before the start on
    the GPUs those flags take (None where that cannot be told: the GPU is then taken to be vLLM's alone),
    their size as CUDA counts it, this container's memory limit, and the release vLLM's log named. `env`
    is the one vLLM inherits."""
    count = gpus_taken(engine)
    used = gpus_for(at_start, count, env) if count else None
    inv = Inventory(
        memory_limit_bytes=cgroups.host_memory(),
        shape=shape,
        gpu_free_gib=least_cuda_free_gib(used or []),
        host_kv_cache=not after.gpus,  # (no GPU here: vLLM's CPU build, its KV cache in host memory)
    )
    if after.gpus:
        first = (used or after.gpus)[0]
        inv.gpu_total_gib = gpu_total_gib(first.name, first.total_bytes)
        # the release vLLM's log named: its facts are the CUDA build's (a CPU build names the same)
        logged = logged_release(diag.numbers)
        if env_keeps_release(logged, env):
            inv.release = logged
    return inv


def within_visible_gpus(
    spec: VLLMServiceSpec, engine: EngineArgs, at_start: GpuSnapshot, env: Mapping[str, str]
) -> VLLMServiceSpec:
    """The spec with its split bound no larger than the GPUs vLLM sees here can hold (TP x PP x PCP for each
    local data-parallel rank): a larger world fails at start, "World size (4) is larger than the number of
    available GPUs (2)" (config/parallel.py), a restart the snapshot already forbids."""
    seen, per_split = visible_count(at_start, env), gpus_taken(engine, 1)
    bound = spec.heal.bounds.max_tensor_parallel_size
    if seen is None or not per_split or not bound or bound * per_split <= seen:
        return spec
    bounds = spec.heal.bounds.model_copy(update={"max_tensor_parallel_size": max(seen // per_split, 1)})
    return spec.model_copy(update={"heal": spec.heal.model_copy(update={"bounds": bounds})})


def onto_fuller_gpus(
    remedy: Remedy, engine: EngineArgs, inv: Inventory, at_start: GpuSnapshot, env: Mapping[str, str]
) -> Inventory | None:
    """Where `remedy` splits the model onto GPUs the crashed start did not take and another process leaves
    less free on them than the figure it was sized by: the inventory to plan it again with (the planner
    takes each GPU of a split to have as little free as its figure says); None otherwise."""
    split = remedy.changes.get("tensor_parallel_size")
    if not isinstance(split, int) or split <= engine.tensor_parallel_size or inv.gpu_free_gib is None:
        return None
    count = gpus_taken(engine, split)
    free = least_cuda_free_gib(gpus_for(at_start, count, env) or []) if count else None
    return replace(inv, gpu_free_gib=free) if free is not None and free < inv.gpu_free_gib else None


def local_shape(model: str) -> ModelShape | None:
    """The shape of a model on disk (never a download from here): it lets the classifier place an
    out-of-memory that the log does not, and the planner size a change by the memory model, as the operator
    does with the model's config. None where it is no folder here, or cannot be read."""
    try:
        if Path(model).expanduser().exists():
            from .model_config import to_shape
            from .model_files import from_path

            return to_shape(from_path(Path(model).expanduser()))
    except Exception:  # noqa: BLE001 - a model we cannot read is sized from vLLM's figures alone
        pass
    return None


def weights_gib(spec: VLLMServiceSpec, model: str, engine: EngineArgs, shape: ModelShape | None) -> float | None:
    """The weights on one GPU of what runs (`model` under these flags), where its shape is known: the quantized
    fallback's at the width its method fixes or the policy declares, once it runs."""
    running = running_shape(spec, model, engine, shape)[1]
    if running is None:
        return None
    try:
        from .model_weights import weights_gib_to_diagnose

        return weights_gib_to_diagnose(running, engine)
    except Exception:  # noqa: BLE001 - a model we cannot size only leaves an OOM unplaced
        return None
