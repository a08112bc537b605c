"""Hostile review (steer3): a client's text that steers the diagnosis. Each xfail test shows a real log
diagnosed one way without the client's text and another way (or quoting it) with it; the passing tests
document attacks that are already defended.

The access line's query string is the client's, byte for byte. uvicorn (protocols/utils.py,
get_path_with_query_string) quotes the path but appends `scope["query_string"].decode("ascii")` as the
client sent it, and both of uvicorn's HTTP parsers take a `"` there: h11's request target is `vchar+`
(0x21-0x7e), llhttp's STRICT_URL_CHAR (nodejs/llhttp src/llhttp/constants.ts) lists `'"'`, and its
default (non-strict) URL_CHAR adds `\\t` and `\\f` (httptools, uvicorn's default parser where installed,
as `fastapi[standard]` in vLLM's requirements installs it). origin._REQUEST_LINE, which tells an access
line in any format but uvicorn's bare default, wants the target to be `[^\\s"]{1,2000}` up to ` HTTP/`:
one `"` or a tab in the query and the line is the engine's, its words a failure.
"""

from __future__ import annotations

import json

import pytest

from crafted.bases import real_log
from crafted.checks import assert_same_diagnosis, assert_unchanged, diagnose, placed
from crafted.exceptions import preprocess_error

NOT_MEMORY = "not_oom-27571-qwen3next-illegal-memory-access"  # a real illegal memory access: not_oom


# --- Findings -----------------------------------------------------------------------------------------------

# The access formats tests/test_diagnosis_access_formats.py already reads (KServe's uvicorn_access
# formatter, python/kserve/kserve/logging.py: `%(asctime)s.%(msecs)03d %(name)s %(levelprefix)s
# %(client_addr)s %(process)s - "%(request_line)s" %(status_code)s`; formats of one's own for uvicorn's
# AccessFormatter), with a `"` (either parser) or a tab (httptools) in the query string.
QUOTED_QUERY = {
    "kserve-quote": '2025-10-27 20:05:09.123 uvicorn.access INFO:     10.0.0.1:52000 1 - "GET /v1/models?q="{t}'
    'ZZUSERZZ HTTP/1.1" 200 OK',
    "kserve-tab": '2025-10-27 20:05:09.123 uvicorn.access INFO:     10.0.0.1:52000 1 - "GET /v1/models?q=\t{t}'
    'ZZUSERZZ HTTP/1.1" 200 OK',
    "bracketed-quote": '[2025-10-27 20:05:09 +0000] uvicorn.access     INFO:     10.0.0.1:52000 - "POST '
    '/v1/completions?"{t}ZZUSERZZ HTTP/1.1" 500',
    "dashes-quote": 'INFO - 2025-10-27 20:05:09,123 - 10.0.0.1:52000 - "GET /?"{t}ZZUSERZZ HTTP/1.1" 404',
    "pipes-quote": '2025-10-27 20:05:09,123|INFO:    |10.0.0.1:52000|"GET /health?"{t}ZZUSERZZ HTTP/1.1"|200',
}


@pytest.mark.parametrize("fmt", sorted(QUOTED_QUERY))
def test_a_quote_or_tab_in_the_query_does_not_make_an_access_line_the_engines(fmt):
    """uvicorn 0.2x/0.3x access line under KServe's formatter (or a format of one's own), the client's
    query holding `"OOMKilled`: a real not_oom (illegal memory access, vLLM on an H100) became
    host_ram_oom / kernel_oom_killer (or `unknown` signals_disagree), with the access line as its
    evidence. tests/test_diagnosis_access_formats.py covers the same lines without the `"`."""
    base_log = real_log(NOT_MEMORY)
    assert diagnose(base_log).cause == "not_oom"
    for log in placed(base_log, QUOTED_QUERY[fmt].format(t="OOMKilled-")):
        assert_same_diagnosis(log, base_log)


def test_a_query_longer_than_the_origin_check_reads_keeps_the_line_an_access_lines():
    """h11 takes a request line up to 16 KiB: the query's failure words come first, its ` HTTP/1.1"` close
    past the first 2 KiB of the line that the origin check reads for the opening."""
    base_log = real_log(NOT_MEMORY)
    long_query = QUOTED_QUERY["kserve-quote"].replace("ZZUSERZZ", "x" * 6000)
    for log in placed(base_log, long_query.format(t="OOMKilled-")):
        assert_same_diagnosis(log, base_log)


def test_a_quoted_query_does_not_set_the_pipeline_size():
    """vLLM 0.32 CPU run (tests/fixtures/vllm-cpu/kv-cache-too-small.log: max seq len 1048576, KV cache
    1 GiB) -> kv_cache_insufficient / max_model_len_exceeds_kv_capacity. A KServe-format access line
    before the engine's refusal with `?"tensor_parallel_size=8&pipeline_parallel_size=4` in its query
    -> multi_gpu_oom / kv_check_fails_on_smallest_stage (markers.py's tp/pp figures need no space)."""
    base_log = real_log("kv-cache-too-small.log")
    line = (
        '2025-10-27 20:05:09.123 uvicorn.access INFO:     10.0.0.1:52000 1 - "GET /v1/models?"'
        'tensor_parallel_size=8&pipeline_parallel_size=4 HTTP/1.1" 200 OK'
    )
    lines = base_log.splitlines()
    at = next(i for i, ln in enumerate(lines) if "To serve at least one" in ln)
    crafted = "\n".join(lines[:at] + [line] + lines[at:]) + "\n"
    assert diagnose(base_log).cause == "kv_cache_insufficient"
    assert_same_diagnosis(crafted, base_log)


# --- Defended (passing) ---------------------------------------------------------------------------------------

# uvicorn's own default access line (`%s - "%s %s HTTP/%s" %d`) is matched from its start (origin._ACCESS),
# so a `"` in its query changes nothing: bare (vLLM <= 0.10.0 and 0.31+), under the API server's prefix
# (0.10.1 to 0.30), under `kubectl logs --timestamps`' RFC 3339 stamp.
DEFAULT_QUOTED = [
    'INFO:     10.0.0.1:52000 - "GET /v1/models?q=OOMKilled-ZZUSERZZ" HTTP/1.1" 404 Not Found',
    '(APIServer pid=7) INFO:     10.0.0.1:52000 - "GET /v1/models?q=OOMKilled-ZZUSERZZ" HTTP/1.1" 404 Not Found',
    '2025-10-27T20:05:09.123456789Z INFO:     10.0.0.1:52000 - "GET /v1/models?q="OOMKilled-ZZUSERZZ HTTP/1.1" 404 '
    "Not Found",
    # X-Forwarded-For under FORWARDED_ALLOW_IPS=* (uvicorn middleware/proxy_headers.py): the client's address,
    # spaces and all; the line's INFO level keeps its words from deciding
    'INFO:     torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB ZZUSERZZ:0 - "GET '
    '/v1/models?" HTTP/1.1" 404 Not Found',
]


@pytest.mark.parametrize("line", DEFAULT_QUOTED)
def test_a_quote_in_the_query_of_uvicorns_default_access_line_changes_nothing(line):
    base_log = real_log(NOT_MEMORY)
    for log in placed(base_log, line):
        assert_same_diagnosis(log, base_log)


def test_a_quote_in_the_query_of_a_json_access_record_changes_nothing():
    """vLLM 0.32's `--logging-config.formatter json` prints uvicorn's records too (docs: "one JSON object
    per vLLM and Uvicorn log record"); the access record's message opens with the client's address."""
    record = {
        "asctime": "2026-12-02 07:35:51,400",
        "levelname": "INFO",
        "name": "uvicorn.access",
        "processName": "MainProcess",
        "process": 17985,
        "message": '10.0.0.1:52000 - "GET /v1/models?q="OOMKilled-ZZUSERZZ&pipeline_parallel_size=4 HTTP/1.1" 404',
        "vllm_process_name": "APIServer",
    }
    base_log = real_log("kv-cache-too-small-json.log")
    for log in placed(base_log, json.dumps(record)):
        assert_same_diagnosis(log, base_log)


def test_client_chosen_lengths_in_a_context_length_400_are_not_the_engines_figures():
    """serving_engine's 400 (`This model's maximum context length is N tokens. However, you requested M
    tokens ...`, M and its parts the client's) in serving_chat.py's report, before a real KV refusal: the
    refusal's max seq len and estimate stay the engine's."""
    error = preprocess_error(
        "ValueError: This model's maximum context length is 4096 tokens. However, you requested 9999 tokens "
        "(9000 in the messages, 999 in the completion). Please reduce the length of the messages or completion. "
        "ZZUSERZZ"
    )
    for where in ("start", "middle", "end"):
        assert_unchanged("kv-cache-too-small.log", error, where)
