"""How the API server writes an object, for the emulator (tests/operator_harness.py): server-side
apply with managed fields, JSON merge patches and their diffs, and JSON patches (RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

_UNMANAGED = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}
_SYSTEM_META = {("metadata", "managedFields"), ("metadata", "resourceVersion"), ("metadata", "uid")}


def _leaves(obj: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    """Field paths of an apply configuration; lists are atomic (one field), as is an empty map."""
    if isinstance(obj, dict) and obj:
        out: dict[tuple, Any] = {}
        for key, value in obj.items():
            out.update(_leaves(value, (*prefix, key)))
        return out
    return {prefix: obj}


def _fields_v1(paths: set[tuple]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def _paths(tree: dict[str, Any], prefix: tuple = ()) -> set[tuple]:
    if not tree:
        return {prefix}
    return {p for key, sub in tree.items() for p in _paths(sub, (*prefix, key[2:]))}


def server_side_apply(live: dict[str, Any], applied: dict[str, Any], manager: str) -> dict[str, Any]:
    """What the API server stores for an apply by `manager`: the fields of the applied
    configuration take their applied values; fields this manager applied before and leaves out
    now are removed; every other field (set by others, or defaulted) is kept."""
    new = copy.deepcopy(live)
    entries = (new.get("metadata") or {}).get("managedFields") or []
    mine = next((e for e in entries if e["manager"] == manager and e["operation"] == "Apply"), None)
    before = _paths(mine["fieldsV1"]) if mine else set()
    leaves = {p: v for p, v in _leaves(applied).items() if p not in _UNMANAGED and p[:2] not in _SYSTEM_META}
    keep = {p[:i] for p in leaves for i in range(1, len(p) + 1)}
    for path in sorted(before - set(leaves), key=len, reverse=True):
        parents = [new]
        for key in path[:-1]:
            parents.append(parents[-1].get(key) if isinstance(parents[-1], dict) else None)
        if isinstance(parents[-1], dict):
            parents[-1].pop(path[-1], None)
        for depth in range(len(path) - 1, 0, -1):  # a map left empty, that nothing applies, goes too
            if parents[depth] == {} and path[:depth] not in keep:
                parents[depth - 1].pop(path[depth - 1], None)
    for path, value in leaves.items():
        node = new
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if value == {} and isinstance(node.get(path[-1]), dict):
            continue  # an empty map asserts the map; keys that others own stay in it
        node[path[-1]] = copy.deepcopy(value)
    for key in ("apiVersion", "kind"):
        new.setdefault(key, applied.get(key))
    meta = new.setdefault("metadata", {})
    meta["managedFields"] = [e for e in entries if e is not mine] + [
        {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": applied.get("apiVersion"),
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1(set(leaves)),
        }
    ]
    return new


def merge_patch(old: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies one (the fakes' PATCH)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(old) if isinstance(old, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns `old` into `new` (kmock stores writes as merge patches)."""
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            sub = merge_diff(old[key], value)
            if sub:
                out[key] = sub
        elif old.get(key, object()) != value:
            out[key] = value
    return out


class JsonPatchFailed(Exception):
    pass


def json_patch(obj: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 (test, replace, add, remove), as the API server applies a JSON patch."""
    out = copy.deepcopy(obj)
    for op in ops:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        parent = out
        try:
            for key in keys[:-1]:
                parent = parent[int(key)] if isinstance(parent, list) else parent[key]
            last: Any = int(keys[-1]) if isinstance(parent, list) and keys[-1] != "-" else keys[-1]
            if op["op"] == "test":
                if parent[last] != op["value"]:
                    raise JsonPatchFailed(f"test failed at {op['path']}")
            elif op["op"] in ("replace", "add"):
                if op["op"] == "replace":
                    parent[last]  # noqa: B018  (must exist)
                if isinstance(parent, list) and op["op"] == "add":
                    parent.insert(len(parent) if last == "-" else last, copy.deepcopy(op["value"]))
                else:
                    parent[last] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[last]
            else:
                raise JsonPatchFailed(f"unsupported op {op['op']}")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise JsonPatchFailed(f"{op['path']}: {exc}") from exc
    return out
