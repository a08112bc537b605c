"""The operator's per-VLLMService write lock: one writer per object, and no memory kept for names
that are gone (a tenant may create and delete services for as long as the operator runs)."""

from __future__ import annotations

import gc
import threading

from vllm_autoheal.kube import writes


def test_writers_of_one_service_share_a_lock_and_other_services_do_not():
    held = writes.lock("team-a", "svc")
    with held:
        assert writes.lock("team-a", "svc") is held
        assert writes.lock("team-a", "svc").locked()
        assert not writes.lock("team-b", "svc").locked()


def test_a_lock_no_writer_holds_is_not_kept():
    before = len(writes._locks)
    for i in range(10_000):
        with writes.lock("churn", f"svc-{i}"):
            pass
    gc.collect()
    assert len(writes._locks) <= before + 1


def test_two_threads_writing_one_service_take_turns():
    inside, overlaps = [], []

    def write():
        for _ in range(200):
            with writes.lock("team-a", "busy"):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                inside.pop()

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlaps
