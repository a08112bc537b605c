"""A VLLMService through the API server's own admission steps, offline, for `render`.

The API server prunes unknown fields, applies the schema's defaults, checks the OpenAPI schema
and then evaluates every CEL rule (x-kubernetes-validations) of the CRD. This module does the
same with the generated CRD (crd.py) and cel-python, so `render` rejects exactly what a cluster
would (tests/test_render_agrees_with_server.py runs the same cases through both).
Pure: a dict in, the problems out, each naming its field as the server does.
"""

from __future__ import annotations

import copy
import reprlib
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import celpy
import re2
from celpy import celtypes

from .crd import NAME_RULE, openapi_schema
from .quantity import exact_quantity


class Quantity:
    """The Kubernetes CEL library's quantity: compareTo/isGreaterThan/isLessThan on exact values."""

    def __init__(self, text: str) -> None:
        self.value = exact_quantity(str(text))


def _quantity(text: celtypes.StringType) -> Quantity:
    return Quantity(text)


def _compare(a: Quantity, b: Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.value > b.value) - (a.value < b.value))


def _is_quantity(text: celtypes.StringType) -> celtypes.BoolType:
    try:
        exact_quantity(str(text))
        return celtypes.BoolType(True)
    except ValueError:
        return celtypes.BoolType(False)


FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "compareTo": _compare,
    "isQuantity": _is_quantity,
    "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > b.value),
    "isLessThan": lambda a, b: celtypes.BoolType(a.value < b.value),
    "asApproximateFloat": lambda a: celtypes.DoubleType(float(a.value)),
}


@lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions=FUNCTIONS)


def _to_cel(value: Any, schema: dict[str, Any]) -> Any:
    """JSON -> CEL values typed by the schema, as the API server types them (a `number` is a
    double even when written as 1)."""
    kind = schema.get("type")
    if kind == "object" or isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {}
        return celtypes.MapType({celtypes.StringType(k): _to_cel(v, props.get(k, extra)) for k, v in value.items()})
    if kind == "array" or isinstance(value, list):
        return celtypes.ListType([_to_cel(v, schema.get("items", {})) for v in value])
    if kind == "number":
        return celtypes.DoubleType(float(value))
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return celtypes.IntType(int(value))  # (the server decodes an integer field's 4.0 as the integer 4)
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    return celtypes.StringType(value)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}


def prune_and_default(value: Any, schema: dict[str, Any]) -> Any:
    """Drop fields the schema does not know, then fill in its defaults (the server's order)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        if "properties" in schema:
            props = schema["properties"]
            value = {k: prune_and_default(v, props[k]) for k, v in value.items() if k in props}
            for name, sub in props.items():
                if name not in value and "default" in sub:
                    value[name] = prune_and_default(copy.deepcopy(sub["default"]), sub)
        elif isinstance(schema.get("additionalProperties"), dict):
            value = {k: prune_and_default(v, schema["additionalProperties"]) for k, v in value.items()}
    elif isinstance(value, list) and "items" in schema:
        value = [prune_and_default(v, schema["items"]) for v in value]
    return value


def _type_ok(value: Any, kind: str | None) -> bool:
    if kind is None:
        return True
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, (int, float)):  # (the API server's integers are int64)
        return (isinstance(value, int) or value.is_integer()) and -(2**63) <= value < 2**63
    return isinstance(value, _TYPES[kind])


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 3, 4, 4, 80, 80, 40


def _shown(value: Any) -> str:
    """A value as a message quotes it, cut short: an alias bomb expands to millions of items, a number to
    thousands of digits (whose repr Python refuses past 4,300)."""
    try:
        return _SHOWN.repr(value)
    except ValueError:
        return f"<an integer of about {value.bit_length() * 3 // 10} digits>" if isinstance(value, int) else "<value>"


def schema_problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """The OpenAPI checks of a structural schema, with the server's field paths."""
    kind = schema.get("type")
    if value is None:
        return [f'{path}: Invalid value: "null": must be {kind}'] if kind else []
    if not _type_ok(value, kind):
        return [f"{path}: Invalid value: {_shown(value)}: must be of type {kind}"]
    out: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: Unsupported value: {_shown(value)}: supported values: {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and (value < low or (schema.get("exclusiveMinimum") and value == low)):
            out.append(
                f"{path}: Invalid value: {value}: must be greater than {'' if schema.get('exclusiveMinimum') else 'or equal to '}{low}"
            )
        if high is not None and (value > high or (schema.get("exclusiveMaximum") and value == high)):
            out.append(
                f"{path}: Invalid value: {value}: must be less than {'' if schema.get('exclusiveMaximum') else 'or equal to '}{high}"
            )
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{path}: Too long: may not be more than {schema['maxLength']} bytes")
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append(f"{path}: Invalid value: {_shown(value)}: should be at least {schema['minLength']} chars long")
        if "pattern" in schema and not re2.search(schema["pattern"], value):
            out.append(f"{path}: Invalid value: {_shown(value)}: should match '{schema['pattern']}'")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{path}: Too many: {len(value)}: must have at most {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(f"{path}: Invalid value: {len(value)}: must have at least {schema['minItems']} items")
        if schema.get("x-kubernetes-list-type") == "set" and len({repr(v) for v in value}) != len(value):
            out.append(f"{path}: Duplicate value")
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                out.append(f"{path}.{name}: Required value")
    for sub, sub_schema, sub_path in _children(value, schema, path):
        out += schema_problems(sub, sub_schema, sub_path)
    return out


def _children(value: Any, schema: dict[str, Any], path: str) -> Iterator[tuple[Any, dict[str, Any], str]]:
    """The nodes below `value` that its schema describes, each with its schema and field path."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        for key, sub in value.items():
            if key in props:
                yield sub, props[key], f"{path}.{key}"
            elif extra is not None:
                yield sub, extra, f"{path}[{key}]"
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield item, schema["items"], f"{path}[{i}]"


def cel_problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Every x-kubernetes-validations rule on every node present, `self` bound to that node."""
    out: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            ok = _program(rule["rule"]).evaluate({"self": _to_cel(value, schema)})
        except celpy.CELEvalError as exc:
            ok, rule = False, {**rule, "message": f"{rule['message']} (rule could not be evaluated: {exc.args[0]})"}
        if not ok:
            out.append(
                f'{path}{rule.get("fieldPath", "")}: Invalid value: "{schema.get("type", "object")}": {rule["message"]}'
            )
    for sub, sub_schema, sub_path in _children(value, schema, path):
        out += cel_problems(sub, sub_schema, sub_path)
    return out


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    """One CEL expression over plain JSON values (an admission policy's `object`, `variables`)."""
    return _program(expression).evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


def admit(obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the object as the server would store it, the problems it would reject it for).

    Like a create, the status is not taken from the request (it is a subresource)."""
    schema = openapi_schema()
    body = {k: v for k, v in obj.items() if k != "status"}
    spec_schema = schema["properties"]["spec"]
    if "spec" not in body:
        return body, ["spec: Required value"]
    spec = prune_and_default(body["spec"], spec_schema)
    body["spec"] = spec
    problems = schema_problems(spec, spec_schema, "spec")
    if isinstance(spec, dict) and not problems:
        problems += cel_problems(spec, spec_schema, "spec")
    return body, problems + _name_problems(body.get("metadata"))


def _name_problems(meta: Any) -> list[str]:
    """What the API server says of metadata and its name (a file for `render` may hold anything)."""
    if not isinstance(meta, dict):
        return ["metadata: Required value: an object with a name"]
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return ["metadata.name: Required value: a string"]
    if not evaluate(NAME_RULE["rule"], {"self": {"metadata": {"name": name}}}):
        return [f'metadata.name: Invalid value: "{name[:80]}": {NAME_RULE["message"]}']
    return []


def manifests(text: str) -> list[Any]:
    """The YAML documents of a manifest file, read as kubectl reads them: a mapping that names a key twice is
    an error (yaml.YAMLError naming the key and its line), where PyYAML alone keeps the last value silently."""
    import yaml

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader: Strict, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # (`<<`: what it merges, a local key overrides)
                continue
            key = loader.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f'mapping key "{str(key)[:100]}" already defined', key_node.start_mark
                    )
                seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return list(yaml.load_all(text, Loader=Strict))  # noqa: S506 - a SafeLoader
