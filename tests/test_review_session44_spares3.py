"""Third review of the skip-list reader (quant_exclusions / quant_config._excluded, 197c386..e79b30f).

1. One expert's names are candidates for compressed-tensors alone (`one_expert=`), but fp8 and ModelOpt also
   test them, the other way round: vllm/model_executor/layers/quantization/utils/quant_utils.py is_layer_skipped
   (vllm-project/vllm@4de0dd6), called for a FusedMoE by Fp8Config.get_quant_method (fp8.py@1436674:
   `elif isinstance(layer, FusedMoE): if is_layer_skipped(prefix=prefix, ignored_layers=...): return
   UnquantizedFusedMoEMethod(layer.moe_config)`) and by ModelOptQuantConfigBase.is_layer_excluded (first line:
   `if is_layer_skipped(prefix, self.exclude_modules, self.packed_modules_mapping): return True`):

       elif "experts" in prefix and not skip_with_substr:
           expert_ignore_layers = filter(lambda layer_name: "experts" in layer_name, ignored_layers)
           return any(prefix in layer_name ... for layer_name in expert_ignore_layers)

   so an entry naming any expert's projection (`model.layers.3.block_sparse_moe.experts.5.w1`) contains the
   FusedMoE prefix (`model.layers.3.block_sparse_moe.experts`) and loads that layer's experts in bf16. The reader
   matches such an entry against nothing (whole names, no one-expert candidates): the experts weighed at fp8.
2. `mixers` by key: Qwen3.5's configs carry `mamba_ssm_dtype` (tests/fixtures/configs/qwen3.5-27b.json), so a model
   with no `mixer` module (vLLM's qwen3_5: self_attn, linear_attn, mlp) is weighed with Nemotron-H's mixer names:
   `re:.*out_proj` (vLLM: the 48 Gated-DeltaNet linear_attn.out_proj in bf16, about +2.1 GiB) now matches
   `mixer.out_proj` and weighs every non-attention weight in bf16 (47.82 GiB where vLLM loads about 18.6; 16.56,
   an under-count, at 197c386).
3. Cost: a mixers model has four prefixes and more names; a 59 KiB compressed-tensors `ignore` of 4,096 plain
   names that contain "model" reads in 0.44 s on this machine (0.22 s at 197c386).
"""

from __future__ import annotations

import json
import time

import pytest

from skip_lists import ct_int4, weights_gib
from vllm_autoheal.model_config import parse

from samples import CONFIGS

GIB = 2**30
MIXTRAL = json.loads((CONFIGS / "mixtral-8x7b.json").read_text())
QWEN3_MOE = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
QWEN35_27B = json.loads((CONFIGS / "qwen3.5-27b.json").read_text())
NANO = json.loads((CONFIGS / "unseen5" / "nemotron-3-nano-30b-a3b.json").read_text())


_gib = weights_gib


def _vllm_fp8_skips_fused_moe(prefix: str, ignored: list[str]) -> bool:
    """quant_utils.is_layer_skipped's experts branch (skip_with_substr False: fp8, ModelOpt)."""
    return "experts" in prefix and any(prefix in name for name in ignored if "experts" in name)


# --- 1. fp8 / ModelOpt: an expert's own names skip its layer's FusedMoE ------------------------------------------

MIXTRAL_EXPERTS = [
    f"model.layers.{i}.block_sparse_moe.experts.{e}.{p}"
    for i in range(32)
    for e in range(8)
    for p in ("w1", "w2", "w3")
]
# every routed expert's weights of Mixtral-8x7B: 32 layers x 8 experts x 3 x 4096 x 14336, one byte more each in bf16
MIXTRAL_EXPERTS_EXTRA_GIB = 32 * 8 * 3 * 4096 * 14336 * (2 - 1) / GIB


def test_fp8_ignored_expert_names_leave_the_experts_in_bf16():
    """Was an under-count (43.78 GiB where vLLM loads about 85): fp8's is_layer_skipped skips a FusedMoE whose prefix
    is inside an ignored entry naming experts; the reader now tests that for every plain entry."""
    assert _vllm_fp8_skips_fused_moe("model.layers.3.block_sparse_moe.experts", MIXTRAL_EXPERTS)
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    plain = parse(json.dumps({**MIXTRAL, "quantization_config": {**fp8, "ignored_layers": ["lm_head"]}}))
    listed = parse(
        json.dumps({**MIXTRAL, "quantization_config": {**fp8, "ignored_layers": ["lm_head"] + MIXTRAL_EXPERTS}})
    )
    assert _gib(listed) >= _gib(plain) + 0.95 * MIXTRAL_EXPERTS_EXTRA_GIB, (_gib(listed), _gib(plain))


def test_modelopt_excluded_one_expert_names_leave_the_experts_in_bf16():
    """Was an under-count (29.05 GiB where vLLM loads about 56): ModelOpt runs the same check first."""
    one = [f"model.layers.{i}.mlp.experts.0.{p}" for i in range(48) for p in ("gate_proj", "up_proj", "down_proj")]
    assert _vllm_fp8_skips_fused_moe("model.layers.7.mlp.experts", one)

    def fields(exclude: list[str]) -> dict:
        quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": exclude}}
        return parse(json.dumps(QWEN3_MOE), quant_raw=json.dumps(quant))

    # 48 layers x 128 experts x 3 x 2048 x 768 weights, a byte more each in bf16
    extra = 48 * 128 * 3 * 2048 * 768 / GIB
    assert _gib(fields(["lm_head"] + one)) >= _gib(fields(["lm_head"])) + 0.95 * extra


# --- 2. Qwen3.5 is no model of mixers ----------------------------------------------------------------------------


def _ct_int4(config: dict, ignore: list[str]) -> dict:
    return ct_int4(QWEN35_27B, ignore)


def _qwen35_out_proj() -> tuple[float, float, float]:
    text = QWEN35_27B.get("text_config", QWEN35_27B)
    linear = sum(1 for t in text["layer_types"] if t == "linear_attention")
    value_dim = text["linear_num_value_heads"] * text["linear_value_head_dim"]
    out_proj = linear * value_dim * text["hidden_size"]  # (48 x 6144 x 5120)
    plain = _gib(_ct_int4(QWEN35_27B, ["lm_head"]))
    floor = plain + out_proj * (2 - 0.6) / GIB  # (bf16 over int4 g128's ~0.53 bytes a weight)
    return floor, plain + out_proj * 2 / GIB, _gib(_ct_int4(QWEN35_27B, ["lm_head", "re:.*out_proj"]))


def test_qwen35_out_proj_entry_is_never_weighed_under_what_vllm_loads():
    """Was an under-count at 197c386 (16.56 GiB: no candidate named Gated DeltaNet's `linear_attn.out_proj`), then,
    with Qwen3.5 taken for a model of mixers by its `mamba_ssm_dtype` key, 'mixer.out_proj' matched. Now the
    `linear_attn` projections are named (Layers.linear) and weighed with the MLP: the safe side."""
    floor, _, got = _qwen35_out_proj()
    assert got >= floor, (got, floor)


@pytest.mark.xfail(
    strict=True,
    reason="the linear_attn projections are weighed as the MLP's share (all that is not attention): 're:.*out_proj' "
    "leaves every layer's MLP and Gated DeltaNet in bf16 (47.8 GiB) where vLLM loads the out_proj alone in bf16 "
    "(about 18.6): a 2.5x over-count, the safe side, kept until a part's own share is weighed",
)
def test_qwen35_out_proj_entry_weighs_the_linear_attention_out_proj_alone():
    floor, ceiling, got = _qwen35_out_proj()
    assert floor <= got <= 1.5 * ceiling, (got, floor, ceiling)


# --- 3. cost ----------------------------------------------------------------------------------------------------


def test_a_small_ignore_list_on_a_mixers_model_is_cheap():
    """Was 0.44 s (0.22 s at 197c386); a plain entry is now one lookup in quant_exclusions._Names."""
    config = {**NANO, "first_k_dense_replace": 1, "hidden_act": "silu", "mlp_hidden_act": "silu"}
    names = ["model.y" + str(i) for i in range(4096)]
    raw = json.dumps({**config, "quantization_config": {"quant_method": "compressed-tensors", "ignore": names}})
    assert len(raw) < 64 * 1024
    best = min(_timed(raw) for _ in range(3))
    assert best < 0.3, best


def _timed(raw: str) -> float:
    start = time.perf_counter()
    parse(raw)
    return time.perf_counter() - start


# --- What withstood ---------------------------------------------------------------------------------------------


def test_fp8_expert_prefix_itself_is_weighed():
    """An ignored FusedMoE prefix (the name fp8 compares exactly) is weighed as the whole MoE."""
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    names = [f"model.layers.{i}.block_sparse_moe.experts" for i in range(32)]
    plain = parse(json.dumps({**MIXTRAL, "quantization_config": {**fp8, "ignored_layers": ["lm_head"]}}))
    listed = parse(json.dumps({**MIXTRAL, "quantization_config": {**fp8, "ignored_layers": names}}))
    assert _gib(listed) >= _gib(plain) + 0.95 * MIXTRAL_EXPERTS_EXTRA_GIB


def test_a_declared_spares_flag_on_a_dense_model_changes_nothing():
    from vllm_autoheal.model_config import check

    llama = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128}
    flagged = check(
        {**llama, "quantization_config": {**awq, "dense_mlp": 1.0, "dense_mlp_spares_experts": True}},
        "inline",
        declared=True,
    )
    plain = check({**llama, "quantization_config": {**awq, "dense_mlp": 1.0}}, "inline", declared=True)
    assert _gib(flagged) == _gib(plain)
