"""The memory cgroup as a container sees it, on cgroup v1 and v2, with and without a cgroup
namespace, and files that are missing, unreadable or odd: never an exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_autoheal import cgroups

V1_HOST_PATH = "/kubepods/burstable/pod1234/abcdef"


@pytest.fixture
def fs(tmp_path, monkeypatch):
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    root.mkdir()
    monkeypatch.setattr(cgroups, "ROOT", root)
    monkeypatch.setattr(cgroups, "PROC_CGROUP", proc)

    def write(proc_text: str, files: dict[str, str]) -> Path:
        proc.write_text(proc_text)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return root

    return write


def test_v2_with_a_cgroup_namespace(fs):
    fs("0::/\n", {"memory.max": "34359738368\n", "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n"})
    assert cgroups.memory_limit() == 32 * 2**30
    assert cgroups.oom_kills() == 2


def test_v2_unlimited(fs):
    fs("0::/\n", {"memory.max": "max\n"})
    assert cgroups.memory_limit() is None


def test_v1_without_a_cgroup_namespace_reads_the_containers_own_mount(fs):
    """On cgroup v1 nodes /proc/self/cgroup names the host's path, and the container's memory cgroup is
    mounted at /sys/fs/cgroup/memory itself: the limit and the OOM kills were never found there."""
    fs(
        f"12:memory:{V1_HOST_PATH}\n11:cpu,cpuacct:{V1_HOST_PATH}\n",
        {
            "memory/memory.limit_in_bytes": "17179869184\n",
            "memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
        },
    )
    assert cgroups.memory_limit() == 16 * 2**30
    assert cgroups.oom_kills() == 4


def test_v1_unlimited_is_a_huge_number(fs):
    fs("12:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert cgroups.memory_limit() is None


@pytest.mark.parametrize("text", ["", "garbage\n", "-1\n", "0\n", "12.5\n"])
def test_an_odd_limit_file_is_unknown_and_raises_nothing(fs, text):
    fs("0::/\n", {"memory.max": text})
    assert cgroups.memory_limit() is None


def test_malformed_or_missing_proc_cgroup_raises_nothing(fs):
    fs("garbage\n0::/\n", {"memory.max": "1073741824\n"})
    assert cgroups.memory_limit() == 2**30
    cgroups.PROC_CGROUP.unlink()
    assert cgroups.memory_limit() == 2**30  # (the mount's root still tells)
    assert cgroups.oom_kills() is None
    assert cgroups.killed_since(None) is False


def test_an_unreadable_file_is_unknown(fs):
    root = fs("0::/\n", {})
    (root / "memory.max").mkdir()  # (reading a directory fails, as an unreadable file would)
    assert cgroups.memory_limit() is None


@pytest.fixture
def meminfo(tmp_path, monkeypatch):
    path = tmp_path / "meminfo"
    monkeypatch.setattr(cgroups, "MEMINFO", path)
    return path


def test_host_memory_is_the_limit_where_one_is_set(fs, meminfo):
    fs("0::/\n", {"memory.max": str(32 * 2**30)})
    meminfo.write_text("MemTotal:       263842012 kB\nMemAvailable:   201234567 kB\n")
    assert cgroups.host_memory() == 32 * 2**30


def test_host_memory_is_what_is_available_on_a_machine_without_a_limit(fs, meminfo):
    fs("0::/\n", {"memory.max": "max"})
    meminfo.write_text("MemTotal:       263842012 kB\nMemFree:   1000 kB\nMemAvailable:   201234567 kB\n")
    assert cgroups.host_memory() == 201234567 * 1024


@pytest.mark.parametrize(
    "text", ["", "MemAvailable:\n", "MemAvailable: lots kB\n", "MemAvailable: -5 kB\n", "MemAvailable: 1e400 kB\n"]
)
def test_an_odd_or_missing_meminfo_is_unknown_and_raises_nothing(fs, meminfo, text):
    fs("0::/\n", {"memory.max": "max"})
    if text:
        meminfo.write_text(text)
    assert cgroups.host_memory() is None
