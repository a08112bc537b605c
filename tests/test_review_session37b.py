"""Hostile review (session 37b) of `serve --quantized-fallback`: the history file, the undo path after a
switch, max attempts with a fallback that also crashes, the gate, a fallback equal to the model, names and
secrets after a switch, and the options' refusals. Three defects, strict xfails when found, fixed the same
session: a record of the fallback under another method started it under that method; a hand-edited record
put the fallback's --quantization on the primary; a fallback equal to MODEL was accepted and never used.

Each serve run starts a fake `vllm.entrypoints.openai.api_server` on PYTHONPATH (the technique of
test_serve_quantized_fallback.py): it logs its argv, then, by the first rule whose flags match, serves
/health and completions (answering only the names vLLM would serve), prints the H100 weights-OOM start of
tests/fixtures/gpu/heal-runs/quantize-nvfp4.log and exits 1, or prints a given text and exits 1."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from samples import fake_vllm

RUNS = Path(__file__).parent / "fixtures" / "gpu" / "heal-runs"
CONFIGS = Path(__file__).parent / "fixtures" / "configs"
FIRST = re.split(r"^\[vllm-autoheal\] starting: .*$", (RUNS / "quantize-nvfp4.log").read_text(), flags=re.M)[1]
FIRST = "".join(line for line in FIRST.splitlines(True) if not line.startswith("[vllm-autoheal]"))
OPTIONS = ("--quantized-fallback", "L70-nvfp4", "--quantized-fallback-method", "compressed-tensors")
SERVE_FALLBACK = [{"when": {"--model": "L70-nvfp4"}, "do": "serve"}]
# serve's key for `serve L70 --enforce-eager` (the record's `key`), as it writes it
KEY = "L70 --gpu-memory-utilization 0.9 --tensor-parallel-size 1 --pipeline-parallel-size 1 --enforce-eager"
ENGINE = {"gpu_memory_utilization": 0.9, "tensor_parallel_size": 1, "pipeline_parallel_size": 1}
ENGINE |= {"enforce_eager": True, "extra_args": []}

FAKE = """
import http.server, json, sys
args = sys.argv[1:]
def flag(name):
    return args[args.index(name) + 1] if name in args else None
with open(ARGV, "a") as f:
    f.write(json.dumps(args) + "\\n")
for rule in json.load(open(RULES)):
    if all(flag(k) == v for k, v in rule["when"].items()):
        break
else:
    rule = {"do": "oom"}
if rule["do"] == "serve":
    named = [a.split("=", 1)[1] for a in args if a.startswith("--served-model-name=")]
    names = named or [flag("--served-model-name") or flag("--model")]
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def do_POST(self):
            asked = json.loads(self.rfile.read(int(self.headers["Content-Length"]))).get("model")
            ok = asked in names
            body = {"choices": [{"text": " world"}]} if ok else {"error": f"The model `{asked}` does not exist."}
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json"); self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(flag("--port"))), Handler).serve_forever()
sys.stdout.write(open(FIRST).read() if rule["do"] == "oom" else rule["text"])
sys.exit(1)
"""


def _serve(tmp: Path, rules: list, *options: str, model: str = "L70") -> subprocess.CompletedProcess:
    (tmp / "first.log").write_text(FIRST)
    (tmp / "rules.json").write_text(json.dumps(rules))
    head = "".join(f"{k} = {str(tmp / v)!r}\n" for k, v in (("FIRST", "first.log"), ("RULES", "rules.json"), ("ARGV", "argv.jsonl")))  # fmt: skip
    env, port = fake_vllm(tmp, head + textwrap.dedent(FAKE))
    return subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "serve", model, "--port", str(port), "--history",
         str(tmp / "history.jsonl"), "--once", "--startup-timeout", "60", "--enforce-eager", *options],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip


def _starts(tmp: Path) -> list[list[str]]:
    path = tmp / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _ours(proc: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[vllm-autoheal]"))


def _records(tmp: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp / "history.jsonl").read_text().splitlines()]


def test_a_fallback_record_under_another_method_does_not_start_it_with_that_method(tmp_path):
    """Severity: Medium.
    Input: `serve L70 --quantized-fallback L70-nvfp4 --quantized-fallback-method compressed-tensors` switched
    and served (serve's own healthy record: model L70-nvfp4, quantization compressed-tensors). The checkpoint
    at that path is re-exported by ModelOpt, and the user now runs the same command with
    `--quantized-fallback-method modelopt_fp4`.
    Now: "using the quantized fallback L70-nvfp4, which worked last time", then `starting: ... --model
    L70-nvfp4 ... --quantization compressed-tensors`: the history's method, not the one named. The key does
    not hold the fallback options, run_model compares only `model`, and remembered() lets `quantization`
    differ from the baseline it was given (it is in HEALABLE). running_shape then says the fallback does not
    run (engine.quantization != method), so a later OOM of it is weighed as the bf16 primary.
    Right: the record ran another checkpoint format than the options name: not used (say so, start the
    primary and heal afresh), or the fallback started with the method named now. The options are the
    consent and the declaration; the history must not override them."""
    first = _serve(tmp_path, SERVE_FALLBACK, *OPTIONS, "--fresh")
    assert first.returncode == 0, _ours(first)
    assert _records(tmp_path)[-1]["engine"]["quantization"] == "compressed-tensors"
    again = _serve(tmp_path, SERVE_FALLBACK, *OPTIONS[:3], "modelopt_fp4")
    started = [a for a in _starts(tmp_path)[2:] if _flag(a, "--model") == "L70-nvfp4"]
    assert all(_flag(a, "--quantization") == "modelopt_fp4" for a in started), _ours(again)


def test_a_hand_edited_record_cannot_put_the_fallbacks_method_on_the_primary(tmp_path):
    """Severity: Low (a hand-edited or hostile history; the hole predates the feature, but the feature is
    what made `quantization` a flag only a switch of model sets).
    Input: the history holds one healthy record of serve's key: model L70 (the primary, bf16) with engine
    quantization compressed-tensors; the options name the fallback L70-nvfp4 compressed-tensors.
    Now: "using the flags that worked last time ... --quantization compressed-tensors" and `starting: ...
    --model L70 ... --quantization compressed-tensors`: vLLM reads a bf16 checkpoint as compressed-tensors
    (it fails at start with no quantization config, a non-memory crash: a give-up on every run until
    --fresh).
    Right: serve_history's promise is that the file decides only what a heal may change, each inside the
    bounds; a heal changes quantization only together with the model (Quantize), so a record whose model is
    the primary but whose quantization is not the command line's is refused, as a foreign flag is."""
    record = {
        "key": KEY,
        "model": "L70",
        "event": "healthy",
        "engine": {**ENGINE, "quantization": "compressed-tensors"},
    }
    (tmp_path / "history.jsonl").write_text(json.dumps(record) + "\n")
    proc = _serve(tmp_path, [{"when": {}, "do": "serve"}], *OPTIONS)
    first = _starts(tmp_path)[0]
    assert not (_flag(first, "--model") == "L70" and _flag(first, "--quantization")), _ours(proc)


def test_a_fallback_equal_to_the_model_is_refused_naming_the_option(tmp_path):
    """Severity: Low.
    Input: `serve L70 --quantized-fallback L70 --quantized-fallback-method fp8` (a user who means vLLM's online
    FP8 of the same checkpoint), and L70's weights do not fit.
    Now: accepted; vLLM starts, runs out loading the weights, and serve exits 1 with "not healing: no allowed
    change is left for weights_load_oom within the bounds (tried: none)": the fallback the user consented
    to is silently never tried (resource_steps.quantized_model returns None when spec.model == fallback),
    and nothing says why.
    Right: exit 2 before vLLM starts, naming --quantized-fallback (it is MODEL itself, which a switch cannot
    reach; in a VLLMService the same equality means the switch already happened), or a switch that runs it
    with its method. Every other unusable combination of the options is refused this way."""
    proc = _serve(tmp_path, [], "--quantized-fallback", "L70", "--quantized-fallback-method", "fp8", "--fresh")
    refused = proc.returncode == 2 and "--quantized-fallback" in proc.stderr and not _starts(tmp_path)
    switched = any(_flag(a, "--quantization") == "fp8" for a in _starts(tmp_path))
    assert refused or switched, (proc.returncode, _ours(proc), proc.stderr[-500:])


# Attacks that were defended.

NOT_SUPPORTED = (
    "INFO 12-06 10:00:00 [model_runner.py:1] Starting to load model L70-nvfp4...\n"
    "ValueError: The quantization method compressed-tensors is not supported for the current GPU. "
    "Minimum capability: 100. Current capability: 90.\n"
)


def test_a_switch_that_made_it_worse_goes_back_to_the_primary_and_its_flags_once_secrets_hidden(tmp_path):
    """The fallback fails to start (not memory): serve undoes the switch (model AND flags), never switches
    again, gives up for the primary's own crash, and no --api-key/--hf-token value is printed or recorded."""
    rules = [{"when": {"--model": "L70-nvfp4"}, "do": "text", "text": NOT_SUPPORTED}]
    secrets = ("--api-key", "sk-SECRET-1", "--hf-token", "hf_SECRET_2")
    proc = _serve(tmp_path, rules, *OPTIONS, "--fresh", *secrets)
    starts = _starts(tmp_path)
    assert proc.returncode == 1 and [_flag(a, "--model") for a in starts] == ["L70", "L70-nvfp4"], _ours(proc)
    assert "made it worse" in proc.stdout and "tried: Quantize" in proc.stdout
    events = [(r["event"], r.get("action"), r["model"]) for r in _records(tmp_path)]
    assert events == [("heal", "Quantize", "L70"), ("undone", "Quantize", "L70-nvfp4"), ("gave_up", None, "L70")]
    assert _records(tmp_path)[-1]["engine"]["quantization"] is None  # (the primary's flags, not the switch's)
    assert "SECRET" not in proc.stdout + proc.stderr + (tmp_path / "history.jsonl").read_text()


def test_a_fallback_that_also_runs_out_never_switches_back_nor_restarts_the_same_flags(tmp_path):
    """Every start runs out of memory; max attempts 6 with TP and CPU offload allowed: after the switch every
    start is the fallback's, each with new flags, and serve gives up."""
    model = tmp_path / "L70 bf16"
    model.mkdir()
    shutil.copy(CONFIGS / "llama-3.1-70b.json", model / "config.json")
    options = ("--quantized-fallback", "FB", "--quantized-fallback-method", "awq", "--fresh", "--max-attempts", "6")
    proc = _serve(tmp_path, [], *options, "--max-cpu-offload-gb", "200", "--max-tensor-parallel-size", "2", model=str(model))  # fmt: skip
    starts = _starts(tmp_path)
    assert proc.returncode == 1 and "not healing" in proc.stdout, _ours(proc)
    assert _flag(starts[0], "--model") == str(model) and {_flag(a, "--model") for a in starts[1:]} == {"FB"}
    assert len({json.dumps(a) for a in starts}) == len(starts)


def test_a_fallback_whose_weights_do_not_fit_either_is_refused_naming_why(tmp_path):
    """DeepSeek-V3's shape at AWQ 4 bits on one 80 GB GPU: no switch, a give-up that says the fallback's
    weights do not fit; one start."""
    model = tmp_path / "dsv3"
    model.mkdir()
    shutil.copy(CONFIGS / "deepseek-v3.json", model / "config.json")
    options = ("--quantized-fallback", "FB", "--quantized-fallback-method", "awq", "--quantized-fallback-bits", "4")
    proc = _serve(tmp_path, [], *options, "--fresh", model=str(model))
    assert proc.returncode == 1 and len(_starts(tmp_path)) == 1, _ours(proc)
    assert "Quantize refused: the memory model says it still does not fit" in proc.stdout


@pytest.mark.parametrize("name", [(), ("--served-model-name", "llama"), ("--served-model-name=llama",)])
def test_once_after_a_switch_asks_for_the_served_name_and_the_keep_command_names_the_fallback(tmp_path, name):
    fallback = "my models/L70 nvfp4"
    rules = [{"when": {"--model": fallback}, "do": "serve"}]
    proc = _serve(tmp_path, rules, OPTIONS[0], fallback, *OPTIONS[2:], "--fresh", *name)
    assert proc.returncode == 0 and "completion ok" in proc.stdout, _ours(proc)
    assert "--model 'my models/L70 nvfp4'" in proc.stdout.split("to keep the healed flags, run:")[1]


@pytest.mark.parametrize(
    "record_model,key,options",
    [
        ("L70-nvfp4", KEY, ("--quantized-fallback", "other-awq", "--quantized-fallback-method", "awq")),
        ("L70-nvfp4", "L8 --enforce-eager", OPTIONS),
        (["L70-nvfp4"], KEY, OPTIONS),
    ],
)
def test_a_record_of_another_fallback_key_or_kind_does_not_start_it(tmp_path, record_model, key, options):
    record = {"key": key, "model": record_model, "event": "healthy", "engine": {**ENGINE, "quantization": "awq"}}
    (tmp_path / "history.jsonl").write_text("{broken\n" + json.dumps(record) + "\n")
    proc = _serve(tmp_path, [{"when": {}, "do": "serve"}], *options)
    assert _flag(_starts(tmp_path)[0], "--model") == "L70" and not _flag(_starts(tmp_path)[0], "--quantization")
    assert "Traceback" not in proc.stderr


def test_a_short_q_on_the_primary_does_not_follow_the_switch(tmp_path):
    proc = _serve(tmp_path, [{"when": {"--model": "FB"}, "do": "serve"}], "--quantized-fallback", "FB",
                  "--quantized-fallback-method", "awq", "--fresh", "-q", "fp8")  # fmt: skip
    assert proc.returncode == 0, _ours(proc)
    assert _starts(tmp_path)[-1].count("--quantization") == 1 and "fp8" not in _starts(tmp_path)[-1]
    before = len(_starts(tmp_path))
    glued = _serve(tmp_path, [], "-qfp8", *OPTIONS)  # (glued: refused before any start)
    assert glued.returncode == 2 and "-qfp8" in glued.stderr and len(_starts(tmp_path)) == before


@pytest.mark.parametrize(
    "options,named",
    [
        ((*OPTIONS[:3], "awq", "--quantized-fallback-group-size", "64"), "--quantized-fallback-group-size"),
        ((*OPTIONS[:3], "AWQ"), "--quantized-fallback-method"),
        (("--quantized-fallback", "", "--quantized-fallback-method", "awq"), "--quantized-fallback"),
        (("--quantized-fallback=--trust-remote-code", "--quantized-fallback-method", "awq"), "--quantized-fallback"),
        (("--quantized-fallback", "x" * 600, "--quantized-fallback-method", "awq"), "--quantized-fallback"),
        ((*OPTIONS[:3], "awq", "--quantized-fallback-bits", "1"), "--quantized-fallback-bits"),
        ((*OPTIONS[:3], "fp8", "--quantized-fallback-bits", "4"), "--quantized-fallback-bits"),
        ((*OPTIONS[:3], "awq", "--quantized-fallback-weight-type", "float"), "--quantized-fallback-weight-type"),
        (("--quantized-fallback-weight-type", "int"), "--quantized-fallback"),
    ],
)
def test_more_unusable_fallback_options_are_refused_naming_them(options, named, capsys):
    from vllm_autoheal.cli import main

    try:
        code = main(["serve", "m", "--python", "/nonexistent/python", *options])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and named in err and "Traceback" not in err and "nonexistent" not in err, err
