"""A VLLMService's status: what the operator observed and did (conditions, heal records, the heal in
flight, what is deployed), with the names a heal record may carry."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..diagnosis.figures import MAX_GIB
from ..diagnosis.model import Cause, EnginePhase
from .engine_args import EngineArgs
from .heal_policy import MAX_ATTEMPTS, HealAction
from .schema import QUANTITY_PATTERN, Model

MAX_HEAL_RECORDS = 20
MAX_OBSERVED_CRASHES = 50
MAX_TRIED = 64
# every setting that crashed of memory while heals used up maxAttempts (one each, and the first): a heal
# never goes back to one, however many it is allowed
MAX_FAILED_ENGINES = MAX_ATTEMPTS + 14
NoHeal = Literal["NoChange", "GiveUp"]  # the planner's outcomes that change nothing
OperatorAction = Literal["RevertUnschedulable"]  # the operator's own, decided by heal.unschedulable
RecordedAction = Literal[HealAction, NoHeal, OperatorAction]
Phase = Literal["Pending", "Progressing", "Running", "Healing", "Degraded", "Failed"]


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
    gpus: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="GPUs one replica ran on at the crash (tensor x pipeline parallel): the split its per-GPU "
        "figures were printed under.",
    )
    gpu_free_gib: float | None = Field(
        None,
        ge=0,
        le=MAX_GIB,
        description="The least free memory the launcher saw on the pod's GPUs before vLLM started, GiB: what this "
        "heal, and a revert of it, may ask of each GPU.",
    )
    unschedulable: bool | None = Field(
        None,
        description="This record takes back a heal whose pods no node could take: each change's before is what "
        "the scheduler refused (no later heal asks for that many GPUs or that much memory again).",
    )
    refused: bool | None = Field(
        None,
        description="The API server refused this heal's spec patch (an admission policy, say): nothing changed, so "
        "it spent no attempt and starts no backoff; its action stays tried.",
    )


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
    marked_by: str | None = Field(
        None,
        max_length=64,
        description="The completion that marked it applied (a token of its own): that one announces the heal, also "
        "where its write landed but its answer was lost.",
    )


class VLLMServiceStatus(Model):
    phase: Phase | None = Field(None, description="Pending, Progressing, Running, Healing, Degraded or Failed.")
    observed_generation: int | None = Field(None, ge=0, description="The spec generation last acted upon.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, MemoryFit, Healing, HealExhausted.")
    baseline: EngineArgs | None = Field(None, description="The engine args the user wrote, before any heal.")
    baseline_for: str | None = Field(
        None,
        max_length=64,
        description=(
            "A digest of what the baseline was taken with besides spec.engine (the model, the memory limit, "
            "the GPU): in StatusOverrides mode a person's change of any of them is an edit, as of spec.engine."
        ),
    )
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
        description=(
            "Crashes already handled, as podUID/container/restartCount@endedAt (Unix seconds), so none is "
            "handled twice; once full, a crash that ended before all of them counts as handled."
        ),
    )
    gpus: int | None = Field(None, description="GPUs per pod.")
    endpoint: str | None = Field(None, description="In-cluster URL of the OpenAI-compatible API.")
    kopf: dict[str, Any] | None = Field(
        None,
        description="kopf's bookkeeping (kept; the operator stores its handler progress in annotations).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
