"""An out-of-memory that no frame or milestone places: torch's own figures, and the model's size
that the deployment knows, still tell loading from later steps (diagnosis/unplaced.py)."""

from __future__ import annotations

import math

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.unplaced import plausible_weights

# torch's message as a real WizardLM-2-8x22B start on one A100 80GB printed it (vLLM issue 4408):
# 78.17 GiB allocated, against 262 GiB of bf16 weights.
HELD_78 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity "
    "of 79.15 GiB of which 147.75 MiB is free. Including non-PyTorch memory, this process has 78.98 GiB memory "
    "in use. Of the allocated memory 78.17 GiB is allocated by PyTorch, and 13.03 MiB is reserved by PyTorch "
    "but unallocated.\n"
)
CUT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.15 GiB of which 147.75 MiB is free.\n"  # noqa: E501
# A real capture-time message (vLLM issue 13045, DeepSeek-R1 on 4090s that started only with --enforce-eager).
POOLS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 246.00 MiB. GPU 0 has a total capacity of "
    "23.65 GiB of which 178.06 MiB is free. Including non-PyTorch memory, this process has 23.46 GiB memory in "
    "use. Of the allocated memory 21.10 GiB is allocated by PyTorch, with 82.00 MiB allocated in private pools "
    "(e.g., CUDA Graphs), and 98.34 MiB is reserved by PyTorch but unallocated.\n"
)


def test_a_process_holding_less_than_the_weights_was_still_loading_them():
    diag = classify(Signals(log=HELD_78, ready_before=False, weights_gib_per_gpu=262.0))
    assert (diag.cause, diag.phase, diag.subtype) == ("weights_load_oom", "load", "weights_not_yet_resident")
    assert diag.numbers["weights_gib_per_gpu"] == 262.0 and "78.17 GiB" in diag.explanation
    # The pod's readiness not known: still loading, since loaded weights never leave.
    assert classify(Signals(log=HELD_78, weights_gib_per_gpu=262.0)).cause == "weights_load_oom"


# IPEX's XPU message (ipex-llm issue 12584): a 4-bit 7B model, 3.8 GiB, on a 15.56 GiB Arc A770 under
# WSL2; nothing of it was allocated when 1.02 GiB could not be.
XPU_EMPTY = (
    "RuntimeError: XPU out of memory. Tried to allocate 1.02 GiB (GPU 0; 15.56 GiB total capacity; 0 bytes "
    "already allocated; 0 bytes reserved in total by PyTorch)\n"
)


def test_weights_that_fit_the_gpu_are_not_what_ran_out_while_loading():
    """Weights that fit the whole GPU load whatever the utilization: an OOM before they were resident
    says something else held the memory, and more GPUs or a quantized checkpoint would not help."""
    diag = classify(Signals(log=XPU_EMPTY, ready_before=False, weights_gib_per_gpu=3.76))
    assert diag.cause == "unknown", diag.explanation
    assert diag.numbers["torch_allocated_gib"] == 0.0 and diag.numbers["gpu_total_gib"] == 15.56
    # the same figures with weights larger than the device: they cannot all load
    assert classify(Signals(log=XPU_EMPTY, ready_before=False, weights_gib_per_gpu=30.0)).cause == "weights_load_oom"


@pytest.mark.parametrize(
    "slept",
    [
        "INFO 05-01 12:00:00 [gpu_worker.py:327] Sleep mode freed 60.12 GiB memory, 2.10 GiB memory is still in use.\n",
        'Traceback (most recent call last):\n  File "/x/vllm/v1/worker/gpu_worker.py", line 340, in wake_up\n'
        "    allocator.wake_up(tags)\n",
    ],
)
def test_an_engine_waking_from_sleep_mode_is_not_loading_its_weights(slept):
    """On wake-up vLLM puts the weights back, so the process holds less than them: no first load.
    (RL frameworks sleep and wake vLLM between rollouts; a trainer on the GPU is the usual cause.)"""
    diag = classify(Signals(log=slept + HELD_78, weights_gib_per_gpu=262.0))
    assert diag.cause == "unknown"


@pytest.mark.parametrize("weights", [None, 70.0, 75.0])
def test_weights_resident_or_unknown_leave_the_oom_unplaced(weights):
    """78.17 GiB held: 70 or 75 GiB of weights (that fit on the 79.15 GiB GPU) are within the
    estimate's margin, so the weights may be all loaded and the OOM in a later step; and no model
    size, no guess."""
    assert classify(Signals(log=HELD_78, ready_before=False, weights_gib_per_gpu=weights)).cause == "unknown"


def test_weights_larger_than_the_whole_gpu_never_finish_loading():
    diag = classify(Signals(log=CUT, ready_before=False, weights_gib_per_gpu=131.0))
    assert (diag.cause, diag.subtype) == ("weights_load_oom", "weights_larger_than_gpu")
    # whatever the process held when it failed (here about as much as the weights)
    held = classify(Signals(log=HELD_78, ready_before=False, weights_gib_per_gpu=80.0))
    assert (held.cause, held.subtype) == ("weights_load_oom", "weights_larger_than_gpu")
    assert classify(Signals(log=CUT, ready_before=False, weights_gib_per_gpu=60.0)).cause == "unknown"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -3.0, 0.0, True, "262", 1e30, [262]])
def test_an_implausible_model_size_is_ignored_never_raises(bad):
    assert plausible_weights(bad) is None
    assert classify(Signals(log=HELD_78, ready_before=False, weights_gib_per_gpu=bad)).cause == "unknown"


def test_graph_pools_before_ready_do_not_place_the_oom_in_capture():
    """vLLM V1 warms the sampler up after capture: an OOM there holds graph pools too (a real one,
    vLLM issue 29049, was the sampler's), so pools place nothing; only the pod's readiness does."""
    assert classify(Signals(log=POOLS, ready_before=False)).cause == "unknown"
    assert classify(Signals(log=POOLS)).cause == "unknown"
    assert classify(Signals(log=POOLS, ready_before=True)).cause == "runtime_oom"


def test_a_prompt_quoting_a_smaller_figure_does_not_place_the_engines_oom():
    """Figures come from the engine's own lines: a logged prompt that quotes torch's message with a
    tiny allocation changes nothing, and its text is not evidence."""
    prompt = HELD_78.strip().replace("78.17 GiB is allocated", "1.00 GiB is allocated").replace('"', "'")
    request = (
        "INFO 05-01 10:00:00 [logger.py:41] Received request chatcmpl-9f2c: prompt: "
        f'"{prompt}", params: SamplingParams(n=1), prompt_token_ids: None, lora_request: None.\n'
    )
    real = HELD_78.replace("78.17 GiB is allocated", "75.00 GiB is allocated")
    diag = classify(Signals(log=request + real, ready_before=False, weights_gib_per_gpu=75.0))
    assert diag.cause == "unknown" and not any("chatcmpl" in e for e in diag.evidence)
    flipped = classify(Signals(log=real + request, ready_before=False, weights_gib_per_gpu=75.0))
    assert flipped.cause == "unknown"


@pytest.mark.parametrize(
    "other",
    [
        "Of the allocated memory 1.00 GiB is allocated by PyTorch, with 5.00 GiB allocated in private pools "
        "(e.g., CUDA Graphs), and 1.00 MiB is reserved by PyTorch but unallocated.",
        "GPU 0 has a total capacity of 1.00 GiB of which 0 bytes is free.",
        "Tried to allocate 500.00 GiB.",
    ],
    ids=["held-and-pools", "device", "allocation"],
)
def test_only_torchs_own_message_places_it(other):
    """A line of a multi-line prompt that some app logged raw, or of an earlier run, holds figures
    torch's message lacks (it was cut): they place nothing."""
    oom = "torch.OutOfMemoryError: CUDA out of memory.\n"  # cut before its figures
    log = f"Received prompt: 'x\n{other}'\n{oom}"
    for weights in (60.0, None):
        assert classify(Signals(log=log, ready_before=False, weights_gib_per_gpu=weights)).cause == "unknown"


@pytest.mark.parametrize(
    "log", ["failure-logs/profile.log", "failure-logs/runtime.log", "heal-runs/seqs.log", "heal-runs/capture.log"]
)
def test_real_h200_ooms_after_loading_are_never_called_loading(log):
    """Real vLLM 0.25 OOMs on an H200 (tests/gpu/), all after Llama-3.1-8B's weights were resident
    (profiling, serving, capture): torch's line alone, with the memory model's weights for that
    model, never says "still loading"."""
    import json
    from pathlib import Path

    from vllm_autoheal.api import EngineArgs
    from vllm_autoheal.model_config import parse, to_shape
    from vllm_autoheal.model_weights import weights_gib_to_diagnose

    fixtures = Path(__file__).parent / "fixtures"
    shape = to_shape(parse((fixtures / "configs" / "llama-3.1-8b.json").read_text()))
    weights = weights_gib_to_diagnose(shape, EngineArgs())
    assert weights is not None and 14 < weights < 16  # vLLM said "Model loading took 15.0 GiB"
    text = (fixtures / "gpu" / log).read_text()
    oom = next(line for line in text.splitlines() if "allocated by PyTorch" in line)
    oom = oom[oom.index("torch.OutOfMemoryError") :] + "\n"
    diag = classify(Signals(log=oom, ready_before=False, weights_gib_per_gpu=weights))
    assert diag.subtype not in ("weights_not_yet_resident", "weights_larger_than_gpu"), json.dumps(diag.numbers)


def test_torch_2_1s_capacty_spelling_gives_the_gpus_size():
    """torch 2.0 and 2.1 printed "total capacty"; the GPU's size is read all the same (vLLM issue 2312:
    Mixtral-8x7B AWQ, 23.1 GiB of weights, on a 23.69 GiB RTX 3090)."""
    log = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacty "
        "of 23.69 GiB of which 24.56 MiB is free. Process 106008 has 23.66 GiB memory in use. Of the allocated "
        "memory 23.19 GiB is allocated by PyTorch, and 32.44 MiB is reserved by PyTorch but unallocated.\n"
    )
    diag = classify(Signals(log=log, ready_before=False, weights_gib_per_gpu=23.1))
    assert diag.numbers["gpu_total_gib"] == 23.69
    assert (diag.cause, diag.subtype) == ("weights_load_oom", "weights_larger_than_gpu")
    assert classify(Signals(log=log, ready_before=False, weights_gib_per_gpu=20.0)).cause == "unknown"
