"""Heal latency over many incidents, and operator memory with many VLLMServices.

    python bench/operator_heal.py [--incidents 100] [--services 1000]

Runs `vllm-autoheal operator` as its own process against kmock (the Kubernetes API
emulator) through a kubeconfig, like a deployed operator. Each incident: a pod of a
VLLMService's Deployment gets a real vLLM KV-cache failure in its termination message;
latency is from the pod update to the VLLMService spec patched (end to end, through
watches), plus the operator's own heal-latency histogram (crash observed -> patched).
Then it loads N VLLMServices and reads the operator's resident memory (VmRSS).
The emulator is one Python process serving every request: at these counts it, not the
operator, is the bottleneck (it runs at 100% CPU while the operator idles), so latencies
grow with the emulator's load; the operator's RSS is the figure that speaks for itself.
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

from operator_harness import Cluster, Emulator, setup_emulator  # noqa: E402
from test_operator import KV_TERMINATION, SPEC  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


async def until(check, timeout: float = 600.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(step)
    raise TimeoutError("the operator did not act in time")


async def main(incidents: int, services: int) -> int:
    async with Emulator() as emulator, kmocklib.Server(emulator):
        setup_emulator(emulator)
        url = str(emulator.url).rstrip("/")
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            kubeconfig.write_text(f"apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster: {{server: '{url}'}}\n"
                                  "users:\n- name: u\n  user: {token: bench}\ncontexts:\n- name: k\n  context: "
                                  "{cluster: k, user: u, namespace: default}\ncurrent-context: k\n")
            metrics_port = _port()
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT / "operator")}
            proc = subprocess.Popen([sys.executable, "-m", "vllm_autoheal", "operator", "--metrics-port",
                                     str(metrics_port), "--health-port", str(_port())], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                return await run(Cluster(emulator), proc, metrics_port, incidents, services)
            finally:
                proc.terminate()
                proc.wait(30)


def forget(c: Cluster, name: str) -> None:
    """Drop an incident's objects from the emulator's store (not through the API), so that each
    incident is measured against the same small store: the emulator slows as it grows."""
    store = c.kmock.objects
    for key in [k for k in list(store) if k[2] and str(k[2]).startswith(name)]:
        del store[key]


async def run(c: Cluster, proc: subprocess.Popen, metrics_port: int, incidents: int, services: int) -> int:
    await asyncio.sleep(2)
    base_rss = rss_mib(proc.pid)
    spec = {**SPEC, "heal": {**SPEC["heal"], "backoffSeconds": 0}}
    latencies = []
    for i in range(incidents):
        name = f"heal-{i:03d}"
        await c.create_vsvc(name, spec)
        await until(lambda: c.deployment_now(name))
        start = time.monotonic()
        await c.crash_pod(name, f"{name}-pod", message=KV_TERMINATION)
        await until(lambda: (c.vsvc_now(name)["spec"]["engine"].get("maxModelLen")))
        latencies.append(time.monotonic() - start)
        forget(c, name)
        if (i + 1) % 10 == 0:
            print(f"  {i + 1} incidents: median so far {statistics.median(latencies) * 1000:.0f} ms; "
                  f"operator RSS {rss_mib(proc.pid):.0f} MiB", flush=True)
    await asyncio.sleep(1)  # the operator counts a heal just after patching
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    total = float(re.search(r"^vllm_autoheal_heal_latency_seconds_sum (\S+)", metrics, re.M).group(1))
    count = float(re.search(r"^vllm_autoheal_heal_latency_seconds_count (\S+)", metrics, re.M).group(1))
    healed = float(re.search(r'^vllm_autoheal_heals_total\{action="LowerMaxModelLen"\} (\S+)', metrics, re.M).group(1))
    q = statistics.quantiles(latencies, n=20)
    print(f"incidents: {incidents}, healed: {int(healed)}")
    print(f"end-to-end heal latency (pod update -> spec patched, through watches): "
          f"median {statistics.median(latencies) * 1000:.0f} ms, p95 {q[18] * 1000:.0f} ms, "
          f"max {max(latencies) * 1000:.0f} ms")
    print(f"operator's own heal latency (crash observed -> resource patched): mean {total / count * 1000:.0f} ms "
          f"over {int(count)}")
    started = time.monotonic()
    for i in range(services):
        await c.create_vsvc(f"load-{i:04d}", SPEC)
        if (i + 1) % 100 == 0:
            print(f"  {i + 1} VLLMServices created; operator RSS {rss_mib(proc.pid):.0f} MiB", flush=True)
    last = f"load-{services - 1:04d}"
    await until(lambda: (c.vsvc_now(last) or {}).get("status", {}).get("endpoint"), timeout=900, step=0.5)
    await asyncio.sleep(5)
    print(f"{services} VLLMServices reconciled in {time.monotonic() - started:.0f} s; operator RSS "
          f"{rss_mib(proc.pid):.0f} MiB (at start {base_rss:.0f} MiB)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--incidents", type=int, default=100)
    parser.add_argument("--services", type=int, default=1000)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.incidents, args.services)))
