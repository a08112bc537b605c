"""An eleventh hostile review, of 23fb389..638a35a (operator/): the census rows (vLLM 0.1's negative
`# GPU blocks`, the 0.1-0.4 frames, the CPU backend's auto KV check in both its forms, externally
held weights as weights_load_oom, NCCL's `Failed to CUDA calloc`, Gaudi's `PT_DEVMEM`), torch's
pre-2.2 OOM with a 2 GiB allowance for the process's own non-PyTorch memory, Ray's ActorDiedError and
RayActorError in ENGINE_REPORT, and the termination message's `gpu_start` validated and handed to the
operator's own reading of the previous log.

Each test below that pins a problem FAILS on 638a35a and says what the classifier (or the heal) said
and what it should say. Severity in brackets.

1. [critical; new for five rows, older for two] Every new FAILURE/BUDGET row is searched anywhere in an
   ENGINE exception line, and an engine exception's first line can hold a client's text: V1 EngineCore
   dies compiling a structured-output grammar and guidance's `serialize_guidance_grammar` raises
   `ValueError(f"Trigger {begin} not found in triggers ...")` with the client's structural-tag `begin`
   (the s10c review's real format, vLLM #43920). A `begin` of `MODULE:PT_DEVMEM Allocation failed ...`
   -> runtime_oom, `Failed to CUDA calloc N bytes` -> multi_gpu_oom, `# GPU blocks: -204` ->
   kv_cache_insufficient, the CPU backend's `Available memory on node 0 (12.0/125.72 GiB) on kv cache
   allocation is less than requested memory for kv (98.5/115.66 GiB)` -> gpu_util_exceeds_free with the
   client's free_gib/total_gib/requested_gib (a number the heal lowers utilization to), its `(-3.41/..)`
   form -> kv_cache_insufficient; each quoting the client's line as evidence, over a real not_oom
   nccl_timeout. 23fb389 said not_oom for all five. (The same line with `CUDA out of memory. Tried to
   allocate 64.00 GiB` -> runtime_oom, and `Externally held weights ... exceed` -> a memory cause, on
   23fb389 too: the hole is older, each new row widens it.) Should say: what the same crash with a
   harmless `begin` says.
   -> test_a_clients_text_on_an_engine_exceptions_first_line_names_no_memory_failure[...]
2. [high; new, and an older form] ENGINE_REPORT is *searched* anywhere in the exception line, so a
   client's text that names `RayActorError` or `ActorDiedError` on the first line of the same grammar
   crash makes every further line of the client's message the engine's own words: `torch.OutOfMemoryError:
   ... ZZUSERZZ` on the next line -> runtime_oom with tried_gib 64, quoting ZZUSERZZ (23fb389: not_oom
   nccl_timeout). `NCCL error` / `ChildFailedError` did the same on 23fb389 already. Should say: only the
   exception's type (or the start of its message, torch's `RuntimeError: NCCL error in:`) makes it an
   engine report.
   -> test_a_ray_exception_name_in_a_clients_text_does_not_make_its_next_lines_the_engines[...]
3. [high; new wiring of an older rule] termination.gpu_snapshot is now given to the operator's reading of
   the log (on 23fb389 only the launcher's own reading had a snapshot), and arithmetic.other_process_gib takes the snapshot's processes over torch's own report whenever the
   snapshot lists any process at all: a 0.25 GiB process at start (a sidecar, an exporter) hides torch's
   "Process 31877 has 38.52 GiB memory in use" at the failure, and the census' two-process weights OOM
   reads weights_load_oom (heal: a quantized model / more TP) instead of gpu_util_exceeds_free.
   -> test_a_small_process_at_start_does_not_hide_torchs_report_at_the_failure
4. [medium; new wiring of an older rule, as 3] other_process_bytes() sums every GPU of the snapshot: 30 GiB held on GPU 1 turns
   a profiling OOM that torch places on GPU 0 (whose own figures show no other process) into
   gpu_util_exceeds_free. Should be profiling_oom (torch's GPU, or no GPU at all, decides).
   -> test_a_process_on_another_gpu_does_not_count_for_an_oom_on_gpu_0
5. [high; the new CPU auto-KV form] `(98.5/115.66 GiB)` is read into the explicit form's row: subtype
   kv_space_exceeds_free_host_memory, free_gib = what the node has *after* the worker's own RSS
   (requested - kv = 17.16 GiB here) was taken. The heal (fit_utilization_to_free) sizes the worker's
   whole budget to that figure: with 12.0 GiB available it sets utilization 0.08 (10.06 GiB, less than
   the 17.16 GiB the worker already uses), the next start fails with the non-positive form, whose
   heal raises utilization to 0.95: a loop of memory changes. Should: keep the worker's own memory in
   the budget (or set the KV size), never a utilization below what it uses.
   -> test_the_cpu_auto_kv_heal_keeps_the_workers_own_memory_in_its_budget
6. [medium; census DESIGNED, new; the row and plan are older] "v0.32-cpu-explicit-kv-exceeds-available" -> gpu_util_exceeds_free ("the KV
   space is the flag to lower"). When the explicit size is VLLM_CPU_KVCACHE_SPACE (the CPU backend's
   documented setting, applied by platforms/cpu.py over the flag) and not the spec's kvCacheMemoryBytes,
   the plan lowers gpuMemoryUtilization to 0.14, which on the CPU backend with an explicit KV size does
   nothing (cpu_worker skips the utilization check and allocates the explicit bytes): a memory change
   that cannot heal. Should: change the KV size, or nothing.
   -> test_an_explicit_cpu_kv_size_is_not_healed_by_lowering_utilization
7. [medium; new row] NCCL's ncclCudaCalloc warns `Failed to CUDA calloc N bytes` whenever its pointer
   stays null: after cudaMalloc or ncclCuMemAlloc failed for ANY reason (NVIDIA/nccl src/include/alloc.h:
   `if (*ptr == nullptr && nelem > 0) WARN("Failed to CUDA calloc ...")`), e.g. cuMem's `operation not
   supported` in a container, a sticky `an illegal memory access`. (a) With NCCL_DEBUG=WARN the real
   cause is printed first (`Cuda failure 'operation not supported'`): 23fb389 said not_oom cuda_error,
   638a35a says unknown signals_disagree. (b) Without NCCL_DEBUG (vLLM's default), torch's `Last error:`
   keeps only the calloc line, which cannot tell an OOM from any other CUDA failure: the census
   convention for such a message is `ambiguous` (no memory cause); 638a35a says multi_gpu_oom.
   -> test_a_calloc_after_a_non_oom_cuda_failure_says_not_memory[...],
      test_a_bare_calloc_last_error_is_no_memory_cause
8. [medium; older, same module] A termination message whose diagnosis.numbers holds an integer too large
   for a float (`{"tried_gib": 10**400}`, valid JSON) raises OverflowError out of termination.read
   (figures.check converts it) instead of being ignored with a note; kube/crash.diagnose calls read()
   outside classify's guard, so the crash is never recorded.
   -> test_a_huge_integer_figure_is_ignored_not_raised
9. [low; new] gpu_start is validated field by field but not as a whole: a process on a GPU index the
   snapshot does not list, a process larger than any GPU, or two GPUs with one index (none of which
   gpu_probe.compact writes) pass, and the process counts. Should be refused as any invalid field is.
   -> test_a_gpu_start_no_launcher_writes_is_refused[...]
10. [low; measured, not asserted as a failure] OWN_NON_TORCH_GIB = 2 GiB: vLLM's own non-torch memory
   is mostly 0.3-1.5 GiB, so under torch < 2.1 another process of up to ~2.4 GiB (e.g. 79.15 total,
   0.5 free, 75.0 reserved: 1.65 - 2 + ...) now reads as none; a 3 GiB one is still seen (test passes).

Fixed in session 11, after the review (every test here passes now):
1. A traceback through the engine's compiling of a request's grammar (vLLM's structured_output and
   guided_decoding code, xgrammar, llguidance, outlines, lm-format-enforcer: findings.GRAMMAR_FRAME) is a
   request's report from its first line on: its lines name only what a request's line may (a failure
   anchored at the start of an engine exception's message), never decide by text elsewhere in them, and
   are never quoted. This also fixes the s10c strict xfail (a forged frame inside that exception).
2. ENGINE_REPORT is matched at the start of the exception line (its type, torch's `NCCL error` opening,
   also inside V1's "Worker failed with error '...'"), never anywhere in it.
3, 4. other_process_gib takes the more of the snapshot's others (on the GPU torch's OOM names, else the
   GPU where others hold the most) and torch's own report.
5, 6. On the CPU backend's KV-space check the heal sets the KV size to fit what is free and never sizes
   the worker's whole budget to that figure (the worker's own memory is not in it); with
   VLLM_CPU_KVCACHE_SPACE in the spec's env, which vLLM applies over the flag, nothing is changed.
7. NCCL's "Failed to CUDA calloc N bytes" row is gone: it follows any failed allocation. The census
   entry is DESIGNED unknown.
8. A termination message with an integer too large for a float is ignored with a note.
9. gpu_start must list each GPU once, and each process on a listed GPU, no larger than that GPU.
10 stays as measured: the 2 GiB allowance is vLLM's own non-PyTorch memory at its largest (NCCL,
   custom all-reduce buffers); an older torch's report cannot tell a smaller other process from it.

What found nothing (tests that pass): Ray's own ActorDiedError reports (its list "(1) ... killed by
SIGKILL by OOM killer ...", SYSTEM_ERROR / UNEXPECTED_SYSTEM_EXIT, K8s' "may have exceeded K8s pod memory
limits"), now trusted as engine words, name no memory cause; the new rows' phrases in every request- and
response-logger format change nothing; a malformed gpu_start (bools, floats for ints, strings, NaN,
Infinity, -0.0, 65 GPUs, 9 processes, deep nesting, a 16 KiB+ message) is ignored with a note and raises
nothing, and what gpu_probe.compact writes always validates; no new regex backtracks (2 MB crafted logs
per shape, classify_stream, 0.7-1.2x a normal log per MB against the 3x bound).
"""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify, termination
from vllm_autoheal.diagnosis.classify import classify_stream
from vllm_autoheal.diagnosis.model import GpuInfo, GpuProcess, GpuSnapshot
from vllm_autoheal.remedy import plan_heal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted_logs import real_log  # noqa: E402
from test_diagnosis_injection import FORMATS, _inject, _vllm_log, _with  # noqa: E402
from test_diagnosis_s10b_review import OOM, _check, _said  # noqa: E402
from test_diagnosis_s10c_review import _grammar_crash  # noqa: E402

from conftest import FIXTURES  # noqa: E402

CENSUS = {
    e["id"]: e
    for name in ("vllm-messages.jsonl", "library-messages.jsonl")
    for e in map(json.loads, (FIXTURES / "census" / name).read_text().splitlines())
}
BASE = "neg-2734-llama2-70b-tp8-timeout"  # a real not_oom (NCCL watchdog timeout)


# --- 1. A client's text on the first line of the engine's own exception (critical) ------------------------
FIRST_LINE = {
    # new rows (23fb389: not_oom nccl_timeout)
    "pt-devmem": "MODULE:PT_DEVMEM Allocation failed for size::9395240960 (8960)MB ZZUSERZZ",
    "nccl-calloc": "Failed to CUDA calloc 4194304 bytes ZZUSERZZ",
    "negative-gpu-blocks": "# GPU blocks: -204 ZZUSERZZ",
    "cpu-auto-kv": "Available memory on node 0 (12.0/125.72 GiB) on kv cache allocation is less than requested "
    "memory for kv (98.5/115.66 GiB) ZZUSERZZ",
    "cpu-auto-kv-nonpositive": "Available memory on node 0 (60.02/125.72 GiB) on kv cache allocation is less than "
    "requested memory for kv (-3.41/57.86 GiB) ZZUSERZZ",
    # older rows, the same hole (23fb389 already said a memory cause)
    "torch-oom-older": "CUDA out of memory. Tried to allocate 64.00 GiB ZZUSERZZ",
    "external-weights-older": "Externally held weights on device cuda:0 (75.3/79.19 GiB) exceed the desired GPU "
    "memory utilization (0.92, 72.86 GiB) ZZUSERZZ",
}


@pytest.mark.parametrize("payload", sorted(FIRST_LINE))
def test_a_clients_text_on_an_engine_exceptions_first_line_names_no_memory_failure(payload):
    """638a35a: neg-2734 not_oom nccl_timeout -> runtime_oom (pt-devmem), multi_gpu_oom (nccl-calloc),
    kv_cache_insufficient (negative-gpu-blocks, cpu-auto-kv-nonpositive), gpu_util_exceeds_free with the
    client's free_gib 12.0 / total_gib 125.72 / requested_gib 98.5 (cpu-auto-kv), each quoting `ValueError:
    Trigger <client text> not found in triggers` as evidence. 23fb389 said not_oom for those five; the two
    `-older` rows were already wrong there. It should say what the same crash with a harmless `begin` says."""
    base_log = real_log(BASE)
    _check(
        _with(base_log, _grammar_crash(FIRST_LINE[payload]), "middle"),
        _with(base_log, _grammar_crash("hello"), "middle"),
        payload,
    )


# --- 2. ENGINE_REPORT searched anywhere in the line (high) --------------------------------------------------
@pytest.mark.parametrize("name", ["RayActorError", "ActorDiedError", "NCCL error"])
def test_a_ray_exception_name_in_a_clients_text_does_not_make_its_next_lines_the_engines(name):
    """638a35a: not_oom nccl_timeout -> runtime_oom oom_in_serving quoting `torch.OutOfMemoryError: ...
    ZZUSERZZ not found in triggers` with tried_gib 64 (RayActorError, ActorDiedError: new; 23fb389 said
    not_oom. `NCCL error`: the same on 23fb389). ENGINE_REPORT.search finds the name in the client's
    `begin` on the exception line, so the line after it is `engine_message`. It should say what the same
    crash with a harmless `begin` says: only the exception's own type names an engine report."""
    base_log = real_log(BASE)
    _check(
        _with(base_log, _grammar_crash("<fn " + name + "\n" + OOM), "middle"),
        _with(base_log, _grammar_crash("<fn " + name + "\nhello"), "middle"),
        name,
    )


EC = "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:09 [core.py:710] "
SITE = "/usr/local/lib/python3.12/dist-packages"
RAY_GET = (
    "EngineCore failed to start.\nTraceback (most recent call last):\n"
    f'  File "{SITE}/vllm/v1/executor/ray_distributed_executor.py", line 378, in _run_workers\n'
    "    ray_worker_outputs = ray.get(ray_worker_outputs)\n"
    f'  File "{SITE}/ray/_private/worker.py", line 873, in get_objects\n    raise value\n'
)
ACTOR_DIED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: RayWorkerWrapper\n\tactor_id: 7a9b0f3c2d1e4f5a6b7c8d9e01000000\n\tpid: 2980\n"
    "\tnamespace: 3f1c2b7e-5d44-4a1e-9b0e-1e2f3a4b5c6d\n\tip: 10.0.3.11\n"
)
RAY_DETAILS = {  # Ray's own words (python/ray/_raylet.pyx, src/ray/core_worker; the docs quote them)
    "connection-error": "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
    "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some "
    "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray "
    "stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.",
    "unexpected-system-exit": "The actor is dead because its worker process has died. Worker exit type: "
    "UNEXPECTED_SYSTEM_EXIT Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of "
    "file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high "
    "memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
    "unexpected errors.",
    "k8s": "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
    "detail: Worker exits unexpectedly. Worker exits with an exit code None. The worker may have exceeded K8s pod "
    "memory limits.",
}


@pytest.mark.parametrize("headed", [True, False], ids=["vllm-header", "plain"])
@pytest.mark.parametrize("detail", sorted(RAY_DETAILS))
def test_rays_own_actor_died_reports_name_no_memory_cause(detail, headed):
    """Found nothing: Ray's list of what may have ended a worker, now read as the engine's words, names
    no memory cause (the wrapper stays a wrapper)."""
    message = RAY_GET + ACTOR_DIED + RAY_DETAILS[detail]
    log = (_vllm_log(EC, message) if headed else message) + "\n"
    d = classify(Signals(log=log, exit_code=1))
    assert not d.is_memory, _said(d)


# --- 3, 4. The start snapshot in the operator's reading (high, medium) ------------------------------------
def _snapshot(gpus, processes) -> GpuSnapshot:
    doc = termination.validate(
        json.dumps(
            {
                "autoheal": 1,
                "diagnosis": {"cause": "unknown"},
                "gpu_start": {"gpus": gpus, "other_processes": processes},
            }
        )
    )
    snap = termination.gpu_snapshot(doc)
    assert snap is not None
    return snap


H100 = "NVIDIA H100 80GB HBM3"


def test_a_small_process_at_start_does_not_hide_torchs_report_at_the_failure():
    """638a35a: gpu_util_exceeds_free -> weights_load_oom oom_in_load. The snapshot (taken before vLLM
    started) lists a 0.25 GiB process, so other_process_gib reads 0.25 from it and never looks at torch's
    own list at the failure ("Process 31877 has 38.52 GiB memory in use"). Without a snapshot, or with an
    empty one, it says gpu_util_exceeds_free. It should still: a later process is in torch's report."""
    log = CENSUS["torch2.2-2.4-oom-two-processes-weights"]["log"]
    assert classify(Signals(log=log)).cause == "gpu_util_exceeds_free"
    snap = _snapshot([[0, H100, 79.15, 78.6]], [[4242, 0, 0.25]])
    d = classify(Signals(log=log, gpu=snap))
    assert d.cause == "gpu_util_exceeds_free", f"said {_said(d)}; torch named a 38.52 GiB process at the failure"


def test_a_process_on_another_gpu_does_not_count_for_an_oom_on_gpu_0():
    """638a35a: profiling_oom -> gpu_util_exceeds_free. torch places the OOM on GPU 0 and its figures
    (79.15 total, 2.13 free, 76.23 reserved by PyTorch) leave no other process there; the snapshot's
    30 GiB process is on GPU 1, and other_process_bytes() sums every GPU. It should say profiling_oom."""
    log = CENSUS["torch1.5-1.9-oom-reserved-no-hint-profile"]["log"]
    snap = _snapshot([[0, H100, 79.15, 78.6], [1, H100, 79.15, 48.6]], [[4242, 1, 30.0]])
    d = classify(Signals(log=log, gpu=snap))
    assert d.cause == "profiling_oom", f"said {_said(d)}; the other process is on GPU 1, the OOM on GPU 0"


# --- 5, 6. The CPU backend's KV checks and their heals (high, medium) ---------------------------------------
def _cpu_spec(**engine) -> VLLMServiceSpec:
    return VLLMServiceSpec(model="m", engine={"gpu_memory_utilization": 0.92, "enforce_eager": True, **engine})


def test_the_cpu_auto_kv_heal_keeps_the_workers_own_memory_in_its_budget():
    """638a35a: the auto form (`for kv (98.5/115.66 GiB)`, the worker's budget 115.66 less its RSS 17.16)
    with 12.0 GiB available -> gpu_util_exceeds_free kv_space_exceeds_free_host_memory, heal
    LowerGpuMemoryUtilization 0.08 (10.06 GiB of 125.72: below the 17.16 GiB the worker already uses).
    The next start then fails with `for kv (-7.10/10.06 GiB)`, kv_cache_insufficient, heal
    RaiseGpuMemoryUtilization 0.95, which is the first crash again. The budget must keep the worker's
    own memory (requested - kv) plus room for a KV cache."""
    log = CENSUS["v0.32-cpu-auto-kv-exceeds-available"]["log"].replace("(31.2/125.72 GiB)", "(12.0/125.72 GiB)")
    d = classify(Signals(log=log))
    r = plan_heal(_cpu_spec(), d)
    consumed = 115.66 - 98.5  # what the worker held when vLLM checked (its budget less the KV it asked for)
    new = (r.changes or {}).get("gpu_memory_utilization")
    assert new is None or new * 125.72 > consumed + 1.0, (
        f"{d.cause} {d.subtype} -> {r.action} {r.changes}: a budget of {new * 125.72:.2f} GiB is below the "
        f"{consumed:.2f} GiB the worker already uses"
    )


def test_an_explicit_cpu_kv_size_is_not_healed_by_lowering_utilization():
    """638a35a (census DESIGNED: gpu_util_exceeds_free, "the KV space is the flag to lower"): the explicit
    form (`for kv (40.0 GiB)`) with no kvCacheMemoryBytes in the spec (the size is VLLM_CPU_KVCACHE_SPACE,
    which vLLM 0.32's platforms/cpu.py applies over the flag) -> LowerGpuMemoryUtilization 0.14. With an
    explicit KV size cpu_worker neither checks nor uses the utilization: the same crash follows. The heal
    should change the KV size or nothing."""
    d = classify(Signals(log=CENSUS["v0.32-cpu-explicit-kv-exceeds-available"]["log"]))
    r = plan_heal(_cpu_spec(), d)
    assert set(r.changes or {}) != {"gpu_memory_utilization"}, f"{d.subtype} -> {r.action} {r.changes}"


# --- 7. NCCL's calloc warning after any failed allocation (medium) ----------------------------------------
NCCL_LOG = CENSUS["nccl2.18-cudamalloc-oom-torch2.1-allreduce-warmup"]["log"]


@pytest.mark.parametrize(
    "error",
    [
        "Cuda failure 'operation not supported'",
        "Cuda failure 1 'invalid argument'",
        "Cuda failure 'an illegal memory access was encountered'",
    ],
)
def test_a_calloc_after_a_non_oom_cuda_failure_says_not_memory(error):
    """638a35a: not_oom cuda_error (23fb389) -> unknown signals_disagree. NCCL printed the CUDA call's
    real failure, then (as it does after any failed allocation) `Failed to CUDA calloc 4194304 bytes`,
    which the new row reads as an out-of-memory after a non-memory failure. It should say not_oom."""
    d = classify(Signals(log=NCCL_LOG.replace("Cuda failure 'out of memory'", error)))
    assert d.cause == "not_oom", f"said {_said(d)}"


def test_a_bare_calloc_last_error_is_no_memory_cause():
    """638a35a: multi_gpu_oom nccl_cuda_oom (23fb389: unknown). Without NCCL_DEBUG only torch's `Last
    error: Failed to CUDA calloc 4194304 bytes` is left, which NCCL prints after any failed cudaMalloc or
    cuMem allocation: the message alone cannot tell an OOM from `operation not supported`. It should not
    name a memory cause (the census' `ambiguous`)."""
    log = NCCL_LOG.replace(
        "\ngpu-node-3:1893:1893 [0] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n", ""
    )
    log = log.replace(
        "\ngpu-node-3:1893:1893 [0] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 4194304 bytes\n", "\n"
    )
    assert "NCCL WARN" not in log
    d = classify(Signals(log=log))
    assert not d.is_memory, f"said {_said(d)}"


# --- 8, 9. The termination message ----------------------------------------------------------------------
def _doc(**extra) -> str:
    return json.dumps({"autoheal": 1, "diagnosis": {"cause": "unknown"}, **extra})


def test_a_huge_integer_figure_is_ignored_not_raised():
    """638a35a (and 23fb389): OverflowError ("int too large to convert to float") out of termination.read
    for a valid JSON integer of 400 digits in diagnosis.numbers under a figure's name; kube/crash.diagnose
    calls read() outside classify's guard. It should be ignored with a note."""
    for numbers in ({"tried_gib": 10**400}, {"process_gib": [10**400]}):
        text = json.dumps({"autoheal": 1, "diagnosis": {"cause": "runtime_oom", "numbers": numbers}})
        doc, note = termination.read(text)
        assert doc is None and note


MALFORMED_GPU_START = {
    "bool-index": {"gpus": [[True, H100, 80, 1]]},
    "float-index": {"gpus": [[0.0, H100, 80, 1]]},
    "string-size": {"gpus": [[0, H100, "80", 1]]},
    "free-over-total": {"gpus": [[0, H100, 80, 81]]},
    "negative": {"gpus": [[0, H100, 80, -1]]},
    "huge-int": {"gpus": [[0, H100, 10**400, 1]]},
    "huge-float": {"gpus": [[0, H100, 1e308, 1]]},
    "pid-bool": {"gpus": [[0, H100, 80, 1]], "other_processes": [[False, 0, 1.0]]},
    "pid-over-range": {"gpus": [[0, H100, 80, 1]], "other_processes": [[2**40, 0, 1.0]]},
    "65-gpus": {"gpus": [[i % 8, H100, 80, 1] for i in range(65)]},
    "9-processes": {"gpus": [[0, H100, 80, 1]], "other_processes": [[i, 0, 1.0] for i in range(9)]},
    "short-row": {"gpus": [[0, H100, 80]]},
    "row-object": {"gpus": [{"index": 0}]},
    "gpus-object": {"gpus": {"0": [0, H100, 80, 1]}},
    "error-null": {"error": None},
    "long-name": {"gpus": [[0, "x" * 41, 80, 1]]},
    "not-object": [1, 2],
}


@pytest.mark.parametrize("shape", sorted(MALFORMED_GPU_START))
def test_a_malformed_gpu_start_is_ignored_with_a_note(shape):
    """Found nothing: each malformed gpu_start makes the whole message ignored, with a note, raising nothing."""
    doc, note = termination.read(_doc(gpu_start=MALFORMED_GPU_START[shape]))
    assert doc is None and note and termination.gpu_snapshot(doc) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": {"gpus": [[0, "x", NaN, 1]]}}',
        '{"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": {"gpus": [[0, "x", Infinity, 1]]}}',
        '{"autoheal": 1, "gpu_start": ' + "[" * 5000 + "]" * 5000 + "}",
        _doc(gpu_start={"gpus": [[0, H100, 80, 1]]}, note="x" * 20000),
    ],
    ids=["nan", "infinity", "deep", "oversize"],
)
def test_non_json_numbers_nesting_and_size_are_ignored(text):
    doc, note = termination.read(text)
    assert doc is None and note


def test_negative_zero_reads_as_an_empty_gpu():
    """Found nothing: -0.0 is a size of 0 (no device: no device size for the classifier)."""
    doc, note = termination.read(_doc(gpu_start={"gpus": [[0, H100, -0.0, -0.0]], "other_processes": [[1, 0, -0.0]]}))
    snap = termination.gpu_snapshot(doc)
    assert note is None and snap is not None and snap.other_process_bytes() == 0 and snap.gpus[0].total_bytes == 0


def test_what_the_launcher_writes_always_validates():
    """Found nothing: gpu_probe.compact's own form (names cut to 40, 8 processes, 2 decimals) passes."""
    from vllm_autoheal.gpu_probe import compact
    from vllm_autoheal.launcher import termination_message

    snap = GpuSnapshot(
        gpus=[GpuInfo(i, "NVIDIA H200 " + "x" * 60, 150_000_000_000, 149_999_999_999, 1) for i in range(8)],
        processes=[GpuProcess(10_000 + i, i % 8, 3 * 2**30 + i) for i in range(12)] + [GpuProcess(1, 0, 5)],
        own_pids=[1],
    )
    text = termination_message({"cause": "unknown"}, 1, compact(snap), None)
    doc, note = termination.read(text)
    assert note is None and doc is not None
    assert len(termination.gpu_snapshot(doc).processes) == 8


INCONSISTENT_GPU_START = {
    "process-on-an-unlisted-gpu": {"gpus": [[0, H100, 79.15, 78.6]], "other_processes": [[4242, 7, 30.0]]},
    "process-larger-than-its-gpu": {"gpus": [[0, H100, 79.15, 78.6]], "other_processes": [[4242, 0, 99999.0]]},
    "one-index-twice": {"gpus": [[0, H100, 79.15, 78.6], [0, "x", 1.0, 0.0]]},
}


@pytest.mark.parametrize("shape", sorted(INCONSISTENT_GPU_START))
def test_a_gpu_start_no_launcher_writes_is_refused(shape):
    """638a35a: accepted; the 30 GiB (or 99999 GiB) process counts as another process's memory for any
    OOM. gpu_probe.compact never writes these (a process is listed under the GPU it was read from, NVML
    reports no process larger than its device, indexes are 0..count-1). They should be refused."""
    doc, note = termination.read(_doc(gpu_start=INCONSISTENT_GPU_START[shape]))
    assert doc is None and note, f"accepted: {doc and doc.get('gpu_start')}"


# --- 10. The 2 GiB allowance for torch < 2.2 (low, measured) -----------------------------------------------
def test_a_3_gib_other_process_is_still_seen_under_old_torch():
    """Found nothing at 3 GiB: 79.15 total, 0.5 free, 74.0 reserved by PyTorch (own non-torch ~0.65 GiB,
    another process ~4 GiB): 79.15 - 0.5 - 76 = 2.65 > 1, gpu_util_exceeds_free. (At ~2.4 GiB another
    process is no longer seen: the allowance's trade, item 10.)"""
    log = CENSUS["torch1.5-1.9-oom-reserved-no-hint-profile"]["log"].replace(
        "2.13 GiB free; 76.23 GiB reserved", "0.50 GiB free; 74.00 GiB reserved"
    )
    assert classify(Signals(log=log)).cause == "gpu_util_exceeds_free"


# --- The new rows' phrases in user text (found nothing) ----------------------------------------------------
USER_QUOTES = [
    "RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::939524096 (896)MB",
    "Last error:\nFailed to CUDA calloc 2097152 bytes",
    "INFO 01-18 16:20:58 llm_engine.py:223] # GPU blocks: -204, # CPU blocks: 512",
    "ValueError: Available memory on node 0 (1.0/125.72 GiB) on kv cache allocation is less than requested memory "
    "for kv (-3.41/57.86 GiB). Reduce CPU memory used by other processes.",
    'File "cache_engine.py", line 76, in allocate_gpu_cache\ntorch.OutOfMemoryError: CUDA out of memory.',
    'File "worker.py", line 1, in profile_num_available_blocks',
    "ray.exceptions.ActorDiedError: The actor died unexpectedly\nMemory cgroup out of memory: Killed process 1",
]


@pytest.mark.parametrize("n", range(len(USER_QUOTES)))
def test_the_new_rows_phrases_in_request_and_response_lines_change_nothing(n):
    base_log = real_log(BASE)
    want = classify(Signals(log=base_log))
    for k, fmt in enumerate(FORMATS):
        d = classify(Signals(log=_inject(base_log, USER_QUOTES[n], fmt, ("start", "middle", "end")[k % 3])))
        assert (d.cause, d.subtype, d.numbers, d.evidence) == (want.cause, want.subtype, want.numbers, want.evidence)


# --- Backtracking (found nothing) --------------------------------------------------------------------------
P = "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:1] "
CRAFTED = {
    "calloc": P + ("Failed to CUDA calloc async 1111111111111111111111 " * 60)[:2040],
    "gpu-blocks": P + ("# GPU blocks: -" + "1" * 13 + " ") * 60,
    "cpu-kv": P + "Available memory on node 0 (" + "1." * 500 + " GiB) on kv cache allocation is less than "
    "requested memory for kv (" + "1." * 400,
    "cpu-kv-nonpositive": P + ("on kv cache allocation is less than requested memory for kv (-" + "1." * 30 + "/") * 20,
    "pt-devmem": P + ("MODULE:PT_DEVMEM Allocation faile " * 60)[:2040],
    "frames": P + ('  File "x", line 1, in profile_num_available_blocksx allocate_gpu_cachex ' * 30)[:2040],
}


def _per_mb(line: str) -> float:
    log = (line + "\n") * (2_000_000 // (len(line) + 1))
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        classify_stream(io.StringIO(log))
        best = min(best, time.perf_counter() - t0)
    return best / (len(log) / 1e6)


def test_no_new_row_backtracks_on_a_crafted_log():
    normal = _per_mb(P + "Avg prompt throughput: 1234.5 tokens/s, Running: 12 reqs rror " + "a" * 1950)
    slow = {shape: round(_per_mb(line) / normal, 2) for shape, line in CRAFTED.items()}
    assert all(ratio < 3 for ratio in slow.values()), slow
