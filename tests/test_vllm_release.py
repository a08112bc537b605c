"""The vLLM release a pod runs, read off its image (operator/vllm_autoheal/vllm_release.py), and what each
release's row changes in the memory model: batch defaults, the profile's dummy sampler, a sliding window's
tokens in flight. Every row's fact was read from that release's wheel; without a release (latest, a
digest, a tag of one's own) every figure is what it was before the table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.api.spec import DEFAULT_IMAGE
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.engine_defaults import default_max_num_batched_tokens, default_max_num_seqs, steps_in_flight
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import CUDAGRAPH_GIB, activation_bytes, estimate, kv_need
from vllm_autoheal.model_runner import release_sampler
from vllm_autoheal.preflight import preflight
from vllm_autoheal.shape_reader import shape_from_config
from vllm_autoheal.vllm_release import (
    RELEASES,
    Release,
    describe,
    facts,
    logged_release,
    parse_image,
    parse_version,
    runs_v1,
)

from samples import config_shape, gpt_oss

GIB = 2**30


def r(text: str, platform: str = "cuda") -> Release:
    release = parse_version(text)
    assert release is not None
    return Release(release.version, platform)


# --- the tag parser


@pytest.mark.parametrize(
    ("image", "version", "platform"),
    [
        ("vllm/vllm-openai:v0.33.0", (0, 33, 0), "cuda"),
        (DEFAULT_IMAGE, (0, 33, 0), "cuda"),
        ("docker.io/vllm/vllm-openai:v0.25.1", (0, 25, 1), "cuda"),
        ("index.docker.io/vllm/vllm-openai:v0.19.0", (0, 19, 0), "cuda"),
        ("registry.local:5000/mirror/vllm/vllm-openai:v0.22.1", (0, 22, 1), "cuda"),
        ("vllm/vllm-openai:v0.10.1.1", (0, 10, 1), "cuda"),
        ("vllm/vllm-openai:v0.8.5.post1", (0, 8, 5), "cuda"),
        # the release pipeline's variants (.buildkite release scripts): arch, CUDA, OS
        ("vllm/vllm-openai:v0.27.0-x86_64", (0, 27, 0), "cuda"),
        ("vllm/vllm-openai:v0.27.0-aarch64", (0, 27, 0), "cuda"),
        ("vllm/vllm-openai:v0.31.0-cu130", (0, 31, 0), "cuda"),
        ("vllm/vllm-openai:v0.31.0-x86_64-cu130", (0, 31, 0), "cuda"),
        ("vllm/vllm-openai:v0.32.0-x86_64-ubuntu2404", (0, 32, 0), "cuda"),
        ("vllm/vllm-openai:v0.32.0-aarch64-cu130-ubuntu2404", (0, 32, 0), "cuda"),
        ("vllm/vllm-openai-rocm:v0.26.0", (0, 26, 0), "rocm"),
        ("vllm/vllm-openai-rocm:v0.26.0-rocm", (0, 26, 0), "rocm"),
        ("harbor.example.com/proxy/vllm/vllm-openai-rocm:v0.26.0", (0, 26, 0), "rocm"),
        ("vllm/vllm-openai:v0.20.2-rocm", (0, 20, 2), "rocm"),
        # AMD's builds
        ("rocm/vllm:rocm6.4.1_vllm_0.10.1_20250909", (0, 10, 1), "rocm"),
        ("rocm/vllm:rocm7.0.0_vllm_0.11.2_20251210", (0, 11, 2), "rocm"),
        ("rocm/vllm:rocm6.3.1_instinct_vllm0.8.3_20250415", (0, 8, 3), "rocm"),
    ],
)
def test_a_release_tag_names_its_release(image, version, platform):
    assert parse_image(image) == Release(version, platform)


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:latest",
        "vllm/vllm-openai:latest-x86_64",
        "vllm/vllm-openai:latest-rocm",
        "vllm/vllm-openai:nightly",
        "vllm/vllm-openai:nightly-aarch64",
        "vllm/vllm-openai:nightly-66a168a197ba214a5b70a74fa2e713c9eeb3251a",
        "vllm/vllm-openai:cu129-nightly",
        "vllm/vllm-openai",
        "vllm/vllm-openai@sha256:" + "a" * 64,
        "vllm/vllm-openai:v0.25.0@sha256:" + "a" * 64,  # the digest decides what runs
        "vllm/vllm-openai:v0.11.0rc1",
        "vllm/vllm-openai:v0.25",
        "vllm/vllm-openai:0.25.0",
        "vllm/vllm-openai:v0.25.0-custom",
        "vllm/vllm-openai:v0.25.0-",
        "vllm/vllm-openai-cpu:v0.25.0",
        "myorg/vllm:v0.25.0",
        "myorg/vllm-openai:v0.25.0",
        "notvllm/vllm-openai:v0.25.0",
        "rocm/vllm:latest",
        "rocm/vllm:v0.14.0_amd_dev",
        "rocm/vllm:rocm6.2_mi300_ubuntu20.04_py3.9_vllm_0.6.4",
        "public.ecr.aws/q9t5s3a7/vllm-release-repo:0123abc-x86_64",
        "ghcr.io/a962702/vllm-security/vllm-openai:nightly-20261002",
        "registry.local:5000/vllm/vllm-openai",
        ":v0.25.0",
        "",
    ],
)
def test_a_tag_that_names_no_release_gives_none(image):
    assert parse_image(image) is None


@pytest.mark.parametrize(
    "image",
    [
        "a" * 100_000,
        "vllm/vllm-openai:v0.25.0" + "-x86_64" * 80,  # a long, valid-looking tail over the 512 bound
        "vllm/vllm-openai:v0.25.0\u200b",
        "vllm/vllm-openai:v\u0660.\u0662\u0665.\u0660",  # Arabic-Indic digits
        "vllm/vllm-openai:v０.２５.０",  # fullwidth digits
        "vllm/vllm-openaï:v0.25.0",
        "vllm/vllm-openai:v0.25.0; rm -rf /",
        "vllm/vllm-openai:v0.25.0\n",
        "vllm/vllm-openai:v0.25.0 --trust-remote-code",
        "vllm/vllm-openai:$(curl evil)",
        "vllm/vllm-openai:v0.25.0`id`",
        "vllm/vllm-openai:v999999.0.0",
        "vllm/vllm-openai:v0.25.0\x00",
        "rocm/vllm:rocm1" + "_a" * 250 + "_vllm_0.10.1_2025090",
        "rocm/vllm:rocm6.4.1_vllm_0.10.1_20250909_" + "x" * 400,
        "../../vllm/vllm-openai:v0.25.0/..",
        None,
        12,
        b"vllm/vllm-openai:v0.25.0",
        ["vllm/vllm-openai:v0.25.0"],
    ],
)
def test_a_hostile_reference_never_raises_and_names_no_release(image):
    started = time.monotonic()
    assert parse_image(image) is None
    assert time.monotonic() - started < 0.5  # no backtracking blow-up


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.25.0", (0, 25, 0)), ("v0.25.0", (0, 25, 0)), (" 0.33.0 ", (0, 33, 0)), ("0.10.1.1", (0, 10, 1)),
     ("0.8.5.post1", (0, 8, 5))],
)  # fmt: skip
def test_a_version_is_read(text, version):
    assert parse_version(text) == Release(version)


@pytest.mark.parametrize(
    "text", ["0.25", "banana", "0.25.0rc1", "0.25.0.dev3", "1e3", "", "\u0660.\u0662\u0665.\u0660", "0" * 1000, None]
)
def test_a_bad_version_is_none(text):
    assert parse_version(text) is None


# --- the table


def test_the_table_is_ordered_and_described_from_0_11_to_0_34():
    firsts = [row.first for row in RELEASES]
    assert firsts == sorted(set(firsts))
    assert facts(r("0.10.2")) is None and facts(r("0.35.0")) is None and facts(r("1.0.0")) is None
    assert facts(r("0.8.3")) is None  # V0 or V1 by the GPU and the flags: not known from the tag
    assert facts(None) is None
    assert facts(r("0.11.0")) is RELEASES[0] and facts(r("0.34.2")) is RELEASES[-1]
    for row in RELEASES:  # every row is the one its first release reads
        assert facts(Release(row.first)) is row
    assert "0.25.0" in describe(r("0.25.0"), "--vllm-version") and "not described" in describe(r("0.7.3"))
    assert "not known" in describe(None, "latest")


# --- batch defaults (arg_utils), each tier


@pytest.mark.parametrize(
    ("gpu", "release", "server", "llm", "seqs"),
    [
        ("NVIDIA-H100-80GB-HBM3", "0.11.0", 8192, 16384, 1024),  # from 70 GiB
        ("NVIDIA-L4", "0.11.0", 2048, 8192, 256),
        ("NVIDIA-A100-SXM4-80GB", "0.11.0", 2048, 8192, 256),  # but an A100 (PR #17885)
        ("NVIDIA-H100-NVL", "0.14.0", 8192, 16384, 1024),
        ("NVIDIA-B200", "0.27.1", 8192, 16384, 1024),
        ("NVIDIA-B200", "0.28.0", 16384, 16384, 1024),  # >= 160 GiB
        ("NVIDIA-H200", "0.33.0", 8192, 16384, 1024),
    ],
)
def test_each_releases_batch_defaults(gpu, release, server, llm, seqs):
    spec, tier = lookup(gpu), facts(r(release)).batch
    assert default_max_num_batched_tokens(spec.memory_gib, "server", spec.name, tier) == server
    assert default_max_num_batched_tokens(spec.memory_gib, "llm", spec.name, tier) == llm
    assert default_max_num_seqs(spec.memory_gib, spec.name, [], tier) == seqs
    est = estimate(config_shape("llama-3.1-8b"), EngineArgs(max_model_len=4096), spec, release=r(release))
    assert (est.max_num_batched_tokens, est.max_num_seqs) == (server, seqs)


def test_without_a_release_the_batch_defaults_are_the_newest():
    for gpu in ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-B200", "NVIDIA-L4"):
        spec = lookup(gpu)
        assert default_max_num_batched_tokens(spec.memory_gib, "server", spec.name) == default_max_num_batched_tokens(
            spec.memory_gib, "server", spec.name, facts(r("0.33.0")).batch
        )


# --- the dummy sampler's path: the runner (config/vllm.py use_v2_model_runner) and the V1 path


@pytest.mark.parametrize(
    ("model", "release", "path"),
    [
        ("llama-3.1-8b", "0.10.2", "v2"),  # the image's FlashInfer or the sort: not pinned, the floor
        ("llama-3.1-8b", "0.11.1", "v1-sort"),  # FlashInfer opt-in (PR #26859)
        ("llama-3.1-8b", "0.16.0", "v1-sort"),
        ("llama-3.1-8b", "0.17.0", "v1-triton"),  # the Triton kernel (PR #33538)
        ("llama-3.1-8b", "0.21.0", "v1-triton"),  # FlashInfer again, and the native path warmed too
        ("llama-3.1-8b", "0.22.0", "v1-triton"),  # only Qwen3 dense on V2
        ("qwen3-0.6b", "0.22.0", "v2"),
        ("llama-3.1-8b", "0.23.0", "v2"),
        ("mixtral-8x7b", "0.23.0", "v1-triton"),  # MoE
        ("qwen1.5-moe-a2.7b", "0.23.0", "v1-triton"),  # MoE, listed only from 0.24
        ("qwen1.5-moe-a2.7b", "0.24.0", "v2"),
        ("gemma-2-2b", "0.24.0", "v1-triton"),  # not listed
        ("gemma-2-2b", "0.25.0", "v2"),  # dense: V2
        ("mixtral-8x7b", "0.25.0", "v1-triton"),  # unlisted MoE
        ("qwen3-next-80b-a3b", "0.25.0", "v1-triton"),  # hybrid
        ("nemotron-h-8b", "0.27.0", "v1-triton"),  # unlisted hybrid
        ("qwen3-next-80b-a3b", "0.28.0", "v1-triton"),
        ("qwen3-next-80b-a3b", "0.29.0", "v2"),  # every model on V2
        ("mixtral-8x7b", "0.33.0", "v2"),
        ("qwen3-next-80b-a3b", "0.14.0", "v1-sort"),
    ],
)
def test_the_release_decides_the_sampler_path(model, release, path):
    shape = qwen3_dense() if model == "qwen3-0.6b" else config_shape(model)
    assert release_sampler(shape, r(release)) == path
    assert release_sampler(shape, r(release, "rocm")) == "v2"  # the CUDA paths only
    assert release_sampler(shape, None) == "v2"


def qwen3_dense(quant: dict | None = None):
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
    }
    return shape_from_config({**config, **({"quantization_config": quant} if quant else {})})


def test_a_quantized_checkpoint_of_a_listed_dense_model_ran_on_v1_in_0_22():
    """_is_default_v2_model_runner_model (0.22, 0.23): not model_config.is_quantized (the checkpoint's
    quantization_config)."""
    quantized = qwen3_dense({"quant_method": "fp8"})
    assert release_sampler(quantized, r("0.22.0")) == "v1-triton"
    assert release_sampler(quantized, r("0.24.0")) == "v2"
    row = facts(r("0.22.0"))
    assert runs_v1(row, "Qwen3ForCausalLM", False, True, False, False)
    assert not runs_v1(row, "Qwen3ForCausalLM", False, False, False, False)


CASES = [
    # tests/test_moe_profile_peak.py's public logs. Qwen3-Next on vLLM 0.10.2 without FlashInfer ran PyTorch's
    # sort, the default path of 0.11.1-0.16 (apply_top_k_top_p unchanged): "Model loading took 74.2812 GiB",
    # "Available KV cache memory: 44.59 GiB" at TP 2 on two H200s.
    ("qwen3-next-tp2-h200", "0.14.0", "NVIDIA-H200", EngineArgs(tensor_parallel_size=2), 74.2812, 44.59, 0.9),
    # gpt-oss-20b on vLLM 0.19.0 (the Triton path, an MoE on the V1 runner), one A100 80GB.
    ("gpt-oss-20b-a100", "0.19.0", "NVIDIA-A100-SXM4-80GB",
     EngineArgs(gpu_memory_utilization=0.65, max_model_len=131072), 13.72, 36.56, 0.4),
]  # fmt: skip


@pytest.mark.parametrize(("case", "release", "gpu", "engine", "weights", "kv", "tolerance"), CASES)
def test_with_the_logs_release_the_estimate_lands_near_vllms_figure(case, release, gpu, engine, weights, kv, tolerance):
    shape = config_shape("qwen3-next-80b-a3b") if case.startswith("qwen") else gpt_oss(24, 32)
    est = estimate(shape, engine, lookup(gpu), release=r(release))
    floor = estimate(shape, engine, lookup(gpu))
    mine = est.requested_gib - weights - est.activation_gib - est.non_torch_gib
    before = floor.requested_gib - weights - floor.activation_gib - floor.non_torch_gib
    assert abs(mine - kv) <= tolerance
    assert kv < mine < before  # nearer, and still not below vLLM's figure


def test_the_qwen3_next_log_keeps_the_floor_at_its_own_release():
    """0.10.2's official image ships FlashInfer, whose sampler 0.10.2 takes by default: the log's sort path
    was an install without it, so at 0.10.2 the estimate keeps the floor (50.05 GiB against 44.59 printed);
    at 0.14 (sort by default) it comes to 45.4."""
    shape, h200, engine = config_shape("qwen3-next-80b-a3b"), lookup("NVIDIA-H200"), EngineArgs(tensor_parallel_size=2)
    assert estimate(shape, engine, h200, release=r("0.10.2")).kv_cache_gib == pytest.approx(50.05, abs=0.01)
    assert estimate(shape, engine, h200, release=r("0.14.0")).kv_cache_gib == pytest.approx(45.41, abs=0.05)
    assert estimate(shape, engine, h200, release=r("0.25.0")).kv_cache_gib < 50.05  # Triton, V1 (hybrid)


@pytest.mark.parametrize(
    ("release", "kv"),
    [(None, 55.17), ("0.10.2", 55.17), ("0.14.0", 51.30), ("0.19.0", 54.24), ("0.22.0", 53.25), ("0.25.0", 55.17),
     ("0.33.0", 54.18)],
)  # fmt: skip
def test_a_dense_8b_on_an_h100_at_defaults(release, kv):
    """Llama-3.1-8B, one H100, vLLM's defaults (8192 tokens, 1024 sequences): the sort path's 4.65 GiB of
    sampler (38 bytes x 1024 x 128,256) outweighs the forward pass's 0.87 in 0.11.1-0.16; the Triton path's
    1.71 (14 bytes) in 0.17-0.22; V2's floor from 0.23 (Llama listed). And the CUDA graphs' 0.99 GiB come off
    the cache where the runner reserves them: the V1 runner from 0.20 (0.22, not 0.19, whose estimate was
    opt-in), not the V2 runner before 0.29 (0.25), every runner from 0.29 (0.33)."""
    est = estimate(
        config_shape("llama-3.1-8b"), EngineArgs(), lookup("NVIDIA-H100-80GB-HBM3"), release=release and r(release)
    )
    assert est.kv_cache_gib == pytest.approx(kv, abs=0.01)


# --- windowed layers: steps in flight (SlidingWindowSpec)


@pytest.mark.parametrize(
    ("release", "extra_args", "pp", "steps"),
    [
        (None, [], 1, 1),
        ("0.25.1", [], 1, 1),
        ("0.26.0", [], 1, 2),  # async scheduling, its default (from 0.14)
        ("0.33.0", [], 1, 2),
        ("0.33.0", ["--no-async-scheduling"], 1, 1),
        ("0.33.0", ["--async-scheduling"], 1, 2),
        ("0.33.0", ["--speculative-config", '{"method": "ngram"}'], 1, 1),  # may turn it off
        ("0.33.0", ["--distributed-executor-backend", "ray"], 1, 1),
        ("0.33.0", [], 2, 2),  # PP stages (the V2 runner's one more not counted)
        ("0.33.0", ["--no-async-scheduling"], 4, 4),
    ],
)
def test_the_steps_a_window_holds_in_flight(release, extra_args, pp, steps):
    row = facts(r(release)) if release else None
    assert steps_in_flight(row.window if row else None, extra_args, pp) == steps


def test_a_mixed_model_keeps_its_windows_in_every_described_release():
    """The hybrid KV cache manager (0.9.1 on) keeps a windowed layer's window in vLLM's check, as do the
    undescribed releases' figures; --disable-hybrid-kv-cache-manager counts it in full."""
    gemma = config_shape("gemma-3-1b")
    assert kv_need(gemma, EngineArgs(), 2048, r("0.11.0")).windowed_per_token
    assert kv_need(gemma, EngineArgs(), 2048, r("0.8.3")).windowed_per_token
    off = EngineArgs(extra_args=["--disable-hybrid-kv-cache-manager"])
    assert not kv_need(gemma, off, 2048, r("0.11.0")).windowed_per_token


# --- no release, and the default image


@pytest.mark.parametrize(
    "model", ["llama-3.1-8b", "mixtral-8x7b", "qwen3-next-80b-a3b", "nemotron-h-8b", "deepseek-v3", "qwen2.5-7b"]
)
@pytest.mark.parametrize("gpu", ["NVIDIA-H200", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4", "NVIDIA-B200"])
def test_the_default_images_release_keeps_todays_figures_but_for_windows_and_graphs(model, gpu):
    """0.33: the batch defaults of 0.28 on, every model on the V2 runner (the floor): as without a release,
    for every model without a sliding window, but for the CUDA graphs, which every runner reserves inside
    the budget from 0.29: the cache is smaller by them, and capture never runs out beyond the budget."""
    shape, spec = config_shape(model), lookup(gpu)
    for engine in (
        EngineArgs(),
        EngineArgs(max_model_len=8192, tensor_parallel_size=2),
        EngineArgs(enforce_eager=True),
    ):
        default, today = estimate(shape, engine, spec, release=r("0.33.0")), estimate(shape, engine, spec)
        assert (default.weights_gib, default.activation_gib, default.requested_gib) == (
            today.weights_gib,
            today.activation_gib,
            today.requested_gib,
        )
        graphs = 0.0 if engine.enforce_eager else CUDAGRAPH_GIB
        assert default.kv_cache_gib == pytest.approx(max(today.kv_cache_gib - graphs, 0.0), abs=1e-9)
        assert default.failure != "cudagraph_capture_oom"
        if engine.enforce_eager:
            assert default == today


def test_the_default_image_counts_two_steps_for_a_windowed_model():
    """What 0.33 changes against the figures without a release: Gemma 3 1B's windowed layers hold two
    batches of 8192 tokens beside the window (one before), so a request of 131,072 needs 0.89 GiB, not 0.70,
    and a 1 GiB cache holds 1.13 of them, not 1.43."""
    shape, h200 = config_shape("gemma-3-1b"), lookup("NVIDIA-H200")
    engine = EngineArgs(kv_cache_memory_bytes=2**30, max_model_len=131072)
    today, default = estimate(shape, engine, h200), estimate(shape, engine, h200, release=parse_image(DEFAULT_IMAGE))
    assert (round(today.kv_needed_gib, 2), round(default.kv_needed_gib, 2)) == (0.70, 0.89)
    assert (today.max_concurrency, default.max_concurrency) == (1.43, 1.13)
    assert (default.kv_cache_gib, default.activation_gib) == (today.kv_cache_gib, today.activation_gib)


def test_pre_flight_reads_the_release_off_the_image():
    shape, h100 = config_shape("llama-3.1-8b"), lookup("NVIDIA-H100-80GB-HBM3")
    old = VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.14.0")
    assert old.release() == r("0.14.0")
    assert preflight(old, h100, shape).estimate.kv_cache_gib == pytest.approx(51.30, abs=0.01)
    for image in (
        "vllm/vllm-openai:latest",
        "registry.example/acme/vllm:2026-09",
        "vllm/vllm-openai@sha256:" + "0" * 64,
    ):
        spec = VLLMServiceSpec(model="m", image=image)
        assert spec.release() is None
        assert preflight(spec, h100, shape).estimate == estimate(shape, EngineArgs(), h100)


@pytest.mark.parametrize("var", ["VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V1"])
def test_an_environment_that_picks_the_runner_or_sampler_drops_the_release(var):
    spec = VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.14.0", env=[{"name": var, "value": "1"}])
    assert spec.release() is None
    other = VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.14.0", env=[{"name": "HF_HOME", "value": "/x"}])
    assert other.release() == r("0.14.0")


# --- plan --vllm-version


def run_plan(capsys, *argv: str) -> tuple[int, str, str]:
    from vllm_autoheal.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


CONFIG = str(Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json")


@pytest.mark.parametrize(
    "bad", ["banana", "0.25", "0.25.0rc1", "v0.25.0; rm -rf /", "\u0660.\u0662\u0665.\u0660", "x" * 5000]
)
def test_plan_refuses_a_bad_version(capsys, bad):
    code, out, err = run_plan(
        capsys, "plan", "--model-config", CONFIG, "--gpu", "NVIDIA-H100-80GB-HBM3", "--vllm-version", bad
    )
    assert code == 2 and "is not a vLLM release" in err and "X.Y.Z" in err and len(err) < 2000


def test_plan_says_which_releases_figures_it_used(capsys):
    argv = ("plan", "--model-config", CONFIG, "--gpu", "NVIDIA-H100-80GB-HBM3")
    code, out, _ = run_plan(capsys, *argv, "--vllm-version", "0.14.0")
    assert code == 0 and "0.14.0 (--vllm-version)" in out and "51.30 GiB" in out and "(outside the budget)" in out
    code, out, _ = run_plan(capsys, *argv)
    assert code == 0 and f"0.33.0 (the default image {DEFAULT_IMAGE})" in out and "54.18 GiB" in out
    assert "0.99 GiB (inside the budget)" in out
    code, out, _ = run_plan(capsys, *argv, "--vllm-version", "0.7.3")
    assert code == 0 and "not described" in out
    code, out, _ = run_plan(capsys, *argv, "--vllm-version", "v0.14.0", "--json")
    data = json.loads(out)
    assert data["vllm"]["release"] == "0.14.0" and data["kv_cache_gib"] == pytest.approx(51.30, abs=0.01)
    same = [o for o in data["options"] if (o["tensor_parallel_size"], o["kv_cache_dtype"]) == (1, "auto")]
    assert [o["kv_tokens"] for o in same] == [data["kv_tokens"]]  # the options with the same release


def test_activation_of_the_sort_path_is_what_the_sampler_holds():
    """The figure test_a_dense_8b_on_an_h100_at_defaults rests on: 38 bytes a logit over 1024 rows."""
    shape = config_shape("llama-3.1-8b")
    peak = activation_bytes(shape, 8192, 1, 1024, "v1-sort") / GIB
    assert peak == pytest.approx(38 * 1024 * 128256 / GIB + 2 * 4096 * 8192 / GIB + 0.03, abs=0.01)


_KV_REFUSAL = "\nValueError: No available memory for the cache blocks. Try increasing gpu_memory_utilization"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (
            "(EngineCore pid=7) INFO 11-30 03:18:44 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: m",
            "0.32.0",
        ),
        ("INFO 12-27 08:52:17 llm_engine.py:249] Initializing an LLM engine (v0.6.4) with config: model='x'", "0.6.4"),
        ("INFO 06-05 08:00:42 [llm_engine.py:243] Initializing a V0 LLM engine (v0.8.5.post1) with config", "0.8.5"),
        (
            "(APIServer pid=4) INFO 08-12 14:53:04 [api_utils.py:345]  \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version 0.27.0",
            "0.27.0",
        ),
        ("INFO 06-05 08:00:42 [llm_engine.py:243] Initializing a V0 LLM engine (v0.8.4+dc1a3e10.nv25.05) with", None),
        ("INFO 02-13 14:17:58 [core.py:84] Initializing a V1 LLM engine (v0.11.1rc2.dev3+gabc) with config", None),
        ("INFO 02-13 14:17:58 [core.py:84] Initializing a V1 LLM engine (v0.9.2.dev364+gb432b7a28.rocm641) with", None),
        # a request's text quoting the engine's first line names nothing
        (
            "INFO 06-05 10:00:00 [logger.py:39] Received request chatcmpl-1: prompt: 'Initializing a V1 LLM engine (v0.5.0)'",
            None,
        ),
        ("INFO 06-05 10:00:00 [core.py:84] Engine note: Initializing a V1 LLM engine (v0.5.0)", None),
    ],
)
def test_the_release_the_engine_logged_is_read_only_from_its_own_words(line, named):
    """The engine names its release on its first line (and, from about 0.27, the API server's banner):
    read from the line's start, as the engine opens it, for a release build only (a dev, rc or vendor
    build's figures may be any release's), never from text a request carried."""
    d = classify(Signals(log=line + _KV_REFUSAL))
    assert logged_release(d.numbers) == (parse_version(named) if named else None)


def test_a_release_the_log_names_fills_in_for_an_image_tag_that_names_none():
    """The operator's inventory: the image's tag first (the release the operator deployed), the log's
    where the tag names none (latest, a digest), neither where the pod's env picks another runner."""
    from vllm_autoheal.api import VLLMService
    from vllm_autoheal.kube.heal import inventory

    d = classify(
        Signals(log="INFO 02-13 14:17:58 [core.py:84] Initializing a V1 LLM engine (v0.14.0) with" + _KV_REFUSAL)
    )
    for image, env, expected in (
        ("vllm/vllm-openai:latest", [], "0.14.0"),
        ("vllm/vllm-openai:v0.33.0", [], "0.33.0"),
        ("vllm/vllm-openai:latest", [{"name": "VLLM_USE_V1", "value": "0"}], None),
    ):
        obj = VLLMService(spec=VLLMServiceSpec(model="m", image=image, env=env))
        assert inventory(obj, None, None, d).release == (parse_version(expected) if expected else None)


# --- the CUDA graphs' reservation inside the budget


@pytest.mark.parametrize(
    ("release", "model", "reserved"),
    [
        ("0.19.0", "llama-3.1-8b", False),  # the estimate was opt-in (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)
        ("0.20.0", "llama-3.1-8b", True),  # on by default; Llama on the V1 runner
        ("0.22.0", "qwen2.5-7b", True),  # V2 only for Qwen3 then
        ("0.25.0", "llama-3.1-8b", False),  # the V2 runner's profile_cudagraph_memory returns 0
        ("0.25.0", "nemotron-h-8b", True),  # a hybrid stays on the V1 runner
        ("0.29.0", "llama-3.1-8b", True),  # the V2 runner estimates its graphs too
        ("0.33.0", "qwen1.5-moe-a2.7b", True),
    ],
)
def test_the_graphs_come_off_the_cache_where_the_runner_reserves_them(release, model, reserved):
    """gpu_worker.py determine_available_memory: available KV = requested - non-KV - the runner's
    graph estimate. The H200 runs of 0.25 (Llama on V2) show the same cache with and without
    --enforce-eager (24.99 GiB at 0.3), which the V1 runner's reservation would not."""
    shape, h100 = config_shape(model), lookup("NVIDIA-H100-80GB-HBM3")
    engine = EngineArgs(max_model_len=8192, gpu_memory_utilization=0.9)
    graphs = estimate(shape, engine, h100, release=r(release))
    eager = estimate(shape, engine.model_copy(update={"enforce_eager": True}), h100, release=r(release))
    assert graphs.kv_cache_gib == pytest.approx(eager.kv_cache_gib - (CUDAGRAPH_GIB if reserved else 0), abs=1e-9)


def test_rocm_reserves_the_graphs_from_0_26():
    """The worker estimated the graphs on CUDA alone (is_cuda) until 0.26 (is_cuda_alike)."""
    shape, mi300x = config_shape("nemotron-h-8b"), lookup("custom", 191.5)  # an MI300X (V1: a hybrid)
    engine, eager = EngineArgs(max_model_len=8192), EngineArgs(max_model_len=8192, enforce_eager=True)
    for version, reserved in (("0.25.0", 0.0), ("0.26.0", CUDAGRAPH_GIB)):
        graphs = estimate(shape, engine, mi300x, release=r(version, "rocm")).kv_cache_gib
        assert graphs == pytest.approx(
            estimate(shape, eager, mi300x, release=r(version, "rocm")).kv_cache_gib - reserved
        )


def test_a_high_utilization_leaves_the_graphs_room_only_where_they_are_captured_beside_the_budget():
    """Qwen2.5-7B on a 24 GB RTX 4090 at utilization 0.95: 1.18 GiB beside the budget, less the CUDA
    context, holds no 0.99 GiB of graphs. Under 0.25 (V2, graphs outside the budget) pre-flight says
    capture runs out and Fix cuts utilization; under 0.33 vLLM reserves them inside the budget, the start
    fits, and Fix changes nothing (a cut there would only shrink the cache)."""
    shape, gpu = config_shape("qwen2.5-7b"), lookup("NVIDIA-GeForce-RTX-4090")
    for version, fits in (("0.25.0", False), ("0.33.0", True)):
        spec = VLLMServiceSpec(
            model="m",
            image=f"vllm/vllm-openai:v{version}",
            engine={"gpuMemoryUtilization": 0.95, "maxModelLen": 32768},
            preflight="Fix",
        )
        before = estimate(shape, spec.engine, gpu, release=spec.release())
        assert before.fits is fits and (before.failure == "cudagraph_capture_oom") is not fits, before.reasons
        assert (preflight(spec, gpu, shape).engine.gpu_memory_utilization == 0.95) is fits


def test_an_environment_that_turns_the_estimate_off_names_no_release():
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.33.0",
        env=[{"name": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "value": "0"}],
    )
    assert spec.release() is None
