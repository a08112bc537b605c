"""The operator's on-disk cache of config.json files from the Hub, bounded.

Every (repo, revision, token) a VLLMService names leaves a file of up to 1 MiB on disk (a refused one
too), and the chart keeps the cache in /tmp, an emptyDir the kubelet evicts the pod past: one tenant
naming 72 padded revisions of a repo of its own, or about 2,000 public models, filled 64 MiB. After
a fetch, once enough was written since the last look, the least recently written repos go, whole
(their locks too), until the cache is within its budget. The newest go last: a fetch that has not read
its file yet finds it there (and where one was removed all the same, from_hub downloads it again).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

CACHE_BYTES = 24 << 20  # of the chart's 64 MiB /tmp
LOOK_EVERY_BYTES = 1 << 20  # written since the last look (the first fetch looks: the emptyDir outlives restarts)

_guard = threading.Lock()
_written_since_look: int | None = None  # None: not looked yet
MIN_WRITE = 32 << 10  # what a config of a few KiB takes on disk with its refs and snapshot link


def wrote(root: Path, size: int, budget: int = CACHE_BYTES) -> None:
    """A fetch wrote `size` bytes under `root` (its per-token caches): prune once enough was written.
    (Never raises: a cache that cannot be pruned is no reason to lose the config just read.)"""
    global _written_since_look
    with _guard:
        if _written_since_look is not None and _written_since_look + max(size, MIN_WRITE) < LOOK_EVERY_BYTES:
            _written_since_look += max(size, MIN_WRITE)
            return
        _written_since_look = 0
        try:
            prune(root, budget)
        except Exception:  # noqa: BLE001 - a file removed meanwhile, a cache another process writes
            pass


def disk_bytes(root: Path) -> int:
    """What the files under `root` take on disk (the kubelet's measure of an emptyDir: blocks, not sizes;
    a config of a few KiB with its refs and snapshot link takes about 32 KiB)."""
    total = 0
    for path in root.rglob("*"):
        try:
            total += path.lstat().st_blocks * 512
        except OSError:  # (removed meanwhile)
            pass
    return total


def _newest(path: Path) -> float:
    times = [path.lstat().st_mtime]
    for child in path.rglob("*"):
        try:
            times.append(child.lstat().st_mtime)
        except OSError:
            pass
    return max(times)


def prune(root: Path, budget: int) -> int:
    """Remove the least recently written repos under `root` (each folder there one huggingface_hub cache:
    a token's) until it takes at most `budget` bytes on disk; returns what it takes then. A repo goes
    whole, with its lock folder (its revisions may share a commit hash with another repo's), as the Hub
    CLI's delete-cache removes one; lock folders and caches left empty go too."""
    if not root.is_dir():
        return 0
    held = disk_bytes(root)
    if held <= budget:
        return held
    caches = [d for d in sorted(root.iterdir()) if d.is_dir()]
    repos = sorted(
        (_newest(repo), str(repo), repo, cache / ".locks" / repo.name)
        for cache in caches
        for repo in cache.iterdir()
        if repo.is_dir() and repo.name.split("--", 1)[0] in ("models", "datasets", "spaces")
    )
    for _at, _name, repo, locks in repos:
        if held <= budget:
            break
        for path in (repo, locks):
            if path.exists():
                held -= disk_bytes(path) + path.lstat().st_blocks * 512
                shutil.rmtree(path, ignore_errors=True)
    for cache in caches:  # (locks of repos gone, and caches left empty)
        locks = cache / ".locks"
        for lock in list(locks.iterdir()) if locks.is_dir() else []:
            if not (cache / lock.name).exists():
                shutil.rmtree(lock, ignore_errors=True)
        for empty in (locks, cache):
            try:
                empty.rmdir()
            except OSError:  # (not empty, or gone)
                pass
    return disk_bytes(root)
