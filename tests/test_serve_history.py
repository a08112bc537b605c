"""`serve`'s history file is untrusted input: whatever it holds, `serve` starts, and never with flags
outside the bounds given on its command line."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal import local
from vllm_autoheal.api import HealBounds, HealPolicy, VLLMServiceSpec
from vllm_autoheal.engine import parse_args
from vllm_autoheal.vllm_command import VllmStart


def supervisor(tmp_path, monkeypatch, content: bytes, **bounds):
    monkeypatch.setattr(local, "vllm_start", lambda python: VllmStart(api_server_module=True))
    path = tmp_path / "history.jsonl"
    path.write_bytes(content)
    spec = VLLMServiceSpec(
        model="m",
        engine=parse_args(["--max-model-len", "8192", "--gpu-memory-utilization", "0.8"]).engine,
        heal=HealPolicy(bounds=HealBounds(**bounds)),
    )
    return local.Supervisor(local.ServeOptions(model="m", spec=spec, history_path=path), out=open("/dev/null", "w"))


def first_start(sup):
    """The flags serve() starts vLLM with (the start itself is skipped: a stop comes at once)."""
    started = []

    def run_once(engine):
        started.append(engine)
        return local.Attempt(None, False, "", interrupted=True)

    sup.run_once = run_once
    assert sup.serve() == 130
    return started[0]


def healthy(sup, **engine) -> bytes:
    rec = {"key": sup.key, "event": "healthy", "engine": {**sup.baseline.model_dump(mode="json"), **engine}}
    return (json.dumps(rec) + "\n").encode()


@pytest.mark.parametrize(
    "bad",
    [
        b"[1, 2]\n",  # JSON, but not an object
        b'"healthy"\n',
        b"\xff\xfe\x00 not text\n",
        b"[" * 100_000 + b"\n",
        b"{}",
    ],
)
def test_a_corrupt_history_never_crashes_serve(tmp_path, monkeypatch, bad):
    sup = supervisor(tmp_path, monkeypatch, b"")
    good = healthy(sup, gpu_memory_utilization=0.7)
    sup = supervisor(tmp_path, monkeypatch, good + bad)
    assert first_start(sup).gpu_memory_utilization == 0.7  # the good record still counts


@pytest.mark.parametrize(
    "engine",
    [
        {"gpu_memory_utilization": "lots"},  # flags vLLM would reject
        {"max_num_seqs": 0},
        None,
    ],
)
def test_a_healthy_record_with_invalid_flags_is_ignored(tmp_path, monkeypatch, engine):
    sup = supervisor(tmp_path, monkeypatch, b"")
    rec = {"key": sup.key, "event": "healthy"} | ({} if engine is None else {"engine": engine})
    sup = supervisor(tmp_path, monkeypatch, (json.dumps(rec) + "\n").encode())
    assert first_start(sup) == sup.baseline


def test_remembered_flags_outside_the_bounds_are_not_used(tmp_path, monkeypatch):
    sup = supervisor(tmp_path, monkeypatch, b"")
    edited = healthy(sup, gpu_memory_utilization=0.99)  # above --max-gpu-memory-utilization 0.9
    sup = supervisor(tmp_path, monkeypatch, edited, max_gpu_memory_utilization=0.9)
    assert first_start(sup) == sup.baseline
    short = healthy(sup, max_model_len=16)  # below --min-max-model-len
    sup = supervisor(tmp_path, monkeypatch, short, max_gpu_memory_utilization=0.9)
    assert first_start(sup) == sup.baseline
    wider = healthy(sup, tensor_parallel_size=8)  # no --max-tensor-parallel-size
    assert first_start(supervisor(tmp_path, monkeypatch, wider)) == sup.baseline


def test_remembered_flags_change_only_what_a_heal_may(tmp_path, monkeypatch):
    sup = supervisor(tmp_path, monkeypatch, b"")
    sneaky = healthy(sup, gpu_memory_utilization=0.7, extra_args=["--trust-remote-code"])
    assert first_start(supervisor(tmp_path, monkeypatch, sneaky)) == sup.baseline
    healed = healthy(sup, gpu_memory_utilization=0.7, enforce_eager=True)
    assert first_start(supervisor(tmp_path, monkeypatch, healed)).enforce_eager is True


def test_only_the_end_of_a_huge_history_is_read(tmp_path, monkeypatch):
    import tracemalloc

    sup = supervisor(tmp_path, monkeypatch, b"")
    filler = (b"x" * 1023 + b"\n") * (64 * 1024)  # 64 MiB of junk lines, then the newest record
    sup = supervisor(tmp_path, monkeypatch, healthy(sup, gpu_memory_utilization=0.6) + filler)
    with sup.opts.history_path.open("ab") as f:
        f.write(healthy(sup, gpu_memory_utilization=0.7))
    tracemalloc.start()
    try:
        assert first_start(sup).gpu_memory_utilization == 0.7
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"reading the history took {peak // 2**20} MiB"


def test_a_credential_is_recorded_hidden_and_the_flags_that_worked_are_still_remembered():
    from vllm_autoheal.api import EngineArgs
    from vllm_autoheal.remedy_gate import Limits
    from vllm_autoheal.serve_history import recorded, remembered

    baseline = parse_args(["--max-model-len", "8192", "--api-key", "sk-ZZSECRETZZ"]).engine
    healed = baseline.model_copy(update={"max_model_len": 4096})
    record = {"event": "healthy", "engine": recorded(healed)}
    assert "ZZSECRETZZ" not in json.dumps(record)
    engine, why_not = remembered([record], baseline, Limits(HealBounds()))
    assert why_not is None and isinstance(engine, EngineArgs)
    assert engine.max_model_len == 4096 and engine.extra_args == ["--api-key", "sk-ZZSECRETZZ"]
