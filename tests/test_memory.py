from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.shape_reader import shape_from_config

from samples import CONFIGS, config_shape

# Published sizes (model cards) and KV bytes per token in bf16: 2 x layers x kv_heads x head_dim x 2.
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, 2 * 32 * 8 * 128 * 2),
    ("llama-3.1-70b", 70.6e9, 2 * 80 * 8 * 128 * 2),
    ("mistral-7b-v0.1", 7.24e9, 2 * 32 * 8 * 128 * 2),
    ("qwen2.5-7b", 7.61e9, 2 * 28 * 4 * 128 * 2),
    ("qwen2.5-32b", 32.5e9, 2 * 64 * 8 * 128 * 2),
    ("mixtral-8x7b", 46.7e9, 2 * 32 * 8 * 128 * 2),
    ("qwen1.5-moe-a2.7b", 14.3e9, 2 * 24 * 16 * 128 * 2),
    ("deepseek-v3", 671e9, 61 * (512 + 64) * 2),  # MLA: one compressed latent + rope key per layer
]


@pytest.mark.parametrize("name,params,kv", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_and_kv_bytes(name, params, kv):
    s = config_shape(name)
    assert abs(s.params() - params) / params < 0.01, s.params()
    assert s.kv_bytes_per_token() == kv


def test_kv_split_by_tensor_parallel_and_fp8():
    s = config_shape("llama-3.1-70b")
    assert s.kv_bytes_per_token(tp=4) == s.kv_bytes_per_token() // 4
    assert s.kv_bytes_per_token(tp=16) == s.kv_bytes_per_token() // 8  # 8 KV heads: replicated past TP 8
    assert s.kv_bytes_per_token("fp8") == s.kv_bytes_per_token() // 2
    assert config_shape("deepseek-v3").kv_bytes_per_token(tp=8) == config_shape("deepseek-v3").kv_bytes_per_token()


def test_quantized_weights_are_about_a_quarter():
    s = config_shape("llama-3.1-70b")
    bf16 = weights_bytes_per_gpu(s)
    awq = weights_bytes_per_gpu(s, "awq")
    assert 0.25 < awq / bf16 < 0.33  # 4-bit linear layers, 16-bit embeddings
    assert weights_bytes_per_gpu(s, tp=4) == pytest.approx(bf16 / 4, rel=0.01)


# Real vLLM 0.25 runs on one H200 (dummy weights, Llama-3.1-8B): flags, whether it started, and the
# memory vLLM measured. The logs they come from are too large for the repository.
GROUND_TRUTH = Path(__file__).parent / "fixtures" / "gpu" / "ground-truth-cases.jsonl"


def _cases():
    return [json.loads(line) for line in GROUND_TRUTH.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["case_id"])
def test_calibrated_on_real_h200_runs(case):
    """Every measured run: available KV within 5 % and `fits` exactly as vLLM did."""
    s = config_shape("llama-3.1-8b")
    engine = EngineArgs(**{k: v for k, v in case["engine_args"].items() if k in EngineArgs.model_fields})
    est = estimate(s, engine, lookup("NVIDIA-H200"), entrypoint="llm")
    assert est.fits == case["started"]
    measured = case["memory_gib"]["available_kv_cache"]
    assert abs(est.kv_cache_gib - measured) / measured < 0.05
    if case["kv_cache"]["estimated_max_model_len"]:
        assert (
            abs(est.max_model_len_fit - case["kv_cache"]["estimated_max_model_len"])
            / case["kv_cache"]["estimated_max_model_len"]
            < 0.05
        )


def test_other_process_and_weights_that_do_not_fit():
    s = config_shape("llama-3.1-70b")
    h100 = lookup("NVIDIA-H100-80GB-HBM3")
    assert estimate(s, EngineArgs(), h100).failure == "weights_load_oom"
    assert estimate(s, EngineArgs(tensor_parallel_size=4, max_model_len=32768), h100).fits
    small = config_shape("llama-3.1-8b")
    shared = estimate(small, EngineArgs(max_model_len=8192), h100, free_gib=40)
    assert shared.failure == "gpu_util_exceeds_free"
    assert estimate(small, EngineArgs(max_model_len=8192, gpu_memory_utilization=0.45), h100, free_gib=40).fits


def test_gpu_catalog():
    assert lookup("NVIDIA-H200").memory_gib == 139.8
    assert lookup("nvidia-a100-sxm4-80gb").memory_gib == lookup("NVIDIA-A100-SXM4-80GB-SHARED").memory_gib
    assert 4 < lookup("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb").memory_gib < 5
    assert lookup("Acme-X1", memory_gib=61.5).memory_gib == 61.5
    with pytest.raises(KeyError, match="give its memory"):
        lookup("Acme-X1")


def test_plan_cli_json_keys_and_exit_codes():
    cfg = str(CONFIGS / "llama-3.1-8b.json")
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "plan", "--model-config", cfg, *a], capture_output=True, text=True
    )
    bad = run("--gpu", "NVIDIA-L4", "--max-model-len", "131072", "--json")
    assert bad.returncode == 1
    data = json.loads(bad.stdout)
    for key in ("weights_gib", "kv_cache_gib", "kv_tokens", "max_model_len_fit", "fits", "reasons"):
        assert key in data
    assert data["fits"] is False and data["suggestion"]["fits"] is True
    assert "--max-model-len" in data["suggestion"]["flags"]
    good = run("--gpu", "NVIDIA-H200", "--max-model-len", "8192")
    assert good.returncode == 0 and "fits             yes" in good.stdout
    unknown = run("--gpu", "Acme-X1")
    assert unknown.returncode == 2 and "give its memory" in unknown.stderr
    shared = run("--gpu", "NVIDIA-H100-80GB-HBM3", "--gpu-free-gib", "40", "--max-model-len", "8192", "--json")
    assert json.loads(shared.stdout)["suggestion"]["steps"][0]["action"] == "LowerGpuMemoryUtilization"


@pytest.mark.parametrize(
    "engine, sized",
    [
        ({}, True),
        ({"tensorParallelSize": 2}, True),
        ({"cpuOffloadGb": 8}, False),  # part of the weights stays in host RAM
        ({"extraArgs": ["--enable-expert-parallel", "--data-parallel-size", "2"]}, False),
        ({"extraArgs": ["--quantization=fp8"]}, False),
        ({"extraArgs": ["--max-num-seqs", "8"]}, True),
    ],
)
def test_the_classifier_gets_the_weights_only_where_the_flags_place_them_as_counted(engine, sized):
    """An overestimate would call a later step's OOM a loading one: flags the model does not count
    (offload, data/expert parallel, another quantization through extra args) give no figure."""
    from vllm_autoheal.model_weights import weights_gib_per_gpu, weights_gib_to_diagnose

    args = EngineArgs.model_validate(engine)
    got = weights_gib_to_diagnose(config_shape("llama-3.1-70b"), args)
    assert (got is not None) == sized
    if sized:
        assert got == weights_gib_per_gpu(config_shape("llama-3.1-70b"), args) > 30


def test_a_container_quantization_without_its_bits_gives_the_classifier_no_figure():
    """compressed-tensors (and modelopt, quark, ...) hold 4- or 8-bit schemes: without the checkpoint's
    bits the width is a guess, and an overestimate would call a later OOM a loading one."""
    from vllm_autoheal.model_weights import weights_gib_to_diagnose

    cfg = json.loads((CONFIGS / "llama-3.1-70b.json").read_text())
    unknown = shape_from_config({**cfg, "quantization_config": {"quant_method": "compressed-tensors"}})
    four = shape_from_config({**cfg, "quantization_config": {"quant_method": "compressed-tensors", "bits": 4}})
    assert weights_gib_to_diagnose(unknown, EngineArgs()) is None
    assert 33 < weights_gib_to_diagnose(four, EngineArgs()) < 42  # 70.6B x 4.25 bits
