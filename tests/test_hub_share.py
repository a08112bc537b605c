"""Each namespace's share of the Hub (model_source): a fetch that answers at once or is cancelled gives
its share back, and one tenant cannot hold every fetch the operator has."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from vllm_autoheal import model_source
from vllm_autoheal.model_config import ModelConfigError
from vllm_autoheal.model_source import HubSettings

SMALL = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}


class Inline:
    """A pool whose fetch has finished by the time submit returns: a fast answer (a refused
    connection, a 404) racing the handler that started it."""

    def submit(self, fn):
        future: Future = Future()
        future.set_result(fn())
        return future


@pytest.fixture
def hub(monkeypatch):
    # (an earlier test's fetch still running in the module's pool would store its answer into the cache
    # these tests fill: wait for it first)
    if isinstance(model_source._pool, ThreadPoolExecutor):
        model_source._pool.shutdown(wait=True)
        model_source._pool = None  # (configure starts a fresh one, which the monkeypatch gives back after)
    model_source.configure(HubSettings(endpoint="http://127.0.0.1:9", timeout_s=1))
    monkeypatch.setattr(model_source, "_pool", Inline())
    yield
    monkeypatch.setattr(model_source, "_pool", None)
    model_source.configure(HubSettings())


def test_a_fetch_that_answers_at_once_is_asked_again_once_its_answer_expires(hub, monkeypatch):
    """A transient error (the Hub unreachable for a moment) is kept ERROR_TTL_S, then asked again.
    A fetch done before its callback was attached left its future in _inflight for ever: every later
    lookup of the model read that first error back, and the Hub was never asked again."""
    answers = iter([ModelConfigError("the Hub could not be reached"), dict(SMALL)])

    def from_hub(*_):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(model_source, "from_hub", from_hub)
    monkeypatch.setattr(model_source, "ERROR_TTL_S", -1.0)  # expired as soon as kept
    first = model_source._hub_cached("acme/m", None, None, "team-a")
    assert first.error and not first.ok
    again = model_source._hub_cached("acme/m", None, None, "team-a")
    assert again.ok, again
    assert not model_source._inflight and not model_source._fetching


def test_a_cancelled_fetch_frees_its_namespaces_share(hub, monkeypatch):
    """A fetch cancelled before it ran (a pool shut down) has no result: its done-callback raised,
    the share was never given back and the future stayed in flight, so after two the namespace
    answered Pending for ever."""
    queued: list[Future] = []

    class Never:
        def submit(self, fn):
            queued.append(Future())
            return queued[-1]

    monkeypatch.setattr(model_source, "_pool", Never())
    monkeypatch.setattr(model_source, "timeout_s", lambda: 0.01)
    model_source._hub = HubSettings(endpoint="http://127.0.0.1:9", timeout_s=0.01)
    for model in ("acme/a", "acme/b"):
        assert model_source._hub_cached(model, None, None, "team-a").pending
    for future in queued:
        future.cancel()
    assert not model_source._fetching and not model_source._inflight


def test_two_namespaces_of_one_tenant_do_not_hold_every_hub_fetch(monkeypatch):
    """A tenant with two namespaces, while the Hub hangs on its models, took all 4 of the pool's
    fetches: another tenant's lookup, which the Hub answers at once, was Pending (on the crash path,
    a heal planned without the model's shape). The pool holds HUB_FETCHES, 16 namespaces' shares."""
    import threading

    hang = threading.Event()

    def from_hub(repo_id, *_):
        if repo_id.startswith("acme/"):
            hang.wait(5)
        return dict(SMALL)

    monkeypatch.setattr(model_source, "from_hub", from_hub)
    model_source.configure(HubSettings(endpoint="http://127.0.0.1:9", timeout_s=0.3))
    try:
        for ns in ("acme-1", "acme-2"):
            for i in range(2):
                threading.Thread(target=model_source._hub_cached, args=(f"acme/{ns}-{i}", None, None, ns)).start()
        threading.Event().wait(0.1)
        assert model_source._hub_cached("other/model", None, None, "team-b").ok
    finally:
        hang.set()
        model_source.configure(HubSettings())


def test_a_tenant_naming_many_models_pushes_out_its_own_answers_not_anothers(hub, monkeypatch):
    """The cache was first-in-first-out across all namespaces: a tenant naming many models (or
    revisions, which cost nothing to invent) pushed out the answers another tenant's services read,
    and each of those reconciles asked the Hub again, waiting on it."""
    asked: list[str] = []

    def from_hub(repo_id, *_):
        asked.append(repo_id)
        return dict(SMALL)

    monkeypatch.setattr(model_source, "from_hub", from_hub)
    monkeypatch.setattr(model_source, "MAX_CACHED", 8)
    for repo in ("acme/a", "acme/b"):
        assert model_source._hub_cached(repo, None, None, "team-a").ok
    for n in range(50):
        assert model_source._hub_cached("flood/m", f"rev{n}", None, "team-b").ok
    assert len(model_source._cache) == 8
    asked.clear()
    for repo in ("acme/a", "acme/b"):
        assert model_source._hub_cached(repo, None, None, "team-a").ok
    assert asked == []  # both still kept: team-a's answers were never pushed out
    assert model_source._hub_cached("flood/m", "rev0", None, "team-b").ok and asked == ["flood/m"]


def test_expired_answers_leave_a_full_cache_first(hub, monkeypatch):
    monkeypatch.setattr(model_source, "from_hub", lambda *_: dict(SMALL))
    monkeypatch.setattr(model_source, "MAX_CACHED", 4)
    for n in range(2):
        model_source._hub_cached("kept/m", f"rev{n}", None, "team-a")
    monkeypatch.setattr(model_source, "OK_TTL_S", -1.0)  # expired as soon as kept
    for n in range(2):
        model_source._hub_cached("old/m", f"rev{n}", None, "team-b")
    monkeypatch.setattr(model_source, "OK_TTL_S", 3600.0)
    for n in range(2, 4):
        model_source._hub_cached("kept/m", f"rev{n}", None, "team-a")
    assert sorted(k[2] for k in model_source._cache) == ["rev0", "rev1", "rev2", "rev3"]
    assert all(k[1] == "kept/m" and stored_by == "team-a" for k, (_, _, stored_by) in model_source._cache.items())
