"""A request's KV transfer parameters in the NIXL connector's failure report are the client's words.

In P/D disaggregation (NixlConnector, vLLM 0.10+) a completion request carries `kv_transfer_params`
(`remote_engine_id`, `remote_host`, `remote_port`, `remote_block_ids`), set by a P/D proxy or by any
client that reaches the decode instance. A failed handshake with that remote is logged by the worker
as `NIXL transfer failure: handshake_setup_failed | Context: {'failure_type': ..., 'request_id': None,
'engine_id': ..., 'remote_engine_id': <the client's>}` with the exception's traceback under it; the
request is failed, the engine goes on. Nothing in it is the engine's own failure.
"""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import real_log

BASES = ["not_oom-27571-qwen3next-illegal-memory-access", "kv-cache-too-small.log", "cg-15228-qwen25-v080"]

HEADER = "(Worker_DP0_TP0_EP0 pid=1539019) ERROR 10-27 20:05:01 [nixl_connector.py:1050] "
PAYLOADS = [
    "CUDA out of memory. Tried to allocate 70.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.10 GiB is free. ZZUSERZZ",
    "OOMKilled ZZUSERZZ",
    "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, which "
    "is larger than the available KV cache memory (0.01 GiB). ZZUSERZZ",
]


def _report(remote_engine_id: str, quote: str) -> str:
    context = {
        "failure_type": "handshake_setup_failed",
        "request_id": None,
        "engine_id": "5f1c1e0a-4b8e-4d1e-9a43-0c2f4f7e9b11",
        "remote_engine_id": remote_engine_id,
    }
    if quote == '"':
        context_text = json.dumps(context)
    else:
        context_text = repr(context)
    message = [
        "NIXL transfer failure: handshake_setup_failed | Context: " + context_text,
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/'
        'nixl_connector.py", line 1261, in done_callback',
        "    self._remote_agents[eid] = f.result()",
        "zmq.error.Again: Resource temporarily unavailable",
    ]
    return "\n".join(HEADER + part for part in message)


@pytest.mark.parametrize("base_name", BASES)
@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_remote_engine_id_in_the_nixl_failure_context_changes_nothing(base_name, payload, quote):
    """A real crash and the connector's report of a failed handshake with a client's remote engine id
    quoting a memory failure, before the crash and after it: the diagnosis is the crash's (the illegal
    memory access had become `unknown`, and the client's OOM figures were taken)."""
    base_log = real_log(base_name)
    base = classify(Signals(log=base_log)).to_dict()
    base.pop("notes")
    report = _report(payload, quote)
    for log in (report + "\n" + base_log, base_log.rstrip("\n") + "\n" + report + "\n"):
        crafted = classify(Signals(log=log)).to_dict()
        assert "ZZUSERZZ" not in json.dumps(crafted)
        crafted.pop("notes")
        assert crafted == base
