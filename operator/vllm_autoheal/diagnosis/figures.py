"""Numbers read from vLLM's messages, each checked for plausibility before anything uses it.
Standard library only.

One table says what each number is (a size in GiB, a token length, a utilization, a count)
and so which values are possible. A number outside its range (NaN, infinite, negative where
vLLM never prints a negative, zero where it prints only a positive size, larger than the GPU, a
length of 2^24 or more, a utilization outside (0, 1], digits other than ASCII's) or against its
own line (ORDERED; arithmetic.numbers) is dropped, with a note saying which and why: a remedy
sized from a wrong number is worse than none.
"""

from __future__ import annotations

import math
import re

from .units import GB, GIB, KB, KIB, MB, MIB, TB, TIB

SIZE, SIGNED_SIZE, LENGTH, UTIL, COUNT, RATIO = "size", "signed-size", "length", "util", "count", "ratio"
POSITIVE_SIZE = "positive-size"  # a size vLLM prints only above zero (a device, a need, a request)
MAX_GIB = 4096.0  # no device, nor a node's RAM for the CPU backend, is larger
MIN_GIB = 1 / GIB  # one byte
MAX_LENGTH = 2**24  # no model has a context this long
MAX_COUNT = 2**31

KIND = {
    "free_gib": SIZE,
    "total_gib": POSITIVE_SIZE,
    "requested_gib": POSITIVE_SIZE,
    "engine_budget_gib": POSITIVE_SIZE,
    "external_gib": SIZE,  # a model's weights another process holds for vLLM (0.32's IPC weight cache)
    "mm_reserved_gib": SIZE,  # what 0.32's frontend multimodal decoding takes out of the KV cache's budget
    "kv_fixed_gib": SIZE,  # the KV cache --kv-cache-memory-bytes fixed, whatever the utilization  # what a utilization leaves beside weights held outside the engine
    "needed_gib": POSITIVE_SIZE,
    "available_gib": SIZE,
    "initial_free_gib": SIZE,
    "current_free_gib": SIZE,
    "worker_gib": SIZE,
    "worker_budget_gib": SIZE,  # the CPU worker's whole share, when vLLM sized its KV space from it
    "tried_gib": SIZE,
    "gpu_total_gib": POSITIVE_SIZE,
    "gpu_free_gib": SIZE,
    "own_gib": SIZE,
    "torch_allocated_gib": SIZE,
    "reserved_gib": SIZE,
    "private_pools_gib": SIZE,
    "requested_kv_gib": POSITIVE_SIZE,
    "node_total_gib": POSITIVE_SIZE,
    "weights_gib": SIZE,
    "initial_usage_gib": SIZE,
    "available_kv_gib": SIGNED_SIZE,
    "kv_reserved_gib": SIGNED_SIZE,
    "max_seq_len": LENGTH,
    "estimated_max_model_len": LENGTH,
    "kv_tokens": LENGTH,
    "kv_cache_tokens": LENGTH,
    "max_model_len": LENGTH,
    "util": UTIL,
    "dummy_requests": COUNT,
    "gpu_blocks": COUNT,
    "max_num_seqs": COUNT,
    "mamba_blocks": COUNT,
    "oom_gpu": COUNT,
    "tp": COUNT,
    "pp": COUNT,
    "max_concurrency": RATIO,
    "process_gib": SIZE,
    # 0.34's extensible cache: the transient peak it keeps free after warm-up, 0.75 x which it also leaves free
    "warmup_peak_gib": SIZE,
    "graphs_gib": SIZE,  # vLLM's estimate of the CUDA graphs it reserves inside the budget
    "util_with_graphs": UTIL,  # ... and the utilization it equals without them ("is equivalent to")
    "util_without_graphs": UTIL,
    "vllm_minor": COUNT,  # the release the engine named: 0.minor.patch
    "vllm_patch": COUNT,
}
SIZES = (SIZE, SIGNED_SIZE, POSITIVE_SIZE)
# Figures one message orders ("X GiB KV cache is needed, which is larger than the available KV cache
# memory (Y GiB)"): the first above the second. A line that says otherwise contradicts its own words,
# and which of the two is wrong cannot be told.
ORDERED = (("needed_gib", "available_gib"),)
# Sizes of what is on the device, so no larger than it (what was asked for can be larger). Not torch's
# free figure: on an APU (AMD Strix Halo) the HIP allocator reports the shared pool as free beside the
# VRAM window as total, "a total capacity of 15.49 GiB of which 84.98 GiB is free" (ROCm/TheRock#4598).
DEVICE_BOUNDED = {
    "free_gib",
    "available_gib",
    "initial_free_gib",
    "current_free_gib",
    "own_gib",
    "torch_allocated_gib",
    "reserved_gib",
    "weights_gib",
    "available_kv_gib",
    "kv_reserved_gib",
    "graphs_gib",
    "warmup_peak_gib",
    "engine_budget_gib",
    "external_gib",
    "mm_reserved_gib",
    "kv_fixed_gib",
}
# vLLM prints GiB as "GB" (format_gib), so GB counts as GiB; the other decimal units are what they say.
_UNIT = {
    "": 1.0,
    "B": 1 / GIB,
    "bytes": 1 / GIB,
    "KB": KB / GIB,
    "KiB": KIB / GIB,
    "MB": MB / GIB,
    "MiB": MIB / GIB,
    "GB": 1.0,
    "GiB": 1.0,
    "TB": TB / GB,
    "TiB": TIB / GIB,
}
_SIZE = re.compile(r"(-?[\d.]{1,30})\s*([KMGT]i?B|B|bytes)?")
_PROCESS_GIB = re.compile(r"Process \d{1,10} has ([\d.]{1,20}) ([GM])iB")


def gib(text: str) -> float:
    """'246.00 MiB' -> 0.24; vLLM's 'GB' is really GiB (format_gib), so GB counts as GiB. NaN if unreadable
    (digits other than ASCII's too: vLLM never prints them, though float() reads them)."""
    t = text.replace(",", "").strip()
    if not t.isascii():
        return math.nan
    mt = _SIZE.match(t)
    if not mt:
        return math.nan
    try:
        value = float(mt.group(1))
    except ValueError:
        return math.nan
    size = value * _UNIT.get(mt.group(2) or "", 1.0)
    rounded = round(size, 4)
    return rounded if rounded or not size else size  # (never a printed size rounded to none: check() judges it)


def parse(key: str, text: str) -> float | int | None:
    kind = KIND.get(key)
    if kind is None:
        return None
    if kind in SIZES:
        return gib(text)
    try:
        if kind in (UTIL, RATIO):
            return float(text)
        return int(text.replace(",", ""))
    except ValueError:
        return None


def check(key: str, value: float | int, device_gib: float | None) -> str | None:
    """Why `value` cannot be what vLLM meant for `key`, or None when it is plausible."""
    kind = KIND.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    if not math.isfinite(value):
        return "not finite"
    if kind == SIGNED_SIZE:
        if abs(value) > MAX_GIB:
            return f"larger than {MAX_GIB:g} GiB"
    elif value < 0:
        return "negative"
    if kind in SIZES:
        limit = device_gib * 1.02 if device_gib and key in DEVICE_BOUNDED else MAX_GIB
        if abs(value) > limit:
            return f"larger than the device ({limit:.1f} GiB)"
        if kind == POSITIVE_SIZE and value == 0:
            return "zero where vLLM prints a positive size"
        if 0 < abs(value) < MIN_GIB:
            return "less than a byte"  # (no tool prints that; a divisor this small sizes anything to infinity)
    elif kind == LENGTH:
        if value >= MAX_LENGTH or (value == 0 and key != "kv_tokens"):
            return "not a plausible length"
    elif kind == UTIL:
        if not 0 < value <= 1:
            return "outside (0, 1]"
    elif kind == COUNT:
        if value >= MAX_COUNT:
            return "too large"
    elif kind == RATIO and value > 1e7:
        return "too large"
    return None


def contradicts(above: float, below: float) -> bool:
    """`above` is below `below` by more than the rounding of two printed figures (0.01 GiB, or 2 %)."""
    return above < below - max(0.01, 0.02 * below)


def process_sizes(text: str) -> list[float]:
    """Sizes of the other processes torch lists in its OOM message ('Process 12 has 3.1 GiB ...')."""
    sizes = []
    for value, unit in _PROCESS_GIB.findall(text):
        try:
            size = float(value) * (1 if unit == "G" else 1 / 1024)
        except ValueError:
            continue
        if math.isfinite(size) and 0 <= size <= MAX_GIB:
            sizes.append(round(size, 2))
    return sizes
