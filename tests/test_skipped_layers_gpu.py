"""Layers a checkpoint leaves unquantized, measured: real vLLM 0.25 starts of Llama-3.1-8B on one H100 80GB
(dummy weights; tests/gpu/quantized_runs.sh, session 38; the configs of tests/gpu/make_models.py), each
predicted before it ran. Where the list skips the whole MLP (GPTQ's modules_in_block_to_quantize naming
attention alone; a ModelOpt NVFP4 glob `model.layers.*.mlp*`) the memory model weighed 13.15 and 13.20 GiB,
vLLM loaded 13.14 and 13.21. Where it skips only down_proj (fp8's ignored_layers naming every layer's; a
compressed-tensors regex `re:.*mlp.down_proj$`) the first prediction weighed the whole MLP in bf16, 13.75 and
13.15 GiB, an over-count by design, where vLLM loaded 10.29 and 7.95; a Llama-named MLP's projections are now
weighed a third each (quant_exclusions.skipped): 10.25 and 7.96. Before this session none of these lists was
read (fp8's, GPTQ's, the regex) and all four were weighed as if fully quantized: 8.50, 5.37, 5.65 and 5.37
GiB, up to 7.8 GiB under."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import parse, to_shape
from vllm_autoheal.vllm_release import parse_version

FIXTURES = Path(__file__).parent / "fixtures"
RUNS = FIXTURES / "gpu" / "skip-runs"
LINE = re.compile(r"^(?P<name>[\w-]+): started: (?P<model>[\w.-]+) (?P<flags>.*)$")
RUN = {m["name"]: m.groupdict() for m in map(LINE.match, (RUNS / "summary.txt").read_text().splitlines()) if m}
BLOCK = [["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"], ["self_attn.o_proj"]]
CT_GROUP = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}
QUANT = {
    "gptq4-attn-only": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "desc_act": False,
        "sym": True,
        "modules_in_block_to_quantize": BLOCK,
    },
    "modelopt-nvfp4-mlp-skipped": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "ignore": ["lm_head", "model.layers.*.mlp*"],
    },
    "fp8-down-skipped": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "ignored_layers": [f"model.layers.{i}.mlp.down_proj" for i in range(32)],
    },
    "w4a16-down-skipped": {
        "quant_method": "compressed-tensors",
        "ignore": ["lm_head", "re:.*mlp.down_proj$"],
        "config_groups": {"group_0": CT_GROUP},
    },
}


def _printed(name: str, pattern: str) -> float:
    return float(re.search(pattern, (RUNS / f"{name}.log").read_text())[1].replace(",", ""))


def _estimate(name: str):
    config = {
        **json.loads((FIXTURES / "configs" / "llama-3.1-8b.json").read_text()),
        "quantization_config": QUANT[name],
    }
    engine = parse_args(RUN[name]["flags"]).engine.model_copy(update={"gpu_memory_utilization": 0.92})
    shape = to_shape(parse(json.dumps(config)))
    return estimate(shape, engine, lookup("NVIDIA-H100-80GB-HBM3"), None, "server", parse_version("0.25.0"))


def test_every_run_is_replayed():
    assert sorted(RUN) == sorted(QUANT) == sorted(p.stem for p in RUNS.glob("*.log"))
    assert "H100 80GB" in (RUNS / "device.txt").read_text()


@pytest.mark.parametrize("name", sorted(QUANT))
def test_skipped_layers_are_weighed_never_under_what_vllm_loads(name):
    loaded = _printed(name, r"Model loading took ([\d.]+) GiB")
    cache = _printed(name, r"Available KV cache memory: ([\d.]+) GiB")
    est = _estimate(name)
    assert est.weights_gib == pytest.approx(loaded, abs=0.07)
    assert est.kv_cache_gib == pytest.approx(cache, rel=0.01)
