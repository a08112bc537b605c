"""A short alias (`-tp`, `-pp`, `-q`) is refused in extraArgs exactly where vLLM's parser would read it
as that flag: checked against argparse itself, with vLLM 0.32's single-dash options (its
FlexibleArgumentParser passes them to argparse as they are), on the Python that runs the tests. Before,
any token that began with `-p` was refused as pipeline parallelism, `-pcp 2` (prefill context
parallelism) among them, and the refusal named the wrong flag."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from vllm_autoheal.engine import BY_CLI, extra_args_problems, forbidden, spelling_pattern

# vLLM 0.32's single-dash options (engine/arg_utils.py) and what each sets
SHORT = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
}
TOKENS = ["-t", "-tp", "-tp=8", "-t=8", "-tp8", "-tpx", "-p", "-pp", "-pp=2", "-pp2", "-pc", "-pcp", "-pcp=2",
          "-d", "-dp", "-dc", "-dcp", "-q", "-qawq", "-q=awq", "-qx"]  # fmt: skip


def vllms_reading(token: str, with_pcp: bool) -> str | None:
    """The long flag argparse reads a token as, among vLLM's single-dash options (None: no flag, or an error)."""
    parser = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    for short, long in SHORT.items():
        if with_pcp or short not in ("-pcp", "-dcp"):
            parser.add_argument(long, short, dest=long)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            known, _ = parser.parse_known_args([token, "1"] if "=" not in token and len(token) <= 4 else [token])
    except (argparse.ArgumentError, SystemExit):
        return None  # (ambiguous: vLLM refuses to start)
    return next((flag for flag, value in vars(known).items() if value is not None), None)


@pytest.mark.parametrize("with_pcp", [False, True], ids=["before-pcp", "vllm-0.32"])
@pytest.mark.parametrize("token", TOKENS)
def test_a_short_token_is_refused_where_argparse_reads_it_as_a_typed_flag(token, with_pcp):
    read = vllms_reading(token, with_pcp)
    entry = forbidden(token)
    refused = entry.cli if entry else None
    if read in BY_CLI:  # a flag a heal sets: refused, naming it
        assert refused == read, (token, read, refused)
    elif read is not None:  # another flag of vLLM's: accepted
        assert refused is None, (token, read, refused)
    # (read is None: vLLM refuses the token itself; refusing it here too, or not, loses nothing)


@pytest.mark.parametrize("token", TOKENS)
def test_the_crds_rule_and_the_python_check_agree(token):
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--quantization"):
        spellings = BY_CLI[flag].spellings
        matched = any(re.search(spelling_pattern(s), token) for s in spellings)
        assert matched == (forbidden(token) is BY_CLI[flag]), (token, flag)


def test_prefill_context_parallelism_is_accepted_and_pipeline_parallelism_refused():
    assert extra_args_problems(["-pcp", "2", "-dcp", "2", "-dp", "2"]) == []
    assert "pipelineParallelSize" in extra_args_problems(["-pp", "2"])[0]
    assert "tensorParallelSize" in extra_args_problems(["-t", "2"])[0]
