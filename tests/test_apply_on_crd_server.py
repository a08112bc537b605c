"""How the operator writes the objects it owns (kube/client.py Kube._apply), against the real API
server: the apiextensions-apiserver serves VLLMServices through the same generic store, patch
handler and field manager as Deployments and Services, so what it answers here is what a cluster
answers there (the core API itself cannot run here).

- An absent object is created, refused where the name is taken (never taken over), and the
  operator's fields become an apply's: a field the service drops later is removed.
- An object looked at and then replaced under its name is not written (409).
"""

from __future__ import annotations

import copy

import pytest
from kubernetes.client.rest import ApiException

from vllm_autoheal import api
from vllm_autoheal.kube import client as kclient

pytestmark = pytest.mark.crdserver
NS = "apply-semantics"


@pytest.fixture(scope="module")
def kube(crd_server):
    from crdserver.server import install_crd

    try:
        apic = install_crd(crd_server)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    from kubernetes import client

    try:
        client.CoreV1Api(apic).create_namespace({"metadata": {"name": NS}})
    except ApiException as exc:
        if exc.status not in (404, 409):  # (this server has no namespaces API: any name is served)
            raise
    k = kclient.Kube.__new__(kclient.Kube)
    k.timeout = 30
    k.api = apic
    return k


@pytest.fixture(autouse=True)
def vsvc_is_an_owned_kind(monkeypatch):
    monkeypatch.setitem(kclient.PLURALS, api.KIND, api.PLURAL)


def _manifest(name: str, **engine) -> dict:
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "vllm-autoheal"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "owner-uid", "controller": True}
            ],
        },
        "spec": {"model": "m", "engine": {"gpuMemoryUtilization": 0.9, **engine}},
    }


def _path(name: str) -> str:
    return f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NS}/{api.PLURAL}/{name}"


def test_a_created_object_is_the_operators_by_apply_so_a_dropped_field_goes(kube):
    assert kube.apply_all([_manifest("made", maxModelLen=4096)]).outcomes[0][1] == "created"
    live = kube.get(_path("made"))
    assert [(e["manager"], e["operation"]) for e in live["metadata"]["managedFields"]] == [
        (kclient.FIELD_MANAGER, "Apply")
    ]
    assert kube.apply_all([_manifest("made")]).outcomes[0][1] == "applied"
    engine = kube.get(_path("made"))["spec"]["engine"]
    assert "maxModelLen" not in engine, "a field the operator no longer sets stayed (owned by the create)"


def test_a_name_taken_between_the_look_and_the_create_is_refused_not_taken_over(kube, monkeypatch):
    theirs = {**_manifest("taken"), "metadata": {"name": "taken", "namespace": NS}}
    real_get = kclient.Kube.get

    def get_then_they_create(self, path):
        found = real_get(self, path)
        if path == _path("taken") and found is None:
            self.request("POST", path.rsplit("/", 1)[0], theirs, query=[("fieldManager", "their-team")])
        return found

    monkeypatch.setattr(kclient.Kube, "get", get_then_they_create)
    with pytest.raises(ApiException) as raised:
        kube.apply_all([_manifest("taken", maxModelLen=1024)])
    assert raised.value.status == 409
    live = real_get(kube, _path("taken"))
    assert "ownerReferences" not in live["metadata"] and "maxModelLen" not in live["spec"]["engine"]


def test_an_object_replaced_between_the_look_and_the_apply_is_not_written(kube, monkeypatch):
    kube.apply_all([_manifest("replaced")])
    real_get = kclient.Kube.get

    def get_then_replaced(self, path):
        found = real_get(self, path)
        if path == _path("replaced") and found is not None:
            self.request("DELETE", path)
            theirs = copy.deepcopy(_manifest("replaced"))
            del theirs["metadata"]["ownerReferences"]
            self.request("POST", path.rsplit("/", 1)[0], theirs, query=[("fieldManager", "their-team")])
        return found

    monkeypatch.setattr(kclient.Kube, "get", get_then_replaced)
    with pytest.raises(ApiException) as raised:
        kube.apply_all([_manifest("replaced", maxModelLen=2048)])
    assert raised.value.status == 409  # (a retry reads again, and reports their object as a name conflict)
    live = real_get(kube, _path("replaced"))
    assert "ownerReferences" not in live["metadata"] and "maxModelLen" not in live["spec"]["engine"]


def test_a_create_left_an_updates_beside_an_apply_is_dropped_on_the_next_pass(kube):
    # A create whose conversion did not land, then an apply (the pass that found it): the operator has an
    # update's entry beside its apply's. The next pass drops the update's, so what the service drops goes.
    path = _path("both")
    made = copy.deepcopy(_manifest("both", maxModelLen=4096))
    kube.request("POST", path.rsplit("/", 1)[0], made, query=[("fieldManager", kclient.FIELD_MANAGER)])
    kube.request("PATCH", path, made, kclient.APPLY, query=[("fieldManager", kclient.FIELD_MANAGER), ("force", "true")])
    before = kube.get(path)
    assert {(e["manager"], e["operation"]) for e in before["metadata"]["managedFields"]} == {
        (kclient.FIELD_MANAGER, "Update"),
        (kclient.FIELD_MANAGER, "Apply"),
    }
    assert kube.apply_all([_manifest("both")]).outcomes[0][1] == "applied"
    live = kube.get(path)
    assert [(e["manager"], e["operation"]) for e in live["metadata"]["managedFields"]] == [
        (kclient.FIELD_MANAGER, "Apply")
    ]
    assert "maxModelLen" not in live["spec"]["engine"]
