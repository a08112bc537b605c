"""The operator's on-disk cache of config.json files from the Hub, bounded.

Every (repo, revision, token) a VLLMService names leaves a file of up to 1 MiB on disk (a refused one
too), and the chart keeps the cache in /tmp, an emptyDir the kubelet evicts the pod past: one tenant
naming 72 padded revisions of a repo of its own, or about 2,000 public models, filled 64 MiB. After
a fetch, once enough was written since the last look, the oldest revisions go until the cache is
within its budget (huggingface_hub's own scan and delete, so blobs shared by revisions are kept while
used). The newest go last: a fetch that has not read its file yet finds it there (and where one was
removed all the same, from_hub downloads it again).
"""

from __future__ import annotations

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


def prune(root: Path, budget: int) -> int:
    """Delete the least recently written revisions under `root` until it takes at most `budget` bytes on
    disk; returns what it takes then. Each folder under `root` is one huggingface_hub cache."""
    from huggingface_hub import scan_cache_dir

    if not root.is_dir():
        return 0
    held = disk_bytes(root)
    if held <= budget:
        return held
    caches = [scan_cache_dir(d) for d in sorted(root.iterdir()) if d.is_dir()]
    revisions = sorted(
        (rev.last_modified, index, rev.commit_hash)
        for index, cache in enumerate(caches)
        for repo in cache.repos
        for rev in repo.revisions
    )
    for _modified, index, commit in revisions:
        if held <= budget:
            break
        strategy = caches[index].delete_revisions(commit)
        # (a repo whose last revision goes is removed whole: its folder holds the rest)
        paths = list(strategy.repos) or [*strategy.blobs, *strategy.snapshots, *strategy.refs]
        freed = sum(disk_bytes(p) + p.lstat().st_blocks * 512 for p in paths if p.exists() or p.is_symlink())
        strategy.execute()
        held -= freed
    return held
