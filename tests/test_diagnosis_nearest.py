"""nearest.Figures answers what arithmetic.numbers' walk answers, for every failure, notes and key order included."""

from __future__ import annotations

import random

from vllm_autoheal.diagnosis import arithmetic
from vllm_autoheal.diagnosis.findings import findings_of
from vllm_autoheal.diagnosis.nearest import Figures
from vllm_autoheal.diagnosis.scan import scan

HEAD = "(EngineCore_DP{r} pid=1) INFO 01-01 00:00:01 [gpu_worker.py:1] "
ERROR = "(EngineCore_DP{r} pid=1) ERROR 01-01 00:00:01 [core.py:1] "
LINES = [
    HEAD + "Available KV cache memory: {v} GiB",
    HEAD + "Model loading took {v} GiB and 5 s",
    HEAD + "Initial free memory: {v} GiB; Requested memory: 0.9 (util), {w} GiB",
    # (eight figure wordings on one line: tests/test_review_speed3.py)
    HEAD + "Available KV cache memory: {v} GiB Model loading took 1.0 GiB model weights take {w} GiB Initial free "
    "memory: 1.0 GiB; Requested memory: 0.9 (util), {v} GiB Explicitly set ({w}/{v}) GiB for KV cache "
    "tensor_parallel_size=2 pipeline_parallel_size=2 Process 1 has {v} GiB memory in use. ",
    ERROR + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {v} MiB. GPU 0 has a total capacity of "
    "{w} GiB of which {v} MiB is free. Process 1 has {v} GiB memory in use.",
    ERROR + "ValueError: To serve at least one request with the model's max seq len (131072), ({v} GiB KV cache is "
    "needed, which is larger than the available KV cache memory ({w} GiB). Try increasing `gpu_memory_utilization`",
    ERROR + "ValueError: Free memory on device cuda:0 ({v}/{w} GiB) on startup is less than desired GPU memory "
    "utilization (0.92, 72.86 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
]
# plausible, zero, signed zero, negative, too large, digits vLLM never prints
VALUES = ["3.96", "0", "-0.00", "0.00", "-1.5", "900000", "\u0663.5", "1.0", "2.0", "79.2", "100", "0.5"]


def test_the_index_answers_as_the_walk_for_every_failure():
    rng = random.Random(7)
    compared = noted = 0
    for _ in range(60):
        log = "\n".join(
            rng.choice(LINES).format(r=rng.randint(0, 3), v=rng.choice(VALUES), w=rng.choice(VALUES))
            for _ in range(rng.randint(3, 20))
        )
        found = findings_of(scan(log).lines)
        for device_gib in (None, 80.0, 1.0):
            figures = Figures(found, device_gib)
            for first in [None, *found]:
                before = ["ignored available_kv_gib=earlier"] if rng.random() < 0.2 else []
                walked, indexed = list(before), list(before)
                expected = arithmetic.numbers(found, first, device_gib, walked)
                got = figures.numbers(first, indexed)
                assert (repr(got), indexed) == (repr(expected), walked), (log, first and first.line.text)
                compared += 1
                noted += len(walked) > len(before)
    assert compared > 1000 and noted > 100  # (the shapes that matter were met: notes, several ranks)
