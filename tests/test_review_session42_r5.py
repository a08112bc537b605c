"""Session 42 review, round 5: LoRA slots weighed with the weights (lora_slots.py), what pre-flight refuses to fit
(preflight.unsplittable, preflight._unweighed) and MIG slices sized from their profile (gpu_catalog._slice_gib),
against what vLLM allocates and what NVIDIA's MIG profiles hold. Each xfail asserts the right behaviour with its
arithmetic; the passing tests are attacks that held.

Sources: vLLM vllm/config/lora.py (LoRADType = Literal["auto", "float16", "bfloat16"]; MaxLoRARanks = Literal[1, 8,
16, 32, 64, 128, 256, 320, 512]; max_lora_rank = 16; max_loras = Field(default=1, ge=1); verify_with_model_config:
an "auto" lora_dtype becomes model_config.dtype), vllm/lora/layers/*.py create_lora_weights (torch.zeros of
lora_config.lora_dtype), vllm/lora/model_manager.py _create_lora_modules (every LinearBase and FusedMoE module is
wrapped: get_supported_lora_modules), vllm/config/speculative.py SpeculativeMethod.
"""

from __future__ import annotations

import json
import math

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.cli import main
from vllm_autoheal.engine import parse_args
from vllm_autoheal.engine_defaults import speculative_method
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.lora_slots import lora_slots_gib
from vllm_autoheal.preflight import preflight

from samples import config_shape

GIB = 2**30
H100 = "NVIDIA-H100-80GB-HBM3"
IMAGE_033 = "vllm/vllm-openai:v0.33.0"
CONFIGS = "tests/fixtures/configs/"
LORA_4x64 = ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"]


def _llama8_slot_elements() -> int:
    """Elements of one Llama-3.1-8B LoRA slot of rank 1 on one GPU (TP 1), per create_lora_weights: qkv a 3 x 4096,
    b 4096 + 1024 + 1024; o_proj a 4096, b 4096; gate_up a 2 x 4096, b 2 x 14336; down a 14336, b 4096; x 32 layers."""
    h, kv, inter = 4096, 1024, 14336
    return (3 * h + (h + 2 * kv) + h + h + 2 * h + 2 * inter + inter + h) * 32


# --- LoRA slots ---------------------------------------------------------------------------------------------------


def test_lora_slots_of_a_dense_decoder_match_vllms_layers():
    """Held: 4 slots of rank 64 in bf16 on Llama-3.1-8B are 2,621,440 x 4 x 64 x 2 B = 1.25 GiB, as lora_slots_gib
    gives; vLLM's default (--enable-lora alone: max_loras 1, max_lora_rank 16) 0.078 GiB; --fully-sharded-loras only
    shards further (an over-estimate, never under)."""
    shape = config_shape("llama-3.1-8b")
    assert math.isclose(
        lora_slots_gib(shape, EngineArgs(extra_args=LORA_4x64)), _llama8_slot_elements() * 4 * 64 * 2 / GIB
    )
    assert math.isclose(lora_slots_gib(shape, EngineArgs(extra_args=["--enable-lora"])), 0.078125)
    assert lora_slots_gib(shape, EngineArgs(extra_args=["--enable-lora=false"])) == 0.0


def test_lora_slots_follow_the_dtype_the_model_runs_in():
    """vLLM's LoRAConfig.verify_with_model_config turns lora_dtype "auto" into model_config.dtype, which --dtype
    float32 sets, and create_lora_weights allocates torch.zeros(..., dtype=lora_config.lora_dtype). Llama-3.1-8B,
    --dtype float32 --enable-lora --max-loras 4 --max-lora-rank 64: 2,621,440 x 4 x 64 x 4 B = 2.50 GiB of slots.
    lora_slots_gib uses shape.served_bytes (2, from config.json's bfloat16) and gives 1.25 GiB, while the weights
    beside it are weighed at --dtype's 4 B (plan: 29.96 GiB without the slots, 31.21 with): 1.25 GiB of the
    KV budget unaccounted, more than the 0.97 GiB margin Fix sizes to."""
    shape = config_shape("llama-3.1-8b")
    # (--dtype is a typed flag: parse_args puts it in EngineArgs.dtype, as the CRD's engine.dtype does)
    got = lora_slots_gib(shape, parse_args([*LORA_4x64, "--dtype", "float32"]).engine)
    assert math.isclose(got, _llama8_slot_elements() * 4 * 64 * 4 / GIB), got


@pytest.mark.parametrize(
    "flags",
    [
        ["--enable-lora", "--max-lora-rank", "48"],
        ["--enable-lora", "--max-loras", "0"],
        ["--enable-lora", "--lora-dtype", "float32"],
    ],
)
def test_plan_refuses_lora_flags_vllm_refuses(flags, capsys):
    """vllm/config/lora.py: max_lora_rank: MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] (48 is
    refused by pydantic at startup), max_loras = Field(default=1, ge=1) (0 refused), lora_dtype: LoRADType =
    Literal["auto", "float16", "bfloat16"] (float32 refused). `plan` prints "fits yes" and exits 0 for each
    (rank 48 weighed as 0.23 GiB; 0 slots silently weighed as none: lora_slots_gib's None is `or 0.0` in
    memory.estimate; float32 weighed at 4 B). Bad input is a clear error: exit 2 naming the flag."""
    rc = main(["plan", "--model-config", CONFIGS + "llama-3.1-8b.json", "--gpu", H100, *flags])
    err = capsys.readouterr().err
    assert rc == 2 and flags[-2] in err and "Traceback" not in err


@pytest.mark.parametrize("mode", ["Fix", "Warn"])
def test_preflight_does_not_call_unweighed_moe_lora_slots_a_fit(mode):
    """Mixtral-8x7B, TP 2 on H100s, --enable-lora --max-loras 8 --max-lora-rank 256. vLLM wraps every LinearBase and
    FusedMoE module (model_manager._create_lora_modules, utils.get_supported_lora_modules): per layer and rank, per
    slot of rank 1, attention qkv a 3 x 4096 + b (4096 + 2 x 1024) / 2, o_proj a 4096 / 2 + b 4096 = 21,504; each of
    8 experts w1/w3 a 2 x 4096 + b 2 x 14336 / 2, w2 a 14336 / 2 + b 4096 = 33,792 (FusedMoEWithLoRA). (21,504 +
    8 x 33,792) x 32 layers x 8 slots x 256 x 2 B = 35.6 GiB a GPU (attention alone 2.63 GiB), where the estimate
    leaves a 25.26 GiB KV cache with 43.54 GiB of weights: vLLM cannot even allocate the slots in its 0.9 share
    (43.54 + 35.6 > 71.26). lora_slots_gib returns None ("not laid out") and memory.estimate adds `or 0.0`:
    fits True, MemoryFit "Fits" (and _unweighed is only consulted when the estimate does not fit). Slots the
    model cannot weigh are no fit claimed: not fits, or a reason naming the unweighed LoRA slots."""
    spec = VLLMServiceSpec(
        model="m",
        engine={"tensorParallelSize": 2, "extraArgs": ["--enable-lora", "--max-loras", "8", "--max-lora-rank", "256"]},
        preflight=mode,
        image=IMAGE_033,
    )
    r = preflight(spec, lookup(H100), config_shape("mixtral-8x7b"))
    assert not r.fits or any("LoRA" in reason for reason in r.reasons), (r.fits, r.reasons)


def test_preflight_does_not_call_a_fit_beside_a_draft_it_cannot_weigh():
    """The round-4 arithmetic (test_review_session42_preflight, draft test): Llama-3.1-8B on an H100, vLLM 0.33,
    --max-model-len 131072 at utilization 0.43 leaves 16.97 GiB of cache for a 16.00 GiB request; a Llama-3.2-1B
    draft (2.30 GiB of bf16 weights, loaded in the same DeviceMemoryProfiler, plus 4 GiB of its own KV at 131,072)
    leaves 14.67: "larger than the available KV cache memory", a crash. Given at 0.43 by the user (the figure Fix
    itself once chose), pre-flight answers fits True and the operator writes MemoryFit True "Fits", Fix or not:
    preflight() returns on est.fits before _unweighed. A draft the memory model cannot weigh is no fit claimed."""
    draft = json.dumps({"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5})
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 131072, "gpuMemoryUtilization": 0.43, "extraArgs": ["--speculative-config", draft]},
        preflight="Fix",
        image=IMAGE_033,
    )
    r = preflight(spec, lookup(H100), config_shape("llama-3.1-8b"))
    assert r.estimate.kv_cache_gib - 2.30 < r.estimate.kv_needed_gib  # (the draft's weights alone overrun it)
    assert not r.fits or any("draft" in reason for reason in r.reasons), (r.fits, r.reasons)


# --- speculative spellings and TP -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "method"),
    [
        (["--speculative-config", '{"method": "eagle3", "model": "x"}'], "eagle3"),
        (["--speculative_config", '{"method": "mtp"}'], "mtp"),
        (["--speculative-config.method=eagle"], "eagle"),
        (["-sc.method", "draft_model"], "draft_model"),
        (["-sc", '{"model": "meta-llama/Llama-3.2-1B"}'], ""),
        (["--speculative-config.model", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"], ""),
    ],
)
def test_speculative_spellings_that_load_weights_are_read(args, method):
    """Held: JSON, underscore, dotted and -sc spellings all name a method (or "" for a draft without one), which
    _unweighed treats as weights it does not weigh."""
    assert speculative_method(args) == method


def test_an_unsplittable_tensor_parallel_size_is_no_fit_in_any_mode():
    """Held: 32 heads and 8 KV heads do not split over 3 GPUs; vLLM refuses; pre-flight says not fits, Warn or Fix."""
    for mode in ("Warn", "Fix"):
        spec = VLLMServiceSpec(model="m", engine={"tensorParallelSize": 3}, preflight=mode, image=IMAGE_033)
        r = preflight(spec, lookup("NVIDIA-L4"), config_shape("llama-3.1-8b"))
        assert not r.fits and "does not split" in r.reasons[0]


# --- MIG -----------------------------------------------------------------------------------------------------------


def test_an_h200_slice_is_never_sized_above_its_share_of_the_gpu():
    """NVIDIA's MIG user guide: an H200 141GB has 8 memory slices; 1g.18gb holds 1/8 of them, 2g.35gb/1g.35gb 2/8,
    3g.71gb/4g.71gb 4/8. The catalog's H200 is 139.80 GiB (measured by torch, tests/fixtures/gpu), so a 4/8 slice
    holds at most 69.90 GiB and a 1/8 one 17.475 (a torch run on an H200 MIG 3g.71gb reported 69.8 GB of VRAM).
    _slice_gib gives 71 - 0.75 = 70.25 and 18 - 0.5 = 17.50: above what the slice has, the direction the commit says
    it never errs in (the profile's number on an H200 is its share of 141 GB, not GiB less 0.75)."""
    whole = lookup("NVIDIA-H200").memory_gib
    assert lookup("NVIDIA-H200-MIG-3g.71gb").memory_gib <= whole / 2
    assert lookup("NVIDIA-H200-MIG-1g.18gb").memory_gib <= whole / 8


def test_mig_slices_on_a100_h100_are_not_above_what_cuda_lists():
    """Held: `nvidia-smi mig -lgip` figures (H100 80GB 1g.10gb 9.75, 2g.20gb 19.62, 3g.40gb 39.50, 7g.80gb 79.25;
    torch on an A100 80GB 2g.20gb 19.50) are never exceeded."""
    for name, listed in [
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 9.75),
        ("NVIDIA-H100-80GB-HBM3-MIG-2g.20gb", 19.62),
        ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", 39.50),
        ("NVIDIA-H100-80GB-HBM3-MIG-7g.80gb", 79.25),
        ("NVIDIA-A100-SXM4-80GB-MIG-2g.20gb", 19.50),
    ]:
        assert lookup(name).memory_gib <= listed, name


@pytest.mark.parametrize("name", ["NVIDIA-H100-MIG-0g.0gb", "NVIDIA-H100-MIG-1g.99999999gb"])
def test_an_absurd_mig_profile_is_a_key_error_not_a_size(name):
    """Held: 0 and past 4096 GiB are no size (KeyError, which kube/reconcile.memory_fit turns into MemoryFit Unknown
    PreflightFailed inside its try; plan exits 2 on an unknown GPU)."""
    with pytest.raises(KeyError):
        lookup(name)
