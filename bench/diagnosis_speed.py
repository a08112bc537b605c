"""Classifier throughput and memory on a generated 100 MB serving log.

    python bench/diagnosis_speed.py [--mb 100]

The log is what a long-lived server leaves: start-up lines, then metrics and
HTTP access lines, then a runtime OOM near the end. It is streamed from a
temporary file (as `vllm-autoheal diagnose FILE` reads it); peak memory growth
is measured with tracemalloc.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from vllm_autoheal.diagnosis.classify import classify_stream  # noqa: E402

HEAD = """(EngineCore_DP0 pid=8402) INFO 10-24 01:22:27 [default_loader.py:267] Loading weights took 14.57 seconds
(EngineCore_DP0 pid=8402) INFO 10-24 01:22:28 [gpu_model_runner.py:2653] Model loading took 62.6327 GiB and 14.898300 seconds
(EngineCore_DP0 pid=8402) INFO 10-24 01:23:12 [gpu_worker.py:298] Available KV cache memory: 6.28 GiB
(APIServer pid=8267) INFO:     Application startup complete.
"""
BODY = ("(APIServer pid=8267) INFO 10-24 01:24:{s:02d} [loggers.py:123] Avg prompt throughput: 1234.5 tokens/s, "
        "Avg generation throughput: 99.1 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 45.1%, "
        "Prefix cache hit rate: 12.0%\n"
        '(APIServer pid=8267) INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
TAIL = """(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710] Traceback (most recent call last):
(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 701, in run_engine_core
(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710]     engine_core.run_busy_loop()
(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 960.00 MiB. GPU 0 has a total capacity of 79.14 GiB of which 712.75 MiB is free.
(APIServer pid=8267) ERROR 10-24 01:26:57 [serving_chat.py:1145] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args(argv)
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as f:
        f.write(HEAD)
        written, i = 0, 0
        while written < args.mb * 10**6:
            block = "".join(BODY.format(s=(i + k) % 60, p=40000 + (i + k) % 20000) for k in range(1000))
            f.write(block)
            written += len(block)
            i += 1000
        f.write(TAIL)
        f.flush()
        size = Path(f.name).stat().st_size
        f.seek(0)
        tracemalloc.start()
        t0 = time.perf_counter()
        diag = classify_stream(f)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    print(f"log: {size / 1e6:.1f} MB -> {diag.cause} ({diag.phase})")
    print(f"throughput: {size / 1e6 / elapsed:.1f} MB/s ({elapsed:.2f} s)")
    print(f"peak memory growth: {peak / 2**20:.1f} MiB")
    return 0 if diag.cause == "runtime_oom" else 1


if __name__ == "__main__":
    sys.exit(main())
