"""The GPU probe against a fake NVML: a GPU that errors mid-listing, processes of other
containers (no /proc entry, no memory figure), and NVML missing: a snapshot, never an exception."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_autoheal import gpu_probe
from vllm_autoheal.diagnosis import GpuInfo, GpuSnapshot
from vllm_autoheal.diagnosis.units import GIB
from vllm_autoheal.gpu_probe import visible_count


class FakeNvml:
    def __init__(self, gpus: int, lost: set[int] = frozenset()) -> None:
        self.gpus, self.lost, self.shut = gpus, lost, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index):
        if index in self.lost:
            raise RuntimeError("GPU is lost")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=80 * GIB, free=70 * GIB, used=10 * GIB)

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # another container's: no memory figure
        return [SimpleNamespace(pid=4_000_000 + handle, usedGpuMemory=None)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        raise RuntimeError("Not Supported")


def test_a_gpu_that_errors_mid_listing_does_not_hide_the_others(monkeypatch):
    nv = FakeNvml(4, lost={1})
    monkeypatch.setattr(gpu_probe, "_nvml", lambda: nv)
    snap = gpu_probe.snapshot()
    assert [g.index for g in snap.gpus] == [0, 2, 3]
    assert "GPU 1" in snap.error and "lost" in snap.error
    assert [p.gpu_index for p in snap.processes] == [0, 2, 3]
    assert nv.shut


def test_processes_of_other_containers_have_no_name_and_no_size(monkeypatch):
    monkeypatch.setattr(gpu_probe, "_nvml", lambda: FakeNvml(1))
    snap = gpu_probe.snapshot()
    assert snap.error is None
    assert [(p.pid, p.name, p.used_bytes) for p in snap.processes] == [(4_000_000, "", 0)]
    assert gpu_probe.compact(snap)["other_processes"] == [[4_000_000, 0, 0.0]]


def test_no_nvml_or_a_failing_count_is_an_error_not_an_exception(monkeypatch):
    monkeypatch.setattr(gpu_probe, "_nvml", lambda: None)
    assert "no NVML" in gpu_probe.snapshot().error
    nv = FakeNvml(2)
    nv.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(RuntimeError("Unknown Error"))
    monkeypatch.setattr(gpu_probe, "_nvml", lambda: nv)
    snap = gpu_probe.snapshot()
    assert snap.gpus == [] and "Unknown Error" in snap.error and nv.shut


@pytest.mark.parametrize(
    "env, seen",
    [
        ({}, 4),  # every GPU NVML lists
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "2, 3"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "0,7,1"}, 1),  # (CUDA stops at an ordinal it cannot use)
        ({"CUDA_VISIBLE_DEVICES": "0,0"}, 1),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "MIG-aaaa,MIG-bbbb"}, 1),  # (a process sees one MIG slice)
    ],
)
def test_the_devices_a_process_sees(env, seen):
    snap = GpuSnapshot(gpus=[GpuInfo(i, "NVIDIA L4", 24 * 2**30, 23 * 2**30, 2**30) for i in range(4)])
    assert visible_count(snap, env) == seen


def test_no_count_without_gpus_or_a_probe():
    assert visible_count(GpuSnapshot(), {}) is None  # (vLLM's CPU backend: its ranks are no GPUs)
    assert visible_count(GpuSnapshot(error="no NVIDIA driver"), {"CUDA_VISIBLE_DEVICES": "0"}) is None
