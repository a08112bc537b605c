"""Hostile review (selfrev33) of e1fa74e (origin: an access line's request line told by its opening and
its HTTP close) and 25c0ba7 (figures: zero sizes, unrounded small sizes, a device figure bounded by its
own line's total, ASCII digits, a KV refusal's needed below its available).

Each xfail(strict) test is a real print diagnosed wrongly today; the passing tests document attacks on
the two changes that are defended. Differential runs (old 7551ae5 vs new) over the 729 corpus logs, the
66 fixture logs and the census messages gave no change of cause, subtype, numbers, notes or heal, and
no line of them (25,024) changed origin.
"""

from __future__ import annotations

import time

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.origin import ACCESS, ENGINE, origin_of
from vllm_autoheal.diagnosis.scan import make_line
from vllm_autoheal.remedy.plan import plan_from_command

E = "(EngineCore_DP0 pid=7) ERROR 05-08 10:00:00 [core.py:700] "
RELEASE = (
    "(EngineCore_DP0 pid=7) INFO 05-08 09:59:00 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with "
    "config: model='Qwen/Qwen3.5-9B'\n"
)


# --- Findings -----------------------------------------------------------------------------------------------


def _apu_oom(total: str, free: str) -> str:
    return (
        RELEASE
        + E
        + "EngineCore failed to start.\n"
        + E
        + "Traceback (most recent call last):\n"
        + E
        + f"torch.OutOfMemoryError: HIP out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity "
        f"of {total} GiB of which {free} GiB is free. Of the allocated memory 1.67 GiB is allocated by PyTorch, "
        "and 8.08 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
    )


def test_an_apu_oom_whose_free_figure_exceeds_its_total_keeps_the_free_figure():
    """torch 2.8 on ROCm, gfx1151 (ROCm/TheRock issue #4598): "HIP out of memory. Tried to allocate 16.00 GiB.
    GPU 0 has a total capacity of 15.49 GiB of which 84.98 GiB is free. Of the allocated memory 1.67 GiB ...";
    ROCm/legacy-rocm-build #6004 shows the same device at mem_get_info total 62.47 GiB, free 120.00 GiB, and
    ROCm/hip #3892 runs vllm/vllm-openai-rocm on it. (Not a regression of 25c0ba7: the line alone was read
    the same before; the heal stays GiveUp, the cause and its explanation are wrong.)"""
    d = classify(Signals(log=_apu_oom("15.49", "84.98")))
    assert d.numbers.get("gpu_free_gib") == 84.98, (d.numbers, d.notes)
    assert d.cause != "weights_load_oom", (d.cause, d.subtype)


# --- Defended -----------------------------------------------------------------------------------------------


def test_an_engine_failure_quoting_its_message_in_double_quotes_stays_the_engines():
    """vLLM's KV refusal holds an apostrophe ("the models's max seq len", kv_cache_utils.py 0.8-0.11), so a
    repr of it is double-quoted and opens `"To ` (a METHOD token and a space): with no ` HTTP/d.d"` after it
    the line is no access line, whatever its length."""
    refusal = (
        "To serve at least one request with the models's max seq len (131072), (16.0 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (9.53 GiB). Based on the available memory, the "
        "estimated maximum model length is 77952."
    )
    for text in (
        f'Exception: Call to collective_rpc method failed: ValueError("{refusal}")',
        f'ValueError("{refusal}") ' + "x" * 70000,
    ):
        assert origin_of(text, "core.py") == ENGINE, text[:80]
    # (a JSON object log_records did not decode, a level named nowhere, is no line of the engine's text formatter:
    # since session 42 it decides nothing, whoever's words it holds)
    record = f'{{"message": "{refusal}", "exc_info": "Traceback (most recent call last): ..."}}'
    assert origin_of(record, "core.py") != ENGINE


def test_an_engine_line_with_an_opening_in_its_head_and_no_close_is_the_engines():
    """A `"Word ` in the first 2 KiB with ` HTTP/1.1` (no closing quote) or `HTTP/1.1"` (no space before) far
    after (httpx's own words end `GET https://... "HTTP/1.1 200 OK"`): no close, no access line."""
    text = (
        'RuntimeError: "CUDA out of memory" raised while fetching: GET https://huggingface.co/x '
        '"HTTP/1.1 200 OK" ' + " HTTP/1.1" * 2000
    )
    assert origin_of(text, "core.py") == ENGINE


def test_the_request_close_is_searched_once_in_linear_time():
    """Many `"GET ` openings and many ` HTTP/1.1` near-closes: one search each, no backtracking (1 MiB, the
    most container_log joins into one line)."""

    def cost(n: int) -> float:
        text = '"GET /' * 50 + " HTTP/1.1" * (n // 9)
        best = 1e9
        for _ in range(5):
            start = time.perf_counter()
            origin_of(text, None)
            best = min(best, time.perf_counter() - start)
        return best

    small, large = cost(2**18), cost(2**20)
    assert large < 8 * small + 0.002, (small, large)


def test_a_kserve_access_line_with_a_quoted_long_query_is_an_access_line():
    """KServe's uvicorn_access format (python/kserve/kserve/logging.py) with a `"` and spaces in a 3 KiB query:
    the line is told by its opening and its close."""
    line = (
        '2025-10-27 20:05:09.123 uvicorn.access INFO:     10.0.0.1:52000 1 - "GET /v1/models?q="CUDA out of '
        "memory. Tried to allocate 2.00 GiB " + "x" * 3000 + ' HTTP/1.1" 200 OK'
    )
    parsed = make_line(0, line)
    assert parsed is not None and parsed.origin == ACCESS


def _kv(need: str, avail: str) -> str:
    return (
        RELEASE + E + "ValueError: To serve at least one request with the models's max seq len (131072), "
        f"({need} GiB KV cache is needed, which is larger than the available KV cache memory ({avail} GiB). "
        "Based on the available memory, the estimated maximum model length is 77952. Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n"
    )


@pytest.mark.parametrize(("need", "avail"), [("4.0", "4.0"), ("17.26", "17.2"), ("0.01", "0.0")])
def test_a_refusal_whose_figures_round_to_each_other_keeps_both(need, avail):
    """vLLM raises when needed > available and prints both with format_gib (2 decimals): they may print
    equal (vllm-ascend 0.23's "17.26 ... (17.2 GiB)" is a real pair), and the check leaves them."""
    d = classify(Signals(log=_kv(need, avail)))
    assert d.cause == "kv_cache_insufficient"
    assert d.numbers.get("needed_gib") == float(need) and d.numbers.get("available_gib") == float(avail)


@pytest.mark.parametrize(
    ("line", "keys"),
    [
        (  # vLLM 0.32 CPU worker (tests/fixtures/census: v0.32-cpu-auto-kv-exceeds-available)
            "ValueError: Available memory on node 0 (31.2/125.72 GiB) on kv cache allocation is less than "
            "requested memory for kv (98.5/115.66 GiB). Reduce CPU memory used by other processes.",
            ("free_gib", "total_gib", "requested_gib", "worker_budget_gib"),
        ),
        (  # vLLM 0.32 CPU worker at start-up (census; its free is the NUMA node's, below the node's total)
            "ValueError: Available memory on node 0 (22.41/125.72 GiB) on startup is less than desired CPU "
            "memory utilization (0.92, 115.66 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
            "controls the fraction of CPU memory reserved (despite its name).",
            ("free_gib", "total_gib", "requested_gib", "util"),
        ),
        (  # vLLM 0.9-0.11 GPU worker (corpus), a 4 GiB MIG slice
            "ValueError: Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 3.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes.",
            ("free_gib", "total_gib", "requested_gib", "util"),
        ),
        (  # torch before 2.2's wording (GPU 0; total capacity; already allocated; free; reserved)
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total "
            "capacity; 77.10 GiB already allocated; 17.06 MiB free; 78.20 GiB reserved in total by PyTorch)",
            ("tried_gib", "gpu_total_gib", "torch_allocated_gib", "gpu_free_gib", "reserved_gib"),
        ),
    ],
)
def test_real_figure_lines_keep_every_figure_under_the_new_checks(line, keys):
    d = classify(Signals(log=RELEASE + E + line + "\n"))
    assert all(k in d.numbers for k in keys), (d.numbers, d.notes)
    assert not [n for n in d.notes if n.startswith("ignored")], d.notes


def test_a_size_in_bytes_or_kib_is_kept_as_printed_not_rounded_to_zero():
    """torch prints "17.06 KiB is free" / "512 bytes is allocated by PyTorch" (an OOM at the first allocation,
    the GPU taken by another process): kept as tiny sizes, and the heal is that of the rounded-to-zero
    reading (own/free of ~0 are read as unknown or none alike)."""
    tiny = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
        "of 79.15 GiB of which 17.06 KiB is free. Process 1234 has 79.13 GiB memory in use. Of the allocated "
        "memory 512 bytes is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated."
    )
    zero = tiny.replace("17.06 KiB", "0 bytes").replace("512 bytes", "0 bytes")
    flags = "m --gpu-memory-utilization 0.9 --max-model-len 32768"
    a, b = (classify(Signals(log=RELEASE + E + t + "\n")) for t in (tiny, zero))
    assert 0 < a.numbers["gpu_free_gib"] < 1e-4
    assert (a.cause, a.subtype) == (b.cause, b.subtype)
    assert plan_from_command(flags, a, 80.0).action == plan_from_command(flags, b, 80.0).action
