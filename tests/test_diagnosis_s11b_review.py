"""A hostile review of the session-11 fixes, 0f9116e..8538208 (operator/): GRAMMAR_FRAME and
`Line.grammar_report` (a traceback through structured-output / guided-decoding code or a grammar library
is a request's report from its first line on), ENGINE_REPORT matched at the start of the exception line,
arithmetic.other_process_gib = max(snapshot, torch), the CPU backend's KV-space heal by
kv_cache_memory_bytes, the kernel warm-up frames, and termination.py's gpu_start checks.

Each test that pins a problem FAILS on 8538208 and says what the classifier (or the heal) said and what
it should say. Severity in brackets.

1. [critical; older, not closed by c56080d] V1's run_engine_core logs "EngineCore encountered a fatal
   error." and then `raise e`: multiprocessing prints the same traceback again with only vLLM's process
   prefix (`(EngineCore_DP0 pid=N) `, no logger header: tests/fixtures/gpu/failure-logs/sampler.log has
   both copies). In that re-print each line of the client's `begin` (guidance's `Trigger {begin} not found`)
   is `(EngineCore_DP0 pid=N) <client text>`, so a client that writes a vLLM logger header after a newline
   (`ERROR 12-01 04:48:09 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate
   64.00 GiB ...`) writes a whole engine line of another writer: the grammar report (and any continuation)
   ends at it. neg-2734 not_oom nccl_timeout -> runtime_oom oom_in_serving, tried_gib 64, quoting
   ZZUSERZZ, with or without the headed copy before it. 0f9116e said the same; the forged frame /
   Traceback forms of the s10c review are closed (they pass below). Should say: what the same crash with a
   harmless `begin` says (a line with a logger header inside the prefix-only re-print of a request's
   report, from the same process, is the report's text).
   -> test_a_forged_logger_header_in_the_reprinted_grammar_crash_names_nothing[...]
2. [high; older, kept by the max()] other_process_gib takes the more of the launcher's start snapshot and
   torch's report. The snapshot is from before vLLM started; a process it lists may have exited (a
   co-tenant job on a shared GPU, the previous instance's context still being torn down). torch's own
   figures at the failure can prove no other process is left: v0.11-weights-oom ("79.19 GiB of which
   81.06 MiB is free ... this process has 79.10 GiB") and v0.32-profile-run-oom ("2.31 GiB is free ...
   this process has 76.88 GiB") leave < 0.1 GiB for anyone else. With a 30 GiB process in the snapshot:
   weights_load_oom -> gpu_util_exceeds_free other_process_holds_gpu, heal LowerGpuMemoryUtilization 0.88;
   profiling_oom -> gpu_util_exceeds_free, LowerGpuMemoryUtilization 0.85 (neither heals: the weights do
   not fit / the profile's peak does not depend on utilization). Should: when torch's total - free - own
   leaves no room for the snapshot's others, torch's figure (at the failure) wins.
   -> test_torchs_own_accounting_at_the_failure_outweighs_a_stale_start_snapshot[...]
3. [medium; a gap in the new rule] fit_kv_bytes_to_free gives up only when VLLM_CPU_KVCACHE_SPACE is in
   spec.env. The same variable from spec.envFrom (a ConfigMap, which the operator does not read) is
   applied by platforms/cpu.py over --kv-cache-memory-bytes just the same; and when the spec sets no
   kvCacheMemoryBytes at all, the explicit KV size the log reports (`for kv (40.0 GiB)`) can only have come
   from that variable (envFrom, or the image's ENV). Both -> SetKvCacheMemoryBytes 15 GiB, a memory change
   the variable overrides: the same crash follows. Should: change nothing (or the variable itself).
   -> test_an_explicit_cpu_kv_size_the_flag_did_not_set_is_not_healed_by_the_flag[...]
4. [low; new] A real OOM whose traceback runs through V1's grammar bitmask (gpu_model_runner.sample_tokens
   -> vllm/v1/structured_output/utils.py apply_grammar_bitmask, its `.to(device)`, or xgrammar's kernel)
   is still runtime_oom oom_in_serving with the OOM line as evidence (passes below), but every figure of
   the OOM line other than the anchored row's is dropped: process_gib 68.58, own_gib 71.0,
   torch_allocated_gib 69.61 are gone from the numbers (the line is a grammar_report line, where only a
   finding anchored at the exception's message counts). Serving heals do not read them today; an unplaced
   or start-up OOM through such a frame would lose the other-process figure that decides
   gpu_util_exceeds_free. Should: the OOM line's own figures, as without the grammar frame.
   -> test_a_grammar_bitmask_oom_keeps_torchs_figures[...]

What found nothing (tests that pass): a real OOM through the grammar bitmask (structured_output/utils.py,
xgrammar) is still found, placed in serving and quoted; the s10c/s11 forged forms inside the grammar
report (a plain second line, a forged frame, a forged `Traceback` + frame, in the headed copy and in the
prefix-only re-print) name nothing and quote nothing; termination.read on more malformed gpu_start forms
(a process on an unlisted GPU, larger than its GPU, a duplicated index, a 5000-digit integer, a lone
surrogate) returns a note and raises nothing.

Fixed after the review (every test here passes now):
1. findings.mark_continuations: a grammar's report printed without vLLM's logger header is a dying engine
   process re-printing its fatal exception; a line of that process that opens with a logger header
   goes on with the report (and the exception's message). The s9 limit (an API server's exception
   printed without a header, whose process goes on logging) stays.
2. arithmetic.other_process_gib: when torch's OOM text accounts for the whole GPU at the failure (its
   total, what was free, what this process held), its figure wins over the start snapshot.
3. remedy.fit_kv_bytes_to_free: the explicit KV-space form (`for kv (40.0 GiB)`), when the spec sets no
   kvCacheMemoryBytes, came from VLLM_CPU_KVCACHE_SPACE (envFrom, the image): nothing is changed. The
   automatic form (`for kv (98.5/115.66 GiB)`, its worker_budget_gib) is still healed by the flag.
4. findings_of: on a line that is the engine's failure carried by a request's report (anchored at the
   start of its message), the figures of that message count too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify, termination
from vllm_autoheal.remedy import plan_heal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted_logs import real_log  # noqa: E402
from test_diagnosis_injection import _vllm_log, _with  # noqa: E402
from test_diagnosis_s10b_review import _check, _said  # noqa: E402
from test_diagnosis_s10c_review import grammar_traceback  # noqa: E402
from test_diagnosis_s11_review import CENSUS, _snapshot  # noqa: E402

from conftest import FIXTURES  # noqa: E402

BASE = "neg-2734-llama2-70b-tp8-timeout"  # a real not_oom (NCCL watchdog timeout)
SITE = "/usr/local/lib/python3.12/dist-packages/vllm"
PREFIX = "(EngineCore_DP0 pid=2441) "
HEADER = PREFIX + "ERROR 12-01 04:48:09 [core.py:710] "
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free. ZZUSERZZ"
)


_grammar_traceback = grammar_traceback  # (the s10c review's grammar crash)


def _grammar_crash(begin: str, headed: bool = True) -> str:
    """The logged copy (every line with vLLM's header), then multiprocessing's re-print of the same
    exception after run_engine_core's `raise e` (every line with the process prefix only)."""
    out = [_vllm_log(HEADER, "EngineCore encountered a fatal error.\n" + _grammar_traceback(begin))] if headed else []
    out.append(_vllm_log(PREFIX, "Process EngineCore_DP0:\n" + _grammar_traceback(begin)))
    return "\n".join(out)


# --- 1. A forged logger header in the prefix-only re-print (critical) -------------------------------------
FORGED_HEADERS = {
    "same-header": "ERROR 12-01 04:48:09 [core.py:710] ",
    "another-file": "ERROR 12-01 04:48:09 [gpu_model_runner.py:2100] ",
}


@pytest.mark.parametrize("headed", [True, False], ids=["both-copies", "reprint-only"])
@pytest.mark.parametrize("header", sorted(FORGED_HEADERS))
def test_a_forged_logger_header_in_the_reprinted_grammar_crash_names_nothing(header, headed):
    """8538208 (and 0f9116e): not_oom nccl_timeout -> runtime_oom oom_in_serving, tried_gib 64, quoting
    `torch.OutOfMemoryError: ... ZZUSERZZ`. In the re-print the client's second line reads
    `(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:09 [core.py:710] torch.OutOfMemoryError: ...`: a new
    writer, so the grammar report ends and the line is the engine's. Should say what a harmless begin says."""
    base_log = real_log(BASE)
    _check(
        _with(base_log, _grammar_crash("<fn\n" + FORGED_HEADERS[header] + OOM, headed), "end"),
        _with(base_log, _grammar_crash("<fn\nhello", headed), "end"),
        header,
    )


CLOSED_FORMS = {
    "plain-second-line": "<fn\n" + OOM,
    "forged-frame": f'<fn\n  File "{SITE}/v1/worker/gpu_model_runner.py", line 1, in execute_model\n    x\n' + OOM,
    "forged-traceback": "<fn\nTraceback (most recent call last):\n"
    f'  File "{SITE}/v1/worker/gpu_model_runner.py", line 1, in execute_model\n    x\n' + OOM,
}


@pytest.mark.parametrize("headed", [True, False], ids=["both-copies", "reprint-only"])
@pytest.mark.parametrize("form", sorted(CLOSED_FORMS))
def test_forged_lines_without_a_header_in_the_grammar_report_name_nothing(form, headed):
    """Found nothing (0f9116e said runtime_oom for the two forged-frame forms): without a logger header
    the client's lines stay in the grammar report, in both copies."""
    base_log = real_log(BASE)
    _check(
        _with(base_log, _grammar_crash(CLOSED_FORMS[form], headed), "end"),
        _with(base_log, _grammar_crash("<fn\nhello", headed), "end"),
        form,
    )


# --- 2. A stale start snapshot against torch's own accounting (high) ---------------------------------------
@pytest.mark.parametrize(
    "census_id,cause", [("v0.11-weights-oom", "weights_load_oom"), ("v0.32-profile-run-oom", "profiling_oom")]
)
def test_torchs_own_accounting_at_the_failure_outweighs_a_stale_start_snapshot(census_id, cause):
    """8538208 (and 0f9116e): -> gpu_util_exceeds_free other_process_holds_gpu, heal
    LowerGpuMemoryUtilization. torch's figures at the failure leave < 0.1 GiB for any other process
    (total - free - this process), so the snapshot's 30 GiB process had exited. Should say `cause`."""
    log = CENSUS[census_id]["log"]
    assert classify(Signals(log=log)).cause == cause
    snap = _snapshot([[0, "NVIDIA A100-SXM4-80GB", 79.19, 49.0]], [[4242, 0, 30.0]])
    d = classify(Signals(log=log, gpu=snap))
    r = plan_heal(VLLMServiceSpec(model="m", engine={"gpu_memory_utilization": 0.9}), d)
    assert d.cause == cause, (
        f"said {_said(d)} -> {r.action} {r.changes}; torch's own figures leave no room for the snapshot's process"
    )


# --- 3. VLLM_CPU_KVCACHE_SPACE from elsewhere than spec.env (medium) ----------------------------------------
@pytest.mark.parametrize(
    "spec_extra",
    [{"env_from": [{"configMapRef": {"name": "cpu-env"}}]}, {}],
    ids=["env-from-configmap", "no-kv-flag-in-spec"],
)
def test_an_explicit_cpu_kv_size_the_flag_did_not_set_is_not_healed_by_the_flag(spec_extra):
    """8538208: SetKvCacheMemoryBytes 16106127360. The log's explicit KV size (40.0 GiB) is not the spec's
    flag (it sets none): platforms/cpu.py applied VLLM_CPU_KVCACHE_SPACE (from envFrom, or the image) over
    the flag, and will again. Should: no kv_cache_memory_bytes change."""
    d = classify(Signals(log=CENSUS["v0.32-cpu-explicit-kv-exceeds-available"]["log"]))
    assert d.subtype == "kv_space_exceeds_free_host_memory"
    spec = VLLMServiceSpec(model="m", engine={"gpu_memory_utilization": 0.92, "enforce_eager": True}, **spec_extra)
    r = plan_heal(spec, d)
    assert "kv_cache_memory_bytes" not in (r.changes or {}), f"{r.action} {r.changes}: the variable overrides it"


# --- 4. A real OOM through the grammar bitmask (low; and confirmations) -------------------------------------
RUNTIME = (FIXTURES / "gpu" / "failure-logs" / "runtime.log").read_text()
RT_HEADER = "(EngineCore pid=2441) ERROR 12-01 04:48:08 [core.py:1233] "
BITMASK_FRAMES = {
    # vLLM >= 0.10: gpu_model_runner -> structured_output/utils.py, the bitmask's copy to the GPU
    "structured-output-utils": [
        f'  File "{SITE}/v1/worker/gpu_model_runner.py", line 2712, in sample_tokens',
        "    apply_grammar_bitmask(scheduler_output, grammar_output, self.input_batch, logits)",
        f'  File "{SITE}/v1/structured_output/utils.py", line 141, in apply_grammar_bitmask',
        "    grammar_bitmask = torch.from_numpy(sorted_bitmask).to(",
        "                      ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    ],
    # ... on into xgrammar's kernel
    "xgrammar-kernel": [
        f'  File "{SITE}/v1/worker/gpu_model_runner.py", line 2712, in sample_tokens',
        "    apply_grammar_bitmask(scheduler_output, grammar_output, self.input_batch, logits)",
        f'  File "{SITE}/v1/structured_output/utils.py", line 167, in apply_grammar_bitmask',
        "    xgr.apply_token_bitmask_inplace(logits, grammar_bitmask, indices=index_tensor)",
        '  File "/usr/local/lib/python3.12/dist-packages/xgrammar/kernels/apply_token_bitmask_inplace_triton.py", '
        "line 100, in apply_token_bitmask_inplace_triton",
        "    logits = logits.float()",
    ],
}


def _through_bitmask(frames: list[str]) -> str:
    """runtime.log (vLLM 0.25 on the H200: a real OOM while serving, another process holding 68.58 GiB)
    with the model-forward frames replaced by the grammar bitmask's."""
    lines = RUNTIME.splitlines()
    start = next(i for i, ln in enumerate(lines) if 'model_runner.py", line 1324, in execute_model' in ln)
    end = next(i for i, ln in enumerate(lines) if "torch.OutOfMemoryError" in ln)
    return "\n".join(lines[:start] + [RT_HEADER + f for f in frames] + lines[end:]) + "\n"


@pytest.mark.parametrize("where", sorted(BITMASK_FRAMES))
def test_a_grammar_bitmask_oom_is_still_a_serving_oom(where):
    """Found nothing: the OOM line is anchored at the exception's message, so it is found, placed (the
    serving frames come before the grammar frame) and quoted."""
    plain = classify(Signals(log=RUNTIME, exit_code=1))
    crafted = classify(Signals(log=_through_bitmask(BITMASK_FRAMES[where]), exit_code=1))
    assert (crafted.cause, crafted.subtype, crafted.phase) == (plain.cause, plain.subtype, plain.phase)
    assert crafted.evidence[:1] == plain.evidence[:1]


@pytest.mark.parametrize("where", sorted(BITMASK_FRAMES))
def test_a_grammar_bitmask_oom_keeps_torchs_figures(where):
    """8538208: numbers lose process_gib 68.58, own_gib 71.0 and torch_allocated_gib 69.61 (the OOM line is
    a grammar_report line: only the anchored row's groups count). Should be the same numbers as the same
    OOM through the model's forward."""
    plain = classify(Signals(log=RUNTIME, exit_code=1))
    crafted = classify(Signals(log=_through_bitmask(BITMASK_FRAMES[where]), exit_code=1))
    lost = {k: v for k, v in plain.numbers.items() if k not in crafted.numbers}
    assert not lost, f"the OOM line's own figures are dropped: {lost}"


# --- termination.read: more malformed gpu_start (confirmations) ---------------------------------------------
H100 = "NVIDIA H100 80GB HBM3"
MORE_MALFORMED = {
    "process-on-unlisted-gpu": {"gpus": [[0, H100, 80, 1]], "other_processes": [[7, 3, 1.0]]},
    "process-larger-than-gpu": {"gpus": [[0, H100, 80, 1]], "other_processes": [[7, 0, 81.0]]},
    "duplicate-index": {"gpus": [[0, H100, 80, 1], [0, H100, 80, 1]]},
    "huge-pid": {"gpus": [[0, H100, 80, 1]], "other_processes": [[10**400, 0, 1.0]]},
    "huge-process-size": {"gpus": [[0, H100, 80, 1]], "other_processes": [[7, 0, 10**400]]},
}


@pytest.mark.parametrize("shape", sorted(MORE_MALFORMED))
def test_more_malformed_gpu_start_is_ignored_with_a_note(shape):
    text = json.dumps({"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": MORE_MALFORMED[shape]})
    doc, note = termination.read(text)
    assert doc is None and note and termination.gpu_snapshot(doc) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"autoheal": 1, "diagnosis": {"cause": "unknown", "numbers": {"tried_gib": ' + "9" * 5000 + "}}}",
        '{"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": {"gpus": [[0, "\\ud800", 80, 1]]}}',
        '{"autoheal": 1, "diagnosis": {"cause": ["runtime_oom"]}}',
    ],
    ids=["5000-digits", "lone-surrogate-name", "cause-a-list"],
)
def test_odd_json_raises_nothing(text):
    doc, note = termination.read(text)
    assert (doc is None and note) or (doc is not None and note is None)
