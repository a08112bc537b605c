"""Prometheus metrics of the operator, served on its /metrics port."""

from __future__ import annotations

import threading
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .api import Phase

REGISTRY = CollectorRegistry()
INCIDENTS = Counter("vllm_autoheal_incidents_total", "vLLM crashes diagnosed, by cause.", ["cause"], registry=REGISTRY)
HEALS = Counter("vllm_autoheal_heals_total", "Heals applied, by action.", ["action"], registry=REGISTRY)
EXHAUSTED = Counter(
    "vllm_autoheal_heals_exhausted_total",
    "Crashes the operator could not heal (attempts or bounds exhausted).",
    registry=REGISTRY,
)
HEAL_LATENCY = Histogram(
    "vllm_autoheal_heal_latency_seconds",
    "From a crash observed to the resource patched.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
SERVICES = Gauge("vllm_autoheal_services", "VLLMServices by phase.", ["phase"], registry=REGISTRY)
PHASES = get_args(Phase)  # the resource phases, from the API
_phase_of: dict[str, str] = {}
_guard = threading.Lock()  # (kopf's workers write phases side by side)


def set_phase(key: str, phase: str | None) -> None:
    """Track one VLLMService's phase (None when it is deleted) and move the gauge by it: the cost of a
    status write does not grow with the services (every tenant's) the table holds."""
    with _guard:
        before = _phase_of.pop(key, None)
        if phase is not None:
            _phase_of[key] = phase
        if before != phase:
            if before in PHASES:
                SERVICES.labels(phase=before).dec()
            if phase in PHASES:
                SERVICES.labels(phase=phase).inc()


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
