"""Under Ray's data-parallel backend the engine cores are Ray actors whose lines the API server prints under
its own prefix first. A client can write an actor's prefix byte for byte, so those lines are set aside:
a forged actor prefix decides nothing, and a real OOM there is a known, safe miss (strict xfails)."""

from __future__ import annotations

import re

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.scan import GAP_LINE

from crafted.bases import API, CLIENT_OOM, illegal_access_crash
from crafted.checks import cause_and_subtype, client_text_absent, diagnose
from crafted.reports import ASGI, STATS, serving_minute

# --- The Ray DP backend in the API server's process -------------------------------------------------
ACTOR = API + "(DPEngineCoreActor pid=2) "


RAY_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use."
)


RAY_START = [
    API + "INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0",
    API + "INFO 12-01 10:00:01 [utils.py:1] Creating placement groups for data parallel",
    ACTOR + "INFO 12-01 10:00:05 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with config: model='m'",
    ACTOR + "INFO 12-01 10:00:09 [gpu_model_runner.py:1] Starting to load model m...",
]


RAY_REMOTE = [
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 80, in __init__',
    "    self.model_executor = executor_class(vllm_config)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2000, in load_model',
    "    self.model = model_loader.load_model(",
    RAY_OOM,
]


RAY_DIED = (
    "The actor died because of an error raised in its creation task, ray::DPEngineCoreActor.__init__() (pid=2, "
    "ip=10.0.0.1, actor_id=abc, repr=<vllm.v1.engine.core.DPEngineCoreActor object at 0x7f>)"
)


ACTORS_COPY = [ACTOR + "Exception raised in creation task: " + RAY_DIED] + [ACTOR + r for r in RAY_REMOTE]


API_SERVERS_COPY = [
    API + "Traceback (most recent call last):",
    API + '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 300, in __init__',
    API + "    ray.get(refs)",
    API + "ray.exceptions.ActorDiedError: " + RAY_DIED,
] + [API + r for r in RAY_REMOTE]


def _ray(*parts: list[str]) -> str:
    return "".join(ln + "\n" for part in parts for ln in part)


@pytest.mark.xfail(
    strict=True,
    reason="a real OOM missed, the answer safe: with Ray in the API server's process and the "
    "actor's own copy of its error not forwarded, the API server's raw ActorDiedError copy is the only one and is "
    "dropped: says unknown allocation_failure_unplaced, should say weights_load_oom",
)
@pytest.mark.parametrize("start", [RAY_START, RAY_START[:2]], ids=["actor-lines-shown", "no-actor-line"])
def test_the_api_servers_copy_of_a_ray_actors_oom_decides_when_the_actors_copy_is_missing(start):
    d = classify(Signals(log=_ray(start, API_SERVERS_COPY)))
    assert cause_and_subtype(d) == ("weights_load_oom", "oom_in_load")


# --- What held ----------------------------------------------------------------------------------------------------
@pytest.mark.xfail(
    strict=True,
    reason="a limit, safe: under Ray DP every line of the engine's comes through the API server "
    "(its prefix outermost), and a client can write an actor's prefix byte for byte: set aside, the OOM is missed",
)
def test_the_ray_dp_shape_with_the_actors_copy_still_decides():
    log = _ray(RAY_START, ACTORS_COPY, API_SERVERS_COPY)
    assert cause_and_subtype(classify(Signals(log=log))) == ("weights_load_oom", "oom_in_load")


# --- A forged actor prefix in a genuine Ray DP log ---------------------------------------------
def _ray_crash() -> str:
    """illegal_access_crash() as the Ray DP backend prints it: the engine core is a Ray actor whose output the API server prints."""
    return re.sub(
        r"^\(EngineCore(?:_DP0)? pid=(\d+)\) ",
        lambda m: API + f"(DPEngineCoreActor pid={m.group(1)}) ",
        illegal_access_crash(),
        flags=re.MULTILINE,
    )


def _ray_window(last: str) -> str:
    return GAP_LINE + "\n" + (API + "hello\n") * 50 + API + last + "\n" + serving_minute(STATS) + _ray_crash()


def test_the_ray_dp_crash_names_no_direct_writer():
    assert all(ln.startswith(API) for ln in _ray_crash().splitlines())
    assert cause_and_subtype(diagnose(_ray_window("bye"))) == ("not_oom", "illegal_memory_access")


@pytest.mark.parametrize("pid", ["2441", "7"], ids=["actors-pid", "other-pid"])
def test_a_clients_forged_actor_prefix_in_a_ray_dp_log_decides_nothing(pid):
    harmless = diagnose(_ray_window("bye"))
    crafted = diagnose(_ray_window(f"(DPEngineCoreActor pid={pid}) " + CLIENT_OOM))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


def test_a_forged_actor_prefix_in_a_whole_report_of_a_ray_dp_log_decides_nothing():
    def log(last: str) -> str:
        report = "".join(API + ln + "\n" for ln in ASGI.splitlines()) + (API + "hello\n") * 5 + API + last + "\n"
        return "".join(ln + "\n" for ln in RAY_START) + report + serving_minute(STATS) + _ray_crash()

    harmless = diagnose(log("bye"))
    crafted = diagnose(log("(DPEngineCoreActor pid=2441) " + CLIENT_OOM))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless) == ("not_oom", "illegal_memory_access")
    assert client_text_absent(crafted)
