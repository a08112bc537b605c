"""Session 42 review, round 7: the two newest pre-flight commits (b25baee, ff70e7c): lora_slots.lora_problem and
lora_slots_gib, preflight's unweighed drafts and slots (PreflightResult.unweighed, MemoryFit Unknown NotWeighed),
cli plan's refusals, and MIG slices sized by their eighths (gpu_catalog._slice_gib). Each xfail asserts the right
behaviour; the passing tests are attacks that held.

Sources: vLLM vllm/config/lora.py (max_loras = Field(default=1, ge=1), no upper bound; __post_init__: max_cpu_loras
None becomes max_loras, and "max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})" is raised where it is
below), vllm/lora/model_manager.py _create_lora_modules (a multimodal model's tower and connector modules are skipped:
"vLLM currently only supports adding LoRA to language model, ... will be ignored"), vLLM's argparse for
--speculative-config (a JSON value: invalid JSON is an argparse error at start).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.cli import main
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.lora_slots import lora_problem, lora_slots_gib
from vllm_autoheal.preflight import preflight

from samples import config_shape

H100 = "NVIDIA-H100-80GB-HBM3"
IMAGE_033 = "vllm/vllm-openai:v0.33.0"
LLAMA8 = "tests/fixtures/configs/llama-3.1-8b.json"


def _plan(capsys, *flags: str) -> tuple[int, str, str]:
    rc = main(["plan", "--model-config", LLAMA8, "--gpu", H100, *flags])
    out, err = capsys.readouterr()
    return rc, out, err


def _fits_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("fits "))


# --- LoRA flags vLLM accepts or refuses ------------------------------------------------------------------------------


def test_many_lora_slots_are_weighed_not_refused_as_a_count_vllm_refuses(capsys):
    """`--enable-lora --max-loras 5000` is a valid LoRAConfig: vLLM starts loading and runs out of memory allocating
    5000 x 16 x 2,621,440 x 2 B = 390 GiB of slots on Llama-3.1-8B. plan's answer is "does not fit" (exit 1), and
    no message may say vLLM refuses a count of at least 1 it accepts (the operator's MemoryFit reason reads the
    same lora_problem text)."""
    engine = EngineArgs(extra_args=["--enable-lora", "--max-loras", "5000"])
    assert lora_problem(engine) is None
    rc, _out, err = _plan(capsys, "--enable-lora", "--max-loras", "5000")
    assert rc == 1, (rc, err)


def test_plan_refuses_fewer_cpu_loras_than_gpu_slots(capsys):
    """vllm/config/lora.py __post_init__: `elif self.max_cpu_loras < self.max_loras: raise ValueError(...)`. The
    commit refuses the LoRA flags vLLM refuses (rank, slots, dtype) with exit 2; this one it lets through."""
    flags = ["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"]
    assert lora_problem(EngineArgs(extra_args=flags)) is not None
    rc, _out, err = _plan(capsys, *flags)
    assert rc == 2 and "--max-cpu-loras" in err and "Traceback" not in err


def test_lora_switch_spellings_held():
    """Held: `--enable-lora=false`, `--no-enable-lora` and `--enable-lora --enable-lora=0` are no slots;
    `--max-lora-rank=64`, the abbreviation `--max-lora-r 64` (argparse reads it as --max-lora-rank) and
    `--lora-dtype=auto` weigh as the spaced spellings; 064 is 64, as argparse's int() reads it."""
    shape = config_shape("llama-3.1-8b")
    for off in (["--enable-lora=false"], ["--no-enable-lora"], ["--enable-lora", "--enable-lora=0"]):
        assert lora_slots_gib(shape, EngineArgs(extra_args=off)) == 0.0, off
    base = lora_slots_gib(shape, EngineArgs(extra_args=["--enable-lora", "--max-lora-rank", "64"]))
    for spelled in (
        ["--enable-lora", "--max-lora-rank=64"],
        ["--enable-lora", "--max-lora-r", "64"],
        ["--enable-lora", "--max-lora-rank", "064"],
        ["--enable-lora", "--max-lora-rank", "64", "--lora-dtype=auto"],
    ):
        assert math.isclose(lora_slots_gib(shape, EngineArgs(extra_args=spelled)), base), spelled
        assert lora_problem(EngineArgs(extra_args=spelled)) is None


@pytest.mark.parametrize(
    "flags",
    [
        ["--enable-lora", "--lora-dtype", "bf16"],
        ["--enable-lora", "--max-lora-rank"],
        ["--enable-lora", "--max-loras", "1e3"],
    ],
)
def test_odd_lora_values_are_exit_2_without_a_traceback(flags, capsys):
    """Held: a dtype alias vLLM's Literal refuses, a flag without its value, a count in float notation: exit 2."""
    rc, _out, err = _plan(capsys, *flags)
    assert rc == 2 and "Traceback" not in err and err.startswith("vllm-autoheal plan:")


def test_lora_slots_of_a_multimodal_model_are_its_language_models():
    """model_manager._create_lora_modules skips the tower and connector modules (_filter_unsupported_mm_module:
    "vLLM currently only supports adding LoRA to language model"), so the slots are the language model's: a
    Llama-3.1-8B language model with a 0.4 B-parameter vision tower holds the same 1.25 GiB of 4 slots of rank 64."""
    shape = config_shape("llama-3.1-8b")
    engine = EngineArgs(extra_args=["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"])
    text_only = lora_slots_gib(shape, engine)
    with_tower = lora_slots_gib(dataclasses.replace(shape, vision_params=400_000_000), engine)
    assert with_tower is not None and math.isclose(with_tower, text_only)


# --- speculative decoding ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["{not json", '"ngram"', "[1, 2]"])
def test_plan_refuses_a_speculative_config_that_is_no_json_object(value, capsys):
    rc, _out, err = _plan(capsys, "-sc", value)
    assert rc == 2 and ("-sc" in err or "speculative" in err) and "Traceback" not in err


def test_plan_does_not_say_no_where_it_cannot_tell(capsys):
    draft = '{"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5}'
    _rc, out, _err = _plan(capsys, "--max-model-len", "32768", "--speculative-config", draft)
    assert "cannot tell" in _fits_line(out)
    assert not _fits_line(out).split(None, 1)[1].startswith("NO"), _fits_line(out)


@pytest.mark.parametrize(
    "flags",
    [
        ["--speculative-config", '{"method":"ngram"}'],
        ["--speculative-config", '{"method":"ngram","num_speculative_tokens":5}'],
        ["--speculative-config.method", "ngram"],
        ["--speculative_config", '{"method": "suffix"}'],
    ],
)
def test_weightless_speculation_still_fits(flags, capsys):
    """Held: n-gram and suffix speculation load no weights: plan says fits (exit 0), pre-flight unweighed is None."""
    rc, out, _err = _plan(capsys, *flags)
    assert rc == 0 and _fits_line(out).endswith("yes")
    spec = VLLMServiceSpec(model="m", engine={"extraArgs": flags}, preflight="Fix", image=IMAGE_033)
    r = preflight(spec, lookup(H100), config_shape("llama-3.1-8b"))
    assert r.fits and r.unweighed is None


def test_a_draft_in_fix_mode_writes_no_flags():
    """Held: a draft the memory model cannot weigh, in Fix, on a spec that does not fit: no steps, engine as given,
    unweighed set (memory_fit then writes NotWeighed, not FittedByPreflight, and no status.effective)."""
    draft = '{"model": "meta-llama/Llama-3.2-1B-Instruct"}'
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 131072, "gpuMemoryUtilization": 0.3, "extraArgs": ["-sc", draft]},
        preflight="Fix",
        image=IMAGE_033,
    )
    r = preflight(spec, lookup(H100), config_shape("llama-3.1-8b"))
    assert not r.fits and r.unweighed and not r.steps and not r.changed


# --- MIG -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "most"),
    [
        ("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", 19.62),  # (nvidia-smi mig -lgip: 4/8 of an A100 40GB)
        ("NVIDIA-A100-SXM4-40GB-MIG-4g.20gb", 19.62),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 4.75),
        ("NVIDIA-A100-SXM4-40GB-MIG-7g.40gb", 39.39),
        ("NVIDIA-H100-NVL-MIG-1g.12gb", 93.09 / 8),
        ("NVIDIA-H100-NVL-MIG-3g.47gb", 93.09 / 2),
        ("NVIDIA-H100-NVL-MIG-7g.94gb", 93.09),
        ("NVIDIA-H200-NVL-MIG-3g.71gb", 139.80 / 2),
        ("NVIDIA-B200-MIG-3g.90gb", 178.36 / 2),
    ],
)
def test_mig_slices_by_products_whose_names_carry_no_or_another_gb_number_held(name, most):
    """Held: a product without a GB number in its name (H100 NVL, 94 GB) caps at the whole; A100 40GB's 3g and 4g
    profiles (both 20gb) are 4/8; H200 NVL and B200 read their profile unit from _PROFILE_WHOLE."""
    gib = lookup(name).memory_gib
    assert 0 < gib <= most + 1e-9, (name, gib)
