"""A Mamba or linear-attention hybrid (Qwen3.5/3.6, Nemotron-H, Granite 4, Kimi's KDA) keeps one state
block per running sequence in the KV cache's pool. vLLM (since PR #38270, 2026) refuses to capture CUDA
graphs for more sequences than the pool has blocks, and names both counts: "max_num_seqs (N) exceeds
available Mamba cache blocks (M)". The heal is max_num_seqs := M, as vLLM asks: a shorter context or
an fp8 cache adds no block, so a KV plan that cut the context would cost a restart for nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate, kv_need
from vllm_autoheal.remedy import GIVE_UP, Inventory, plan_heal

from crafted.bases import ENGINE_CORE, MARKER, real_log
from crafted.checks import client_text_absent, diagnose
from crafted.request_logging import FORMATS, inject
from samples import config_shape

MESSAGE = (
    "max_num_seqs (1024) exceeds available Mamba cache blocks (856). Each decode sequence requires one Mamba "
    "cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at most 856 or increase "
    "gpu_memory_utilization."
)
FORMS = {
    "raised": f"ValueError: {MESSAGE}",
    "a worker's error, re-raised by the engine": f"{ENGINE_CORE}RuntimeError: Worker failed with error '{MESSAGE}'",
    "logged by the engine core": f"{ENGINE_CORE}ERROR 12-01 04:48:08 [core.py:1231] ValueError: {MESSAGE}",
}


@pytest.mark.parametrize("form", FORMS)
def test_the_engines_refusal_is_a_cache_pool_short_of_state_blocks(form):
    d = diagnose(FORMS[form])
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "state_blocks_below_max_num_seqs")
    assert d.numbers["max_num_seqs"] == 1024 and d.numbers["mamba_blocks"] == 856


def test_the_heal_is_the_sequences_vllm_has_blocks_for_and_keeps_the_context():
    d = diagnose(FORMS["raised"])
    spec = VLLMServiceSpec(model="m", engine={"maxModelLen": 262144})
    remedy = plan_heal(spec, d, inventory=Inventory(shape=config_shape("llama-3.1-8b"), gpu_total_gib=79.2))
    assert remedy.action == "LowerMaxNumSeqs" and remedy.changes == {"max_num_seqs": 856}, remedy


def test_the_sequences_already_set_are_what_is_lowered():
    d = diagnose(FORMS["raised"].replace("(1024)", "(300)").replace("(856)", "(243)"))
    remedy = plan_heal(VLLMServiceSpec(model="m", engine={"maxNumSeqs": 300}), d)
    assert remedy.changes == {"max_num_seqs": 243}, remedy


def test_below_the_fewest_sequences_allowed_the_cache_grows_instead():
    """vLLM's other way out: more memory for the cache pool, hence more blocks; never a shorter
    context, which frees no block."""
    d = diagnose(FORMS["raised"].replace("(856)", "(4)"))
    spec = VLLMServiceSpec(model="m", engine={"gpuMemoryUtilization": 0.8, "maxModelLen": 32768})
    remedy = plan_heal(spec, d, inventory=Inventory(gpu_total_gib=79.2, gpu_free_gib=79.0))
    assert remedy.action == "RaiseGpuMemoryUtilization" and "max_model_len" not in remedy.changes, remedy
    no_room = plan_heal(
        spec.model_copy(update={"heal": spec.heal.model_copy(update={"allowed_actions": ["LowerMaxModelLen"]})}), d
    )
    assert no_room.action == GIVE_UP, no_room


@pytest.mark.parametrize("fmt", FORMATS[:3])
def test_a_prompt_quoting_the_refusal_decides_nothing(fmt):
    base = real_log("neg-2734-llama2-70b-tp8-timeout")
    crafted = inject(base, f"{MESSAGE} {MARKER}", fmt, "end")
    d, real = diagnose(crafted), diagnose(base)
    assert (d.cause, d.subtype) == (real.cause, real.subtype)
    assert client_text_absent(d)


def _refusal(seqs: int, blocks: int):
    return diagnose(FORMS["raised"].replace("(1024)", f"({seqs})").replace("(856)", f"({blocks})"))


def test_unset_sequences_are_vllms_default_and_a_printed_count_above_it_raises_nothing():
    """Left unset, max_num_seqs is vLLM's default, at most 1024 in any vLLM so far. A refusal naming
    more sequences than that (forged in the termination message, or another vLLM's) must not 'lower'
    max_num_seqs to 50,000 blocks: that sets 49x the sequences that ran. Within it, the printed count
    is what ran (defaults differ by version and GPU): 256 sequences on a 48 GB GPU, 1024 on an H100."""
    remedy = plan_heal(VLLMServiceSpec(model="m"), _refusal(60000, 50000), inventory=Inventory(gpu_total_gib=79.2))
    assert "max_num_seqs" not in remedy.changes, remedy
    for gpu, seqs, blocks in ((44.4, 256, 243), (79.2, 1024, 969)):
        remedy = plan_heal(VLLMServiceSpec(model="m"), _refusal(seqs, blocks), inventory=Inventory(gpu_total_gib=gpu))
        assert remedy.changes == {"max_num_seqs": blocks}, remedy


def test_on_a_gpu_whose_default_is_256_a_printed_1000_sequences_is_no_default():
    """vLLM's default is 256 sequences below 70 GiB of GPU. A forged refusal naming 1,000 sequences
    and 900 blocks on a 24 GiB GPU would set max_num_seqs 900, 3.5x what ran: nothing is lowered."""
    for seqs, blocks in ((1000, 900), (257, 200)):
        remedy = plan_heal(VLLMServiceSpec(model="m"), _refusal(seqs, blocks), inventory=Inventory(gpu_total_gib=23.6))
        assert "max_num_seqs" not in remedy.changes, remedy
    remedy = plan_heal(VLLMServiceSpec(model="m"), _refusal(256, 200), inventory=Inventory(gpu_total_gib=23.6))
    assert remedy.changes == {"max_num_seqs": 200}, remedy


@pytest.mark.parametrize(
    "seqs, blocks, engine",
    [
        (1024, 1024, {}),  # as many blocks as sequences: vLLM prints this only when short
        (1024, 2**31, {}),  # a block count past what vLLM prints: dropped, nothing left to size by
        (1024, 856, {"maxNumSeqs": 300}),  # not this run's refusal: 300 sequences have their 856 blocks
    ],
)
def test_figures_that_describe_no_shortage_of_this_run_change_no_memory(seqs, blocks, engine):
    """'A wrong memory change is worse than none': where the refusal's own figures show no shortage
    for what ran, the cache must not be grown blind to the bound (0.9 -> 0.95 here)."""
    spec = VLLMServiceSpec(model="m", engine=engine)
    remedy = plan_heal(spec, _refusal(seqs, blocks), inventory=Inventory(gpu_total_gib=79.2))
    assert remedy.action == GIVE_UP, remedy


# Real vLLM 0.25 runs on one H200 (tests/gpu/hybrid_state.sh): Nemotron-H 8B's shapes with dummy weights,
# a fixed cache of 1 GiB (blocks-1024) and of 100 MiB (kv-8k).
HYBRID_LOGS = Path(__file__).parent / "fixtures" / "gpu" / "hybrid-logs"
NEMOTRON_H = json.loads((Path(__file__).parent / "fixtures" / "configs" / "nemotron-h-8b.json").read_text())


def test_a_real_refusal_on_an_h200_is_healed_to_the_blocks_vllm_has():
    log = (HYBRID_LOGS / "hybrid-blocks-1024.log").read_text()
    d = diagnose(log)
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "state_blocks_below_max_num_seqs")
    assert d.numbers["mamba_blocks"] == 63
    spec = VLLMServiceSpec(model="m", engine={"maxNumSeqs": 1024, "maxModelLen": 8192, "kvCacheMemoryBytes": 2**30})
    remedy = plan_heal(spec, d, inventory=Inventory(shape=config_shape("nemotron-h-8b"), gpu_total_gib=139.8))
    assert remedy.changes == {"max_num_seqs": 63}, remedy


def test_nemotron_h_keeps_k_and_v_per_token_in_its_four_attending_layers_only():
    """vLLM 0.25 sized one 8,192-token request at 0.22 GiB: 8 blocks of 1,040 tokens in each of the 4
    attending layers (K and V of 8 heads of 128, bf16: 4 KiB a token and layer, 0.127 GiB), and one
    state page (the attention block's 4.06 MiB) in each of the 24 Mamba-2 layers (0.095 GiB). Counted
    as 52 attending layers the first part alone was 1.63 GiB."""
    shape = config_shape("nemotron-h-8b")
    assert shape.kv_layers() == (4, 0) and shape.kv_bytes_per_token() == 4 * 4096
    log = (HYBRID_LOGS / "hybrid-kv-8k.log").read_text()
    assert "(0.22 GiB KV cache is needed" in log
    need = kv_need(shape, EngineArgs(max_model_len=8192), 8192)
    attending = need.full_per_token * 8 * 1040 / 2**30  # 8 blocks of 1,040 tokens
    assert 0.126 <= attending <= 0.128


def test_one_requests_need_counts_the_state_pages_as_vllm_does():
    """The rest of vLLM's 0.22 GiB: the attention block widened until its page holds a state page
    (1,040 tokens: 4 KiB a token and layer; the Mamba-2 state 4.06 MiB, its temporal part in float32 as
    vLLM keeps it for Nemotron-H), and that page once for each of the 24 Mamba layers. Left out, one
    request's need was 0.125 GiB: pre-flight would have fitted a context vLLM refuses."""
    need = kv_need(config_shape("nemotron-h-8b"), EngineArgs(max_model_len=8192), 8192)
    assert need.block == 1040 and need.state_bytes == 24 * 1040 * 4096
    assert (
        f"({need.bytes_for(8192) / 2**30:.2f} GiB KV cache is needed" in (HYBRID_LOGS / "hybrid-kv-8k.log").read_text()
    )
    assert need.longest(100 * 2**20, 8192) == 0  # (vLLM printed no estimate of the longest that fits)


def test_nemotron_h_weighs_one_block_a_layer():
    """Nemotron-H builds one block a layer, as its pattern names it (4 attention, 24 Mamba-2, 24 MLP of
    up and down only): vLLM 0.25 loaded 15.11 GiB. Counted as attention and a gated MLP in each of the 52
    layers, it was 31.7 GiB, twice that: pre-flight and the TP heal would have sized on it."""
    log = (HYBRID_LOGS / "hybrid-kv-8k.log").read_text()
    assert "Model loading took 15.11 GiB" in log
    shape = config_shape("nemotron-h-8b")
    weights = estimate(shape, EngineArgs(max_model_len=8192), lookup("NVIDIA-H200")).weights_gib
    assert abs(weights - 15.11) / 15.11 < 0.01, weights


def test_the_crds_inline_config_reads_nemotron_h_as_its_file_does():
    from vllm_autoheal.api.config_json import ConfigJson
    from vllm_autoheal.model_config import check, to_shape

    config = NEMOTRON_H
    inline = ConfigJson.model_validate(config).model_dump(exclude_none=True)
    assert to_shape(check(inline)) == to_shape(check(config)) == config_shape("nemotron-h-8b")


def test_only_mamba_layers_keep_a_state_page():
    """A layer list that also names MLP and MoE layers (Nemotron 3.5's layers_block_type): only its
    Mamba layers keep a state page; counting the others would make one request look larger than it is."""
    from vllm_autoheal.model_config import check, to_shape

    words = ["mamba", "mlp", "mamba", "attention", "moe", "mamba", "mlp", "attention"]
    base = {k: v for k, v in NEMOTRON_H.items() if k != "hybrid_override_pattern"}
    listed = to_shape(check({**base, "num_hidden_layers": 8, "layers_block_type": words}))
    lettered = to_shape(check({**NEMOTRON_H, "num_hidden_layers": 8, "hybrid_override_pattern": "M-M*EM-*"}))
    assert listed.mamba_layers == lettered.mamba_layers == 3
    assert listed.state_layers == lettered.state_layers == 6


def test_pre_flight_foresees_the_refusal_with_vllms_own_block_count():
    """The H200 run above, before it starts: a 1 GiB cache for Nemotron-H 8B is 63 pool blocks of 4
    layers' 4.06 MiB pages (vLLM printed 63), short of 1,024 sequences. Fix starts it at what the
    blocks hold (less the model's 3 % margin), so the refusal and its restart never happen; Warn
    says why; the same cache with enforce_eager (no full CUDA graphs, no check) fits."""
    from vllm_autoheal.preflight import preflight

    shape, h200 = config_shape("nemotron-h-8b"), lookup("NVIDIA-H200")
    engine = {"maxNumSeqs": 1024, "maxModelLen": 8192, "kvCacheMemoryBytes": 2**30}
    est = estimate(shape, EngineArgs(max_model_len=8192, max_num_seqs=1024, kv_cache_memory_bytes=2**30), h200)
    log = (HYBRID_LOGS / "hybrid-blocks-1024.log").read_text()
    assert f"exceeds available Mamba cache blocks ({est.state_blocks})" in log
    assert est.failure == "kv_cache_insufficient" and est.state_blocks == 63

    fixed = preflight(VLLMServiceSpec(model="m", engine=engine, preflight="Fix"), h200, shape)
    assert fixed.fits and fixed.engine.max_num_seqs == 61, fixed.reasons
    assert [s.action for s in fixed.steps] == ["LowerMaxNumSeqs"]
    assert fixed.engine.max_model_len == 8192  # no context lost
    warned = preflight(VLLMServiceSpec(model="m", engine=engine, preflight="Warn"), h200, shape)
    assert not warned.fits and "63 Mamba state blocks" in warned.reasons[0]
    eager = preflight(
        VLLMServiceSpec(model="m", engine={**engine, "enforceEager": True}, preflight="Warn"), h200, shape
    )
    assert eager.fits, eager.reasons


def test_pre_flight_checks_state_blocks_only_where_the_model_keeps_state_pages():
    """A plain transformer has no Mamba state: any max_num_seqs passes this check, as in vLLM."""
    est = estimate(
        config_shape("llama-3.1-8b"), EngineArgs(max_model_len=8192, max_num_seqs=100_000), lookup("NVIDIA-H200")
    )
    assert est.state_blocks is None and est.fits, est.reasons


def test_pre_flights_margin_does_not_push_the_sequences_below_the_heals_bound():
    """63 blocks counted, a bound of 62 sequences: the 3 % margin alone would say 61, below the bound, and
    Fix would give up (a fixed cache cannot grow) where 62 sequences have their blocks."""
    from vllm_autoheal.preflight import preflight

    engine = {"maxNumSeqs": 1024, "maxModelLen": 8192, "kvCacheMemoryBytes": 2**30}
    spec = VLLMServiceSpec(model="m", engine=engine, preflight="Fix", heal={"bounds": {"minMaxNumSeqs": 62}})
    fixed = preflight(spec, lookup("NVIDIA-H200"), config_shape("nemotron-h-8b"))
    assert fixed.fits and fixed.engine.max_num_seqs == 62, fixed.reasons


def test_on_an_a100_vllms_default_is_256_and_a_printed_1000_is_no_default():
    """vLLM gives an A100 of 80 GB the small GPUs' 256 sequences: a refusal naming 1,000 there is no run's
    default (max_num_seqs unset), and lowering to its 900 blocks would set 3.5x what ran."""
    a100 = Inventory(gpu_total_gib=79.15, gpu_name="NVIDIA-A100-SXM4-80GB")
    remedy = plan_heal(VLLMServiceSpec(model="m"), _refusal(1000, 900), inventory=a100)
    assert "max_num_seqs" not in remedy.changes, remedy
    remedy = plan_heal(VLLMServiceSpec(model="m"), _refusal(256, 200), inventory=a100)
    assert remedy.changes == {"max_num_seqs": 200}, remedy
