"""kopf's diffbase as the operator keeps it (kube/diffbase.py): within the API server's 256 KiB of
annotations for the largest spec the CRD admits, and still a record of every change."""

from __future__ import annotations

import copy

import kopf
from kopf._cogs.structs.diffs import diff  # (kopf's own comparison of two essences; not re-exported)

from vllm_autoheal import validation
from vllm_autoheal.kube.diffbase import MAPPING_BYTES, DigestedDiffBaseStorage

STORAGE = DigestedDiffBaseStorage(prefix="vllm.autoheal.dev", key="last-handled-configuration")
KEY = "vllm.autoheal.dev/last-handled-configuration"


def body(spec: dict, annotations: dict | None = None) -> kopf.Body:
    meta = {"name": "svc", "namespace": "team-a", "uid": "u", "annotations": annotations or {}}
    return kopf.Body(
        {"apiVersion": "vllm.autoheal.dev/v1alpha1", "kind": "VLLMService", "metadata": meta, "spec": spec}
    )


def stored(b: kopf.Body) -> str:
    patch = kopf.Patch()
    STORAGE.store(body=b, patch=patch, essence=STORAGE.build(body=b))
    return patch["metadata"]["annotations"][KEY]


def largest_spec() -> dict:
    """Every list the schema bounds filled to its bound with its longest values, where that is large."""
    spec = {"model": "m" * 512, "engine": {"extraArgs": [f"--x{i}=" + "a" * 500 for i in range(64)]}}
    spec["env"] = [{"name": "E" * 250 + f"{i:03}", "value": "v" * 32768} for i in range(128)]
    spec["envFrom"] = [{"prefix": "p" * 253, "configMapRef": {"name": f"c{i}"}} for i in range(32)]
    return spec


def test_the_largest_admitted_spec_and_the_tenants_annotations_fit_in_a_small_annotation():
    spec = largest_spec()
    admitted, problems = validation.admit(body(spec))
    assert problems == [], problems
    tenant_annotations = {f"team.example/note-{i}": "n" * 100 for i in range(1000)}  # (~130 KiB of its own)
    kept = stored(body(admitted["spec"], tenant_annotations))
    spec_kept = len(stored(body(admitted["spec"])))
    assert spec_kept <= MAPPING_BYTES + 200  # the spec, bounded whatever the CRD admits
    # (the tenant's annotations are kept key by key: kopf clears its own among them)
    assert len(kept) + sum(len(k) + len(v) for k, v in tenant_annotations.items()) <= 256 * 1024


def test_a_stored_essence_shows_no_change_for_the_same_spec_and_one_for_any_change():
    spec = {"model": "m", "env": [{"name": "PROMPT", "value": "x" * 32768}], "engine": {"maxModelLen": 8192}}
    base = body(spec)
    patch = kopf.Patch()
    STORAGE.store(body=base, patch=patch, essence=STORAGE.build(body=base))
    kept = body(spec, {KEY: patch["metadata"]["annotations"][KEY]})
    old = STORAGE.fetch(body=kept)
    assert not diff(old, STORAGE.build(body=kept))  # (kopf calls no update handler)
    one_letter = copy.deepcopy(spec)
    one_letter["env"][0]["value"] = "x" * 32767 + "y"
    assert diff(old, STORAGE.build(body=body(one_letter, {KEY: "x"})))
    longer = copy.deepcopy(spec)
    longer["engine"]["maxModelLen"] = 4096
    changes = diff(old, STORAGE.build(body=body(longer)))
    assert [tuple(c[1]) for c in changes] == [("spec", "engine", "maxModelLen")]  # (small fields stay readable)
