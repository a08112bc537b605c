"""A container's log as the node keeps and serves it: the kubelet's CRI log file, docker's json-file log,
collectors' prefixes, and a stand-in for a kubelet's log endpoint."""

from __future__ import annotations

import json

from vllm_autoheal.kube import client as kc


def cri_log(log: str, zone: str = "Z", record: int | None = None) -> str:
    """The kubelet's CRI log file: `<RFC3339Nano> <stream> <F|P> <text>`, each line its own time; a line
    longer than `record` characters is split into P records and an F record (containerd: 16 KiB)."""
    out = []
    for i, line in enumerate(log.splitlines()):
        time = f"2025-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.{123456789 + i * 1000:09d}{zone}"
        parts = [line[k : k + record] for k in range(0, len(line), record)] if record and line else [line]
        out += [f"{time} stderr {'F' if j == len(parts) - 1 else 'P'} {p}" for j, p in enumerate(parts)]
    return "\n".join(out) + "\n"


def docker_log(log: str, record: int | None = None) -> str:
    """docker's json-file log: one JSON record a line; a line longer than `record` characters is split
    into records whose "log" has no trailing newline but the last (docker: 16 KiB)."""
    out = []
    for i, line in enumerate(log.splitlines()):
        text = line + "\n"
        parts = [text[k : k + record] for k in range(0, len(text), record)] if record else [text]
        out += [
            json.dumps({"log": p, "stream": "stderr", "time": f"2025-01-01T00:00:{i % 60:02d}.{i:09d}Z"}) for p in parts
        ]
    return "\n".join(out) + "\n"


# A log as collectors hand it over: as is, under docker compose's service prefix, with kubectl's --timestamps.
COLLECTORS = {
    "plain": lambda log: log,
    "compose": lambda log: "".join(f"vllm-1  | {ln}\n" for ln in log.splitlines()),
    "kubectl-timestamps": lambda log: "".join(
        f"2026-12-02T07:36:{i % 60:02d}.123456789Z {ln}\n" for i, ln in enumerate(log.splitlines())
    ),
}


class Kubelet(kc.Kube):
    """A kubelet's log endpoint, as it serves tailLines and limitBytes, over `output`."""

    def __init__(self, output: str) -> None:  # (no cluster: only the log endpoint is served)
        self.output, self.asked = output, []

    def request(self, method, path, body=None, content_type="", query=None, raw=False, timeout=None):
        assert timeout is not None and 0 < timeout <= kc.LOG_BUDGET_S  # (each call within the read's budget)
        options = dict(query or [])
        self.asked.append(options["tailLines"])
        lines = self.output.splitlines(keepends=True)[-options["tailLines"] :]
        return "".join(lines).encode()[: options["limitBytes"]].decode("utf-8", "replace")
