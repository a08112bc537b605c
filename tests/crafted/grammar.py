"""A structured-output grammar that fails to compile and takes the engine down, its trigger the
client's: the traceback, the crash as a text-logging engine writes it (logged, then re-printed by
multiprocessing), and as a JSON-logging engine writes it."""

from __future__ import annotations

from crafted.bases import ENGINE_CORE, vllm_log
from crafted.checks import client_text_absent, diagnose, said
from crafted.records import JSON_START, record

SITE = "/usr/local/lib/python3.12/dist-packages/vllm"


FRAME = f'  File "{SITE}/v1/worker/gpu_model_runner.py", line 1, in execute_model\n    x = y\n'


def grammar_traceback(begin: str) -> str:
    """The traceback of a structured-output grammar that fails to compile (its trigger `begin` the
    client's), as Python prints it (without any prefix)."""
    return (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/v1/engine/core.py", line 701, in run_engine_core\n    engine_core.run_busy_loop()\n'
        f'  File "{SITE}/v1/core/sched/scheduler.py", line 350, in schedule\n'
        "    if not self._check_grammar_completion():\n"
        f'  File "{SITE}/v1/structured_output/__init__.py", line 128, in _async_create_grammar\n'
        "    return self.backend.compile_grammar(request_type, grammar_spec)\n"
        f'  File "{SITE}/v1/structured_output/backend_guidance.py", line 260, in serialize_guidance_grammar\n'
        "    raise ValueError(\n"
        f"ValueError: Trigger {begin} not found in triggers ['<tool_call>']"
    )


ENGINE_ERROR_HEADER = ENGINE_CORE + "ERROR 12-01 04:48:09 [core.py:710] "


def grammar_crash(begin: str, headed: bool = True) -> str:
    """The logged copy (every line with vLLM's header), then multiprocessing's re-print of the same
    exception after run_engine_core's `raise e` (every line with the process prefix only)."""
    out = (
        [vllm_log(ENGINE_ERROR_HEADER, "EngineCore encountered a fatal error.\n" + grammar_traceback(begin))]
        if headed
        else []
    )
    out.append(vllm_log(ENGINE_CORE, "Process EngineCore_DP0:\n" + grammar_traceback(begin)))
    return "\n".join(out)


def json_grammar_crash(begin: str, logged: bool = True) -> str:
    """The grammar crash as a JSON-mode engine writes it: the logged copy one record (the traceback in
    exc_info), then multiprocessing's re-print, raw, without any prefix (as in the real JSON fixture)."""
    tb = grammar_traceback(begin)
    out = [record("EngineCore encountered a fatal error.", tb)] if logged else []
    return "\n".join([*out, "Process EngineCore_DP0:\n" + tb]) + "\n"


def assert_json_reads_like(begin: str, harmless: str, logged: bool, what: str) -> None:
    """A JSON-mode grammar crash with the client's `begin` is diagnosed as with a harmless one."""
    crafted_d = diagnose(JSON_START + json_grammar_crash(begin, logged))
    harmless_d = diagnose(JSON_START + json_grammar_crash(harmless, logged))
    key = lambda d: (d.cause, d.subtype, d.numbers)  # noqa: E731
    assert key(crafted_d) == key(harmless_d), f"{what}: said {said(crafted_d)}; should say {said(harmless_d)}"
    assert client_text_absent(crafted_d), f"{what}: the client's text is quoted"
