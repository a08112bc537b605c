"""Heal latency over many incidents, and operator memory with many VLLMServices.

    python bench/operator_heal.py [--incidents 100] [--burst 50] [--services 1000] [--after-load 20]

Runs `vllm-autoheal operator` as its own process against kmock (the Kubernetes API
emulator) through a kubeconfig, like a deployed operator. Incidents, one at a time, each on
a VLLMService of its own, alternate: a pod whose termination message is the launcher's real
vLLM KV-cache diagnosis (-> maxModelLen), and a pod OOMKilled with exit 137 (-> memory limit).
Latency runs from the pod update to the VLLMService spec patched (end to end, through
watches); the operator's own heal-latency histogram (crash observed -> resource patched and
the Deployment re-rendered) is read from its /metrics. A burst then crashes the pods of
many VLLMServices at once and times until the last is healed. Then N VLLMServices are
loaded and reconciled, the operator's resident memory (VmRSS) is read, and a few more
incidents show the latency with them loaded.
The emulator is one Python process serving every request at about 20-40 ms each, so these
latencies are mostly the emulator's; the operator's own CPU time is printed beside them.
Its request log is bounded (Emulator.bound_request_log): kept whole it makes every request
slower than the last.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "tests")]

import kmock as kmocklib  # noqa: E402

from test_operator import KV_TERMINATION, SPEC  # noqa: E402
from vllm_autoheal.api import GROUP, PLURAL, VERSION  # noqa: E402

from operator_harness import Cluster, Emulator, setup_emulator  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def until(check, timeout: float = 600.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(step)
    raise TimeoutError("the operator did not act in time")


async def main(incidents: int, burst_size: int, services: int, after_load: int, log_path: str | None) -> int:
    async with Emulator() as emulator, kmocklib.Server(emulator):
        setup_emulator(emulator)
        emulator.bound_request_log(64)
        url = str(emulator.url).rstrip("/")
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            kubeconfig.write_text(
                f"apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster: {{server: '{url}'}}\n"
                "users:\n- name: u\n  user: {token: bench}\ncontexts:\n- name: k\n  context: "
                "{cluster: k, user: u, namespace: default}\ncurrent-context: k\n"
            )
            metrics_port = _port()
            log = open(log_path, "w") if log_path else subprocess.DEVNULL
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT / "operator")}
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vllm_autoheal",
                    "operator",
                    "--metrics-port",
                    str(metrics_port),
                    "--health-port",
                    str(_port()),
                    "--log-format",
                    "full",
                    "--hub-endpoint",
                    "off",
                ],  # never the internet from a bench
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            try:
                return await run(Cluster(emulator), proc, metrics_port, incidents, burst_size, services, after_load)
            finally:
                proc.terminate()
                await asyncio.to_thread(proc.wait, 30)  # the loop serves kmock meanwhile


# Each incident kind: how the pod dies, and the spec field the heal must change.
INCIDENTS = {
    "kv-cache": (dict(message=KV_TERMINATION), lambda v: v["spec"]["engine"].get("maxModelLen")),
    "OOMKilled": (
        dict(exit_code=137, reason="OOMKilled"),
        lambda v: v["spec"]["resources"]["limits"]["memory"] != SPEC["resources"]["limits"]["memory"],
    ),
}


async def heal_incidents(c: Cluster, proc: subprocess.Popen, prefix: str, count: int) -> list[float]:
    """One incident at a time, alternating kinds; each on a VLLMService of its own."""
    spec = {**SPEC, "heal": {**SPEC["heal"], "backoffSeconds": 0}}
    latencies = []
    kinds = list(INCIDENTS)
    for i in range(count):
        name = f"{prefix}-{i:03d}"
        crash, healed = INCIDENTS[kinds[i % len(kinds)]]
        await c.create_vsvc(name, spec)
        await until(lambda: c.deployment_now(name))
        start = time.monotonic()
        await c.crash_pod(name, f"{name}-pod", **crash)
        await until(lambda: healed(c.vsvc_now(name)))
        latencies.append(time.monotonic() - start)
        # the heal is done when it is recorded in status; only then the next incident
        await until(lambda: (c.vsvc_now(name).get("status") or {}).get("heals"))
        if (i + 1) % 10 == 0:
            print(
                f"  {i + 1} incidents: median so far {statistics.median(latencies) * 1000:.0f} ms; "
                f"operator RSS {rss_mib(proc.pid):.0f} MiB",
                flush=True,
            )
    return latencies


async def burst(c: Cluster, count: int) -> tuple[float, list[float]]:
    """`count` pods of as many VLLMServices crash at once (a bad rollout, a node-wide event):
    seconds to post all the crashes, and each service's time from the first crash to healed."""
    spec = {**SPEC, "heal": {**SPEC["heal"], "backoffSeconds": 0}}
    names = [f"burst-{i:03d}" for i in range(count)]
    kinds = [list(INCIDENTS)[i % len(INCIDENTS)] for i in range(count)]
    for name in names:
        await c.create_vsvc(name, spec)
    for name in names:
        await until(lambda: c.deployment_now(name))
    start = time.monotonic()
    await asyncio.gather(
        *(c.crash_pod(name, f"{name}-pod", **INCIDENTS[kind][0]) for name, kind in zip(names, kinds, strict=True))
    )
    posted = time.monotonic() - start
    healed_at: dict[str, float] = {}
    while len(healed_at) < count and time.monotonic() - start < 600:
        items = (await c.call("GET", f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"))["items"]
        now = time.monotonic() - start
        for v in items:
            name = v["metadata"]["name"]
            if name in names and name not in healed_at and INCIDENTS[kinds[names.index(name)]][1](v):
                healed_at[name] = now
        await asyncio.sleep(0.1)
    return posted, sorted(healed_at.values())


def report(what: str, latencies: list[float]) -> None:
    q = statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) > 1 else latencies * 19
    print(
        f"{what}: {len(latencies)} incidents ({', '.join(INCIDENTS)} alternating); end-to-end heal latency "
        f"(pod update -> spec patched, through watches): median {statistics.median(latencies) * 1000:.0f} ms, "
        f"p95 {q[18] * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )


def operator_metrics(port: int) -> tuple[float, float, float]:
    """(heals counted, mean own heal latency s, heal latency histogram count)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = float(re.search(r"^vllm_autoheal_heal_latency_seconds_sum (\S+)", text, re.M).group(1))
    count = float(re.search(r"^vllm_autoheal_heal_latency_seconds_count (\S+)", text, re.M).group(1))
    heals = sum(float(v) for v in re.findall(r"^vllm_autoheal_heals_total\{[^}]*\} (\S+)", text, re.M))
    return heals, total / count if count else float("nan"), count


async def run(
    c: Cluster,
    proc: subprocess.Popen,
    metrics_port: int,
    incidents: int,
    burst_size: int,
    services: int,
    after_load: int,
) -> int:
    await asyncio.sleep(2)
    base_rss = rss_mib(proc.pid)
    cpu, wall = cpu_seconds(proc.pid), time.monotonic()
    latencies = await heal_incidents(c, proc, "heal", incidents)
    cpu, wall = cpu_seconds(proc.pid) - cpu, time.monotonic() - wall
    heals, own_mean, own_count = operator_metrics(metrics_port)
    report("heals", latencies)
    print(
        f"heals counted by the operator: {int(heals)}; its own heal latency (crash observed -> resource "
        f"patched and Deployment re-rendered): mean {own_mean * 1000:.0f} ms over {int(own_count)}"
    )
    print(
        f"operator CPU: {cpu:.1f} s in {wall:.0f} s ({cpu / wall:.0%} of a core), {cpu / incidents * 1000:.0f} ms "
        f"per incident (its create, reconcile and heal)"
    )
    if burst_size:
        cpu = cpu_seconds(proc.pid)
        posted, healed = await burst(c, burst_size)
        print(
            f"burst: {burst_size} pods of {burst_size} VLLMServices crashed at once (posted within "
            f"{posted * 1000:.0f} ms): {len(healed)} healed; the last {healed[-1]:.1f} s after the first crash, "
            f"median {statistics.median(healed):.1f} s; operator CPU {cpu_seconds(proc.pid) - cpu:.1f} s "
            f"(creates, reconciles and heals)"
        )
    if not services:
        return 0
    started, cpu = time.monotonic(), cpu_seconds(proc.pid)
    for i in range(services):
        await c.create_vsvc(f"load-{i:04d}", SPEC)
        if (i + 1) % 100 == 0:
            print(f"  {i + 1} VLLMServices created; operator RSS {rss_mib(proc.pid):.0f} MiB", flush=True)
    last = f"load-{services - 1:04d}"
    await until(lambda: (c.vsvc_now(last) or {}).get("status", {}).get("endpoint"), timeout=900, step=0.5)
    took, cpu = time.monotonic() - started, cpu_seconds(proc.pid) - cpu
    await asyncio.sleep(5)
    print(
        f"{services} VLLMServices reconciled (Deployment, Service, status) in {took:.0f} s, operator CPU "
        f"{cpu:.1f} s ({cpu / services * 1000:.0f} ms each); operator RSS {rss_mib(proc.pid):.0f} MiB "
        f"(at start {base_rss:.0f} MiB)"
    )
    if after_load:
        report(
            f"heals with {services + incidents + burst_size} VLLMServices loaded",
            await heal_incidents(c, proc, "loaded", after_load),
        )
        print(f"operator RSS at the end: {rss_mib(proc.pid):.0f} MiB")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--incidents", type=int, default=100)
    parser.add_argument("--burst", type=int, default=50, help="pods that crash at once, after the incidents")
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--after-load", type=int, default=20, help="incidents with the services loaded")
    parser.add_argument("--operator-log", help="write the operator's log here (default: discard)")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.incidents, args.burst, args.services, args.after_load, args.operator_log)))
