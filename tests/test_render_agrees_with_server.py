"""`vllm-autoheal render` is a dry run of the API server: the same VLLMServices go through
render and through the real CRD API server (a server-side dry run), and both accept or both
reject, naming the same field; what both accept, they store with the same defaults."""

from __future__ import annotations

import json

import pytest
import yaml

from vllm_autoheal import api
from vllm_autoheal.cli import main

from samples import ACCEPTED_EXTRA_ARGS

pytestmark = pytest.mark.crdserver
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SMALL_CONFIG = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}

# (id, spec without the model, None when valid / the field both must name when invalid)
CASES = [
    ("minimal", {}, None),
    (
        "typed-engine",
        {
            "engine": {
                "maxModelLen": 32768,
                "gpuMemoryUtilization": 1,
                "maxNumSeqs": 64,
                "maxNumBatchedTokens": 8192,
                "enforceEager": True,
            }
        },
        None,
    ),
    (
        "tp2-pp2-four-gpus",
        {"engine": {"tensorParallelSize": 2, "pipelineParallelSize": 2}, "resources": {"gpus": 4}},
        None,
    ),
    (
        "other-flags",
        {"engine": {"extraArgs": ACCEPTED_EXTRA_ARGS}},
        None,
    ),
    (
        "placement",
        {
            "resources": {
                "gpuProduct": "NVIDIA-L4",
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
                "limits": {"memory": "32Gi"},
                "requests": {"memory": "16Gi"},
                "shmSize": "64Gi",
            }
        },
        None,
    ),
    (
        "cache-and-env",
        {
            "modelCache": {"enabled": True, "size": "100Gi", "mountPath": "/models/.cache"},
            "env": [{"name": "GREETING", "value": "$(HOME)"}],
            "runAsNonRoot": True,
        },
        None,
    ),
    ("tp-heal", {"heal": {"allowedActions": ["IncreaseTensorParallel"], "bounds": {"maxTensorParallelSize": 4}}}, None),
    ("underscored-typed-flag", {"engine": {"extraArgs": ["--max_model_len=999999"]}}, "spec.engine.extraArgs"),
    ("short-alias", {"engine": {"extraArgs": ["-tp", "8"]}}, "spec.engine.extraArgs"),
    (
        "underscored-utilization",
        {"engine": {"extraArgs": ["--gpu_memory_utilization", "0.99"]}},
        "spec.engine.extraArgs",
    ),
    ("abbreviation", {"engine": {"extraArgs": ["--max-num-seq=4"]}}, "spec.engine.extraArgs"),
    ("config-file", {"engine": {"extraArgs": ["--config", "/etc/vllm.yaml"]}}, "spec.engine.extraArgs"),
    ("hf-token", {"engine": {"extraArgs": ["--hf-token", "hf_x"]}}, "spec.engine.extraArgs"),
    ("served-model-name", {"engine": {"extraArgs": ["--served_model_name", "x"]}}, "spec.engine.extraArgs"),
    ("tp-times-pp", {"engine": {"tensorParallelSize": 2}, "resources": {"gpus": 3}}, "spec.resources.gpus"),
    ("shm-unbounded", {"resources": {"shmSize": "1000Ei"}}, "spec.resources.shmSize"),
    ("shm-not-a-quantity", {"resources": {"shmSize": "lots"}}, "spec.resources.shmSize"),
    ("cache-at-launcher", {"modelCache": {"mountPath": "/autoheal"}}, "spec.modelCache.mountPath"),
    ("cache-dotdot", {"modelCache": {"mountPath": "/models/../usr"}}, "spec.modelCache.mountPath"),
    ("utilization-above-one", {"engine": {"gpuMemoryUtilization": 3}}, "spec.engine.gpuMemoryUtilization"),
    ("utilization-zero", {"engine": {"gpuMemoryUtilization": 0}}, "spec.engine.gpuMemoryUtilization"),
    ("replicas-as-text", {"replicas": "2"}, "spec.replicas"),
    (
        "request-above-limit",
        {"resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}},
        "spec.resources.requests.memory",
    ),
    (
        "batched-below-seqs",
        {"engine": {"maxNumSeqs": 256, "maxNumBatchedTokens": 128}},
        "spec.engine.maxNumBatchedTokens",
    ),
    ("fallback-without-model", {"heal": {"quantizedFallback": {"allowed": True}}}, "spec.heal.quantizedFallback.model"),
    ("duplicate-actions", {"heal": {"allowedActions": ["EnforceEager", "EnforceEager"]}}, "spec.heal.allowedActions"),
    ("tp-action-without-bound", {"heal": {"allowedActions": ["IncreaseTensorParallel"]}}, "spec.heal.allowedActions"),
    ("too-many-extra-args", {"engine": {"extraArgs": ["--seed=1"] * 65}}, "spec.engine.extraArgs"),
    ("extra-arg-too-long", {"engine": {"extraArgs": ["--chat-template=" + "x" * 600]}}, "spec.engine.extraArgs"),
    ("bad-enum", {"heal": {"mode": "Yolo"}}, "spec.heal.mode"),
    (
        "model-config-inline",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "num_key_value_heads": 8, "torch_dtype": "bfloat16"}}},
        None,
    ),
    ("model-config-map", {"modelConfig": {"configMapRef": {"name": "llama.config"}, "revision": "v1.0"}}, None),
    (
        "model-config-layers-1e12",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "num_hidden_layers": 1e12}}},
        "spec.modelConfig.inline.num_hidden_layers",
    ),
    (
        "model-config-kv-above-heads",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "num_key_value_heads": 64}}},
        "spec.modelConfig.inline.num_key_value_heads",
    ),
    (
        "model-config-both",
        {"modelConfig": {"inline": SMALL_CONFIG, "configMapRef": {"name": "c"}}},
        "spec.modelConfig.inline",
    ),
]


@pytest.fixture(scope="module")
def k8s(crd_server):
    from kubernetes import client

    from crdserver.server import install_crd

    return client.CustomObjectsApi(install_crd(crd_server))


def _body(case_id: str, spec: dict) -> dict:
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "metadata": {"name": f"agree-{case_id}", "namespace": "default"},
        "spec": {"model": MODEL, **spec},
    }


def _render(tmp_path, body: dict, capsys) -> tuple[int, str, list[dict]]:
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump(body))
    code = main(["render", "-f", str(path)])
    out = capsys.readouterr()
    return code, out.err, [d for d in yaml.safe_load_all(out.out) if d] if code == 0 else []


def _server(k8s, body: dict) -> tuple[bool, str, dict]:
    from kubernetes.client.rest import ApiException

    try:
        stored = k8s.create_namespaced_custom_object(api.GROUP, api.VERSION, "default", api.PLURAL, body, dry_run="All")
        return True, "", stored
    except ApiException as exc:
        assert exc.status == 422, exc.body
        return False, json.loads(exc.body)["message"], {}


@pytest.mark.parametrize("case_id,spec,field", CASES, ids=[c[0] for c in CASES])
def test_render_and_the_server_agree(k8s, tmp_path, capsys, case_id, spec, field):
    body = _body(case_id, spec)
    code, err, manifests = _render(tmp_path, body, capsys)
    accepted, message, stored = _server(k8s, body)
    assert (code == 0) == accepted, f"render exit {code}: {err}\nserver: {message or 'accepted'}"
    if field is None:
        from vllm_autoheal.validation import admit

        assert admit(body)[0]["spec"] == stored["spec"]  # the same defaults as the server's
        assert [m["kind"] for m in manifests][-2:] == ["Deployment", "Service"]
    else:
        assert code == 2 and field in err and "Traceback" not in err, err
        assert field in message, message


def test_enough_cases_of_each_kind():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)
    assert sum(c[2] is None for c in CASES) >= 5 and sum(c[2] is not None for c in CASES) >= 15


def test_render_and_the_server_refuse_a_name_no_service_can_take(k8s, tmp_path, capsys):
    body = {**_body("minimal", {}), "metadata": {"name": "llama.v2"}}
    code, err, _ = _render(tmp_path, body, capsys)
    accepted, message, _ = _server(k8s, body)
    assert not accepted and "metadata.name" in message, message
    assert code == 2 and "metadata.name" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "metadata", [{}, {"name": ""}, {"name": ["x"]}, 5], ids=["none", "empty", "a-list", "not-an-object"]
)
def test_render_and_the_server_refuse_what_has_no_name(k8s, tmp_path, capsys, metadata):
    from kubernetes.client.rest import ApiException

    body = {**_body("minimal", {}), "metadata": metadata}
    code, err, _ = _render(tmp_path, body, capsys)
    assert code == 2 and "metadata" in err and "Traceback" not in err, err
    with pytest.raises(ApiException) as refused:  # 422 for a missing name; 400 for one that is not a string
        k8s.create_namespaced_custom_object(api.GROUP, api.VERSION, "default", api.PLURAL, body, dry_run="All")
    assert refused.value.status in (400, 422)
