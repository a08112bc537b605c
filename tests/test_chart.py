"""The Helm chart with a real helm binary; manifests validated offline; the Dockerfile, statically."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_autoheal.kube.resources import LAUNCHER_DIR

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "vllm-autoheal"


def template(helm: str, tmp_path: Path, values: dict) -> list[dict]:
    vals = tmp_path / "values.yaml"
    vals.write_text(yaml.safe_dump(values))
    out = subprocess.run(
        [helm, "template", "rel", str(CHART), "--namespace", "ops", "-f", str(vals)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_lint_strict_is_clean(helm):
    proc = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout and "[WARNING]" not in proc.stdout


DIGEST = "sha256:" + "a1" * 32
VALUE_SETS = {
    "default": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "ha": {"replicas": 3},
    "monitoring": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "dashboard": {"enabled": True},
    },
    "custom-image": {
        "image": {"repository": "registry.example.com/ml/vllm-autoheal", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
    },
    "digest": {"image": {"repository": "registry.example.com/ml/vllm-autoheal", "digest": DIGEST}},
    "locked-down": {
        "watchNamespaces": ["team-a"],
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        },
        "admissionPolicy": {
            "enabled": True,
            "allowedImagePrefixes": ["vllm/vllm-openai:"],
            "maxGpus": 8,
            "maxMemory": "512Gi",
        },
    },
    "hub-mirror": {"hub": {"endpoint": "https://hf-mirror.example.com", "useSecretTokens": False}},
}


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_renders_and_validates_offline(helm, tmp_path, name):
    import kubernetes_validate

    docs = template(helm, tmp_path, VALUE_SETS[name])
    for doc in docs:
        if doc["apiVersion"].startswith(("monitoring.coreos.com", "kopf.dev")):
            continue  # a custom resource: kubernetes-validate knows built-in kinds only
        kubernetes_validate.validate(doc, "1.31.0", strict=True)
    dep = by_kind(docs, "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    rules = [r for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role") for r in role["rules"]]
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in rules)
    if name == "namespaced":
        assert {r["metadata"]["namespace"] for r in by_kind(docs, "Role")} == {"team-a", "team-b"}
        assert "--namespace=team-a" in c["args"] and "--namespace=team-b" in c["args"]
        cluster_resources = {res for r in by_kind(docs, "ClusterRole")[0]["rules"] for res in r["resources"]}
        assert cluster_resources == {"customresourcedefinitions"}
    if name == "ha":
        assert dep["spec"]["replicas"] == 3 and any(a.startswith("--peering=") for a in c["args"])
        assert any("clusterkopfpeerings" in r["resources"] for r in rules)
        # (kopf waits for the peering object --peering names, and never makes it)
        named = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--peering="))
        assert [(p["kind"], p["metadata"]["name"]) for p in by_kind(docs, "ClusterKopfPeering")] == [
            ("ClusterKopfPeering", named)
        ]
    else:
        assert not any(a.startswith("--peering=") for a in c["args"])
        assert not by_kind(docs, "ClusterKopfPeering") and not by_kind(docs, "KopfPeering")
    if name == "monitoring":
        sm = by_kind(docs, "ServiceMonitor")[0]
        assert sm["metadata"]["labels"]["release"] == "prom"
        dash = json.loads(by_kind(docs, "ConfigMap")[0]["data"]["vllm-autoheal.json"])
        exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
        for metric in (
            "vllm_autoheal_incidents_total",
            "vllm_autoheal_heals_total",
            "vllm_autoheal_heal_latency_seconds_bucket",
            "vllm_autoheal_services",
        ):
            assert metric in exprs
    else:
        assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "ConfigMap")
    image = c["image"]
    if name == "custom-image":
        assert image == "registry.example.com/ml/vllm-autoheal:0.1.0-rc1"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    elif name == "digest":
        assert image == f"registry.example.com/ml/vllm-autoheal@{DIGEST}"
    else:
        assert image == "ghcr.io/vllm-autoheal/vllm-autoheal:0.1.0"
    assert f"--operator-image={image}" in c["args"]  # the launcher init container uses the same image
    policies = by_kind(docs, "ValidatingAdmissionPolicy")
    networks = by_kind(docs, "NetworkPolicy")
    if name == "locked-down":
        binding = by_kind(docs, "ValidatingAdmissionPolicyBinding")[0]
        assert binding["spec"]["policyName"] == policies[0]["metadata"]["name"]
        assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a"]
        ingress = networks[0]["spec"]["ingress"]
        assert networks[0]["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
        assert ingress[0]["ports"] == [{"port": "metrics", "protocol": "TCP"}] and len(ingress) == 1
    else:
        assert not policies and not networks
    secrets = any("secrets" in r["resources"] for r in rules)
    if name == "hub-mirror":  # no Hub tokens: no Secrets read
        assert "--hub-endpoint=https://hf-mirror.example.com" in c["args"] and "--no-hub-tokens" in c["args"]
        assert not secrets
    else:
        assert "--hub-endpoint=https://huggingface.co" in c["args"] and secrets


INVALID = [
    ({"replicas": "two"}, "/replicas"),
    ({"replicas": 0}, "/replicas"),
    ({"logFormat": "xml"}, "/logFormat"),
    ({"metrics": {"port": 70000}}, "/metrics/port"),
    ({"watchNamespaces": "default"}, "/watchNamespaces"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"repository": "x", "tag": "latest"}}, "/image/tag"),
    ({"colour": "blue"}, "colour"),
    ({"heal": {"enabled": "yes"}}, "/heal/enabled"),
    ({"image": {"repository": "x", "digest": "sha256:abc"}}, "/image/digest"),
    ({"admissionPolicy": {"maxGpus": -1}}, "/admissionPolicy/maxGpus"),
    ({"admissionPolicy": {"maxMemory": "lots"}}, "/admissionPolicy/maxMemory"),
    ({"admissionPolicy": {"allowedImagePrefixes": ["x' || true || '"]}}, "/admissionPolicy/allowedImagePrefixes/0"),
    # A prefix that ends mid-name admits other hosts and repositories: registry.example.com.evil.io/x
    (
        {"admissionPolicy": {"allowedImagePrefixes": ["registry.example.com"]}},
        "/admissionPolicy/allowedImagePrefixes/0",
    ),
    (
        {"admissionPolicy": {"allowedImagePrefixes": ["a/", "vllm/vllm-openai"]}},
        "/admissionPolicy/allowedImagePrefixes/1",
    ),
    ({"admissionPolicy": {"validationActions": ["Allow"]}}, "/admissionPolicy/validationActions/0"),
    ({"networkPolicy": {"enabled": "on"}}, "/networkPolicy/enabled"),
    ({"hub": {"endpoint": "ftp://mirror"}}, "/hub/endpoint"),
]


@pytest.mark.parametrize("values,field", INVALID, ids=[f for _, f in INVALID])
def test_invalid_values_are_rejected_naming_the_value(helm, tmp_path, values, field):
    vals = tmp_path / "bad.yaml"
    vals.write_text(yaml.safe_dump(values))
    proc = subprocess.run([helm, "template", "rel", str(CHART), "-f", str(vals)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert field in proc.stderr, proc.stderr


def test_network_policy_without_peers_admits_nothing(helm, tmp_path):
    docs = template(helm, tmp_path, {"networkPolicy": {"enabled": True}})
    policy = by_kind(docs, "NetworkPolicy")[0]["spec"]
    assert policy["policyTypes"] == ["Ingress"] and policy["ingress"] == []


# (VLLMService spec, the words of the policy's message that must deny it; None = admitted)
POLICY_CASES = [
    ({"engine": {"tensorParallelSize": 2}, "resources": {"limits": {"memory": "64Gi"}}}, None),
    (
        {
            "replicas": 4,
            "engine": {"tensorParallelSize": 2},
            "resources": {"limits": {"memory": "128Gi"}},
            "heal": {"bounds": {"maxMemoryLimit": "128Gi"}},
        },
        None,
    ),
    ({"image": "evil.example.com/miner:1", "resources": {"limits": {"memory": "64Gi"}}}, "spec.image"),
    (
        {"replicas": 3, "engine": {"tensorParallelSize": 4}, "resources": {"limits": {"memory": "64Gi"}}},
        "at most 8 GPUs",
    ),
    ({"resources": {"gpus": 16, "limits": {"memory": "64Gi"}}, "engine": {"tensorParallelSize": 16}}, "at most 8 GPUs"),
    (
        {
            "resources": {"limits": {"memory": "64Gi"}},
            "heal": {"allowedActions": ["IncreaseTensorParallel"], "bounds": {"maxTensorParallelSize": 16}},
        },
        "maxTensorParallelSize",
    ),
    ({"replicas": 2, "resources": {"limits": {"memory": "300Gi"}}}, "limits.memory x replicas"),
    ({}, "limits.memory must be set"),
    # (an object imported whole may set NVIDIA_VISIBLE_DEVICES, its keys unseen at admission: session 35c)
    ({"resources": {"limits": {"memory": "64Gi"}}, "envFrom": [{"configMapRef": {"name": "gpus"}}]}, "envFrom"),
    (
        {"resources": {"limits": {"memory": "64Gi"}}, "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "c"}}]},
        None,
    ),
    ({"resources": {"limits": {"memory": "64Gi"}}, "heal": {"bounds": {"maxMemoryLimit": "600Gi"}}}, "maxMemoryLimit"),
]


@pytest.mark.parametrize("spec,denial", POLICY_CASES)
def test_admission_policy_bounds_images_gpus_and_memory(helm, tmp_path, spec, denial):
    """The policy's CEL, evaluated as the API server would (cel-python, the object after the CRD's
    defaults), admits ordinary VLLMServices and denies each excess with its message."""
    from vllm_autoheal.validation import admit, evaluate

    docs = template(helm, tmp_path, VALUE_SETS["locked-down"])
    policy = by_kind(docs, "ValidatingAdmissionPolicy")[0]["spec"]
    obj, problems = admit(
        {
            "apiVersion": "vllm.autoheal.dev/v1alpha1",
            "kind": "VLLMService",
            "metadata": {"name": "x"},
            "spec": {"model": "org/m", **spec},
        }
    )
    assert problems == []
    variables: dict = {}
    for var in policy["variables"]:
        variables[var["name"]] = evaluate(var["expression"], {"object": obj, "variables": variables})
    denied = [
        v["message"]
        for v in policy["validations"]
        if not evaluate(v["expression"], {"object": obj, "variables": variables})
    ]
    if denial is None:
        assert denied == []
    else:
        assert len(denied) == 1 and denial in denied[0], denied


def test_chart_crd_is_the_generated_crd():
    assert (CHART / "crds" / "vllmservices.vllm.autoheal.dev.yaml").read_bytes() == (
        ROOT / "crds" / "vllmservices.vllm.autoheal.dev.yaml"
    ).read_bytes()


def test_chart_version_tied_to_the_package():
    from vllm_autoheal import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert re.search(rf'^version = "{re.escape(__version__)}"', (ROOT / "pyproject.toml").read_text(), re.M)


@pytest.mark.crdserver
def test_chart_crds_are_accepted_by_the_real_crd_server(crd_server):
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(config.new_client_from_config(str(crd_server.kubeconfig)))
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            try:
                ext.create_custom_resource_definition(doc)
            except ApiException as exc:
                assert exc.status == 409, exc.body  # already created by another test: fine
            assert ext.read_custom_resource_definition(doc["metadata"]["name"]).spec.group == doc["spec"]["group"]


def test_dockerfile_is_non_root_pinned_and_its_entrypoint_exists():
    text = (ROOT / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms and all(":" in f and not f.endswith(":latest") for f in froms)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    entry = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])", text, re.M).group(1))
    assert entry == ["vllm-autoheal"]
    assert 'vllm-autoheal = "vllm_autoheal.cli:main"' in (ROOT / "pyproject.toml").read_text()
    assert f"{LAUNCHER_DIR}" in text  # where the launcher init container copies the package from
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignore and ".venv" in ignore
