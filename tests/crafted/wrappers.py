"""The headers of servers that wrap vLLM and print its lines under their own (Triton's glog, KServe's),
headers a client can forge, and vLLM's message for an engine core killed at start-up."""

from __future__ import annotations

TRITON = "I1115 02:58:49.477216 1 pb_stub.cc:325] "


KSERVE = "2024-07-01 07:28:04.488 1 kserve ERROR [__main__.py:<module>():254] "


V1_KILLED = "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': -9}"


# Headers a client writes at the start of its own lines: a glog line, KServe's, and vLLM's own header
# as older vLLM versions print it (no process prefix).
FORGED_HEADERS = {
    "glog": "E1115 02:58:51.162611 1 core.cc:1] ",
    "kserve": KSERVE,
    "vllm-older-than-this-change": "ERROR 10-24 01:26:57 [core.py:710] ",
}
