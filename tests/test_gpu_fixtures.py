"""What the NVML probe and PyTorch said on the project's real H200 (tests/gpu/capture_h200.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import GpuSnapshot, Signals, classify
from vllm_autoheal.gpu_probe import compact, snapshot
from vllm_autoheal.remedy import Inventory, plan_heal

GPU = Path(__file__).parent / "fixtures" / "gpu"


def test_probe_saw_the_second_process_holding_60_gib():
    data = json.loads((GPU / "probe-second-process-60g.json").read_text())
    snap = GpuSnapshot.from_dict(data["snapshot"])
    assert snap.gpus[0].name == "NVIDIA H200"
    assert 140 < snap.gpus[0].total_bytes / 2**30 < 141  # NVML's total (torch sees 139.80)
    holder = [p for p in snap.processes if p.pid == data["holder_pid"]]
    assert holder and 60 < holder[0].used_bytes / 2**30 < 61
    assert 59 < snap.other_process_bytes() / 2**30 < 62


def test_real_torch_oom_with_another_process_is_a_shared_gpu():
    log = (GPU / "torch-oom.log").read_text()
    d = classify(Signals(log=log))
    assert d.cause == "gpu_util_exceeds_free" and d.subtype == "other_process_holds_gpu"
    assert d.numbers["tried_gib"] == 20.0 and d.numbers["gpu_total_gib"] == 139.8
    assert d.numbers["own_gib"] == 70.51 and d.numbers["process_gib"] == 60.51
    # In a container torch cannot name the other process; its own arithmetic still shows it:
    # 139.80 total - 8.77 free - 70.51 this process = 60.52 GiB held by someone else.
    alone = log.replace("Process 668 has 60.51 GiB memory in use. ", "")
    assert classify(Signals(log=alone)).cause == "gpu_util_exceeds_free"
    # and when this process holds what is not free, nobody else is blamed
    own = alone.replace("this process has 70.51 GiB", "this process has 131.01 GiB")
    assert classify(Signals(log=own)).cause != "gpu_util_exceeds_free"


def test_real_termination_message_from_the_launcher():
    raw = (GPU / "termination-message.json").read_bytes()
    assert len(raw) <= 4096
    doc = json.loads(raw)
    assert doc["diagnosis"]["cause"] == "gpu_util_exceeds_free"
    assert doc["gpu_start"]["other_processes"][0][2] == 60.51
    # the operator reads it back as the diagnosis, and the planner can act on it
    d = classify(Signals(termination_message=raw.decode()))
    assert d.source == "termination-message" and d.cause == "gpu_util_exceeds_free"
    r = plan_heal(VLLMServiceSpec(model="m"), d, inventory=Inventory(gpu_total_gib=140.4, gpu_free_gib=79.29))
    # (79.29 free - 0.51 context - 0.99 graphs - 0.5 - 1% of 139.8) / 139.8, rounded down
    assert r.action == "LowerGpuMemoryUtilization" and r.changes == {"gpu_memory_utilization": 0.54}


def test_probe_without_a_driver_says_so():
    snap = snapshot()  # this machine has no NVIDIA driver
    if snap.gpus:
        pytest.skip("an NVIDIA driver is present here: this test is for machines without one")
    assert snap.error and ("driver" in snap.error or "NVML" in snap.error)
    assert compact(snap)["error"]


def test_a_72b_model_on_one_h200_is_weights_with_the_gpus_size_and_never_more_without_it():
    """vLLM 0.25 prints the weights (135.43 GiB) and a negative KV budget, but not the GPU's size: the
    launcher's snapshot (what the probe saw before vLLM started) gives it, and the weights then take
    nearly the whole GPU. Without it, the reading is the KV check's (the model might fit a larger GPU)."""
    log = (GPU / "failure-logs" / "weights72.log").read_text()
    probe = GpuSnapshot.from_dict(json.loads((GPU / "probe-second-process-60g.json").read_text())["snapshot"])
    alone = GpuSnapshot(gpus=probe.gpus[:1])  # the same H200, with no other process on it
    with_size = classify(Signals(log=log, gpu=alone, exit_code=1, ready_before=False))
    assert (with_size.cause, with_size.subtype) == ("weights_load_oom", "weights_exceed_gpu")
    assert classify(Signals(log=log)).cause == "kv_cache_insufficient"


def test_the_v2_runners_kernel_warm_up_is_start_up_not_serving():
    """vLLM 0.25's warmup_kernels runs execute_model and sample_tokens on a dummy batch before the
    server is up: an OOM there is the start-up batch's (profiling), even from the log alone."""
    d = classify(Signals(log=(GPU / "failure-logs" / "sampler64k.log").read_text()))
    assert (d.cause, d.phase) == ("profiling_oom", "profile")
