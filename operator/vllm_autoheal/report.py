"""Human-readable text for a diagnosis and its remedy (the CLI and `serve` print these)."""
from __future__ import annotations

from typing import Any

from .diagnosis import Diagnosis

# What to change when no engine args were given to size a remedy from.
ADVICE = {
    "kv_cache_insufficient": "Lower --max-model-len to the estimate vLLM printed, or raise "
                             "--gpu-memory-utilization if the GPU has free memory; then --kv-cache-dtype fp8.",
    "gpu_util_exceeds_free": "Set --gpu-memory-utilization to what is really free (free/total minus a margin), "
                             "or stop the other process on the GPU.",
    "weights_load_oom": "The weights do not fit: use more GPUs (--tensor-parallel-size), a quantized checkpoint, "
                        "or --cpu-offload-gb.",
    "profiling_oom": "Lower --max-num-seqs and/or --max-num-batched-tokens (the profiling batch), "
                     "then --gpu-memory-utilization.",
    "cudagraph_capture_oom": "Add --enforce-eager (or capture fewer sizes), or lower --gpu-memory-utilization.",
    "runtime_oom": "Leave headroom: lower --gpu-memory-utilization a step, then --max-num-seqs / "
                   "--max-num-batched-tokens.",
    "multi_gpu_oom": "Lower --gpu-memory-utilization for the tight rank, balance the split, or --enforce-eager.",
    "host_ram_oom": "Raise the container's memory limit, or lower --cpu-offload-gb / KV offload / swap space.",
    "not_oom": "Do not change memory settings; fix the error shown in the evidence.",
    "unknown": "No known failure was found; read the full log (the cause sits above the last traceback).",
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
    if remedy is not None:
        lines.append(f"remedy:   {remedy.summary()}")
    else:
        lines.append(f"change:   {ADVICE.get(diag.cause, ADVICE['unknown'])}")
    return "\n".join(lines)
