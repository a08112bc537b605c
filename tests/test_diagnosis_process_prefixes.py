"""The prefixes vLLM and the launchers around it put before each process's lines (`(Worker_TP0 pid=N)`,
vLLM 0.10's `(VllmWorker TP0 pid=N)`, torchrun's, SkyPilot's) are read as prefixes, so a worker's
exception quoting a client's text is still read as that exception, and names no memory failure."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify

from crafted.bases import vllm_log
from crafted.request_logging import ACCESS_LINE


# --- vLLM 0.10.x's worker prefix is not read -----------------------------------------
def _worker_key_error(prefix: str, key: str) -> str:
    header = prefix + "ERROR 11-22 10:01:28 [multiproc_executor.py:611] "
    return (
        ACCESS_LINE.replace("INFO", "(APIServer pid=7) INFO", 1)
        + vllm_log(
            header,
            "WorkerProc hit an exception.\nTraceback (most recent call last):\n"
            '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 1, in execute_model\n'
            "    encoder_output = self.encoder_cache[mm_hash]\n"
            f"KeyError: {key!r}",
        )
        + "\n"
    )


CLIENT_OOM_KEY = "img-1 CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ"


def test_the_same_worker_failure_under_the_0_11_prefix_names_no_memory_cause():
    assert classify(Signals(log=_worker_key_error("(Worker_TP0 pid=77) ", CLIENT_OOM_KEY))).cause not in MEMORY_CAUSES


@pytest.mark.parametrize(
    "prefix", ["(VllmWorker TP0 pid=77) ", "(EngineCore_0 pid=715) (VllmWorker TP0 pid=720) "], ids=["plain", "nested"]
)
def test_vllm_010s_worker_prefix_is_read_as_a_prefix(prefix):
    assert classify(Signals(log=_worker_key_error(prefix, CLIENT_OOM_KEY))).cause not in MEMORY_CAUSES


# Found while fixing 5: the same hole under torchrun --tee's "[default0]:" (its role, then the local rank,
# and no space), which RL frameworks that launch vLLM with torchrun print on every line. Each prefix below
# is one a real launcher, executor or actor writes before a worker's lines: under none may a client's text
# in a worker's KeyError name a memory cause.
LAUNCHER_PREFIXES = [
    "[default0]:",
    "[default0]: ",
    "[rank3]:",
    "(VllmWorkerProcess pid=77) ",
    "(VllmWorker rank=1 pid=7) ",
    "(VllmWorker TP1 pid=7) ",
    "(VllmWorker PP0_TP1 pid=7) ",
    "(Worker_PP1_TP0 pid=3) ",
    "(EngineCore_DP0 pid=1) (Worker_TP0_EP0 pid=2) ",
    "(RayWorkerWrapper pid=77, ip=10.0.0.1) ",
    "(RayWorkerWrapper pid=77, ip=10.0.0.1) [rank3]:",
    "\x1b[36m(RayWorkerWrapper pid=77)\x1b[0m ",
    "(ServeReplica:default:LLMServer:qwen pid=77) ",
    "(WorkerDict pid=9, ip=10.1.1.1) ",
    "[1,0]<stderr>:",
    "(task, pid=1234) ",  # SkyPilot's, one node
    "(node-0, worker1, rank=1, pid=22755, ip=172.31.81.91) ",  # SkyPilot's, a worker node (skypilot#1380)
    "(worker1, rank=1, pid=22755, ip=172.31.81.91) ",
]


# Prefixes no rule cuts (srun --label's padded task number, a CRI line read raw, a wrapper's own logging
# format, Ray's autoscaler tag): the failure may go unread (`unknown`), but the first exception named on
# a line is the engine's, and the client's text in its message names nothing and is never quoted.
UNKNOWN_PREFIXES = [
    "  0: ",
    "2024-06-01T10:00:00.123456789Z stdout F ",
    "2024-06-01 10:00:00,123 - INFO - ",
    "INFO 2024-06-01 10:00:00 ",
    "(autoscaler +5s) ",
]


@pytest.mark.parametrize("prefix", LAUNCHER_PREFIXES)
def test_no_launchers_prefix_lets_a_workers_quoted_client_text_name_memory(prefix):
    d = classify(Signals(log=_worker_key_error(prefix, CLIENT_OOM_KEY)))
    assert (d.cause, d.subtype) == ("not_oom", "other_error")
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


@pytest.mark.parametrize("prefix", UNKNOWN_PREFIXES)
def test_under_a_prefix_no_rule_knows_a_workers_quoted_client_text_names_nothing(prefix):
    d = classify(Signals(log=_worker_key_error(prefix, CLIENT_OOM_KEY)))
    assert d.cause not in MEMORY_CAUSES
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())
