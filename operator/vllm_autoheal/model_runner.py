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


# Flags with which 0.22-0.27 run a model on the V1 runner though its default is V2 (config/vllm.py
# _get_v2_model_runner_unsupported_features: drafts, prefill context parallelism, stock torch.compile, dual batch
# overlap, elastic EP, routed experts capture, logits processors, prompt embeds, logprobs modes, ...)
_V1_FALLBACK_FLAGS = (
    "--speculative",
    "-pcp",
    "--prefill-context",
    "-O",
    "--compilation-config",
    "-cc",  # (its alias: -cc.mode=1 is stock torch.compile)
    "--runner",  # (a pooling runner: V2 takes generate models only)
    "--convert",
    "--task",
    "--enable-dbo",
    "--enable-elastic",
    "--enable-return-routed",
    "--logits-processors",
    "--enable-prompt-embeds",
    "--logprobs-mode",
    "--kv-sharing",
    "--ec-transfer",
)
# The architectures vLLM runs as generate models by default (config/model.py _SUFFIX_TO_DEFAULTS): the rest pool
# (ForSequenceClassification, RewardModel, a bare Model, ...), on the V1 runner
GENERATE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
# The releases whose V2 runner never installs the weight offloader (v1/worker/gpu/model_runner.py has no
# set_offloader before vLLM PR #51413, merged after 0.27.1 was cut; 0.29.0 has it; 0.28 is not known).
OFFLOAD_IGNORED = ((0, 22, 0), (0, 28, 0))


def offload_ignored(shape: ModelShape, release: Release | None, extra_args: list[str] | None = None) -> bool:
    """Whether --cpu-offload-gb does nothing for this model, for certain: the release's default puts it on the V2
    runner, which in 0.22-0.27 loads every weight on the GPU whatever the flag says (measured on 0.25: Llama-3.1-8B
    loaded 15.0 GiB with --cpu-offload-gb 4 and 8; vLLM issue #51396), and no flag falls it back to V1."""
    if release is None or facts(release) is None or not OFFLOAD_IGNORED[0] <= release.version < OFFLOAD_IGNORED[1]:
        return False
    names = [a.split("=", 1)[0].replace("_", "-") for a in extra_args or [] if a.startswith("-")]
    if any(name.startswith(_V1_FALLBACK_FLAGS) for name in names) or not shape.architecture.endswith(GENERATE_SUFFIXES):
        return False
    return not on_v1_runner(shape, release, extra_args)


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
