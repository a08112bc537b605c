"""Access logs and request traces in the formats the stacks around vLLM print: the client's words.

uvicorn's default access line (`INFO:     127.0.0.1:1 - "GET / HTTP/1.1" 200 OK`) is known already.
KServe (python/kserve/kserve/logging.py) prints its own: `<time> uvicorn.access INFO:     <client>
<pid> - "<request line>" <status>`, and its trace logger `<time> <pid> kserve.trace requestId: <the
x-request-id header>, preprocess_ms: ...`; a logging config of one's own may put uvicorn's fields in
any order. A request line's target (its query string) needs no space to name a memory failure
(`OOMKilled`, `torch.OutOfMemoryError`), and a request id may hold spaces.
"""

from __future__ import annotations

import pytest

from crafted.bases import real_log
from crafted.checks import assert_same_diagnosis, placed

BASES = ["not_oom-27571-qwen3next-illegal-memory-access", "kv-cache-too-small.log", "cg-15228-qwen25-v080"]

# Words a request line's target can carry without a space, each one a memory failure's.
TARGETS = ["OOMKilled", "torch.OutOfMemoryError", "CUDA_ERROR_OUT_OF_MEMORY", "std::bad_alloc", "MemoryError"]
ACCESS_LINES = [
    # KServe's uvicorn_access formatter
    '2025-10-27 20:05:09.123 uvicorn.access INFO:     10.0.0.1:52000 1 - "GET /v1/models?q={t}ZZUSERZZ HTTP/1.1" 200 OK',
    # formats of one's own for uvicorn's AccessFormatter
    '[2025-10-27 20:05:09 +0000] uvicorn.access     INFO:     10.0.0.1:52000 - "POST /v1/completions?{t}ZZUSERZZ '
    'HTTP/1.1" 500',
    'INFO - 2025-10-27 20:05:09,123 - 10.0.0.1:52000 - "GET /{t}ZZUSERZZ HTTP/1.1" 404',
    '2025-10-27 20:05:09,123|INFO:    |10.0.0.1:52000|"GET /health?{t}ZZUSERZZ HTTP/1.1"|200',
]


@pytest.mark.parametrize("base_name", BASES)
@pytest.mark.parametrize("line", ACCESS_LINES)
def test_a_request_lines_target_in_any_access_format_changes_nothing(base_name, line):
    """A real crash (an illegal memory access, a KV-cache shortage, a CUDA-graph OOM) and access lines
    whose query names a memory failure: the diagnosis is the crash's (the illegal memory access had
    become a kernel OOM kill under KServe's access format)."""
    base_log = real_log(base_name)
    for target in TARGETS:
        for log in placed(base_log, line.format(t=target)):
            assert_same_diagnosis(log, base_log)


KSERVE_TRACE = (
    "2025-10-27 20:05:09.123 1 kserve.trace requestId: {rid}, preprocess_ms: 0.102, explain_ms: 0, "
    "predict_ms: 1211.9, postprocess_ms: 0.087"
)
REQUEST_IDS = [
    "OOMKilled-ZZUSERZZ",
    "CUDA out of memory. Tried to allocate 70.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.10 GiB is free. ZZUSERZZ",
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). ZZUSERZZ",
]


@pytest.mark.parametrize("base_name", BASES)
@pytest.mark.parametrize("rid", REQUEST_IDS)
def test_a_request_id_in_kserves_trace_line_changes_nothing(base_name, rid):
    """KServe's trace line names the request by the client's x-request-id header, in camel case
    (`requestId:`): the line is the request's (it had made an illegal memory access a kernel OOM kill)."""
    base_log = real_log(base_name)
    for log in placed(base_log, KSERVE_TRACE.format(rid=rid)):
        assert_same_diagnosis(log, base_log)
