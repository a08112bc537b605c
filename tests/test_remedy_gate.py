"""The one safety gate: every remedy of the planner passes it, in the operator, in `serve` and in
`diagnose --engine-args`; and the utilization floor comes from need, not a fixed number."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import textwrap

import pytest

from vllm_autoheal.api import MAX_OFFLOAD_GIB, EngineArgs, HealBounds, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.remedy import GIVE_UP, Inventory, plan_heal
from vllm_autoheal.remedy_gate import Limits, check, fingerprint, utilization_floor

from samples import config_shape

LLAMA8 = config_shape("llama-3.1-8b")
LLAMA70 = config_shape("llama-3.1-70b")
# A real vLLM failure on an H200 where another process held 72 % of the GPU (issue 12).
H200_FREE = (
    "ValueError: Free memory on device cuda:0 (38.69/139.8 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)
ENGINE = EngineArgs(gpu_memory_utilization=0.9, max_model_len=32768, max_num_seqs=256)
LIMITS = Limits(
    HealBounds(min_gpu_memory_utilization=0.3, max_tensor_parallel_size=4, max_memory_limit="64Gi"),
    memory_limit_bytes=32 * 2**30,
)


@pytest.mark.parametrize(
    "cause, changes, problem",
    [
        ("runtime_oom", {"gpu_memory_utilization": math.nan}, "not a finite number"),
        ("host_ram_oom", {"kv_cache_memory_bytes": 10**30}, "less than or equal"),  # the CRD's range
        ("weights_load_oom", {"cpu_offload_gb": 1.49e53}, "less than or equal"),
        ("weights_load_oom", {"cpu_offload_gb": 20.0}, "more than the container's memory limit holds"),  # (16)
        ("runtime_oom", {"gpu_memory_utilization": 0.26}, "below its bound 0.3"),
        ("runtime_oom", {"gpu_memory_utilization": -4.08}, "greater than 0"),
        ("runtime_oom", {"gpu_memory_utilization": 0.93}, "does not move the way runtime_oom calls for"),
        ("kv_cache_insufficient", {"max_model_len": 65536}, "does not move"),
        ("kv_cache_insufficient", {"tensor_parallel_size": 8}, "above its bound 4"),
        ("profiling_oom", {"max_num_batched_tokens": 128}, "below max_num_seqs"),
        ("host_ram_oom", {"memory_limit": "80Gi"}, "above its bound 64Gi"),
        ("runtime_oom", {"enforce_eager": True}, "not what runtime_oom calls for"),
        ("runtime_oom", {"gpu_memory_utilization": 0.9}, "does not move"),
        ("runtime_oom", {}, "changes nothing"),
    ],
)
def test_the_gate_refuses_with_the_reason(cause, changes, problem):
    reason = check(cause, changes, ENGINE, "m", "32Gi", LIMITS)
    assert reason is not None and problem in reason, reason


def test_the_gate_passes_a_sound_remedy_and_never_one_that_already_crashed():
    assert check("runtime_oom", {"gpu_memory_utilization": 0.88}, ENGINE, "m", "32Gi", LIMITS) is None
    failed = {fingerprint("m", ENGINE.model_copy(update={"gpu_memory_utilization": 0.88}), "32Gi")}
    assert "already crashed" in check(
        "runtime_oom", {"gpu_memory_utilization": 0.88}, ENGINE, "m", "32Gi", LIMITS, failed
    )


def test_h200_other_process_heals_in_one_step_with_default_settings():
    """0.9 of 139.8 GiB asked, 38.69 free: the default bounds leave the fit (0.25) allowed."""
    r = plan_heal(
        VLLMServiceSpec(model="meta-llama/Llama-3.1-8B-Instruct"), classify(Signals(log=H200_FREE, exit_code=1))
    )
    assert r.action == "LowerGpuMemoryUtilization" and r.changes == {"gpu_memory_utilization": 0.25}
    assert 0.25 * 139.8 < 38.69 - 1.0


def test_floor_from_need_when_the_model_is_known():
    bounds = HealBounds(min_max_model_len=8192)
    floor = utilization_floor(bounds, EngineArgs(), LLAMA8, 139.8)
    est = estimate(LLAMA8, EngineArgs(gpu_memory_utilization=floor, max_model_len=8192), lookup("NVIDIA-H200"))
    assert est.fits and 0.1 < floor < 0.2  # ~16 GiB of weights and 1 GiB of KV on a 140 GiB GPU
    assert utilization_floor(HealBounds(min_gpu_memory_utilization=0.5), EngineArgs(), LLAMA8, 139.8) == 0.5
    assert utilization_floor(bounds, EngineArgs(), None, 139.8) is None  # vLLM's own figures decide
    # 70B on one H200 with 30 GiB free: lowering utilization cannot hold the weights; it says so
    d = classify(Signals(log=H200_FREE.replace("38.69", "30.00")))
    r = plan_heal(
        VLLMServiceSpec(model="m", heal={"bounds": {"minMaxModelLen": 8192}}),
        d,
        inventory=Inventory(gpu_total_gib=139.8, shape=LLAMA70),
    )
    assert r.action == GIVE_UP and "LowerGpuMemoryUtilization" not in r.reason


def test_an_explicit_floor_still_wins():
    spec = VLLMServiceSpec(model="m", heal={"bounds": {"minGpuMemoryUtilization": 0.5}})
    assert plan_heal(spec, classify(Signals(log=H200_FREE))).action == GIVE_UP


HOSTILE = [
    Diagnosis(
        cause="kv_cache_insufficient",
        numbers={"estimated_max_model_len": 1e30, "needed_gib": 1e30, "available_gib": 1.0, "max_seq_len": 131072},
    ),
    Diagnosis(cause="kv_cache_insufficient", numbers={"estimated_max_model_len": math.inf}),
    Diagnosis(cause="gpu_util_exceeds_free", numbers={"free_gib": 1e30, "total_gib": 1e-30}),
    Diagnosis(cause="gpu_util_exceeds_free", numbers={"free_gib": math.nan, "total_gib": 139.8}),
    Diagnosis(cause="runtime_oom", numbers={"tried_gib": -1e30, "gpu_total_gib": 79.14}),
    Diagnosis(cause="profiling_oom", numbers={"dummy_requests": 1e30}),
    Diagnosis(cause="weights_load_oom"),
    Diagnosis(cause="host_ram_oom"),
]


@pytest.mark.parametrize("diag", HOSTILE, ids=lambda d: f"{d.cause}-{sorted(d.numbers.items())[:1]}")
def test_hostile_numbers_never_make_an_absurd_remedy(diag):
    spec = VLLMServiceSpec(
        model="m",
        engine={"maxModelLen": 131072, "gpuMemoryUtilization": 0.9},
        resources={"limits": {"memory": "32Gi"}},
        heal={
            "bounds": {"maxTensorParallelSize": 2, "maxMemoryLimit": "48Gi"},
            "allowedActions": [
                "IncreaseTensorParallel",
                "CpuOffload",
                "LowerMaxModelLen",
                "LowerGpuMemoryUtilization",
                "RaiseGpuMemoryUtilization",
                "LowerMaxNumSeqs",
                "SetKvCacheMemoryBytes",
                "RaiseMemoryLimit",
            ],
        },
    )
    for inv in (Inventory(), Inventory(gpu_total_gib=22.0, shape=LLAMA70, memory_limit_bytes=32 * 2**30)):
        r = plan_heal(spec, diag, inventory=inv)
        if r.gives_up:
            continue
        after = EngineArgs.model_validate(r.apply(spec.engine).model_dump())  # inside the CRD's ranges
        assert all(not isinstance(v, float) or math.isfinite(v) for v in r.changes.values())
        assert (after.cpu_offload_gb or 0) <= min(MAX_OFFLOAD_GIB, 32)


def test_diagnose_engine_args_uses_the_same_gate():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_autoheal",
            "diagnose",
            "-",
            "--json",
            "--engine-args",
            "--gpu-memory-utilization 0.9",
        ],
        input=H200_FREE,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    remedy = json.loads(out)["remedy"]
    assert remedy["action"] == "LowerGpuMemoryUtilization" and remedy["changes"] == {"gpu_memory_utilization": 0.25}
    # the same crash with the flags already at what would fit: nothing absurd, a reason instead
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_autoheal",
            "diagnose",
            "-",
            "--json",
            "--engine-args",
            "--gpu-memory-utilization 0.2",
        ],
        input=H200_FREE,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["remedy"]["action"] == GIVE_UP


FAKE_VLLM = """
import sys
print("INFO 01-01 [gpu_model_runner.py:1] Model loading took 15.0 GiB", flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
      "79.14 GiB of which 1.00 GiB is free.", flush=True)
print("ARGS " + " ".join(sys.argv[1:]), flush=True)
sys.exit(1)
"""


def test_serve_heals_through_the_same_gate_and_stops_at_the_bound(tmp_path, monkeypatch):
    """`serve` with a real child process that dies of a profiling OOM every time: each heal is a
    different change inside the bounds, utilization never goes below --min-gpu-memory-utilization,
    and it gives up saying why."""
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "fake" / "vllm", tmp_path / "fake" / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(textwrap.dedent(FAKE_VLLM))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    history = tmp_path / "history.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_autoheal",
            "serve",
            "m",
            "--port",
            str(port),
            "--history",
            str(history),
            "--min-gpu-memory-utilization",
            "0.85",
            "--max-attempts",
            "9",
            "--startup-timeout",
            "60",
            "--gpu-memory-utilization",
            "0.9",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in history.read_text().splitlines()]
    heals = [r for r in records if r["event"] == "heal"]
    assert [h["action"] for h in heals] == ["LowerMaxNumSeqs", "LowerMaxNumBatchedTokens", "LowerGpuMemoryUtilization"]
    assert all(h["after"]["gpu_memory_utilization"] >= 0.85 for h in heals)
    assert len({json.dumps(h["after"], sort_keys=True) for h in heals}) == len(heals)  # never the same twice
    assert records[-1]["event"] == "gave_up" and "no allowed change" in records[-1]["reason"]


@pytest.mark.parametrize(
    ("seqs", "batched"), [(None, None), (256, None), (None, 8), (256, 8192), (256, 256), (256, 255), (1, 2**24)]
)
def test_the_gates_batch_rule_is_the_crds(seqs, batched):
    """serve's history and the gate refuse flags with batched tokens below sequences by one predicate,
    and it reads as the CRD's CEL rule does on the real admission path (`render`)."""
    from vllm_autoheal.remedy_gate import batch_below_seqs
    from vllm_autoheal.validation import admit

    engine = {k: v for k, v in (("maxNumSeqs", seqs), ("maxNumBatchedTokens", batched)) if v is not None}
    body = {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "svc", "namespace": "team"},
        "spec": {"model": "m", "engine": engine},
    }
    refused_by_crd = any("maxNumBatchedTokens" in p for p in admit(body)[1])
    assert batch_below_seqs(EngineArgs.model_validate(engine)) == refused_by_crd


def test_no_raise_goes_back_to_a_utilization_that_ran_out_outside_the_budget():
    """A runtime OOM at 0.9 was cut to 0.85: a KV heal may raise to 0.89, never to 0.9 or above; a cut from
    above that ceiling (the user set 0.95 since) is no raise and passes."""
    capped = Limits(HealBounds(), ceiling=0.9)
    at = EngineArgs(gpu_memory_utilization=0.85, max_model_len=32768)
    assert check("kv_cache_insufficient", {"gpu_memory_utilization": 0.89}, at, "m", None, capped) is None
    reason = check("kv_cache_insufficient", {"gpu_memory_utilization": 0.91}, at, "m", None, capped)
    assert reason is not None and "already ran out of memory outside the budget" in reason
    above = at.model_copy(update={"gpu_memory_utilization": 0.95})
    assert check("runtime_oom", {"gpu_memory_utilization": 0.93}, above, "m", None, capped) is None
