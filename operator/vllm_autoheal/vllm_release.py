"""Which vLLM release a pod runs, read off its image, and what that release decides for the memory model:
its batch defaults, how its KV check sizes a sliding window's layers, which model runner a model gets and
what the V1 runner's dummy sampler holds in the start-up profile.

Each row of RELEASES was read from that release's own source (the wheels on PyPI, every release from
0.8.0 to 0.34.0, compared file by file); a row starts where a fact changes, and its comment names the
file and, where known, the pull request. Releases before 0.11.0 (which still had the V0 engine, taken
below compute capability 8.0 and for some flags, with its own defaults and profile: which engine ran is
not known from the tag) and after the last row's series are not described: no facts, so the memory model keeps its
release-independent figures, as for an image whose tag names no release (latest, nightly, a digest, a
build of one's own). Where a release's figure could not be pinned (which top-k/top-p path an image with
FlashInfer ran before 0.11.1), the row leaves it unset and the floor stands.

Pure and standard library only: strings and tuples in, facts out; parsing never raises."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

Version = tuple[int, int, int]

# The batch-default tiers (engine_defaults.py applies each): "70gib-no-a100" the large defaults from 70 GiB
# but an A100; "160gib" the same and a larger tier from 160 GiB.
# Which models the V1 runner gets by default (runs_v1): "all"; "v2-listed-dense" all but a listed, dense,
# unquantized architecture; "v2-listed" all but a listed one; "v1-hybrid-unlisted-moe" hybrid and
# attention-free models and unlisted MoE; "v1-unlisted-hybrid-moe" attention-free, unlisted hybrid and
# unlisted MoE; "none".


@dataclass(frozen=True)
class Facts:
    first: Version  # the first release these facts hold for
    batch: str  # the batch-default tier (arg_utils)
    window: str | None  # a windowed layer's tokens: "one-step", "in-flight"; None: unpinned
    v1_sampler: str | None  # sampler_peak path of the V1 runner's dummy sampler; None: the floor stands
    v1_models: str  # which models run on the V1 runner by default
    v2_architectures: frozenset[str] = frozenset()  # the list v1_models names
    # Which runners reserve their CUDA-graph estimate inside the budget (gpu_worker.py
    # determine_available_memory: available KV = requested - non-KV - the runner's
    # profile_cudagraph_memory(), VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default): "none", "v1"
    # (the V2 runner's estimate is `return 0`), "all". Where reserved, the KV cache is smaller by the
    # graphs and capture runs inside the budget.
    graphs: str = "none"
    # The extensible KV cache (config/vllm.py _resolve_extensible_kv_cache: on by default on CUDA and ROCm):
    # sized after warm-up and capture from the memory then free (v1/worker/extensible_kv_cache.py
    # measure_kv_cache_bytes), the budget only a cap, so a budget above the free memory is no refusal.
    extensible: bool = False


_V2_023 = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"})
_V2_024 = _V2_023 | {"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}
_V2_025 = frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})
_V2_026 = _V2_025 | {"InklingForCausalLM", "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM"}
_V2_027 = _V2_026 | {"KimiK3ForConditionalGeneration"}
_V2_028 = _V2_027 | {"DeepseekV4ForCausalLM"}

# fmt: off
RELEASES: tuple[Facts, ...] = (
    # The first release without the V0 engine (before it, 0.8-0.10 fell back to V0 below compute
    # capability 8.0 and for some flags, with other batch defaults and profile: which ran is not known
    # from the tag, so no facts). arg_utils get_batch_defaults: the large defaults from 70 GiB but an A100
    # (PR #17885, 0.9.0); the hybrid KV cache manager keeps windows, one step in flight (0.9.1). The image's
    # top-k/top-p path (FlashInfer's or the sort) is not pinned: the floor.
    Facts((0, 11, 0), "70gib-no-a100", "one-step", None, "all"),
    # topk_topp_sampler.py: FlashInfer's sampler opt-in (VLLM_USE_FLASHINFER_SAMPLER=1, PR #26859), so the
    # dummy sampler takes PyTorch's sort (apply_top_k_top_p, unchanged from 0.10.2's, whose run without
    # FlashInfer the Qwen3-Next log of tests/test_moe_profile_peak.py shows).
    Facts((0, 11, 1), "70gib-no-a100", "one-step", "v1-sort", "all"),
    # topk_topp_sampler.py apply_top_k_top_p: the Triton kernel (topk_topp_triton.py, in place) from 8 rows
    # (PR #33538).
    Facts((0, 17, 0), "70gib-no-a100", "one-step", "v1-triton", "all"),
    # envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "1" (it was "0"): the V1 runner's
    # profile_cudagraph_memory (the two largest sizes of each mode captured into a scratch pool,
    # extrapolated; no margin) comes off the KV budget. Its log says "default since v0.21.0".
    Facts((0, 20, 0), "70gib-no-a100", "one-step", "v1-triton", "all", graphs="v1"),
    # FlashInfer's sampler on by default again (envs.py, PR #40376), but gpu_model_runner.py
    # _dummy_sampler_run also warms forward_native (the Triton path): its peak is at least that.
    Facts((0, 21, 0), "70gib-no-a100", "one-step", "v1-triton", "all", graphs="v1"),
    # config/vllm.py use_v2_model_runner: V2 by default for DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES, not MoE,
    # not a quantized checkpoint (PR #39337, Qwen3 dense).
    Facts(
        (0, 22, 0), "70gib-no-a100", "one-step", "v1-triton", "v2-listed-dense", frozenset({"Qwen3ForCausalLM"}), "v1"
    ),
    Facts((0, 23, 0), "70gib-no-a100", "one-step", "v1-triton", "v2-listed-dense", _V2_023, "v1"),
    # _is_default_v2_model_runner_model: any listed architecture, MoE or not.
    Facts((0, 24, 0), "70gib-no-a100", "one-step", "v1-triton", "v2-listed", _V2_024, "v1"),
    # V2 unless hybrid or attention-free, and for MoE only the listed ones.
    Facts((0, 25, 0), "70gib-no-a100", "one-step", "v1-triton", "v1-hybrid-unlisted-moe", _V2_025, "v1"),
    # SlidingWindowSpec.max_admission_blocks_per_request: window - 1 + max_in_flight_tokens, that is
    # max_concurrent_batches (2 with async scheduling, its default since 0.14.0; PP stages) times
    # max_num_batched_tokens (PR #47728; issue #49878: Gemma 4's KV need up 40 % from 0.25.1).
    Facts((0, 26, 0), "70gib-no-a100", "in-flight", "v1-triton", "v1-hybrid-unlisted-moe", _V2_026, "v1"),
    # A listed hybrid goes to V2 too (default_v2_model_runner_architectures).
    Facts((0, 27, 0), "70gib-no-a100", "in-flight", "v1-triton", "v1-unlisted-hybrid-moe", _V2_027, "v1"),
    # arg_utils get_batch_defaults: 16384 tokens for the server too from 160 GiB.
    Facts((0, 28, 0), "160gib", "in-flight", "v1-triton", "v1-unlisted-hybrid-moe", _V2_028, "v1"),
    # use_v2_model_runner: V2 for every model by default (its unsupported features aside): the floor.
    # The V2 runner estimates its graphs too (gpu/cudagraph_utils.py, a real capture into a throwaway
    # pool), so every runner reserves them.
    Facts((0, 29, 0), "160gib", "in-flight", "v1-triton", "none", graphs="all"),
    # 0.34.0 drops the V1 GPU runner (v1/worker/gpu_model_runner.py) altogether, and sizes its extensible
    # KV cache after capture (the graphs inside the budget too; model_runner.extensible_kv_cache).
    Facts((0, 34, 0), "160gib", "in-flight", "v1-triton", "none", graphs="all", extensible=True),
)
# fmt: on
LAST_SERIES = (0, 34)  # the newest release read: later ones are not described

# Environment variables with which a release runs another runner, sampler or graph estimate than its default:
# set, its figures are not the release's.
GRAPH_ESTIMATE_ENV = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"
RELEASE_ENV = frozenset({"VLLM_USE_V1", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_FLASHINFER_SAMPLER", GRAPH_ESTIMATE_ENV})


@dataclass(frozen=True)
class Release:
    version: Version
    platform: str = "cuda"  # "rocm": the ROCm builds (no CUDA sampler facts)

    def __str__(self) -> str:
        text = ".".join(map(str, self.version))
        return text + (" (ROCm)" if self.platform == "rocm" else "")


MAX_REFERENCE = 512  # spec.image's own bound
_VERSION = r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:\.\d{1,3}|\.post\d{1,3})?"
VERSION = re.compile(rf"v?{_VERSION}", re.ASCII)
# vllm/vllm-openai(-rocm):vX.Y.Z[-x86_64|-aarch64|-cu130|-ubuntu2404|-rocm...] (the release pipeline's tags)
OFFICIAL_TAG = re.compile(rf"v{_VERSION}((?:-(?:x86_64|aarch64|arm64|amd64|cu\d{{3}}|ubuntu\d{{4}}|rocm))*)", re.ASCII)
# rocm/vllm:rocm6.4.1_vllm_0.10.1_20250909, rocm6.3.1_instinct_vllm0.8.3_20250415 (AMD's builds)
AMD_TAG = re.compile(rf"rocm[\d.]{{1,12}}(?:_[a-z0-9]{{1,16}})*?_vllm_?{_VERSION}_\d{{8}}", re.ASCII)


def parse_version(text: object) -> Release | None:
    """A release named as X.Y.Z (a leading v, a fourth number or .postN allowed: 0.10.1.1, 0.8.5.post1);
    None for anything else (release candidates and dev builds included)."""
    if not isinstance(text, str) or len(text) > 32:
        return None
    m = VERSION.fullmatch(text.strip())
    return Release((int(m[1]), int(m[2]), int(m[3]))) if m else None


def logged_release(numbers: dict) -> Release | None:
    """The release the engine's log named at start (diagnosis: vllm_minor, vllm_patch, read only from its
    own lines, and only for a release build), or None."""
    minor, patch = numbers.get("vllm_minor"), numbers.get("vllm_patch")
    if type(minor) is not int or type(patch) is not int:
        return None
    return Release((0, minor, patch))


def logged_on(image: object, logged: Release | None) -> Release | None:
    """The release a log named, for a pod of `image`: a ROCm build may print a plain release too (the
    corpus's MI308X log, notoom-51964: the banner's `version 0.27.0`, as a CUDA build's reads), so where
    the image's reference names ROCm anywhere (vllm-openai-rocm, rocm/vllm, a tag or a build of one's
    own) it is read as a ROCm build, whose sampler keeps the floor."""
    if logged is None or not isinstance(image, str) or "rocm" not in image.lower():
        return logged
    return Release(logged.version, "rocm")


def parse_image(image: object) -> Release | None:
    """The release an image reference names: vllm/vllm-openai:vX.Y.Z and its arch, CUDA and OS variants,
    vllm/vllm-openai-rocm:vX.Y.Z, rocm/vllm's dated tags; under any registry or mirror path. None for a
    digest, latest, nightly, a release candidate, any other repository or tag, and anything malformed."""
    if not isinstance(image, str) or not image or len(image) > MAX_REFERENCE or "@" in image:
        return None
    if not image.isascii() or any(c.isspace() for c in image):
        return None
    path, colon, tag = image.rpartition(":")
    if not colon or "/" in tag or not path:
        return None
    repo = path.lower().split("/")
    if len(repo) >= 2 and repo[-2:] in (["vllm", "vllm-openai"], ["vllm", "vllm-openai-rocm"]):
        m = OFFICIAL_TAG.fullmatch(tag)
        if not m:
            return None
        rocm = repo[-1].endswith("-rocm") or "rocm" in m[4]
        return Release((int(m[1]), int(m[2]), int(m[3])), "rocm" if rocm else "cuda")
    if len(repo) >= 2 and repo[-2:] == ["rocm", "vllm"]:
        m = AMD_TAG.fullmatch(tag)
        return Release((int(m[1]), int(m[2]), int(m[3])), "rocm") if m else None
    return None


# vLLM's own --gpu-memory-utilization where a command line names none (config/cache.py CacheConfig, and the LLM
# class's): 0.9 through 0.19.1, 0.92 from 0.20.0 (PR #38284; read in the 0.19.1, 0.20.0 and 0.22.0 wheels, and
# printed by 0.25 on an H100). vllm-autoheal always passes the flag (0.9 unless set): this is for a plain vLLM
# command line only (diagnose --engine-args).
UTILIZATION_092_FROM: Version = (0, 20, 0)


def default_utilization(release: Release | None) -> float | None:
    """The utilization the release takes where its command line names none; None where no release is known,
    or it is newer than the last series read."""
    if release is None or release.version[:2] > LAST_SERIES:
        return None
    return 0.92 if release.version >= UTILIZATION_092_FROM else 0.9


def facts(release: Release | None) -> Facts | None:
    """The facts of a release's row; None for no release or one the table does not describe."""
    if release is None or release.version[:2] > LAST_SERIES or release.version < RELEASES[0].first:
        return None
    return [row for row in RELEASES if row.first <= release.version][-1]


def runs_v1(row: Facts, architecture: str, moe: bool, quantized: bool, hybrid: bool, attention_free: bool) -> bool:
    """Whether the release's default puts this model on the V1 runner for certain (config/vllm.py
    use_v2_model_runner; its fallbacks for unsupported features only move a model from V2 to V1, so
    False may still run V1, where the floor stands). `quantized`: the checkpoint's own quantization."""
    listed = architecture in row.v2_architectures
    if row.v1_models == "all":
        return True
    if row.v1_models == "v2-listed-dense":
        return not listed or moe or quantized
    if row.v1_models == "v2-listed":
        return not listed
    if row.v1_models == "v1-hybrid-unlisted-moe":
        return hybrid or attention_free or (moe and not listed)
    if row.v1_models == "v1-unlisted-hybrid-moe":
        return attention_free or ((hybrid or moe) and not listed)
    return False


def sampler_path(release: Release | None, row: Facts | None, v1: bool) -> str:
    """The dummy sampler's path (sampler_peak.py) the release runs: the V1 runner's where the model runs
    on it for certain and the release's figure is pinned (CUDA builds), else the floor every path holds."""
    if release is None or row is None or release.platform != "cuda" or not v1 or row.v1_sampler is None:
        return "v2"
    return row.v1_sampler


def env_keeps_release(release: Release | None, env: Mapping[str, str | None]) -> bool:
    """Whether a pod's environment (name -> value; None where it comes from elsewhere) leaves the
    release's figures as they are: none of RELEASE_ENV set, but the graph estimate on, its own default
    from 0.20 (which a release before then does not have): vLLM reads it as bool(int(value))."""
    for name in RELEASE_ENV & env.keys():
        default = name == GRAPH_ESTIMATE_ENV and release is not None and release.version >= (0, 20, 0)
        if not (default and _on(env[name])):
            return False
    return True


def _on(value: str | None) -> bool:
    try:
        return int((value or "").strip()) != 0
    except ValueError:  # (vLLM refuses it at start: no figures of the release's)
        return False


def graphs_in_budget(release: Release | None, row: Facts | None, v1: bool) -> bool:
    """Whether the release reserves the CUDA graphs' memory inside the budget for a model that runs on
    the V1 runner for certain (`v1`, runs_v1) or may run on V2: not on ROCm before 0.26.0 (the worker's
    estimate was CUDA's alone until is_cuda_alike), and where only the V1 runner reserves them, only for
    a model that runs there for certain (else the V2 runner's default, outside the budget, stands)."""
    if release is None or row is None or row.graphs == "none":
        return False
    if release.platform == "rocm" and release.version < (0, 26, 0):
        return False
    return row.graphs == "all" or v1


def describe(release: Release | None, source: str = "") -> str:
    """Which release's figures an estimate used, for `plan` to print; `source`: where the release came
    from (the image, the option)."""
    first, last = ".".join(map(str, RELEASES[0].first)), ".".join(map(str, LAST_SERIES))
    shared = "the figures every release shares (the sampler's floor, one step in flight, 0.28's batch defaults)"
    if release is None:
        return f"not known ({source or 'no release named'}): {shared}"
    where = f" ({source})" if source else ""
    if facts(release) is None:
        return f"{release}{where}: not described (from {first} to {last}.x are): {shared}"
    row = facts(release)
    cache = ", extensible KV cache" if row is not None and row.extensible else ""
    return (
        f"{release}{where}: that release's batch defaults, dummy sampler, windowed layers{cache} and CUDA-graph "
        "reservation"
    )
