"""The generated CRD against the real Kubernetes CRD API server (apiextensions-apiserver + etcd)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vllm_autoheal import api

from samples import ACCEPTED_EXTRA_ARGS, QWEN25_VL_VISION

pytestmark = pytest.mark.crdserver
ROOT = Path(__file__).resolve().parents[1]
NS = "default"


@pytest.fixture(scope="module")
def k8s(crd_server):
    from kubernetes import client

    from crdserver.server import install_crd

    try:
        return client.CustomObjectsApi(install_crd(crd_server))
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _create(co, body):
    return co.create_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL, body)


SMALL_CONFIG = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}


def _vsvc(name: str, **spec) -> dict:
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct", **spec},
    }


def test_crd_is_accepted_and_established(k8s):
    assert k8s is not None


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_accepted(k8s, path):
    body = yaml.safe_load(path.read_text())
    body["metadata"]["name"] = "ex-" + path.stem.replace("_", "-")[:50]
    body["metadata"].pop("namespace", None)
    created = _create(k8s, body)
    assert created["spec"]["model"] == body["spec"]["model"]
    k8s.delete_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL, body["metadata"]["name"])


# One invalid resource per rule: (id, spec overrides, text the server's message must contain).
INVALID = [
    ("no-model", {"model": None}, "spec.model"),
    ("empty-model", {"model": ""}, "spec.model"),
    ("util-zero", {"engine": {"gpuMemoryUtilization": 0}}, "spec.engine.gpuMemoryUtilization"),
    ("util-above-one", {"engine": {"gpuMemoryUtilization": 1.2}}, "spec.engine.gpuMemoryUtilization"),
    ("max-model-len-zero", {"engine": {"maxModelLen": 0}}, "spec.engine.maxModelLen"),
    ("max-num-seqs-negative", {"engine": {"maxNumSeqs": -4}}, "spec.engine.maxNumSeqs"),
    ("tp-zero", {"engine": {"tensorParallelSize": 0}}, "spec.engine.tensorParallelSize"),
    ("bad-quantization", {"engine": {"quantization": "int3"}}, "spec.engine.quantization"),
    ("bad-kv-dtype", {"engine": {"kvCacheDtype": "fp4"}}, "spec.engine.kvCacheDtype"),
    ("bad-dtype", {"engine": {"dtype": "int8"}}, "spec.engine.dtype"),
    (
        "batched-below-seqs",
        {"engine": {"maxNumSeqs": 256, "maxNumBatchedTokens": 128}},
        "spec.engine.maxNumBatchedTokens",
    ),
    ("typed-flag-in-extra-args", {"engine": {"extraArgs": ["--max-model-len=4096"]}}, "spec.engine.extraArgs"),
    # every spelling vLLM accepts (engine.FLAGS and engine.RESERVED generate these rules)
    ("typed-flag-underscores", {"engine": {"extraArgs": ["--max_model_len=999999"]}}, "use engine.maxModelLen"),
    ("typed-flag-short-alias", {"engine": {"extraArgs": ["-tp", "8"]}}, "use engine.tensorParallelSize"),
    (
        "typed-flag-underscores-value",
        {"engine": {"extraArgs": ["--gpu_memory_utilization", "0.99"]}},
        "use engine.gpuMemoryUtilization",
    ),
    ("typed-flag-abbreviated", {"engine": {"extraArgs": ["--max-model", "4096"]}}, "use engine.maxModelLen"),
    ("typed-flag-negated", {"engine": {"extraArgs": ["--no-enforce-eager"]}}, "use engine.enforceEager"),
    ("quantization-alias", {"engine": {"extraArgs": ["-q", "awq"]}}, "use engine.quantization"),
    ("config-file", {"engine": {"extraArgs": ["--config", "/models/flags.yaml"]}}, "--config"),
    ("secret-hf-token", {"engine": {"extraArgs": ["--hf-token", "hf_x"]}}, "spec.hfTokenSecretRef"),
    (
        "secret-ref-path",
        {"hfTokenSecretRef": {"name": "../../kube-system/secrets/x", "key": "t"}},
        "spec.hfTokenSecretRef.name",
    ),
    ("secret-api-key", {"engine": {"extraArgs": ["--api_key=sk-1"]}}, "Secret"),
    ("reserved-port", {"engine": {"extraArgs": ["--port=9000"]}}, "set spec.port"),
    ("data-parallel", {"engine": {"extraArgs": ["-dp", "2"]}}, "spec.replicas"),
    ("prefill-context-parallel", {"engine": {"extraArgs": ["--prefill_context_parallel_size=2"]}}, "take more"),
    ("shm-unbounded", {"resources": {"shmSize": "1000Ei"}}, "spec.resources.shmSize"),
    (
        "cache-hides-launcher",
        {"modelCache": {"enabled": True, "size": "1Gi", "mountPath": "/autoheal"}},
        "spec.modelCache.mountPath",
    ),
    ("cache-hides-image", {"modelCache": {"mountPath": "/usr/lib/python3"}}, "spec.modelCache.mountPath"),
    ("cache-above-launcher", {"modelCache": {"mountPath": "/"}}, "spec.modelCache.mountPath"),
    ("cache-path-dotdot", {"modelCache": {"mountPath": "/models/../dev"}}, "spec.modelCache.mountPath"),
    ("gpus-not-tp-times-pp", {"engine": {"tensorParallelSize": 4}, "resources": {"gpus": 2}}, "spec.resources.gpus"),
    ("bad-memory-quantity", {"resources": {"limits": {"memory": "lots"}}}, "spec.resources.limits.memory"),
    (
        "request-above-limit",
        {"resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}},
        "spec.resources.requests.memory",
    ),
    ("bad-shm", {"resources": {"shmSize": "-1Gi"}}, "spec.resources.shmSize"),
    ("bad-heal-mode", {"heal": {"mode": "Yolo"}}, "spec.heal.mode"),
    ("bad-action", {"heal": {"allowedActions": ["DeleteNode"]}}, "spec.heal.allowedActions"),
    ("max-attempts-zero", {"heal": {"maxAttempts": 0}}, "spec.heal.maxAttempts"),
    (
        "util-bounds-inverted",
        {"heal": {"bounds": {"minGpuMemoryUtilization": 0.9, "maxGpuMemoryUtilization": 0.5}}},
        "spec.heal.bounds.minGpuMemoryUtilization",
    ),
    (
        "max-tp-below-tp",
        {"engine": {"tensorParallelSize": 4}, "heal": {"bounds": {"maxTensorParallelSize": 2}}},
        "spec.heal.bounds.maxTensorParallelSize",
    ),
    (
        "memory-bound-below-limit",
        {"resources": {"limits": {"memory": "64Gi"}}, "heal": {"bounds": {"maxMemoryLimit": "32Gi"}}},
        "spec.heal.bounds.maxMemoryLimit",
    ),
    ("quantize-without-model", {"heal": {"quantizedFallback": {"allowed": True}}}, "spec.heal.quantizedFallback.model"),
    (  # (fp8 fixes its width: a declared one could only contradict it)
        "bits-for-a-fixed-width-method",
        {"heal": {"quantizedFallback": {"allowed": True, "model": "m-fp8", "method": "fp8", "bits": 4}}},
        "spec.heal.quantizedFallback.bits",
    ),
    (  # (a GGUF file mixes widths: one figure would mislead the weighing)
        "bits-for-gguf",
        {"heal": {"quantizedFallback": {"allowed": True, "model": "m.gguf", "method": "gguf", "bits": 4}}},
        "spec.heal.quantizedFallback.bits",
    ),
    ("bits-without-method", {"heal": {"quantizedFallback": {"bits": 4}}}, "spec.heal.quantizedFallback.bits"),
    (
        "bits-above-8",
        {"heal": {"quantizedFallback": {"allowed": True, "model": "m-awq", "method": "awq", "bits": 16}}},
        "spec.heal.quantizedFallback.bits",
    ),
    (
        "float-weights-of-an-integer-method",
        {
            "heal": {
                "quantizedFallback": {
                    "allowed": True,
                    "model": "m",
                    "method": "gptq_marlin",
                    "bits": 4,
                    "weightType": "float",
                }
            }
        },
        "spec.heal.quantizedFallback.weightType",
    ),
    (
        "float-weights-without-bits",
        {
            "heal": {
                "quantizedFallback": {
                    "allowed": True,
                    "model": "m",
                    "method": "compressed-tensors",
                    "weightType": "float",
                }
            }
        },
        "spec.heal.quantizedFallback.weightType",
    ),
    ("tp-action-without-bound", {"heal": {"allowedActions": ["IncreaseTensorParallel"]}}, "spec.heal.allowedActions"),
    ("bad-preflight", {"preflight": "Maybe"}, "spec.preflight"),
    (
        "cache-claim-and-size",
        {"modelCache": {"enabled": True, "claimName": "models", "size": "100Gi"}},
        "spec.modelCache.claimName",
    ),
    (
        "env-value-and-from",
        {"env": [{"name": "HF_TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]},
        "spec.env[0].valueFrom",
    ),
    # The Deployment is written by server-side apply, which refuses an env list with a name twice
    # (the server answers 500, retried forever): the pod's env names must be unique, and not the
    # launcher's PYTHONPATH nor the HF_TOKEN that hfTokenSecretRef sets.
    (
        "env-name-twice",
        {"env": [{"name": "MODE", "value": "a"}, {"name": "MODE", "value": "b"}]},
        "spec.env",
    ),
    ("env-launcher-path", {"env": [{"name": "PYTHONPATH", "value": "/opt/mine"}]}, "spec.env"),
    (
        "env-token-twice",
        {"hfTokenSecretRef": {"name": "hf", "key": "token"}, "env": [{"name": "HF_TOKEN", "value": "x"}]},
        "spec.env",
    ),
    ("replicas-negative", {"replicas": -1}, "spec.replicas"),
    ("image-with-space", {"image": "vllm/vllm-openai latest"}, "spec.image"),
    ("port-out-of-range", {"port": 70000}, "spec.port"),
    (
        "config-layers-1e12",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "num_hidden_layers": 1e12}}},
        "spec.modelConfig.inline.num_hidden_layers",
    ),
    (
        "config-negative-hidden",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "hidden_size": -4096}}},
        "spec.modelConfig.inline.hidden_size",
    ),
    (
        "config-string-vocab",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "vocab_size": "lots"}}},
        "spec.modelConfig.inline.vocab_size",
    ),
    (
        "config-kv-above-heads",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "num_key_value_heads": 64}}},
        "spec.modelConfig.inline.num_key_value_heads",
    ),
    (
        "config-missing-layers",
        {"modelConfig": {"inline": {k: v for k, v in SMALL_CONFIG.items() if k != "num_hidden_layers"}}},
        "spec.modelConfig.inline.num_hidden_layers",
    ),
    (
        "config-vision-depth-huge",
        {"modelConfig": {"inline": {**SMALL_CONFIG, "vision_config": {"depth": 10**6, "hidden_size": 1280}}}},
        "spec.modelConfig.inline.vision_config.depth",
    ),
    (
        "config-inline-and-ref",
        {"modelConfig": {"inline": SMALL_CONFIG, "configMapRef": {"name": "cfg"}}},
        "spec.modelConfig.inline",
    ),
    (
        "config-bad-configmap-name",
        {"modelConfig": {"configMapRef": {"name": "Not_A_Name"}}},
        "spec.modelConfig.configMapRef.name",
    ),
    # what the pod template carries, bounded as Kubernetes bounds it there (refused here, not at the Deployment)
    (
        "toleration-value-too-long",
        {"resources": {"tolerations": [{"key": "team", "operator": "Equal", "value": "v" * 64}]}},
        "spec.resources.tolerations[0].value",
    ),
    (
        "node-selector-value-too-long",
        {"resources": {"nodeSelector": {"pool": "p" * 64}}},
        "spec.resources.nodeSelector",
    ),
    (
        "node-selector-too-many",
        {"resources": {"nodeSelector": {f"k{i}": "v" for i in range(65)}}},
        "spec.resources.nodeSelector",
    ),
    (
        "storage-class-not-a-name",
        {"modelCache": {"size": "100Gi", "storageClassName": "Fast SSD"}},
        "spec.modelCache.storageClassName",
    ),
    ("env-value-too-long", {"env": [{"name": "BIG", "value": "x" * 32769}]}, "spec.env[0].value"),
]


@pytest.mark.parametrize("case_id,overrides,field", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_resource_is_rejected_naming_the_field(k8s, case_id, overrides, field):
    from kubernetes.client.rest import ApiException

    body = _vsvc("bad-" + case_id, **overrides)
    if overrides.get("model", "x") is None:
        del body["spec"]["model"]
    with pytest.raises(ApiException) as info:
        _create(k8s, body)
    assert info.value.status == 422, info.value.body
    message = json.loads(info.value.body)["message"]
    assert field in message, message


@pytest.mark.parametrize("name", ["llama.v2", "8b", "x" * 64])
def test_a_name_no_service_or_label_can_take_is_rejected(k8s, name):
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as info:
        _create(k8s, _vsvc(name))
    assert info.value.status == 422 and "DNS-1035" in json.loads(info.value.body)["message"], info.value.body


def test_other_flags_in_every_spelling_are_accepted(k8s):
    extra = ACCEPTED_EXTRA_ARGS
    created = _create(k8s, _vsvc("good-extra-args", engine={"extraArgs": extra}))
    assert created["spec"]["engine"]["extraArgs"] == extra


def test_inline_model_config_is_kept_as_config_json_spells_it(k8s):
    config = json.loads((Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json").read_text())
    created = _create(k8s, _vsvc("inline-config", modelConfig={"inline": config}))
    inline = created["spec"]["modelConfig"]["inline"]
    assert inline["num_key_value_heads"] == 8 and inline["torch_dtype"] == "bfloat16"
    assert "rope_scaling" not in inline  # fields the memory model does not read are pruned
    assert api.VLLMServiceSpec.model_validate(created["spec"]).model_config_source.inline.num_hidden_layers == 32


def test_invalid_cases_are_distinct():
    assert len({c[0] for c in INVALID}) == len(INVALID) >= 20


def test_defaults_are_applied(k8s):
    created = _create(k8s, _vsvc("defaults"))
    spec = created["spec"]
    assert spec["engine"]["gpuMemoryUtilization"] == 0.9
    assert spec["engine"]["tensorParallelSize"] == 1
    assert spec["heal"]["mode"] == "PatchSpec"
    assert spec["heal"]["maxAttempts"] == 5
    assert spec["heal"]["bounds"]["minMaxModelLen"] == 2048
    assert spec["resources"]["shmSize"] == "8Gi"
    assert spec["preflight"] == "Warn"
    assert spec["image"] == api.DEFAULT_IMAGE
    # The server's defaults are the models' defaults: parsing it back changes nothing.
    assert api.VLLMServiceSpec.model_validate(spec).wire() == spec


def test_unknown_fields_are_pruned(k8s):
    body = _vsvc("pruned", engine={"maxModelLen": 4096, "madeUpFlag": 3}, colour="blue")
    created = _create(k8s, body)
    assert "colour" not in created["spec"]
    assert "madeUpFlag" not in created["spec"]["engine"]
    assert created["spec"]["engine"]["maxModelLen"] == 4096


def test_status_changes_only_through_the_subresource(k8s):
    _create(k8s, _vsvc("statusonly"))
    patched = k8s.patch_namespaced_custom_object(
        api.GROUP, api.VERSION, NS, api.PLURAL, "statusonly", {"status": {"phase": "Running"}}
    )
    assert "status" not in patched or patched["status"].get("phase") != "Running"
    patched = k8s.patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, NS, api.PLURAL, "statusonly", {"status": {"phase": "Running"}}
    )
    assert patched["status"]["phase"] == "Running"


def test_operator_status_round_trips_unpruned(k8s):
    created = _create(k8s, _vsvc("roundtrip", engine={"maxModelLen": 131072}))
    engine = api.EngineArgs.model_validate(created["spec"]["engine"])
    healed = engine.model_copy(update={"max_model_len": 32464})
    status = api.VLLMServiceStatus(
        phase="Healing",
        observed_generation=created["metadata"]["generation"],
        conditions=[
            api.Condition(
                type="Healing",
                status="True",
                reason="KvCacheInsufficient",
                message="max_model_len 131072 -> 32464",
                last_transition_time="2026-11-30T03:00:00Z",
                observed_generation=1,
            )
        ],
        baseline=engine,
        effective=healed,
        attempts=1,
        heal_count=1,
        last_cause="kv_cache_insufficient",
        observed_crashes=["uid-1/vllm/0"],
        gpus=1,
        endpoint="http://roundtrip.default.svc:8000/v1",
        heals=[
            api.HealRecord(
                time="2026-11-30T03:00:00Z",
                pod="roundtrip-abc",
                pod_uid="uid-1",
                restart_count=0,
                cause="kv_cache_insufficient",
                phase="kv-allocation",
                evidence=["ValueError: To serve at least one request ..."],
                action="LowerMaxModelLen",
                reason="vLLM estimated 32464 fits",
                changes=[api.FieldChange(field="maxModelLen", before="131072", after="32464")],
            )
        ],
        kopf={"progress": {"reconcile": {"started": "x"}}},
    )
    body = {"status": status.wire()}
    got = k8s.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, NS, api.PLURAL, "roundtrip", body)
    assert got["status"] == status.wire()
    # and the spec patch a heal makes in PatchSpec mode is accepted as is
    got = k8s.patch_namespaced_custom_object(
        api.GROUP, api.VERSION, NS, api.PLURAL, "roundtrip", {"spec": {"engine": {"maxModelLen": 32464}}}
    )
    assert got["spec"]["engine"]["maxModelLen"] == 32464
    assert got["metadata"]["generation"] == created["metadata"]["generation"] + 1


def test_a_heals_spec_patch_removes_a_flag_its_target_leaves_unset(k8s):
    """PatchSpec replaces the engine whole: a revert to flags without max_model_len (the flags
    before a tensor-parallel heal that also set one) must leave none, where a plain merge patch
    of the target's flags kept the heal's 8192 in the spec."""
    from vllm_autoheal.api import Deployed, EngineArgs, VLLMService
    from vllm_autoheal.kube.heal_apply import in_spec, spec_patch

    engine = {"gpuMemoryUtilization": 0.9, "tensorParallelSize": 2, "maxModelLen": 8192}
    created = _create(k8s, _vsvc("revert-patch", engine=engine, resources={"gpus": 2}))
    obj = VLLMService.model_validate(created)
    target = Deployed(
        engine=EngineArgs(gpu_memory_utilization=0.9, tensor_parallel_size=1), model=obj.spec.model, memory_limit=None
    )
    body = spec_patch(obj, target, created["spec"]["engine"])
    got = k8s.patch_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL, "revert-patch", body)
    assert "maxModelLen" not in got["spec"]["engine"], got["spec"]["engine"]
    assert got["spec"]["engine"]["tensorParallelSize"] == 1 and got["spec"]["resources"]["gpus"] == 1
    assert in_spec(VLLMService.model_validate(got)).engine.max_model_len is None


def test_an_inline_multimodal_config_keeps_its_vision_encoder(k8s):
    """A pasted Qwen2.5-VL config.json: the server keeps vision_config's sizing fields (in each spelling),
    and the operator weighs the encoder as from the file (0.68 B parameters)."""
    from vllm_autoheal.model_config import check
    from vllm_autoheal.shape_reader import shape_from_config

    vision = {**QWEN25_VL_VISION, "window_size": 112}
    created = _create(k8s, _vsvc("vl-inline", modelConfig={"inline": {**SMALL_CONFIG, "vision_config": vision}}))
    kept = created["spec"]["modelConfig"]["inline"]["vision_config"]
    assert kept == {k: v for k, v in vision.items() if k != "window_size"}  # (what sizes nothing is pruned)
    params = shape_from_config(check(created["spec"]["modelConfig"]["inline"])).vision_params
    assert abs(params - 0.675e9) / 0.675e9 < 0.03
