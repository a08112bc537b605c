"""Which model runner a vLLM release puts a model on, and what that decides for the memory model: the
start-up profile's dummy sampler (sampler_peak.py) and whether the CUDA graphs come off the KV cache
(vllm_release.graphs_in_budget). Pure: no I/O."""

from __future__ import annotations

from .api import EngineArgs
from .engine_defaults import captures_graphs, speculative_method
from .model_shape import ModelShape
from .vllm_release import Release, facts, graphs_in_budget, runs_v1, sampler_path


def on_v1_runner(shape: ModelShape, release: Release | None, extra_args: list[str] | None = None) -> bool:
    """Whether the release's default puts this model on the V1 runner for certain: with an n-gram draft
    in 0.22-0.29 (the V2 runner did not run it: config/vllm.py _get_v2_model_runner_unsupported_features;
    from 0.30 it has its own n-gram speculator); not with another draft from 0.25 (some force the V2
    runner: dspark, then dflash from 0.26); not for a release the table does not describe."""
    row = facts(release)
    if row is None or release is None:
        return False
    method = speculative_method(extra_args or [])
    if method in ("ngram", "ngram_gpu") and (0, 22, 0) <= release.version < (0, 30, 0):
        return True
    if method is not None and release.version >= (0, 25, 0):
        return False
    moe, quantized = shape.experts > 0, shape.quantization is not None
    return runs_v1(row, shape.architecture, moe, quantized, shape.mamba_layers > 0, shape.attention_layers == 0)


def graphs_reserved(shape: ModelShape | None, engine: EngineArgs, release: Release | None) -> bool:
    """Whether vLLM takes its estimate of the CUDA graphs off the KV budget and captures them inside it
    (vllm_release.graphs_in_budget): not where it captures none, nor under kv_cache_memory_bytes (the
    worker returns that size before any estimate); without the model's shape, only where every model
    runs on a runner that does."""
    if not captures_graphs(engine.enforce_eager, engine.extra_args) or engine.kv_cache_memory_bytes:
        return False
    row = facts(release)
    if shape is None:
        v1 = row is not None and row.v1_models == "all"
    else:
        v1 = on_v1_runner(shape, release, engine.extra_args)
    return graphs_in_budget(release, row, v1)


def release_sampler(shape: ModelShape, release: Release | None, extra_args: list[str] | None = None) -> str:
    """The dummy sampler's path (sampler_peak.py) the release runs this model on: the V1 runner's where
    its default puts the model there for certain, else the floor."""
    return sampler_path(release, facts(release), on_v1_runner(shape, release, extra_args))
