"""Review of the PatchSpec write (kube/heal_apply.py): the spec patch is decided on a fresh read and
written with its resourceVersion. The decision must be the recorded heal's: a fresh read whose spec
holds the heal's starting flags but whose status no longer holds the heal (dropped after a person's
edit and its revert, e.g. a GitOps sync) must not write the dropped heal into the spec."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from api_writes import merge_patch
from vllm_autoheal.api import EngineArgs
from vllm_autoheal.kube import heal_apply
from vllm_autoheal.kube.config import OperatorConfig

NS, NAME = "team-a", "svc"
PREVIOUS = {"engine": {"gpuMemoryUtilization": 0.9, "maxModelLen": 32768}, "model": "m", "memoryLimit": "32Gi"}
TARGET = {"engine": {"gpuMemoryUtilization": 0.9, "maxModelLen": 16384}, "model": "m", "memoryLimit": "32Gi"}


@pytest.fixture(autouse=True)
def _no_events(monkeypatch):  # (a heal made posts 'Healed'; no kopf context here to post it in)
    monkeypatch.setattr(heal_apply, "event", lambda body, **k: None)


class FakeKube:
    """An API server's merge patch with a resourceVersion precondition; `between` runs once, after
    the read the write is decided on (what another writer did in that moment)."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj, self.reads, self.between, self.applied = obj, 0, None, []

    def vsvc_path(self, ns: str, name: str) -> str:
        return f"/{ns}/{name}"

    def get_vsvc(self, ns: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.obj)

    def request(self, method: str, path: str, body: dict[str, Any], content_type: str) -> dict[str, Any]:
        if self.between is not None:
            hook, self.between = self.between, None
            hook(self.obj)
        version = body.get("metadata", {}).get("resourceVersion")
        if version is not None and version != self.obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        body = copy.deepcopy(body)
        body["metadata"].pop("resourceVersion", None)
        self.obj = merge_patch(self.obj, body)
        self.obj["metadata"]["resourceVersion"] = str(int(self.obj["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.obj)

    def apply_all(self, manifests: list[dict[str, Any]]) -> Any:
        self.applied.append(manifests)


def _service() -> dict[str, Any]:
    return {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": NAME, "namespace": NS, "resourceVersion": "1", "generation": 1, "uid": "u"},
        "spec": {
            "model": "m",
            "engine": dict(PREVIOUS["engine"]),
            "resources": {"limits": {"memory": "32Gi"}},
            "heal": {"mode": "PatchSpec"},
        },
        "status": {
            "inFlight": {
                "crash": "pod/vllm/1",
                "cause": "kv_cache_insufficient",
                "action": "LowerMaxModelLen",
                "target": TARGET,
                "previous": PREVIOUS,
                "time": "2026-01-01T00:00:00Z",
            }
        },
    }


def test_a_heal_dropped_while_its_spec_write_was_decided_is_not_written():
    """The person's edit (32768 -> 8192) made reconcile drop the heal; their GitOps tool put 32768
    back before the heal's write. The write's own read sees 32768 - the heal's starting flags - and a
    status without the heal: the spec must stay as the person left it, not become the heal's 16384."""
    kube = FakeKube(_service())

    def person_edits_and_reverts_and_the_heal_is_dropped(obj: dict[str, Any]) -> None:
        obj["status"]["inFlight"] = None  # reconcile, on the edit: the person's spec wins
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 3)

    kube.between = person_edits_and_reverts_and_the_heal_is_dropped
    cfg = OperatorConfig()
    assert heal_apply.complete(kube, cfg, None, NS, NAME, logging.getLogger("t"))  # type: ignore[arg-type]
    assert kube.obj["spec"]["engine"]["maxModelLen"] == 32768, kube.obj["spec"]["engine"]
    assert not kube.applied


def test_the_recorded_heal_is_written_and_the_engine_replaced_whole():
    """(The ordinary path: the spec becomes the heal's flags, nothing else of the engine kept.)"""
    obj = _service()
    obj["spec"]["engine"]["maxNumBatchedTokens"] = 8192
    obj["status"]["inFlight"]["previous"]["engine"]["maxNumBatchedTokens"] = 8192
    kube = FakeKube(obj)
    cfg = OperatorConfig()
    assert heal_apply.complete(kube, cfg, None, NS, NAME, logging.getLogger("t"))  # type: ignore[arg-type]
    engine = EngineArgs.model_validate(kube.obj["spec"]["engine"])
    assert engine.max_model_len == 16384 and engine.max_num_batched_tokens is None
    assert kube.obj["status"]["inFlight"]["applied"] is True
