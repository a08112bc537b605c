"""The weights of an mxfp4 checkpoint on one GPU (operator/vllm_autoheal/mxfp4_experts.py): vLLM quantizes
the routed experts alone and pads them to its kernel's tile, which depends on the GPU. Replayed against
public start-up logs of gpt-oss ("Model loading took"); everything else keeps its figures."""

from __future__ import annotations

import pytest

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.gpu_catalog import GpuSpec, lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_shape import QUANT_BYTES
from vllm_autoheal.model_weights import WEIGHT_BUFFERS_GIB, weights_bytes_per_gpu, weights_gib_per_gpu
from vllm_autoheal.mxfp4_experts import expert_bytes_per_gpu, padding

from samples import config_shape, gpt_oss

GIB = 2**30
H100, A100 = lookup("NVIDIA-H100-80GB-HBM3"), lookup("NVIDIA-A100-SXM4-80GB")


GPT_OSS_120B, GPT_OSS_20B = gpt_oss(36, 128), gpt_oss(24, 32)


def test_gpt_oss_20b_on_an_a100_loads_what_vllm_loaded():
    """https://myoceane.fr/index.php/ai-vllm-a100-gemma-4/ (vLLM 0.19.0, one A100 80GB): "Model loading took
    13.72 GiB". An A100 runs Marlin alone: 2880 wide experts padded to 3072 x 2944. 13.71 (11.96 before)."""
    got = weights_gib_per_gpu(GPT_OSS_20B, EngineArgs(), A100)
    assert got == pytest.approx(13.72, rel=0.02) and got <= 13.72


def test_marlins_padding_gives_the_120b_figure_vllm_loaded_with_marlin():
    """https://github.com/vllm-project/vllm/issues/23278 (vLLM 0.10.1, one H100): Marlin ran ("Weight-only
    FP4 compression will be used leveraging the Marlin kernel"), "Model loading took 65.9651 GiB". Marlin
    pads alike on every GPU: counted on an A100, where it is certain, the figure is 65.91."""
    got = weights_gib_per_gpu(GPT_OSS_120B, EngineArgs(), A100)
    assert got == pytest.approx(65.9651, rel=0.02) and got <= 65.9651


def test_gpt_oss_120b_on_an_h100_counts_the_smallest_padding():
    """On an H100 vLLM runs Marlin (0.10.1 without triton_kernels: 65.97 GiB), Triton (0.14.1: "Using
    Triton backend", 64.38 GiB, https://github.com/vllm-project/vllm/issues/33155) or FlashInfer's CUTLASS
    on request; the estimate does not know which, so it counts Triton's, the smallest: none for 2880-wide
    experts. 60.78 GiB, under both logs (59.38 before, which counted attention and router in 4 bits)."""
    got = weights_gib_per_gpu(GPT_OSS_120B, EngineArgs(), H100)
    assert got == pytest.approx(60.78, abs=0.02)
    assert got < 64.38 < 65.9651
    assert got == weights_gib_per_gpu(GPT_OSS_120B, EngineArgs(), None)  # (as an unknown GPU: no padding)


def test_the_estimate_uses_the_gpus_padding():
    """estimate() counts the padding of the GPU it is given: the KV cache the 20b's figures leave on an A100
    with the flags of the log above (36.56 GiB printed; the rest of the gap is the profile peak's)."""
    engine = EngineArgs(gpu_memory_utilization=0.65, max_model_len=131072)
    est = estimate(GPT_OSS_20B, engine, A100)
    assert est.weights_gib == weights_gib_per_gpu(GPT_OSS_20B, engine, A100)
    assert est.kv_cache_gib == pytest.approx(37.19, abs=0.02)


def test_only_the_experts_are_mxfp4():
    """Attention, router, embeddings and lm_head in bf16 (Mxfp4Config: UnquantizedLinearMethod for every
    linear layer); the experts at mxfp4's bytes, a bf16 bias a row."""
    s = GPT_OSS_120B
    experts = s.moe_layer_count(s.layers) * s.routed_expert_params()
    dense = s.embedding_params() + s.stack_params(s.layers) - experts
    biases = s.layers * s.experts * (2 * s.moe_intermediate + s.hidden) * 2
    want = dense * 2 + experts * QUANT_BYTES["mxfp4"] + biases + WEIGHT_BUFFERS_GIB * GIB
    assert weights_bytes_per_gpu(s) == int(want)


@pytest.mark.parametrize(
    "capability, hidden, inter",
    [((8, 0), 3072, 1536), ((8, 9), 3072, 1536), ((9, 0), 2880, 1472), ((10, 0), 2880, 1472), ((12, 0), 2880, 1472)],
)
def test_the_padding_applies_to_each_gpus_share_of_the_intermediate_width(capability, hidden, inter):
    """TP 2 splits the 2880-wide intermediate to 1440 a GPU before padding: Marlin's 128 make it 1536,
    Triton's 64 1472; the hidden width is not split (FusedMoE's intermediate_size_per_partition)."""
    s = GPT_OSS_120B
    weights = s.experts * 3 * hidden * inter * QUANT_BYTES["mxfp4"]
    biases = s.experts * (2 * inter + hidden) * 2
    assert expert_bytes_per_gpu(s, s.layers, 2, QUANT_BYTES["mxfp4"], capability) == s.layers * (weights + biases)


def test_a_gpu_without_a_known_architecture_counts_no_padding():
    assert padding(None) == padding((7, 5)) == (1, 1)
    assert GpuSpec("gpu", 80.0).capability is None  # (what the remedy planner builds)


@pytest.mark.parametrize(
    "config", ["mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v3", "llama-3.1-8b", "nemotron-h-8b"]
)
@pytest.mark.parametrize("quantization", [None, "awq", "gptq", "fp8", "experts_int8", "moe_wna16"])
def test_other_quantizations_and_dense_models_keep_their_weights(config, quantization):
    """Every quantization but mxfp4 counts as before: its width on every linear layer, the embeddings in
    the model dtype, whatever the GPU."""
    s = config_shape(config)
    legacy = int(
        (s.stack_params(s.layers) * QUANT_BYTES.get(quantization or "", 2.0) + s.embedding_params() * 2.0)
        + WEIGHT_BUFFERS_GIB * GIB
    )
    assert {weights_bytes_per_gpu(s, quantization, capability=c) for c in (None, (8, 0), (9, 0))} == {legacy}


def test_a_dense_mxfp4_checkpoint_keeps_its_weights():
    """Without experts there is nothing to pad, and the quantization's width stands as before."""
    s = config_shape("llama-3.1-8b")
    legacy = int(
        s.stack_params(s.layers) * QUANT_BYTES["mxfp4"] + s.embedding_params() * 2.0 + WEIGHT_BUFFERS_GIB * GIB
    )
    assert weights_bytes_per_gpu(s, "mxfp4", capability=(8, 0)) == legacy


def test_another_mxfp4_moe_of_tile_wide_experts_is_not_padded():
    """A non-gpt-oss MoE under mxfp4 (Mixtral's shape: 4096 by 14336, multiples of every tile): the same
    weights on every GPU; its non-expert layers in bf16, as vLLM's Mxfp4Config keeps them."""
    s = config_shape("mixtral-8x7b")
    assert len({weights_bytes_per_gpu(s, "mxfp4", capability=c) for c in (None, (8, 0), (9, 0), (10, 0))}) == 1


@pytest.mark.parametrize(
    "name, capability",
    [
        ("NVIDIA-H100-80GB-HBM3", (9, 0)),
        ("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", (8, 0)),
        ("NVIDIA-L4", (8, 9)),
        ("NVIDIA-B200", (10, 0)),
        ("NVIDIA-GeForce-RTX-5090", (12, 0)),
    ],
)
def test_the_catalog_knows_each_products_compute_capability(name, capability):
    assert lookup(name).capability == capability
    assert lookup(name, 40.0).capability == capability  # (a size given beside a known product)
    assert lookup("custom", 40.0).capability is None


def test_the_heals_floor_reads_the_gpu_the_inventory_names():
    """The planner's estimates take the GPU's product from the inventory (its name and compute
    capability), not a nameless size: gpt-oss-120b's least utilization on an A100 counts the 65.9
    GiB Marlin loads, not the 60.8 an unknown GPU is credited with (the heal went below it)."""
    from vllm_autoheal.api import HealBounds
    from vllm_autoheal.remedy_gate import utilization_floor

    bounds = HealBounds(min_max_model_len=4096)
    named = utilization_floor(bounds, EngineArgs(), GPT_OSS_120B, 79.15, gpu_name="NVIDIA-A100-SXM4-80GB")
    nameless = utilization_floor(bounds, EngineArgs(), GPT_OSS_120B, 79.15)
    assert named is not None and nameless is not None
    padded = estimate(GPT_OSS_120B, EngineArgs(), A100).weights_gib
    assert padded > 65.5 and named * 79.15 >= padded > nameless * 79.15  # 0.85 where it was 0.79
