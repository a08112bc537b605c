"""Owns the human-readable text for a diagnosis and its remedy, and the ADVICE table (the CLI and `serve` print it)."""

from __future__ import annotations

from typing import Any

from .diagnosis import Diagnosis
from .diagnosis.model import Cause

# What to change when no engine args were given to size a remedy from.
ADVICE: dict[Cause, str] = {
    Cause.KV_CACHE_INSUFFICIENT: "Lower --max-model-len to the estimate vLLM printed, or raise "
    "--gpu-memory-utilization if the GPU has free memory; then --kv-cache-dtype fp8.",
    Cause.GPU_UTIL_EXCEEDS_FREE: "Set --gpu-memory-utilization to what is really free (free/total minus a margin), "
    "or stop the other process on the GPU.",
    Cause.WEIGHTS_LOAD_OOM: "The weights do not fit: use more GPUs (--tensor-parallel-size), a quantized checkpoint, "
    "or --cpu-offload-gb.",
    Cause.PROFILING_OOM: "Lower --max-num-seqs and/or --max-num-batched-tokens (the profiling batch), "
    "then --gpu-memory-utilization.",
    Cause.CUDAGRAPH_CAPTURE_OOM: "Add --enforce-eager (or capture fewer sizes), or lower --gpu-memory-utilization.",
    Cause.RUNTIME_OOM: "Leave headroom: lower --gpu-memory-utilization a step, then --max-num-seqs / "
    "--max-num-batched-tokens.",
    Cause.MULTI_GPU_OOM: "Lower --gpu-memory-utilization for the tight rank, balance the split, or --enforce-eager.",
    Cause.HOST_RAM_OOM: "Raise the container's memory limit, or lower --cpu-offload-gb / KV offload / swap space.",
    Cause.NOT_OOM: "Do not change memory settings; fix the error shown in the evidence.",
    Cause.UNKNOWN: "No known failure was found; read the full log (the cause sits above the last traceback).",
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_diagnosis(diag: Diagnosis, remedy: Any = None) -> str:
    head = f"cause:    {diag.cause}"
    if diag.subtype:
        head += f" ({diag.subtype})"
    lines = [head, f"phase:    {diag.phase}   confidence: {diag.confidence}   source: {diag.source}"]
    if diag.explanation:
        lines.append(f"why:      {diag.explanation}")
    if diag.evidence:
        lines.append("evidence:")
        lines += [f"  > {e}" for e in diag.evidence]
    if diag.numbers:
        lines.append("numbers:  " + "  ".join(f"{k}={_fmt(v)}" for k, v in diag.numbers.items()))
    if diag.notes:
        lines += [f"note:     {n}" for n in diag.notes]
    if remedy is not None:
        lines.append(f"remedy:   {remedy.summary()}")
    else:
        lines.append(f"change:   {ADVICE[diag.cause]}")
    return "\n".join(lines)


def render_plan(shape: Any, gpu: Any, first: Any, fixed: Any, vllm: str = "", share: str = "") -> str:
    """The fit table `vllm-autoheal plan` prints; `vllm`: which release's figures it used; `share`: the
    utilization the budget was sized at, and where it came from."""
    est = first.estimate
    rows = [
        ("model", f"{shape.architecture}, {shape.params() / 1e9:.2f} B parameters"),
        *([("vLLM", vllm)] if vllm else []),
        ("GPU", f"{gpu.name}: {gpu.memory_gib:g} GiB ({gpu.source}); free at start {est.gpu_free_gib:.2f} GiB"),
        ("requested", f"{est.requested_gib:.2f} GiB" + (f" ({share})" if share else "")),
        ("weights / GPU", f"{est.weights_gib:.2f} GiB"),
        ("activation peak", f"{est.activation_gib:.2f} GiB (max_num_batched_tokens {est.max_num_batched_tokens:,})"),
        ("non-torch", f"{est.non_torch_gib:.2f} GiB"),
        ("CUDA graphs", f"{est.cudagraph_gib:.2f} GiB ({'inside' if est.graphs_in_budget else 'outside'} the budget)"),
        ("KV cache", f"{est.kv_cache_gib:.2f} GiB = {est.kv_tokens:,} tokens ({est.kv_bytes_per_token:,} bytes/token)"),
        (
            "max_model_len",
            f"{est.max_model_len:,}; largest that fits {est.max_model_len_fit:,}; "
            f"concurrency at that length {est.max_concurrency:g}x",
        ),
        ("fits", "yes" if first.fits else ("" if first.unweighed else "NO: ") + "; ".join(first.reasons)),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if not first.fits and fixed.steps:
        flags = " ".join(s.flags() for s in fixed.steps)
        verdict = "fits" if fixed.fits else "still does not fit"
        lines.append(f"\nsuggestion ({verdict}): {flags}")
        lines += [f"  - {s.action}: {s.reason}" for s in fixed.steps]
        lines.append(f"  then: KV cache {fixed.estimate.kv_cache_gib:.2f} GiB = {fixed.estimate.kv_tokens:,} tokens")
    return "\n".join(lines)
