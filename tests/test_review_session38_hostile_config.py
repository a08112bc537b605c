"""Hostile review (session 38) of the reading of a checkpoint's config.json as untrusted input:
quant_config.py (quantization_config: GPTQ/AWQ keys, compressed-tensors config_groups and ignore, ModelOpt's
quant_algo in flat or nested layout, its exclude_modules/ignore, the cache it names), config_field.py,
model_config.py (parse/check, text_config merging) and model_source.py (from_path, hf_quant_config.json beside a
local config.json), through `check`, `parse`, `from_path` and `vllm-autoheal plan --model-config`.

Ground truth: vLLM 0.25's own source (transformers_utils/model_arch_config_convertor.py
_normalize_quantization_config and get_quantization_config, transformers_utils/config.py, quantization/auto_awq.py,
auto_gptq.py and utils/gptq_utils.py, fp8.py, bitsandbytes.py, modelopt.py, compressed_tensors/compressed_tensors.py
and utils.py, utils/quant_utils.is_layer_skipped). Every defect below is an input vLLM loads and runs with MORE
weight bytes (or a larger cache) than the reader figures: an under-count the operator would promise as free
memory. Llama-3.1-8B (tests/fixtures/configs) is the base: 15.00 GiB in bf16; its MLP (32 x 3 x 4096 x 14,336 =
5.64 B weights) alone is 10.5 GiB in bf16. Width "unknown" (no `bits` in the checked config) is accepted as a
fix wherever the project's convention for exclusions allows it.

The plain tests at the end pin hostile inputs that are handled right (types, sizes, time, special files)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_config import MAX_CONFIG_BYTES, ModelConfigError, check, parse, to_shape
from vllm_autoheal.model_files import from_path
from vllm_autoheal.model_weights import weights_bytes_per_gpu
from vllm_autoheal.vllm_release import parse_version

from samples import CONFIGS

GIB = 2**30
H100 = "NVIDIA-H100-80GB-HBM3"
V025 = parse_version("0.25.0")
ROOT = Path(__file__).resolve().parents[1]
L8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
LAYERS, HIDDEN, MLP = 32, 4096, 14336
GATE_UP = LAYERS * 2 * HIDDEN * MLP  # 3.76 B weights
DOWN = LAYERS * HIDDEN * MLP  # 1.88 B weights
W4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
W8 = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}
GPTQ4 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
AWQ4 = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
NVFP4_FLAT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}


def _fields(quant: dict | None, base: dict = L8) -> dict:
    config = dict(base)
    if quant is not None:
        config["quantization_config"] = quant
    return check(config)


def _gib(fields: dict, quantization: str | None = None) -> float:
    return weights_bytes_per_gpu(to_shape(fields), quantization=quantization, capability=(9, 0)) / GIB


def _not_under(quant: dict, floor_gib: float, base: dict = L8) -> tuple[bool, str]:
    """Right: either the width is left unknown (no `bits`), or the weights weigh at least what vLLM loads."""
    fields = _fields(quant, base)
    checked = fields.get("quantization_config") or {}
    gib = _gib(fields)
    return ("bits" not in checked or gib >= floor_gib), f"{gib:.2f} GiB, checked {checked}"


# --- which quantization_config vLLM reads ------------------------------------------------------------------


def test_a_multimodal_configs_top_level_quantization_config_wins():
    """Severity: High (a 2x under-count of the quantized weights).
    Input: a LLaVA-style config whose top-level quantization_config is GPTQ 8 bits (groups of 128) and whose
    text_config (Llama-3.1-8B) carries another quantization_config, GPTQ 4 bits.
    Now: check() merges text_config over the top level, so the 4-bit one is read: 5.37 GiB of weights.
    Right: 8 bits, 8.65 GiB: vLLM 0.25's ModelArchConfigConvertor.get_quantization_config reads
    hf_config.quantization_config and looks at text_config's only where the top level has none."""
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "quantization_config": {**GPTQ4, "bits": 8},
        "text_config": {**L8, "quantization_config": GPTQ4},
    }
    fields = check(config)
    assert fields["quantization_config"].get("bits") == 8, fields["quantization_config"]
    assert _gib(fields) >= 8.6


@pytest.mark.parametrize("where", ["config.json", "hf_quant_config.json"])
def test_a_modelopt_producer_decides_the_method(where, tmp_path):
    """Severity: High (weights 3.1 GiB under on an 8B: ModelOpt FP8 counted as GPTQ 4 bits).
    Input: a quantization_config (in config.json, or in hf_quant_config.json beside a config.json without one)
    {"quant_method": "gptq", "bits": 4, "group_size": 128, "producer": {"name": "modelopt"},
    "quantization": {"quant_algo": "FP8"}}.
    Now: read as GPTQ 4 bits: 5.37 GiB (from hf_quant_config.json the file's own quant_method also overrides the
    "modelopt" the reader puts first).
    Right: ModelOpt FP8, 8.50 GiB (or the width unknown): vLLM 0.25's _normalize_quantization_config sets
    quant_cfg["quant_method"] = "modelopt" from producer.name and quantization.quant_algo, whatever it was."""
    quant = {**GPTQ4, "producer": {"name": "modelopt", "version": "0.19.0"}, "quantization": {"quant_algo": "FP8"}}
    if where == "config.json":
        fields = _fields(quant)
    else:
        (tmp_path / "config.json").write_text(json.dumps(L8))
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(quant))
        fields = from_path(tmp_path)
    checked = fields.get("quantization_config") or {}
    assert "bits" not in checked or _gib(fields) >= 8.4, (round(_gib(fields), 2), checked)


@pytest.mark.parametrize(
    "extra,right",
    [
        ({"w_bit": 4, "bits": 2}, (4, 128)),
        ({"q_group_size": 32, "group_size": 128}, (4, 32)),
    ],
    ids=["w_bit-4-bits-2", "q_group_size-32-group_size-128"],
)
def test_awq_reads_w_bit_and_q_group_size_first(extra, right):
    """Severity: High (w_bit 4 with a stray bits 2: 3.83 GiB counted where vLLM loads 5.45; groups of 32 read as
    128: the scales a quarter of their size).
    Input: an AWQ quantization_config holding both spellings, e.g. {"quant_method": "awq", "w_bit": 4, "bits": 2,
    "group_size": 128, "zero_point": true}.
    Now: bits 2 (or group 128) read.
    Right: vLLM 0.25's AutoAWQConfig.from_config: get_from_keys(config, ["w_bit", "bits"]) and
    ["q_group_size", "group_size"]: the first key present wins, so 4 bits and groups of 32 (or width unknown)."""
    checked = _fields({**AWQ4, **extra})["quantization_config"]
    assert "bits" not in checked or (checked["bits"], checked.get("group_size")) == right, checked


@pytest.mark.parametrize(
    "quant,flag",
    [
        (AWQ4, None),
        ({**GPTQ4, "bits": 8}, "gptq_marlin"),
    ],
    ids=["AWQ", "GPTQ-8bit-with-gptq_marlin"],
)
def test_the_methods_spelling_does_not_change_the_weights(quant, flag):
    """Severity: Medium/High (GPTQ 8 bits served with --quantization gptq_marlin: 5.37 GiB counted, 8.65 held;
    "AWQ": its fp16 zero points on Hopper counted as packed, 0.08 GiB under on an 8B, 0.7 GiB on a 70B).
    Input: quant_method "AWQ" / "GPTQ" (upper case), otherwise the config as the lower-case spelling.
    Now: the checked config keeps "AWQ"; ModelShape.quantization "AWQ": quantized_bytes' method.startswith("awq")
    and same_method("gptq_marlin", "GPTQ") fail, so the zero points shrink and --quantization gptq_marlin weighs
    QUANT_BYTES' 4-bit default instead of the checkpoint's 8 bits.
    Right: as the lower-case spelling: vLLM 0.25's _normalize_quantization_config lower-cases quant_method
    before any method reads it."""
    upper = {**quant, "quant_method": quant["quant_method"].upper()}
    assert _gib(_fields(upper), flag) == pytest.approx(_gib(_fields(quant), flag), abs=0.01)


# --- keys read for a method vLLM does not read them for ----------------------------------------------------


@pytest.mark.parametrize(
    "quant,floor",
    [
        ({"quant_method": "fp8", "activation_scheme": "dynamic", "bits": 1, "group_size": -1}, 8.4),
        ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": [], "activation_scale_ub": 1200.0, "bits": 1}, 8.4),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False, "bits": 2}, 8.4),
    ],
    ids=["fp8", "fbgemm_fp8", "bitsandbytes-8bit"],
)
def test_a_stray_bits_does_not_shrink_a_fixed_width_method(quant, floor):
    """Severity: Critical (fp8 weights counted at 1 bit: 2.81 GiB where vLLM loads 8.50 GiB on an 8B, 24 GiB
    under on a 70B).
    Input: an fp8 (or fbgemm_fp8, or bitsandbytes load_in_8bit) quantization_config with a stray "bits": 1 (2).
    Now: _weights_format falls through to GPTQ/AWQ's keys for any method and keeps bits 1; model_weights weighs
    the checkpoint at quantized_bytes(1, -1).
    Right: vLLM 0.25's Fp8Config.from_config reads quant_method, activation_scheme, ignored_layers,
    weight_block_size (FBGEMMFp8Config: modules_to_not_convert, activation_scale_ub; BitsAndBytesConfig:
    load_in_8bit/4bit...), never bits: the width is the method's (1 byte a weight), or left unknown."""
    ok, why = _not_under(quant, floor)
    assert ok, why


@pytest.mark.parametrize(
    "groups,floor",
    [
        ({f"group_{i}": {"targets": [f"re:.*layers\\.{i}\\..*"], "weights": W8} for i in range(65)}, 8.5),
        ({}, 14.9),
    ],
    ids=["65-groups-of-8-bits", "no-groups"],
)
def test_compressed_tensors_never_reads_a_top_level_bits(groups, floor):
    """Severity: High (65 groups of 8 bits read as 4 bits: 5.37 GiB counted, 8.6 held; no groups at all: every
    layer unquantized, 15.0 GiB held, 5.37 counted).
    Input: {"quant_method": "compressed-tensors", "bits": 4, "group_size": 128, "config_groups": <65 groups
    of W8, one per layer range | {}>}.
    Now: _weights_args returns None beyond MAX_GROUPS (or for none) and _weights_format reads GPTQ's bits.
    Right: vLLM 0.25's CompressedTensorsConfig builds its schemes from config_groups alone (an empty map:
    UnquantizedLinearMethod for every layer); the width is unknown, never the top-level bits."""
    quant = {"quant_method": "compressed-tensors", "bits": 4, "group_size": 128, "config_groups": groups}
    ok, why = _not_under(quant, floor)
    assert ok, why


# --- the reader's own keys accepted from a raw config -------------------------------------------------------


@pytest.mark.parametrize("kv", ["nvfp4", "fp8_e4m3"])
def test_a_raw_kv_cache_dtype_key_does_not_shrink_the_cache(kv):
    """Severity: Critical (KV cache over-promised 3.6x: 1,887,280 tokens of cache figured where vLLM holds
    530,784).
    Input: Llama-3.1-8B GPTQ 4 bits whose config.json quantization_config also says "kv_cache_dtype": "nvfp4"
    (or "fp8_e4m3"); --kv-cache-dtype auto, H100, vLLM 0.25.
    Now: _auto_kv returns it as the checkpoint's cache (the branch meant for a config this reader checked):
    36,864 bytes a token.
    Right: 131,072 bytes a token (bf16): no vLLM code reads quantization_config["kv_cache_dtype"]
    (torch_utils.get_kv_cache_quant_algo_string reads ModelOpt's kv_cache_scheme/kv_cache_quant_algo only)."""
    shape = to_shape(parse(json.dumps({**L8, "quantization_config": {**GPTQ4, "kv_cache_dtype": kv}})))
    est = estimate(shape, parse_args("").engine, lookup(H100), None, "server", V025)
    assert est.kv_bytes_per_token == 131072


def test_a_raw_weights_type_key_does_not_shrink_the_weights():
    """Severity: Medium (AWQ 4 bits in groups of 128 weighed as a float format: 5.30 GiB where 5.45 are held on
    an 8B; 1.3 GiB under on a 70B).
    Input: an AWQ 4-bit config.json whose quantization_config adds "weights_type": "float".
    Now: the one-byte scale and no zero point of a float format are counted.
    Right: the same 5.45 GiB as without the key: vLLM's AWQ reads no weights_type."""
    plain = _gib(_fields(AWQ4))
    raw = _gib(parse(json.dumps({**L8, "quantization_config": {**AWQ4, "weights_type": "float"}})))
    assert raw == pytest.approx(plain, abs=0.01)


# --- layers left unquantized that the reader does not see --------------------------------------------------


@pytest.mark.parametrize(
    "quant,floor",
    [
        ({**AWQ4, "modules_to_not_convert": ["mlp"]}, 12.4),
        ({**GPTQ4, "dynamic": {"-:.*mlp.*": {}}}, 12.4),
        ({**GPTQ4, "dynamic": {"+:.*down_proj.*": {"bits": 8}}}, 5.37 + DOWN * (1.0234 - 0.5195) / GIB - 0.05),
        (
            {
                **GPTQ4,
                "modules_in_block_to_quantize": [
                    ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
                ],
            },
            12.4,
        ),
    ],
    ids=[
        "awq-modules_to_not_convert-mlp",
        "gptq-dynamic-negative-mlp",
        "gptq-dynamic-down_proj-8-bits",
        "gptq-modules_in_block_to_quantize-attention",
    ],
)
def test_layers_a_method_leaves_unquantized_count(quant, floor):
    """Severity: High (the whole MLP in bf16 counted at 4 bits: about 7 GiB under on an 8B, 60 GiB on a 70B).
    Input: skip lists of the methods themselves: AWQ's modules_to_not_convert ["mlp"] (vLLM 0.25 AutoAWQConfig:
    is_layer_skipped(..., skip_with_substr=True)); GPTQModel's dynamic {"-:.*mlp.*": {}} (negative match:
    UnquantizedLinearMethod, gptq_utils.get_linear_quant_method) or {"+:.*down_proj.*": {"bits": 8}} (override_config:
    those layers at 8 bits); modules_in_block_to_quantize naming only attention (is_layer_gptq_quantized: the
    rest unquantized).
    Now: none of these keys is read: everything at the declared width.
    Right: the layers vLLM leaves in the model dtype (or at 8 bits) weighed so, or the width left unknown as for
    ModelOpt's and compressed-tensors' exclusions."""
    ok, why = _not_under(quant, floor)
    assert ok, why


@pytest.mark.parametrize("key", ["ignored_layers", "modules_to_not_convert"])
def test_fp8_ignored_layers_are_weighed_in_the_model_dtype(key):
    """Severity: High (every down_proj in bf16 counted at fp8: 8.50 GiB where vLLM holds about 10.2 GiB on an 8B;
    about 14 GiB under on a 70B).
    Input: {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["model.layers.0.mlp.down_proj",
    ... one per layer]} (or the same list as modules_to_not_convert, which Fp8Config reads where ignored_layers is
    empty).
    Now: the list is not read; fp8's width has no bits to leave unknown, so every linear layer weighs 1 byte.
    Right: vLLM 0.25's Fp8Config.get_quant_method: is_layer_skipped(prefix, ignored_layers) ->
    UnquantizedLinearMethod, the model dtype: at least 8.50 + 1.88 B x (2 - 1) B = 10.2 GiB."""
    quant = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        key: [f"model.layers.{i}.mlp.down_proj" for i in range(LAYERS)],
    }
    gib = _gib(_fields(quant))
    assert gib >= 8.49 + DOWN * (2 - 1) / GIB - 0.05, f"{gib:.2f} GiB"


@pytest.mark.parametrize(
    "targets,floor",
    [(["re:.*self_attn.*"], 12.4), (["LlamaAttention"], 14.9)],
    ids=["attention-regex-only", "LlamaAttention-group-dropped"],
)
def test_compressed_tensors_layers_no_group_targets_are_unquantized(targets, floor):
    """Severity: High (5.37 GiB counted where vLLM holds about 13 GiB, or all 15.0 GiB).
    Input: {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": <targets>, "weights":
    W4A16 groups of 128}}}.
    Now: every linear layer at 4 bits.
    Right: vLLM 0.25: CompressedTensorsConfig.get_scheme_dict returns None for a layer find_matched_target does
    not match (UnquantizedLinearMethod, the model dtype), and from_config drops a group whose single target ends
    with "Attention" ("Attention quant is coupled with KV-cache quantization"): the MLP (or everything) in bf16,
    or the width unknown."""
    quant = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": targets, "weights": W4}}}
    ok, why = _not_under(quant, floor)
    assert ok, why


@pytest.mark.parametrize(
    "pattern",
    ["re:.*mlp.*|lm_head", "re:.*(self_attn|mlp).*", "re:.*mlp.*|.*gate", "re:(?!.*norm).*"],
)
def test_compressed_tensors_ignore_regexes_are_not_judged_by_their_words(pattern):
    """Severity: High (the MLP in bf16 counted at 4 bits: 5.37 GiB, or 7.2 with attention dense, where vLLM
    holds about 13 GiB).
    Input: compressed-tensors W4A16 (targets ["Linear"]) with ignore ["lm_head", <pattern>].
    Now: _excluded sees "lm_head"/"norm" (UNWEIGHED_PARTS), "attn" (attention only) or a trailing "gate" (the MoE
    router) in the pattern text and calls it harmless.
    Right: vLLM 0.25's compressed_tensors.utils._is_equal_or_regex_match runs re.match(pattern, layer_name): each
    of these matches model.layers.N.mlp.gate_proj/up_proj/down_proj, which then load unquantized; a "re:"
    pattern cannot be judged by the words it contains (width unknown, as for "re:.*mlp.*")."""
    quant = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": W4}},
        "ignore": ["lm_head", pattern],
    }
    ok, why = _not_under(quant, 12.4)
    assert ok, why


@pytest.mark.parametrize("entry", ["mlp.gate", "gate"])
def test_modelopt_exclusions_match_as_substrings(entry):
    """Severity: High (gate_up_proj in bf16 counted at NVFP4: 5.65 GiB where vLLM holds about 10.7 GiB).
    Input: ModelOpt NVFP4 (flat layout) with ignore ["lm_head", "mlp.gate"] (an exporter's name for a MoE
    router) or ["lm_head", "gate"].
    Now: _excluded skips any entry ending in "gate" as the router.
    Right: vLLM 0.25's ModelOptQuantConfigBase.is_layer_excluded also tests `exclude_module in prefix`:
    "mlp.gate" is in "model.layers.N.mlp.gate_up_proj", which then gets UnquantizedLinearMethod."""
    ok, why = _not_under({**NVFP4_FLAT, "ignore": ["lm_head", entry]}, 5.65 + GATE_UP * (2 - 0.5625) / GIB - 0.1)
    assert ok, why


def test_modelopt_flat_layout_reads_ignore():
    """Severity: High (the MLP in bf16 counted at NVFP4: 5.65 GiB where vLLM holds about 13 GiB).
    Input: {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"],
    "ignore": ["lm_head", "model.layers.*.mlp*"]} (no `quantization` object).
    Now: exclude_modules, harmless, is read; ignore is never looked at.
    Right: vLLM 0.25's ModelOptQuantConfigBase.from_config: without "quantization", exclude_modules =
    config.get("ignore", []): the MLPs excluded (width unknown, or weighed in bf16)."""
    quant = {**NVFP4_FLAT, "exclude_modules": ["lm_head"], "ignore": ["lm_head", "model.layers.*.mlp*"]}
    ok, why = _not_under(quant, 12.4)
    assert ok, why


# --- the CLI's local files ---------------------------------------------------------------------------------


def _read_in_thread(path: Path, seconds: float) -> tuple[bool, object]:
    box: list[object] = []

    def run() -> None:
        try:
            box.append(from_path(path))
        except BaseException as exc:  # noqa: BLE001 - what it raised is the answer
            box.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    return worker.is_alive(), (box[0] if box else None)


def test_plan_model_config_naming_a_fifo_does_not_hang(tmp_path):
    """Severity: Medium (the CLI hangs; pre-flight tooling that runs it waits forever).
    Input: `vllm-autoheal plan --model-config PATH` (or --model PATH) where PATH is a FIFO nobody writes
    (cli_commands: to_shape(from_path(args.model_config))).
    Now: _read_raw's open() blocks until a writer comes.
    Right: only a regular file is read (the hf_quant_config.json beside it and a directory's config.json are
    already checked with is_file()); anything else is a ModelConfigError at once."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    try:
        hung, result = _read_in_thread(fifo, 3.0)
    finally:
        try:  # unblock a reader stuck in open(): a writer comes and goes
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert not hung, "from_path still blocked after 3 s"
    assert isinstance(result, ModelConfigError), result


def test_plan_with_a_lone_surrogate_in_a_name_does_not_traceback(tmp_path):
    """Severity: Low/Medium (a traceback and exit 1, which plan documents as 'the flags do not fit').
    Input: config.json with "architectures": ["Llama\\ud800"] (json.dumps writes it; json.loads accepts it),
    `vllm-autoheal plan --model-config config.json --gpu NVIDIA-H100-80GB-HBM3`, stdout UTF-8.
    Now: check() accepts the name; print(render_plan(...)) raises UnicodeEncodeError: surrogates not allowed.
    Right: a name that is not encodable text is refused (exit 2, naming the field) or printed escaped."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**L8, "architectures": ["Llama\ud800"]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "plan", "--model-config", str(path), "--gpu", H100],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert proc.returncode in (0, 2), proc.returncode


# --- hostile inputs that are handled right -----------------------------------------------------------------

HOSTILE_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1,
    4.0,
    4.5,
    1e308,
    10**30,
    "4",
    "",
    "x" * 100,
    [],
    [128, 128],
    [True, 1],
    ["*"],
    [None],
    {},
    {"num_bits": "4"},
    {"num_bits": 4, "type": "float"},
    {"num_bits": 8, "type": "float", "dynamic": False},
    {"g": {"targets": ["Linear"], "weights": [None]}},
    {"g": {"targets": ["Linear"], "weights": {"num_bits": True}}},
    {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 0}}},
]
QUANT_KEYS = [
    "bits",
    "w_bit",
    "group_size",
    "q_group_size",
    "quant_algo",
    "quantization",
    "config_groups",
    "kv_cache_scheme",
    "kv_cache_quant_algo",
    "exclude_modules",
    "ignore",
    "weight_block_size",
    "producer",
]
METHODS = ["gptq", "awq", "modelopt", "MODELOPT", "compressed-tensors", "compressed_tensors", "fp8", "gguf"]


def test_hostile_types_in_a_quantization_config_never_raise_anything_but_model_config_error():
    """Every key the reader looks at, for each method, set to each hostile value (wrong types, bools as ints,
    non-whole and huge numbers, lists for objects, nested garbage): a ModelConfigError or a checked config the
    memory model sizes, never another exception."""
    engine, gpu = parse_args("").engine, lookup(H100)
    for method, key, value in itertools.product(METHODS, QUANT_KEYS, HOSTILE_VALUES):
        for quant in ({"quant_method": method, key: value}, {"quant_method": method, "quantization": {key: value}}):
            try:
                shape = to_shape(_fields(quant))
            except ModelConfigError:
                continue
            weights_bytes_per_gpu(shape, capability=(9, 0))
            estimate(shape, engine, gpu, None, "server", V025)


@pytest.mark.parametrize(
    "quant,field",
    [
        ({**GPTQ4, "bits": True}, "quantization_config.bits"),
        ({**GPTQ4, "bits": 4.5}, "quantization_config.bits"),
        ({**GPTQ4, "bits": 0}, "quantization_config.bits"),
        ({**GPTQ4, "bits": 10**30}, "quantization_config.bits"),
        ({**GPTQ4, "group_size": 0}, "quantization_config.group_size"),
        ({**GPTQ4, "group_size": 1e9}, "quantization_config.group_size"),
        ({"quant_method": ["gptq"]}, "quantization_config"),
        ({"quant_method": "g" * 65}, "quantization_config"),
    ],
)
def test_nonsense_numbers_are_refused_naming_the_field(quant, field):
    with pytest.raises(ModelConfigError, match=field.replace(".", r"\.")):
        _fields(quant)


def test_nan_and_infinity_are_refused_when_parsed():
    for text in ("NaN", "Infinity", "-Infinity"):
        raw = json.dumps(L8)[:-1] + f', "quantization_config": {{"quant_method": "gptq", "bits": {text}}}}}'
        with pytest.raises(ModelConfigError, match="not a number JSON allows"):
            parse(raw)


@pytest.mark.parametrize("pattern", ["re:.*mlp.*", "*", "model.layers.*", "re:.*", "model.layers.0"])
def test_compressed_tensors_broad_ignore_patterns_leave_the_width_unknown(pattern):
    quant = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": W4}},
        "ignore": ["lm_head", pattern],
    }
    checked = _fields(quant)["quantization_config"]
    # (the width unknown, or, since this session's fix, the MLP weighed in the model's dtype: never 4 bits)
    assert "bits" not in checked or checked.get("dense_mlp") == 1.0, checked


def test_pathological_sizes_are_bounded_and_fast():
    """Inputs under the 1 MiB cap that would cost work: each parsed (or refused) in well under a second."""
    names = [f"model.layers.{i}.self_attn.q_proj" + "x" * 200 for i in range(4096)]
    groups = {f"g{i}": {"targets": ["x" * 10000], "weights": W4} for i in range(64)}
    cases = [
        "[" * (MAX_CONFIG_BYTES - 8),
        '{"a":' * 200000,
        json.dumps({**L8, **{f"k{i}": i for i in range(60000)}}),
        json.dumps({**L8, "quantization_config": {"quant_method": "compressed-tensors", "ignore": names}}),
        json.dumps({**L8, "quantization_config": {"quant_method": "compressed-tensors", "ignore": ["a"] * 100000}}),
        json.dumps({**L8, "quantization_config": {"quant_method": "compressed-tensors", "config_groups": groups}}),
        json.dumps({**L8, "quantization_config": {"quant_method": "modelopt", "quant_algo": "N" * 900000}}),
        json.dumps(L8)[:-1] + ', "num_hidden_layers": ' + "9" * 5000 + "}",
        "x" * (MAX_CONFIG_BYTES + 1),
    ]
    for raw in cases:
        start = time.perf_counter()
        try:
            parse(raw)
        except ModelConfigError:
            pass
        assert time.perf_counter() - start < 1.0


def test_special_files_beside_config_json_are_ignored_or_refused_at_once(tmp_path):
    """hf_quant_config.json as a FIFO, a link to /dev/zero, a directory or a JSON list: not read (vLLM would not
    size from them either); config.json linked to /dev/zero: refused by the size cap, never read unbounded."""
    (tmp_path / "config.json").write_text(json.dumps(L8))
    beside = tmp_path / "hf_quant_config.json"
    for make in (
        lambda: os.mkfifo(beside),
        lambda: beside.symlink_to("/dev/zero"),
        lambda: beside.mkdir(),
        lambda: beside.write_text("[1, 2, 3]"),
    ):
        make()
        hung, result = _read_in_thread(tmp_path, 3.0)
        assert not hung and isinstance(result, dict) and "quantization_config" not in result, result
        beside.rmdir() if beside.is_dir() and not beside.is_symlink() else beside.unlink()
    beside.write_text("{not json")
    with pytest.raises(ModelConfigError, match="hf_quant_config.json"):
        from_path(tmp_path)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    hung, result = _read_in_thread(zero, 3.0)
    # (refused as no regular file before a byte is read, since the FIFO finding's fix; the size cap before it)
    assert not hung and isinstance(result, ModelConfigError) and "not a regular file" in str(result), result


def test_quantization_config_in_text_config_alone_is_read():
    """(The multimodal precedence finding's other half, handled right: where the top level has none, vLLM reads
    text_config's, and so does the reader.)"""
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": {**L8}}
    config["text_config"]["quantization_config"] = GPTQ4
    assert check(config)["quantization_config"]["bits"] == 4
