"""The pod a VLLMService gets: hardened by default, user strings reach vLLM as written."""

from __future__ import annotations

from vllm_autoheal.api import VLLMService
from vllm_autoheal.kube import resources
from vllm_autoheal.kube.resources import deployment


def _pod(**spec) -> dict:
    obj = VLLMService.model_validate(
        {"metadata": {"name": "s", "namespace": "ml", "uid": "u1"}, "spec": {"model": "org/m", **spec}}
    )
    return deployment(obj)["spec"]["template"]["spec"]


def test_pod_is_hardened_by_default():
    pod = _pod()
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    for c in pod["containers"] + pod["initContainers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    vllm = pod["containers"][0]
    assert "runAsNonRoot" not in vllm["securityContext"]  # vLLM's images run as root
    assert pod["initContainers"][0]["securityContext"]["runAsNonRoot"] is True
    assert _pod(runAsNonRoot=True)["containers"][0]["securityContext"]["runAsNonRoot"] is True


def test_variable_references_in_user_strings_are_not_expanded():
    pod = _pod(
        model="org/$(HF_TOKEN)",
        servedModelName="$(HF_TOKEN)",
        engine={"extraArgs": ["--chat-template=$(SECRET)"]},
        env=[{"name": "A", "value": "x$(HF_TOKEN)"}, {"name": "B", "value": "$$(kept)"}],
        hfTokenSecretRef={"name": "hf", "key": "token"},
    )
    command = pod["containers"][0]["command"]
    assert "org/$$(HF_TOKEN)" in command and "--chat-template=$$(SECRET)" in command
    assert command[command.index("--served-model-name") + 1] == "$$(HF_TOKEN)"
    assert not any("$(" in t.replace("$$(", "") for t in command)
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["A"]["value"] == "x$$(HF_TOKEN)" and env["B"]["value"] == "$$$$(kept)"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}


def test_shm_is_bounded_by_the_memory_limit():
    def shm(**res) -> str:
        return next(v for v in _pod(resources=res)["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]

    assert shm() == "8Gi"
    assert shm(limits={"memory": "4Gi"}) == "4Gi"
    assert shm(shmSize="2Gi", limits={"memory": "4Gi"}) == "2Gi"
    assert shm(shmSize="64Gi") == "64Gi"


def _healed(mode: str, baseline_for: str | None, **spec) -> VLLMService:
    """A service whose heal set maxModelLen 4096 into status.effective, for the spec as given."""
    obj = VLLMService.model_validate(
        {
            "apiVersion": "vllm.autoheal.dev/v1alpha1",
            "kind": "VLLMService",
            "metadata": {"name": "s", "namespace": "t"},
            "spec": {
                "model": "org/a",
                "heal": {"mode": mode, "quantizedFallback": {"allowed": True, "model": "org/a-awq", "method": "awq"}},
                **spec,
            },
            "status": {"baseline": {}, "effective": {"maxModelLen": 4096}, "effectiveModel": "org/a-awq"},
        }
    )
    obj.status.baseline_for = baseline_for
    return obj


def test_status_overrides_apply_only_to_the_model_memory_and_gpu_they_were_sized_for():
    taken = resources.sized_for(_healed("StatusOverrides", None))
    assert resources.effective(_healed("StatusOverrides", taken))[:2] == (
        "org/a-awq",
        _healed("PatchSpec", None).status.effective,
    )
    for change in (
        {"model": "org/b"},
        {"resources": {"gpuProduct": "NVIDIA-H200"}},
        {"resources": {"limits": {"memory": "64Gi"}}},
    ):
        moved = _healed("StatusOverrides", taken, **change)
        assert not resources.on_baseline(moved)
        model, engine, _memory = resources.effective(moved)
        assert model == moved.spec.model and engine == moved.spec.engine  # the person's spec, as written
    # a baseline written by an older version (no baselineFor) is judged by spec.engine alone
    assert resources.on_baseline(_healed("StatusOverrides", None, model="org/b"))
    # PatchSpec: heals write the model and memory limit into the spec themselves
    assert resources.on_baseline(_healed("PatchSpec", taken, model="org/b"))


def test_no_env_name_reaches_the_pod_twice():
    """Server-side apply refuses a container whose env names a variable twice (the server answers
    500, which the operator retried every 10 s, forever, with nothing in status): such a spec is
    refused at admission, as the API server and `render` both check it."""
    from vllm_autoheal.validation import admit

    twice = [{"name": "MODE", "value": "a"}, {"name": "MODE", "value": "b"}]
    token = {"name": "hf", "key": "token"}
    for spec in (
        {"env": twice},
        {"env": [{"name": "PYTHONPATH", "value": "/opt/mine"}]},
        {"env": [{"name": "HF_TOKEN", "value": "x"}], "hfTokenSecretRef": token},
    ):
        _, problems = admit({"metadata": {"name": "s"}, "spec": {"model": "org/m", **spec}})
        assert any(p.startswith("spec.env") for p in problems), (spec, problems)
    # what stays allowed: PYTHONPATH without the launcher, HF_TOKEN without hfTokenSecretRef
    for spec in (
        {"env": [{"name": "PYTHONPATH", "value": "/opt/mine"}], "launcher": False},
        {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": token}}]},
    ):
        body, problems = admit({"metadata": {"name": "s"}, "spec": {"model": "org/m", **spec}})
        assert problems == [], problems
        obj = VLLMService.model_validate({**body, "metadata": {"name": "s", "namespace": "ml", "uid": "u1"}})
        names = [e["name"] for e in deployment(obj)["spec"]["template"]["spec"]["containers"][0]["env"]]
        assert len(names) == len(set(names)), names


def test_status_overrides_past_the_spec_and_its_heal_bounds_are_not_deployed():
    """Status is the operator's to write, but a role granting a tenant `vllmservices/status` (a wildcard over
    the group's resources) must not buy more GPUs, memory or another model than admission allowed the spec:
    overrides past spec.heal.bounds are refused whole, and the spec as written is deployed."""
    base = {
        "model": "org/a",
        "engine": {"tensorParallelSize": 2},
        "resources": {"limits": {"memory": "64Gi"}},
        "heal": {
            "mode": "StatusOverrides",
            "allowedActions": ["IncreaseTensorParallel", "RaiseMemoryLimit", "LowerMaxModelLen"],
            "bounds": {"maxTensorParallelSize": 4, "maxMemoryLimit": "128Gi"},
        },
    }

    def served(**status) -> VLLMService:
        obj = VLLMService.model_validate(
            {
                "metadata": {"name": "s", "namespace": "t"},
                "spec": base,
                "status": {"baseline": {"tensorParallelSize": 2}, **status},
            }
        )
        obj.status.baseline_for = resources.sized_for(obj)
        return obj

    within = served(effective={"tensorParallelSize": 4}, effectiveMemoryLimit="128Gi")
    assert resources.overrides_refused(within) is None
    assert resources.gpu_count(within) == 4 and resources.effective(within)[2] == "128Gi"
    for status, field in (
        ({"effective": {"tensorParallelSize": 8}}, "tensorParallelSize"),
        ({"effective": {"tensorParallelSize": 2, "pipelineParallelSize": 4}}, "pipelineParallelSize"),
        ({"effective": {"tensorParallelSize": 2}, "effectiveMemoryLimit": "1Ti"}, "effectiveMemoryLimit"),
        ({"effective": {"tensorParallelSize": 2}, "effectiveModel": "org/huge"}, "effectiveModel"),
    ):
        beyond = served(**status)
        assert field in (resources.overrides_refused(beyond) or ""), status
        assert resources.effective(beyond) == ("org/a", beyond.spec.engine, "64Gi")
        assert resources.gpu_count(beyond) == 2
