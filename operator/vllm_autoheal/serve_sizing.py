"""How `serve` sizes a heal by this machine's GPUs: the free memory NVML saw on the GPUs vLLM takes, before
the start that crashed (the launcher's probe does the same in Kubernetes), and their size as CUDA counts it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from . import cgroups
from .api import EngineArgs
from .diagnosis import Diagnosis, GpuSnapshot
from .gpu_catalog import gpu_total_gib, least_cuda_free_gib
from .gpu_probe import gpus_for
from .model_shape import ModelShape
from .remedy import Inventory, Remedy
from .vllm_release import env_keeps_release, logged_release


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
    used = gpus_for(at_start, engine.tensor_parallel_size * engine.pipeline_parallel_size, env)
    inv = Inventory(
        memory_limit_bytes=cgroups.memory_limit(), shape=shape, gpu_free_gib=least_cuda_free_gib(used or [])
    )
    if after.gpus:
        first = (used or after.gpus)[0]
        inv.gpu_total_gib = gpu_total_gib(first.name, first.total_bytes)
        # the release vLLM's log named: its facts are the CUDA build's (a CPU build names the same)
        logged = logged_release(diag.numbers)
        if env_keeps_release(logged, env):
            inv.release = logged
    return inv


def onto_fuller_gpus(
    remedy: Remedy, engine: EngineArgs, inv: Inventory, at_start: GpuSnapshot, env: Mapping[str, str]
) -> Inventory | None:
    """Where `remedy` splits the model onto GPUs the crashed start did not take and another process leaves
    less free on them than the figure it was sized by: the inventory to plan it again with (the planner
    takes each GPU of a split to have as little free as its figure says); None otherwise."""
    split = remedy.changes.get("tensor_parallel_size")
    if not isinstance(split, int) or split <= engine.tensor_parallel_size or inv.gpu_free_gib is None:
        return None
    free = least_cuda_free_gib(gpus_for(at_start, split * engine.pipeline_parallel_size, env) or [])
    return replace(inv, gpu_free_gib=free) if free is not None and free < inv.gpu_free_gib else None
