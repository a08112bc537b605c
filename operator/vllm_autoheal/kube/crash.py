"""What the operator reads of one crash: the launcher's termination message, else the crashed
container's previous log, classified with what the operator knows of the deployment (its TP/PP,
GPU count and the model's weights on one GPU) and of the pod (Ready before, exit state); and the
model's config, looked up once per crash before any status write takes the object's lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import model_source
from ..api import EngineArgs, VLLMService
from ..diagnosis import Diagnosis, Signals, classify, termination
from ..diagnosis.figures import MAX_GIB
from ..gpu_catalog import least_cuda_free_gib
from ..model_shape import ModelShape
from ..model_source import DEPRECATED_ANNOTATION
from ..model_weights import weights_gib_to_diagnose
from ..remedy.model import running_shape
from . import pods, resources
from .client import Kube
from .later import PerNamespace
from .resources import effective

if TYPE_CHECKING:
    from .heal import Incident

# Of kopf's worker threads (handlers.configure: 8), how many one namespace's log reads may hold at
# once: a read can take its whole budget (client.LOG_BUDGET_S) where a node stalls, and a tenant
# with more crashing replicas than workers would hold up every other tenant's heal meanwhile.
LOG_READS_PER_NAMESPACE = 2
# ...and all namespaces together: one tenant may own many namespaces (4 of them held all 8 workers).
LOG_READS_ON_WORKERS = 4
_worker_reads = threading.BoundedSemaphore(LOG_READS_ON_WORKERS)
# The rest are read from timer threads (kube/later.py), a few at once per namespace: bounded too, as
# each holds up to client.LOG_LIMIT_BYTES, and a crash loop of hundreds of replicas must not hold GiBs.
# A queued read waits for its slot however long: each read ends within LOG_BUDGET_S, so its turn
# comes, and reading anyway after a wait undid the bound for every crash behind 4 x the wait.
QUEUED_READS_PER_NAMESPACE = 4
# (each with the reads that use it now: a namespace's slots go once its reads are done, so namespaces
# made and gone, one per pull request, leave none behind)
_log_reads: dict[tuple[str, bool], tuple[threading.BoundedSemaphore, int]] = {}
_log_reads_guard = threading.Lock()


# Crashes waiting for a read off kopf's workers (each on a timer thread of its own), or being looked
# at there, per namespace at most this many: a crash loop of many pods queued a thread per crash,
# without end. A crash beyond it is looked at again on its pod's next event.
QUEUED_CRASHES_PER_NAMESPACE = 16
_queued = PerNamespace(QUEUED_CRASHES_PER_NAMESPACE)  # by crash id


class LogReadsBusy(Exception):
    """The namespace's log reads hold their share of kopf's workers: look at the crash off them."""


def queue_off_workers(crash_id: str, namespace: str) -> bool:
    """True once per crash until unqueue_off_workers (each of the pod's events would queue it again),
    while its namespace has fewer than QUEUED_CRASHES_PER_NAMESPACE queued."""
    return _queued.take(crash_id, namespace)


def unqueue_off_workers(crash_id: str) -> None:
    _queued.release(crash_id)


def _read_log(kube: Kube, incident: Incident) -> str:
    """The crashed container's previous log, within its namespace's share of concurrent reads: on a
    kopf worker a read beyond it (or beyond all namespaces' share) raises LogReadsBusy at once; off
    them (incident.off_workers) it waits its turn."""
    key = (incident.namespace, incident.off_workers)
    with _log_reads_guard:
        if key not in _log_reads:
            size = QUEUED_READS_PER_NAMESPACE if incident.off_workers else LOG_READS_PER_NAMESPACE
            _log_reads[key] = (threading.BoundedSemaphore(size), 0)
        slots, users = _log_reads[key]
        _log_reads[key] = (slots, users + 1)
    try:
        return _read_within(kube, incident, slots)
    finally:
        with _log_reads_guard:
            slots, users = _log_reads[key]
            if users > 1:
                _log_reads[key] = (slots, users - 1)
            else:
                del _log_reads[key]


def _read_within(kube: Kube, incident: Incident, slots: threading.BoundedSemaphore) -> str:
    held: list[threading.BoundedSemaphore] = []
    if incident.off_workers:
        slots.acquire()
        held.append(slots)
    elif incident.crash_id not in _queued:  # (a crash already queued is read there, once)
        for sem in (slots, _worker_reads):
            if not sem.acquire(blocking=False):
                break
            held.append(sem)
    try:
        if not incident.off_workers and len(held) < 2:
            raise LogReadsBusy(incident.namespace)
        return kube.previous_log(incident.namespace, incident.pod_name, resources.CONTAINER)
    finally:
        for sem in held:
            sem.release()


def _model_inputs(obj: VLLMService) -> tuple[Any, ...]:
    """What a model lookup reads of the object: its spec (the generation) and the deprecated annotation."""
    return obj.metadata.get("generation"), (obj.metadata.get("annotations") or {}).get(DEPRECATED_ANNOTATION)


@dataclass(frozen=True)
class ModelLookup:
    """A model's config looked up before a status write (a ConfigMap or Secret GET, or a wait for
    the Hub, must not hold the object's write lock), with what of the object it was looked up for."""

    resolved: model_source.Resolved
    inputs: tuple[Any, ...]

    @classmethod
    def of(cls, kube: Kube, obj: VLLMService) -> ModelLookup:
        return cls(model_source.for_service(obj, kube.get), _model_inputs(obj))

    def shape_for(self, kube: Kube, fresh: VLLMService) -> ModelShape | None:
        """The shape for the object as read under the lock: this lookup's, unless it changed since."""
        if self.inputs == _model_inputs(fresh):
            return self.resolved.shape
        return model_source.for_service(fresh, kube.get).shape


def diagnose(kube: Kube, incident: Incident, obj: VLLMService) -> Diagnosis:
    """Why the crash happened, from the launcher's termination message, else the container's
    previous log, with the deployment's context."""
    model, engine, _memory = effective(obj)
    signals: dict[str, Any] = dict(
        exit_code=incident.crash.get("exitCode"),
        reason=incident.crash.get("reason"),
        ready_before=pods.ready_before(incident.pod, incident.crash),
        tensor_parallel_size=engine.tensor_parallel_size,
        pipeline_parallel_size=engine.pipeline_parallel_size,
        gpu_count=resources.gpu_count(obj),
    )
    message = incident.crash.get("message")
    doc, incident.note = termination.read(message)
    if incident.note:  # written in the tenant's container and not the launcher's: read the log instead
        message = None
    else:  # (it only sizes this service's own heal, within its own bounds: a forged figure harms no other)
        incident.gpu_free_gib = launcher_free_gib(doc)
    diag = classify(Signals(termination_message=message, **signals))
    if diag.cause != "unknown" and diag.source in ("termination-message", "log"):
        return diag
    # The 2 KiB log tail never holds a vLLM root cause, and the launcher in the pod does not know
    # the model's size: read the crashed container's own log, with all the operator knows.
    log = _read_log(kube, incident)
    if log:
        shape = incident.model.resolved.shape if incident.model is not None and model == obj.spec.model else None
        runs, running = running_shape(obj.spec, model, engine, shape)
        # (a fallback's only where its width is known: a PatchSpec switch keeps the config it replaced)
        weights = weights_per_gpu(running if runs else shape, engine)
        # (with what the launcher's probe saw on the GPUs before vLLM started, as the launcher read it)
        gpu = termination.gpu_snapshot(doc)
        from_log = classify(Signals(log=log, weights_gib_per_gpu=weights, gpu=gpu, **signals))
        if from_log.cause != "unknown" or diag.cause == "unknown":
            return from_log
    return diag


def weights_per_gpu(shape: ModelShape | None, engine: EngineArgs) -> float | None:
    """The spec model's weights on one GPU by the memory model, with the flags that run, or None
    when its config is not at hand."""
    try:
        return weights_gib_to_diagnose(shape, engine) if shape is not None else None
    except Exception:  # noqa: BLE001 - a model we cannot size only leaves an OOM unplaced
        return None


def launcher_free_gib(doc: dict[str, Any] | None) -> float | None:
    """The least free memory CUDA could take on the pod's GPUs before vLLM started (the launcher's probe): what a
    heal may ask of each GPU beside other processes; None without a usable snapshot, or above what a heal record
    keeps (no GPU is that large)."""
    snapshot = termination.gpu_snapshot(doc)
    least = least_cuda_free_gib(snapshot.gpus) if snapshot is not None else None
    return least if least is not None and least <= MAX_GIB else None
