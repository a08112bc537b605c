"""Review of commit 8bd7246 (kube/client.py Kube._apply / Kube._create): an absent object is created
by POST and the operator's managedFields entry then turned from an update's into an apply's by a JSON
patch; an owned object is applied with the live uid (a 422 naming metadata.uid re-raised as 409).
Each test was a defect found on that code (a strict xfail), asserting the right behaviour; all four are
fixed: a create's entry is converted on any later pass until it is (and the object is not 'unchanged'
meanwhile), only the server's refusal of the uid itself is read as 'replaced', a 404 of the conversion is
nothing left to convert, and the emulator's applied empty map keeps the keys other entries own."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from vllm_autoheal.api import VLLMService
from vllm_autoheal.kube import resources
from vllm_autoheal.kube.client import APPLIED_HASH, APPLY, FIELD_MANAGER, JSON_PATCH, MERGE, Kube
from vllm_autoheal.kube.reconcile import REFUSED
from vllm_autoheal.kube.writes import transient
from vllm_autoheal.validation import admit

from operator_harness import NS, Emulator, wait_for

VSVC = f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{NS}/vllmservices"
SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9},
    "resources": {"limits": {"memory": "32Gi"}, "shmSize": "4Gi"},
    "preflight": "Off",
}


def _vsvc(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "s", "namespace": "team-a", "uid": "svc-uid"},
        "spec": {"model": "org/m", **spec},
    }


def _deployment(spec: dict[str, Any]) -> dict[str, Any]:
    stored, problems = admit(_vsvc(spec))
    assert problems == [], problems  # (the CRD admits it: any tenant may write it)
    return resources.deployment(VLLMService.model_validate({**stored, "metadata": _vsvc({})["metadata"]}))


class FakeServer(Kube):
    """Kube's requests answered by `answer(method, path, body, content_type)`; no client, nothing leaves the process."""

    def __init__(self, answer) -> None:
        self.timeout = None
        self.answer = answer
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json", *a, **k):
        self.calls.append((method, content_type))
        return self.answer(method, path, copy.deepcopy(body), content_type)


# --- 1. the create's fields stay an update's where the one JSON patch after it did not land -----------


@pytest.mark.kmock(cls=Emulator)
async def test_a_field_dropped_after_a_create_whose_conversion_failed_leaves_the_deployment(cluster):
    """Medium (silent drift, the very defect the commit fixes, back after one failed request).
    Input: a VLLMService with resources.nodeSelector {pool: a100, zone: z1}; the JSON patch that follows the
    Deployment's create answers 503 once; later the author removes the key pool.
    Now: _create raises the 503, reconcile retries (kopf.TemporaryError), the retry GETs the Deployment, finds
    it controlled and its applied-hash current: 'unchanged', no write, no conversion. The entry
    (vllm-autoheal, Update) owns spec.template.spec.nodeSelector.pool from then on, and the apply after the edit
    leaves it: the pods keep requiring pool=a100 (a pool the author moved off). Same for the lost-POST-response
    retry (409 or GET finds it), a crash between POST and PATCH, and two failed tries in the loop (silent).
    Right: a live object the operator controls that still carries its (vllm-autoheal, Update) entry is
    converted on the next pass (and not taken as 'unchanged' until it is), or the conversion failure is not
    swallowed; the dropped field leaves the Deployment."""
    spec = {**SPEC, "resources": {**SPEC["resources"], "nodeSelector": {"pool": "a100", "zone": "z1"}}}
    fault = cluster.kmock.fail("PATCH", "/deployments/conv", 503, times=1)  # (the JSON patch after the POST)
    await cluster.create_vsvc("conv", spec)
    await cluster.settled("conv")
    assert fault.hits == 1
    dep = await cluster.deployment("conv")
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "a100", "zone": "z1"}
    before = dep["metadata"]["annotations"][APPLIED_HASH]
    await cluster.call("PATCH", f"{VSVC}/conv", {"spec": {"resources": {"nodeSelector": {"pool": None}}}}, MERGE)
    dep = await wait_for(
        lambda: (d := cluster.deployment_now("conv")) and d["metadata"]["annotations"][APPLIED_HASH] != before and d,
        what="the Deployment applied after the edit",
    )
    managers = {(m["manager"], m["operation"]) for m in dep["metadata"]["managedFields"]}
    assert "pool" not in (dep["spec"]["template"]["spec"].get("nodeSelector") or {}), managers


# --- 2. a manifest the server refuses is read as "replaced meanwhile" where its words name metadata.uid ---


def test_a_refused_manifest_whose_refusal_echoes_metadata_uid_stays_refused():
    """Low (tenant-triggered endless retry; status never says why). Input: a VLLMService already deployed,
    edited to resources.nodeSelector {pool: "metadata.uid?"} (the CRD admits any string of <= 63 characters
    as a value; a pod's nodeSelector value must be a label value). The apply of the Deployment is refused:
    422 'spec.template.spec.nodeSelector: Invalid value: "metadata.uid?": a valid label must be ...'.
    Now: _apply sees 'metadata.uid' in the reason and raises 409 'replaced since it was read'; reconcile takes
    it as transient (kopf.TemporaryError every retry_delay_s, forever, each pass 1 GET per object + the
    refused PATCH, a warning in the log), Ready never becomes ObjectsRefused; heal_apply.complete's Later
    re-queues itself the same way. Right: only the server's uid refusal itself
    ('metadata.uid: Invalid value: "<the uid sent>": field is immutable') is a 409; this one stays a 422,
    which reconcile reports as ObjectsRefused and waits for the next edit."""
    manifest = _deployment({"resources": {"nodeSelector": {"pool": "metadata.uid?"}}})
    live = copy.deepcopy(_deployment({}))
    live["metadata"].update(uid="dep-uid", annotations={APPLIED_HASH: "an-older-manifest"})
    refusal = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Deployment.apps "s" is invalid: spec.template.spec.nodeSelector: Invalid value: '
        "\"metadata.uid?\": a valid label must be an empty string or consist of alphanumeric characters, '-', "
        "'_' or '.', and must start and end with an alphanumeric character",
        "reason": "Invalid",
        "code": 422,
    }

    def answer(method, path, body, content_type):
        if method == "GET":
            return copy.deepcopy(live)
        if method == "PATCH" and content_type == APPLY:
            assert body["metadata"]["uid"] == "dep-uid"  # (the object read: no replacement here)
            raise ApiException(status=422, reason=f"Unprocessable Entity: {json.dumps(refusal)}"[:520])
        raise AssertionError(f"unexpected {method} {path}")

    kube = FakeServer(answer)
    with pytest.raises(ApiException) as raised:
        kube.apply(manifest)
    assert not transient(raised.value) and raised.value.status in REFUSED, (raised.value.status, raised.value.reason)


# --- 3. an object deleted between the create and the JSON patch: a 404 leaks ---------------------------


def test_an_object_deleted_right_after_its_create_is_retried_as_transient():
    """Low (a narrow race; a traceback and a slower retry). Input: the operator creates the Deployment (POST
    201); a person or a script deletes it before the JSON patch that converts the operator's managedFields
    entry; that patch answers 404. Now: ApiException(404) leaves _create; reconcile's handler (transient: no;
    REFUSED: no) re-raises it: kopf logs 'Handler failed with an exception' and retries after its own
    default backoff; heal_apply.complete re-raises it likewise (not deferred through Later). Right: nothing is
    left to convert, so the create's outcome stands (or a 409, read again, so the retry creates it anew at
    retry_delay_s): a 404 here is never a handler error. (An absent object on the apply path is the server's
    409 'uid mismatch ... no existing object was found', handled as transient: that path is sound.)"""
    manifest = _deployment({})

    def answer(method, path, body, content_type):
        if method == "GET":
            raise ApiException(status=404, reason="Not Found")
        if method == "POST":
            body["metadata"].update(uid="dep-uid", managedFields=[{"manager": FIELD_MANAGER, "operation": "Update"}])
            return body
        if method == "PATCH" and content_type == JSON_PATCH:
            raise ApiException(status=404, reason='Not Found: {"reason":"NotFound","code":404}')
        raise AssertionError(f"unexpected {method} {path}")

    kube = FakeServer(answer)
    try:
        outcome = kube.apply(manifest)
    except ApiException as exc:
        assert transient(exc), f"a {exc.status} from the conversion is a handler error, not a retry"
    else:
        assert outcome == "created"


# --- 4. the emulator: an applied empty map wipes the keys other managers own ------------------------------


def test_the_emulated_apply_keeps_keys_others_own_under_an_applied_empty_map():
    """Low (test harness: it hides a defect). Input: a live Deployment whose nodeSelector.pool is owned by
    another entry (here the operator's own create, operation Update, as a failed conversion leaves it),
    then an apply by vllm-autoheal whose nodeSelector is {} (the render always names nodeSelector, empty when
    the author sets none). Now: the emulator stores nodeSelector {} (pool gone), so a harness test of 'the
    author removes every node selector key' after a failed conversion passes; the real server keeps pool
    (owned by another entry). Right: an empty map applied asserts the map, and keys owned by other entries
    stay; only keys this applier owned before and leaves out go."""
    from api_writes import server_side_apply

    owned_by_update = {"f:spec": {"f:nodeSelector": {"f:pool": {}}}}
    live = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "d",
            "managedFields": [
                {
                    "manager": FIELD_MANAGER,
                    "operation": "Update",
                    "apiVersion": "apps/v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": owned_by_update,
                }
            ],
        },
        "spec": {"nodeSelector": {"pool": "a100"}},
    }
    applied = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"nodeSelector": {}}}
    assert server_side_apply(live, applied, FIELD_MANAGER)["spec"]["nodeSelector"] == {"pool": "a100"}
