"""--cpu-offload-gb on the V2 model runner of vLLM 0.22-0.27: ignored, measured.

Real vLLM 0.25 starts of Llama-3.1-8B (random bf16 weights in safetensors, read by the default loader) on one
H100 80GB (tests/gpu/host_memory.sh, session 39; tests/fixtures/gpu/host-memory/). Predicted before the run:
"Model loading took" 15.0 GiB less the offload (11.0 and 7.0 GiB), and the host memory of the run's processes
up by about the offload (once or twice it). Measured: 15.0 GiB loaded on the GPU with --cpu-offload-gb 4 and 8
alike, the same 23.49 GiB KV cache as without it, and no more host memory (peak RssAnon of all processes 2.53 GiB
against 2.55 without): the V2 runner (v1/worker/gpu/model_runner.py, which vLLM 0.25 runs every dense model on)
never installs the weight offloader (no set_offloader; vLLM issue #51396, fixed by PR #51413 after 0.27.1 was
cut, present at 0.29.0). The memory model counted the offload off the GPU, and a heal set it as a remedy: a
restart that changes nothing. A separate worker process (--distributed-executor-backend mp, as each rank of a
split) added 0.56 GiB of anonymous host memory (3.11 against 2.55)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_autoheal.api import EngineArgs, VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_runner import offload_ignored
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

RUNS = Path(__file__).parent / "fixtures" / "gpu" / "host-memory"
LOADED = re.compile(r"Model loading took (?P<gib>[\d.]+) GiB")
LLAMA8, LLAMA70, QWEN3_MOE = config_shape("llama-3.1-8b"), config_shape("llama-3.1-70b"), config_shape("qwen3-30b-a3b")
H100 = lookup("NVIDIA-H100-80GB-HBM3")
V025 = parse_version("0.25.0")


def _loaded(name: str) -> float:
    return float(LOADED.search((RUNS / f"{name}.log").read_text())["gib"])


@pytest.mark.parametrize("name, offload", [("base", 0.0), ("offload4", 4.0), ("offload8", 8.0)])
def test_the_weights_on_the_gpu_are_what_vllm_025_loaded(name, offload):
    assert f"'cpu_offload_gb': {offload}" in (RUNS / f"{name}.log").read_text() or not offload  # (the flag ran)
    engine = EngineArgs(max_model_len=4096, enforce_eager=True, gpu_memory_utilization=0.5, cpu_offload_gb=offload)
    est = estimate(LLAMA8, engine, H100, release=V025)
    assert _loaded(name) == 15.0
    assert est.weights_gib == pytest.approx(_loaded(name), abs=0.1), est


@pytest.mark.parametrize(
    "version, shape, extra, ignored",
    [
        ("0.25.0", LLAMA8, [], True),
        ("0.23.0", LLAMA8, [], True),  # (Llama listed for V2 from 0.23)
        ("0.22.0", LLAMA8, [], False),  # (Qwen3 dense alone on V2)
        ("0.21.0", LLAMA8, [], False),  # (no V2 by default)
        ("0.27.1", LLAMA8, [], True),
        ("0.28.0", LLAMA8, [], False),  # (not known: no claim)
        ("0.29.0", LLAMA8, [], False),  # (the V2 runner installs it)
        ("0.25.0", QWEN3_MOE, [], False),  # (an unlisted MoE runs on V1 in 0.25)
        ("0.25.0", LLAMA8, ["--speculative-config", '{"method": "ngram"}'], False),  # (a draft: V1 may run)
        ("0.25.0", LLAMA8, ["--enable-prompt-embeds"], False),  # (V2 does not support it: V1 runs)
    ],
)
def test_which_runs_ignore_the_offload(version, shape, extra, ignored):
    assert offload_ignored(shape, parse_version(version), extra) is ignored
    assert not offload_ignored(shape, None, extra)  # (no release known: no claim)


def _spec(**bounds: object) -> VLLMServiceSpec:
    return VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B",
        engine={"maxModelLen": 8192, "cpuOffloadGb": 10},
        heal={"bounds": bounds, "allowedActions": ["CpuOffload", "LowerCpuOffload", "RaiseMemoryLimit"]},
    )


def test_no_offload_heal_where_the_release_ignores_it():
    inv = Inventory(gpu_total_gib=H100.memory_gib, shape=LLAMA70, release=V025, memory_limit_bytes=512 * 2**30)
    r = plan_heal(_spec(), Diagnosis(cause="weights_load_oom"), inventory=inv)
    assert r.action == "GiveUp" and "ignores --cpu-offload-gb" in r.reason, r.reason
    older = Inventory(**{**inv.__dict__, "release": parse_version("0.21.0")})
    assert plan_heal(_spec(), Diagnosis(cause="weights_load_oom"), inventory=older).action == "CpuOffload"


def test_a_host_oom_lowers_no_offload_that_holds_no_host_memory():
    # (split 2 ways, so that the weights a cut puts back fit the GPU: the memory model vetoes a cut they do not)
    spec = _spec()
    spec.engine = spec.engine.model_copy(update={"tensor_parallel_size": 2})
    inv = Inventory(gpu_total_gib=H100.memory_gib, shape=LLAMA70, release=V025, memory_limit_bytes=64 * 2**30)
    r = plan_heal(spec, Diagnosis(cause="host_ram_oom"), inventory=inv)
    assert r.action != "LowerCpuOffload", r.summary()
    older = Inventory(**{**inv.__dict__, "release": parse_version("0.21.0")})
    assert plan_heal(spec, Diagnosis(cause="host_ram_oom"), inventory=older).action == "LowerCpuOffload"
