"""VLLMService -> Deployment, Service (and PVC) manifests. Pure: the same code serves the
operator and `vllm-autoheal render`.

Only the effective engine args (and model, memory limit) reach the pod template, so a heal
rolls the pods out and nothing else does. The template carries a hash of them, which the
operator uses to ignore crashes of pods that still run flags it already healed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .. import __version__
from ..api import GROUP, KIND, LAUNCHER_MOUNT, SHM_CEILING, VERSION, Deployed, EngineArgs, VLLMService, VLLMServiceSpec
from ..engine import to_command
from ..quantity import format_bytes, parse_quantity
from ..remedy_gate import fingerprint

LAUNCHER_DIR = "/opt/vllm-autoheal"  # where the operator image keeps the package (Dockerfile)
SHARED_DIR = LAUNCHER_MOUNT  # the emptyDir the init container copies it into
CONTAINER = "vllm"
SERVICE_LABEL = f"{GROUP}/service"
MANAGED_BY, MANAGER = "app.kubernetes.io/managed-by", "vllm-autoheal"  # (what the operator's watches select)
ENGINE_HASH = f"{GROUP}/engine-hash"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DEFAULT_OPERATOR_IMAGE = f"ghcr.io/vllm-autoheal/vllm-autoheal:{__version__}"  # its init container copies the launcher


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "inference-server",
        MANAGED_BY: MANAGER,
        "app.kubernetes.io/part-of": "vllm-autoheal",
        SERVICE_LABEL: name,
    }


def selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": name, SERVICE_LABEL: name}


def engine_hash(model: str, engine: EngineArgs, memory_limit: str | None) -> str:
    return fingerprint(model, engine, memory_limit)


def gpu_count(obj: VLLMService) -> int:
    """nvidia.com/gpu per pod: always the deployed engine's TP x PP (a heal may have changed it)."""
    _model, engine, _memory = effective(obj)
    if obj.spec.resources.gpus is not None and engine == obj.spec.engine:
        return obj.spec.resources.gpus
    return engine.tensor_parallel_size * engine.pipeline_parallel_size


def sized_for(obj: VLLMService) -> str:
    """A digest of what heals and pre-flight size their flags for, besides spec.engine: the model,
    the memory limit and the GPU (status.baselineFor)."""
    spec = obj.spec
    facts = [spec.model, spec.resources.limits.memory, spec.resources.gpu_product, spec.resources.gpu_memory_gib]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


def on_baseline(obj: VLLMService) -> bool:
    """The spec is still what status.baseline was taken from. In StatusOverrides mode only a person
    writes the spec, so a change of the model, memory limit or GPU counts as well as one of
    spec.engine (a baseline of an older version, without baselineFor, is judged by the engine alone);
    in PatchSpec mode heals write the model and memory limit into the spec themselves."""
    status = obj.status
    if status.baseline is None or status.baseline != obj.spec.engine:
        return False
    return obj.spec.heal.mode != "StatusOverrides" or status.baseline_for in (None, sized_for(obj))


def effective(obj: VLLMService) -> tuple[str, EngineArgs, str | None]:
    """(model, engine args, memory limit) to deploy. status.effective (a heal in StatusOverrides
    mode, or pre-flight's fitting flags) applies while the spec is still the baseline it was made
    for (on_baseline), and only within what the spec and its heal policy allow (overrides_refused);
    once a person changes the spec, the spec wins again."""
    spec, status = obj.spec, obj.status
    model, engine, memory = spec.model, spec.engine, spec.resources.limits.memory
    if status.effective is not None and on_baseline(obj) and overrides_refused(obj) is None:
        engine = status.effective
        model = status.effective_model or model
        memory = status.effective_memory_limit or memory
    return model, engine, memory


def overrides_refused(obj: VLLMService) -> str | None:
    """Why status's overrides ask for more than the spec and its heal policy allow, or None. A heal and
    pre-flight never do (the safety gate holds them to spec.heal.bounds), but status is no proof of
    who wrote it: a role that grants a tenant `vllmservices/status` (a wildcard over the group's
    resources does) would otherwise deploy GPUs, memory or a model past what admission allowed the
    spec. The other flags run in the tenant's own pod alone, under the CRD's own rules for them."""
    status = obj.status
    if status.effective is None:
        return None
    fields = ("status.effectiveModel", "status.effective", "status.effectiveMemoryLimit")
    target = Deployed.model_construct(
        engine=status.effective,
        model=status.effective_model or obj.spec.model,
        memory_limit=status.effective_memory_limit,
    )
    return past_policy(obj.spec, target, fields)


def past_policy(spec: VLLMServiceSpec, target: Deployed, fields: tuple[str, str, str]) -> str | None:
    """Why `target` (what status says to deploy: overrides, or a heal recorded in flight) asks for more than
    the spec and its heal policy allow, or None. `fields`: where status holds its model, engine and memory
    limit, to name them."""
    engine, bounds, (model_at, engine_at, memory_at) = target.engine, spec.heal.bounds, fields
    fallback = spec.heal.quantized_fallback
    if target.model not in (spec.model, fallback.model if fallback.allowed else None):
        return f"{model_at} is neither spec.model nor the quantized fallback the policy allows"
    if engine.pipeline_parallel_size != spec.engine.pipeline_parallel_size:
        return f"{engine_at}.pipelineParallelSize differs from the spec's (no heal changes it)"
    if list(engine.extra_args or []) != list(spec.engine.extra_args or []):
        # (no heal changes them: another repository's code, a tokenizer or a draft model, comes in through them)
        return f"{engine_at}.extraArgs differ from the spec's (no heal changes them)"
    top = max(spec.engine.tensor_parallel_size, bounds.max_tensor_parallel_size or 0)
    if engine.tensor_parallel_size > top:
        return f"{engine_at}.tensorParallelSize {engine.tensor_parallel_size} is above {top}"
    memory = target.memory_limit
    if memory is not None and memory != spec.resources.limits.memory:
        try:
            caps = [parse_quantity(q) for q in (spec.resources.limits.memory, bounds.max_memory_limit) if q]
            above = not caps or parse_quantity(memory) > max(caps)
        except ValueError:
            above = True
        if above:
            return f"{memory_at} {memory} is above the spec's limit and heal.bounds.maxMemoryLimit"
    return None


def owner_reference(meta: dict[str, Any]) -> list[dict[str, Any]]:
    if not meta.get("uid"):
        return []  # `render` of a file: not created yet, so nothing to own it
    return [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(obj: VLLMService, name: str) -> dict[str, Any]:
    meta = {"name": name, "labels": labels(obj.metadata["name"]), "ownerReferences": owner_reference(obj.metadata)}
    if obj.metadata.get("namespace"):
        meta["namespace"] = obj.metadata["namespace"]
    return meta


def escape(text: str) -> str:
    """The kubelet expands $(VAR) in a container's command, args and env values: a user string
    must reach vLLM as written, not as the value of another variable (a Secret's, say). Every "$" is
    doubled: the kubelet reads "$$" as "$", so "$$(X)" written by a user stays "$$(X)" too."""
    return text.replace("$", "$$")


# The vLLM container: no privilege escalation, no capabilities (vLLM needs none on a GPU node).
# Non-root is left to spec.runAsNonRoot, since vLLM's official images run as root.
def container_security(**extra: Any) -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, **extra}


def shm_size(obj: VLLMService) -> str:
    """/dev/shm is memory counted against the container: never above its memory limit or the ceiling."""
    wanted = parse_quantity(obj.spec.resources.shm_size)
    bound = parse_quantity(SHM_CEILING)
    memory_limit = effective(obj)[2]
    if memory_limit:
        bound = min(bound, parse_quantity(memory_limit))
    return obj.spec.resources.shm_size if wanted <= bound else format_bytes(bound)


def _env(obj: VLLMService) -> list[dict[str, Any]]:
    env = [{**e.wire(), "value": escape(e.value)} if e.value is not None else e.wire() for e in obj.spec.env]
    if obj.spec.hf_token_secret_ref:
        ref = obj.spec.hf_token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if obj.spec.launcher:
        env.append({"name": "PYTHONPATH", "value": SHARED_DIR})
    return env


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def cache_claim_name(obj: VLLMService) -> str:
    return obj.spec.model_cache.claim_name or f"{obj.metadata['name']}-model-cache"


def deployment(obj: VLLMService, operator_image: str = DEFAULT_OPERATOR_IMAGE) -> dict[str, Any]:
    spec, name = obj.spec, obj.metadata["name"]
    model, engine, memory_limit = effective(obj)
    serve_args = ["--host", "0.0.0.0", "--port", str(spec.port)]
    if spec.served_model_name:
        serve_args += ["--served-model-name", spec.served_model_name]
    command = to_command(model, engine, serve_args=serve_args)
    if spec.launcher:
        command = ["python3", "-m", "vllm_autoheal.launcher", "--", *command]
    command = [escape(token) for token in command]
    gpus = gpu_count(obj)
    res = spec.resources
    limits: dict[str, Any] = {GPU_RESOURCE: gpus} if gpus else {}
    requests: dict[str, Any] = {GPU_RESOURCE: gpus} if gpus else {}
    for key, value in (("cpu", res.limits.cpu), ("memory", memory_limit)):
        if value:
            limits[key] = value
    for key, value in (("cpu", res.requests.cpu), ("memory", res.requests.memory)):
        if value:
            requests[key] = value
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(obj)}}]
    if spec.model_cache.enabled:
        mounts.append({"name": "model-cache", "mountPath": spec.model_cache.mount_path})
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": cache_claim_name(obj)}})
    init = []
    if spec.launcher:
        mounts.append({"name": "autoheal", "mountPath": SHARED_DIR, "readOnly": True})
        volumes.append({"name": "autoheal", "emptyDir": {"sizeLimit": "64Mi"}})
        init.append(
            {
                "name": "autoheal-launcher",
                "image": operator_image,
                "command": ["cp", "-r", f"{LAUNCHER_DIR}/vllm_autoheal", f"{SHARED_DIR}/"],
                "volumeMounts": [{"name": "autoheal", "mountPath": SHARED_DIR}],
                # the operator image runs as a non-root user and only copies files
                "securityContext": container_security(readOnlyRootFilesystem=True, runAsNonRoot=True),
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
            }
        )
    container = {
        "name": CONTAINER,
        "image": spec.image,
        "command": command,
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}],
        "env": _env(obj),
        "envFrom": [e.wire() for e in spec.env_from],
        "resources": {"limits": limits, "requests": requests},
        "volumeMounts": mounts,
        # Model loads take minutes: the startup probe allows 30, then liveness takes over.
        "startupProbe": _probe("/health", 10, 180),
        "readinessProbe": _probe("/health", 10, 3),
        "livenessProbe": _probe("/health", 15, 4),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(**({"runAsNonRoot": True} if spec.run_as_non_root else {})),
    }
    node_selector = dict(res.node_selector)
    if res.gpu_product:
        node_selector[GPU_PRODUCT_LABEL] = res.gpu_product
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [t.wire() for t in res.tolerations]
    pod_labels = labels(name)
    template = {
        "metadata": {"labels": pod_labels, "annotations": {ENGINE_HASH: engine_hash(model, engine, memory_limit)}},
        "spec": {
            "initContainers": init,
            "containers": [container],
            "volumes": volumes,
            "nodeSelector": node_selector,
            "tolerations": tolerations,
            # vLLM never talks to the Kubernetes API: no token in the pod for it to leak.
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "terminationGracePeriodSeconds": 60,
            "restartPolicy": "Always",
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(obj, name),
        # maxSurge 0: a GPU node rarely has a spare GPU for a surge pod; replace in place.
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": template,
        },
    }


def service(obj: VLLMService) -> dict[str, Any]:
    name = obj.metadata["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(obj, name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(name),
            "ports": [{"name": "http", "port": obj.spec.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def model_cache_claim(obj: VLLMService) -> dict[str, Any] | None:
    cache = obj.spec.model_cache
    if not cache.enabled or cache.claim_name:
        return None
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(obj, cache_claim_name(obj)),
        "spec": spec,
    }


def endpoint(obj: VLLMService) -> str:
    return f"http://{obj.metadata['name']}.{obj.metadata.get('namespace', 'default')}.svc:{obj.spec.port}/v1"


def render(obj: VLLMService, operator_image: str = DEFAULT_OPERATOR_IMAGE) -> list[dict[str, Any]]:
    """Every object the operator applies for this VLLMService, in apply order."""
    out = [m for m in (model_cache_claim(obj),) if m is not None]
    return out + [deployment(obj, operator_image), service(obj)]
