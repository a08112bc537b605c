"""Hostile review of the changes of 3e046e6..b2254b3 (diffbase digests, the env and flag rules, pod
ownership, shared unschedulable looks, the bounded Hub cache, the Event budget, the model config's
aliases and the plan's refusal of a context longer than the model). Each test asserts the right
behaviour and is a strict xfail until the defect it names is fixed."""

from __future__ import annotations

import json
from typing import Any

import kopf
import pytest

from test_pod_ownership import Reads, obj, ref
from test_review_tenant import LOG, LONG_AGO, _intent, _pending_pod, _reverted, _stuck_heal
from vllm_autoheal import hub_cache, validation
from vllm_autoheal.api import EngineArgs
from vllm_autoheal.kube import heal_events, ownership, unschedulable
from vllm_autoheal.kube.config import OperatorConfig
from vllm_autoheal.kube.diffbase import DigestedDiffBaseStorage, kept
from vllm_autoheal.kube.heal_apply import fp
from vllm_autoheal.model_config import parse, to_shape
from vllm_autoheal.model_source import HubSettings, from_hub
from vllm_autoheal.plan_options import longer_than_the_model

from hub_server import CONFIGS, Hub, Repo
from operator_harness import PendingLater

GROUP = "vllm.autoheal.dev"
NS = "team-a"


def _body(spec: dict[str, Any], labels: dict | None = None, annotations: dict | None = None) -> dict[str, Any]:
    meta = {"name": "svc", "namespace": NS, "uid": "u", "labels": labels or {}, "annotations": annotations or {}}
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "VLLMService", "metadata": meta, "spec": spec}


# --- kube/diffbase.py -------------------------------------------------------------------------


def test_metadata_with_many_labels_and_annotations_stays_a_mapping_kopf_can_clear():
    labels = {f"team.example/l{i:03}": "v" * 63 for i in range(60)}  # ~5.5 KiB, under MAPPING_BYTES
    annotations = {f"team.example/a{i}": "x" * 200 for i in range(30)}  # ~6.5 KiB, under it too
    storage = DigestedDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    essence = storage.build(body=kopf.Body(_body({"model": "m"}, labels, annotations)))
    cleared = kopf.AnnotationsProgressStorage(prefix=GROUP).clear(essence=essence)  # (kopf's processing does)
    assert isinstance(cleared["metadata"], dict)


def test_an_edit_to_a_literal_digest_string_is_seen():
    big = "m" * 500  # (spec.model: up to 512 characters, kept as its digest past VALUE_BYTES)
    digest = kept({"model": big})["model"]
    for literal in (json.dumps(digest), str(digest), *(str(v) for v in digest.values())):
        assert kept({"model": big}) != kept({"model": literal})  # (a string never takes the digest's form)


# --- the env rule (api/spec.py) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "c"}}]},  # + key VISIBLE_DEVICES
        {"envFrom": [{"prefix": "NVIDIA_MIG_", "secretRef": {"name": "s"}}]},
        {"envFrom": [{"prefix": "N", "configMapRef": {"name": "c"}}]},  # + key VIDIA_VISIBLE_DEVICES
    ],
    ids=["prefix-NVIDIA_", "prefix-NVIDIA_MIG_", "prefix-N"],
)
def test_env_from_cannot_spell_the_device_plugins_variables(spec):
    _admitted, problems = validation.admit(_body({"model": "m", **spec}))
    assert problems


def test_env_cannot_ask_the_toolkit_for_imex_channels():
    _admitted, problems = validation.admit(
        _body({"model": "m", "env": [{"name": "NVIDIA_IMEX_CHANNELS", "value": "all"}]})
    )
    assert problems


# --- kube/ownership.py and the unschedulable looks -----------------------------------------------


@pytest.fixture
def fresh_looks(monkeypatch):
    monkeypatch.setattr(unschedulable, "_recent", unschedulable.RecentReads())
    monkeypatch.setattr(unschedulable, "_looks", unschedulable.NamespaceLooks())


def test_a_decoy_pending_pod_does_not_revert_a_heal(monkeypatch, fresh_looks):
    decoy = _pending_pod(0, fp(_intent().target), LONG_AGO, owned=False)
    assert not (decoy["metadata"].get("ownerReferences"))
    kube, events = _stuck_heal(monkeypatch, [decoy])
    unschedulable.check(kube, OperatorConfig(), PendingLater(), NS, "svc", LOG, decoy)  # type: ignore[arg-type]
    assert not _reverted(kube) and not events


def test_a_remembered_chain_does_not_outlive_the_service_it_ended_at(monkeypatch):
    monkeypatch.setattr(ownership, "_chains", type(ownership._chains)())
    reads = Reads()
    pod = obj("svc-5d8f-x", "pod-1", ref("ReplicaSet", "svc-5d8f", "rs-1"))
    assert ownership.run_by_service(reads, NS, "svc", pod)
    reads.vsvcs["svc"] = obj("svc", "vsvc-2")  # made again; the orphaned Deployment still names vsvc-1
    assert not ownership.run_by_service(reads, NS, "svc", pod)


# --- hub_cache.py -------------------------------------------------------------------------------


def _fetch_repos(tmp_path, n: int, shared_commit: bool) -> Any:
    """n repos of one config fetched into one token's cache; the root of the per-token caches."""
    config = (CONFIGS / "llama-3.1-8b.json").read_bytes()
    commits = ["0123456789abcdef0123456789abcdef01234567" if shared_commit else f"{i + 1:040x}" for i in range(n)]
    hub = Hub(repos={f"t/m{i}": Repo({"config.json": config}, commit=commits[i]) for i in range(n)})
    server, hub.url = hub.serve()
    root = tmp_path / "by-token"
    settings = HubSettings(endpoint=hub.url, cache_dir=str(root / "anonymous"), timeout_s=10)
    try:
        for i in range(n):
            assert from_hub(f"t/m{i}", None, settings, False)["num_hidden_layers"] == 32
    finally:
        server.shutdown()
        server.server_close()
    return root


def test_prune_reaches_its_budget_when_repos_share_a_commit_hash(tmp_path):
    root = _fetch_repos(tmp_path, 40, shared_commit=True)
    budget = 64 << 10
    hub_cache.prune(root, budget)
    repos = [p for p in (root / "anonymous").iterdir() if p.name.startswith("models--")]
    assert sum(hub_cache.disk_bytes(p) for p in repos) <= budget, f"{len(repos)} of 40 repos kept"


def test_prune_reaches_its_budget_however_many_repos_were_named(tmp_path):
    root = _fetch_repos(tmp_path, 40, shared_commit=False)
    budget = 64 << 10
    hub_cache.prune(root, budget)
    assert hub_cache.disk_bytes(root) <= budget  # (the repos' lock folders went with them)


# --- kube/heal_events.py -------------------------------------------------------------------------


def test_one_namespaces_many_services_post_a_bounded_burst_of_events(monkeypatch):
    monkeypatch.setattr(heal_events, "_budget", heal_events.EventBudget())
    posted: list[str] = []
    monkeypatch.setattr(heal_events, "post_event", lambda vsvc, **k: posted.append(vsvc["metadata"]["namespace"]))
    for i in range(200):
        vsvc = {"metadata": {"name": f"svc-{i}", "namespace": NS, "uid": f"uid-{i}"}}
        for _crash in range(30):
            heal_events.event(vsvc, "Warning", "HealApplied", "m")
    other = {"metadata": {"name": "svc", "namespace": "team-b", "uid": "uid-b"}}
    heal_events.event(other, "Warning", "HealApplied", "m")
    assert posted.count(NS) <= 4 * heal_events.BURST and posted[-1] == "team-b"


# --- model_config aliases / plan_options.longer_than_the_model ---------------------------------------


def _aya(**extra: Any) -> Any:
    config = json.loads((CONFIGS / "unseen2" / "aya-23-8b.json").read_text())
    return to_shape(parse(json.dumps({**config, **extra}), "cohere"))


def test_command_r_context_is_its_model_max_length():
    shape = _aya(model_max_length=131072)
    assert shape.max_position_embeddings == 131072
    assert longer_than_the_model(shape, EngineArgs(max_model_len=131072), None) is None


def test_the_longest_context_is_the_smallest_of_vllms_names():
    shape = _aya(seq_length=2048)
    assert shape.max_position_embeddings == 2048
    assert longer_than_the_model(shape, EngineArgs(max_model_len=8192), None)


def test_an_ordinary_env_from_prefix_is_admitted():
    """The control: prefixes that cannot begin a device-plugin variable are not refused."""
    for prefix in ("APP_", "HF_", "VLLM_", "NV_", "NVIDIA_TF32_"):
        spec = {"model": "m", "envFrom": [{"prefix": prefix, "configMapRef": {"name": "c"}}]}
        assert validation.admit(_body(spec))[1] == [], prefix
    assert validation.admit(_body({"model": "m", "envFrom": [{"configMapRef": {"name": "c"}}]}))[1] == []
