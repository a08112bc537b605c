"""`serve MODEL [vLLM flags]`: a vLLM flag typed before MODEL is refused (exit 2) rather than guessed, since
argparse cannot know whether it takes a value; serve's own options still go anywhere, vLLM's after MODEL or
after `--`."""

from __future__ import annotations

import pytest

from vllm_autoheal import local
from vllm_autoheal.cli import main


def served(monkeypatch, argv: list[str]) -> tuple[int, list[local.ServeOptions]]:
    seen: list[local.ServeOptions] = []
    monkeypatch.setattr(local, "supervise", lambda opts: seen.append(opts) or 0)
    return main(argv), seen


@pytest.mark.parametrize(
    ("before", "named"),
    [
        (["--tokenizer", "org/tok"], "--tokenizer"),
        (["--tokenizer=org/tok"], "--tokenizer"),
        (["--enforce-eager"], "--enforce-eager"),  # (even one that takes no value: serve cannot tell)
        (["-O3"], "-O3"),
        (["--port", "9", "-tp", "2"], "-tp"),
    ],
)
def test_a_vllm_flag_before_model_is_refused_naming_it(before, named, monkeypatch, capsys):
    code, seen = served(monkeypatch, ["serve", *before, "meta-llama/X"])
    assert code == 2 and seen == []
    err = capsys.readouterr().err
    assert f"{named!r} comes before MODEL" in err and "after --" in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "9001", "--fresh", "m", "--tokenizer", "t"],
        ["serve", "--port=9001", "--history", "h.jsonl", "m", "--tokenizer", "t"],
        ["serve", "m", "--tokenizer", "t", "--port", "9001"],
        ["serve", "--once", "m", "--", "--tokenizer", "t"],
        ["serve", "--quantized-fallback", "q", "--quantized-fallback-method", "awq", "m", "--tokenizer", "t"],
    ],
)
def test_serves_own_options_before_model_still_work(argv, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, seen = served(monkeypatch, argv)
    assert code == 0 and seen[0].model == "m"
    extra = seen[0].spec.engine.extra_args
    assert extra[extra.index("--tokenizer") + 1] == "t"
