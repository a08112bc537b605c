"""Hostile review (cli33) of the command line's input handling: the rule is that bad input gets exit
2 and a message naming the problem, never a traceback, and that the work any input can cause is
bounded. Each xfail(strict) test below is a defect found today; the plain tests are defended cases.

The CLI runs in a child (with this checkout's operator/ on its path, never the internet for the Hub)
where a deadline, a closed descriptor or a full disk is part of the input; else in-process."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_autoheal.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIG_8B = str(ROOT / "tests" / "fixtures" / "configs" / "llama-3.1-8b.json")
VLLMSERVICE = (ROOT / "examples" / "llama-8b-one-gpu.yaml").read_text()
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 1.00 GiB is free."
)


def cli(*args: str, timeout: float = 30, stdin=None, stdout=None, env: dict[str, str] | None = None, **kw):
    """The CLI in a child; a child still running at `timeout` fails the test (it hung)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    base["HF_ENDPOINT"] = "http://127.0.0.1:9"  # never the internet
    base["PYTHONPATH"] = str(ROOT / "operator")  # this checkout's code, not an installed copy
    try:
        return subprocess.run(
            [sys.executable, "-m", "vllm_autoheal", *args],
            stdin=stdin,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env={**base, **(env or {})},
            timeout=timeout,
            **kw,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"vllm-autoheal {' '.join(a[:40] for a in args[:6])} still running after {timeout:g} s")


def bad_input(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode == 2 and "Traceback" not in proc.stderr


# --- plan -------------------------------------------------------------------------------------


def test_plan_model_under_the_home_of_no_such_user_is_bad_input():
    proc = cli("plan", "--model", "~nosuchuser-cli33/model", "--gpu", "NVIDIA-L4")
    assert bad_input(proc), proc.stderr[-800:]


def test_plan_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused():
    proc = cli("plan", "--model-config", CONFIG_8B, "--gpu", "NVIDIA-L4", "--tensor-parallel-size", "3")
    assert bad_input(proc) and "3" in proc.stderr, (proc.returncode, proc.stdout[-400:])


def test_plan_with_a_flood_of_flags_answers_promptly():
    proc = cli("plan", "--model-config", CONFIG_8B, "--gpu", "NVIDIA-L4", *["--x"] * 40_000, timeout=10)
    assert bad_input(proc)


def test_plan_an_empty_gpu_name_is_named_as_given(capsys):
    assert main(["plan", "--model-config", CONFIG_8B, "--gpu", ""]) == 2
    err = capsys.readouterr().err
    assert "'custom'" not in err and ("''" in err or "--gpu" in err), err


def test_plan_refuses_a_url_or_a_climbing_path_as_a_model_id():
    for model in ("http://127.0.0.1:9/org/model", "org/../../etc"):
        proc = cli("plan", "--model", model, "--gpu", "NVIDIA-L4")
        assert bad_input(proc) and "neither a local path nor a Hugging Face repo id" in proc.stderr


@pytest.mark.parametrize(
    ("value", "said"),
    [("1e309", "hidden_size must be a whole number, got inf"), ("9" * 5000, "Exceeds the limit (4300 digits)")],
)
def test_plan_an_infinite_or_overlong_number_in_the_config_is_bad_input(value, said, tmp_path):
    config = json.loads(Path(CONFIG_8B).read_text())
    text = json.dumps(config).replace('"hidden_size": 4096', f'"hidden_size": {value}')
    (tmp_path / "config.json").write_text(text)
    proc = cli("plan", "--model-config", str(tmp_path / "config.json"), "--gpu", "NVIDIA-L4")
    assert bad_input(proc) and said in proc.stderr


# --- diagnose ---------------------------------------------------------------------------------


def test_diagnose_with_stdin_closed_is_bad_input():
    proc = cli("diagnose", "-", preexec_fn=lambda: os.close(0))
    assert bad_input(proc), (proc.returncode, proc.stdout)


def test_diagnose_stdin_with_a_non_utf8_byte_keeps_the_log(monkeypatch, capsys):
    data = b"INFO starting\n\xff\xfe progress\n" + OOM.encode() + b"\n"
    # what sys.stdin is under a UTF-8 locale that is not C/POSIX (en_US.UTF-8): strict decoding
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="strict"))
    assert main(["diagnose", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("CUDA out of memory" in e for e in out["evidence"]), out["explanation"]


def test_diagnose_refuses_a_device_on_stdin():
    with open("/dev/zero", "rb") as zero:
        proc = cli("diagnose", "-", stdin=zero, timeout=15)
    assert bad_input(proc)


def test_diagnose_a_50_gb_log_reads_only_its_windows(tmp_path):
    """A 50 GB (sparse) file, its last line torch's OOM: read through it cost ~135 s (2.7 s a GB); its
    head and tail are sought (log_file.windows)."""
    log = tmp_path / "huge.log"
    line = ("\n" + OOM + "\n").encode()  # (its own line: the bytes before it hold no newline)
    with open(log, "wb") as f:
        f.truncate(50 * 2**30 - len(line))
        f.seek(0, os.SEEK_END)
        f.write(line)
    proc = cli("diagnose", str(log), timeout=20)
    assert proc.returncode == 0 and "CUDA out of memory" in proc.stdout


def test_diagnose_a_utf16_log_is_read_or_refused(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(("INFO starting\n" + OOM + "\n").encode("utf-16"))
    proc = cli("diagnose", str(log))
    assert bad_input(proc) or "CUDA out of memory" in proc.stdout, proc.stdout


def test_diagnose_a_gzipped_log_is_read_or_refused(tmp_path):
    log = tmp_path / "0.log.20250101-000000.gz"
    log.write_bytes(gzip.compress(("INFO starting\n" + OOM + "\n").encode()))
    proc = cli("diagnose", str(log))
    assert bad_input(proc) or "CUDA out of memory" in proc.stdout, proc.stdout


def test_diagnose_an_example_and_a_file_together_is_a_usage_error(tmp_path, capsys):
    log = tmp_path / "mine.log"
    log.write_text(OOM + "\n")
    code = main(["diagnose", "--example", "h200-kv-cache-too-small", str(log)])
    assert code == 2, capsys.readouterr().out[:200]


@pytest.mark.parametrize("what", ["directory", "broken-symlink", "missing-parent"])
def test_diagnose_a_path_that_is_no_readable_file_is_bad_input(what, tmp_path, capsys):
    path = tmp_path / "x"
    if what == "directory":
        path.mkdir()
    elif what == "broken-symlink":
        path.symlink_to(tmp_path / "nowhere")
    else:
        path = tmp_path / "no-dir" / "x.log"
    assert main(["diagnose", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"cannot read {path}" in err and "Traceback" not in err


def test_diagnose_a_log_of_nul_bytes_and_no_newline_is_read(tmp_path, capsys):
    log = tmp_path / "nul.log"
    log.write_bytes(b"\x00" * (4 * 2**20) + b"\n" + OOM.encode() + b"\n")
    assert main(["diagnose", "--json", str(log)]) == 0
    assert any("CUDA out of memory" in e for e in json.loads(capsys.readouterr().out)["evidence"])


# --- output -----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["crd"], ["diagnose", "--example", "h200-kv-cache-too-small"]])
def test_output_to_a_full_disk_is_said_without_a_traceback(argv):
    with open("/dev/full", "w") as full:
        proc = cli(*argv, stdout=full)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-400:]


# --- render -----------------------------------------------------------------------------------


def render_file(tmp_path: Path, text: str | bytes) -> subprocess.CompletedProcess:
    path = tmp_path / "svc.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return cli("render", "-f", str(path))


def anchors(levels: int, indent: str) -> str:
    """YAML anchors a0..a(levels-1): a0 a list of 10 strings, each next a list of 10 aliases of the one before."""
    lines = ["x0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return ("\n" + indent).join(lines)


def test_render_a_deeply_nested_file_is_bad_input(tmp_path):
    assert bad_input(render_file(tmp_path, "a: " + "[" * 100_000 + "]" * 100_000 + "\n"))


@pytest.mark.parametrize(
    "data",
    [VLLMSERVICE.encode() + b"# caf\xe9\n", VLLMSERVICE.encode("utf-16"), bytes(range(128, 256)) * 64],
    ids=["latin-1", "utf-16", "random"],
)
def test_render_a_file_that_is_not_utf8_is_bad_input(data, tmp_path):
    proc = render_file(tmp_path, data)
    assert bad_input(proc) and "svc.yaml" in proc.stderr, proc.stderr[-400:]


def test_render_an_integer_of_5000_digits_is_bad_input(tmp_path):
    assert bad_input(render_file(tmp_path, VLLMSERVICE.replace("maxModelLen: 32768", "maxModelLen: " + "9" * 5000)))


def test_render_a_huge_file_is_refused_promptly(tmp_path):
    path = tmp_path / "svc.yaml"
    path.write_text("- aaaaaaaa\n" * 800_000)  # 8.8 MB
    assert bad_input(cli("render", "-f", str(path), timeout=10))


def test_render_an_alias_bomb_in_a_typed_field_gets_a_short_message(tmp_path):
    text = VLLMSERVICE.replace("  engine:\n", "  engine:\n    extraArgs: *a5\n").replace(
        "metadata:\n", "metadata:\n  annotations:\n    " + anchors(6, "    ") + "\n"
    )
    assert len(text) < 2048
    proc = render_file(tmp_path, text)
    assert bad_input(proc) and len(proc.stderr) < 64 * 1024, len(proc.stderr)


def test_render_an_alias_bomb_in_unknown_fields_and_status_is_pruned_unexpanded(tmp_path):
    text = VLLMSERVICE.replace("spec:\n", "spec:\n  " + anchors(9, "  ") + "\n") + "status:\n  kopf: {b: *a8}\n"
    proc = render_file(tmp_path, text)
    assert proc.returncode == 0 and "kind: Deployment" in proc.stdout and len(proc.stdout) < 64 * 1024


def test_render_a_python_tag_is_not_valid_yaml(tmp_path):
    proc = render_file(
        tmp_path, VLLMSERVICE.replace("model: meta-llama", "model: !!python/object/apply:os.getpid []\n#")
    )
    assert bad_input(proc) and "is not valid YAML" in proc.stderr and "python/object" in proc.stderr


def test_a_huge_log_sought_gives_what_reading_it_through_gives(tmp_path):
    """A real vLLM 0.25 KV failure (H200) whose startup and failure lie 100 MiB of serving metrics apart:
    `diagnose` reads only the head and tail of the file (log_file.windows), as a file and on stdin, and
    says what classifying the whole stream says: the cause, the figures of the head (the weights) and of
    the tail, the same evidence and notes."""
    from vllm_autoheal.diagnosis.classify import classify_stream
    from vllm_autoheal.log_file import SOUGHT_ABOVE

    lines = (ROOT / "tests" / "fixtures" / "gpu" / "failure-logs" / "kvlen.log").read_text().splitlines(True)
    metrics = (
        "(APIServer pid=7) INFO 12-02 06:05:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%\n"
    )
    log = tmp_path / "vllm.log"
    with open(log, "w") as f:
        f.writelines(lines[:30])
        f.write(metrics * (100 * 2**20 // len(metrics)))
        f.writelines(lines[30:])
    assert log.stat().st_size > SOUGHT_ABOVE
    with open(log, encoding="utf-8", errors="replace") as f:
        whole = json.loads(json.dumps(classify_stream(f).__dict__, default=str))
    assert whole["cause"] == "kv_cache_insufficient" and whole["numbers"]["weights_gib"] == 15.0
    keys = ("cause", "phase", "subtype", "numbers", "evidence", "notes")
    as_file = json.loads(cli("diagnose", "--json", str(log), timeout=20).stdout)
    with open(log, "rb") as f:
        on_stdin = json.loads(cli("diagnose", "--json", "-", stdin=f, timeout=20).stdout)
    for got in (as_file, on_stdin):
        assert {k: got[k] for k in keys} == {k: whole[k] for k in keys}


def test_render_refuses_a_key_named_twice_as_kubectl_does(tmp_path):
    """kubectl refuses a manifest whose mapping names a key twice ('mapping key "model" already defined');
    PyYAML alone kept the last value, so render rendered a service other than the one the file seems to say.
    A merge key (`<<`) that a local key overrides is no duplicate."""
    dup = tmp_path / "dup.yaml"
    dup.write_text(
        "apiVersion: vllm.autoheal.dev/v1alpha1\nkind: VLLMService\nmetadata:\n  name: a\n"
        "spec:\n  model: org/small\n  model: org/large\n"
    )
    proc = cli("render", "-f", str(dup))
    assert bad_input(proc) and 'mapping key "model" already defined' in proc.stderr and "line 7" in proc.stderr
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "base: &base {model: org/small}\n---\napiVersion: vllm.autoheal.dev/v1alpha1\nkind: VLLMService\n"
        "metadata:\n  name: a\nspec:\n  <<: {model: org/small, port: 8000}\n  model: org/large\n"
    )
    proc = cli("render", "-f", str(merged))
    assert proc.returncode == 0 and "org/large" in proc.stdout, proc.stderr
