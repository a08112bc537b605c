"""Crafted lines that each aim at one of the classifier's patterns: near misses repeated, long runs
before the literal a pattern needs. Every one is a whole line; repeated to a log's size, each must cost
about what a normal line of the same length costs.

bench/diagnosis_speed.py measures each against the issue's bound (3x a normal log per MB, on a quiet
machine); the tests (tests/test_diagnosis_speed_shapes.py) hold each to what a test on a shared machine
can tell apart from noise: no pattern backtracks.
"""

from __future__ import annotations

# An engine line's header, and the normal line every crafted one is compared with.
P = "(EngineCore_DP0 pid=1) ERROR 10-24 01:26:57 [core.py:1] "
NORMAL_LINE = P + "Avg prompt throughput: 1234.5 tokens/s, Running: 12 reqs rror " + "a" * 1950

# Each new regex of sessions 30-33, on a 2 KiB line built to make it backtrack.
NEAR_MISS_LINES = {
    "cudacheck-colons": P + ("Cuda error " + "a:1" * 60 + " ")[:2040],
    "cudacheck-unclosed": P + "Cuda error " + "a:1" * 66 + " '" + "x" * 1800,
    "aborted": P + ("Aborted (core dumpe" * 120)[:2040],
    "received-by-pid": P + ("Signal 11 (SIGSEGV) received by PI" * 70)[:2040],
    "died-exit-code": P + ("died, exit code: -1" * 110)[:2040],
    "shell-report": "a: " + "line 1: " * 250 + "1 Segmentation fault",
    "python-stub": "Failed to initialize Python stub: " + ("a" * 79 + ". ") * 25,
    "model-server": "Failed to start model server: " + "Engine core " * 170,
    "systemd": "a" * 199 + ".service: A process of this unit has been killed by the OO " + "OOM killer " * 150,
    "slurm": "slurmstepd-" + "a" * 99 + ": error: Detected 1 oom_kill even " + "oom_kill event " * 120,
    "kserve-header": "1 kserve ERROR [" + "a" * 80 + ":" + "<" * 80 + "(" * 1800,
    "glog-header": "E1115 02:58:51.162611 1 " + "a" * 80 + ":1" + "1" * 1900,
    "backticks": "`" * 1000 + " " * 1000 + "rror",
    "kubectl-reason": "Reason: " + " " * 39 + "OOMKille " + "OOMKilled " * 200,
}

# The rows made live: their needles repeated, and near misses of their regexes.
NEW_ROW_LINES = {
    name: P + line
    for name, line in {
        "outofresources": "OutOfResources " * 130,
        "outofresources-colon": "OutOfResources: out of " * 80,
        "cuda-graph-addresses": "Registering 1 cuda graph addresse " * 58 + "cuda graph addresses",
        "digits": "Registering " + "1" * 1990 + " cuda graph addresse",
        "registering-spaces": "Registering " + "1 " * 990 + "cuda graph addresses",
    }.items()
}

NEW_ROW_NEAR_MISSES = {
    "calloc": P + ("Failed to CUDA calloc async 1111111111111111111111 " * 60)[:2040],
    "gpu-blocks": P + ("# GPU blocks: -" + "1" * 13 + " ") * 60,
    "cpu-kv": P + "Available memory on node 0 (" + "1." * 500 + " GiB) on kv cache allocation is less than "
    "requested memory for kv (" + "1." * 400,
    "cpu-kv-nonpositive": P + ("on kv cache allocation is less than requested memory for kv (-" + "1." * 30 + "/") * 20,
    "pt-devmem": P + ("MODULE:PT_DEVMEM Allocation faile " * 60)[:2040],
    "frames": P + ('  File "x", line 1, in profile_num_available_blocksx allocate_gpu_cachex ' * 30)[:2040],
}

CRAFTED_LINES = NEAR_MISS_LINES | NEW_ROW_LINES | NEW_ROW_NEAR_MISSES
