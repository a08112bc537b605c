"""The engine's report on compiling a request's grammar (xgrammar's traceback, logged and re-printed
without a prefix) is the request's text: a forged header, record, prefix or frame inside it names
nothing, while a real OOM in the grammar bitmask is still a serving OOM with torch's figures."""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis import log_records as lr

from conftest import FIXTURES
from crafted.bases import BASE, OOM, real_log, with_lines
from crafted.checks import assert_reads_like
from crafted.grammar import FRAME, SITE, assert_json_reads_like, grammar_crash, grammar_traceback
from crafted.records import record

# --- A forged logger header in the prefix-only re-print -------------------------------------
FORGED_HEADERS = {
    "same-header": "ERROR 12-01 04:48:09 [core.py:710] ",
    "another-file": "ERROR 12-01 04:48:09 [gpu_model_runner.py:2100] ",
}


@pytest.mark.parametrize("headed", [True, False], ids=["both-copies", "reprint-only"])
@pytest.mark.parametrize("header", sorted(FORGED_HEADERS))
def test_a_forged_logger_header_in_the_reprinted_grammar_crash_names_nothing(header, headed):
    """Unfixed: not_oom nccl_timeout -> runtime_oom oom_in_serving, tried_gib 64, quoting
    `torch.OutOfMemoryError: ... ZZUSERZZ`. In the re-print the client's second line reads
    `(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:09 [core.py:710] torch.OutOfMemoryError: ...`: a new
    writer, so the grammar report ends and the line is the engine's. Should say what a harmless begin says."""
    base_log = real_log(BASE)
    assert_reads_like(
        with_lines(base_log, grammar_crash("<fn\n" + FORGED_HEADERS[header] + OOM, headed), "end"),
        with_lines(base_log, grammar_crash("<fn\nhello", headed), "end"),
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
    """Without a logger header
    the client's lines stay in the grammar report, in both copies."""
    base_log = real_log(BASE)
    assert_reads_like(
        with_lines(base_log, grammar_crash(CLOSED_FORMS[form], headed), "end"),
        with_lines(base_log, grammar_crash("<fn\nhello", headed), "end"),
        form,
    )


# --- A real OOM through the grammar bitmask (and confirmations) -------------------------------------
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
    """The OOM line is anchored at the exception's message, so it is found, placed (the
    serving frames come before the grammar frame) and quoted."""
    plain = classify(Signals(log=RUNTIME, exit_code=1))
    crafted = classify(Signals(log=_through_bitmask(BITMASK_FRAMES[where]), exit_code=1))
    assert (crafted.cause, crafted.subtype, crafted.phase) == (plain.cause, plain.subtype, plain.phase)
    assert crafted.evidence[:1] == plain.evidence[:1]


@pytest.mark.parametrize("where", sorted(BITMASK_FRAMES))
def test_a_grammar_bitmask_oom_keeps_torchs_figures(where):
    """Unfixed: numbers lose process_gib 68.58, own_gib 71.0 and torch_allocated_gib 69.61 (the OOM line is
    a grammar_report line: only the anchored row's groups count). Should be the same numbers as the same
    OOM through the model's forward."""
    plain = classify(Signals(log=RUNTIME, exit_code=1))
    crafted = classify(Signals(log=_through_bitmask(BITMASK_FRAMES[where]), exit_code=1))
    lost = {k: v for k, v in plain.numbers.items() if k not in crafted.numbers}
    assert not lost, f"the OOM line's own figures are dropped: {lost}"


FORGED_TRACEBACK = "Traceback (most recent call last):\n" + FRAME + OOM


# --- A shortened record loses its grammar frames ---------------------------------------
@pytest.mark.parametrize("short_lines", [100, 300, 1000, 5000])
def test_a_shortened_record_keeps_the_grammar_report_it_opened(short_lines):
    """Unfixed: not_oom other_error -> weights_load_oom oom_in_load, quoting `torch.OutOfMemoryError: ...
    ZZUSERZZ not found in triggers`. The logged record prints as `EngineCore encountered a fatal error.`,
    `[...]`, then the client's last lines: its forged traceback, under `ERROR [core.py:0]`. (20 short lines
    fit the budget: not_oom.) Should say what a harmless begin of as many lines says."""
    filler = "aaaaaaaaaa\n" * short_lines
    printed = lr.render(record("EngineCore encountered a fatal error.", grammar_traceback("<fn\n" + filler + "z")))
    assert printed is not None and (short_lines < 1000 or any(p.endswith(lr.GAP) for p in printed))
    assert_json_reads_like(
        "<fn\n" + filler + FORGED_TRACEBACK, "<fn\n" + filler + "hello", True, f"{short_lines} lines"
    )


# --- A forged process prefix in a prefix-less re-print -------------------------------
FORGED_PREFIXED = "<fn\n(EngineCore pid=2441) ERROR 12-01 04:48:09 [core.py:710] " + OOM


def test_a_forged_process_prefix_in_a_prefixless_reprint_names_nothing_text():
    """Unfixed: neg-2734 not_oom -> runtime_oom oom_in_serving, quoting ZZUSERZZ."""
    base_log = real_log(BASE)
    reprint = lambda begin: "Process EngineCore:\n" + grammar_traceback(begin)  # noqa: E731
    assert_reads_like(
        with_lines(base_log, reprint(FORGED_PREFIXED), "end"),
        with_lines(base_log, reprint("<fn\nhello"), "end"),
        "text",
    )


@pytest.mark.parametrize("logged", [True, False], ids=["logged-and-reprint", "reprint-only"])
def test_a_forged_process_prefix_in_a_prefixless_reprint_names_nothing_json(logged):
    """Unfixed: not_oom other_error -> weights_load_oom oom_in_load, quoting ZZUSERZZ."""
    assert_json_reads_like(FORGED_PREFIXED, "<fn\nhello", logged, "json")


@pytest.mark.parametrize("shape", ["reprint-without-prefix", "headed-and-prefixed-reprint"])
def test_many_blank_lines_do_not_push_the_grammar_frames_out_of_the_raw_tail(shape):
    """Unfixed: neg-2734 not_oom -> runtime_oom oom_in_serving, quoting ZZUSERZZ. (10 blank
    lines: not_oom.)"""
    base_log = real_log(BASE)

    def crash(begin: str) -> str:
        if shape == "reprint-without-prefix":
            return "Process EngineCore_DP0:\n" + grammar_traceback(begin)
        return grammar_crash(begin, headed=True)

    blank = "<fn" + "\n" * 3000
    assert_reads_like(
        with_lines(base_log, crash(blank + FORGED_TRACEBACK), "end"),
        with_lines(base_log, crash(blank + "hello"), "end"),
        shape,
    )


@pytest.mark.parametrize("headed", [True, False], ids=["both-copies", "reprint-only"])
def test_a_logging_prefix_a_client_establishes_in_the_grammar_crash_names_nothing(headed):
    """The client's `ZZ ERROR ... [core.py:710]` lines make `ZZ ` the logging prefix; once cut, the lines
    carry the dying process's prefix and a header: the dying rule holds them."""
    base_log = real_log(BASE)
    flood = "\n".join(f"ZZ ERROR 12-01 04:48:09 [core.py:710] line {i}" for i in range(300))
    crafted = "<fn\n" + flood + "\nZZ ERROR 12-01 04:48:09 [core.py:710] " + OOM
    assert_reads_like(
        with_lines(base_log, grammar_crash(crafted, headed), "end"),
        with_lines(base_log, grammar_crash("<fn\n" + flood + "\nhello", headed), "end"),
        "zz",
    )
