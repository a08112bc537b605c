"""Second review of the spares-experts / one-expert-names / Nemotron-H `mixer` naming (c6165f3..cb92a90).

1. Nemotron-H's ModelOpt exports name their excluded layers by the checkpoint's names, `backbone.layers.N.mixer.*`
   (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4's hf_quant_config.json: the six attention layers, the Mamba layer in
   front of each, every conv1d). vLLM renames them before matching: ModelOptQuantConfigBase.apply_vllm_mapper runs
   hf_to_vllm_mapper.apply_list over exclude_modules, and NemotronHForCausalLM.hf_to_vllm_mapper maps the prefix
   `backbone` to `model` (vllm/model_executor/models/nemotron_h.py). The reader has no such mapping: the list is
   weighed as nothing (an under-count: attention and six Mamba mixers loaded in bf16, weighed at NVFP4's width).
2. The one-expert names (`<prefix>.0.gate_proj`, ...) that compressed-tensors tests are tested for every method, but
   AWQ (awq_marlin.AWQMarlinConfig.get_quant_method: is_layer_skipped(prefix, modules_to_not_convert,
   skip_with_substr=True) on the FusedMoE prefix alone), ModelOpt, fp8 and bitsandbytes test only the FusedMoE prefix.
   AutoAWQ's Mixtral default `modules_to_not_convert: ["gate"]` (the router) now matches
   `block_sparse_moe.experts.0.gate_proj`, so the whole MoE is weighed in bf16: 84.7 GiB where vLLM loads 23.0 (the
   figure at 197c386).
3. The `mixers` flag is Nemotron-H's alone, but vLLM names every MambaMixer2 `mixer` (granitemoehybrid.py:
   MambaMixer2(..., prefix=f"{prefix}.mixer"); mamba_mixer2.py: in_proj prefix f"{prefix}.in_proj"): a Granite-4.0-H
   skip list naming `mixer` leaves the Mamba projections in bf16 in vLLM and is weighed as nothing here.
"""

from __future__ import annotations

import json

import pytest

from skip_lists import ct_int4, weights_gib
from vllm_autoheal.model_config import parse
from vllm_autoheal.quant_width import quantized_bytes

from samples import CONFIGS

GIB = 2**30
NANO = json.loads((CONFIGS / "unseen5" / "nemotron-3-nano-30b-a3b.json").read_text())
GRANITE_TOY = json.loads((CONFIGS / "unseen5" / "granitemoehybrid-toy.json").read_text())


_gib = weights_gib


# --- 1. Nemotron-3-Nano-30B-A3B-NVFP4's own hf_quant_config.json -------------------------------------------------

NANO_ATTENTION = (5, 12, 19, 26, 33, 42)
NANO_MAMBA_BEFORE_ATTENTION = (4, 11, 18, 25, 32, 41)
NANO_CONV = (0, 2, 4, 7, 9, 11, 14, 16, 18, 21, 23, 25, 28, 30, 32, 35, 37, 39, 41, 44, 46, 48, 50)


def _nano_nvfp4_hf_quant(prefix: str = "backbone") -> dict:
    exclude = ["lm_head"]
    for mamba, attention in zip(NANO_MAMBA_BEFORE_ATTENTION, NANO_ATTENTION, strict=True):
        exclude += [f"{prefix}.layers.{mamba}.mixer.{p}" for p in ("in_proj", "out_proj")]
        exclude += [f"{prefix}.layers.{attention}.mixer.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    exclude += [f"{prefix}.layers.{i}.mixer.conv1d" for i in NANO_CONV]
    return {
        "producer": {"name": "modelopt", "version": "0.29.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": "FP8",
            "group_size": 16,
            "exclude_modules": exclude,
        },
    }


def _nano_unquantized_extra_gib() -> float:
    """What the excluded layers add over NVFP4's width: 6 attention layers (q 2688 x 4096, k and v 2688 x 256 each,
    o 4096 x 2688) and 6 Mamba-2 mixers (in_proj 2688 x (2 x 4096 + 2 x 8 x 128 + 64), out_proj 4096 x 2688)."""
    hidden, inner = 2688, 64 * 64
    attention = hidden * (4096 + 2 * 256) + 4096 * hidden
    mamba = hidden * (2 * inner + 2 * 8 * 128 + 64) + inner * hidden
    nvfp4 = quantized_bytes(4, 16, "modelopt_fp4", None, True)
    return 6 * (attention + mamba) * (2 - nvfp4) / GIB


def test_nemotron_nano_nvfp4_real_exclusions_in_checkpoint_names_are_weighed():
    """Was an under-count (17.53 GiB where vLLM loads at least 18.02): the checkpoint's `backbone.` names matched no
    candidate; vLLM maps them to `model.` (hf_to_vllm_mapper). Now a model of mixers is also named under
    `backbone.` (quant_exclusions._BACKBONE)."""
    fields = parse(json.dumps(NANO), quant_raw=json.dumps(_nano_nvfp4_hf_quant()))
    nothing_excluded = parse(
        json.dumps(NANO),
        quant_raw=json.dumps(
            {
                **_nano_nvfp4_hf_quant(),
                "quantization": {**_nano_nvfp4_hf_quant()["quantization"], "exclude_modules": ["lm_head"]},
            }
        ),
    )
    floor = _gib(nothing_excluded) + _nano_unquantized_extra_gib()  # (what vLLM loads, at the least)
    assert _gib(fields) >= floor, (_gib(fields), floor)


def test_the_same_list_in_vllms_names_is_weighed_safely():
    """What withstood: the same list after vLLM's renaming (model.layers.N.mixer.*) is weighed over vLLM's figure
    (attention and all but the routed experts in bf16: 19.53 GiB, vLLM about 18.02)."""
    fields = parse(json.dumps(NANO), quant_raw=json.dumps(_nano_nvfp4_hf_quant("model")))
    nothing = parse(
        json.dumps(NANO),
        quant_raw=json.dumps(
            {
                **_nano_nvfp4_hf_quant(),
                "quantization": {**_nano_nvfp4_hf_quant()["quantization"], "exclude_modules": ["lm_head"]},
            }
        ),
    )
    assert _gib(fields) >= _gib(nothing) + _nano_unquantized_extra_gib()


# --- 2. AWQ's router-only skip list ------------------------------------------------------------------------------


def _awq(config: dict, skip: list[str] | None) -> dict:
    quant = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    return parse(
        json.dumps({**config, "quantization_config": quant | ({"modules_to_not_convert": skip} if skip else {})})
    )


@pytest.mark.parametrize("model", ["mixtral-8x7b.json", "qwen3-30b-a3b.json"])
def test_awq_router_only_skip_list_leaves_the_experts_quantized(model):
    """Was a 3.5x over-count made this session: one expert's names are tested only for compressed-tensors."""
    config = json.loads((CONFIGS / model).read_text())
    # (vLLM: `"gate" in "model.layers.0.block_sparse_moe.experts"` is False: the FusedMoE stays AWQ)
    assert "gate" not in "model.layers.0.block_sparse_moe.experts" and "gate" not in "model.layers.0.mlp.experts"
    assert _gib(_awq(config, ["gate"])) <= 1.05 * _gib(_awq(config, None))


# --- 3. Granite-4.0-H's Mamba-2 mixers ---------------------------------------------------------------------------


_ct_int4 = ct_int4


@pytest.mark.parametrize("entry", [r"re:.*mixer.*", r"re:.*mixer\.(in|out)_proj$"])
def test_granite4_hybrid_ignore_naming_the_mamba_mixers_is_weighed(entry):
    """Was an under-count: Layers.mixers now holds for Granite-4.0-H too (quant_exclusions.MIXER_TYPES)."""
    # the toy's 6 Mamba-2 layers: in_proj 512 x (2 x 1024 + 2 x 128 + 8), out_proj 1024 x 512 (1,708,032 params each),
    # in bf16 in vLLM where the rest is int4 (about 0.53 bytes a weight): over 1.4 bytes more each
    extra = 6 * 1_708_032 * 1.4 / GIB
    assert _gib(_ct_int4(GRANITE_TOY, ["lm_head", entry])) >= _gib(_ct_int4(GRANITE_TOY, ["lm_head"])) + extra
