"""Session 45 hostile review (stacks): the stacks that run vLLM and print into the same pod log with their own
request logging (Ray Serve LLM, KServe's huggingfaceserver, LMCache, ...). Each strict xfail shows a real log
diagnosed one way and the same log with a client's line in it (a request that fails, a request id the client
chose) another way (a memory cause, the client's figures among the heal's numbers, the client's words quoted, or
the engine's own crash lost); the passing tests are formats not covered before that held.

Findings:
- Ray Serve LLM logs every request it fails with the exception's traceback (ray.llm
  `_internal/serve/deployments/utils/error_handling_utils.py` handle_failure and, later,
  `utils/server_utils.py` get_response_for_error: `logger.error(f"Encountered failure while handling request
  {request_id}", exc_info=e)`; the real shape in ray-project/ray#53267: Serve's header on the first line only,
  `ERROR 2025-05-23 00:42:04,876 default_LLMDeploymentqwen-0_5b rcja4aht <request id> -- Encountered failure
  while handling request <id>`, then the traceback's lines bare, frames handle_failure, llm_server.py _predict, the
  engine's generate; the Ray driver adds `(ServeReplica:... pid=N) ` to each line where it forwards them, the
  replica's own stream (RAY_LOG_TO_STDERR, the replica's log) has none, next to vLLM's engine core lines with
  theirs). A request's own failure reaches it: vLLM validates a request's structured output inside
  AsyncLLM.generate (add_request -> the input processor -> validate_guidance_grammar ->
  serialize_guidance_grammar, vllm v1/structured_output/backend_guidance.py), and a structural tag whose `begin`
  matches no trigger raises `ValueError: Trigger {begin} not found in triggers [...]`. A frame under
  /structured_output/ makes the traceback a request's grammar report (quoted.GRAMMAR_FRAME, "the request's from its
  first line on"), and without the replica's prefix that report runs on over the engine core's crash logged after
  it: a real serving OOM reads `unknown traceback_without_error` with no evidence (no heal), a real illegal memory
  access `not_oom cuda_error` with no evidence. Any client sends such a request (a harmless `begin`, no memory
  words), and a flood of them puts one next to the engine's crash. With the replica's prefix the crash is read
  (and the client's OOM or KV-capacity words in `begin` decide nothing: held). The run-on is the defence of
  tests/test_diagnosis_grammar_reports.py (a prefix-less grammar re-print keeps even prefixed lines, since the
  client's trigger forges `(EngineCore pid=N) ...` lines): written for the engine's own re-print, the process's
  last word; here the prefix-less report is another program's, in mid-log, and the lines it takes are the
  engine's real crash.
- LMCache's connector logs each request's lookup in the engine core's process with its own formatter
  (`[%(asctime)s] LMCache %(levelname)s: %(message)s (%(filename)s:%(lineno)d:%(name)s)`, header on the first
  line only: lmcache/integration/vllm/vllm_v1_adapter.py, `logger.info("Reqid: %s, Total tokens %d, LMCache hit
  tokens: %d, need to load: %d", request.request_id, ...)`; LMCache's docs show `(EngineCore_DP0 pid=494270)
  [2025-09-30 01:12:36,502] LMCache INFO: ...`). The request id holds the client's: vLLM's `_base_request_id`
  takes the body's `request_id` (a JSON string, newlines kept) where no X-Request-Id is sent. The id's further
  lines carry vLLM's stdout decorator's process prefix `(EngineCore pid=N) ` and nothing else: a line of the
  engine core's that opens with an exception is read as the engine's raw traceback. A real illegal access reads
  runtime_oom (the client's 64 GiB) or kv_cache_insufficient (16), quoted; a real serving OOM takes the client's
  figures. This is the headerless-line mechanism test_review_session45_steer.py leaves as a limit for a logging
  format of the operator's own; here it needs no configuration: LMCache's formatter is LMCache's, in its default
  set-up, and the prefix vLLM adds names the engine core.

Both are left as limits (strict xfails), not fixed: the first is a safe miss (no heal, never a memory change), and
requiring multiprocessing's `Process <name>:` banner before a prefix-less grammar report counts as the dying
engine's re-print lost that re-print where blank lines had pushed the banner out of the raw tail
(test_diagnosis_grammar_reports.py); the second is the first-line-only limit of test_review_session45_steer.py,
whose fix (a carry over headerless lines) was escaped and hid real raw OOM lines (test_review_session45_attack.py).

Held (formats not covered before):
- the same Ray Serve LLM traceback under the replica's prefix, the client's `torch.OutOfMemoryError: ...` or
  KV-capacity message in the structural tag's `begin`;
- KServe's exception handlers (python/kserve/kserve/errors.py, every one `logger.error("Exception:",
  exc_info=exc)` under KSERVE_LOGGER_FORMAT `%(asctime)s.%(msecs)03d %(process)s %(name)s %(levelname)s
  [%(filename)s:%(funcName)s():%(lineno)s] %(message)s`): ModelNotFound's `Model with name {model_name} does not
  exist.`, the name from the URL path (GET /v1/models/{model_name}, percent-decoded: spaces and newlines), with
  the traceback's starlette and kserve frames;
- Ray Serve LLM's ingress (ray.llm `_internal/serve/core/ingress/ingress.py` _get_model_id: `HTTPException(404,
  f'Got request for model "{model}". ...')`, the body's `model`), logged by the same get_response_for_error;
- LMCache's `Reqid:` line with the client's request id on one line (an X-Request-Id header, no newline).
"""

from __future__ import annotations

import pytest

from test_review_session45_steer2 import (
    ENGINE_PROCESS,
    _before_crash,
    _runtime_oom,
    assert_engine_line_keeps_the_diagnosis,
)

from crafted.bases import PAYLOADS, illegal_access_log
from crafted.checks import assert_reads_like, diagnose

OOM = "torch.OutOfMemoryError: " + PAYLOADS["cuda-oom"]
KV = "ValueError: " + PAYLOADS["kv-capacity"]
RAY_SITE = "/home/ray/anaconda3/lib/python3.11/site-packages"

# --- Ray Serve LLM: a request's failure, logged with its traceback -----------------------------------------------
REPLICA = "(ServeReplica:default:LLMDeploymentqwen-0_5b pid=14262) "
SERVE_HEAD = (
    "ERROR 2025-05-23 00:42:04,876 default_LLMDeploymentqwen-0_5b rcja4aht 700823bf-0cfe-460a-bb1c-00e25d0f3fb8 -- "
    "Encountered failure while handling request 700823bf-0cfe-460a-bb1c-00e25d0f3fb8"
)
HARMLESS_BEGIN = "<function=get_weather>"


def _serve_failure(begin: str, prefix: str) -> list[str]:
    """error_handling_utils.handle_failure's record of a request whose structural tag names no trigger."""
    lines = [
        SERVE_HEAD,
        "Traceback (most recent call last):",
        f'  File "{RAY_SITE}/ray/llm/_internal/serve/deployments/utils/error_handling_utils.py", line 50, in '
        "handle_failure",
        "    async for response in async_iterator:",
        f'  File "{RAY_SITE}/ray/llm/_internal/serve/deployments/llm/llm_server.py", line 528, in _predict',
        "    async for llm_response in self.engine.generate(llm_request):",
        f'  File "{RAY_SITE}/vllm/v1/engine/async_llm.py", line 300, in generate',
        "    q = await self.add_request(",
        f'  File "{RAY_SITE}/vllm/v1/structured_output/backend_guidance.py", line 274, in validate_guidance_grammar',
        "    guidance_grm = serialize_guidance_grammar(tp, grm)",
        f'  File "{RAY_SITE}/vllm/v1/structured_output/backend_guidance.py", line 252, in serialize_guidance_grammar',
        "    raise ValueError(",
        f"ValueError: Trigger {begin} not found in triggers ['<function=']",
    ]
    return [prefix + line for line in lines]


@pytest.mark.xfail(
    strict=True,
    reason="a limit (session 45): a Ray Serve LLM request's grammar failure, unprefixed, takes the engine's crash after "
    "it into its report (a safe miss: no heal, no change); requiring multiprocessing's banner for the dying re-print "
    "lost the engine's own re-print where blank lines push the banner out",
)
@pytest.mark.parametrize("base", [illegal_access_log, _runtime_oom], ids=["illegal-access", "serving-oom"])
def test_a_ray_serve_llm_request_failure_hides_no_crash(base):
    """The real crash with a client's failed request (a harmless trigger) logged by the replica just before the
    engine core's dump: the diagnosis is the crash's."""
    log = base()
    assert_reads_like(_before_crash(log, _serve_failure(HARMLESS_BEGIN, "")), log, "a Ray Serve LLM request's failure")


@pytest.mark.parametrize(
    "base, payload",
    [(illegal_access_log, OOM), (illegal_access_log, KV), (_runtime_oom, KV), (_runtime_oom, OOM)],
    ids=["illegal-access-oom", "illegal-access-kv", "serving-oom-kv", "serving-oom-oom"],
)
def test_a_ray_serve_llm_request_failure_names_no_failure(base, payload):
    log = base()
    harmless = _before_crash(log, _serve_failure(HARMLESS_BEGIN, REPLICA))
    assert diagnose(harmless).cause == diagnose(log).cause
    crafted = _before_crash(log, _serve_failure("<x> " + payload, REPLICA))
    assert_reads_like(crafted, harmless, "a Ray Serve LLM request's failure")


# --- LMCache: the request id on LMCache's lookup line, in the engine core's process ------------------------------
HARMLESS_ID = "6709d8795d3c4464"


def _lmcache_lookup(request_id: str, prefix: str) -> list[str]:
    """vllm_v1_adapter.py's lookup line; vLLM's stdout decorator puts the process prefix on every line."""
    message = (
        f"[2025-09-30 01:12:36,502] LMCache INFO: Reqid: chatcmpl-{request_id}-9f3fffed, Total tokens 32, LMCache "
        "hit tokens: 24, need to load: 8 (vllm_v1_adapter.py:1364:lmcache.integration.vllm.vllm_v1_adapter)"
    )
    return [prefix + line for line in message.split("\n")]


@pytest.mark.xfail(
    strict=True,
    reason="a limit (session 45): a multi-line request id's further lines on LMCache's lookup line (its formatter heads "
    "a message's first line only) read as the engine core's traceback, as under the operator's own such format",
)
@pytest.mark.parametrize(
    "base, payload",
    [(illegal_access_log, OOM), (illegal_access_log, KV), (_runtime_oom, OOM), (_runtime_oom, KV)],
    ids=["illegal-access-oom", "illegal-access-kv", "serving-oom-oom", "serving-oom-kv"],
)
@pytest.mark.parametrize("prefixes", [True, False], ids=["v0.25-prefixes", "no-prefixes"])
def test_a_request_id_on_lmcaches_lookup_line_names_no_failure(base, payload, prefixes):
    assert_engine_line_keeps_the_diagnosis(
        base, prefixes, _lmcache_lookup, HARMLESS_ID, "x\n" + payload, "a request id on LMCache's lookup line"
    )


@pytest.mark.parametrize("base", [illegal_access_log, _runtime_oom], ids=["illegal-access", "serving-oom"])
@pytest.mark.parametrize("payload", [OOM, KV], ids=["oom", "kv"])
def test_a_request_id_header_on_lmcaches_lookup_line_names_no_failure(base, payload):
    log = base()
    harmless = _before_crash(log, _lmcache_lookup(HARMLESS_ID, ENGINE_PROCESS))
    crafted = _before_crash(log, _lmcache_lookup("x " + payload, ENGINE_PROCESS))
    assert_reads_like(crafted, harmless, "an X-Request-Id on LMCache's lookup line")


# --- held: KServe's ModelNotFound, Ray Serve LLM's ingress 404 ----------------------------------------------------
KSERVE_SITE = "/kserve-workspace/prod_venv/lib/python3.12/site-packages"


def _kserve_model_not_found(name: str) -> list[str]:
    """errors.py model_not_found_handler: `logger.error("Exception:", exc_info=exc)`, KServe's format."""
    text = "\n".join(
        [
            "2025-06-10 02:48:30.946 1 kserve ERROR [errors.py:model_not_found_handler():151] Exception:",
            "Traceback (most recent call last):",
            f'  File "{KSERVE_SITE}/starlette/middleware/exceptions.py", line 63, in __call__',
            "    await wrap_app_handling_exceptions(self.app, conn)(scope, receive, send)",
            f'  File "{KSERVE_SITE}/kserve/protocol/rest/v1_endpoints.py", line 120, in model_ready',
            "    model_ready = await self.dataplane.model_ready(model_name)",
            f'  File "{KSERVE_SITE}/kserve/protocol/dataplane.py", line 294, in model_ready',
            "    raise ModelNotFound(model_name)",
            f"kserve.errors.ModelNotFound: Model with name {name} does not exist.",
        ]
    )
    return text.split("\n")


def _ray_ingress_404(model: str) -> list[str]:
    """get_response_for_error's record (a 404: WARNING) of ingress.py _get_model_id's HTTPException."""
    base_id = model.split(":")[0]
    text = "\n".join(
        [
            "WARNING 2025-05-23 00:42:04,876 default_OpenAiIngress rcja4aht 700823bf-0cfe-460a-bb1c-00e25d0f3fb8 -- "
            "Encountered failure while handling request 700823bf-0cfe-460a-bb1c-00e25d0f3fb8",
            "Traceback (most recent call last):",
            f'  File "{RAY_SITE}/ray/llm/_internal/serve/core/ingress/middleware.py", line 85, in '
            "_handle_application_exceptions",
            "    return await call_next(request)",
            f'  File "{RAY_SITE}/starlette/middleware/base.py", line 168, in call_next',
            "    raise app_exc",
            f'  File "{RAY_SITE}/ray/llm/_internal/serve/core/ingress/ingress.py", line 370, in _get_response',
            "    model_id = await self._get_model_id(body.model)",
            f'  File "{RAY_SITE}/ray/llm/_internal/serve/core/ingress/ingress.py", line 345, in _get_model_id',
            "    raise HTTPException(",
            f'fastapi.exceptions.HTTPException: 404: Got request for model "{model}". Could not find base model with '
            f'ID "{base_id}".',
        ]
    )
    return [REPLICA.replace("LLMDeploymentqwen-0_5b", "OpenAiIngress") + line for line in text.split("\n")]


@pytest.mark.parametrize("write", [_kserve_model_not_found, _ray_ingress_404], ids=["kserve-404", "ray-ingress-404"])
@pytest.mark.parametrize("base", [illegal_access_log, _runtime_oom], ids=["illegal-access", "serving-oom"])
@pytest.mark.parametrize(
    "payload", ["x " + OOM, "x " + KV, "x\n" + OOM, "x\n" + KV], ids=["oom", "kv", "oom-nl", "kv-nl"]
)
def test_a_model_name_in_a_frontends_not_found_traceback_names_no_failure(write, base, payload):
    log = base()
    harmless = _before_crash(log, write("qwen-typo"))
    crafted = _before_crash(log, write(payload))
    assert_reads_like(crafted, harmless, "a model name in a not-found traceback")
