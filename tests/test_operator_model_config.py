"""Pre-flight in the operator from a resolved model config: the Hub (a local one on 127.0.0.1,
through the real huggingface_hub client), a ConfigMap, a token from a Secret; and hostile
configs that cost their own VLLMService a condition and nobody else anything."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import time
from pathlib import Path

import pytest

from vllm_autoheal import model_source
from vllm_autoheal.kube.client import MERGE
from vllm_autoheal.model_source import HubSettings

from hub_server import GATED_TOKEN, hub  # noqa: F401 - the fixture
from operator_harness import (
    HARNESS_AGENT,
    NS,
    Cluster,
    Emulator,
    flag,
    operator_writes,
    running_operator,
    setup_emulator,
    wait_for,
)

pytestmark = pytest.mark.kmock(cls=Emulator)
VSVC_PATH = f"/apis/vllm.autoheal.dev/v1alpha1/namespaces/{NS}/vllmservices"
SMALL = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}


@pytest.fixture
async def cluster(kmock, hub):  # noqa: F811
    setup_emulator(kmock)
    model_source.configure(HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=5))  # as --hub-endpoint
    async with running_operator():
        yield Cluster(kmock)
    model_source.configure(HubSettings())


async def config_map(cluster: Cluster, name: str, config_json: str) -> None:
    """A ConfigMap in the test namespace holding a config.json under its default key."""
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}}
    await cluster.call("POST", f"/api/v1/namespaces/{NS}/configmaps", {**body, "data": {"config.json": config_json}})


def memory_fit(obj: dict | None) -> dict | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == "MemoryFit"), None)


async def wait_fit(cluster: Cluster, name: str) -> dict:
    return await wait_for(lambda: memory_fit(cluster.vsvc_now(name)), what=f"MemoryFit of {name}")


async def test_only_model_and_gpu_gets_memory_fit_from_the_hub(cluster, hub):  # noqa: F811
    await cluster.create_vsvc(
        "plain", {"model": "meta-llama/Llama-3.1-8B-Instruct", "resources": {"gpuProduct": "NVIDIA-L4"}}
    )
    fit = await wait_fit(cluster, "plain")
    # Llama-3.1-8B's own context (131,072, from its config.json) does not fit an L4's KV cache
    assert fit["status"] == "False" and fit["reason"] == "KvCacheInsufficient", fit
    assert "< max_model_len 131,072" in fit["message"]
    assert ("GET", "/meta-llama/Llama-3.1-8B-Instruct/resolve/main/config.json", False) in hub.requests


async def test_fix_mode_the_first_deployment_already_fits(cluster):
    await cluster.create_vsvc(
        "fix",
        {"model": "meta-llama/Llama-3.1-8B-Instruct", "preflight": "Fix", "resources": {"gpuProduct": "NVIDIA-L4"}},
    )
    fit = await wait_fit(cluster, "fix")
    assert fit["status"] == "True" and fit["reason"] == "FittedByPreflight", fit
    dep = await wait_for(lambda: cluster.deployment_now("fix"), what="deployment")
    fitted = int(flag(dep, "--max-model-len"))
    assert 16384 < fitted < 131072  # an L4 holds ~35k tokens of Llama-8B KV at utilization 0.9
    await asyncio.sleep(1)
    # written once, so the first pods already ran the fitted flags
    assert [w for w in operator_writes(cluster.kmock, "fix") if "/deployments/" in w[1]] == [
        ("PATCH", "/apis/apps/v1/namespaces/default/deployments/fix")
    ]
    obj = await cluster.vsvc("fix")
    assert "maxModelLen" not in obj["spec"].get("engine", {})  # the spec stays as written


async def test_gated_model_uses_the_token_from_hf_token_secret_ref(cluster, hub):  # noqa: F811
    token = base64.b64encode(GATED_TOKEN.encode()).decode()
    await cluster.call(
        "POST",
        f"/api/v1/namespaces/{NS}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": NS}, "data": {"token": token}},
    )
    spec = {"model": "meta-llama/Llama-3.1-70B-Instruct", "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"}}
    await cluster.create_vsvc("gated", {**spec, "hfTokenSecretRef": {"name": "hf", "key": "token"}})
    await cluster.create_vsvc("no-token", spec)
    fit = await wait_fit(cluster, "gated")
    assert fit["status"] == "False" and fit["reason"] == "WeightsLoadOom" and "weights need" in fit["message"]
    refused = await wait_fit(cluster, "no-token")
    assert refused["status"] == "Unknown" and refused["reason"] == "ModelConfigUnavailable"
    assert "is gated: accept its terms" in refused["message"] and GATED_TOKEN not in json.dumps(refused)


async def test_config_map_ref(cluster, hub):  # noqa: F811
    from hub_server import CONFIGS

    await config_map(cluster, "qwen", (CONFIGS / "qwen2.5-32b.json").read_text())
    await cluster.create_vsvc(
        "cm",
        {
            "model": "/models/qwen-32b",
            "modelConfig": {"configMapRef": {"name": "qwen"}},
            "engine": {"maxModelLen": 8192},
            "resources": {"gpuProduct": "NVIDIA-H200"},
        },
    )
    fit = await wait_fit(cluster, "cm")
    assert fit["status"] == "True" and fit["reason"] == "Fits", fit
    await cluster.create_vsvc(
        "cm-missing",
        {
            "model": "x/y",
            "modelConfig": {"configMapRef": {"name": "absent"}},
            "resources": {"gpuProduct": "NVIDIA-H200"},
        },
    )
    missing = await wait_fit(cluster, "cm-missing")
    assert (
        missing["status"] == "Unknown"
        and "ConfigMap default/absent key config.json: no such ConfigMap" in missing["message"]
    )
    assert not [r for r in hub.requests if "x/y" in r[1]]  # a ConfigMap named: the Hub is not asked


BIG = {"hidden_size": 8192, "num_attention_heads": 64, "vocab_size": 128256}
HOSTILE = {  # each: the config text, and what its MemoryFit must name. Every one held a handler
    # thread forever before the layer count was bounded (the operator has 8).
    "layers-1e12": (json.dumps({**BIG, "num_hidden_layers": 1e12}), "num_hidden_layers is 1e+12"),
    "layers-int": (json.dumps({**BIG, "num_hidden_layers": 10**12}), "num_hidden_layers is 1000000000000"),
    "tied": (json.dumps({**BIG, "num_hidden_layers": 2e12, "tie_word_embeddings": True}), "num_hidden_layers is 2e+12"),
    "text-config": (json.dumps({"text_config": {**BIG, "num_hidden_layers": 1e11}}), "num_hidden_layers is 1e+11"),
    "old-spelling": (
        json.dumps({"n_layer": 1e12, "n_embd": 4096, "n_head": 32, "vocab_size": 50257}),
        "n_layer is 1e+12",
    ),
    "moe": (
        json.dumps({**BIG, "num_hidden_layers": 10**10, "num_local_experts": 8, "num_experts_per_tok": 2}),
        "num_hidden_layers is 10000000000",
    ),
    "pipeline": (
        json.dumps({**BIG, "num_hidden_layers": 4e11, "max_position_embeddings": 8192}),
        "num_hidden_layers is 4e+11",
    ),
    "also-negative": (json.dumps({**BIG, "num_hidden_layers": 1e12, "head_dim": -128}), "num_hidden_layers is 1e+12"),
    "configmap": (json.dumps({**BIG, "num_hidden_layers": 1e12}), "num_hidden_layers is 1e+12"),
}


async def test_hostile_configs_do_not_delay_an_ordinary_service(cluster):
    """Nine VLLMServices with hostile configs (eight through the deprecated annotation, one through a
    ConfigMap) and a tenth, ordinary one: it gets its Deployment; each hostile one gets its own
    Deployment too, and MemoryFit=Unknown naming the field. (Other shapes of hostile config:
    test_model_config.py.)"""
    names = list(HOSTILE)
    base = {"model": "acme/hostile-model", "preflight": "Fix", "resources": {"gpuProduct": "NVIDIA-H200"}}
    cm_name = names[-1]
    await config_map(cluster, cm_name, HOSTILE[cm_name][0])
    await asyncio.gather(
        *[
            cluster.create_vsvc(name, {**base, "modelConfig": {"configMapRef": {"name": name}}})
            if name == cm_name
            else cluster.create_vsvc(name, base, annotations={"vllm.autoheal.dev/model-config": HOSTILE[name][0]})
            for name in names
        ]
    )
    await cluster.create_vsvc(
        "ordinary",
        {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "engine": {"maxModelLen": 8192},
            "resources": {"gpuProduct": "NVIDIA-L4"},
        },
    )
    assert await wait_for(lambda: cluster.deployment_now("ordinary"), what="the ordinary service's Deployment")
    ordinary = await wait_fit(cluster, "ordinary")
    assert ordinary["status"] == "True", ordinary
    for name in names:
        await wait_for(lambda: cluster.deployment_now(name), what=f"Deployment of {name}")
        fit = await wait_fit(cluster, name)
        assert fit["status"] == "Unknown" and fit["reason"] == "ModelConfigUnavailable", (name, fit)
        assert HOSTILE[name][1] in fit["message"], (name, fit["message"])


async def test_a_slow_hub_is_asked_again_without_blocking_the_handler(cluster, hub):  # noqa: F811
    import threading

    model_source.configure(HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=1))
    hub.stall = threading.Event()  # the Hub holds every request
    await cluster.create_vsvc(
        "slow",
        {
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "engine": {"maxModelLen": 8192},
            "resources": {"gpuProduct": "NVIDIA-L4"},
        },
    )
    waiting = await wait_fit(cluster, "slow")
    assert waiting["status"] == "Unknown" and waiting["reason"] == "ModelConfigPending", waiting
    assert await wait_for(lambda: cluster.deployment_now("slow"), what="deployment while the Hub is slow")
    hub.stall.set()  # it answers: the retry finds the config
    fit = await wait_for(
        lambda: (f := memory_fit(cluster.vsvc_now("slow"))) and f["status"] != "Unknown" and f,
        what="MemoryFit once the Hub answered",
    )
    assert fit["status"] == "True" and fit["reason"] == "Fits", fit


async def test_a_tenant_naming_many_models_while_the_hub_hangs_holds_two_workers(cluster, hub):  # noqa: F811
    """Twelve services of one tenant, each naming another model, while the Hub holds every request:
    that tenant starts two lookups and keeps two handlers waiting, the rest answer Pending at once
    (and ask again later). Each waiting handler would hold one of the operator's 8 workers for the
    Hub timeout: another tenant's service would wait behind them, and its own Hub lookup would
    queue behind the twelve."""
    import threading

    # (bounds relative to the Hub timeout, so that a loaded machine does not decide: waiting behind team-a's
    # lookups is at least one timeout, the other tenant's own work far less)
    timeout_s = 8
    model_source.configure(HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=timeout_s))
    hub.stall = threading.Event()
    many = cluster.in_namespace("team-a")
    await asyncio.gather(
        *[
            many.create_vsvc(f"m{i}", {"model": f"acme/model-{i}", "resources": {"gpuProduct": "NVIDIA-L4"}})
            for i in range(12)
        ]
    )
    await asyncio.sleep(1.0)  # team-a's reconciles are under way
    started = time.monotonic()
    await cluster.create_vsvc("other", {"model": "m/x", "preflight": "Off", "resources": {"gpuProduct": "NVIDIA-L4"}})
    assert await wait_for(lambda: cluster.deployment_now("other"), what="the other tenant's Deployment")
    waited = time.monotonic() - started
    print(f"the other tenant's Deployment after {waited:.2f} s")
    assert waited < timeout_s / 2
    asked = {path.split("/")[2] for _, path, _ in hub.requests if path.startswith("/acme/")}
    assert len(asked) <= model_source.HUB_LOOKUPS_PER_NAMESPACE, asked
    fits = [await wait_fit(many, f"m{i}") for i in range(12)]
    assert all(f["reason"] == "ModelConfigPending" for f in fits), fits


async def test_hf_token_secret_ref_never_reads_a_secret_of_another_namespace(cluster, hub, caplog):  # noqa: F811
    # A tenant names another namespace's Secret by a path in hfTokenSecretRef.name: the HTTP client
    # resolves the dot segments, and the operator (which may get Secrets everywhere) would read it.
    token = base64.b64encode(GATED_TOKEN.encode()).decode()
    await cluster.call(
        "POST",
        "/api/v1/namespaces/victim/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf", "namespace": "victim"},
            "data": {"token": token},
        },
    )
    spec = {"model": "meta-llama/Llama-3.1-70B-Instruct", "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"}}
    await cluster.create_vsvc(
        "steal", {**spec, "hfTokenSecretRef": {"name": "../../victim/secrets/hf", "key": "token"}}
    )
    await wait_for(  # refused as invalid, not sized with the victim's token
        lambda: [
            r
            for r in caplog.records
            if "invalid VLLMService" in r.getMessage() and "hfTokenSecretRef" in r.getMessage()
        ],
        what="the refusal",
    )
    assert memory_fit(await cluster.vsvc("steal")) is None
    operator_reads = [r for r in cluster.kmock._requests if r.headers.get("User-Agent", "") != HARNESS_AGENT]
    assert not [r for r in operator_reads if "/namespaces/victim/" in r.url.path]


async def test_an_edit_leaves_none_of_pre_flights_fitted_flags_behind(cluster):
    # status is written by JSON merge patch: a flag left out of the new status.effective would stay
    llama8 = json.loads((Path(__file__).parent / "fixtures" / "configs" / "llama-3.1-8b.json").read_text())
    spec = {
        "model": "/models/llama-8b",
        "preflight": "Fix",
        "modelConfig": {"inline": llama8},
        "resources": {"gpuMemoryGib": 30},
    }
    await cluster.create_vsvc("fitted", spec)
    fit = await wait_fit(cluster, "fitted")
    assert (
        fit["reason"] == "FittedByPreflight" and "maxModelLen" in (await cluster.vsvc("fitted"))["status"]["effective"]
    )
    edited = {**spec, "engine": {"kvCacheDtype": "fp8"}}  # fits as written: nothing to fit
    await cluster.call("PATCH", f"{VSVC_PATH}/fitted", {"spec": edited}, MERGE)
    fit = await wait_for(
        lambda: (f := memory_fit(cluster.vsvc_now("fitted"))) and f["reason"] == "Fits" and f, what="Fits"
    )
    effective = (await cluster.vsvc("fitted"))["status"]["effective"]
    assert "maxModelLen" not in effective and effective["kvCacheDtype"] == "fp8", effective
    await cluster.call("PATCH", f"{VSVC_PATH}/fitted", {"spec": {"replicas": 2}}, MERGE)  # a later reconcile
    dep = await wait_for(
        lambda: (d := cluster.deployment_now("fitted")) and d["spec"]["replicas"] == 2 and d, what="replicas 2"
    )
    assert flag(dep, "--max-model-len") is None and flag(dep, "--kv-cache-dtype") == "fp8"


async def test_a_flag_removed_from_the_spec_leaves_the_baseline(cluster):
    # A baseline that kept the removed flag would differ from spec.engine forever: in StatusOverrides
    # mode every reconcile would be a person's edit (heal state reset) and no heal would deploy.
    spec = {"model": "m/x", "preflight": "Off", "engine": {"maxModelLen": 8192}, "heal": {"mode": "StatusOverrides"}}
    await cluster.create_vsvc("removed", spec)
    await wait_for(lambda: ((cluster.vsvc_now("removed") or {}).get("status") or {}).get("baseline"), what="baseline")
    await cluster.call("PATCH", f"{VSVC_PATH}/removed", {"spec": {"engine": {"maxModelLen": None}}}, MERGE)
    status = await wait_for(
        lambda: (s := cluster.vsvc_now("removed")["status"]).get("observedGeneration") == 2 and s, what="the edit"
    )
    assert "maxModelLen" not in status["baseline"] and "maxModelLen" not in status["effective"], status


async def test_a_heal_looks_the_model_up_once_and_never_under_the_objects_write_lock(cluster, monkeypatch):
    """The model's config (a ConfigMap GET here; a Secret GET and a wait for the Hub elsewhere) is
    looked up before the heal's status write, not inside it: the object's write lock is held by no
    network call, and one crash costs one lookup, not one for the diagnosis and one for the plan."""
    from vllm_autoheal.kube import writes

    from samples import KV_TERMINATION

    await config_map(cluster, "small", json.dumps(SMALL))
    await cluster.create_vsvc(
        "looked",
        {
            "model": "/models/small",
            "modelConfig": {"configMapRef": {"name": "small"}},
            "engine": {"maxModelLen": 1048576},
        },
    )
    await cluster.settled("looked")
    lookups: list[bool] = []  # for each lookup by the crash's handler: was the object's write lock held?
    real = model_source._for_service

    def watched(obj, get):
        if any(frame.function == "handle_crash" for frame in inspect.stack(0)):  # (not a reconcile's pre-flight)
            lookups.append(writes.lock(NS, "looked").locked())
        return real(obj, get)

    monkeypatch.setattr(model_source, "_for_service", watched)
    await cluster.crash_pod("looked", "looked-a", message=KV_TERMINATION)
    obj = await cluster.heal_recorded("looked")
    assert obj["spec"]["engine"]["maxModelLen"] == 524160  # healed, planned with the model's shape at hand
    assert lookups == [False]
