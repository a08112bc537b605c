"""Prometheus metrics of the operator, served on its /metrics port."""

from __future__ import annotations

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


def set_phase(key: str, phase: str | None) -> None:
    """Track one VLLMService's phase (None when it is deleted) and refresh the gauge."""
    if phase is None:
        _phase_of.pop(key, None)
    else:
        _phase_of[key] = phase
    for p in PHASES:
        SERVICES.labels(phase=p).set(sum(1 for v in _phase_of.values() if v == p))


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
