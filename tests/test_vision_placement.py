"""Where vLLM puts a multimodal model's vision encoder, by the flags: not at all when every modality
the tower serves is limited to 0 (--language-model-only), and whole on every GPU under
--mm-encoder-tp-mode data; pre-flight's weights (and the classifier's loading threshold) follow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal import model_config
from vllm_autoheal.api import EngineArgs
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.shape_reader import shape_from_config

from samples import CONFIGS, QWEN25_VL_VISION

QWEN25_VL = QWEN25_VL_VISION
QWEN35 = json.loads((CONFIGS / "qwen3.5-0.8b.json").read_text())


@pytest.mark.parametrize(
    "extra",
    [
        ["--language-model-only"],
        ["--limit-mm-per-prompt", '{"image": 0, "video": 0}'],
        ['--limit-mm-per-prompt={"image": {"count": 0}, "video": 0}'],
    ],
)
def test_a_text_only_serve_does_not_load_the_vision_encoder(extra):
    """vLLM builds a tower whose modalities are all limited to 0 on the meta device
    (interfaces.py _mark_tower_model -> no_init_weights; 'running in text-only mode'), so none of its
    weights reach the GPU: pre-flight must not count them."""
    shape = shape_from_config(QWEN35)
    with_tower = estimate(shape, EngineArgs(max_model_len=8192), lookup("NVIDIA-H200")).weights_gib
    text_only = estimate(shape, EngineArgs(max_model_len=8192, extra_args=extra), lookup("NVIDIA-H200")).weights_gib
    assert with_tower - text_only == pytest.approx(shape.vision_params * 2 / 2**30, rel=0.01)


def test_one_modality_left_keeps_the_encoder():
    shape = shape_from_config(QWEN35)
    args = EngineArgs(max_model_len=8192, extra_args=["--limit-mm-per-prompt", '{"image": 0}'])  # video: 999
    assert estimate(shape, args, lookup("NVIDIA-H200")).weights_gib == pytest.approx(
        estimate(shape, EngineArgs(max_model_len=8192), lookup("NVIDIA-H200")).weights_gib
    )


def test_mm_encoder_tp_mode_data_replicates_the_encoder_on_every_gpu():
    """--mm-encoder-tp-mode data: 'hosting the full weights on each TP rank' (MultiModalConfig); the
    Qwen-VL encoders honour it (supports_encoder_tp_data). Dividing the encoder by TP 8 leaves 7/8 of
    Qwen2.5-VL's 1.26 GiB uncounted on every GPU."""
    from vllm_autoheal.model_weights import weights_gib_per_gpu

    raw = {**json.loads((CONFIGS / "qwen2.5-7b.json").read_text()), "vision_config": QWEN25_VL}
    shape = shape_from_config(model_config.check(raw))
    sharded = weights_gib_per_gpu(shape, EngineArgs(tensor_parallel_size=4))
    data = weights_gib_per_gpu(shape, EngineArgs(tensor_parallel_size=4, extra_args=["--mm-encoder-tp-mode", "data"]))
    assert data - sharded == pytest.approx(shape.vision_params * 2 * (1 - 1 / 4) / 2**30, rel=0.01)


def test_the_h200_run_was_text_only_so_its_1_43_gib_is_the_language_model():
    """The calibration log (hybrid-qwen3.5-0.8b-kv-8k.log) ran with language_model_only=True and vLLM
    printed 'running in text-only mode': the encoder was on the meta device, so 'Model loading took
    1.43 GiB' is the language model alone: 0.75 B parameters, its 18 Gated DeltaNet mixers weighed as
    such and its attention's q_proj doubled by the output gate (0.64 B when both were read as plain
    attention)."""
    log = (Path(__file__).parent / "fixtures" / "gpu" / "hybrid-logs" / "hybrid-qwen3.5-0.8b-kv-8k.log").read_text()
    assert "'language_model_only': True" in log and "running in text-only mode" in log
    args = EngineArgs(max_model_len=8192, extra_args=["--language-model-only"])
    weights = estimate(shape_from_config(QWEN35), args, lookup("NVIDIA-H200")).weights_gib
    assert abs(weights - 1.43) / 1.43 < 0.01, weights


def test_the_classifier_gets_no_threshold_where_the_encoder_may_or_may_not_be_replicated():
    """vLLM replicates only encoders with data-parallel support and splits the rest: the threshold
    would be the larger count, and an overestimate calls a later step's OOM a loading one."""
    from vllm_autoheal.model_weights import weights_gib_to_diagnose

    raw = {**json.loads((CONFIGS / "qwen2.5-7b.json").read_text()), "vision_config": QWEN25_VL}
    shape = shape_from_config(model_config.check(raw))
    assert weights_gib_to_diagnose(shape, EngineArgs(tensor_parallel_size=2)) is not None
    args = EngineArgs(tensor_parallel_size=2, extra_args=["--mm-encoder-tp-mode=data"])
    assert weights_gib_to_diagnose(shape, args) is None


def test_the_dotted_limit_spelling_is_read():
    from vllm_autoheal.engine_defaults import encoder_placement

    assert encoder_placement(["--limit-mm-per-prompt.image", "0", "--limit-mm-per-prompt.video=0"]) == "off"
    assert encoder_placement(["--limit-mm-per-prompt.image", "0"]) == "weights"
    assert encoder_placement(["--language-model-only", "--mm-encoder-tp-mode", "data"]) == "off"


def test_online_fp8_quantizes_the_encoder_with_the_rest():
    """--quantization fp8 on a bf16 checkpoint: vLLM passes the quant_config to the Qwen2.5-VL tower
    (qwen2_5_vl.py), and online Fp8Config quantizes every linear layer it does not ignore - the
    encoder's 0.68 B parameters take 1 byte each, not 2 (0.63 GiB counted twice over)."""
    from vllm_autoheal.model_weights import weights_gib_per_gpu

    raw = {**json.loads((CONFIGS / "qwen2.5-7b.json").read_text()), "vision_config": QWEN25_VL}
    shape = shape_from_config(model_config.check(raw))
    text = shape_from_config(json.loads((CONFIGS / "qwen2.5-7b.json").read_text()))
    fp8 = EngineArgs(quantization="fp8")
    assert weights_gib_per_gpu(shape, fp8) - weights_gib_per_gpu(text, fp8) == pytest.approx(
        shape.vision_params / 2**30, rel=0.02
    )


def test_qwen3_next_weighs_what_vllm_loaded_at_tp_2():
    """A public vLLM 0.10.2 log (Qwen3-Next-80B-A3B-Instruct, TP 2, two H200s): 'Model loading took
    74.2812 GiB' a GPU. Its 36 Gated DeltaNet mixers and gated attention weighed as such: 74.24 (73.65
    with the mixers read as plain attention)."""
    shape = shape_from_config(json.loads((CONFIGS / "qwen3-next-80b-a3b.json").read_text()))
    weights = estimate(shape, EngineArgs(tensor_parallel_size=2), lookup("NVIDIA-H200")).weights_gib
    assert abs(weights - 74.2812) / 74.2812 < 0.005, weights
