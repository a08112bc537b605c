"""The memory model sizes a sliding-window model's KV cache as vLLM does: a windowed layer keeps the
window less one plus a scheduler step's tokens (and a block more), whatever the context; a hybrid
model's layers are counted in vLLM's padded groups. Replayed from real vLLM 0.25 runs on an H200
(tests/gpu/sliding_windows.sh), each stopped at vLLM's own check with a fixed KV cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import GpuSpec
from vllm_autoheal.memory import estimate, kv_need
from vllm_autoheal.model_config import check, to_shape

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "gpu" / "window-logs"
RUN = re.compile(
    r"^(?P<name>[\w-]+): exit 1 in \d+ s: (?P<model>[\w.-]+) kv (?P<mib>\d+) MiB batched (?P<batched>\d+)$"
)
RUNS = [m.groupdict() for m in map(RUN.match, (LOGS / "summary.txt").read_text().splitlines()) if m]


def shape_of(model: str):
    """The shape as the operator has it: the config through model_config's check."""
    return to_shape(check(json.loads((FIXTURES / "configs" / f"{model}.json").read_text())))


def test_every_run_is_replayed():
    assert {r["model"] for r in RUNS} == {"mistral-7b-v0.1", "gemma-2-2b", "gemma-3-1b"} and len(RUNS) == 5


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_vllms_own_kv_check_is_reproduced(run):
    log = (LOGS / f"window-{run['name']}.log").read_text()
    d = classify(Signals(log=log))
    assert d.cause == "kv_cache_insufficient", d
    length = int(re.search(r"max seq len \((\d+)\)", log)[1])
    need = kv_need(shape_of(run["model"]), EngineArgs(max_model_len=length), int(run["batched"]))
    assert need.bytes_for(length) / 2**30 == pytest.approx(d.numbers["needed_gib"], abs=0.005)
    assert need.longest(int(run["mib"]) * 2**20, length) == d.numbers["estimated_max_model_len"]


def test_full_context_counting_would_have_been_far_off():
    """What the runs rule out: counting every layer at full context (the model before) says Gemma 3 1B
    holds a request of about 5,900 tokens in 150 MiB; vLLM says 22,944."""
    shape = shape_of("gemma-3-1b")
    per_token = shape.kv_bytes_per_token()
    assert 150 * 2**20 // per_token < 6000 < 22944


@pytest.mark.parametrize(
    ("config", "layers"),
    [
        ({"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12}, (12, 12)),  # gpt-oss
        ({"sliding_window": 1024, "sliding_window_pattern": 6}, (4, 20)),  # Gemma 3: every 6th layer full
        ({"sliding_window": 4096, "model_type": "gemma2"}, (12, 12)),
        ({"sliding_window": 4096}, (0, 24)),  # Mistral 7B v0.1: every layer
        ({"sliding_window": 4096, "use_sliding_window": False}, (24, 0)),  # Qwen2's window left off
        ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 20}, (20, 4)),
        ({"sliding_window": 0}, (24, 0)),
        ({}, (24, 0)),
    ],
)
def test_which_layers_keep_a_window(config, layers):
    base = {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000}
    assert shape_of_config({**base, **config}).kv_layers() == layers


def shape_of_config(config: dict):
    return to_shape(check(config))


def test_a_hostile_layer_types_list_is_refused_or_bounded():
    from vllm_autoheal.model_config import ModelConfigError

    base = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "sliding_window": 8}
    with pytest.raises(ModelConfigError, match="layer_types"):
        check({**base, "layer_types": ["sliding_attention"] * 5000})
    with pytest.raises(ModelConfigError, match="layer_types"):
        check({**base, "layer_types": "sliding_attention"})
    assert shape_of_config({**base, "layer_types": ["sliding_attention"] * 1000}).kv_layers() == (0, 4)


def test_pre_flight_keeps_a_windowed_models_context():
    """Mistral 7B v0.1 at 32768 on a 22 GiB GPU at utilization 0.75: its 2.5 GiB of cache holds about
    20,000 tokens counted at full context, short of 32768 (pre-flight said it does not fit, and Fix
    would cut the context); a request keeps only its 4096-token window (plus a step's tokens) in
    every layer, so it fits, as vLLM finds."""
    shape = shape_of("mistral-7b-v0.1")
    est = estimate(shape, EngineArgs(max_model_len=32768, gpu_memory_utilization=0.75), GpuSpec("L4", 22.0))
    assert est.kv_tokens < 32768 and est.fits, est.reasons


def test_the_utilization_floor_and_pre_flights_figures_count_the_window():
    """The floor a heal may not go under holds a KV cache of minMaxModelLen, and pre-flight's
    predicted KV error names what one request needs: both as vLLM counts a windowed model's cache
    (Mistral 7B v0.1 at 32768 needs 0.75 GiB at a 2048-token step, not the 4 GiB of full context)."""
    from vllm_autoheal.api import HealBounds
    from vllm_autoheal.preflight import predicted_diagnosis
    from vllm_autoheal.remedy_gate import utilization_floor

    shape = shape_of("mistral-7b-v0.1")
    engine = EngineArgs(max_model_len=32768, max_num_batched_tokens=2048)
    floor = utilization_floor(HealBounds(min_max_model_len=32768), engine, shape, 24.0)
    weights = estimate(shape, engine, GpuSpec("gpu", 24.0)).weights_gib
    assert floor is not None and floor * 24.0 < weights + 2.0  # weights, activations and 0.75 GiB of cache
    small = estimate(shape, engine.model_copy(update={"kv_cache_memory_bytes": 400 * 2**20}), GpuSpec("gpu", 80.0))
    d = predicted_diagnosis(small, engine)
    assert d.cause == "kv_cache_insufficient" and d.numbers["needed_gib"] == 0.75
    assert d.numbers["estimated_max_model_len"] == int(3184 * 0.97)  # vLLM's own: 3184 (window-mistral-400.log)


@pytest.mark.parametrize(
    ("extra_args", "windowed"),
    [
        ([], True),
        (["--disable-hybrid-kv-cache-manager"], False),
        (["--disable_hybrid_kv_cache_manager"], False),
        (["--disable-hybrid-kv-cache-manager", "--no-disable-hybrid-kv-cache-manager"], True),
        (["--kv-transfer-config", '{"kv_connector":"NixlConnector"}'], True),
    ],
)
def test_with_the_hybrid_cache_manager_off_a_hybrid_models_window_is_counted_in_full(extra_args, windowed):
    """vLLM then promotes every windowed layer of a model with both kinds to a full one."""
    need = kv_need(shape_of("gemma-3-1b"), EngineArgs(extra_args=extra_args), 2048)
    assert bool(need.windowed_per_token) == windowed
    assert kv_need(shape_of("mistral-7b-v0.1"), EngineArgs(extra_args=extra_args), 2048).windowed_per_token  # one kind


# --- Hostile review (review-mem): which layers vLLM windows, read as HF's config classes fill it in.


@pytest.mark.parametrize(
    ("config", "layers"),
    [
        # Gemma 3 4B's text_config names no sliding_window_pattern: HF's Gemma3TextConfig fills in
        # layer_types with every 6th layer full (5 of 34), which vLLM's gemma3.py reads
        ({"model_type": "gemma3_text", "num_hidden_layers": 34, "sliding_window": 1024}, (5, 30)),
        ({"model_type": "cohere2", "num_hidden_layers": 40, "sliding_window": 4096}, (10, 30)),  # every 4th
        ({"model_type": "olmo3", "num_hidden_layers": 32, "sliding_window": 4096}, (8, 24)),  # every 4th
        ({"model_type": "gpt_oss", "num_hidden_layers": 24, "sliding_window": 128}, (12, 12)),  # alternate
        # pattern 1: HF makes every layer full ((i + 1) % 1 == 0), so vLLM has no window at all
        (
            {"model_type": "gemma3_text", "num_hidden_layers": 24, "sliding_window": 512, "sliding_window_pattern": 1},
            (24, 0),
        ),
        # Qwen2/Qwen3 drop the window unless use_sliding_window is true (its default is false)
        ({"model_type": "qwen2", "num_hidden_layers": 24, "sliding_window": 4096}, (24, 0)),
        ({"model_type": "qwen3_moe", "num_hidden_layers": 24, "sliding_window": 4096}, (24, 0)),
        # vLLM reads layer_types[i] for layer i: entries past the last layer are nobody's
        (
            {
                "num_hidden_layers": 4,
                "sliding_window": 8,
                "layer_types": ["full_attention"] * 4 + ["sliding_attention"] * 996,
            },
            (4, 0),
        ),
    ],
)
def test_the_layers_hf_fills_in_are_the_ones_vllm_windows(config, layers):
    """What happened: a config that lists no layer_types (nor, for Gemma 3, Cohere2, OLMo 3, gpt-oss,
    the pattern) had every layer counted as windowed, as had a Qwen2 config that leaves
    use_sliding_window out, Gemma 3's pattern 1, and layer_types entries past the last layer. vLLM
    keeps those layers' caches at full context: the model undercounted the need (Gemma 3 27B at
    128k: about an eighth of the need), said "fits" where vLLM stops at its KV check, so pre-flight's
    Fix kept a context that cannot start and a heal's veto let a doomed plan through. What should:
    the layers as HF's config class fills them in and vLLM's model code reads them. Severity: high
    (undercount: a crash the numbers could have avoided)."""
    base = {"hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000}
    assert shape_of_config({**base, **config}).kv_layers() == layers


def test_exaone4s_lettered_window_pattern_is_not_refused():
    """What happened: EXAONE 4.0's config.json spells sliding_window_pattern "LLLG" (and lists
    layer_types); model_config now reads the pattern as a whole number, so the model's config was
    refused (ModelConfigError) and EXAONE 4 lost pre-flight and heal sizing, and the CRD's inline
    schema (integer) refused the file as pasted. What should: a short lettered pattern accepted,
    layer_types deciding. Severity: high (a supported model refused)."""
    from vllm_autoheal.api.config_json import ConfigJson

    cfg = {
        "model_type": "exaone4",
        "num_hidden_layers": 8,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "vocab_size": 32000,
        "sliding_window": 4096,
        "sliding_window_pattern": "LLLG",
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
    }
    assert shape_of_config(cfg).kv_layers() == (2, 6)
    assert ConfigJson.model_validate(cfg).sliding_window_pattern == "LLLG"
    no_types = {k: v for k, v in cfg.items() if k != "layer_types"}
    assert shape_of_config(no_types).kv_layers() == (2, 6)  # "LLLG": every 4th layer full
    from vllm_autoheal.model_config import ModelConfigError

    with pytest.raises(ModelConfigError, match="sliding_window_pattern"):
        check({**cfg, "sliding_window_pattern": "L" * 5000})
    with pytest.raises(ModelConfigError, match="sliding_window_pattern"):
        check({**cfg, "sliding_window_pattern": ["L"]})


def test_the_crds_inline_schema_takes_a_lettered_pattern():
    from vllm_autoheal.crd import crd

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    inline = spec["properties"]["modelConfig"]["properties"]["inline"]["properties"]
    assert inline["sliding_window_pattern"].get("x-kubernetes-int-or-string") is True


def test_vllm_032_holds_two_steps_in_flight_with_async_scheduling():
    """Mistral 7B v0.1 at 32768, step 2048: from vLLM 0.26 a windowed layer is sized for max_in_flight_tokens
    (config/vllm.py: max_concurrent_batches x max_num_batched_tokens, 2 steps with async scheduling, its
    default; PR #47728, read in the 0.26-0.34 wheels), so 0.32 needs (4095 + 4096) tokens a layer; 0.25 (the
    five H200 runs above) one step, (4095 + 2048), as does the estimate without a release."""
    from vllm_autoheal.vllm_release import Release

    shape = shape_of("mistral-7b-v0.1")
    per_token = shape.kv_bytes_per_token()
    engine = EngineArgs(max_model_len=32768)
    two, one = (((4095 + steps * 2048 + 15) // 16 + 1) * 16 for steps in (2, 1))
    assert kv_need(shape, engine, 2048, Release((0, 32, 0))).bytes_for(32768) == per_token * two
    assert kv_need(shape, engine, 2048, Release((0, 25, 0))).bytes_for(32768) == per_token * one
    assert kv_need(shape, engine, 2048).bytes_for(32768) == per_token * one
    off = EngineArgs(max_model_len=32768, extra_args=["--no-async-scheduling"])
    assert kv_need(shape, off, 2048, Release((0, 32, 0))).bytes_for(32768) == per_token * one
