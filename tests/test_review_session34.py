"""Hostile review (session 34) of four changes: the memory model's veto of the quantized fallback
(remedy/plan.py `_cannot_fit`, 28dcecf), data and prefill context parallelism refused in extraArgs
(engine.py RESERVED, 0a74e75), no reconcile for a metadata-only edit (kube/handlers.py
`_changes_what_reconcile_reads`, e8ab4e7), and `diagnose` reading only the head and tail of a huge
regular file (log_file.windows, afd3575).

Each xfail(strict) test is a defect found today, asserting the right behaviour; the plain tests are
attacks that were defended."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis
from vllm_autoheal.diagnosis.classify import classify_stream
from vllm_autoheal.diagnosis.model import Cause
from vllm_autoheal.engine import extra_args_problems, parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.kube.handlers import _changes_what_reconcile_reads
from vllm_autoheal.log_file import SOUGHT_ABOVE, windows
from vllm_autoheal.memory import estimate
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.serve_sizing import gpus_taken
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

ROOT = Path(__file__).resolve().parents[1]
FAILURES = ROOT / "tests" / "fixtures" / "gpu" / "failure-logs"
LLAMA70 = config_shape("llama-3.1-70b")
V025 = parse_version("0.25.0")


def _weights_heal(gpu: str, flags: str, method: str, fallback: str) -> object:
    """A weights_load_oom of Llama-3.1-70B (bf16) on one GPU, under the CRD's default heal policy (its
    allowedActions include Quantize, LowerMaxModelLen and RaiseGpuMemoryUtilization, not a split) with
    the quantized fallback allowed."""
    spec = VLLMServiceSpec(
        model="meta-llama/Llama-3.1-70B-Instruct",
        engine=parse_args(flags).engine,
        heal={"quantizedFallback": {"allowed": True, "model": fallback, "method": method}},
    )
    inv = Inventory(gpu_total_gib=lookup(gpu).memory_gib, gpu_name=gpu, shape=LLAMA70, release=V025)
    return plan_heal(spec, Diagnosis(cause=Cause.WEIGHTS_LOAD_OOM), inventory=inv)


# --- 1. the quantized fallback's veto (28dcecf) -----------------------------------------------------------


def test_an_fp8_fallback_whose_weights_fit_is_not_refused_for_a_kv_shortfall_a_kv_heal_answers():
    """Severity: high (a regression of the commonest quantized fallback: a service that healed now gives up).
    Input: Llama-3.1-70B-Instruct in bf16 on one H100 80GB, --max-model-len 8192, utilization 0.9 (the
    operator's default), vLLM 0.25: out of memory loading the weights. The default heal policy with
    quantizedFallback RedHatAI/Llama-3.1-70B-Instruct-FP8 (fp8) allowed; no split allowed (one GPU).
    Now: the memory model puts the fp8 weights at 67.7 GiB, which fit, but its KV cache at 0.9 holds one
    request of 5,296 tokens < 8,192, so _cannot_fit refuses Quantize and the plan is GiveUp. Before the
    change Quantize was tried; vLLM's KV check then failed and the next heal raised utilization (the
    memory model itself says 0.92, vLLM 0.25's own default, holds 10,496 tokens: it fits), healthy in two
    restarts.
    Right: the quantized fallback is planned (with, in the same change, the utilization or the context
    the memory model says the quantized start needs, where the policy allows them), never a give-up."""
    r = _weights_heal("NVIDIA-H100-80GB-HBM3", "--max-model-len 8192", "fp8", "RedHatAI/Llama-3.1-70B-Instruct-FP8")
    # (the memory model's own figures for the quantized start: it fits at vLLM 0.25's default share)
    at_092 = parse_args("--max-model-len 8192").engine.model_copy(
        update={"quantization": "fp8", "gpu_memory_utilization": 0.92}
    )
    assert estimate(LLAMA70, at_092, lookup("NVIDIA-H100-80GB-HBM3"), None, "server", V025).fits
    assert r.action == "Quantize", r.reason
    assert r.changes["model"] == "RedHatAI/Llama-3.1-70B-Instruct-FP8"
    assert "still fails" not in r.expected, r.expected


def test_a_gguf_fallback_is_not_weighed_at_a_width_the_method_does_not_say():
    """Severity: medium (a false veto: a fallback that would run is refused, and the service gives up).
    Input: Llama-3.1-70B-Instruct in bf16 on one L40S (44.4 GiB), --max-model-len 4096: out of memory
    loading the weights; quantizedFallback a Q2_K GGUF of it (method gguf; the file is 26.4 GB, about
    24.6 GiB, with its embeddings quantized too).
    Now: gguf is not in model_weights.VARIABLE_WIDTH, so _cannot_fit weighs the model at 0.563 bytes a linear
    weight (39.85 GiB of weights on the GPU) and says no memory is left for the KV cache: Quantize
    refused, GiveUp. The real checkpoint leaves about 14 GiB for the cache at 0.9.
    Right: a GGUF's width is the file's quant type, which the method does not say (as for awq and gptq):
    not weighed, the named checkpoint is tried."""
    r = _weights_heal("NVIDIA-L40S", "--max-model-len 4096", "gguf", "/models/Llama-3.1-70B-Instruct-Q2_K.gguf")
    assert r.action == "Quantize", r.reason


def test_an_unweighed_fallback_has_no_verdict_of_the_width_it_was_not_weighed_at():
    """Severity: low (a contradictory report: the status and Event say the heal taken still fails).
    Input: as above on one H100, --max-model-len unset (131,072), quantizedFallback an AWQ checkpoint.
    Now: Quantize is planned unweighed (awq: VARIABLE_WIDTH), while its `expected`, from _expect, weighs
    the 4-bit guess and reads 'KV cache 31.52 GiB holds 103,280 tokens for max_model_len 131,072 (still
    fails: ...)'. The commit's comment says `expected` says the same as the veto.
    Right: where the width is not known, `expected` gives no verdict (or says the width is not known)."""
    r = _weights_heal("NVIDIA-H100-80GB-HBM3", "", "awq", "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4")
    assert r.action == "Quantize", r.reason
    assert "still fails" not in r.expected, r.expected


# --- 2. data and prefill context parallelism in extraArgs (0a74e75) ---------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--data_parallel_size=2"],
        ["--data-parallel-size-l", "2"],  # (argparse's abbreviation of --data-parallel-size-local)
        ["--data-parallel-si=2"],  # (ambiguous to argparse; refused either way)
        ["-dpl=2"],
        ["-d=2"],  # (Python 3.12.7+: an abbreviated single-dash option takes =value)
        ["-dp.x", "2"],  # (a dotted key)
        ["-pc", "2"],  # (argparse's abbreviation of -pcp)
        ["--prefill_context_parallel_size", "2"],
    ],
)
def test_every_spelling_of_the_gpu_multiplying_flags_is_refused(args):
    """Defended: each spelling vLLM 0.25's parser reads as -dp, -dpl or -pcp is refused in extraArgs."""
    assert extra_args_problems(args), args


@pytest.mark.parametrize(
    "args", [["--data-parallel-rank", "0"], ["-dpn", "0"], ["--data-parallel-start-rank=0"], ["-dcp", "2"]]
)
def test_flags_that_take_no_more_gpus_stay_accepted(args):
    """Defended: a data-parallel rank (bounded by the size, 1 here), and decode context parallelism (on the
    TP GPUs) take no GPU beyond TP x PP. (Nor do VLLM_DP_SIZE in spec.env, which starts only the
    data_parallel_size_local engines, one, nor a speculative draft's TP, 1 or the target's, nor the
    external_launcher backend, whose world is multiplied by a data-parallel size that stays 1.)"""
    assert extra_args_problems(args) == [], args


def test_serve_counts_the_gpus_prefill_context_parallelism_takes():
    """Severity: low (serve only: a heal sized from the free memory of fewer GPUs than vLLM used).
    Input: `serve` with extra flags `-pcp 2` (TP 1; accepted there: serve does not go through the CRD).
    Now: gpus_taken says 1; vLLM 0.25's ParallelConfig.world_size is TP x PP x prefill_context_parallel_size
    = 2, so serve reads the free memory of GPU 0 alone (another process on GPU 1 is not seen).
    Right: 2, as it counts -dp 2."""
    assert gpus_taken(parse_args("-dp 2").engine) == 2  # (data parallelism is counted)
    assert gpus_taken(parse_args("-pcp 2").engine) == 2


# --- 3. no reconcile for a metadata-only edit (e8ab4e7) ----------------------------------------------------


def _essence(spec: dict, labels: dict | None = None, annotations: dict | None = None) -> dict:
    meta = {k: v for k, v in (("labels", labels), ("annotations", annotations)) if v}
    return {"spec": spec, **({"metadata": meta} if meta else {})}


def test_only_an_edit_of_what_reconcile_reads_runs_one():
    """Defended: a label or another tool's annotation alone runs no reconcile; any spec change does, also
    one that comes with a label edit, and also one that a kopf retry sees again (the diffbase is stored
    only once the handler is done, so `old` stays the last handled spec). The operator's own annotations
    (its heal's, the deprecated model config) never were in kopf's essence (kopf drops the keys of its
    storage's prefix, the operator's group), so an edit of them alone ran no reconcile before either."""
    spec = {"model": "m", "engine": {"maxModelLen": 8192}}
    old = _essence(spec, {"team": "a"})
    assert not _changes_what_reconcile_reads(old=old, new=_essence(spec, {"team": "b"}))
    assert not _changes_what_reconcile_reads(old=old, new=_essence(spec, {"team": "a"}, {"argocd.argoproj.io/x": "1"}))
    edited = {"model": "m", "engine": {"maxModelLen": 4096}}
    assert _changes_what_reconcile_reads(old=old, new=_essence(edited, {"team": "a"}))
    assert _changes_what_reconcile_reads(old=old, new=_essence(edited, {"team": "b"}))
    assert _changes_what_reconcile_reads(old=_essence(spec), new=_essence({**spec, "replicas": 2}))


# --- 4. diagnose reads only the windows of a huge regular file (afd3575) ------------------------------------


def _cli(*args: str, stdin=None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=str(ROOT / "operator"))
    return subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        errors="replace",
        env=env,
        timeout=timeout,
    )


def test_stdin_at_an_offset_is_read_from_its_position(tmp_path):
    """Severity: medium (a wrong diagnosis of the run asked about, from the part of the file skipped).
    Input: a log file of 80 MiB and more holding two runs: the first ends in vLLM's KV refusal (the real
    H200 kvlen run, weights72.log), the second is a start that stopped on a port in use (port.log: not a
    memory failure). `diagnose -` is given the file on stdin, its offset at the second run's start, as
    `{ dd bs=1M skip=N count=0; vllm-autoheal diagnose -; } < vllm.log` or a wrapper that seeks leaves it.
    Now: log_file.windows reads 4 MiB from the position (the second run, to the end) and then seeks to
    st_size - 16 MiB, before the position: the first run's KV refusal is read too, and decides.
    Right: what the stream holds from its position is what is diagnosed, as for a pipe (here the second
    run alone: not_oom); the windows are taken within it (st_size less the position)."""
    first, second = (FAILURES / "weights72.log").read_bytes(), (FAILURES / "port.log").read_bytes()
    log = tmp_path / "vllm.log"
    with open(log, "wb") as f:
        f.write(b"INFO an earlier run's start\n")
        f.truncate(SOUGHT_ABOVE + 1)  # (sparse: its bytes are never read)
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + first)
        offset = f.tell()
        f.write(second)
    assert classify_stream(io.StringIO(second.decode())).cause == "not_oom"
    assert classify_stream(io.StringIO(first.decode())).cause == "kv_cache_insufficient"
    with open(log, "rb") as f:
        f.seek(offset)
        proc = _cli("diagnose", "--json", "-", stdin=f)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["cause"] == "not_oom"


def test_what_is_no_regular_file_is_read_through(tmp_path):
    """Defended: a FIFO, a /proc file (st_size 0) and a file below the bound are handed on as they are,
    never sought; so is a UTF-16 file (a seek may split a character). A UTF-8 BOM only opens the head,
    as it opens the whole file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'x\\n')"])
    try:
        with open(fifo, "rb") as f:
            assert windows(f, utf8=True) is f
    finally:
        writer.wait(timeout=30)
    with open("/proc/self/status", "rb") as f:
        assert windows(f, utf8=True) is f
    small = tmp_path / "small.log"
    small.write_bytes(b"\xef\xbb\xbfINFO hello\n")
    with open(small, "rb") as f:
        assert windows(f, utf8=True) is f
    big = tmp_path / "big.log"
    with open(big, "wb") as f:
        f.write(b"\xff\xfe")
        f.truncate(SOUGHT_ABOVE + 2)
    with open(big, "rb") as f:
        assert windows(f, utf8=False) is f


def test_a_node_log_of_short_records_keeps_the_figures_of_the_tail_window(tmp_path):
    """Severity: low (a figure of the tail window lost: a heal sized without vLLM's printed KV budget).
    Input: the real H200 KV refusal (kvlen.log) as the kubelet writes it (`<RFC 3339> stdout F <text>`), its
    start-up and its 'Available KV cache memory: 11.86 GiB' line 70 MiB of serving metrics apart, then 20
    MiB of records of empty lines (a process printing blank lines; 41 bytes a record) before the traceback.
    Now: read through, the classifier's 1 MiB tail window (counted in decoded characters) holds the 11.86
    GiB line; log_file.windows hands it only the last 16 MiB of raw bytes, about 400 K characters once the
    CRI prefixes are cut, and available_kv_gib is missing from the numbers.
    Right: the sought read gives what reading the file through gives (read back further, or through,
    where the tail decodes to less than the window)."""
    lines = (FAILURES / "kvlen.log").read_text().splitlines()
    stamp = "2026-12-02T06:04:24.123456789Z stdout F "
    metrics = (
        f"{stamp}(APIServer pid=7) INFO 12-02 06:05:00 [loggers.py:123] Engine 000: Avg prompt throughput: "
        "0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs\n"
    )
    log = tmp_path / "0.log"
    with open(log, "w") as f:
        f.writelines(f"{stamp}{line}\n" for line in lines[:28])
        f.write(metrics * (70 * 2**20 // len(metrics)))
        f.writelines(f"{stamp}{line}\n" for line in lines[28:30])
        f.write(f"{stamp}\n" * (20 * 2**20 // len(stamp + "\n")))
        f.writelines(f"{stamp}{line}\n" for line in lines[30:])
    assert log.stat().st_size > SOUGHT_ABOVE
    with open(log, encoding="utf-8", errors="replace") as f:
        whole = classify_stream(f)
    assert whole.cause == "kv_cache_insufficient" and whole.numbers["available_kv_gib"] == 11.86
    with open(log, "rb") as f:
        sought = classify_stream(io.TextIOWrapper(windows(f, utf8=True), encoding="utf-8", errors="replace"))
    assert (sought.cause, sought.numbers) == (whole.cause, whole.numbers)


def test_a_quantized_fallback_short_only_of_the_graphs_margin_is_not_refused():
    """At utilization 0.99 the fp8 checkpoint's weights and cache fit the H100 and only the CUDA graphs lack
    room outside the budget: that margin is another heal's (as for a split), so the fallback is not vetoed; its
    `expected` says what the memory model sees."""
    r = _weights_heal(
        "NVIDIA-H100-80GB-HBM3", "--max-model-len 8192 --gpu-memory-utilization 0.99", "fp8", "org/Llama-70B-FP8"
    )
    assert r.action == "Quantize" and "CUDA graphs" in r.expected, r.summary()
