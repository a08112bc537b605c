"""Why did a vLLM server die? `classify(Signals) -> Diagnosis`. Standard library only, so the
in-pod launcher can run it with the vLLM image's own Python."""

from .classify import classify, classify_stream
from .model import CAUSES, MEMORY_CAUSES, PHASES, Diagnosis, GpuInfo, GpuProcess, GpuSnapshot, Signals
from .termination import from_termination_message

__all__ = [
    "classify",
    "classify_stream",
    "from_termination_message",
    "CAUSES",
    "MEMORY_CAUSES",
    "PHASES",
    "Diagnosis",
    "GpuInfo",
    "GpuProcess",
    "GpuSnapshot",
    "Signals",
]
