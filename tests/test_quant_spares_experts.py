"""A skip list that leaves all but a MoE's routed experts unquantized (Kimi-K2.5's compressed-tensors `ignore`:
attention, the shared experts, the first dense layer's MLP): vLLM tests one name for all of a layer's routed
experts (its FusedMoE prefix, `...mlp.experts`), which none of the entries matches, so they load at the
checkpoint's width. The MLP's unquantized share is then of the rest (dense_mlp_spares_experts); before, it was
of the whole MLP, the routed experts included: Kimi-K2.5 weighed 1,903.7 GiB where vLLM loads 554.27."""

from __future__ import annotations

import json

import pytest

from skip_lists import KIMI, kimi_with_ignore, quant_of, weights_gib
from vllm_autoheal.model_config import check, parse, to_shape

from samples import CONFIGS


def _with_ignore(ignore: list[str]) -> dict:
    return kimi_with_ignore(ignore)


def _quant(config: dict) -> dict:
    return quant_of(parse(json.dumps(config)))


def _gib(config: dict, tp: int = 8) -> float:
    return weights_gib(parse(json.dumps(config)), tp)


def test_kimis_ignore_list_spares_the_routed_experts():
    quant = _quant(KIMI)
    assert quant["dense_mlp"] == 1.0 and quant["dense_mlp_spares_experts"] is True and quant["dense_attention"]
    # (8 GPUs: about a ninth of the checkpoint's 554.27 GiB each, where the whole MLP in bf16 was 3.4x that)
    assert 554.27 / 8 <= _gib(KIMI) <= 1.05 * 554.27 / 8 + 1


@pytest.mark.parametrize(
    "naming",
    [
        r"re:.*mlp\.experts.*",  # the routed experts by their FusedMoE prefix
        "re:.*experts.*",  # shared and routed alike
        "re:.*mlp.*",  # every MLP name
        "*mlp.experts.*",  # one expert's names, which vLLM does not test (its FusedMoE prefix has no dot after)
    ],
)
def test_a_list_that_names_the_routed_experts_leaves_them_whole_in_the_share(naming):
    quant = _quant(_with_ignore(["lm_head", "re:.*self_attn.*", naming]))
    assert "dense_mlp_spares_experts" not in quant, quant
    if "*" in naming[:1]:
        return
    assert _gib(_with_ignore(["lm_head", "re:.*self_attn.*", naming])) > 3 * _gib(KIMI)  # (an over-count, safe)


def test_the_flag_survives_a_check_of_what_this_reader_wrote_and_is_not_taken_on_a_declared_share_alone():
    fields = parse(json.dumps(KIMI))
    again = check(fields, declared=True)
    text, text_again = fields.get("text_config", fields), again.get("text_config", again)
    assert text_again["quantization_config"] == text["quantization_config"]
    # a declared share without the flag stays a share of the whole MLP (a person's description, taken as written)
    described = json.loads(json.dumps(fields))
    q = described.get("text_config", described)["quantization_config"]
    del q["dense_mlp_spares_experts"]
    q.pop("ignore", None)
    declared = check(described, declared=True)
    assert "dense_mlp_spares_experts" not in declared.get("text_config", declared)["quantization_config"]


def test_a_dense_models_skip_list_never_spares_experts():
    llama = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    llama["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128}}},
        "ignore": ["lm_head", r"re:.*mlp\.down_proj"],
    }
    quant = parse(json.dumps(llama))["quantization_config"]
    assert 0 < quant["dense_mlp"] < 1 and "dense_mlp_spares_experts" not in quant


def test_the_routed_experts_left_quantized_are_judged_for_their_groups():
    """Where the rest of the MLP is unquantized its groups are not judged, but the routed experts' still are:
    compressed-tensors refuses an expert slice that is no whole number of groups."""
    shape = to_shape(parse(json.dumps(KIMI)))
    assert shape.dense_mlp_spares_experts and shape.quant_group == 32 and shape.moe_intermediate == 2048
    assert shape._groups_split(8)  # 256 a rank: 8 groups
    assert not shape._groups_split(128)  # 16 a rank: half a group
