"""Log shapes that cost more per byte than a normal log: no pattern may backtrack on them.

Timings on a shared machine are noisy: each test compares the best of a few runs of a crafted log
against a normal log of about the same size, timed in the same test, and holds it under
crafted.bases.BACKTRACKING; the issue's 3x is measured by bench/diagnosis_speed.py.
"""

from __future__ import annotations

import sys

import pytest

from crafted.bases import BACKTRACKING, ROOT, cost_to_normal, repeated, seconds_per_byte, startup_failure

sys.path.insert(0, str(ROOT / "bench"))
from crafted_lines import CRAFTED_LINES, NORMAL_LINE  # noqa: E402

SIZE = 600_000


NORMAL = (
    "(APIServer pid=8267) INFO 10-24 01:24:{s:02d} [loggers.py:123] Avg prompt throughput: 1234.5 tokens/s, "
    "Avg generation throughput: 99.1 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 45.1%\n"
    '(APIServer pid=8267) INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
)


TAIL = (
    "(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 960.00 MiB. GPU 0 has a total capacity of 79.14 GiB of which 712.75 MiB is free.\n"
)


def _normal() -> str:
    out, n, i = [], 0, 0
    while n < SIZE:
        block = NORMAL.format(s=i % 60, p=40000 + i)
        out.append(block)
        n, i = n + len(block), i + 1
    return "".join(out) + TAIL


def _crafted(line_of) -> str:
    out, n, i = [], 0, 0
    while n < SIZE:
        line = line_of(i) + "\n"
        out.append(line)
        n, i = n + len(line), i + 1
    return "".join(out) + TAIL


def test_many_processes_each_opening_a_request_message_cost_a_lookup_a_line():
    """Each line a process of its own (distinct pids), each opening a request's message (the request
    logger's, AsyncLLM's `Added request`): scan's open messages were filtered over all the processes
    on every line, quadratic in the processes (120x a normal log per MB)."""
    normal = seconds_per_byte(_normal())
    for line_of in (
        lambda i: f"(P{i} pid={i}) INFO 12-01 10:00:01 [logger.py:41] Received request x: prompt: 'a'",
        lambda i: f"(P{i} pid={i}) INFO 12-01 10:00:01 [core.py:41] Added request {i}",
    ):
        assert seconds_per_byte(_crafted(line_of)) < BACKTRACKING * normal


@pytest.mark.parametrize("shape", sorted(CRAFTED_LINES))
def test_no_pattern_backtracks_on_a_crafted_line(shape):
    """Each crafted line (bench/crafted_lines.py), repeated to a log, against a normal line of its length."""
    assert cost_to_normal(repeated(CRAFTED_LINES[shape]), repeated(NORMAL_LINE)) < BACKTRACKING


# (The two timing tests of this shape, the order of the lines and 3x a normal log, are
# measured in bench/diagnosis_speed.py: "milestones then warnings" and "the other order":
# the orders cost the same and
# the shape costs what any log whose every line holds needles costs: ~6x at 0.5 MB (all of it the raw
# tail, read line by line), ~3.9x at the operator's 2 MB. Performance is measured in bench/.)


def test_near_misses_on_every_read_line_cost_no_more_than_a_plain_log():
    near = "Failed to allocat Unable to allocat allocate memor ALLOC_FAILE MemoryErro bad_allo " * 30
    plain = "y" * len(near)

    def cost(filler: str) -> float:
        log = startup_failure("torch.distributed.DistBackendError: " + filler, *([filler] * 25))
        return seconds_per_byte(log) * len(log)

    near_s, plain_s = cost(near), cost(plain)
    assert near_s < 1.0
    assert near_s < BACKTRACKING * plain_s + 0.01
