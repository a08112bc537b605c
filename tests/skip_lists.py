"""Shared by the tests of quantization skip lists (quant_exclusions.py): real configs, a list written into them,
and what the memory model then weighs."""

from __future__ import annotations

import json

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.model_config import parse, to_shape
from vllm_autoheal.model_weights import weights_gib_per_gpu

from samples import CONFIGS

KIMI = json.loads((CONFIGS / "unseen4" / "kimi-k2.5.json").read_text())
NEMOTRON_NANO = json.loads((CONFIGS / "unseen5" / "nemotron-3-nano-30b-a3b.json").read_text())


def kimi_with_ignore(ignore: list[str]) -> dict:
    """Kimi-K2.5 with another compressed-tensors ignore list."""
    config = json.loads(json.dumps(KIMI))
    for part in (config, config["text_config"]):  # (it writes the same quantization_config in both)
        part["quantization_config"]["ignore"] = ignore
    return config


def quant_of(fields: dict) -> dict:
    """The checked quantization_config of checked fields (a multimodal model's under text_config)."""
    return fields.get("text_config", fields).get("quantization_config") or fields["quantization_config"]


def ct_int4(config: dict, ignore: list[str]) -> dict:
    """`config` as a compressed-tensors int4 (group 128) checkpoint with this ignore list, checked."""
    quant = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "group_size": 128, "strategy": "group"},
            }
        },
        "ignore": ignore,
    }
    return parse(json.dumps({**config, "quantization_config": quant}))


def weights_gib(fields: dict, tp: int = 1) -> float:
    """The weights on the busiest GPU of checked fields, at this tensor-parallel size."""
    return weights_gib_per_gpu(to_shape(fields), EngineArgs(model="m", tensor_parallel_size=tp))
