"""Model folders for the GPU heal runs (tests/gpu/heal_runs.sh): a real model's config.json and a
tiny byte-level BPE tokenizer padded with placeholder tokens to the model's vocabulary size, so
`vllm serve --load-format dummy` starts with real memory behaviour and can detokenize any id.
Run with a Python that has `tokenizers` and `transformers` (scripts/vllm-cpu-env.sh's):
    python tests/gpu/make_models.py OUT_DIR [NAME...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from tiny_model import save_tokenizer  # noqa: E402  (scripts/ is no package)

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "fixtures" / "configs"
QWEN25_72B = {  # Qwen/Qwen2.5-72B-Instruct's config.json (the fields vLLM reads)
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "max_window_layers": 70,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "attention_dropout": 0.0,
    "use_cache": True,
}


# Sliding-window models (tests/gpu/sliding_windows.sh): every layer windowed, every other, 5 of 6.
WINDOWED = ("mistral-7b-v0.1", "gemma-2-2b", "gemma-3-1b")
# Mamba hybrids (tests/gpu/hybrid_state.sh): Nemotron-H 8B, dense (the payload has no MoE kernels), and
# Qwen3.5-0.8B (Gated DeltaNet, run text-only; Qwen3-Next, MoE in every layer, needs the MoE kernels).
HYBRID = ("nemotron-h-8b", "qwen3.5-0.8b")
# Dense models beside Llama (tests/gpu/h100_runs.sh): weights that fill most of an 80 GiB card.
DENSE = ("llama-3.1-8b", "qwen2.5-32b", "qwen2.5-7b")
# Architectures the memory model was not fitted to (tests/gpu/unseen_runs.sh): two-matrix MLPs 4 x hidden
# wide (GPT-2, GPT-J, GPTBigCode multi-query, GPT-NeoX), StarCoder2's, and Phi-3's fused projections.
UNSEEN = ("gpt2", "gpt-j-6b", "unseen/santacoder-gpt-bigcode", "redpajama-incite-3b", "starcoder2-7b", "phi-4-mini")
# Quantized checkpoints of a width the method's name leaves open (tests/gpu/quantized_runs.sh): Llama-3.1-8B's
# config with the quantization_config AutoAWQ and AutoGPTQ write (vLLM builds the packed layers from it).
AWQ = {"quant_method": "awq", "zero_point": True, "group_size": 128, "version": "gemm"}
# (GPTQModel's modules_in_block_to_quantize: without it vLLM 0.25 reads which layers are quantized from the
# safetensors' dtypes, and dummy weights have none, so it would quantize nothing)
BLOCK = [["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"], ["self_attn.o_proj"]]
BLOCK += [["mlp.up_proj", "mlp.gate_proj"], ["mlp.down_proj"]]
GPTQ = {"quant_method": "gptq", "desc_act": False, "sym": True, "modules_in_block_to_quantize": BLOCK}
# llm-compressor's W4A16 and W8A16 (compressed-tensors, pack-quantized, symmetric groups of 128)
CT_WEIGHTS = {"type": "int", "symmetric": True, "strategy": "group", "group_size": 128, "dynamic": False}
CT_GROUP = {"targets": ["Linear"], "input_activations": None, "output_activations": None}
CT = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"]}
CT |= {"quantization_status": "compressed", "kv_cache_scheme": None}
# Float 4-bit formats (one fp8 or e8m0 scale a group, no zero point): llm-compressor's NVFP4 (W4A4) and
# NVFP4A16 (groups of 16, tensor_group, a global scale a tensor) and MXFP4 (groups of 32), and ModelOpt's
# NVFP4 as its older exports write it (quant_algo, no config_groups); on an H100 vLLM runs them on Marlin.
FP4 = {"num_bits": 4, "type": "float", "symmetric": True, "dynamic": False}
NVFP4_ARGS = {**FP4, "strategy": "tensor_group", "group_size": 16}
NVFP4 = {"weights": NVFP4_ARGS, "input_activations": {**NVFP4_ARGS, "dynamic": "local"}}
MXFP4_ARGS = {**FP4, "strategy": "group", "group_size": 32}
MXFP4 = {"weights": MXFP4_ARGS, "input_activations": {**MXFP4_ARGS, "dynamic": True}}
# (ModelOpt's config.json names the layers it left out `ignore`; its older hf_quant_config.json nests the
# rest under `quantization` and names them `exclude_modules`: a session-37 run that named them so at the top
# level had its lm_head quantized too, 0.7 GiB less)
MODELOPT_NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]}
NESTED = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"], "kv_cache_quant_algo": None}
MODELOPT_NVFP4_NESTED = {"quant_method": "modelopt", "producer": {"name": "modelopt"}, "quantization": NESTED}
QUANTIZED = {
    "llama-3.1-8b-awq4": {**AWQ, "bits": 4},
    "llama-3.1-8b-gptq4": {**GPTQ, "bits": 4, "group_size": 128},
    "llama-3.1-8b-gptq8": {**GPTQ, "bits": 8, "group_size": 128},
    "llama-3.1-8b-gptq4-g32": {**GPTQ, "bits": 4, "group_size": 32},
    "llama-3.1-8b-w4a16": {**CT, "config_groups": {"group_0": {**CT_GROUP, "weights": {**CT_WEIGHTS, "num_bits": 4}}}},
    "llama-3.1-8b-w8a16": {**CT, "config_groups": {"group_0": {**CT_GROUP, "weights": {**CT_WEIGHTS, "num_bits": 8}}}},
    "llama-3.1-8b-nvfp4": {**CT, "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {**CT_GROUP, **NVFP4}}},
    "llama-3.1-8b-nvfp4a16": {
        **CT,
        "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": {**CT_GROUP, "weights": NVFP4["weights"]}},
    },
    "llama-3.1-8b-mxfp4": {**CT, "format": "mxfp4-pack-quantized", "config_groups": {"group_0": {**CT_GROUP, **MXFP4}}},
    "llama-3.1-8b-modelopt-nvfp4": MODELOPT_NVFP4,
    "llama-3.1-8b-modelopt-nvfp4-nested": MODELOPT_NVFP4_NESTED,
    # (session 37's review: ModelOpt MXFP8's e8m0 scale a 32, and a cache ModelOpt names, fp8 under auto)
    "llama-3.1-8b-modelopt-mxfp8": {"quant_method": "modelopt", "quant_algo": "MXFP8", "ignore": ["lm_head"]},
    "llama-3.1-8b-modelopt-nvfp4-kvfp8": {
        **MODELOPT_NVFP4,
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
    },
    # (session 38: layers a checkpoint skips, matched as vLLM matches each method's list: the MLP left in bf16 by
    # GPTQ's modules_in_block_to_quantize naming attention alone and by a ModelOpt glob; only down_proj by fp8's
    # ignored_layers (every layer's name) and by a compressed-tensors regex: weighed as the whole MLP, an over-count)
    "llama-3.1-8b-gptq4-attn-only": {**GPTQ, "bits": 4, "group_size": 128, "modules_in_block_to_quantize": BLOCK[:2]},
    "llama-3.1-8b-modelopt-nvfp4-mlp-skipped": {**MODELOPT_NVFP4, "ignore": ["lm_head", "model.layers.*.mlp*"]},
    "llama-3.1-8b-fp8-down-skipped": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "ignored_layers": [f"model.layers.{i}.mlp.down_proj" for i in range(32)],
    },
    "llama-3.1-8b-w4a16-down-skipped": {
        **CT,
        "ignore": ["lm_head", "re:.*mlp.down_proj$"],
        "config_groups": {"group_0": {**CT_GROUP, "weights": {**CT_WEIGHTS, "num_bits": 4}}},
    },
}


# The quantized fallback's real heals (tests/gpu/heal_runs.sh quantize-nvfp4, quantize-awq): Llama-3.1-70B in bf16
# (141 GB, more than one 80 GB card holds), as llm-compressor's NVFP4 and as AutoAWQ's 4 bits in groups of 128.
FALLBACKS = ("llama-3.1-70b",)
QUANTIZED_70B = {
    "llama-3.1-70b-nvfp4": QUANTIZED["llama-3.1-8b-nvfp4"],
    "llama-3.1-70b-awq4": QUANTIZED["llama-3.1-8b-awq4"],
}


def build(root: Path, only: list[str]) -> None:
    names = WINDOWED + HYBRID + DENSE + UNSEEN + FALLBACKS
    real = {name: json.loads((CONFIGS / f"{name}.json").read_text()) for name in names}
    quantized = {name: {**real["llama-3.1-8b"], "quantization_config": q} for name, q in QUANTIZED.items()}
    quantized |= {name: {**real["llama-3.1-70b"], "quantization_config": q} for name, q in QUANTIZED_70B.items()}
    quantized["llama-3.1-70b-awq4"]["torch_dtype"] = "float16"  # (as AutoAWQ saves its checkpoints)
    for name, config in (*real.items(), *quantized.items(), ("qwen2.5-72b", QWEN25_72B)):
        name = name.removeprefix("unseen/")
        if only and name not in only:
            continue
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        config = {**config, "bos_token_id": 1, "eos_token_id": 2}  # the tiny tokenizer's special ids
        if (config.get("rope_scaling") or {}).get("rope_type") == "gptj":  # transformers 5 writes it; vLLM 0.25 refuses
            config = {k: v for k, v in config.items() if k != "rope_scaling"}  # it (GPT-J's rotary needs no scaling)
        (out / "config.json").write_text(json.dumps(config, indent=1))
        save_tokenizer(out, config.get("vocab_size") or config["text_config"]["vocab_size"])
        print(out)


if __name__ == "__main__":
    build(Path(sys.argv[1]), sys.argv[2:])  # (names after the folder: only those)
