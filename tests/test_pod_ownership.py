"""kube/ownership.py: a crash changes a VLLMService only where its pod is the service's own, by the
controller chain the Deployment and ReplicaSet controllers write (uids, not names or labels)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vllm_autoheal.kube import ownership

NS = "team-a"


def ref(kind: str, name: str, uid: str, controller: bool = True) -> dict[str, Any]:
    api = "vllm.autoheal.dev/v1alpha1" if kind == "VLLMService" else "apps/v1"
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": controller}


def obj(name: str, uid: str, *owners: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid, "ownerReferences": list(owners)}}


class Reads:
    """The API objects the check reads, and how many reads it made."""

    def __init__(self) -> None:
        self.objects = {
            f"/apis/apps/v1/namespaces/{NS}/replicasets/svc-5d8f": obj(
                "svc-5d8f", "rs-1", ref("Deployment", "svc", "dep-1")
            ),
            f"/apis/apps/v1/namespaces/{NS}/deployments/svc": obj("svc", "dep-1", ref("VLLMService", "svc", "vsvc-1")),
        }
        self.vsvcs = {"svc": obj("svc", "vsvc-1")}
        self.reads = 0

    def get(self, path: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.objects.get(path))

    def get_vsvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.vsvcs.get(name))


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch):
    monkeypatch.setattr(ownership, "_chains", type(ownership._chains)())


def pod(*owners: dict[str, Any]) -> dict[str, Any]:
    return obj("svc-5d8f-x2z", "pod-1", *owners)


def test_the_services_own_pod_is_its_own_and_its_chain_is_read_once():
    reads = Reads()
    mine = pod(ref("ReplicaSet", "svc-5d8f", "rs-1"))
    assert ownership.run_by_service(reads, NS, "svc", mine)
    first = reads.reads
    for _ in range(100):  # (a crash-looping pod's events: given the service's uid just read, no reads)
        assert ownership.run_by_service(reads, NS, "svc", mine, "vsvc-1")
    assert first == 3 and reads.reads == first
    for _ in range(10):  # (not given it: the service alone is read, to learn it)
        assert ownership.run_by_service(reads, NS, "svc", mine)
    assert reads.reads == first + 10


@pytest.mark.parametrize(
    "owners",
    [
        [],  # kubectl debug --copy-to, or a pod written from the template
        [ref("ReplicaSet", "svc-5d8f", "rs-1", controller=False)],  # an owner, not its controller
        [ref("ReplicaSet", "svc-5d8f", "forged-uid")],  # the right name, another uid
        [ref("ReplicaSet", "other-rs", "rs-9")],  # a ReplicaSet that does not exist
        [ref("Deployment", "svc", "dep-1")],  # a Deployment does not run pods itself
        [ref("Job", "svc", "job-1")],
    ],
    ids=["no-owner", "not-controller", "forged-uid", "no-such-rs", "deployment", "job"],
)
def test_a_pod_whose_chain_does_not_end_at_the_service_is_not_its_own(owners):
    reads = Reads()
    assert not ownership.run_by_service(reads, NS, "svc", pod(*owners))
    assert reads.reads <= 3


def test_a_chain_through_another_teams_deployment_or_a_recreated_service_is_not_the_services():
    reads = Reads()
    mine = pod(ref("ReplicaSet", "svc-5d8f", "rs-1"))
    reads.vsvcs["svc"] = obj("svc", "vsvc-2")  # deleted and created again: the old chain is not this one's
    assert not ownership.run_by_service(reads, NS, "svc", mine)
    reads = Reads()
    deployments = f"/apis/apps/v1/namespaces/{NS}/deployments/svc"
    reads.objects[deployments] = obj("svc", "dep-1", ref("VLLMService", "other", "vsvc-1"))
    assert not ownership.run_by_service(reads, NS, "svc", mine)
    assert not ownership.run_by_service(Reads(), NS, "other", mine)  # (the service named by the label)


def test_the_remembered_chains_are_bounded(monkeypatch):
    monkeypatch.setattr(ownership, "REMEMBERED", 8)
    reads = Reads()
    for i in range(50):
        name = f"svc-{i}"
        path = f"/apis/apps/v1/namespaces/{NS}/replicasets/{name}"
        reads.objects[path] = obj(name, f"rs-{i}", ref("Deployment", "svc", "dep-1"))
        assert ownership.run_by_service(reads, NS, "svc", pod(ref("ReplicaSet", name, f"rs-{i}")))
    assert len(ownership._chains) == 8


def test_a_forged_chain_costs_its_reads_once_and_a_chain_answers_for_its_own_service_only():
    reads = Reads()
    forged = pod(ref("ReplicaSet", "svc-5d8f", "forged-uid"))
    for _ in range(50):  # (a decoy's events, or one look over many decoys carrying the same uid)
        assert not ownership.run_by_service(reads, NS, "svc", forged)
    assert reads.reads == 1
    mine = pod(ref("ReplicaSet", "svc-5d8f", "rs-1"))
    assert not ownership.run_by_service(reads, NS, "other", mine)  # (asked for another service first)
    assert ownership.run_by_service(reads, NS, "svc", mine)  # (not poisoned by that answer)


@pytest.mark.parametrize(
    "name", ["../../secrets/hf", "svc-5d8f/../../../namespaces/other/secrets/x", "Svc", "a" * 300, ""]
)
def test_an_owner_reference_that_names_no_object_reads_nothing(name):
    """An ownerReference's name is checked only for being set: it goes into the path the chain is read by."""
    reads = Reads()
    assert not ownership.run_by_service(reads, NS, "svc", pod(ref("ReplicaSet", name, "rs-1")))
    assert reads.reads == 0
