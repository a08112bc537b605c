"""Log shapes that cost more per byte than a normal log: each must stay within ~3x of it.

Timings on a shared machine are noisy: each test compares the best of a few runs of a crafted log
against a normal log of about the same size, timed in the same test.
"""

from __future__ import annotations

from crafted_logs import seconds_per_byte

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
        assert seconds_per_byte(_crafted(line_of)) < 3 * normal
