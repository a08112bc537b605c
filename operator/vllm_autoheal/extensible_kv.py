"""vLLM 0.34's extensible KV cache (vllm_release.Facts.extensible): whether it sizes an engine's cache, and
what it holds. Read in 0.34.0's sources:
- config/vllm.py _resolve_extensible_kv_cache: on by default on CUDA and ROCm, unless turned off, or
  kv_cache_memory_bytes, num_gpu_blocks_override, elastic EP or some KV connectors size the cache;
- v1/worker/utils.py request_memory: a budget above the memory free at start is no refusal (the cache
  only reserves address space for it);
- gpu_worker.py determine_available_memory: the "Available KV cache memory" line, and the start-up
  check that one request of max_model_len fits, are the budget's address space, as before 0.34;
- extensible_kv_cache.py measure_kv_cache_bytes, after warm-up and capture: the cache holds
  min(budget - what the engine holds, what is free - margin) - the transient reserve, where the
  engine holds the weights, non-torch memory and the captured graphs, the reserve is the profiled
  activation peak plus the graph estimate (gpu_worker.py peak_activation_memory, or a larger warm-up
  peak), and the margin max(1 GiB, 3 on ROCm, 0.75 x the reserve); v1/core/kv_cache_planning.py
  shrink_kv_cache_configs checks again that one request of max_model_len fits in that (the smaller:
  the one the memory model checks).
Pure: no I/O.
"""

from __future__ import annotations

from .api import EngineArgs
from .flag_tokens import flag_value, switched
from .vllm_release import Release, facts

# The flags with which vLLM sizes its KV cache otherwise: a block count given, elastic EP, a KV connector
# (some share the cache in ways a driver-mapped one cannot, and NIXL without an IMEX channel turns it
# off: which one is not known from here).
NOT_EXTENSIBLE_VALUES = ("--num-gpu-blocks-override", "--kv-transfer-config")
NOT_EXTENSIBLE_SWITCH = "--enable-elastic-ep"
# vLLM's parser pairs every `--enable-x` switch with `--disable-x` (utils/argparse_utils.py
# EnableDisableAction), beside argparse's own `--no-enable-x`.
SWITCH, DISABLE = "--enable-extensible-kv-cache", "--disable-extensible-kv-cache"
MARGIN_FLOOR_GIB = {"cuda": 1.0, "rocm": 3.0}  # KV_CACHE_MARGIN_FLOOR_BYTES
MARGIN_SHARE = 0.75  # KV_CACHE_MARGIN_FRACTION, of the transient reserve


def extensible_kv_cache(engine: EngineArgs, release: Release | None) -> bool:
    """Whether the release sizes this engine's KV cache after warm-up, as vLLM settles it: on unless
    `--no-enable-extensible-kv-cache` or `--disable-extensible-kv-cache`, kv_cache_memory_bytes, elastic EP or a flag of
    NOT_EXTENSIBLE_VALUES. Where the driver cannot map memory vLLM falls back to its estimate (and
    says so in its log): not known from here."""
    row = facts(release)
    if row is None or release is None or not row.extensible or engine.kv_cache_memory_bytes:
        return False
    args = engine.extra_args
    if switched_on(args) is False or switched(args, NOT_EXTENSIBLE_SWITCH):
        return False
    return all(flag_value(args, f) is None for f in NOT_EXTENSIBLE_VALUES)


def switched_on(args: list[str]) -> bool | None:
    """What the command line sets `enable_extensible_kv_cache` to (None: unset): the last of its
    spellings wins, as in argparse (the switch takes no value)."""
    value: bool | None = None
    for token in args:
        on, off = switched([token], SWITCH), switched([token], DISABLE)
        if on is not None:
            value = on
        elif off is not None:
            value = not off
    return value


def held_after_warmup_gib(
    release: Release | None,
    requested: float,
    free: float,
    held: float,
    activation: float,
    graphs: float,
) -> float:
    """GiB the extensible cache holds (unclamped; at most 0 where no block fits): `requested` the budget,
    `free` what is free at start (past the CUDA context), `held` the weights and non-torch memory,
    `activation` the profiled activation peak, `graphs` the captured graphs (0 where none). A larger
    warm-up peak and torch's reserve growth, which only the run measures, would take more."""
    reserve = activation + graphs
    return min(requested, free - margin_gib(release, reserve)) - held - graphs - reserve


def margin_gib(release: Release | None, reserve: float) -> float:
    """What the extensible cache leaves free of the memory free after warm-up, beside the `reserve` (the
    activation peak and the graph estimate) it keeps free in full: a budget past the free memory less this
    buys no cache."""
    floor = MARGIN_FLOOR_GIB["rocm" if release is not None and release.platform == "rocm" else "cuda"]
    return max(floor, MARGIN_SHARE * reserve)
