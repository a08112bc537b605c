"""Owns the VLLMService API (vllm.autoheal.dev/v1alpha1) as pydantic v2 models, and the HealAction table.

These models are the one source of truth: the CRD in ``crds/`` is generated from
them (``crd.py``), the operator parses objects with them, and the planner reads
bounds from them. Field names are snake_case in Python and camelCase on the wire.
Cross-field rules are CEL (``x-kubernetes-validations``) so the API server, not
the operator, rejects a bad resource, with a message that names the field.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.alias_generators import to_camel

from . import model_config as mc
from .diagnosis.model import Cause, EnginePhase

GROUP = "vllm.autoheal.dev"
VERSION = "v1alpha1"
KIND = "VLLMService"
PLURAL = "vllmservices"
SINGULAR = "vllmservice"
SHORT_NAMES = ["vllmsvc", "vsvc"]
DEFAULT_IMAGE = "vllm/vllm-openai:v0.33.0"
MAX_HEAL_RECORDS = 20
MAX_OBSERVED_CRASHES = 50
MAX_TRIED = 64
MAX_FAILED_ENGINES = 32
# The CRD's ranges for the sizes a heal may set: generous, but finite, so an absurd number
# (1e30 from a forged termination message, 1.49e53 from a runaway estimate) is refused.
MAX_TOKENS = 2**24  # 16M tokens of context or batch
MAX_SEQS = 2**20  # vLLM sets no limit; a million sequences is past any GPU
MAX_GPU_BYTES = 2**44  # 16 TiB of KV cache on one GPU
MAX_OFFLOAD_GIB = 4096.0

# A Kubernetes resource quantity (the apimachinery grammar, without exponents).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
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
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

Quantization = Literal[
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "bitsandbytes",
    "fp8",
    "fbgemm_fp8",
    "compressed-tensors",
    "modelopt",
    "modelopt_fp4",
    "gguf",
    "marlin",
    "experts_int8",
    "mxfp4",
    "ptpc_fp8",
    "torchao",
    "inc",
    "quark",
    "moe_wna16",
]
KVCacheDtype = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"]
ModelDtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
HealMode = Literal["PatchSpec", "StatusOverrides"]
PreflightMode = Literal["Fix", "Warn", "Off"]
UnschedulablePolicy = Literal["Revert", "Wait"]
HealAction = Literal[
    "RaiseGpuMemoryUtilization",
    "LowerGpuMemoryUtilization",
    "LowerMaxModelLen",
    "LowerMaxNumSeqs",
    "LowerMaxNumBatchedTokens",
    "EnforceEager",
    "Fp8KvCache",
    "SetKvCacheMemoryBytes",
    "IncreaseTensorParallel",
    "CpuOffload",
    "LowerCpuOffload",
    "RaiseMemoryLimit",
    "Quantize",
]
ALL_ACTIONS: list[str] = list(get_args(HealAction))
NoHeal = Literal["NoChange", "GiveUp"]  # the planner's outcomes that change nothing
OperatorAction = Literal["RevertUnschedulable"]  # the operator's own, decided by heal.unschedulable
RecordedAction = Literal[HealAction, NoHeal, OperatorAction]
Phase = Literal["Pending", "Progressing", "Running", "Healing", "Degraded", "Failed"]


def rule(expr: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """One CEL rule; fieldPath makes the API server name the offending field."""
    out = {"rule": expr, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def cel(*rules: dict[str, Any]) -> ConfigDict:
    """Model config carrying CEL rules (merged with Model's own config by pydantic)."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": list(rules)})


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        """The camelCase dict as the API server stores it (unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def nested(cls: type[Model], description: str) -> Any:
    """An optional sub-object, present with its defaults when left out."""
    return Field(default_factory=cls, description=description)


class EngineArgs(Model):
    """vLLM engine flags the operator understands and may change when healing."""

    model_config = cel(
        rule(
            "!has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens >= self.maxNumSeqs",
            "maxNumBatchedTokens must be >= maxNumSeqs (vLLM refuses to start otherwise)",
            ".maxNumBatchedTokens",
        ),
        # extraArgs' rules are generated from engine.py's flag tables (crd.py adds them).
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of each GPU's memory vLLM may use (weights, activations, KV cache)."
    )
    max_model_len: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="Longest request (prompt + output) in tokens; unset = the model's own limit.",
    )
    max_num_seqs: int | None = Field(
        None, ge=1, le=MAX_SEQS, description="Most sequences batched at once; unset = vLLM's per-GPU default."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Most tokens in one scheduler step; sets the activation peak."
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs one model copy is split across.")
    pipeline_parallel_size: int = Field(1, ge=1, le=64, description="Pipeline stages (GPUs in sequence).")
    dtype: ModelDtype | None = Field(None, description="Weight/activation dtype; unset = vLLM's auto.")
    quantization: Quantization | None = Field(
        None, description="Weight quantization method; unset = read from the checkpoint."
    )
    kv_cache_dtype: KVCacheDtype | None = Field(None, description="KV cache dtype; fp8 halves KV memory per token.")
    kv_cache_memory_bytes: int | None = Field(
        None,
        ge=1,
        le=MAX_GPU_BYTES,
        description="Fixed KV cache size per GPU in bytes; overrides gpuMemoryUtilization for KV.",
    )
    cpu_offload_gb: float | None = Field(
        None,
        ge=0,
        le=MAX_OFFLOAD_GIB,
        description="GiB of weights per GPU kept in host RAM (slower, saves GPU memory).",
    )
    enforce_eager: bool | None = Field(
        None, description="Skip CUDA-graph capture (saves its memory, costs some speed)."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Further `vllm serve` arguments, passed in order after the typed ones.",
        json_schema_extra={"items": {"type": "string", "maxLength": 512}},
    )


class Toleration(Model):
    key: str | None = Field(None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value to match with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; unset = all effects."
    )
    toleration_seconds: int | None = Field(None, description="How long a NoExecute taint is tolerated.")


class ComputeAmounts(Model):
    cpu: str | None = Field(None, pattern=QUANTITY_PATTERN, max_length=32, description="CPU quantity, e.g. 4 or 500m.")
    memory: str | None = Field(None, pattern=QUANTITY_PATTERN, max_length=32, description="Memory quantity, e.g. 64Gi.")


def quantity_le(lhs: str, rhs: str) -> str:
    """CEL: lhs <= rhs for two optional quantity fields of self."""
    return f"!has(self.{lhs}) || !has(self.{rhs}) || quantity(self.{lhs}).compareTo(quantity(self.{rhs})) <= 0"


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
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node labels the pods require.")
    tolerations: list[Toleration] = Field(
        default_factory=list, description=("Tolerations added to the default nvidia.com/gpu NoSchedule toleration.")
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
    storage_class_name: str | None = Field(None, description="Storage class of the created PVC.")
    mount_path: str = Field(
        "/root/.cache/huggingface",
        pattern=MOUNT_PATH_PATTERN,
        max_length=256,
        description="Where the cache is mounted (not a path the pod itself needs).",
    )


class KeyRef(Model):
    name: str = Field(..., min_length=1, max_length=253, description="Object name.")
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
    value: str | None = Field(None, description="Literal value.")
    value_from: EnvSource | None = Field(None, description="Value from a Secret or ConfigMap key.")


class NamedRef(Model):
    name: str = Field(..., min_length=1, max_length=253, description="Object name.")


class EnvFromSource(Model):
    prefix: str | None = Field(None, description="Prefix added to every variable name.")
    secret_ref: NamedRef | None = Field(None, description="All keys of a Secret.")
    config_map_ref: NamedRef | None = Field(None, description="All keys of a ConfigMap.")


class ConfigJsonBase(BaseModel):
    """config.json fields keep config.json's own spelling (snake_case), so a file pastes as is."""

    model_config = ConfigDict(extra="ignore")


class QuantizationConfig(ConfigJsonBase):
    quant_method: str | None = Field(None, max_length=64, description="The checkpoint's quantization method.")
    bits: int | None = Field(
        None, ge=1, le=32, description="Bits per quantized weight (compressed-tensors: its weights' num_bits)."
    )


# The fields the memory model reads, typed and ranged from the one table in model_config.py.
ConfigJson = create_model(  # type: ignore[call-overload]
    "ConfigJson",
    __base__=ConfigJsonBase,
    __doc__="The fields of the model's config.json that size it.",
    **{
        f.name: (
            int if f.required else int | None,
            Field(... if f.required else None, ge=f.low, le=f.high, description=f.description),
        )
        for f in mc.FIELDS
    },
    **{
        name: (str | None, Field(None, max_length=limit, description=f"config.json's {name}."))
        for name, limit in mc.STRINGS.items()
    },
    architectures=(
        list[str] | None,
        Field(
            None,
            max_length=mc.MAX_ARCHITECTURES,
            description="Architecture names.",
            json_schema_extra={"items": {"type": "string", "maxLength": mc.MAX_NAME}},
        ),
    ),
    tie_word_embeddings=(bool | None, Field(None, description="Input and output embeddings shared.")),
    attention_bias=(bool | None, Field(None, description="q/k/v projections carry a bias.")),
    quantization_config=(QuantizationConfig | None, Field(None, description="The checkpoint's quantization.")),
)
ConfigJson.model_config["json_schema_extra"] = {
    "x-kubernetes-validations": [
        rule(
            "!has(self.num_key_value_heads) || self.num_key_value_heads <= self.num_attention_heads",
            "num_key_value_heads must be <= num_attention_heads",
            ".num_key_value_heads",
        )
    ]
}
ConfigJson.model_rebuild(force=True)


class ConfigMapKeyRef(Model):
    name: str = Field(..., pattern=DNS_SUBDOMAIN, max_length=253, description="ConfigMap name.")
    key: str = Field(
        "config.json", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253, description="Key holding the config.json text."
    )


class ModelConfigSource(Model):
    """Where pre-flight and heals read the model's shape; unset = config.json from the Hub."""

    model_config = cel(
        rule("!(has(self.inline) && has(self.configMapRef))", "set inline or configMapRef, not both", ".inline")
    )
    inline: ConfigJson | None = Field(
        None,
        description=("config.json's fields, as the file spells them (a multimodal model: its text_config)."),
    )
    config_map_ref: ConfigMapKeyRef | None = Field(
        None, description="A ConfigMap key holding config.json (at most 1 MiB)."
    )
    revision: str | None = Field(
        None,
        pattern=r"^[\w./-]+$",
        max_length=128,
        description=("Hub revision (branch, tag or commit) of config.json; unset = main."),
    )


class HealBounds(Model):
    """The limits no heal may cross; the operator gives up rather than leave them."""

    model_config = cel(
        rule(
            "!has(self.minGpuMemoryUtilization) || self.minGpuMemoryUtilization <= self.maxGpuMemoryUtilization",
            "minGpuMemoryUtilization must be <= maxGpuMemoryUtilization",
            ".minGpuMemoryUtilization",
        ),
    )
    min_gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "Lowest utilization a heal may set; unset = what the weights, activation peak and a KV cache of "
            "minMaxModelLen need when the model's shape is known, else vLLM's own figures decide."
        ),
    )
    max_gpu_memory_utilization: float = Field(0.95, gt=0, le=1, description="Highest utilization a heal may set.")
    min_max_model_len: int = Field(2048, ge=1, le=MAX_TOKENS, description="Shortest maxModelLen a heal may set.")
    min_max_num_seqs: int = Field(8, ge=1, le=MAX_SEQS, description="Fewest maxNumSeqs a heal may set.")
    min_max_num_batched_tokens: int = Field(
        512, ge=1, le=MAX_TOKENS, description=("Fewest maxNumBatchedTokens a heal may set.")
    )
    min_kv_cache_memory_bytes: int = Field(
        2**28, ge=1, le=MAX_GPU_BYTES, description=("Smallest kvCacheMemoryBytes a heal may set.")
    )
    max_cpu_offload_gb: float | None = Field(
        None,
        ge=0,
        le=MAX_OFFLOAD_GIB,
        description=("Most cpuOffloadGb a heal may set; unset = no more than the container's memory limit holds."),
    )
    max_tensor_parallel_size: int | None = Field(
        None, ge=1, le=64, description=("Largest tensorParallelSize a heal may set; unset = never raise it.")
    )
    max_memory_limit: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description=("Largest container memory limit a host-RAM heal may set; unset = never raise it."),
    )


class QuantizedFallback(Model):
    """A quantized checkpoint to switch to when the weights do not fit."""

    model_config = cel(
        rule("!self.allowed || (has(self.model) && has(self.method))", "allowed needs both model and method", ".model"),
    )
    allowed: bool = Field(False, description="May a heal switch to the quantized model?")
    model: str | None = Field(None, min_length=1, max_length=512, description="The quantized model (HF id or path).")
    method: Quantization | None = Field(None, description="Its quantization method.")


class HealPolicy(Model):
    """How, how often and how far the operator may change the engine flags."""

    enabled: bool = Field(True, description="Heal memory crashes; false = only diagnose and report.")
    mode: HealMode = Field(
        "PatchSpec",
        description=(
            "PatchSpec: write the healed flags into spec.engine. "
            "StatusOverrides: keep spec untouched (GitOps) and deploy from status.effective."
        ),
    )
    max_attempts: int = Field(5, ge=1, le=50, description="Heals allowed before giving up (HealExhausted).")
    backoff_seconds: int = Field(30, ge=0, le=3600, description="Least time between two heals.")
    unschedulable_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description=("How long a healed pod may stay Unschedulable before the heal counts as blocked (HealBlocked)."),
    )
    on_unschedulable: UnschedulablePolicy = Field(
        "Revert",
        description=(
            "When a heal's pods cannot be scheduled: Revert = go back to the last flags that scheduled and try the "
            "next remedy that needs no more resources; Wait = only report (HealBlocked condition and Event)."
        ),
    )
    allowed_actions: list[HealAction] = Field(
        default_factory=lambda: [a for a in get_args(HealAction) if a != "IncreaseTensorParallel"],
        max_length=len(ALL_ACTIONS),
        description="Changes a heal may make.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    bounds: HealBounds = nested(HealBounds, "Limits no heal may cross.")
    quantized_fallback: QuantizedFallback = nested(QuantizedFallback, "Quantized model to switch to.")


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
        rule(
            "!('IncreaseTensorParallel' in self.heal.allowedActions) || has(self.heal.bounds.maxTensorParallelSize)",
            "IncreaseTensorParallel needs heal.bounds.maxTensorParallelSize",
            ".heal.allowedActions",
        ),
    )
    model: str = Field(..., min_length=1, max_length=512, description="Hugging Face model id or a local path.")
    served_model_name: str | None = Field(None, max_length=256, description="Name clients use; unset = model.")
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

    def gpu_count(self) -> int:
        if self.resources.gpus is not None:
            return self.resources.gpus
        return self.engine.tensor_parallel_size * self.engine.pipeline_parallel_size


class Condition(Model):
    type: str = Field(..., description="Ready, MemoryFit, Healing or HealExhausted.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(
        ...,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
        description="CamelCase reason, stable for automation.",
    )
    message: str = Field("", max_length=32768, description="Explanation for people.")
    last_transition_time: str | None = Field(
        None, description="When status last changed (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    observed_generation: int | None = Field(None, ge=0, description="The generation this condition describes.")


class FieldChange(Model):
    field: str = Field(..., description="Engine arg or resource changed, e.g. maxModelLen.")
    before: str | None = Field(None, description="Value before the heal (unset = vLLM default).")
    after: str | None = Field(None, description="Value after the heal.")


class HealRecord(Model):
    time: str = Field(
        ..., description="When the heal was decided (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    pod: str = Field(..., description="The pod that crashed.")
    pod_uid: str = Field("", description="Its uid.")
    container: str = Field("vllm", description="The container that crashed.")
    restart_count: int = Field(0, ge=0, description="Its restart count at the crash.")
    cause: Cause = Field(..., description="Diagnosed cause, e.g. kv_cache_insufficient.")
    phase: EnginePhase = Field(EnginePhase.UNKNOWN, description="Engine phase at the crash.")
    evidence: list[str] = Field(
        default_factory=list,
        max_length=5,
        description="Log lines that decided the cause.",
        json_schema_extra={"items": {"type": "string", "maxLength": 512}},
    )
    numbers: dict[str, float] = Field(
        default_factory=dict, description=("Figures vLLM printed, e.g. estimated_max_model_len, free_gib, needed_gib.")
    )
    action: RecordedAction = Field(..., description="What was done: an action name, NoChange or GiveUp.")
    reason: str = Field("", max_length=2048, description="Why, citing the evidence.")
    changes: list[FieldChange] = Field(default_factory=list, description="Each changed field, before and after.")


class Deployed(Model):
    """What a pod template runs: the engine args, the model and the container memory limit."""

    engine: EngineArgs = Field(..., description="Engine args.")
    model: str = Field(..., max_length=512, description="Model.")
    memory_limit: str | None = Field(None, pattern=QUANTITY_PATTERN, description="Container memory limit.")

    def gpus(self) -> int:
        return self.engine.tensor_parallel_size * self.engine.pipeline_parallel_size


class HealIntent(Model):
    """A heal decided and recorded before it is applied, so that an API error or an operator restart
    between its writes finishes it (reconcile completes it) instead of leaving half of it."""

    crash: str = Field(..., max_length=512, description="The crash it heals (podUID/container/restartCount).")
    cause: Cause = Field(..., description="The diagnosed cause.")
    action: RecordedAction = Field(..., description="The action.")
    summary: str = Field("", max_length=2048, description="What changes and why.")
    target: Deployed = Field(..., description="What the heal deploys.")
    previous: Deployed = Field(..., description="What ran before it (scheduled: it ran and crashed).")
    applied: bool = Field(False, description="The heal's writes are all done; its pods are rolling out.")
    time: str = Field(
        ..., description="When the heal was decided (RFC 3339).", json_schema_extra={"format": "date-time"}
    )


class VLLMServiceStatus(Model):
    phase: Phase | None = Field(None, description="Pending, Progressing, Running, Healing, Degraded or Failed.")
    observed_generation: int | None = Field(None, ge=0, description="The spec generation last acted upon.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, MemoryFit, Healing, HealExhausted.")
    baseline: EngineArgs | None = Field(None, description="The engine args the user wrote, before any heal.")
    effective: EngineArgs | None = Field(None, description="The engine args deployed now.")
    effective_memory_limit: str | None = Field(None, description="Memory limit deployed now, when a heal raised it.")
    effective_model: str | None = Field(
        None, description="Model deployed now, when a heal switched to the quantized fallback (StatusOverrides mode)."
    )
    heals: list[HealRecord] = Field(
        default_factory=list, max_length=MAX_HEAL_RECORDS, description="Recent heals and decisions, oldest first."
    )
    attempts: int = Field(
        0,
        ge=0,
        description=("Heals since the spec was last changed by a person (a counter: only a person's edit resets it)."),
    )
    tried: list[str] = Field(
        default_factory=list,
        max_length=MAX_TRIED,
        description=("cause/action pairs tried since the last edit by a person; none is tried twice."),
        json_schema_extra={"items": {"type": "string", "maxLength": 160}},
    )
    failed_engines: list[str] = Field(
        default_factory=list,
        max_length=MAX_FAILED_ENGINES,
        description=("Fingerprints of the deployed settings that crashed of memory; a heal never goes back to one."),
        json_schema_extra={"items": {"type": "string", "maxLength": 64}},
    )
    in_flight: HealIntent | None = Field(None, description="The heal being applied or rolled out.")
    heal_count: int = Field(0, ge=0, description="All heals of this service.")
    last_cause: str | None = Field(None, description="Cause of the last diagnosed crash.")
    observed_crashes: list[str] = Field(
        default_factory=list,
        max_length=MAX_OBSERVED_CRASHES,
        description=("Crashes already handled, as podUID/container/restartCount, so none is handled twice."),
    )
    gpus: int | None = Field(None, description="GPUs per pod.")
    endpoint: str | None = Field(None, description="In-cluster URL of the OpenAI-compatible API.")
    kopf: dict[str, Any] | None = Field(
        None,
        description="kopf's bookkeeping (kept; the operator stores its handler progress in annotations).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class VLLMService(Model):
    api_version: str = Field(f"{GROUP}/{VERSION}")
    kind: str = Field(KIND)
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VLLMServiceSpec
    status: VLLMServiceStatus = Field(default_factory=VLLMServiceStatus)
