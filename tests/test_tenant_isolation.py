"""One tenant's crashing pods must not hold up another tenant's heal: the real kopf operator
against kmock, with the shared resources (kopf's worker threads, the API client) under load."""

from __future__ import annotations

import asyncio
import time

import pytest

from operator_harness import Emulator, wait_for
from samples import KV_TERMINATION, PLAIN_SPEC

pytestmark = pytest.mark.kmock(cls=Emulator)
SPEC = {**PLAIN_SPEC, "heal": {"backoffSeconds": 0}}


async def test_a_tenant_whose_crash_logs_stall_does_not_delay_another_tenants_heal(cluster, kmock):
    # Tenant A: more replicas than kopf has worker threads crash without a termination message,
    # and the kubelet never finishes sending their logs (a node that hangs). Tenant B: one crash
    # the launcher explained. Each log read was given the request timeout, and urllib3 repeated a
    # GET that timed out 3 more times (2 minutes a pod with the default 30 s), then the error
    # lost A's crash; B waited for a worker all that time. Now a log read has a budget (the
    # request timeout here, 5 s), and A's crashes are recorded without their logs.
    await cluster.create_vsvc("stuck", SPEC)
    await cluster.create_vsvc("other", SPEC)
    await cluster.settled("stuck")
    await cluster.settled("other")
    kmock.fail("GET", "/log", delay=120, times=1000)
    for i in range(10):
        await cluster.crash_pod("stuck", f"stuck-{i}")
    await asyncio.sleep(1.0)
    started = time.monotonic()
    await cluster.crash_pod("other", "other-a", message=KV_TERMINATION)
    await cluster.heal_recorded("other")
    assert time.monotonic() - started < 8.0
    await wait_for(
        lambda: len(((cluster.vsvc_now("stuck") or {}).get("status") or {}).get("observedCrashes") or []) == 10,
        what="every crash of the tenant whose logs stall recorded",
    )
