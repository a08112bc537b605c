"""A short alias (`-tp`, `-pp`, `-q`) is refused in extraArgs exactly where vLLM's parser would read it
as that flag: checked against argparse itself, with vLLM 0.32's single-dash options (its
FlexibleArgumentParser passes them to argparse as they are), on the Python that runs the tests. Before,
any token that began with `-p` was refused as pipeline parallelism, `-pcp 2` (prefill context
parallelism) among them, and the refusal named the wrong flag."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_autoheal.engine import BY_CLI, extra_args_problems, forbidden
from vllm_autoheal.flag_tokens import spelling_pattern

ROOT_FIXTURES = Path(__file__).parent / "fixtures"

# vLLM 0.32's single-dash options (engine/arg_utils.py) and what each sets
SHORT = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
}
# vLLM 0.32's single-dash switches (they take no value)
SWITCHES = {
    "-ep": "--enable-expert-parallel",
    "-dpe": "--data-parallel-external-lb",
    "-dph": "--data-parallel-hybrid-lb",
    "-dpm": "--data-parallel-multi-port-external-lb",
}
TOKENS = ["-t", "-tp", "-tp=8", "-t=8", "-tp8", "-tpx", "-p", "-pp", "-pp=2", "-pp2", "-pc", "-pcp", "-pcp=2",
          "-d", "-dp", "-dc", "-dcp", "-q", "-qawq", "-q=awq", "-qx", "-p=2", "-pc=2", "-d=2", "-dc=2",
          "-ep", "-ep=qawq", "-dpe=qfp8", "-dph=qawq", "-dpm=qawq", "-ep=q", "-ep=hq", "-dp=2"]  # fmt: skip


def argparse_from_3_12_7(parser: argparse.ArgumentParser) -> None:
    """Give an older Python's parser the single-dash reading of CPython gh-124345 (3.12.7, 3.13.0 and
    later; vLLM's images run Python 3.12): an abbreviated single-dash option takes `=value`, so `-t=8`
    is `-tp 8`. (Those versions also refuse a switch's `-ep=q…` instead of reading `-q`: not modelled.)"""
    older = parser._get_option_tuples

    def option_tuples(option_string):
        if option_string[1:2] not in ("-", "") and "=" in option_string:
            prefix, _, value = option_string.partition("=")
            return [
                (action, option, option_string[2:] if option == option_string[:2] else value)
                for option, action in parser._option_string_actions.items()
                if option == option_string[:2] or option.startswith(prefix)
            ]
        return older(option_string)

    parser._get_option_tuples = option_tuples


def vllms_reading(token: str, with_pcp: bool, newer: bool = False) -> str | None:
    """The long flag argparse reads a token as, among vLLM's single-dash options (None: no flag, or an error)."""
    parser = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    for short, long in SHORT.items():
        if with_pcp or short not in ("-pcp", "-dcp"):
            parser.add_argument(long, short, dest=long)
    for short, long in SWITCHES.items():
        parser.add_argument(long, short, dest=long, action="store_true", default=None)
    if newer and sys.version_info < (3, 12, 7):
        argparse_from_3_12_7(parser)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            known, _ = parser.parse_known_args([token, "1"] if "=" not in token and len(token) <= 4 else [token])
    except (argparse.ArgumentError, SystemExit):
        return None  # (ambiguous: vLLM refuses to start)
    read = [flag for flag, value in vars(known).items() if value is not None]
    return next((flag for flag in read if flag in BY_CLI), read[0] if read else None)


@pytest.mark.parametrize("newer", [False, True], ids=["python-3.11", "python-3.12.7+"])
@pytest.mark.parametrize("with_pcp", [False, True], ids=["before-pcp", "vllm-0.32"])
@pytest.mark.parametrize("token", TOKENS)
def test_a_short_token_is_refused_where_argparse_reads_it_as_a_typed_flag(token, with_pcp, newer):
    read = vllms_reading(token, with_pcp, newer)
    entry = forbidden(token)
    refused = entry.cli if entry else None
    if read is not None:  # a flag a heal sets or one reserved (more GPUs than the pod's): refused, naming it
        reserved = forbidden(read)  # (another flag of vLLM's: accepted)
        assert refused == (reserved.cli if reserved else None), (token, read, refused)
    # (read is None: vLLM refuses the token itself; refusing it here too, or not, loses nothing)


@pytest.mark.parametrize("token", TOKENS)
def test_the_crds_rule_and_the_python_check_agree(token):
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--quantization"):
        spellings = BY_CLI[flag].spellings
        matched = any(re.search(spelling_pattern(s), token) for s in spellings)
        assert matched == (forbidden(token) is BY_CLI[flag]), (token, flag)


DOTTED = ["--enforce-eager.x", "--enforce_eager.x=1", "--no-enforce-eager.x", "--enforce.x", "--served-model-name.x",
          "--api-key.x", "--hf-token.x", "--host.x", "--model.x", "--quantization.x", "--max-model-len.x"]  # fmt: skip


@pytest.mark.parametrize("token", DOTTED + ["-ep=qawq", "-dpm=q", "-t=8", "-t=2.5"])
def test_a_bypass_found_in_review_is_refused_by_both_checks(token):
    """Each was accepted by c824178 and is read by vLLM 0.32 as a typed or reserved flag (see
    test_the_real_vllm_parser_reads_each_bypass): a dotted key of a long flag sets it (a switch is
    switched on, a string flag takes the JSON text), `-ep=qawq` is `-ep -q awq` on Python 3.11,
    `-t=8` is `-tp 8` from Python 3.12.7 on."""
    entry = forbidden(token)
    assert entry is not None, token
    assert any(re.search(spelling_pattern(s), token) for s in entry.spellings), token


@pytest.mark.parametrize("token", ["--logging-config.formatter", "--compilation-config.mode", "-dcp=2", "-ep",
                                   "--enable-expert-parallel", "-dpa=10.0.0.1", "-dpr=1"])  # fmt: skip
def test_other_flags_stay_accepted(token):
    assert forbidden(token) is None, token


REAL_PARSER = """
import argparse, contextlib, io, json, logging, sys
logging.disable(logging.CRITICAL)
if sys.argv[1] == "newer":  # CPython gh-124345 (3.12.7+): an abbreviated single-dash option takes =value
    older = argparse.ArgumentParser._get_option_tuples
    def tuples(self, s):
        if s[1:2] not in ("-", "") and "=" in s:
            prefix, _, value = s.partition("=")
            return [(a, o, s[2:] if o == s[:2] else value) for o, a in self._option_string_actions.items()
                    if o == s[:2] or o.startswith(prefix)]
        return older(self, s)
    argparse.ArgumentParser._get_option_tuples = tuples
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
keys = ["tensor_parallel_size", "quantization", "enforce_eager", "served_model_name", "api_key", "hf_token", "host", "model"]
default = vars(parser.parse_args(["--model", "m"]))
out = []
for args in json.loads(sys.argv[2]):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ns = vars(parser.parse_args(["--model", "m", *args]))
        out.append({k: ns[k] for k in keys if ns[k] != default[k]})
    except SystemExit:
        out.append(None)
print(json.dumps(out))
"""


def real_vllm_reads(python: str, argparse_kind: str, cases: list[list[str]]) -> list[dict | None]:
    done = subprocess.run([python, "-c", REAL_PARSER, argparse_kind, json.dumps(cases)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_the_real_vllm_parser_reads_each_bypass(vllm_python):
    """vLLM 0.32's own API-server parser (python -m vllm.entrypoints.openai.api_server) on its Python 3.11,
    and with the single-dash reading of Python 3.12.7+: each bypass sets a flag extraArgs may not set."""
    cases = [["-ep=qawq"], ["-dpm=q", "awq"], ["--enforce-eager.x", "1"], ["--served-model-name.x", "y"],
             ["--api-key.x", "k"], ["--hf-token.x", "s"], ["-t=8"]]  # fmt: skip
    got = real_vllm_reads(vllm_python, "3.11", cases)
    assert got[0] == {"quantization": "awq"} and got[1] == {"quantization": "awq"}
    assert got[2] == {"enforce_eager": True}
    assert got[3] == {"served_model_name": ['{"x": "y"}']} and got[4] == {"api_key": ['{"x": "k"}']}
    assert got[5] == {"hf_token": '{"x": "s"}'}
    assert got[6] is None  # unrecognized on 3.11
    assert real_vllm_reads(vllm_python, "newer", [["-t=8"]]) == [{"tensor_parallel_size": 8}]
    for args in cases:
        assert extra_args_problems(args), args


def test_context_parallelism_is_not_read_as_pipeline_parallelism():
    """-pcp and -dcp start like -pp: neither is refused as pipelineParallelSize. Decode context parallelism
    runs on the TP GPUs (accepted); prefill context parallelism multiplies them (refused for its own
    reason, as data parallelism is)."""
    assert extra_args_problems(["-dcp", "2"]) == []
    for args in (["-pcp", "2"], ["-dp", "2"]):
        (problem,) = extra_args_problems(args)
        assert "pipelineParallelSize" not in problem and "makes vLLM take more" in problem
    assert "pipelineParallelSize" in extra_args_problems(["-pp", "2"])[0]
    assert "tensorParallelSize" in extra_args_problems(["-t", "2"])[0]


def test_plan_and_diagnose_refuse_a_short_prefix_they_would_not_size_from(tmp_path, capsys):
    """`-t 2` is read by vLLM as `-tp 2`: plan and diagnose --engine-args would size one GPU. Exit 2, naming it."""
    from vllm_autoheal.cli import main

    config = str(ROOT_FIXTURES / "configs" / "llama-3.1-8b.json")
    assert main(["plan", "--model-config", config, "--gpu", "NVIDIA-H100-80GB-HBM3", "-t", "2"]) == 2
    assert "spell it --tensor-parallel-size" in capsys.readouterr().err
    log = tmp_path / "oom.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    assert main(["diagnose", "--engine-args", "-t 2", str(log)]) == 2
    assert "spell it --tensor-parallel-size" in capsys.readouterr().err
