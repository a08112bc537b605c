"""This process's memory cgroup: its limit and its OOM-kill counter (v2 or v1). Standard library only.

When the kernel kills only a vLLM worker for the memory limit, vLLM's own last words vary
(`exit code: -9`, `exit code: None`, or just `cancelled`), and the container may exit with 1
rather than 137. The cgroup's oom_kill counter is what the kubelet itself reads: if it grew
while vLLM ran, host RAM ran out, whatever vLLM printed.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _memory_dirs() -> list[Path]:
    dirs = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hid, controllers, path = line.split(":", 2)
            if hid == "0":
                dirs.append(ROOT / path.lstrip("/"))  # v2 unified
            elif "memory" in controllers.split(","):
                dirs.append(ROOT / "memory" / path.lstrip("/"))  # v1
    except (OSError, ValueError):
        pass
    return dirs


def memory_limit() -> int | None:
    """The memory limit in bytes, or None when unlimited or unknown."""
    for d in _memory_dirs():
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                text = (d / name).read_text().strip()
            except OSError:
                continue
            if text != "max" and int(text) < 2**60:
                return int(text)
    return None


def oom_kills() -> int | None:
    """How many processes the kernel has OOM-killed in this cgroup, or None when unknown."""
    for d in _memory_dirs():
        for name in ("memory.events", "memory.oom_control"):
            try:
                for line in (d / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                continue
    return None


def killed_since(before: int | None) -> bool:
    after = oom_kills()
    return before is not None and after is not None and after > before
