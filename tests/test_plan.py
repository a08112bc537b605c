"""`plan --model ID|PATH` and its options table, as a user runs it (the CLI in a subprocess),
with the Hub served locally (HF_ENDPOINT) through the real huggingface_hub client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.plan_options import memory_bar, options, tensor_parallel_sizes

from hub_server import GATED_TOKEN, hub  # noqa: F401 - the fixture
from samples import CONFIGS, config_shape

H100 = "NVIDIA-H100-80GB-HBM3"


def plan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    base["HF_ENDPOINT"] = "http://127.0.0.1:9"  # never the internet: a test that forgets its Hub fails
    return subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "plan", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=120,
    )


def test_70b_on_one_h100_lists_a_fitting_tensor_parallel_option():
    out = plan(
        "--model-config",
        str(CONFIGS / "llama-3.1-70b.json"),
        "--gpu",
        H100,
        "--max-model-len",
        "32768",
        "--quantized-variant",
        "fp8",
        "--json",
    )
    assert out.returncode == 1, out.stderr  # as asked (one GPU, bf16) it does not fit
    data = json.loads(out.stdout)
    assert data["fits"] is False and data["failure"] == "weights_load_oom"
    opts = data["options"]
    for o in opts:
        assert {
            "tensor_parallel_size",
            "quantization",
            "kv_cache_dtype",
            "fits",
            "weights_gib",
            "kv_tokens",
            "max_model_len_fit",
        } <= set(o)
    assert sorted({o["tensor_parallel_size"] for o in opts}) == [1, 2, 4, 8]  # 64 heads
    assert {o["quantization"] for o in opts} == {None, "fp8"}
    assert {o["kv_cache_dtype"] for o in opts} == {"auto", "fp8"}
    smallest = [o for o in opts if o["smallest"]]
    assert len(smallest) == 1 and smallest[0]["fits"] and smallest[0]["tensor_parallel_size"] == 2
    assert any(o["fits"] and o["tensor_parallel_size"] == 2 and o["quantization"] is None for o in opts)
    one_gpu_fp8 = next(
        o
        for o in opts
        if o["tensor_parallel_size"] == 1 and o["quantization"] == "fp8" and o["kv_cache_dtype"] == "auto"
    )
    assert 60 < one_gpu_fp8["weights_gib"] < 75  # half of bf16's 131 GiB, plus 16-bit embeddings
    assert all(o["max_model_len_fit"] <= 131072 for o in opts)  # never past the model's own context
    text = plan("--model-config", str(CONFIGS / "llama-3.1-70b.json"), "--gpu", H100, "--max-model-len", "32768")
    assert text.returncode == 1
    assert "GPU 0 [" in text.stdout and "over by" in text.stdout  # the weights alone overflow
    star = next(line for line in text.stdout.splitlines() if line.startswith("*   2"))
    assert star.rstrip().endswith("yes")


def test_memory_bar_is_one_line_that_adds_up():
    shape = config_shape("llama-3.1-8b")
    from vllm_autoheal.memory import estimate

    e = estimate(shape, EngineArgs(max_model_len=8192), lookup("NVIDIA-H200"))
    bar = memory_bar(e, width=50)
    cells = bar[1 : bar.index("]")]
    assert len(cells) == 50 and cells.startswith("W" * 5) and "K" in cells and cells.endswith(".")
    assert "\n" not in bar and "free" in bar
    shared = memory_bar(estimate(shape, EngineArgs(max_model_len=8192), lookup("NVIDIA-H200"), free_gib=40))
    assert shared.startswith("[xxxxxxxxxxxx")  # another process holds 100 of 140 GiB


def test_tensor_parallel_sizes_divide_the_heads():
    qwen = config_shape("qwen2.5-7b")  # 28 heads, 4 KV heads: 7 divides the heads, not the KV heads
    assert tensor_parallel_sizes(qwen) == [1, 2, 4]
    opts = options(qwen, EngineArgs(max_model_len=4096), lookup("NVIDIA-L4"), quantized_variants=["awq", "awq"])
    assert len(opts) == 3 * 2 * 2 and sum(o.smallest for o in opts) == 1


def test_plan_model_through_the_local_hub(hub):  # noqa: F811
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": hub.cache}
    out = plan(
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu",
        "NVIDIA-H200",
        "--max-model-len",
        "8192",
        "--json",
        env=env,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["fits"] and data["model"]["source"] == f"meta-llama/Llama-3.1-8B-Instruct@main on {hub.url}"
    assert data["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert ("GET", "/meta-llama/Llama-3.1-8B-Instruct/resolve/main/config.json", False) in hub.requests
    gated = plan("--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", H100, env=env)
    assert gated.returncode == 2 and "is gated: accept its terms" in gated.stderr
    assert "Traceback" not in gated.stderr and gated.stdout == ""
    with_token = plan(
        "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", H100, "--json", env={**env, "HF_TOKEN": GATED_TOKEN}
    )
    assert with_token.returncode == 1 and json.loads(with_token.stdout)["model"]["params"] > 70e9
    assert hub.requests[-1][2] is True  # sent as a bearer token
    missing = plan("--model", "acme/absent", "--gpu", H100, env=env)
    assert missing.returncode == 2 and "acme/absent@main" in missing.stderr and "no such model" in missing.stderr
    assert "HTTP 401" in missing.stderr


def test_plan_model_from_a_local_directory(tmp_path):
    model = tmp_path / "qwen"
    model.mkdir()
    shutil.copy(CONFIGS / "qwen2.5-7b.json", model / "config.json")
    out = plan("--model", str(model), "--gpu", "NVIDIA-L4", "--max-model-len", "4096", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"]["source"] == str(model)


def test_bad_input_exits_2_with_a_message(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(
        json.dumps({"num_hidden_layers": -32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000})
    )
    out = plan("--model-config", str(bad), "--gpu", H100)
    assert out.returncode == 2 and "num_hidden_layers is -32; real models have 1 to 1,024" in out.stderr
    assert "Traceback" not in out.stderr
    bad.write_text('{"num_hidden_layers": 1e12, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 1}')
    out = plan("--model", str(tmp_path), "--gpu", H100)
    assert out.returncode == 2 and "num_hidden_layers is 1e+12" in out.stderr
    out = plan("--model", str(tmp_path / "absent"), "--gpu", H100)
    assert out.returncode == 2 and "no such file or directory" in out.stderr
    out = plan("--model-config", str(CONFIGS / "llama-3.1-8b.json"), "--gpu", H100, "--quantized-variant", "q3")
    assert out.returncode == 2 and "invalid choice: 'q3'" in out.stderr
    both = plan("--model", "x/y", "--model-config", str(bad), "--gpu", H100)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
