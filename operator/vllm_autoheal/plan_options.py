"""`plan`'s answer to "how many GPUs, which checkpoint": every tensor-parallel size 1-8 that
vLLM splits the model into, the model's own dtype and each quantized variant named, auto and fp8 KV cache,
each through the memory model; and a one-line memory bar per GPU. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .api import EngineArgs
from .gpu_catalog import GpuSpec, one_device_a_process
from .memory import Estimate, ModelShape, estimate
from .vllm_release import Release

MAX_TP = 8
KV_DTYPES = ("auto", "fp8")
BAR_WIDTH = 50
# (label, glyph, Estimate field) in the order vLLM takes the memory
SEGMENTS = (
    ("weights", "W", "weights_gib"),
    ("activation", "A", "activation_gib"),
    ("non-torch", "N", "non_torch_gib"),
    ("graphs", "G", "cudagraph_gib"),
    ("KV", "K", "kv_cache_gib"),
)


def longer_than_the_model(shape: ModelShape, engine: EngineArgs, allow_long: str | None) -> str | None:
    """Why vLLM refuses this --max-model-len before it starts, or None: above the longest context the
    config names (max_position_embeddings or its other names), unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is
    on (`allow_long`: its value). Not where RoPE scaling or --hf-overrides change that length, which vLLM
    derives its own way."""
    limit, asked = shape.max_position_embeddings, engine.max_model_len
    if not (limit and asked and asked > limit) or shape.positions_scaled:
        return None
    overrides = any(a.split("=", 1)[0].replace("_", "-") == "--hf-overrides" for a in engine.extra_args)
    if (allow_long or "").strip().lower() in ("1", "true") or overrides:
        return None
    return (
        f"--max-model-len {asked:,} is longer than the model's {limit:,} (max_position_embeddings): vLLM refuses "
        "to start with it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
    )


@dataclass
class Option:
    tensor_parallel_size: int
    quantization: str | None  # None: the checkpoint as it is (its dtype, or its own quantization)
    kv_cache_dtype: str
    estimate: Estimate
    pipeline_parallel_size: int = 1
    model_limit: int = 0  # the model's max_position_embeddings: no longer context is served
    smallest: bool = False

    @property
    def max_model_len_fit(self) -> int:
        fit = self.estimate.max_model_len_fit
        return min(fit, self.model_limit) if self.model_limit else fit

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "gpus": self.gpus,
            "fits": e.fits,
            "weights_gib": round(e.weights_gib, 3),
            "kv_tokens": e.kv_tokens,
            "max_model_len_fit": self.max_model_len_fit,
            "max_concurrency": e.max_concurrency,
            "failure": e.failure,
            "smallest": self.smallest,
        }


def tensor_parallel_sizes(shape: ModelShape) -> list[int]:
    """The sizes vLLM can split the heads and KV heads over (ModelShape.splits)."""
    return [tp for tp in range(1, MAX_TP + 1) if shape.splits(tp)]


def options(
    shape: ModelShape,
    engine: EngineArgs,
    gpu: GpuSpec,
    free_gib: float | None = None,
    entrypoint: str = "server",
    quantized_variants: list[str] | None = None,
    release: Release | None = None,
) -> list[Option]:
    """Each combination at the asked flags otherwise; the smallest that fits is marked: fewest
    GPUs, then the checkpoint as it is before a quantized one, then auto KV before fp8. `release`: the
    vLLM release whose figures to use (memory.estimate)."""
    variants = [None, *[q for q in dict.fromkeys(quantized_variants or []) if q != shape.quantization]]
    out = []
    # (a MIG slice or a time-sliced replica: one device a process, no split over them)
    sizes = [1] if one_device_a_process(gpu.name) else tensor_parallel_sizes(shape)
    for tp in sizes:
        for quant in variants:
            for kv in KV_DTYPES:
                e = engine.model_copy(
                    update={
                        "tensor_parallel_size": tp,
                        "kv_cache_dtype": kv,
                        "quantization": quant or engine.quantization,
                    }
                )
                # (a variant is another checkpoint, whose config names no cache of its own: auto is the dtype)
                weighed = replace(shape, auto_kv_dtype=None) if quant else shape
                out.append(
                    Option(
                        tp,
                        quant,
                        kv,
                        estimate(weighed, e, gpu, free_gib, entrypoint, release),
                        pipeline_parallel_size=engine.pipeline_parallel_size,
                        model_limit=shape.max_position_embeddings,
                    )
                )
    fitting = [o for o in out if o.estimate.fits]
    if fitting:
        min(
            fitting, key=lambda o: (o.gpus, variants.index(o.quantization), KV_DTYPES.index(o.kv_cache_dtype))
        ).smallest = True
    return out


def render_options(opts: list[Option], max_model_len: int) -> str:
    head = (
        f"{'':2}{'TP':>3} {'GPUs':>4}  {'weights':<12} {'KV cache':<8} {'weights/GPU':>11} {'KV tokens':>11} "
        f"{'max len fits':>12} {'conc. @ ' + format(max_model_len, ','):>16}  fits"
    )
    lines = [head]
    for o in opts:
        e = o.estimate
        lines.append(
            f"{'*' if o.smallest else '':2}{o.tensor_parallel_size:>3} {o.gpus:>4}  "
            f"{o.quantization or 'as is':<12} {o.kv_cache_dtype:<8} {e.weights_gib:>7.2f} GiB "
            f"{e.kv_tokens:>11,} {o.max_model_len_fit:>12,} {e.max_concurrency:>15g}x  "
            f"{'yes' if e.fits else 'no: ' + (e.failure or '')}"
        )
    lines.append("max len fits: the longest request the KV cache holds, at most the model's own context")
    if any(o.smallest for o in opts):
        lines.append("* the smallest option that fits (fewest GPUs; the checkpoint as it is; auto KV cache)")
    else:
        lines.append("none fits: more GPUs (pipeline parallelism), a smaller context, or another GPU")
    return "\n".join(lines)


def memory_bar(e: Estimate, width: int = BAR_WIDTH) -> str:
    """One GPU's memory as vLLM takes it: W weights | A activation | N non-torch | G graphs | K KV | . free;
    ! marks what does not fit in the GPU."""
    used = [(glyph, max(getattr(e, attr), 0.0)) for _, glyph, attr in SEGMENTS]
    taken = sum(g for _, g in used) + (e.gpu_total_gib - e.gpu_free_gib)  # another process's share: x
    scale = width / max(e.gpu_total_gib, taken, 1e-9)
    bar, edge = "", 0.0
    for glyph, gib in [("x", e.gpu_total_gib - e.gpu_free_gib), *used]:
        edge += gib * scale
        bar += glyph * (round(edge) - len(bar))
    limit = round(e.gpu_total_gib * scale)
    bar = bar[:limit] + "!" * (len(bar) - limit) if len(bar) > limit else bar + "." * (width - len(bar))
    free = e.gpu_total_gib - taken
    return (
        f"[{bar}] "
        + " ".join(f"{glyph} {getattr(e, attr):.1f}" for _, glyph, attr in SEGMENTS)
        + (f" free {free:.1f} GiB" if free >= 0 else f" over by {-free:.1f} GiB")
    )


def render_bars(e: Estimate, gpus: int) -> str:
    legend = "W weights | A activation | N non-torch | G CUDA graphs | K KV cache | . free | x other processes"
    return "\n".join([f"memory per GPU ({legend}):"] + [f"  GPU {i} {memory_bar(e)}" for i in range(gpus)])
