"""Owns the generated VLLMService CustomResourceDefinition (from the api/ package's pydantic models).

pydantic writes JSON Schema 2020-12; the API server wants a *structural* OpenAPI v3
schema: every node typed, no $ref, no anyOf for optionals, numeric exclusive
bounds as booleans. This module does that translation and nothing else, so the
committed CRD is always exactly what ``api/`` says (a test compares them).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic.json_schema import GenerateJsonSchema

from . import api, engine

# JSON Schema keys that carry over unchanged into an OpenAPI v3 structural schema.
_KEPT = {
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "format",
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a $ref (pydantic may put sibling keys such as default next to it)."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        merged = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        return _resolve(merged, defs)
    return node


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "anyOf" in node:  # Optional[T] -> T; absence means null on the wire.
        choices = [c for c in node["anyOf"] if c.get("type") != "null"]
        if len(choices) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {node['anyOf']}")
        siblings = {k: v for k, v in node.items() if k != "anyOf"}
        return structural({**_resolve(choices[0], defs), **siblings}, defs)
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEPT}
    out.update({k: v for k, v in node.items() if k.startswith("x-kubernetes-")})
    if "const" in node:
        out["enum"] = [node["const"]]
    if "exclusiveMinimum" in node:
        out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node:
        out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("default", 0) is None:
        del out["default"]
    kind = out.get("type")
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        if "properties" in node:
            out["properties"] = {name: structural(sub, defs) for name, sub in node["properties"].items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = structural(node["additionalProperties"], defs)
        elif not out.get("x-kubernetes-preserve-unknown-fields"):
            out["x-kubernetes-preserve-unknown-fields"] = True
    if kind == "array":
        out["items"] = structural(node.get("items", {}), defs)
    return out


class _WithFactoryDefaults(GenerateJsonSchema):
    """Write `default_factory` values as CRD defaults too (pydantic leaves them out), so the
    server fills in exactly what the models would. A sub-model's default is its full wire
    value, not `{}`: the server checks CEL rules against a default as written."""

    def get_default_value(self, schema: Any) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            value = factory()
            return value.wire() if isinstance(value, api.Model) else value
        return super().get_default_value(schema)


def _add_extra_args_rules(node: dict[str, Any]) -> None:
    """Every EngineArgs node (spec.engine, status.baseline, status.effective) refuses the typed,
    reserved and secret-bearing flags of engine.py's tables in extraArgs, in every spelling."""
    if "extraArgs" in node.get("properties", {}):
        generated = [api.rule(*engine.extra_args_rule(entry), ".extraArgs") for entry in engine.ENTRIES]
        # a new list: the model's own rules list is shared by every node made from it
        node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", []), *generated]
    for sub in node.get("properties", {}).values():
        _add_extra_args_rules(sub)
    if isinstance(node.get("items"), dict):
        _add_extra_args_rules(node["items"])


# The name becomes the Service's (a DNS-1035 label) and a label value (63 characters at most): one
# the API server admits but those refuse would leave the objects half applied, the status unwritten.
NAME_RULE = api.rule(
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",
    "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
    "at most 63 characters): it names the Service and labels the pods",
)


def openapi_schema() -> dict[str, Any]:
    raw = api.VLLMService.model_json_schema(by_alias=True, mode="validation", schema_generator=_WithFactoryDefaults)
    defs = raw.get("$defs", {})
    spec = structural(raw["properties"]["spec"], defs)
    status = structural(defs["VLLMServiceStatus"], defs)
    spec["description"] = (api.VLLMServiceSpec.__doc__ or "").strip()
    status["description"] = "What the operator observed and did."
    _add_extra_args_rules(spec)
    _add_extra_args_rules(status)
    return {
        "type": "object",
        "description": "A vLLM inference server that vllm-autoheal runs and heals when it runs out of memory.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
        "x-kubernetes-validations": [NAME_RULE],
    }


PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
    {"name": "Heals", "type": "integer", "jsonPath": ".status.healCount"},
    {"name": "Last Cause", "type": "string", "jsonPath": ".status.lastCause"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "vllm-autoheal", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": ["vllm", "all"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = "# Generated by `vllm-autoheal crd` from operator/vllm_autoheal/api/. Do not edit by hand.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100, allow_unicode=True)
