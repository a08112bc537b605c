"""A VLLMService's spec: the model, the engine, where and with what its pods run, and the heal policy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..vllm_release import Release, env_keeps_release, logged_on, parse_image
from .config_json import DNS_SUBDOMAIN, ModelConfigSource
from .engine_args import EngineArgs
from .heal_policy import HealPolicy
from .schema import NOT_A_FLAG, QUANTITY_PATTERN, Model, cel, nested, quantity_le, rule

DEFAULT_IMAGE = "vllm/vllm-openai:v0.33.0"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# An absolute path without empty, "." or ".." segments.
MOUNT_PATH_PATTERN = r"^(/\.{0,2}[A-Za-z0-9_-][A-Za-z0-9._-]*)+$"
LAUNCHER_MOUNT = "/autoheal"  # the emptyDir the init container copies the launcher into
# Paths the pod itself needs: a volume there (or above) would hide the launcher, /dev/shm, the
# termination log, the service-account mount or the image's own Python and vLLM.
RESERVED_MOUNT_PATHS = (
    LAUNCHER_MOUNT,
    "/dev",
    "/proc",
    "/sys",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/var/run/secrets",
)
# /dev/shm is memory; the pod renders it no larger than the memory limit, and never above this.
SHM_CEILING = "64Gi"
PreflightMode = Literal["Fix", "Warn", "Off"]
# Kubernetes' own bounds for what the pod template carries (the API server refuses more there, after the
# VLLMService was admitted), and one for an env value (kopf's copy of the spec in an annotation keeps a
# long value as its digest: kube/diffbase.py).
QUALIFIED_NAME = 316  # a label or taint key: a 253-character prefix, "/", 63 characters
LABEL_VALUE = 63
ENV_VALUE = 32768
# What the NVIDIA container toolkit reads to choose a container's GPUs and their features: set in the pod
# spec they would override the device plugin's own (the kubelet puts the container's env last), and on
# nodes whose toolkit takes the variable the pod would see GPUs other pods were given.
DEVICE_PLUGIN_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_IMEX_CHANNELS")
DEVICE_PLUGIN_ENV_PREFIX = "NVIDIA_MIG_"


class Toleration(Model):
    key: str | None = Field(None, max_length=QUALIFIED_NAME, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal.")
    value: str | None = Field(None, max_length=LABEL_VALUE, description="Taint value to match with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; unset = all effects."
    )
    toleration_seconds: int | None = Field(None, description="How long a NoExecute taint is tolerated.")


class ComputeAmounts(Model):
    cpu: str | None = Field(None, pattern=QUANTITY_PATTERN, max_length=32, description="CPU quantity, e.g. 4 or 500m.")
    memory: str | None = Field(None, pattern=QUANTITY_PATTERN, max_length=32, description="Memory quantity, e.g. 64Gi.")


class Resources(Model):
    """Where and with what the vLLM pods run."""

    model_config = cel(
        rule(
            quantity_le("requests.memory", "limits.memory"),
            "requests.memory must be <= limits.memory",
            ".requests.memory",
        ),
        rule(quantity_le("requests.cpu", "limits.cpu"), "requests.cpu must be <= limits.cpu", ".requests.cpu"),
        rule(
            f"!has(self.shmSize) || quantity(self.shmSize).compareTo(quantity('{SHM_CEILING}')) <= 0",
            f"shmSize must be <= {SHM_CEILING} (/dev/shm is memory on the node)",
            ".shmSize",
        ),
    )
    gpus: int | None = Field(
        None, ge=0, le=64, description=("nvidia.com/gpu per pod; unset = tensorParallelSize x pipelineParallelSize.")
    )
    gpu_product: str | None = Field(
        None,
        max_length=128,
        description=(
            "GPU product as GPU feature discovery labels nodes (nvidia.com/gpu.product), e.g. NVIDIA-H100-80GB-HBM3."
        ),
    )
    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description=("Memory of one GPU in GiB, for pre-flight when the product is not in the built-in catalog."),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra node labels the pods require.",
        json_schema_extra={"additionalProperties": {"type": "string", "maxLength": LABEL_VALUE}},
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=64,
        description=("Tolerations added to the default nvidia.com/gpu NoSchedule toleration."),
    )
    requests: ComputeAmounts = nested(ComputeAmounts, "CPU and memory requests of the vLLM container.")
    limits: ComputeAmounts = nested(ComputeAmounts, "CPU and memory limits of the vLLM container.")
    shm_size: str = Field(
        "8Gi",
        pattern=QUANTITY_PATTERN,
        max_length=32,
        description=(
            f"Size of /dev/shm (memory-backed), used by NCCL and vLLM's IPC buffers; at most {SHM_CEILING}, "
            "and no more than limits.memory when that is set."
        ),
    )


class ModelCache(Model):
    """A PersistentVolumeClaim mounted as the Hugging Face cache, so restarts skip the download."""

    model_config = cel(
        rule(
            "!self.enabled || has(self.claimName) != has(self.size)",
            "set exactly one of claimName (use an existing PVC) or size (create one)",
            ".claimName",
        ),
        rule(
            f"!has(self.mountPath) || !{list(RESERVED_MOUNT_PATHS)!r}.exists(r, self.mountPath == r || "
            "self.mountPath.startsWith(r + '/') || r.startsWith(self.mountPath + '/'))",
            f"mountPath must not be, contain or lie under a path the pod needs: {', '.join(RESERVED_MOUNT_PATHS)}",
            ".mountPath",
        ),
    )
    enabled: bool = Field(False, description="Mount a PVC as the model cache.")
    claim_name: str | None = Field(None, pattern=DNS_LABEL, max_length=63, description="An existing PVC to mount.")
    size: str | None = Field(None, pattern=QUANTITY_PATTERN, description="Size of a PVC the operator creates.")
    storage_class_name: str | None = Field(
        None, pattern=DNS_SUBDOMAIN, max_length=253, description="Storage class of the created PVC."
    )
    mount_path: str = Field(
        "/root/.cache/huggingface",
        pattern=MOUNT_PATH_PATTERN,
        max_length=256,
        description="Where the cache is mounted (not a path the pod itself needs).",
    )


class KeyRef(Model):
    # an object's name, never a path: the operator reads the Secret itself (a name with "../" would
    # reach another namespace's)
    name: str = Field(..., pattern=DNS_SUBDOMAIN, max_length=253, description="Object name.")
    key: str = Field(..., min_length=1, description="Key in the object's data.")
    optional: bool | None = Field(None, description="Start even if it is missing.")


class EnvSource(Model):
    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")


class EnvVar(Model):
    model_config = cel(
        rule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both", ".valueFrom")
    )
    name: str = Field(..., pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=256, description="Variable name.")
    value: str | None = Field(None, max_length=ENV_VALUE, description="Literal value.")
    value_from: EnvSource | None = Field(None, description="Value from a Secret or ConfigMap key.")


class NamedRef(Model):
    name: str = Field(..., pattern=DNS_SUBDOMAIN, max_length=253, description="Object name.")


class EnvFromSource(Model):
    prefix: str | None = Field(None, max_length=253, description="Prefix added to every variable name.")
    secret_ref: NamedRef | None = Field(None, description="All keys of a Secret.")
    config_map_ref: NamedRef | None = Field(None, description="All keys of a ConfigMap.")


class VLLMServiceSpec(Model):
    """A vLLM OpenAI-compatible server, kept running through memory failures."""

    model_config = cel(
        rule(
            "!has(self.resources.gpus) || self.resources.gpus == "
            "self.engine.tensorParallelSize * self.engine.pipelineParallelSize",
            "resources.gpus must equal engine.tensorParallelSize x engine.pipelineParallelSize",
            ".resources.gpus",
        ),
        rule(
            "!has(self.heal.bounds.maxTensorParallelSize) || "
            "self.heal.bounds.maxTensorParallelSize >= self.engine.tensorParallelSize",
            "heal.bounds.maxTensorParallelSize must be >= engine.tensorParallelSize",
            ".heal.bounds.maxTensorParallelSize",
        ),
        rule(
            "!has(self.heal.bounds.maxMemoryLimit) || !has(self.resources.limits.memory) || "
            "quantity(self.resources.limits.memory).compareTo(quantity(self.heal.bounds.maxMemoryLimit)) <= 0",
            "heal.bounds.maxMemoryLimit must be >= resources.limits.memory",
            ".heal.bounds.maxMemoryLimit",
        ),
        # The Deployment is written by server-side apply, which refuses an env list naming a
        # variable twice (with a 500 the operator would retry forever): the operator's own too.
        rule(
            "self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "env must not name a variable twice",
            ".env",
        ),
        rule(
            "!self.launcher || !self.env.exists(e, e.name == 'PYTHONPATH')",
            "env must not set PYTHONPATH while launcher is on (the launcher's own)",
            ".env",
        ),
        rule(
            f"!self.env.exists(e, e.name in {list(DEVICE_PLUGIN_ENV)} || e.name.startsWith('{DEVICE_PLUGIN_ENV_PREFIX}'))",
            f"env must not set {', '.join(DEVICE_PLUGIN_ENV)} or {DEVICE_PLUGIN_ENV_PREFIX}*: the device plugin's own",
            ".env",
        ),
        # (a prefix that, with a key of a ConfigMap or Secret, would spell one of them)
        rule(
            "!self.envFrom.exists(f, has(f.prefix) && f.prefix != '' && ("
            f"{[*DEVICE_PLUGIN_ENV, DEVICE_PLUGIN_ENV_PREFIX]}.exists(n, n.startsWith(f.prefix))"
            f" || f.prefix.startsWith('{DEVICE_PLUGIN_ENV_PREFIX}')))",
            "envFrom[].prefix must not begin a variable the device plugin sets "
            f"({', '.join(DEVICE_PLUGIN_ENV)}, {DEVICE_PLUGIN_ENV_PREFIX}*)",
            ".envFrom",
        ),
        rule(
            "!has(self.hfTokenSecretRef) || !self.env.exists(e, e.name == 'HF_TOKEN')",
            "env must not set HF_TOKEN while hfTokenSecretRef does",
            ".env",
        ),
        rule(
            "!('IncreaseTensorParallel' in self.heal.allowedActions) || has(self.heal.bounds.maxTensorParallelSize)",
            "IncreaseTensorParallel needs heal.bounds.maxTensorParallelSize",
            ".heal.allowedActions",
        ),
    )
    model: str = Field(
        ..., min_length=1, max_length=512, pattern=NOT_A_FLAG, description="Hugging Face model id or a local path."
    )
    served_model_name: str | None = Field(
        None, max_length=256, pattern=NOT_A_FLAG, description="Name clients use; unset = model."
    )
    image: str = Field(DEFAULT_IMAGE, pattern=r"^\S+$", max_length=512, description="vLLM container image.")
    replicas: int = Field(1, ge=0, le=1000, description="Number of vLLM pods.")
    port: int = Field(8000, ge=1, le=65535, description="Port vLLM serves on.")
    run_as_non_root: bool = Field(
        False,
        description=(
            "Require the vLLM container to run as a non-root user; the image must name one. Off by default "
            "because vLLM's official images run as root (the pod drops every capability either way)."
        ),
    )
    launcher: bool = Field(
        True,
        description=(
            "Wrap vLLM in the autoheal launcher, which writes a diagnosis to the termination message. "
            "Turn off for images without Python."
        ),
    )
    engine: EngineArgs = nested(EngineArgs, "vLLM engine flags.")
    resources: Resources = nested(Resources, "GPUs, placement, CPU and memory.")
    model_cache: ModelCache = nested(ModelCache, "PVC for the model cache.")
    hf_token_secret_ref: KeyRef | None = Field(
        None,
        description=(
            "Secret key exposed to vLLM as HF_TOKEN; the operator also uses it to read config.json from the Hub."
        ),
    )
    model_config_source: ModelConfigSource | None = Field(
        None,
        alias="modelConfig",
        description=(
            "The model's config.json for pre-flight and heals: inline or a ConfigMap; unset = from the Hub by "
            "spec.model. Replaces the deprecated vllm.autoheal.dev/model-config annotation."
        ),
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=128, description="Extra environment variables.")
    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=32, description="Environment from objects.")
    heal: HealPolicy = nested(HealPolicy, "Healing policy.")
    preflight: PreflightMode = Field(
        "Warn",
        description=(
            "Check before start that the model fits the GPU: Fix = start with fitting flags, "
            "Warn = only report (MemoryFit condition), Off = skip."
        ),
    )

    def release(self, logged: Release | None = None) -> Release | None:
        """The vLLM release the pod runs: the image's tag (vllm_release.parse_image), else the one its
        engine's log named (`logged`, where a tag such as latest names none; a ROCm image's as ROCm's);
        None where neither says, or where the pod's environment picks another runner, sampler or graph
        estimate than the release's default."""
        release = parse_image(self.image) or logged_on(self.image, logged)
        return release if env_keeps_release(release, {var.name: var.value for var in self.env}) else None

    def gpu_count(self) -> int:
        if self.resources.gpus is not None:
            return self.resources.gpus
        return self.engine.tensor_parallel_size * self.engine.pipeline_parallel_size
