"""`serve --quantized-fallback`: the local supervisor switches to the quantized checkpoint the options name
when the weights do not fit, weighed before the switch as the operator's heal weighs spec.heal.quantizedFallback.

The GPU run (tests/gpu/heal_runs.sh quantize-nvfp4, session 37, one H100 80GB, real vLLM 0.25, dummy
weights): Llama-3.1-70B in bf16 ran out of memory loading its weights; serve switched to its NVFP4 checkpoint
(compressed-tensors, 4 bits, float) with max_model_len 93,792 in the same restart (predicted before the run:
a KV cache of 29.51 GiB holding 96,704 tokens), and vLLM started with 29.41 GiB and 96,367 tokens (1.03x
concurrency for that context) and answered a completion. The same start with AutoAWQ's 4-bit checkpoint
(awq_marlin, bits 4, groups of 128, run on Machete): max_model_len 100,128 predicted with 31.50 GiB and 103,232
tokens; vLLM held 31.47 GiB and 103,104 tokens (37.88 GiB of weights), and served. Here: that decision replanned from the run's own
output, and the supervisor's switch, its history and its undo replayed by a child that prints that output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import GpuInfo, GpuSnapshot, Signals, classify
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_weights import weights_gib_to_diagnose
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.remedy.model import fallback_shape
from vllm_autoheal.vllm_release import parse_version

from samples import OPENAI_HANDLER, config_shape, fake_vllm

RUNS = Path(__file__).parent / "fixtures" / "gpu" / "heal-runs"
H100 = GpuSnapshot(gpus=[GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=85017493504)])
FALLBACK = {"allowed": True, "model": "L70-nvfp4", "method": "compressed-tensors", "bits": 4, "weightType": "float"}
AWQ = {"allowed": True, "model": "L70-awq", "method": "awq_marlin", "bits": 4, "groupSize": 128}
# Each H100 run: the fallback its options named, the switch serve made, the kernel vLLM then built
GPU_RUNS = {
    "quantize-nvfp4": (FALLBACK, 93792, "quantization=compressed-tensors", "MarlinNvFp4LinearKernel"),
    "quantize-awq": (AWQ, 100128, "quantization=auto_awq", "MacheteLinearKernel"),
}


def _starts(name: str) -> list[str]:
    return re.split(r"^\[vllm-autoheal\] starting: .*$", (RUNS / f"{name}.log").read_text(), flags=re.M)[1:]


STARTS = _starts("quantize-nvfp4")


def _printed(text: str, pattern: str) -> float:
    return float(re.search(pattern, text)[1].replace(",", ""))


@pytest.mark.parametrize("name", sorted(GPU_RUNS))
def test_the_h100_run_switched_once_and_served(name):
    ours = re.findall(r"^\[vllm-autoheal\] (.*)$", (RUNS / f"{name}.log").read_text(), re.M)
    assert sum(x.startswith("healed weights_load_oom") for x in ours) == 1
    assert any(x.startswith("healthy: ") and "after 1 restart(s)" in x for x in ours)
    assert any(x.startswith("completion ok") for x in ours)
    _, _, method, kernel = GPU_RUNS[name]
    assert method in _starts(name)[1] and kernel in _starts(name)[1]


@pytest.mark.parametrize("name", sorted(GPU_RUNS))
def test_the_switch_is_planned_from_the_runs_own_output_as_it_healed(name):
    """The first start's output, classified with the model's shape (the weights serve reads from its
    folder), and planned with the card's total: the same switch, and the figures vLLM then printed."""
    fallback, length, _, _ = GPU_RUNS[name]
    starts = _starts(name)
    shape, engine = config_shape("llama-3.1-70b"), parse_args("--enforce-eager --load-format dummy").engine
    diag = classify(
        Signals(
            log=starts[0],
            exit_code=1,
            ready_before=False,
            gpu=H100,
            weights_gib_per_gpu=weights_gib_to_diagnose(shape, engine),
        )
    )
    assert diag.cause == "weights_load_oom", (diag.cause, diag.evidence)
    spec = VLLMServiceSpec(model="L70", engine=engine, heal={"quantizedFallback": fallback})
    inv = Inventory(gpu_total_gib=79.18, gpu_free_gib=79.18, shape=shape, release=parse_version("0.25.0"))
    remedy = plan_heal(spec, diag, inventory=inv)
    assert remedy.action == "Quantize", remedy.summary()
    assert remedy.changes == {"model": fallback["model"], "quantization": fallback["method"], "max_model_len": length}
    healed = remedy.apply(engine)
    weighed = fallback_shape(spec.heal, shape)
    est = estimate(weighed, healed, lookup("NVIDIA-H100-80GB-HBM3"), None, "server", parse_version("0.25.0"))
    assert est.weights_gib == pytest.approx(_printed(starts[1], r"Model loading took ([\d.]+) GiB"), abs=0.2)
    assert est.kv_cache_gib == pytest.approx(_printed(starts[1], r"Available KV cache memory: ([\d.]+) GiB"), rel=0.01)
    tokens = _printed(starts[1], r"GPU KV cache size: ([\d,]+) tokens")
    assert tokens >= length and est.max_model_len_fit == pytest.approx(tokens, rel=0.01)


# The child: started with the bf16 model it prints the H100 run's first start (the weights OOM) and exits 1;
# with the fallback and --quantization compressed-tensors it serves /health and a completion.
FAKE_VLLM = """
import http.server, json, sys
args = sys.argv[1:]
def flag(name):
    return args[args.index(name) + 1] if name in args else None
if flag("--model") == "L70-nvfp4" and flag("--quantization") == "compressed-tensors":
    port = int(flag("--port"))
{handler}
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
sys.stdout.write(open(FIRST).read())
sys.exit(1)
""".replace("{handler}", textwrap.indent(OPENAI_HANDLER, "    "))


def _serve(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    (tmp_path / "first.log").write_text(STARTS[0])
    source = f"FIRST = {str(tmp_path / 'first.log')!r}\n" + textwrap.dedent(FAKE_VLLM)
    env, port = fake_vllm(tmp_path, source)
    return subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "serve", "L70", "--port", str(port), "--history",
         str(tmp_path / "history.jsonl"), "--once", "--startup-timeout", "60", "--enforce-eager", *options],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip


OPTIONS = ("--quantized-fallback", "L70-nvfp4", "--quantized-fallback-method", "compressed-tensors")


def test_serve_switches_to_the_named_fallback_and_starts_it_next_time(tmp_path):
    proc = _serve(tmp_path, *OPTIONS, "--fresh")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [(r["event"], r.get("action"), r["model"]) for r in records] == [
        ("heal", "Quantize", "L70"),  # (the model that crashed)
        ("healthy", None, "L70-nvfp4"),
    ]
    assert records[0]["changes"]["model"] == "L70-nvfp4"
    assert "--model L70-nvfp4" in proc.stdout.split("to keep the healed flags, run:")[1]
    # The next run starts the fallback the history says worked, while the options still name it.
    again = _serve(tmp_path, *OPTIONS)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "using the quantized fallback L70-nvfp4" in again.stdout and "healed" not in again.stdout
    # Without the options, the history's switch is not taken: the model as given, healed afresh (here: no
    # fallback to switch to, so a give-up, not a start of a checkpoint nobody named).
    alone = _serve(tmp_path)
    assert "not using the flags in the history" in alone.stdout and "another model" in alone.stdout
    assert "--model L70-nvfp4" not in alone.stdout and alone.returncode == 1, alone.stdout[-2000:]


@pytest.mark.parametrize(
    "options,named",
    [
        (("--quantized-fallback", "q"), "--quantized-fallback-method"),
        (("--quantized-fallback-bits", "4"), "--quantized-fallback"),
        ((*OPTIONS[:2], "--quantized-fallback-method", "nope"), "--quantized-fallback-method"),
        ((*OPTIONS, "--quantized-fallback-bits", "5"), "--quantized-fallback-bits"),
        (
            (
                *OPTIONS[:2],
                "--quantized-fallback-method",
                "gptq_marlin",
                "--quantized-fallback-bits",
                "4",
                "--quantized-fallback-weight-type",
                "float",
            ),
            "--quantized-fallback-weight-type",
        ),  # fmt: skip
        ((*OPTIONS, "--quantized-fallback-group-size", "128"), "--quantized-fallback-group-size"),
        (
            (*OPTIONS[:2], "--quantized-fallback-method", "awq", "--quantized-fallback-bits", "99"),
            "--quantized-fallback-bits",
        ),
        (("--quantized-fallback", "--x", "--quantized-fallback-method", "awq"), "--quantized-fallback"),
    ],
)
def test_a_fallback_option_that_cannot_be_used_is_refused_naming_it(options, named, capsys):
    """Exit 2 and a message naming the option, never a traceback, and no vLLM started."""
    from vllm_autoheal.cli import main

    try:
        code = main(["serve", "m", "--python", "/nonexistent/python", *options])
    except SystemExit as exc:  # (argparse's own refusals: exit 2 too)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and named in err and "Traceback" not in err, err


@pytest.mark.parametrize("spelling", ["same", "trailing-slash", "dot-slash", "link"])
def test_a_fallback_that_is_the_served_model_however_spelled_is_refused(spelling, tmp_path, capsys, monkeypatch):
    """A fallback naming the model being served would switch to the same weights (the planner skips it):
    refused with exit 2, also where the folder is spelled another way (`/m/`, `./m`, a link to it)."""
    from vllm_autoheal.cli import main

    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)
    monkeypatch.chdir(tmp_path)
    fallback = {"same": str(folder), "trailing-slash": f"{folder}/", "dot-slash": "./m", "link": "link"}[spelling]
    options = ["--quantized-fallback", fallback, "--quantized-fallback-method", "awq"]
    code = main(["serve", str(folder), "--python", "/nonexistent/python", *options])
    err = capsys.readouterr().err
    assert code == 2 and "names the model being served" in err and "Traceback" not in err, err


def test_another_folder_as_the_fallback_is_not_refused_as_the_served_model(tmp_path):
    from vllm_autoheal.cli_serve import same_checkpoint

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert not same_checkpoint(str(tmp_path / "a"), str(tmp_path / "b"))
    assert not same_checkpoint("org/model", "org/model-AWQ")
    assert same_checkpoint("org/model", "org/model/")
