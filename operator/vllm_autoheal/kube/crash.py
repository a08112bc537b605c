"""What the operator reads of one crash: the launcher's termination message, else the crashed
container's previous log, classified with what the operator knows of the deployment (its TP/PP,
GPU count and the model's weights on one GPU) and of the pod (Ready before, exit state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import model_source
from ..api import EngineArgs, VLLMService
from ..diagnosis import Diagnosis, Signals, classify, termination
from ..memory import weights_gib_to_diagnose
from . import pods, resources
from .client import Kube
from .resources import effective

if TYPE_CHECKING:
    from .heal import Incident


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
    diag = classify(Signals(termination_message=message, **signals))
    if diag.cause != "unknown" and diag.source in ("termination-message", "log"):
        return diag
    # The 2 KiB log tail never holds a vLLM root cause, and the launcher in the pod does not know
    # the model's size: read the crashed container's own log, with all the operator knows.
    log = kube.previous_log(incident.namespace, incident.pod_name, resources.CONTAINER)
    if log:
        weights = weights_per_gpu(kube, obj, engine) if model == obj.spec.model else None  # a fallback: another size
        # (with what the launcher's probe saw on the GPUs before vLLM started, as the launcher read it)
        gpu = termination.gpu_snapshot(doc)
        from_log = classify(Signals(log=log, weights_gib_per_gpu=weights, gpu=gpu, **signals))
        if from_log.cause != "unknown" or diag.cause == "unknown":
            return from_log
    return diag


def weights_per_gpu(kube: Kube, obj: VLLMService, engine: EngineArgs) -> float | None:
    """The spec model's weights on one GPU by the memory model, with the flags that run, or None
    when its config is not at hand (the lookup is cached and bounded by the Hub timeout)."""
    try:
        shape = model_source.for_service(obj, kube.get).shape
        return weights_gib_to_diagnose(shape, engine) if shape is not None else None
    except Exception:  # noqa: BLE001 - a model we cannot size only leaves an OOM unplaced
        return None
