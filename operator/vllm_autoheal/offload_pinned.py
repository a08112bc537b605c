"""The host memory --cpu-offload-gb pins on each GPU's rank, and the most of it a container's limit holds.
Pure: no I/O.

vLLM's offloader (model_executor/offloader/uva.py; models/utils.py maybe_offload_to_cpu before 0.11) moves the
parameters of the decoder layers a rank holds to pinned host memory, layer by layer and in each layer's order,
until their bytes reach the figure (the parameter that crosses it moves too). torch's pinned allocator
(CachingHostAllocator) rounds each block up to a power of two, so a figure costs from once to nearly twice
itself: Llama-3.1-8B's layer of 416 MiB pins 480 (1.15x), Qwen2.5-7B's of 445 MiB pins 832 (1.87x). Measured on
an H100 (vLLM 0.25 on its V1 runner, tests/gpu/host_memory.sh): 4 and 8 GiB of Llama-3.1-8B offloaded 4.06 and
8.02 GiB and pinned 4.69 and 9.25 GiB (RssShmem, charged to the container), and 8 GiB of Qwen2.5-7B moved 8.12 and
pinned 15.19 GiB: the figures this module gives.
"""

from __future__ import annotations

import math

from .api import EngineArgs
from .diagnosis.units import GIB
from .flag_tokens import flag_value, spelled_by
from .local_ranks import data_parallel_here, ranks_here
from .model_shape import DTYPE_BYTES, ModelShape
from .model_weights import WEIGHT_BUFFERS_GIB, weights_gib_per_gpu

# What a figure costs where a layer's blocks are not known: a block rounded to a power of two is under twice it (the
# block that crosses the figure moves too, so a small figure beside huge blocks, Mixtral's experts, costs a little more)
ROUNDING_BOUND = 2.0
# What the container holds besides the offload (measured with vLLM 0.25 on Llama-3.1-8B, peak anonymous memory of
# all its processes: 2.55 GiB for the API server and engine core, 0.56 GiB more for each worker process a rank
# runs in), and a tenth of the limit kept for what varies (page cache while loading, a bigger tokenizer)
HOST_BASE_GIB = 2.6
HOST_PER_RANK_GIB = 0.6
LIMIT_MARGIN = 0.1
MOST_HOST_GIB = 2.0**20  # more host memory than any machine has (1 PiB): a figure past it sizes nothing
# Flags that choose another offloader or which parameters move (config/offload.py), in any spelling vLLM reads
OTHER_OFFLOAD_FLAGS = (
    "--cpu-offload-params",
    "--offload-backend",
    "--offload-group-size",
    "--offload-num-in-group",
    "--offload-prefetch-step",
    "--offload-params",
)


def layer_blocks(shape: ModelShape | None, engine: EngineArgs) -> tuple[int, ...] | None:
    """The bytes of one decoder layer's parameters on one rank, in the order vLLM moves them (attention's
    qkv_proj and its bias, o_proj; the MLP's gate_up_proj, down_proj; the two norms), for a dense, unquantized
    layer of attention and MLP under the UVA offloader; None for any other (the rounding's bound applies)."""
    if shape is None or (engine.quantization or shape.quantization) or not shape.heads or not shape.head_dim:
        return None
    if shape.experts or shape.is_mla or shape.state_layers or shape.blocks or shape.vision_params:
        return None
    if any(spelled_by(token, flag) for token in engine.extra_args for flag in OTHER_OFFLOAD_FLAGS):
        return None
    width = DTYPE_BYTES.get(engine.dtype or "auto", 2.0) if engine.dtype not in (None, "auto") else shape.served_bytes
    tp, h = engine.tensor_parallel_size, shape.hidden
    q = shape.heads // tp * shape.head_dim * (2 if shape.output_gate else 1)
    kv = max(1, (shape.kv_heads or shape.heads) // tp) * shape.head_dim  # (replicated where fewer than the ranks)
    mlp = shape.intermediate // tp
    params = (
        (q + 2 * kv) * h,
        (q + 2 * kv) if shape.qkv_bias else 0,
        h * shape.heads // tp * shape.head_dim,
        (2 if shape.gated_mlp else 1) * mlp * h,
        h * mlp,
        h,
        h,
    )
    return tuple(int(p * width) for p in params if p > 0)


def _pinned(block: int) -> int:
    return 1 << (block - 1).bit_length()


def _rank_layers(shape: ModelShape, engine: EngineArgs) -> int:
    return math.ceil(shape.layers / engine.pipeline_parallel_size)  # (the busiest stage)


def _walk(shape: ModelShape | None, engine: EngineArgs, figure: float | None) -> tuple[float, float]:
    """(moved, pinned) GiB on a rank for `figure` GiB of offload (default: the engine's), as the offloader moves
    them; (figure, twice it) where the layers are not laid out. Counted, never iterated over layers, so the work
    does not grow with a (possibly hostile) layer count."""
    target = (engine.cpu_offload_gb or 0.0) if figure is None else figure
    if target <= 0 or not math.isfinite(target):
        return (0.0, 0.0) if target <= 0 else (math.inf, math.inf)
    blocks = layer_blocks(shape, engine)
    if blocks is None or shape is None:
        return target, target * ROUNDING_BOUND
    limit, layer, pinned_layer = int(target * GIB), sum(blocks), sum(_pinned(b) for b in blocks)
    whole, layers = limit // layer, _rank_layers(shape, engine)
    if whole >= layers:
        return layers * layer / GIB, layers * pinned_layer / GIB
    moved, pinned = whole * layer, whole * pinned_layer
    for block in blocks:  # (the next layer's parameters, until the figure is reached)
        if moved >= limit:
            break
        moved, pinned = moved + block, pinned + _pinned(block)
    return moved / GIB, pinned / GIB


def pinned_gib(shape: ModelShape | None, engine: EngineArgs, figure: float | None = None) -> float:
    """The host memory `figure` GiB of offload (default: the engine's) pins on each rank."""
    return _walk(shape, engine, figure)[1]


def offloaded_gib(shape: ModelShape | None, engine: EngineArgs) -> float:
    """The weights the engine's offload moves off each GPU: the figure, and the rest of the parameter that
    crosses it (Llama-3.1-8B: 4.06 GiB for 4, as vLLM 0.25 printed), where the layers are laid out."""
    return _walk(shape, engine, None)[0]


def most_offload_gib(shape: ModelShape | None, engine: EngineArgs, host_gib: float) -> float:
    """The largest figure whose pinned memory on a rank stays within `host_gib` (inf where every layer fits)."""
    if host_gib <= 0:
        return 0.0
    blocks = layer_blocks(shape, engine)
    if blocks is None or shape is None:
        return host_gib / ROUNDING_BOUND
    room, layer, pinned_layer = int(host_gib * GIB), sum(blocks), sum(_pinned(b) for b in blocks)
    whole = room // pinned_layer
    if whole >= _rank_layers(shape, engine):
        return math.inf
    moved, pinned = whole * layer, whole * pinned_layer
    for block in blocks:
        if pinned + _pinned(block) > room:
            break
        moved, pinned = moved + block, pinned + _pinned(block)
    return moved / GIB


def besides_offload_gib(engine: EngineArgs) -> float | None:
    """Host memory these flags ask for besides the weights' offload: the KV cache's offloading buffer
    (--kv-offloading-size, GiB for all of an engine's TP ranks, config/cache.py) for each local data-parallel
    engine; None where the flags do not say how much (a connector of --kv-transfer-config, a size that is no
    number, ranks that cannot be told)."""
    args = engine.extra_args or []
    engines = data_parallel_here(args)
    if engines is None or any(spelled_by(token, "--kv-transfer-config") for token in args):
        return None
    size = flag_value(args, "--kv-offloading-size")
    if size is None:
        return 0.0
    try:
        gib = float(size)
    except ValueError:
        return None
    total = gib * engines
    return total if math.isfinite(total) and 0 <= total <= MOST_HOST_GIB else None


def _beside_offload(engine: EngineArgs) -> tuple[int, float] | None:
    """The ranks vLLM starts here and the host memory it holds besides the offload (HOST_BASE_GIB, HOST_PER_RANK_GIB
    a rank, a KV offloading buffer); None where either cannot be told."""
    ranks, besides = ranks_here(engine), besides_offload_gib(engine)
    if ranks is None or besides is None:
        return None
    return ranks, HOST_BASE_GIB + HOST_PER_RANK_GIB * ranks + besides


def held_beside_offload_gib(engine: EngineArgs) -> float | None:
    """What the container holds whatever the weights' offload (vLLM's processes, a KV offloading buffer): no
    offload cut frees it; None where it cannot be told."""
    beside = _beside_offload(engine)
    return None if beside is None else beside[1]


def offload_host_gib(memory_limit_bytes: int, engine: EngineArgs) -> float:
    """The host memory a container's limit leaves each rank's offload: the limit less a tenth, less what vLLM
    holds besides (_beside_offload), shared by every rank vLLM starts here; none where that cannot be told."""
    beside = _beside_offload(engine)
    if beside is None:
        return 0.0
    ranks, held = beside
    return max(memory_limit_bytes / GIB * (1 - LIMIT_MARGIN) - held, 0.0) / ranks


def least_pinned_gib(shape: ModelShape | None, engine: EngineArgs) -> tuple[float, bool] | None:
    """The host memory the engine's offload pins on each rank at the least, and whether that is the figure itself
    (True: the layers are laid out, pinned_gib) or a floor (False: the offloader moves parameters until their bytes
    reach the figure, or all the decoder layers hold, and pins each moved byte at least once); None where it
    cannot be told (no model shape, another offloader's flags)."""
    gb = engine.cpu_offload_gb or 0.0
    if gb <= 0:
        return 0.0, True
    if layer_blocks(shape, engine) is not None:
        return pinned_gib(shape, engine), True
    if shape is None or any(spelled_by(token, flag) for token in engine.extra_args for flag in OTHER_OFFLOAD_FLAGS):
        return None
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    embed = shape.embedding_params() if pp == 1 else shape.vocab * shape.hidden
    outside = (embed + shape.vision_params) * shape.served_bytes / tp / GIB + WEIGHT_BUFFERS_GIB
    layers = max(weights_gib_per_gpu(shape, engine) - outside, 0.0)  # (what the decoder layers hold on the rank)
    return min(gb, layers), False


def limit_for_pinned_gib(
    shape: ModelShape | None, engine: EngineArgs, offload_counts: bool = True
) -> tuple[float, bool] | None:
    """The least container limit that holds what the flags pin (the weights' offload on every rank, a KV offloading
    buffer) beside vLLM's processes, a tenth spare, and whether that is sized from the figure (True) or from the
    least the offload pins (False, least_pinned_gib); None where nothing is pinned (the kill is not the flags') or
    what is cannot be told. `offload_counts`: False where the release ignores --cpu-offload-gb."""
    beside = _beside_offload(engine)
    if beside is None:
        return None
    ranks, held = beside
    offload = least_pinned_gib(shape, engine) if offload_counts else (0.0, True)
    if offload is None or (offload[0] <= 0 and not besides_offload_gib(engine)):
        return None
    return (offload[0] * ranks + held) / (1 - LIMIT_MARGIN), offload[1]
