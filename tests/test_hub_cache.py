"""hub_cache: the operator's on-disk Hub cache is pruned to its budget, oldest revisions first, through
the real huggingface_hub client against the local Hub (tests/hub_server.py)."""

from __future__ import annotations

import json
import os

from vllm_autoheal import hub_cache
from vllm_autoheal.model_source import HubSettings, from_hub

from hub_server import CONFIGS, Hub, Repo


def test_the_oldest_revisions_go_first_and_a_pruned_config_is_fetched_again(tmp_path):
    config = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    hub = Hub(repos={})
    server, hub.url = hub.serve()
    root = tmp_path / "by-token"
    settings = HubSettings(endpoint=hub.url, cache_dir=str(root / "anonymous"), timeout_s=10)
    commits = [f"{i:040x}" for i in range(1, 9)]
    try:
        for i, commit in enumerate(commits):
            padded = json.dumps({**config, "_pad": "x" * 300_000, "_i": i}).encode()
            hub.repos["t/m"] = Repo({"config.json": padded}, revisions=(commit,), commit=commit)
            assert from_hub("t/m", commit, settings, False)["num_hidden_layers"] == 32
            snapshots = root / "anonymous" / "models--t--m" / "snapshots"
            os.utime(snapshots / commit / "config.json", (1_000 + i, 1_000 + i), follow_symlinks=True)
        held = hub_cache.prune(root, 1 << 20)
        assert held <= 1 << 20 and hub_cache.disk_bytes(root) <= 1 << 20
        kept = sorted(p.name for p in snapshots.iterdir())
        assert kept and kept == commits[-len(kept) :]  # the newest stay
        # a revision pruned is fetched again when named (the Hub still has the newest commit only)
        hub.repos["t/m"] = Repo(
            {"config.json": json.dumps(config).encode()}, revisions=(commits[0],), commit=commits[0]
        )
        assert from_hub("t/m", commits[0], settings, False)["num_hidden_layers"] == 32
    finally:
        server.shutdown()
        server.server_close()


def test_a_cache_that_cannot_be_pruned_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_cache, "_written_since_look", None)

    def broken(root, budget):
        raise PermissionError("read-only")

    monkeypatch.setattr(hub_cache, "prune", broken)
    hub_cache.wrote(tmp_path, 10)  # (no exception: the config just read still serves)
