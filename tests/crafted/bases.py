"""The real logs crafted logs build on: the corpus, real vLLM CPU runs, frozen injection bases and the
census of vLLM's messages; the marker every client payload carries; vLLM's line shape; and a timing
helper for the speed tests."""

from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_autoheal.diagnosis import Signals, classify

ROOT = Path(__file__).resolve().parents[2]


FIXTURES = ROOT / "tests" / "fixtures"


CORPUS = {s["id"]: s for s in map(json.loads, (ROOT / "tests/corpus/corpus.jsonl").read_text().splitlines())}


CENSUS = {
    e["id"]: e
    for name in ("vllm-messages.jsonl", "library-messages.jsonl")
    for e in map(json.loads, (FIXTURES / "census" / name).read_text().splitlines())
}


REAL_CPU = FIXTURES / "vllm-cpu"


FROZEN_BASES = FIXTURES / "injection-bases"


MARKER = "ZZUSERZZ"  # in every crafted payload: the client's words, to be found nowhere in a diagnosis


# Memory failures as a client writes them, each with the marker.
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free. ZZUSERZZ"
)


CLIENT_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 1.00 GiB is free. ZZUSERZZ"
)


PAYLOADS = {
    "cuda-oom": "CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
    "1.00 GiB is free. ZZUSERZZ",
    "kv-capacity": "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, the "
    "estimated maximum model length is 16. ZZUSERZZ",
    "cgroup-kill": "Memory cgroup out of memory: Killed process 1 (python3) ZZUSERZZ",
}


BASE = "neg-2734-llama2-70b-tp8-timeout"  # a real not_oom (NCCL watchdog timeout)


BASES = [BASE, "memory-limit-kill.log"]  # a real not_oom and a real host_ram_oom (a memory-limit kill)


# Two real non-memory crashes (an NCCL timeout, a watchdog) and two real runtime OOMs.
ID_BASES = [
    BASE,
    "neg-6042-watchdog-worker-died",
    "rt-27466-busy-loop",
    "local-h200-runtime",
]


H100 = "NVIDIA H100 80GB HBM3"


# The process prefixes vLLM puts before its API server's and its engine core's lines.
API = "(APIServer pid=2320) "


ENGINE_CORE = "(EngineCore_DP0 pid=2441) "


def real_log(name: str) -> str:
    """A real vLLM CPU run's log (NAME.log), else a corpus sample's (as frozen for these tests, if it is)."""
    if name.endswith(".log"):
        return (REAL_CPU / name).read_text()
    frozen = FROZEN_BASES / f"{name}.log"
    return frozen.read_text() if frozen.exists() else CORPUS[name]["log"]


def corpus_log(name: str) -> str:
    """A training sample's log, ending in one newline (tests build only on the training split)."""
    sample = CORPUS[name]
    assert sample["split"] == "train"
    return sample["log"].rstrip("\n") + "\n"


def vllm_log(header: str, message: str) -> str:
    """vLLM's NewLineFormatter repeats the header on every line of a multi-line message."""
    return "\n".join(header + part for part in message.split("\n"))


def with_lines(base_log: str, extra: str, where: str) -> str:
    """`base_log` with the lines of `extra` put at its start, middle or end."""
    lines = base_log.splitlines()
    at = {"start": 0, "middle": len(lines) // 2, "end": len(lines)}[where]
    lines[at:at] = extra.splitlines()
    return "\n".join(lines) + "\n"


# A V1 engine's start-up failure, headed, up to the executor's construction.
TRACEBACK = """INFO 11-22 10:01:20 [gpu_model_runner.py:1811] Starting to load model /models/qwen...
ERROR 11-22 10:01:28 [core.py:708] EngineCore failed to start.
ERROR 11-22 10:01:28 [core.py:708] Traceback (most recent call last):
ERROR 11-22 10:01:28 [core.py:708]   File "/usr/local/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 699, in run_engine_core
ERROR 11-22 10:01:28 [core.py:708]     engine_core = EngineCoreProc(*args, **kwargs)
ERROR 11-22 10:01:28 [core.py:708]   File "/usr/local/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 498, in __init__
ERROR 11-22 10:01:28 [core.py:708]     super().__init__(vllm_config, executor_class, log_stats,
ERROR 11-22 10:01:28 [core.py:708]   File "/usr/local/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 83, in __init__
ERROR 11-22 10:01:28 [core.py:708]     self.model_executor = executor_class(vllm_config)
"""


def startup_failure(*message: str) -> str:
    """TRACEBACK going on with `message`'s lines under the same header."""
    return TRACEBACK + "".join(f"ERROR 11-22 10:01:28 [core.py:708] {line}\n" for line in message)


ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"


def illegal_access_log() -> str:
    """A real V1 serving crash (corpus local-h200-runtime, vLLM 0.25 on an H200) whose final error is
    made an illegal memory access: about 100 lines of EngineCore's headed traceback, then the API
    server's. Not memory: a memory change there is wrong."""
    lines = corpus_log("local-h200-runtime").splitlines()
    out = []
    for ln in lines:
        if "torch.OutOfMemoryError" in ln:
            ln = ln.split("[core.py:1233] ")[0] + "[core.py:1233] " + ILLEGAL
        out.append(ln)
    return "\n".join(out) + "\n"


def illegal_access_crash() -> str:
    """The crash of illegal_access_log from the engine's dump of its input on (no start-up)."""
    lines = illegal_access_log().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "[dump_input.py:" in ln)
    return "".join(lines[at:])


# How many times a normal log's cost per byte a crafted log may take in a test. The bound, 3x,
# is bench/diagnosis_speed.py's to measure, on a quiet machine: the ratio moves with the processor and
# the load (a shape at 2.4x here took 3.1x on CI's machine), so a test held to 3x fails on noise. A
# pattern that backtracks on a 2 KiB line costs hundreds of times a normal line: that a test catches.
BACKTRACKING = 8


def cost_to_normal(crafted: str, normal: str, runs: int = 3) -> float:
    """The per-byte cost of classifying `crafted` over that of `normal`, each the best of a few runs,
    interleaved (the machine's load changes both alike)."""
    best_crafted = best_normal = float("inf")
    for _ in range(runs):
        best_crafted = min(best_crafted, seconds_per_byte(crafted, runs=1))
        best_normal = min(best_normal, seconds_per_byte(normal, runs=1))
    return best_crafted / best_normal


def repeated(line: str, size: int = 400_000) -> str:
    """`line` as every line of a log of about `size` bytes."""
    return (line + "\n") * (size // (len(line) + 1))


def seconds_per_byte(log: str, runs: int = 3) -> float:
    """The best of a few classifications of `log`, per byte (timings on a shared machine are noisy:
    only a ratio to a normal log timed alongside says anything)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        classify(Signals(log=log))
        best = min(best, time.perf_counter() - started)
    return best / len(log)
