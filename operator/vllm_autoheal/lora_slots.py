"""The GPU memory `--enable-lora` takes at load: vLLM allocates every adapter slot up front (max_loras slots of
max_lora_rank for each LoRA-wrapped linear layer, lora/layers/base_linear.py create_lora_weights), inside the load
vLLM measures as "Model loading took", so off the KV budget. Pure: no I/O.

A slot of a decoder layer of attention and a dense MLP, on one rank: each linear layer's A (rank x its input) and B
(its output x rank), one pair for each slice of a merged layer (q, k and v; gate and up); a column-parallel layer's
B split over the ranks and its A whole, a row-parallel layer's A split and its B whole. Llama-3.1-8B: 81,920
elements a rank a layer, 1.25 GiB for 4 slots of rank 64 in bf16.
"""

from __future__ import annotations

from .api import EngineArgs
from .diagnosis.units import GIB
from .flag_tokens import flag_value, switched
from .model_shape import DTYPE_BYTES, ModelShape

DEFAULT_MAX_LORAS, DEFAULT_MAX_RANK = 1, 16  # vLLM's LoRAConfig defaults
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks LoRAConfig accepts (MaxLoRARanks)
LORA_DTYPES = ("auto", "float16", "bfloat16")  # (auto: the dtype the model runs in)


def lora_problem(engine: EngineArgs) -> str | None:
    """Why vLLM refuses the LoRA flags at start (LoRAConfig's checks), or None."""
    args = engine.extra_args or []
    if not switched(args, "--enable-lora"):
        return None
    rank, loras, dtype = (
        flag_value(args, "--max-lora-rank"),
        flag_value(args, "--max-loras"),
        flag_value(args, "--lora-dtype"),
    )
    if rank is not None and (_count(rank, DEFAULT_MAX_RANK) or 0) not in MAX_LORA_RANKS:
        return (
            f"--max-lora-rank {rank[:20]!r} is none of the ranks vLLM accepts ({', '.join(map(str, MAX_LORA_RANKS))})"
        )
    if loras is not None and _count(loras, DEFAULT_MAX_LORAS) is None:
        return f"--max-loras {loras[:20]!r} is no count of at least 1, which vLLM requires"
    cpu = flag_value(args, "--max-cpu-loras")
    if cpu is not None and (_count(cpu, 0) or 0) < (_count(loras, DEFAULT_MAX_LORAS) or 0):
        return f"--max-cpu-loras {cpu[:20]!r} is below --max-loras, which vLLM refuses (max_cpu_loras >= max_loras)"
    if dtype is not None and dtype not in LORA_DTYPES:
        return f"--lora-dtype {dtype[:20]!r} is none of {', '.join(LORA_DTYPES)}, which vLLM requires"
    return None


def lora_slots_gib(shape: ModelShape, engine: EngineArgs) -> float | None:
    """The adapter slots' memory on the busiest rank: 0 without --enable-lora; None where the flags or the layers
    do not say it plainly (a count that is no number, flags vLLM refuses, experts, MLA, state layers: layers whose
    adapters this does not lay out)."""
    args = engine.extra_args or []
    if not switched(args, "--enable-lora"):
        return 0.0
    loras, rank = (
        _count(flag_value(args, "--max-loras"), DEFAULT_MAX_LORAS),
        _count(flag_value(args, "--max-lora-rank"), DEFAULT_MAX_RANK),
    )
    # (a vision tower and its connector get no adapters: vLLM wraps the language model's layers alone)
    if loras is None or rank is None or shape.experts or shape.is_mla or shape.state_layers:
        return None
    if not shape.heads or not shape.head_dim:
        return None
    if lora_problem(engine):
        return None
    # (auto: the dtype the model runs in, --dtype's where given: LoRAConfig.verify_with_model_config)
    dtype = flag_value(args, "--lora-dtype")
    dtype = dtype if dtype not in (None, "auto") else engine.dtype
    width = DTYPE_BYTES.get(dtype, shape.served_bytes) if dtype not in (None, "auto") else shape.served_bytes
    tp, h, mlp = engine.tensor_parallel_size, shape.hidden, shape.intermediate
    q = shape.heads * shape.head_dim * (2 if shape.output_gate else 1)
    kv = (shape.kv_heads or shape.heads) * shape.head_dim
    merged = 2 if shape.gated_mlp else 1
    per_layer = (
        3 * h
        + (q + 2 * kv) / tp  # qkv: an A for each of q, k, v; B split
        + shape.heads * shape.head_dim / tp
        + h  # o_proj: A split, B whole
        + merged * h
        + merged * mlp / tp  # gate_up (or up): an A a slice; B split
        + mlp / tp
        + h  # down: A split, B whole
    )
    layers = -(-shape.layers // engine.pipeline_parallel_size)  # (the busiest stage)
    return per_layer * layers * loras * rank * width / GIB


def _count(text: str | None, default: int) -> int | None:
    if text is None:
        return default
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 and int(text) > 0 else None
