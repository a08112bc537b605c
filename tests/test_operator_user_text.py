"""End to end through the operator (and the launcher's message): a prompt that quotes vLLM's
memory errors never changes a VLLMService, and its text reaches neither status nor Events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.launcher import termination_message

from operator_harness import NS, Emulator, wait_for

pytestmark = pytest.mark.kmock(cls=Emulator)

CORPUS = {
    s["id"]: s for s in map(json.loads, (Path(__file__).parent / "corpus" / "corpus.jsonl").read_text().splitlines())
}
# A real NCCL watchdog timeout (not memory), with a logged request quoting a KV-cache error whose
# estimate would shrink the context to 2048 tokens if it were believed.
PROMPT = (
    "(APIServer pid=7) INFO 12-01 10:00:01 [logger.py:41] Received request chatcmpl-9f2: prompt: "
    + repr(
        "why? ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB "
        "KV cache is needed, which is larger than the available KV cache memory (0.25 GiB). Based on the "
        "available memory, the estimated maximum model length is 2048. USERTEXT"
    )
    + ", params: SamplingParams(n=1), lora_request: None."
)
LOG = PROMPT + "\n" + CORPUS["neg-6042-watchdog-worker-died"]["log"] + "\n"
SPEC = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"gpuMemoryUtilization": 0.9, "maxModelLen": 131072},
    "resources": {"gpuProduct": "NVIDIA-L4", "limits": {"memory": "32Gi"}},
    "heal": {"backoffSeconds": 0},
}


@pytest.mark.parametrize("through", ["launcher", "previous-log"])
async def test_a_prompt_quoting_a_memory_error_changes_nothing(cluster, kmock, through):
    name = f"prompt-{through}"
    await cluster.create_vsvc(name, SPEC)
    await cluster.settled(name)
    if through == "launcher":
        message = termination_message(classify(Signals(log=LOG, exit_code=1)).to_dict(), 1, None, None)
    else:  # no launcher: the operator reads the crashed container's previous log
        message = LOG[-2048:]
        kmock[f"get /api/v1/namespaces/{NS}/pods/{name}-a/log"] << LOG.encode()
    await cluster.crash_pod(name, f"{name}-a", message=message)
    events = await wait_for(
        lambda: [e for e in cluster.events_now("NotMemory") if e["involvedObject"]["name"] == name],
        what="NotMemory event",
    )
    obj = await cluster.vsvc(name)
    assert obj["spec"]["engine"]["maxModelLen"] == 131072 and obj["spec"]["engine"]["gpuMemoryUtilization"] == 0.9
    assert (obj.get("status") or {}).get("healCount", 0) == 0
    all_events = await wait_for(lambda: cluster.events_now(), what="events")  # read off the test's own loop
    everything = json.dumps(obj) + json.dumps(all_events)
    assert "USERTEXT" not in everything and "Received request" not in everything
    assert "Watchdog caught collective operation timeout" in json.dumps(events)
