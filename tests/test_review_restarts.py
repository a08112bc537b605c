"""Hostile review of the operator across restarts, crashes between its own writes, concurrent writers
and kopf's retries. Each test asserts the right behaviour and is a strict xfail until the defect it
names is fixed."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import kmock as kmocklib
import kopf
import pytest

from test_chart import template
from test_operator_on_crd_server import _fresh, split  # noqa: F401 - the split cluster's fixture
from vllm_autoheal.cli import build_parser
from vllm_autoheal.cli_commands import peering_options
from vllm_autoheal.kube.client import MERGE

from operator_harness import TEST_CONFIG, Cluster, Emulator, flag, setup_emulator, vsvc_path, wait_for
from samples import KV_TERMINATION, NOT_MEMORY, SPEC

pytestmark = pytest.mark.kmock(cls=Emulator)


def status(obj: dict) -> dict:
    return obj.get("status") or {}


# --- a person's revert of a heal that is still rolling out ------------------------------------


async def test_a_persons_revert_of_a_heal_still_rolling_out_is_deployed(cluster):
    """PatchSpec: the heal lowered max_model_len and its pods are still starting (a large model loads
    for minutes, so status.inFlight stays set). The person reverts the spec by hand to the flags
    they wrote. The Deployment must run their spec, as it does once the rollout is over."""
    name = "revert-mid"
    obj = await cluster.first_heal(name, SPEC, f"{name}-a", message=KV_TERMINATION)
    assert obj["spec"]["engine"]["maxModelLen"] == 524160 and status(obj)["inFlight"]["applied"]
    await wait_for(lambda: flag(cluster.deployment_now(name), "--max-model-len") == "524160", what="the heal's rollout")
    # the person's revert, before the healed pods are available (the rollout is not over)
    await cluster.call("PATCH", vsvc_path(name), {"spec": {"engine": {"maxModelLen": None}}}, MERGE)
    await wait_for(lambda: "maxModelLen" not in cluster.vsvc_now(name)["spec"]["engine"], what="the revert stored")
    await cluster.deployment_available(name)  # the Deployment controller, whichever template it has
    await cluster.quiet(name)
    dep = await cluster.deployment(name)
    assert flag(dep, "--max-model-len") is None, "the person's revert is not deployed"
    obj = await cluster.vsvc(name)
    assert "maxModelLen" not in status(obj)["effective"]


# --- a VLLMService deleted and made again under the same name --------------------------------


async def test_a_crash_of_the_old_services_pod_does_not_heal_a_service_made_again_under_its_name(cluster, monkeypatch):
    """`kubectl replace --force`, a Helm reinstall, a GitOps re-create: the old service's pods are still
    terminating (the garbage collector removes its Deployment first, then its ReplicaSet and pods) when
    the new service of the same name is reconciled. Read afresh, the old pod's chain ends at a service of
    another uid, so it is not the new service's; its crash must not change the new service's flags."""
    from vllm_autoheal.kube import ownership

    looked: list[tuple[str, int, bool]] = []
    real = ownership.run_by_service

    def spied(kube, namespace, service, pod):
        found = real(kube, namespace, service, pod)
        cs = (pod.get("status") or {}).get("containerStatuses") or [{}]
        looked.append((pod["metadata"]["name"], cs[0].get("restartCount", 0), found))
        return found

    monkeypatch.setattr(ownership, "run_by_service", spied)
    name = "same-name"
    await cluster.create_vsvc(name, SPEC)
    await cluster.settled(name)
    await cluster.crash_pod(name, f"{name}-old", message=NOT_MEMORY, restart_count=1)  # its chain is looked up
    await wait_for(lambda: status(cluster.vsvc_now(name)).get("observedCrashes"), what="the first crash recorded")
    # deleted: the service, then (the garbage collector) its Deployment and Service; the old ReplicaSet
    # and its pod are still there, terminating
    await cluster.call("DELETE", vsvc_path(name))
    await cluster.call("DELETE", f"/apis/apps/v1/namespaces/default/deployments/{name}")
    await cluster.call("DELETE", f"/api/v1/namespaces/default/services/{name}")
    await wait_for(lambda: cluster.vsvc_now(name) is None and cluster.deployment_now(name) is None, what="gone")
    await cluster.create_vsvc(name, SPEC)  # made again: a new uid
    new = await cluster.settled(name)
    assert not status(new).get("observedCrashes")
    # the old pod's container dies again as it terminates
    await cluster.crash_pod(name, f"{name}-old", message=KV_TERMINATION, restart_count=2)
    await wait_for(lambda: any(p == f"{name}-old" and r == 2 for p, r, _ in looked), what="the old pod looked at")
    await cluster.quiet(name)
    obj = await cluster.vsvc(name)
    assert "maxModelLen" not in obj["spec"]["engine"], "the old service's pod healed the new service"
    assert not status(obj).get("healCount") and not status(obj).get("observedCrashes")


# --- two replicas: the chart's HA mode ----------------------------------------------------------


def serve_peering_crds(kmock) -> None:
    """The kopf.dev CRDs the chart installs (crds/kopf-peering.yaml)."""
    verbs = {"get", "list", "watch", "create", "patch", "delete"}
    kmock.resources["kopf.dev/v1/clusterkopfpeerings"] = kmocklib.ResourceInfo(
        kind="ClusterKopfPeering", namespaced=False, singular="clusterkopfpeering", verbs=verbs
    )
    kmock.resources["kopf.dev/v1/kopfpeerings"] = kmocklib.ResourceInfo(
        kind="KopfPeering", namespaced=True, singular="kopfpeering", verbs=verbs
    )


def ha_install(helm: str, tmp_path) -> tuple[list[str], list[dict]]:
    """What `helm install --set replicas=2` deploys of the operator: its container's arguments and the
    kopf.dev objects of its templates."""
    docs = template(helm, tmp_path, {"replicas": 2})
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args, [d for d in docs if d["apiVersion"].startswith("kopf.dev/")]


@contextlib.asynccontextmanager
async def replicas(count: int, args: list[str]):
    """`count` operator processes as the chart runs them: each parses the chart's arguments as
    cli_commands.run_operator does and runs kopf with its peering_options (each draws its priority)."""
    import vllm_autoheal.kube.handlers  # noqa: F401 - registers the handlers

    options = [peering_options(build_parser().parse_args(args)) for _ in range(count)]
    stops = [threading.Event() for _ in range(count)]
    threads = [
        threading.Thread(
            target=lambda stop=stop, o=o: asyncio.run(
                kopf.operator(**o, stop_flag=stop, memo=kopf.Memo(config=TEST_CONFIG))
            ),
            daemon=True,
        )
        for stop, o in zip(stops, options, strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        await asyncio.sleep(0.5)
        yield [(o["priority"], stop) for o, stop in zip(options, stops, strict=True)]
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            await asyncio.to_thread(thread.join, 20)
    assert not any(t.is_alive() for t in threads), "an operator did not stop within 20 s"


async def _served(c: Cluster, name: str) -> bool:
    await c.create_vsvc(name, SPEC)
    try:
        await wait_for(lambda: c.deployment_now(name), timeout=10, what=f"{name}'s Deployment")
    except AssertionError:
        return False
    return True


async def test_the_charts_ha_install_serves_vllmservices(kmock, helm, tmp_path):
    """`helm install --set replicas=2`: the peering CRDs, the ClusterKopfPeering its templates make (kopf
    waits for the one --peering names and never makes it), and two operators of its arguments. kopf's
    peering is no leader election: replicas of one priority all pause, so each draws its own, and the
    highest live one serves."""
    args, peerings = ha_install(helm, tmp_path)
    assert any(a.startswith("--peering=") for a in args) and "--priority" not in " ".join(args)
    assert [p["kind"] for p in peerings] == ["ClusterKopfPeering"]
    setup_emulator(kmock)
    serve_peering_crds(kmock)
    c = Cluster(kmock)
    for peering in peerings:
        await c.call("POST", "/apis/kopf.dev/v1/clusterkopfpeerings", peering)
    async with replicas(2, args) as running:
        assert await _served(c, "ha-chart"), "no operator replica serves"
        # the active one (the highest priority) leaves as a rolling update stops it: the other takes over
        max(running, key=lambda r: r[0])[1].set()
        assert await _served(c, "ha-chart-after"), "the standby replica did not take over"


def test_replicas_draw_their_own_priority_and_a_given_one_is_kept():
    chart = ["operator", "--peering=vllm-autoheal"]
    drawn = {peering_options(build_parser().parse_args(chart))["priority"] for _ in range(20)}
    assert len(drawn) > 1 and all(p > 0 for p in drawn)
    assert peering_options(build_parser().parse_args([*chart, "--priority", "7"]))["priority"] == 7
    standalone = peering_options(build_parser().parse_args(["operator"]))
    assert standalone["standalone"] and standalone["priority"] is None


# --- two writers of one crash: the operator's rolling update ------------------------------------


@pytest.mark.crdserver
async def test_a_crash_another_replica_recorded_first_posts_no_events_here(split, monkeypatch):  # noqa: F811
    """The chart's Deployment (replicas: 1, standalone, the default RollingUpdate strategy: the new pod
    starts before the old one stops) runs two operators for a while at every upgrade; both see a crash
    of that moment. The real API server lets one record it (resourceVersion) and the other reads again
    and finds it recorded: that one did not heal, and must not say it did. Played here by the test
    writing the other replica's record between this operator's read and its write."""
    from vllm_autoheal.api import GROUP, PLURAL, VERSION
    from vllm_autoheal.kube import heal, heal_events
    from vllm_autoheal.kube.writes import replacing

    c, name = split, "case-two-writers"
    await _fresh(c, name, SPEC)
    path = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{name}/status"
    real_record, real_handle, real_post = heal.record, heal.handle_crash, heal_events.post
    raced, returned, posted, calls = [], [], [], []

    def other_replica_first(kube, incident, fresh, cfg, expected):
        out = real_record(kube, incident, fresh, cfg, expected)
        calls.append(out is not None)
        if out and not raced:  # the other replica read the same object and wrote the same record first
            current = fresh.get("status") or {}
            body = {
                "metadata": {"resourceVersion": fresh["metadata"]["resourceVersion"]},
                "status": {k: replacing(current.get(k), v) for k, v in out.items()},
            }
            raced.append(c.kube.request("PATCH", path, body, MERGE))
        return out

    def handle(*args, **kwargs):
        try:
            return real_handle(*args, **kwargs)
        finally:
            returned.append(bool(raced))

    monkeypatch.setattr(heal, "record", other_replica_first)
    monkeypatch.setattr(heal, "handle_crash", handle)
    monkeypatch.setattr(heal_events, "post", lambda *a, **k: (posted.append(a[2].action), real_post(*a, **k)))
    await c.crash_pod(name, f"{name}-a", message=KV_TERMINATION)
    await wait_for(lambda: any(returned), timeout=20, what="the raced crash handled")
    obj = await c.vsvc(name)
    assert obj["status"]["healCount"] == 1 and len(obj["status"]["heals"]) == 1  # (recorded once: by the other)
    assert calls[:2] == [True, False]  # this replica's write was refused (409); read again, the crash was recorded
    assert posted == [], f"this replica posted the Events of a heal it did not record: {posted}"
