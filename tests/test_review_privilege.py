"""A hostile review of what a VLLMService author (or anyone who may create pods in the namespace) can get
through the operator beyond the pod they asked for: privilege in the rendered pod, heals steered past
what the service's owner allowed, objects the operator does not own, and Secrets echoed. Each xfail(strict)
test is a defect found on the current code, asserting the right behaviour; the plain tests pin attacks
found defended that no other test covered."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from api_writes import server_side_apply
from test_chart import VALUE_SETS, by_kind, template
from vllm_autoheal.api import VLLMService
from vllm_autoheal.kube import resources
from vllm_autoheal.kube.client import APPLY, Kube
from vllm_autoheal.kube.resources import deployment
from vllm_autoheal.model_source import HubSettings, ModelConfigError, from_hub
from vllm_autoheal.validation import admit, evaluate

from operator_harness import Emulator
from samples import KV_TERMINATION, SPEC


def _vsvc(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "vllm.autoheal.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "s", "namespace": "team-a", "uid": "u1"},
        "spec": {"model": "org/m", **spec},
    }


def _admitted_and_rendered(spec: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """(what the API server would refuse the VLLMService for, the pod spec the operator renders from it)."""
    stored, problems = admit(_vsvc(spec))
    pod = deployment(VLLMService.model_validate({**stored, "metadata": _vsvc({})["metadata"]}))
    return problems, pod["spec"]["template"]["spec"]


# --- the kubelet's $(VAR) expansion, as k8s.io/kubernetes third_party/forked/golang/expansion/expand.go ---


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the container gets for a command, arg or env value: `$$` is one `$`, `$(NAME)` the
    variable's value where it is defined (else left as written), any other `$` itself."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(" and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(env.get(name, f"$({name})"))
            i = end + 1
        else:
            out.append("$" + nxt) if nxt != "(" else out.append("$(")
            i += 2
    return "".join(out)


def test_the_kubelet_expansion_port_reads_as_kubernetes_documents():
    env = {"HF_TOKEN": "hf_s3cret"}
    assert kubelet_expand("$(HF_TOKEN)", env) == "hf_s3cret"
    assert kubelet_expand("$$(HF_TOKEN)", env) == "$(HF_TOKEN)"  # the documented escape
    assert kubelet_expand("$(UNSET)", env) == "$(UNSET)" and kubelet_expand("a$b$", env) == "a$b$"
    assert kubelet_expand("$$$(HF_TOKEN)", env) == "$hf_s3cret"  # an escaped `$`, then a reference


def test_a_dollar_before_a_variable_reference_does_not_let_the_kubelet_expand_a_secret():
    """Medium. The kubelet expands `$(NAME)` in a container's command and env values from the
    container's variables, HF_TOKEN among them (spec.hfTokenSecretRef, a secretKeyRef). The operator
    escapes `$(` as `$$(`, which is right only where no `$` comes before it: Kubernetes reads `$$` as one
    `$` first. Doubling every `$` (escape: text.replace("$", "$$")) gives back each string as written."""
    written = "$$(HF_TOKEN)"
    problems, pod = _admitted_and_rendered(
        {
            "model": f"org/m{written}",
            "servedModelName": written,
            "engine": {"extraArgs": [f"--chat-template={written}"]},
            "env": [{"name": "GREETING", "value": written}],
            "hfTokenSecretRef": {"name": "hf", "key": "token"},
        }
    )
    assert problems == []
    variables = {"HF_TOKEN": "hf_s3cret"}
    command = [kubelet_expand(t, variables) for t in pod["containers"][0]["command"]]
    assert command[command.index("--served-model-name") + 1] == written
    assert f"org/m{written}" in command and f"--chat-template={written}" in command
    assert not any("hf_s3cret" in t for t in command), command
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert kubelet_expand(env["GREETING"], variables) == written


def test_env_cannot_widen_the_gpus_the_device_plugin_gave_the_pod(helm, tmp_path):
    """Medium (High on envvar-strategy nodes). A pod gets its GPUs from the device plugin, which the
    NVIDIA container toolkit reads from NVIDIA_VISIBLE_DEVICES; the kubelet puts a container's own env
    after the device plugin's, so `NVIDIA_VISIBLE_DEVICES=all` in spec.env wins. The chart's admission
    policy (maxGpus) then bounds nothing, and the pod can fill the memory of GPUs another tenant's pod
    was given (one tenant slowing or crashing another). The CRD already refuses some env names
    (PYTHONPATH, HF_TOKEN): it should refuse NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES and
    NVIDIA_MIG_* too (api/spec.py VLLMServiceSpec rules), and the README should say envFrom can still
    carry them (a ConfigMap's keys are not seen at admission) and that nodes should take GPUs by
    volume mounts (accept-nvidia-visible-devices-envvar-when-unprivileged = false)."""
    policy = by_kind(template(helm, tmp_path, VALUE_SETS["locked-down"]), "ValidatingAdmissionPolicy")[0]["spec"]
    spec = {
        "resources": {"gpus": 1, "limits": {"memory": "64Gi"}},
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
    }
    stored, problems = admit(_vsvc(spec))
    variables: dict = {}
    for var in policy["variables"]:
        variables[var["name"]] = evaluate(var["expression"], {"object": stored, "variables": variables})
    denied = [
        v["message"]
        for v in policy["validations"]
        if not evaluate(v["expression"], {"object": stored, "variables": variables})
    ]
    if problems or denied:
        return  # refused at admission: the right outcome
    _, pod = _admitted_and_rendered(spec)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert "NVIDIA_VISIBLE_DEVICES" not in env, "admitted, and rendered into a 1-GPU pod"


@pytest.mark.parametrize(
    "spec",
    [
        {"model": "--api-key=sk-live-123"},
        {"model": "-tp=8"},
        {"heal": {"quantizedFallback": {"allowed": True, "model": "--hf-token=hf_s3cret", "method": "awq"}}},
    ],
    ids=["model-api-key", "model-short-flag", "fallback-hf-token"],
)
def test_a_model_name_is_never_read_by_vllm_as_a_flag(spec):
    """Low. The same text in extraArgs is refused (the control below). A Hub id or a local path never
    begins with '-': the CRD should say so (api/spec.py: a pattern on model and quantizedFallback.model,
    e.g. ^[^-]), and the render could also pass `--model MODEL` where a positional is ambiguous."""
    assert admit(_vsvc({"engine": {"extraArgs": ["--api-key=sk-live-123"]}}))[1]  # control: refused there
    stored, problems = admit(_vsvc(spec))
    assert problems and "should match" in problems[0] and "model:" in problems[0], problems  # (names the field)


# --- pods the operator does not own -------------------------------------------------------------


@pytest.mark.kmock(cls=Emulator)
async def test_a_crash_of_a_pod_the_service_does_not_own_is_not_healed(cluster):
    """Medium. Creating pods and editing VLLMServices are separate grants (Kubernetes' aggregated `edit`
    role has the first, not the second, unless the CRD's roles are aggregated into it). The operator should
    act on a crash only of a pod its Deployment runs: the pod's controller a ReplicaSet (by uid) whose
    controller is the service's Deployment, whose controller is the VLLMService (kube/handlers.py
    pod_changed, or heal.handle_crash; the harness's crash_pod would then give its pods that chain)."""
    await cluster.create_vsvc("victim", SPEC)
    await cluster.settled("victim")
    dep = copy.deepcopy(await cluster.deployment("victim"))
    # The decoy: no owner, no GPU, a shell image that writes the termination message and exits 1.
    decoy = dep["spec"]["template"]["spec"]
    decoy["containers"] = [{"name": "vllm", "image": "busybox:1.36", "command": ["sh", "-c", "cat msg >&2; exit 1"]}]
    decoy.pop("initContainers", None)
    await cluster.crash_pod("victim", "someone-elses-pod", message=KV_TERMINATION, template_from=dep, owned=False)
    await asyncio.sleep(3.0)  # (a heal of the service's own pods is recorded well within this)
    status = (await cluster.vsvc("victim")).get("status") or {}
    assert not status.get("healCount") and not status.get("observedCrashes"), status.get("heals")
    assert "maxModelLen" not in (await cluster.vsvc("victim"))["spec"]["engine"]


# --- objects the operator does not own: the look and the write are two requests ---------------------


class RacingServer(Kube):
    """The few API calls apply_all makes, against objects held here; a Service named `payments` is created
    by its own team right after the operator's GET found none (server-side apply creates or takes over)."""

    def __init__(self) -> None:  # (no client: nothing leaves the process)
        self.timeout = None
        self.objects: dict[str, dict[str, Any]] = {}
        self.raced = False

    def request(self, method: str, path: str, body: Any = None, content_type: str = "", *a: Any, **k: Any) -> Any:
        live = self.objects.get(path)
        if method == "GET":
            if live is None and path.endswith("/services/payments") and not self.raced:
                self.raced = True
                self.objects[path] = {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "payments", "namespace": "team-a", "uid": "theirs", "resourceVersion": "1"},
                    "spec": {"selector": {"app": "payments"}, "ports": [{"name": "https", "port": 443}]},
                }
            if live is None:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(live)
        if method == "POST":  # a create: refused where the name is taken
            path = f"{path}/{body['metadata']['name']}"
            if path in self.objects:
                raise ApiException(status=409, reason="AlreadyExists")
            self.objects[path] = copy.deepcopy(body)
            return body
        if method == "PATCH" and content_type == APPLY:
            want = body["metadata"]
            if live is not None and any(
                want.get(k) not in (None, live["metadata"].get(k)) for k in ("uid", "resourceVersion")
            ):
                raise ApiException(status=409, reason="Conflict: precondition failed")
            self.objects[path] = server_side_apply(live or {}, body, "vllm-autoheal")
            return self.objects[path]
        raise AssertionError(f"unexpected {method} {path}")


def test_an_object_created_between_the_look_and_the_write_is_not_taken_over():
    """Defended (was: a race, the window one request). The NameConflict check held only for objects there at
    the GET, and a forced apply creates or takes over. The write now carries what the look saw: a create
    (POST, 409 where the name was taken meanwhile) for an object that was absent, and the live uid in the
    apply for one that was the service's; the 409 is retried, and the retry reports the name conflict.
    tests/test_apply_on_crd_server.py shows the same against the real API server."""
    kube = RacingServer()
    obj = VLLMService.model_validate({**_vsvc({}), "metadata": {**_vsvc({})["metadata"], "name": "payments"}})
    try:
        kube.apply_all(resources.render(obj))
    except ApiException:
        pass  # refused: nothing written over theirs
    theirs = kube.objects["/api/v1/namespaces/team-a/services/payments"]
    assert not theirs["metadata"].get("ownerReferences"), theirs["metadata"]
    assert theirs["spec"]["selector"] == {"app": "payments"}


# --- defended: no field of the spec reaches the pod's privileges --------------------------------------


def test_no_spec_field_gives_the_pod_host_access_privilege_a_service_account_or_a_priority():
    """Defended. Fields a pod would honour, written anywhere in a VLLMService, are pruned by the CRD (the
    API server's structural schema) and never rendered: the pod is exactly the operator's, whatever the
    author adds."""
    hostile = {
        "hostNetwork": True,
        "hostPID": True,
        "hostIPC": True,
        "serviceAccountName": "vllm-autoheal",
        "automountServiceAccountToken": True,
        "priorityClassName": "system-node-critical",
        "runtimeClassName": "runc-privileged",
        "securityContext": {"privileged": True, "runAsUser": 0},
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "volumeMounts": [{"name": "root", "mountPath": "/host"}],
        "affinity": {"nodeAffinity": {}},
        "command": ["sh"],
        "labels": {"app": "payments"},
        "annotations": {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"},
        "resources": {
            "limits": {"memory": "32Gi", "nvidia.com/gpu": 8},
            "hostPort": 80,
            "privileged": True,
        },
        "engine": {"securityContext": {"privileged": True}},
        "modelCache": {"enabled": True, "size": "10Gi", "hostPath": "/var/lib/kubelet"},
    }
    problems, pod = _admitted_and_rendered(hostile)
    assert problems == []
    assert set(pod) == {
        "initContainers",
        "containers",
        "volumes",
        "nodeSelector",
        "tolerations",
        "automountServiceAccountToken",
        "enableServiceLinks",
        "securityContext",
        "terminationGracePeriodSeconds",
        "restartPolicy",
    }
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}
    }
    assert [sorted(set(v) - {"name"}) for v in pod["volumes"]] == [
        ["emptyDir"],
        ["persistentVolumeClaim"],
        ["emptyDir"],
    ]
    assert pod["volumes"][1]["persistentVolumeClaim"] == {"claimName": "s-model-cache"}
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert "hostPort" not in container["ports"][0]
    assert container["command"][:5] == ["python3", "-m", "vllm_autoheal.launcher", "--", "vllm"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/dev/shm", "/root/.cache/huggingface", "/autoheal"}


def test_a_hub_token_the_http_client_refuses_is_not_echoed_into_status(tmp_path):
    """Defended. The operator sends the value of the Secret key spec.hfTokenSecretRef names as a bearer
    token; a value the HTTP stack refuses as a header (a newline, a NUL) raises an error whose text names
    the header, and every error of from_hub is written to the MemoryFit condition, which anyone who may
    read the VLLMService sees. The failed metadata request falls back to the local cache, whose error says
    nothing of the token."""
    hub = HubSettings(endpoint="http://127.0.0.1:9", cache_dir=str(tmp_path), timeout_s=2)
    for token in ("hf_s3cret\nX-Injected: 1", "hf_s3cret\x00", "hf_s3cret\r", "hf_s3cr\u00e9t"):
        with pytest.raises(ModelConfigError) as caught:
            from_hub("org/model", None, hub, token)
        assert "s3cr" not in str(caught.value), caught.value
