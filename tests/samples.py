"""Crash samples and specs the operator tests share: a test helper, like operator_harness.py.
Test modules import these from here, never from one another."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.launcher import termination_message
from vllm_autoheal.model_shape import ModelShape
from vllm_autoheal.shape_reader import shape_from_config

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-cpu"
CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def config_shape(name: str) -> ModelShape:
    """A bundled model's shape, read from tests/fixtures/configs/NAME.json."""
    return shape_from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


KV_LOG = (FIXTURES / "kv-cache-too-small.log").read_text()
# What the in-pod launcher writes when vLLM dies of this (made from the real engine's log).
KV_TERMINATION = termination_message(classify(Signals(log=KV_LOG, exit_code=1)).to_dict(), 1, None, None)
# The plainest VLLMService of the operator tests: one L4, healed at once.
PLAIN_SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9},
    "resources": {"gpuProduct": "NVIDIA-L4", "limits": {"memory": "32Gi"}},
    "heal": {"backoffSeconds": 0},
}
SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9},
    "resources": {"gpuProduct": "NVIDIA-L4", "limits": {"memory": "32Gi"}, "shmSize": "4Gi"},
    "heal": {"backoffSeconds": 0, "bounds": {"maxMemoryLimit": "40Gi"}},
}
H200_FREE = (
    "ValueError: Free memory on device cuda:0 (38.69/139.8 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)
H200_TERMINATION = termination_message(classify(Signals(log=H200_FREE, exit_code=1)).to_dict(), 1, None, None)
NOT_MEMORY = termination_message(
    classify(Signals(log=(FIXTURES / "model-not-found.log").read_text(), exit_code=1)).to_dict(), 1, None, None
)
RUNTIME_OOM = termination_message(
    {
        "cause": "runtime_oom",
        "phase": "serving",
        "confidence": "high",
        "numbers": {"tried_gib": 0.5, "gpu_total_gib": 22.0},
        "evidence": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB."],
    },
    1,
    None,
    None,
)
WEIGHTS_OOM = termination_message(
    {
        "cause": "weights_load_oom",
        "phase": "load",
        "confidence": "high",
        "evidence": ["ValueError: Failed to load model - not enough GPU memory"],
    },
    1,
    None,
    None,
)
TP_HEAL = {"backoffSeconds": 0, "allowedActions": ["IncreaseTensorParallel"], "bounds": {"maxTensorParallelSize": 2}}
NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."

BAD_MESSAGES = {
    "nan": KV_TERMINATION.replace('"available_gib":1.0', '"available_gib":NaN'),
    "infinity": KV_TERMINATION.replace('"estimated_max_model_len":524160', '"estimated_max_model_len":Infinity'),
    "string-numbers": KV_TERMINATION.replace('"numbers":{', '"numbers":"{').replace(',"evidence"', '","evidence"', 1),
    "integer-evidence": json.dumps(
        {**json.loads(KV_TERMINATION), "diagnosis": {**json.loads(KV_TERMINATION)["diagnosis"], "evidence": [1, 2, 3]}}
    ),
    "huge": KV_TERMINATION.replace('"estimated_max_model_len":524160', '"estimated_max_model_len":1e30'),
}


# Ordinary vLLM flags in several spellings that extraArgs must accept (the CRD server and render agree).
ACCEPTED_EXTRA_ARGS = [
    "--trust-remote-code",
    "--max-num-partial-prefills",
    "2",
    "--model-impl",
    "vllm",
    "--config-format",
    "hf",
    "--seed",
    "-1",
    "--enable_prefix_caching",
    "--tokenizer=org/tok",
    "-O3",
    "-dcp",  # vLLM's decode context parallelism (0.32's -dcp, on the TP GPUs): a flag of its own, not -pp
    "2",
    "--data-parallel-rank=0",  # (not --data-parallel-size: more GPUs than the pod's, refused)
    "--logging-config.formatter",  # JSON log records (diagnosis/log_records.py reads them)
    "json",
]


# A stand-in for vLLM's OpenAI server in `serve`'s subprocess tests: answers /health and a completion
# (the source of a handler class, put into each fake vLLM module's text).
OPENAI_HANDLER = """
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def do_POST(self):
        body = json.dumps({"choices": [{"text": " world"}]}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
"""


def fake_vllm(tmp: Path, source: str) -> tuple[dict[str, str], int]:
    """A stand-in `vllm.entrypoints.openai.api_server` module of this source under tmp/fake, first on the child's
    PYTHONPATH and this checkout after it (the child must not run an installed vllm_autoheal), and a free port
    on 127.0.0.1: (the child's environment, the port)."""
    pkg = tmp / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (tmp / "fake" / "vllm", tmp / "fake" / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp / "fake"), *sys.path]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return env, s.getsockname()[1]


# Qwen/Qwen2.5-VL-7B-Instruct's vision_config (0.68 B parameters): the multimodal tests' encoder.
QWEN25_VL_VISION = {
    "depth": 32,
    "hidden_act": "silu",
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "in_chans": 3,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}


def gpt_oss(layers: int, experts: int, **extra):
    """openai/gpt-oss-120b's (36 layers, 128 experts) and -20b's (24, 32) config.json, the fields read here."""
    return shape_from_config(
        {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "attention_bias": True,
            "hidden_size": 2880,
            "intermediate_size": 2880,
            "num_hidden_layers": layers,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "num_local_experts": experts,
            "num_experts_per_tok": 4,
            "vocab_size": 201088,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
            "quantization_config": {
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.*.mlp.router",
                    "model.embed_tokens",
                    "lm_head",
                ],
                "quant_method": "mxfp4",
            },
            **extra,
        }
    )
