"""Review of c6165f3 (dense_mlp_spares_experts): a skip list that names some of a MoE's MLP but, as the reader
judges it, none of its routed experts now leaves the routed experts at the quantized width.

The rule rests on "vLLM tests one name for all of a layer's routed experts, its FusedMoE prefix". That holds for
ModelOpt (is_layer_excluded(prefix)), AWQ (modules_to_not_convert substrings of the prefix), GPTQ (dynamic
"-:" patterns re.match'ed on the prefix, gptq_utils/get_moe_quant_method) and fp8 (quant_utils.is_layer_skipped),
but not for compressed-tensors: CompressedTensorsMoEMethod.get_moe_method (vllm/model_executor/layers/
quantization/compressed_tensors/compressed_tensors_moe[/compressed_tensors_moe].py) asks get_scheme_dict, and so
should_ignore_layer(ignore), for ONE EXPERT's names:

    unfused_names = [layer_name + proj_name for proj_name in [".0.gate_proj", ".0.up_proj", ".0.down_proj"]]
    ...
    if scheme_dict is None:  # ignored layer
        return UnquantizedFusedMoEMethod(layer.moe_config)

so an `ignore` regex that matches `model.layers.3.mlp.experts.0.gate_proj` (and up, down) but not the prefix
`model.layers.3.mlp.experts` loads every routed expert in bf16. The reader tests only the prefix (and a literal
"expert" in the entry), so such entries are judged to spare the experts: an under-count of the whole model's
bulk. Before c6165f3 the same lists weighed the whole MLP unquantized (safe).

Also: the reader's candidate names cover the mlp/feed_forward/block_sparse_moe families, not Nemotron-H's
`mixer.` naming, so a ModelOpt pattern that excludes Nemotron-H's MoE mixers (FusedMoE prefix
`model.layers.N.mixer.experts`, fnmatch'ed by is_layer_excluded) is weighed as nothing; beside an entry that
names the shared experts it now spares the routed ones.
"""

from __future__ import annotations

import json
import re

import pytest

from skip_lists import KIMI, NEMOTRON_NANO, kimi_with_ignore, quant_of, weights_gib
from vllm_autoheal.model_config import check, parse

_kimi_with_ignore, _quant = kimi_with_ignore, quant_of


def _gib(config: dict, tp: int) -> float:
    return weights_gib(parse(json.dumps(config)), tp)


# The names compressed-tensors' get_moe_method tests for a layer's routed experts (Kimi-K2.5: a multimodal
# model, its language model under language_model.; either spelling matches the same way).
def _vllm_expert_names(layer: int = 3) -> list[str]:
    prefix = f"language_model.model.layers.{layer}.mlp.experts"
    return [prefix + proj for proj in (".0.gate_proj", ".0.up_proj", ".0.down_proj")]


def _ct_ignores(name: str, ignore: list[str]) -> bool:
    """compressed-tensors' check_equal_or_regex_match (utils.py): exact name, or re.match of a 're:' entry."""
    return any(re.match(e[3:], name) if e.startswith("re:") else e == name for e in ignore)


@pytest.mark.parametrize(
    "mlp_entries",
    [
        [r"re:.*mlp.*_proj"],  # every MLP projection, the natural way to write it
        [r"re:.*(gate|up|down)_proj"],
        [r"re:.*gate_proj", r"re:.*up_proj", r"re:.*down_proj"],  # llm-compressor recipes' per-projection form
    ],
)
def test_ct_ignore_matching_one_experts_names_does_not_spare_the_routed_experts(mlp_entries):
    """Was an under-count (71.1 GiB a GPU where vLLM loads 239.0): compressed-tensors tests one expert's names
    (get_moe_method: `<prefix>.0.gate_proj`, ...), which these entries match; the reader tested the prefix alone.
    Now quant_exclusions._ONE_EXPERT names them too."""
    ignore = ["lm_head", r"re:.*self_attn.*", *mlp_entries]
    # (what vLLM does: all three of the expert names it tests are ignored, so the whole FusedMoE is unquantized)
    assert all(_ct_ignores(name, ignore) for name in _vllm_expert_names())
    config = _kimi_with_ignore(ignore)
    assert "dense_mlp_spares_experts" not in _quant(parse(json.dumps(config)))
    assert _gib(config, tp=8) > 3 * _gib(KIMI, tp=8)  # (the routed experts in bf16: 3.4x the checkpoint)


def test_modelopt_exclusion_of_nemotron_h_mixers_is_not_weighed_as_sparing_the_experts():
    """Was an under-count (31.4 GiB where vLLM loads 58.9): Nemotron-H names every block `mixer`, which the
    reader had no names for, so '*mixer*' weighed nothing and '*shared_experts*' spared the experts."""
    bf16 = _gib(NEMOTRON_NANO, tp=1)
    config = {
        **NEMOTRON_NANO,
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "FP8",
            "ignore": ["lm_head", "*shared_experts*", "*mixer*"],
        },
    }
    assert _gib(config, tp=1) >= 0.95 * bf16


def test_kimis_own_ignore_list_matches_none_of_the_expert_names_compressed_tensors_tests():
    """Why Kimi-K2.5's 568 GiB is right, and what the rule must check instead of the prefix: none of its entries
    matches `...mlp.experts.0.{gate,up,down}_proj` (its MLP pattern wants `mlp.` right before the projection)."""
    ignore = KIMI["text_config"]["quantization_config"]["ignore"]
    assert not any(_ct_ignores(name, ignore) for name in _vllm_expert_names())
    assert _quant(parse(json.dumps(KIMI)))["dense_mlp_spares_experts"] is True


def test_a_declared_flag_is_dropped_beside_a_list_that_names_the_experts_or_cannot_be_judged():
    fields = parse(json.dumps(KIMI))
    for ignore in ([r"re:.*mlp\.experts.*"], [r"re:.*layers\.1\..*"]):  # (names them; a layer by number)
        described = json.loads(json.dumps(fields))
        quant = _quant(described)
        quant["ignore"] = ignore
        assert quant["dense_mlp_spares_experts"] is True and quant["dense_mlp"] == 1.0
        assert "dense_mlp_spares_experts" not in _quant(check(described, declared=True)), ignore
