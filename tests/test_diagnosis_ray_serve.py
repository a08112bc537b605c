"""Ray Serve's own log lines carry a request's words.

Under Ray Serve (Ray Serve LLM, a deployment of one's own wrapping vLLM) the replica's logger and its
print() (redirected to that logger) write `LEVEL YYYY-MM-DD HH:MM:SS,mmm <deployment> <replica id>
[<request id>] file.py:N - message` (ServeFormatter, ray/serve/_private/logging_utils.py). Inside a
request the request id is the client's X-Request-Id header, spaces and all, and the access line and
any print() of the request's text carry it. None of that is the engine's.
"""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import real_log
from crafted.checks import assert_same_diagnosis

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 70.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free. ZZUSERZZ"
)
KV = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, "
    "the estimated maximum model length is 16. ZZUSERZZ"
)
REPLICA = "(ServeReplica:default:LLMServer:qwen pid=77) "
SERVE = "{level} 2025-10-27 20:05:09,123 LLMServer:qwen 7xkz1bq2 "
# In a request: the X-Request-Id header's value, then the file and line of the call, then the message.
LINES = [
    SERVE + "{payload} replica.py:373 - POST /v1/chat/completions 200 12.3ms",  # the access line
    SERVE + "{payload} replica.py:373 - POST /v1/chat/completions 500 12.3ms",
    SERVE + "3f8a1b2c-77e1 server.py:88 - {payload}",  # the deployment's print() of the prompt
    SERVE + "3f8a1b2c-77e1 replica.py:1021 - Request failed: {payload}",
    # a request id that opens like the file and line of a line out of any request
    SERVE + "replica.py:1 - {payload} replica.py:373 - POST /v1/chat/completions 200 12.3ms",
]
BASES = ["not_oom-27571-qwen3next-illegal-memory-access", "kv-cache-too-small.log", "cg-15228-qwen25-v080"]


@pytest.mark.parametrize("base_name", BASES)
@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("payload", [OOM, KV])
@pytest.mark.parametrize("level", ["INFO", "ERROR"])
def test_a_request_id_or_print_in_ray_serves_replica_lines_changes_nothing(base_name, line, payload, level):
    """A real crash (an illegal memory access, a KV-cache shortage, a CUDA-graph OOM) and Ray Serve's
    request lines quoting another failure, before the crash and after it: the diagnosis is the crash's."""
    base_log = real_log(base_name)
    for prefix in ("", REPLICA):
        crafted = prefix + line.format(level=level, payload=payload)
        lines = base_log.splitlines()
        assert_same_diagnosis(crafted + "\n" + base_log, base_log)
        assert_same_diagnosis(
            "\n".join(lines[: len(lines) // 2] + [crafted] + lines[len(lines) // 2 :]) + "\n", base_log
        )
        assert_same_diagnosis(base_log.rstrip("\n") + "\n" + crafted + "\n", base_log)


def test_a_logging_format_of_ones_own_that_opens_like_serves_is_still_read():
    """vLLM under `%(levelname)s %(asctime)s %(name)s %(filename)s:%(lineno)d - %(message)s` (or a
    process name before the file): a vLLM logger's name or a file:line where Serve's component would be
    is no Serve line, and the engine's failure there is read."""
    oom = OOM.replace(" ZZUSERZZ", "")
    for opening in ("vllm.v1.engine.core core.py:710", "EngineCore_DP0 core.py:710"):
        d = classify(Signals(log=f"ERROR 2025-10-27 20:05:09,123 {opening} - {oom}\n"))
        assert d.numbers.get("tried_gib") == 70.0


START_UP_OOM = (
    "(ServeReplica:default:LLMServer pid=77) (EngineCore_DP0 pid=99) ERROR 10-27 20:05:10 [core.py:710] "
    "EngineCore failed to start.\n"
    "(ServeReplica:default:LLMServer pid=77) (EngineCore_DP0 pid=99) ERROR 10-27 20:05:10 [core.py:710] "
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free.\n"
)
PROXY = [
    "(ProxyActor pid=55) INFO 2025-10-27 20:05:01,123 proxy 10.0.0.5 3f8a1b2c-77e1 proxy.py:1235 - "
    "POST /v1/chat/completions 503 2.1ms",
    "(ServeReplica:default:LLMServer pid=77) INFO 2025-10-27 20:05:01,123 LLMServer 7xkz1bq2 3f8a1b2c-77e1 "
    "replica.py:373 - POST /v1/chat/completions 200 2.1ms",
]


@pytest.mark.parametrize("line", PROXY)
def test_a_request_serve_answered_while_the_engine_started_is_no_sign_it_served(line):
    """Serve's proxy takes requests (503, or queued) while a replica's engine is still starting: its
    request lines before an OOM that the log does not place must not make it a serving OOM (which
    changes the serving flags); the start-up OOM stays unplaced."""
    alone = classify(Signals(log=START_UP_OOM))
    crafted = classify(Signals(log=line + "\n" + START_UP_OOM))
    assert (crafted.cause, crafted.phase) == (alone.cause, alone.phase) == ("unknown", "unknown")
