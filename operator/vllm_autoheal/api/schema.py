"""What every API model shares: camelCase on the wire, CEL rules in the schema, sub-objects present
with their defaults, and the Kubernetes quantity grammar."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A Kubernetes resource quantity (the apimachinery grammar, without exponents).
# A name vLLM takes as a positional or an option's value (a model, a served name): never one that opens
# like a flag, which `vllm serve` would read as one (a secret given as --api-key=..., past extraArgs' rules).
NOT_A_FLAG = r"^[^-]"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"


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


def quantity_le(lhs: str, rhs: str) -> str:
    """CEL: lhs <= rhs for two optional quantity fields of self."""
    return f"!has(self.{lhs}) || !has(self.{rhs}) || quantity(self.{lhs}).compareTo(quantity(self.{rhs})) <= 0"
