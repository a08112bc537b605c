"""The operator loop through Kubernetes objects: kopf in-process against kmock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.kube import resources
from vllm_autoheal.kube.client import MERGE
from vllm_autoheal.launcher import termination_message

from operator_harness import (
    TEST_CONFIG,
    Cluster,
    Emulator,
    flag,
    running_operator,
    setup_emulator,
    vllm_container,
    vsvc_path,
    wait_for,
)
from samples import FIXTURES, KV_LOG, KV_TERMINATION, SPEC

pytestmark = pytest.mark.kmock(cls=Emulator)


async def test_create_renders_deployment_and_service(cluster):
    spec = {
        **SPEC,
        "engine": {"tensorParallelSize": 2, "maxModelLen": 32768},
        "hfTokenSecretRef": {"name": "hf", "key": "token"},
        "resources": {
            **SPEC["resources"],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        },
    }
    await cluster.create_vsvc("llama", spec)
    dep = await wait_for(lambda: cluster.deployment_now("llama"), what="deployment")
    c = vllm_container(dep)
    assert c["command"][:5] == ["python3", "-m", "vllm_autoheal.launcher", "--", "vllm"]
    assert flag(dep, "--max-model-len") == "32768" and flag(dep, "--tensor-parallel-size") == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2 and c["resources"]["limits"]["memory"] == "32Gi"
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in pod["volumes"]
    assert pod["initContainers"][0]["command"][:2] == ["cp", "-r"]
    assert c["startupProbe"]["httpGet"]["path"] == "/health" and c["startupProbe"]["failureThreshold"] >= 60
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in c["env"]
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "VLLMService"
    # applied after the Deployment, in its own request
    svc = await wait_for(lambda: cluster.kube.get("/api/v1/namespaces/default/services/llama"), what="service")
    assert svc["spec"]["ports"][0]["port"] == 8000
    st = (
        await wait_for(
            lambda: (cluster.vsvc_now("llama").get("status") or {}).get("endpoint") and cluster.vsvc_now("llama"),
            what="status",
        )
    ).get("status")
    assert st["gpus"] == 2 and st["baseline"]["maxModelLen"] == 32768 and st["phase"] == "Progressing"
    assert st["endpoint"] == "http://llama.default.svc:8000/v1"


async def test_a_deleted_deployment_is_applied_again_while_its_service_stays(cluster):
    """A person (or another tool) deletes a VLLMService's Deployment: the operator, which watches the Deployments
    it manages, renders and applies it again, as it was (before, only the next edit of the spec or the
    operator's restart brought it back). A Deployment of the same labels that the service does not control
    (here: no ownerReference) brings nothing back."""
    await cluster.create_vsvc("kept", SPEC)
    first = await wait_for(lambda: cluster.deployment_now("kept"), what="deployment")
    await cluster.settled("kept")
    path = "/apis/apps/v1/namespaces/default/deployments/kept"
    await cluster.call("DELETE", path)
    again = await wait_for(lambda: cluster.deployment_now("kept"), what="the deployment applied again")
    assert again["spec"]["template"] == first["spec"]["template"]
    await cluster.quiet("kept")
    decoy = {**first, "metadata": {k: v for k, v in first["metadata"].items() if k in ("name", "namespace", "labels")}}
    decoy["metadata"]["name"] = "decoy"
    decoys = "/apis/apps/v1/namespaces/default/deployments"
    await cluster.call("POST", decoys, decoy)
    await cluster.call("DELETE", f"{decoys}/decoy")
    await cluster.quiet("kept")
    assert await cluster.get(f"{decoys}/decoy") is None
    # the service deleted, then its Deployment (the garbage collector's order): nothing is brought back
    await cluster.call("DELETE", "/apis/vllm.autoheal.dev/v1alpha1/namespaces/default/vllmservices/kept")
    await cluster.call("DELETE", path)
    await asyncio.sleep(1.0)
    assert await cluster.get(path) is None


async def test_a_deleted_service_or_model_cache_claim_is_applied_again_while_its_service_stays(cluster):
    """A VLLMService's Service (its endpoint) or its model-cache claim deleted by hand: applied again at once,
    as the Deployment is. Before, nothing did until the next edit of the spec or the operator's restart,
    however long that took: the endpoint stayed gone."""
    await cluster.create_vsvc("ends", {**SPEC, "modelCache": {"enabled": True, "size": "50Gi"}})
    await cluster.settled("ends")
    for path in (
        "/api/v1/namespaces/default/services/ends",
        "/api/v1/namespaces/default/persistentvolumeclaims/ends-model-cache",
    ):
        first = await wait_for(lambda p=path: cluster.kube.get(p), what=path)
        await cluster.call("DELETE", path)
        again = await wait_for(lambda p=path: cluster.kube.get(p), what=f"{path} applied again")
        assert again["spec"] == first["spec"] and again["metadata"]["uid"] != first["metadata"]["uid"]


async def test_kv_crash_patches_spec_records_baseline_and_rolls_out(cluster):
    await cluster.create_vsvc("kv", SPEC)
    await cluster.settled("kv")
    before = await cluster.deployment("kv")
    await cluster.crash_pod("kv", "kv-abc", message=KV_TERMINATION)
    obj = await wait_for(
        lambda: cluster.vsvc_now("kv")["spec"]["engine"].get("maxModelLen") and cluster.vsvc_now("kv"),
        what="spec patch",
    )
    assert obj["spec"]["engine"]["maxModelLen"] == 524160  # vLLM's estimate, from the message
    status = obj["status"]
    assert status["baseline"] == {
        "gpuMemoryUtilization": 0.9,
        "tensorParallelSize": 1,
        "pipelineParallelSize": 1,
        "extraArgs": [],
    }
    heal = status["heals"][-1]
    assert heal["cause"] == "kv_cache_insufficient" and heal["action"] == "LowerMaxModelLen"
    assert heal["changes"] == [{"field": "maxModelLen", "after": "524160"}]  # before: unset (vLLM default)
    assert status["healCount"] == 1 and status["lastCause"] == "kv_cache_insufficient"
    assert any(c["type"] == "Healing" and c["status"] == "True" for c in status["conditions"])
    dep = await wait_for(
        lambda: flag(cluster.deployment_now("kv"), "--max-model-len") == "524160" and cluster.deployment_now("kv"),
        what="new pod template",
    )
    old_hash = before["spec"]["template"]["metadata"]["annotations"][resources.ENGINE_HASH]
    assert dep["spec"]["template"]["metadata"]["annotations"][resources.ENGINE_HASH] != old_hash
    assert await wait_for(lambda: cluster.events_now("OOMDetected"), what="OOMDetected event")
    healed = await wait_for(lambda: cluster.events_now("Healed"), what="Healed event")
    assert "--max-model-len 524160" in healed[0]["message"]


async def test_the_same_crash_is_healed_once_even_across_an_operator_restart(cluster):
    await cluster.create_vsvc("once", SPEC)
    await cluster.settled("once")
    first = await cluster.deployment("once")
    uid = await cluster.crash_pod("once", "once-a", message=KV_TERMINATION)
    await wait_for(lambda: cluster.vsvc_now("once")["status"].get("healCount") == 1, what="first heal")
    # The same crash reported again (another status update of the same pod), and a second pod
    # of the old template crashing for the same reason: neither heals again.
    await cluster.crash_pod("once", "once-a", message=KV_TERMINATION, uid=uid)
    second = await cluster.crash_pod("once", "once-b", message=KV_TERMINATION, template_from=first)
    await wait_for(
        lambda: any(c.startswith(f"{second}/") for c in cluster.vsvc_now("once")["status"].get("observedCrashes", [])),
        what="the second pod's crash, looked at",
    )
    await asyncio.sleep(2)  # (the repeated report changes nothing that could be waited for)
    status = (await cluster.vsvc("once"))["status"]
    assert status["healCount"] == 1 and len(status["heals"]) == 1


async def test_a_heal_writes_once_and_then_goes_quiet(cluster):
    """No update storm: the heal's status write, its spec patch and kopf's own bookkeeping each
    come back as watch events; none of them may wake another round of writes."""
    await cluster.create_vsvc("calm", SPEC)
    await cluster.settled("calm")
    before = len(await cluster.quiet("calm"))
    await cluster.crash_pod("calm", "calm-a", message=KV_TERMINATION)
    obj = await wait_for(
        lambda: (
            (v := cluster.vsvc_now("calm"))["metadata"]["generation"] == 2
            and (v.get("status") or {}).get("observedGeneration") == 2
            and v
        ),
        what="healed generation",
    )
    assert obj["spec"]["engine"]["maxModelLen"] == 524160
    writes = (await cluster.quiet("calm"))[before:]  # an update storm never goes quiet
    deployment_writes = [w for w in writes if "/deployments/" in w[1]]
    assert deployment_writes == [("PATCH", "/apis/apps/v1/namespaces/default/deployments/calm")]
    spec_patches = [w for w in writes if w[1].endswith("/vllmservices/calm")]
    # the heal's spec patch, and kopf recording that it handled that change
    assert len(spec_patches) <= 2, writes


async def test_operator_restart_does_not_heal_a_handled_crash(kmock):
    setup_emulator(kmock)
    async with running_operator():
        c = Cluster(kmock)
        await c.first_heal("restart", SPEC, "restart-a", message=KV_TERMINATION)
    async with running_operator():  # a new operator process sees the same pod on its first listing
        await asyncio.sleep(3)
        obj = await c.vsvc("restart")
        assert obj["status"]["healCount"] == 1 and obj["spec"]["engine"]["maxModelLen"] == 524160


async def test_oom_killed_raises_the_memory_limit_vpa_style_within_the_bound(cluster):
    await cluster.create_vsvc("ram", SPEC)
    await cluster.settled("ram")
    await cluster.crash_pod("ram", "ram-a", exit_code=137, reason="OOMKilled", message="Killed")
    obj = await wait_for(
        lambda: cluster.vsvc_now("ram")["spec"]["resources"]["limits"]["memory"] != "32Gi" and cluster.vsvc_now("ram"),
        what="memory limit patch",
    )
    assert obj["spec"]["resources"]["limits"]["memory"] == "39322Mi"  # 32Gi x 1.2
    dep = await wait_for(
        lambda: (
            vllm_container(cluster.deployment_now("ram"))["resources"]["limits"]["memory"] == "39322Mi"
            and cluster.deployment_now("ram")
        ),
        what="deployment limit",
    )
    assert dep


async def test_not_memory_is_left_alone_with_an_event(cluster):
    await cluster.create_vsvc("nm", SPEC)
    await cluster.settled("nm")
    msg = termination_message(
        classify(Signals(log=(FIXTURES / "model-not-found.log").read_text(), exit_code=1)).to_dict(), 1, None, None
    )
    await cluster.crash_pod("nm", "nm-a", message=msg)
    events = await wait_for(lambda: cluster.events_now("NotMemory"), what="NotMemory event")
    assert "model_not_found" in events[0]["message"]
    obj = await cluster.vsvc("nm")
    assert obj["spec"]["engine"] == SPEC["engine"]  # as written (kmock applies no CRD defaults)
    assert obj["status"]["heals"][-1]["action"] == "NoChange" and obj["status"].get("healCount", 0) == 0


async def test_fallback_log_tail_sends_the_operator_to_the_previous_log(cluster):
    """Without the launcher, the 2 KiB tail holds only the API server's traceback: the operator
    reads the crashed container's log through the API and finds the root cause there."""
    await cluster.create_vsvc("tail", {**SPEC, "launcher": False})
    await cluster.settled("tail")
    cluster.kmock["get /api/v1/namespaces/default/pods/tail-a/log"] << KV_LOG.encode()
    await cluster.crash_pod("tail", "tail-a", message=KV_LOG[-2048:])
    obj = await wait_for(
        lambda: cluster.vsvc_now("tail")["spec"]["engine"].get("maxModelLen") and cluster.vsvc_now("tail"),
        what="heal from the previous log",
    )
    assert obj["spec"]["engine"]["maxModelLen"] == 524160


async def test_attempts_exhausted_sets_heal_exhausted_and_stops(cluster):
    await cluster.create_vsvc("ex", {**SPEC, "heal": {**SPEC["heal"], "maxAttempts": 1}})
    await cluster.settled("ex")
    await cluster.crash_pod("ex", "ex-a", message=KV_TERMINATION)
    await wait_for(lambda: cluster.vsvc_now("ex")["status"].get("healCount") == 1, what="first heal")
    await wait_for(lambda: flag(cluster.deployment_now("ex"), "--max-model-len") == "524160", what="rollout")
    engine = dict((await cluster.vsvc("ex"))["spec"]["engine"])
    await cluster.crash_pod("ex", "ex-b", message=KV_TERMINATION)  # the healed pods crash again
    obj = await wait_for(
        lambda: (
            any(
                c["type"] == "HealExhausted" and c["status"] == "True"
                for c in cluster.vsvc_now("ex")["status"].get("conditions", [])
            )
            and cluster.vsvc_now("ex")
        ),
        what="HealExhausted",
    )
    assert obj["status"]["phase"] == "Failed" and obj["spec"]["engine"] == engine
    assert await wait_for(lambda: cluster.events_now("HealExhausted"), what="HealExhausted event")


async def test_status_overrides_never_touch_the_spec(cluster):
    spec = {**SPEC, "heal": {**SPEC["heal"], "mode": "StatusOverrides"}}
    await cluster.create_vsvc("gitops", spec)
    await cluster.settled("gitops")
    await cluster.crash_pod("gitops", "gitops-a", message=KV_TERMINATION)
    dep = await wait_for(
        lambda: (
            flag(cluster.deployment_now("gitops"), "--max-model-len") == "524160" and cluster.deployment_now("gitops")
        ),
        what="rollout from status",
    )
    obj = await cluster.vsvc("gitops")
    assert "maxModelLen" not in obj["spec"]["engine"]
    assert obj["status"]["effective"]["maxModelLen"] == 524160
    assert resources.ENGINE_HASH in dep["spec"]["template"]["metadata"]["annotations"]


async def test_status_overrides_give_way_to_a_persons_change_of_the_model(cluster):
    """StatusOverrides: heals are sized for the model, memory limit and GPU the spec names; a person's
    change of the model (in Git) is an edit, as one of spec.engine is: the new model runs with the
    flags as written, and the heal count starts over (before, the healed flags, or a healed quantized
    model, went on running whatever the spec said)."""
    spec = {**SPEC, "heal": {**SPEC["heal"], "mode": "StatusOverrides"}}
    await cluster.create_vsvc("regit", spec)
    await cluster.settled("regit")
    await cluster.crash_pod("regit", "regit-a", message=KV_TERMINATION)
    await wait_for(lambda: flag(cluster.deployment_now("regit"), "--max-model-len") == "524160", what="the heal")
    await cluster.call("PATCH", vsvc_path("regit"), {"spec": {"model": "example/other-model"}}, MERGE)

    def redeployed() -> dict | None:
        dep = cluster.deployment_now("regit")
        return dep if "example/other-model" in json.dumps(vllm_container(dep)) else None

    dep = await wait_for(redeployed, what="the new model deployed")
    assert flag(dep, "--max-model-len") is None  # spec.engine names none: the healed 524160 is gone
    obj = await cluster.settled("regit")
    assert obj["status"]["attempts"] == 0 and obj["status"]["healCount"] == 1
    assert "maxModelLen" not in (obj["status"].get("effective") or {})


async def test_preflight_fix_starts_with_flags_that_fit(cluster):
    config = (Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json").read_text()
    spec = {**SPEC, "preflight": "Fix", "engine": {"maxModelLen": 131072}}
    await cluster.create_vsvc("fit", spec, annotations={"vllm.autoheal.dev/model-config": config})
    dep = await wait_for(lambda: cluster.deployment_now("fit"), what="deployment")
    fitted = int(flag(dep, "--max-model-len"))
    assert 16384 < fitted < 131072  # an L4 holds ~35k tokens of Llama-8B KV at utilization 0.9
    obj, fit = await cluster.with_condition("fit", "MemoryFit")
    assert fit["status"] == "True" and fit["reason"] == "FittedByPreflight"
    assert obj["spec"]["engine"]["maxModelLen"] == 131072  # the spec stays as written


async def test_preflight_fix_only_reports_when_the_operator_may_change_nothing(kmock):
    """The chart's heal.enabled=false (diagnose and report only) holds for pre-flight's Fix too: the
    first Deployment runs the flags as written, and MemoryFit says what does not fit and why."""
    import dataclasses

    setup_emulator(kmock)
    config = (Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json").read_text()
    spec = {**SPEC, "preflight": "Fix", "engine": {"maxModelLen": 131072}}
    async with running_operator(dataclasses.replace(TEST_CONFIG, heal_enabled=False)):
        c = Cluster(kmock)
        await c.create_vsvc("report", spec, annotations={"vllm.autoheal.dev/model-config": config})
        obj, fit = await c.with_condition("report", "MemoryFit")
        dep = await wait_for(lambda: c.deployment_now("report"), what="deployment")
    assert flag(dep, "--max-model-len") == "131072" and obj["status"]["effective"]["maxModelLen"] == 131072
    assert fit["status"] == "False" and "heal.enabled=false" in fit["message"]


async def test_preflight_warn_reports_without_changing(cluster):
    config = (Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-70b.json").read_text()
    await cluster.create_vsvc(
        "big", {**SPEC, "preflight": "Warn"}, annotations={"vllm.autoheal.dev/model-config": config}
    )
    _obj, fit = await cluster.with_condition("big", "MemoryFit")
    assert fit["status"] == "False" and fit["reason"] == "WeightsLoadOom" and "weights need" in fit["message"]


async def test_metrics_count_incidents_and_heals(cluster):
    from vllm_autoheal import metrics

    samples = [
        ("vllm_autoheal_incidents_total", {"cause": "kv_cache_insufficient"}),
        ("vllm_autoheal_heals_total", {"action": "LowerMaxModelLen"}),
        ("vllm_autoheal_heal_latency_seconds_count", {}),
    ]

    def values() -> list[float]:
        return [metrics.REGISTRY.get_sample_value(name, labels) or 0.0 for name, labels in samples]

    before = values()  # (other tests of this process healed too)
    await cluster.first_heal("counted", SPEC, "counted-a", message=KV_TERMINATION)
    # counted after the heal's writes (the heal and its latency once it is applied)
    await wait_for(lambda: all(v >= b + 1 for v, b in zip(values(), before, strict=True)), what="the heal counted")


def test_render_cli_prints_what_the_operator_applies(tmp_path):
    import subprocess
    import sys

    import yaml

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "render", "-f", str(root / "examples" / "llama-8b-one-gpu.yaml")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out)]
    assert kinds == ["PersistentVolumeClaim", "Deployment", "Service"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: vllm.autoheal.dev/v1alpha1\nkind: VLLMService\nmetadata: {name: x}\n"
        "spec: {engine: {gpuMemoryUtilization: 3}}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "render", "-f", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "gpuMemoryUtilization" in proc.stderr and "model" in proc.stderr


@pytest.mark.parametrize("log_format, prefixed", [("plain", True), ("full", True), ("json", False)])
def test_operator_log_lines_name_their_vllmservice(log_format, prefixed):
    import subprocess
    import sys

    code = (
        "import logging; from vllm_autoheal.cli_commands import configure_logging; "
        f"configure_logging({log_format!r}); logging.getLogger('kopf.objects').info("
        "'Deployment llama patched', extra={'k8s_ref': {'namespace': 'ml', 'name': 'llama'}})"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "Deployment llama patched" in err
    assert ("[ml/llama] Deployment llama patched" in err) is prefixed
