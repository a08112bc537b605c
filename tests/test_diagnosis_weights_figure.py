"""The weights figure the unplaced-OOM rules (diagnosis/unplaced.py) are fed: kube/crash.py's
weights_per_gpu = model_weights.weights_gib_to_diagnose(shape, engine) of the model's config.json. It counts the
weights as vLLM loads them, so an OOM after the weights were all resident is not called weights_load_oom
(a wrong memory change). Each test models a real checkpoint and the vLLM behaviour that puts less on the
GPU than a naive estimate.

Every config below is the checkpoint's own config.json, reduced to the fields the memory model reads
(model_config.FIELDS and STRINGS); no engine flag is set that weights_gib_to_diagnose declines (no extra
args, no cpu offload)."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.model_config import parse, to_shape
from vllm_autoheal.model_weights import weights_gib_to_diagnose


def operator_weights(config: dict, **engine) -> float | None:
    """What kube/crash.py's weights_per_gpu hands the classifier for this config.json."""
    return weights_gib_to_diagnose(to_shape(parse(json.dumps(config))), EngineArgs(**engine))


def torch_oom(tried: str, total: str, free: str, in_use: str, held: str, reserved: str) -> str:
    """torch's OOM message as c10/cuda/CUDACachingAllocator.cpp formats it (TORCH_CHECK_WITH
    OutOfMemoryError: "... is allocated by PyTorch, and ... is reserved by PyTorch but unallocated.")."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity "
        f"of {total} of which {free} is free. Including non-PyTorch memory, this process has {in_use} memory "
        f"in use. Of the allocated memory {held} is allocated by PyTorch, and {reserved} is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
    )


def cut_oom(tried: str, total: str, free: str) -> str:
    """The same message cut after its first sentence (as the existing tests' CUT): no held figure."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity "
        f"of {total} of which {free} is free.\n"
    )


# google/gemma-2-2b (base) config.json: "torch_dtype": "float32", no tie_word_embeddings field.
GEMMA2_2B = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "num_hidden_layers": 26,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "torch_dtype": "float32",
}


def test_a_float32_config_is_served_in_16_bits_so_its_weights_are_half_the_estimate():
    """vLLM's default --dtype auto never keeps a float32 checkpoint in float32: vllm/config/model.py
    `_resolve_auto_dtype` ("# Downcast for float32 models: config_dtype = preferred_dtype", i.e.
    bfloat16, gemma2 being in _FLOAT16_NOT_SUPPORTED_MODELS); older vLLM `_get_and_verify_dtype`
    did the same with float16 ("we use float16 for float32 models"). The memory model instead
    prices the weights at DTYPE_BYTES[shape.dtype] = 4 bytes (weights_bytes_per_gpu; it also counts
    an untied lm_head, the config naming no tie_word_embeddings). google/gemma-2-2b ships "torch_dtype": "float32": vLLM holds ~4.9 GiB
    of bf16 weights, the operator says ~12 GiB. On a T4 a start-up OOM (one large activation of
    the profiling run) with 7.31 GiB allocated -- all weights resident plus activations -- is then
    called weights_load_oom."""
    weights = operator_weights(GEMMA2_2B)
    assert weights is not None and 4.5 < weights < 5.5  # vLLM's ~4.9 GiB: 16 bits, tied embeddings (was ~12)
    log = torch_oom("6.00 GiB", "14.58 GiB", "5.21 GiB", "9.37 GiB", "7.31 GiB", "1.55 GiB")
    diag = classify(Signals(log=log, ready_before=False, weights_gib_per_gpu=weights))
    assert diag.cause != "weights_load_oom", diag.explanation


# meta-llama/Llama-4-Maverick-17B-128E-Instruct text_config (48 layers; the TRT-LLM test copy of
# the config keeps every field but num_hidden_layers): MoE only every second layer.
MAVERICK = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text",
        "head_dim": 128,
        "hidden_size": 5120,
        "interleave_moe_layer_step": 2,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "max_position_embeddings": 1048576,
        "num_attention_heads": 40,
        "num_experts_per_tok": 1,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "num_local_experts": 128,
        "vocab_size": 202048,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}


# ai21labs/Jamba-v0.1 config.json: 16 experts in every second layer (expert_layer_period 2).
JAMBA = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 65536,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    "log",
    [
        cut_oom("3.91 GiB", "139.81 GiB", "1.20 GiB"),
        torch_oom("3.91 GiB", "139.81 GiB", "1.20 GiB", "138.10 GiB", "120.42 GiB", "15.31 GiB"),
    ],
    ids=["cut", "held-120"],
)
def test_llama4_maverick_alternates_moe_and_dense_layers(log):
    """vllm/model_executor/models/llama4.py, Llama4DecoderLayer: `is_moe_layer =
    config.interleave_moe_layer_step > 0 and (self.layer_idx + 1) %
    config.interleave_moe_layer_step == 0`, else a dense LlamaMLP of intermediate_size_mlp. Maverick
    has interleave_moe_layer_step 2: 24 MoE layers, ~400B parameters (~93 GiB bf16 per GPU at
    TP=8). The memory model reads num_local_experts and makes all 48 layers MoE (~778B), ~181 GiB
    per GPU: above a whole H200, so every start-up OOM whose message is cut is 'weights larger than
    the GPU', and one holding 120 GiB (weights resident, profiling) is 'still loading'."""
    weights = operator_weights(MAVERICK, tensor_parallel_size=8)
    assert weights is not None and 85 < weights < 100  # vLLM's ~93 GiB (was ~181)
    diag = classify(Signals(log=log, ready_before=False, weights_gib_per_gpu=weights))
    assert diag.cause != "weights_load_oom", diag.explanation


def test_jamba_puts_experts_in_every_second_layer_only():
    """vllm/model_executor/models/jamba.py: each decoder layer takes `num_experts =
    config.layers_num_experts[layer_idx]` (HF JambaConfig: num_experts only where layer_idx %
    expert_layer_period == expert_layer_offset, else 1, a dense JambaMLP). Jamba-v0.1 is ~52B
    parameters, ~48 GiB bf16 per GPU at TP=2; the memory model counts 16 experts in all 32 layers
    (~92B), ~86 GiB per GPU, more than an 80 GB H100: a cut start-up OOM is called
    weights_load_oom although the weights fit."""
    from vllm_autoheal.model_config import ModelConfigError
    from vllm_autoheal.shape_reader import shape_from_config

    with pytest.raises(ModelConfigError, match="Mamba-2"):  # (since refused: its Mamba-1 state is not sized)
        operator_weights(JAMBA, tensor_parallel_size=2)
    weights = weights_gib_to_diagnose(shape_from_config(JAMBA), EngineArgs(tensor_parallel_size=2))
    assert weights is not None and 40 < weights < 56  # vLLM's ~48 GiB (was ~86), as the model counts it
    log = cut_oom("2.00 GiB", "79.19 GiB", "1.05 GiB")
    diag = classify(Signals(log=log, ready_before=False, weights_gib_per_gpu=weights))
    assert diag.cause != "weights_load_oom", diag.explanation


# RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w4a16 config.json: quant_method
# "compressed-tensors", format "pack-quantized", 4-bit weights (group 128).
LLAMA70B_W4A16 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 128}}},
    },
}


@pytest.mark.parametrize(
    "log",
    [
        cut_oom("1.96 GiB", "44.52 GiB", "1.38 GiB"),
        torch_oom("30.00 GiB", "79.19 GiB", "28.71 GiB", "50.47 GiB", "47.80 GiB", "1.95 GiB"),
    ],
    ids=["cut-l40s", "held-47.8-h100"],
)
def test_compressed_tensors_w4a16_weights_are_4_bit_not_8(log):
    """compressed-tensors is a container, not a width: vllm/model_executor/layers/quantization/
    compressed_tensors/schemes/compressed_tensors_wNa16.py packs `pack_factor = 32 // num_bits`
    weights per int32 (8 per int32 for W4A16: 0.5 byte a weight, plus group scales). The memory
    model prices every "compressed-tensors" checkpoint at QUANT_BYTES 1.0 (the W8A8 width): a
    Llama-3.1-70B w4a16 holds ~37 GiB of weights, the operator says ~68 GiB. On one L40S (the
    48 GB card this checkpoint is made to fit) a cut start-up OOM is 'weights larger than the GPU';
    on an H100 an OOM of the profiling run holding 47.8 GiB (weights resident) is 'still loading'."""
    weights = operator_weights(LLAMA70B_W4A16)
    assert weights is not None and 33 < weights < 42  # vLLM's ~37 GiB (was ~68)
    diag = classify(Signals(log=log, ready_before=False, weights_gib_per_gpu=weights))
    assert diag.cause != "weights_load_oom", diag.explanation
