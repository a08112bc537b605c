"""hub_cache: the operator's on-disk Hub cache is pruned to its budget, oldest revisions first, through
the real huggingface_hub client against the local Hub (tests/hub_server.py)."""

from __future__ import annotations

import json
import os

from vllm_autoheal import hub_cache
from vllm_autoheal.model_source import HubSettings, from_hub

from hub_server import CONFIGS, Hub, Repo


def test_the_oldest_repos_go_first_and_a_pruned_config_is_fetched_again(tmp_path):
    config = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    hub = Hub(repos={})
    server, hub.url = hub.serve()
    root = tmp_path / "by-token"
    settings = HubSettings(endpoint=hub.url, cache_dir=str(root / "anonymous"), timeout_s=10)
    names = [f"t/m{i}" for i in range(8)]
    try:
        for i, name in enumerate(names):
            padded = json.dumps({**config, "_pad": "x" * 300_000, "_i": i}).encode()
            hub.repos[name] = Repo({"config.json": padded})
            assert from_hub(name, None, settings, False)["num_hidden_layers"] == 32
            folder = root / "anonymous" / f"models--t--m{i}"
            for path in (folder, *folder.rglob("*")):
                os.utime(path, (1_000 + i, 1_000 + i), follow_symlinks=False)
        held = hub_cache.prune(root, 1 << 20)
        assert held <= 1 << 20 and hub_cache.disk_bytes(root) <= 1 << 20
        kept = sorted(int(p.name.removeprefix("models--t--m")) for p in (root / "anonymous").glob("models--*"))
        assert kept and kept == list(range(8 - len(kept), 8))  # the newest stay
        assert sorted(p.name for p in (root / "anonymous" / ".locks").iterdir()) == [f"models--t--m{i}" for i in kept]
        assert from_hub(names[0], None, settings, False)["num_hidden_layers"] == 32  # (a pruned one: fetched again)
    finally:
        server.shutdown()
        server.server_close()


def test_a_cache_that_cannot_be_pruned_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_cache, "_written_since_look", None)

    def broken(root, budget):
        raise PermissionError("read-only")

    monkeypatch.setattr(hub_cache, "prune", broken)
    hub_cache.wrote(tmp_path, 10)  # (no exception: the config just read still serves)
