"""Owns the diagnosis vocabulary: the Cause and EnginePhase tables, Signals in, Diagnosis out. Standard library only."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Cause(StrEnum):
    """Every cause a diagnosis can name: the one table the explanation (EXPLANATIONS below),
    advice (report.ADVICE) and remedy (remedy.PLANS) tables are keyed by."""

    KV_CACHE_INSUFFICIENT = "kv_cache_insufficient"
    GPU_UTIL_EXCEEDS_FREE = "gpu_util_exceeds_free"
    WEIGHTS_LOAD_OOM = "weights_load_oom"
    PROFILING_OOM = "profiling_oom"
    CUDAGRAPH_CAPTURE_OOM = "cudagraph_capture_oom"
    RUNTIME_OOM = "runtime_oom"
    MULTI_GPU_OOM = "multi_gpu_oom"
    HOST_RAM_OOM = "host_ram_oom"
    NOT_OOM = "not_oom"
    UNKNOWN = "unknown"


class EnginePhase(StrEnum):
    """Where in vLLM's start-up (or serving) the engine was, in the order vLLM goes through them."""

    LOAD = "load"
    PROFILE = "profile"
    KV = "kv-allocation"
    CAPTURE = "graph-capture"
    SERVING = "serving"
    UNKNOWN = "unknown"
    PREDICTED = "predicted"  # not a crash: the memory model's verdict before start (pre-flight)


# Short names for the members (the same objects, not another table).
(
    KV_CACHE_INSUFFICIENT,
    GPU_UTIL_EXCEEDS_FREE,
    WEIGHTS_LOAD_OOM,
    PROFILING_OOM,
    CUDAGRAPH_CAPTURE_OOM,
    RUNTIME_OOM,
    MULTI_GPU_OOM,
    HOST_RAM_OOM,
    NOT_OOM,
    UNKNOWN,
) = tuple(Cause)
CAUSES = tuple(Cause)
MEMORY_CAUSES = frozenset(Cause) - {Cause.NOT_OOM, Cause.UNKNOWN}

# What each cause means, in a diagnosis' explanation when nothing more specific is said.
EXPLANATIONS: dict[Cause, str] = {
    KV_CACHE_INSUFFICIENT: "The memory left for the KV cache cannot hold one request of max_model_len "
    "(or, for a Mamba hybrid, one state block for each of max_num_seqs sequences).",
    GPU_UTIL_EXCEEDS_FREE: "vLLM asked for more memory than was free: something else holds part of it.",
    WEIGHTS_LOAD_OOM: "The model weights do not fit in the GPU memory vLLM may use.",
    PROFILING_OOM: "Out of memory in the start-up profiling run (the dummy batch or sampler warm-up).",
    CUDAGRAPH_CAPTURE_OOM: "Out of memory while capturing CUDA graphs at the end of start-up.",
    RUNTIME_OOM: "Out of GPU memory while serving requests, after a successful start.",
    MULTI_GPU_OOM: "Out of memory on one GPU of a multi-GPU deployment.",
    HOST_RAM_OOM: "The machine or container ran out of host (CPU) RAM.",
    NOT_OOM: "The crash is not about memory; memory settings must not be changed for it.",
    UNKNOWN: "No known failure message was found.",
}

PHASE_LOAD, PHASE_PROFILE, PHASE_KV, PHASE_CAPTURE, PHASE_SERVING, PHASE_UNKNOWN, PHASE_PREDICTED = tuple(EnginePhase)
PHASES = tuple(EnginePhase)


@dataclass
class GpuInfo:
    index: int
    name: str = ""
    total_bytes: int = 0
    free_bytes: int = 0
    used_bytes: int = 0


@dataclass
class GpuProcess:
    pid: int
    gpu_index: int
    used_bytes: int
    name: str = ""


@dataclass
class GpuSnapshot:
    """GPU state as NVML saw it; `own_pids` are the processes of the engine itself."""

    gpus: list[GpuInfo] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    own_pids: list[int] = field(default_factory=list)
    error: str | None = None  # e.g. "no NVIDIA driver"

    def other_process_bytes(self, gpu_index: int | None = None) -> int:
        own = set(self.own_pids)
        return sum(
            p.used_bytes for p in self.processes if p.pid not in own and (gpu_index is None or p.gpu_index == gpu_index)
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GpuSnapshot | None:
        if not data:
            return None
        return cls(
            gpus=[GpuInfo(**g) for g in data.get("gpus", [])],
            processes=[GpuProcess(**p) for p in data.get("processes", [])],
            own_pids=list(data.get("own_pids", [])),
            error=data.get("error"),
        )


@dataclass
class Signals:
    """Everything a dead vLLM container leaves behind, plus what its deployment says."""

    log: str = ""  # any length; only the parts that matter are read
    exit_code: int | None = None
    reason: str | None = None  # container termination reason: OOMKilled, Error, ...
    termination_message: str | None = None
    ready_before: bool | None = None  # had the server answered /health before it died?
    gpu: GpuSnapshot | None = None
    # Deployment context (from the spec or the command line), used only to break ties.
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    gpu_count: int | None = None
    weights_gib_per_gpu: float | None = None  # the model's weights on one GPU, from the memory model


@dataclass
class Diagnosis:
    cause: Cause = Cause.UNKNOWN
    phase: EnginePhase = EnginePhase.UNKNOWN
    subtype: str | None = None
    evidence: list[str] = field(default_factory=list)
    numbers: dict[str, float | int] = field(default_factory=dict)
    explanation: str = ""
    confidence: str = "low"  # high: an explicit vLLM message; medium: inferred; low: guessed
    source: str = "log"  # log, exit-state, termination-message, log-tail-only
    notes: list[str] = field(default_factory=list)  # numbers dropped as implausible, lines ignored, ...

    def __post_init__(self) -> None:
        self.cause, self.phase = Cause(self.cause), EnginePhase(self.phase)  # a bad name is a bug: fail here

    @property
    def is_memory(self) -> bool:
        return self.cause in MEMORY_CAUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
