"""Review of the Helm chart (session 35c): defects a production GPU cluster shared by many teams would hit.

Each test was a strict xfail stating what is right; all five are fixed: cluster-scoped names carry the release's
namespace, the admission policy requires an envFrom prefix (admissionPolicy.requireEnvFromPrefix, on by default),
kopfpeerings are granted only in namespaced mode, and the chart refuses Warn with Deny and a health port that is
the metrics port."""

from __future__ import annotations

import subprocess

import yaml

from test_chart import CHART, VALUE_SETS, by_kind, template

CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ClusterKopfPeering",
}


def render_in(helm: str, tmp_path, namespace: str, values: dict) -> list[dict]:
    vals = tmp_path / f"{namespace}.yaml"
    vals.write_text(yaml.safe_dump(values))
    out = subprocess.run(
        [helm, "template", "rel", str(CHART), "--namespace", namespace, "-f", str(vals)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_two_teams_same_release_name_do_not_collide(helm, tmp_path):
    """Severity: medium. Input: release "rel" installed by team A in namespace team-a
    (watchNamespaces=[team-a], admissionPolicy.enabled) and by team B in namespace team-b
    (watchNamespaces=[team-b], same options). Now: both render ClusterRole/ClusterRoleBinding
    rel-vllm-autoheal-cluster and ValidatingAdmissionPolicy(+Binding) rel-vllm-autoheal-limits, so the
    second `helm install` fails (object exists, owned by another release namespace). Right: the names of
    cluster-scoped objects include the release namespace (or the chart can name them), so they differ."""
    names = []
    for ns in ("team-a", "team-b"):
        docs = render_in(helm, tmp_path, ns, {"watchNamespaces": [ns], "admissionPolicy": {"enabled": True}})
        names.append({(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in CLUSTER_SCOPED})
    assert names[0] and names[0].isdisjoint(names[1]), sorted(names[0] & names[1])


def test_admission_policy_denies_unprefixed_env_from(helm, tmp_path):
    """Severity: high. Input: the locked-down values (admissionPolicy.enabled, maxGpus 8); a tenant's
    VLLMService with resources.gpus 1 and envFrom [{configMapRef: {name: gpus}}], no prefix, where the
    tenant's ConfigMap "gpus" holds NVIDIA_VISIBLE_DEVICES=all. The CRD forbids that variable in env and
    as an envFrom prefix, but not an unprefixed envFrom, and the policy never looks at envFrom: it is
    admitted. The container's env then overrides the device plugin's NVIDIA_VISIBLE_DEVICES, and under
    the NVIDIA runtime's default (envvar strategy) the pod sees every GPU on the node, other teams' too.
    Right: the policy (which cannot see the ConfigMap's keys) denies envFrom entries without a prefix,
    or the operator refuses to deploy one whose source names a device-plugin variable."""
    # (denied, and a prefixed one admitted, under the locked-down values: test_chart.py's POLICY_CASES)
    denying = template(helm, tmp_path, VALUE_SETS["locked-down"])
    assert "envFrom" in str(by_kind(denying, "ValidatingAdmissionPolicy")[0]["spec"]["validations"])
    # (an administrator whose nodes take GPUs by volume mounts may turn it off)
    relaxed = template(
        helm,
        tmp_path,
        {
            **VALUE_SETS["locked-down"],
            "admissionPolicy": {**VALUE_SETS["locked-down"]["admissionPolicy"], "requireEnvFromPrefix": False},
        },
    )
    assert "envFrom" not in str(by_kind(relaxed, "ValidatingAdmissionPolicy")[0]["spec"]["validations"])


def test_cluster_mode_ha_grants_no_namespaced_peerings(helm, tmp_path):
    """Severity: low (RBAC broader than needed). Input: replicas=2, watchNamespaces empty. Now: the
    ClusterRole grants both clusterkopfpeerings and kopfpeerings get/list/watch/patch cluster-wide, but
    kopf in clusterwide mode selects only clusterkopfpeerings (kopf peering.guess_selectors). The patch
    on kopfpeerings everywhere lets this service account write a high-priority peer into any other
    team's kopf operator's KopfPeering and pause it. Right: kopfpeerings only in namespaced mode
    (the Roles), clusterkopfpeerings only in cluster mode."""
    docs = template(helm, tmp_path, {"replicas": 2})
    granted = {
        r
        for role in by_kind(docs, "ClusterRole")
        for rule in role["rules"]
        if "kopf.dev" in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert granted == {"clusterkopfpeerings"}, granted


def _template_rc(helm: str, tmp_path, values: dict) -> subprocess.CompletedProcess:
    vals = tmp_path / "v.yaml"
    vals.write_text(yaml.safe_dump(values))
    return subprocess.run([helm, "template", "rel", str(CHART), "-f", str(vals)], capture_output=True, text=True)


def test_warn_with_deny_is_rejected_by_the_chart(helm, tmp_path):
    """Severity: low (broken install). Input: admissionPolicy.enabled=true,
    admissionPolicy.validationActions=[Warn, Deny]. Now: renders a ValidatingAdmissionPolicyBinding with
    validationActions ["Warn","Deny"], which the API server refuses ("Deny and Warn may not be used
    together"), failing the whole install midway. Right: the values schema (or a template `fail`) rejects
    the combination at `helm template`/`install` time, naming /admissionPolicy/validationActions."""
    proc = _template_rc(helm, tmp_path, {"admissionPolicy": {"enabled": True, "validationActions": ["Warn", "Deny"]}})
    assert proc.returncode != 0 and "validationActions" in proc.stderr


def test_health_port_equal_to_metrics_port_is_rejected(helm, tmp_path):
    """Severity: low (broken install). Input: healthPort=8080 (metrics.port default 8080). Now: renders
    --metrics-port=8080 --health-port=8080 and two containerPorts 8080; the metrics server binds first
    and kopf's liveness endpoint cannot bind, so the pod never becomes live. Right: the chart fails
    rendering, naming healthPort."""
    proc = _template_rc(helm, tmp_path, {"healthPort": 8080})
    assert proc.returncode != 0 and "healthPort" in proc.stderr
