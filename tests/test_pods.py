"""What a pod's own status says about its crashed run (kube/pods.py, pure)."""

from __future__ import annotations

import pytest

from vllm_autoheal.kube.pods import ready_before

RUN = {"startedAt": "2026-11-30T02:50:00Z", "finishedAt": "2026-11-30T03:00:00Z"}


def pod(status: str | None, changed: str | None) -> dict:
    if status is None:
        return {"status": {}}
    return {"status": {"conditions": [{"type": "Ready", "status": status, "lastTransitionTime": changed}]}}


@pytest.mark.parametrize(
    "status, changed, run, expected",
    [
        ("False", "2026-11-30T03:00:01Z", RUN, True),  # flipped to False at the crash: it had been ready
        ("False", "2026-11-30T02:55:00Z", RUN, True),  # a failed readiness probe while serving
        ("False", "2026-11-30T02:49:00Z", RUN, False),  # not ready since before the run
        ("False", "2026-11-30T02:50:03Z", RUN, False),  # the pod's first condition, seconds after the start
        ("True", "2026-11-30T03:05:00Z", RUN, None),  # a later run is ready: this one's readiness is gone
        (None, None, RUN, None),
        ("False", "not a time", RUN, None),
        ("False", "2026-11-30T03:00:01Z", {"finishedAt": "2026-11-30T03:00:00Z"}, None),  # no start time
    ],
)
def test_ready_before(status, changed, run, expected):
    assert ready_before(pod(status, changed), run) is expected
