"""User text in the log never steers a diagnosis.

vLLM echoes requests and responses into its log (`--enable-log-requests`,
`--enable-log-outputs`, in every version's own format). Each crafted log below is a real
crash (a real non-memory failure, or a real out-of-memory) with request or response lines
inserted that quote one of vLLM's memory errors, with numbers chosen to do harm. The
diagnosis must be exactly what the real crash alone gives: same cause, phase, evidence and
numbers (so the same remedy, and none for a non-memory crash), and no request line and no
prompt text anywhere in it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_autoheal.diagnosis import MEMORY_CAUSES, Signals, classify

from crafted.bases import CORPUS, ENGINE_CORE, ID_BASES, real_log, vllm_log, with_lines
from crafted.checks import assert_same, assert_unchanged
from crafted.exceptions import add_lora_failure, anthropic_tool_removal, hf_download_failure, preprocess_error
from crafted.request_logging import (
    ABORTED,
    CLIENT_ID_LINES,
    ENGINE_DEAD,
    ERROR_STACK,
    FORMATS,
    GRAMMAR,
    LEVELED_CLIENT_LINES,
    inject,
)

# What a user might quote, one per memory cause (with numbers chosen to do harm).
QUOTES = {
    "kv_cache_insufficient": "ValueError: To serve at least one request with the model's max seq len (131072), "
    "(16.0 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(0.01 GiB). Based on the available memory, the estimated maximum model length is 2048.",
    "gpu_util_exceeds_free": "ValueError: Free memory on device cuda:0 (3.1/79.2 GiB) on startup is less than desired "
    "GPU memory utilization (0.9, 71.3 GiB). Decrease GPU memory utilization",
    "weights_load_oom": "ValueError: Failed to load model - not enough GPU memory",
    "profiling_oom": "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests.",
    "cudagraph_capture_oom": 'File "gpu_model_runner.py", line 3362, in capture_model\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB.",
    "runtime_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 10000000000000000000 GiB. "
    "GPU 0 has a total capacity of 79.19 GiB of which 1.10 GiB is free.",
    "multi_gpu_oom": "ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda failure 'out of memory'",
    "host_ram_oom": "Memory cgroup out of memory: Killed process 4242 (python3). A worker died unexpectedly "
    "(exit code: -9) OOMKilled",
}


# A corpus sample's log may later grow (scripts/corpus_extend.py): a base the tests were written on
# as it was then (rt-3430, cut before its OOM: the base that decides nothing) is kept here.


NOT_MEMORY_BASES = [
    "neg-2734-llama2-70b-tp8-timeout",
    "neg-52435-tp3-heads",
    "model-not-found.log",
    "neg-6042-watchdog-worker-died",
]


MEMORY_BASES = ["kv-cache-too-small.log", "cg-15228-qwen25-v080", "memory-limit-kill.log", "rt-27466-busy-loop"]


CASES = [(base, cause, i) for i, cause in enumerate(QUOTES) for base in (NOT_MEMORY_BASES[i % 4], MEMORY_BASES[i % 4])]


@pytest.mark.parametrize("base_name,quoted_cause,n", CASES, ids=[f"{b}-quotes-{c}" for b, c, _ in CASES])
def test_quoted_memory_errors_in_prompts_and_outputs_change_nothing(base_name, quoted_cause, n):
    base_log = real_log(base_name) if base_name in CORPUS or base_name.endswith(".log") else None
    if base_log is None:
        pytest.fail(f"base crash {base_name} missing from tests/corpus")
    base = classify(Signals(log=base_log))
    for k, fmt in enumerate(FORMATS[n % len(FORMATS) :] + FORMATS[: n % len(FORMATS)]):
        where = ("start", "middle", "end")[k % 3]
        crafted_log = inject(base_log, QUOTES[quoted_cause], fmt, where)
        crafted = classify(Signals(log=crafted_log))
        assert_same(crafted, base)
        text = json.dumps(crafted.to_dict())
        assert "Received request" not in text and "Generated response" not in text and "my server printed" not in text
        assert any("user text" in note for note in crafted.notes)
    if base_name in NOT_MEMORY_BASES:
        assert base.cause not in MEMORY_CAUSES


def test_the_bases_are_what_they_claim():
    """The real crashes under the crafted lines: half not memory, half memory of several kinds."""
    not_memory = {classify(Signals(log=real_log(b))).cause for b in NOT_MEMORY_BASES}
    memory = {classify(Signals(log=real_log(b))).cause for b in MEMORY_BASES}
    assert not_memory == {"not_oom"}
    assert memory <= set(MEMORY_CAUSES) and len(memory) >= 3


def test_a_prompt_alone_decides_nothing():
    """Only request lines quoting every memory error: nothing the engine said, so `unknown`."""
    log = "\n".join(fmt.format(r=repr(q)) for q in QUOTES.values() for fmt in FORMATS)
    d = classify(Signals(log=log, exit_code=1))
    assert d.cause == "unknown" and d.evidence == [] and {k for k in d.numbers} <= {"exit_code"}


def test_the_hooks_nccl_timeout_with_a_quoted_oom_through_the_cli(tmp_path):
    log = tmp_path / "inject.log"
    log.write_text(inject(CORPUS["neg-6042-watchdog-worker-died"]["log"], QUOTES["runtime_oom"], FORMATS[2], "start"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_autoheal",
            "diagnose",
            str(log),
            "--json",
            "--engine-args",
            "--gpu-memory-utilization 0.9 --max-model-len 131072",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out)
    assert result["cause"] == "not_oom"
    assert "Received request" not in out and "my server printed" not in out
    assert not (result.get("remedy") or {}).get("changes")


# --- User text in lines the engine itself writes ----------------------------------------------------
KV_PAYLOAD = (
    "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, the "
    "estimated maximum model length is 16. ZZUSERZZ"
)


STREAM_ERROR = vllm_log(
    "(APIServer pid=8267) ERROR 10-24 01:26:57 [serving_chat.py:1145] ",
    "Error in chat completion stream generator.\nTraceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/async_llm.py", line 387, '
    "in generate\n    out = q.get_nowait() or await q.get()\n"
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
    "(above) for the root cause.",
)


HOSTILE = {
    # the request id (X-Request-Id header) in V0's and V1's "Added request" line
    "added-request": "INFO 02-13 07:19:11 async_llm_engine.py:211] Added request chatcmpl-" + KV_PAYLOAD + ".",
    # a newline in the request id: the continuation carries the logger's header, then a forged one
    "forged-header": vllm_log(
        "(APIServer pid=8267) INFO 10-24 01:24:03 [logger.py:43] ",
        "Received request chatcmpl-x\nERROR 10-24 01:26:57 [core.py:710] "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ\n"
        "-a1b2: params: SamplingParams(n=1), lora_request: None.",
    ),
    # a chat template the request brought raises with the user's message
    "template-error": preprocess_error("jinja2.exceptions.TemplateError: " + KV_PAYLOAD),
    # the batch V1 dumps when execute_model fails names each request by its id
    "dump-input": "(EngineCore_DP0 pid=8402) ERROR 10-24 01:26:57 [dump_input.py:79] SchedulerOutput(scheduled_new_"
    "reqs=[NewRequestData(req_id=chatcmpl-" + KV_PAYLOAD + "-9f1c,prompt_token_ids_len=12)])",
    # an access line of a server on a Unix socket has no client address
    "uds-access": '(APIServer pid=7) INFO:      - "GET /v1/OOMKilled?x=torch.OutOfMemoryError HTTP/1.1" 404 Not Found',
    # an ordinary 400 for a long prompt, and V0's warning for one: a request's error, not the crash's
    "too-long-400": preprocess_error(
        "ValueError: This model's maximum context length is 16384 tokens. However, you "
        "requested 122946 tokens (112946 in the messages, 10000 in the completion). "
        "Please reduce the length of the messages or completion."
    ),
    "too-long-warning": "WARNING 02-13 07:19:11 scheduler.py:949] Input prompt (32889 tokens) is too long and "
    "exceeds limit of 2048",
}


HOSTILE_BASES = [
    "neg-2734-llama2-70b-tp8-timeout",
    "rt-27466-busy-loop",
    "cg-15228-qwen25-v080",
    "memory-limit-kill.log",
]


@pytest.mark.parametrize("attack", sorted(HOSTILE))
@pytest.mark.parametrize("base_name", HOSTILE_BASES)
def test_user_text_in_lines_the_engine_writes_changes_nothing(attack, base_name):
    base_log = real_log(base_name)
    base = classify(Signals(log=base_log, exit_code=137 if base_name.endswith(".log") else 1))
    for where in ("start", "middle", "end"):
        lines = base_log.splitlines()
        at = {"start": 0, "middle": len(lines) // 2, "end": len(lines)}[where]
        lines[at:at] = HOSTILE[attack].splitlines()
        crafted = classify(Signals(log="\n".join(lines) + "\n", exit_code=137 if base_name.endswith(".log") else 1))
        assert_same(crafted, base)
        assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


def test_a_flood_of_per_request_tracebacks_after_the_crash_keeps_the_root_cause():
    """Hundreds of streams each log the engine's death; the tail keeps the engine's own lines first."""
    base_log = real_log("rt-27466-busy-loop")
    base = classify(Signals(log=base_log))
    flooded = base_log + "\n" + "\n".join([STREAM_ERROR] * 400) + "\n"
    assert base.cause == "runtime_oom"
    assert_same(classify(Signals(log=flooded)), base)


def test_a_request_error_alone_still_says_not_memory():
    """With nothing else in the log, a 400 for a long prompt is reported, as not memory, without its text."""
    d = classify(Signals(log=HOSTILE["too-long-400"] + "\n"))
    assert d.cause == "not_oom" and d.subtype == "prompt_too_long" and d.evidence == []


PLACING = {  # what an INFO line may still carry: a budget, a frame, a milestone
    "budget": "a Available KV cache memory: -1.5 GiB ZZUSERZZ",
    "zero-blocks": "a # GPU blocks: 0 ZZUSERZZ",
    "capture-frame": "a in capture_model ZZUSERZZ",
    "load-frame": "a in load_model ZZUSERZZ",
}


FAILING = {  # what an ERROR line may carry: the new KILLED and HOST wordings
    "sigkill": "a SIGKILL ZZUSERZZ",
    "exit-137": "a exited with code 137 ZZUSERZZ",
    "ray-oom": "a ray-oom-prevention ZZUSERZZ",
    "cpu-alloc": "a DefaultCPUAllocator: not enough memory ZZUSERZZ",
}


@pytest.mark.parametrize("payload", sorted(PLACING))
@pytest.mark.parametrize("fmt", [ABORTED, ENGINE_DEAD], ids=["aborted", "engine-dead"])
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_request_id_in_asyncllm_request_lines_changes_nothing(base_name, fmt, payload):
    """AsyncLLM logs `Request <id> aborted.` (a client disconnect) and `... failed (engine dead).`
    (every in-flight request, after the crash): the id is the client's X-Request-Id."""
    assert_unchanged(base_name, fmt.format(PLACING[payload]), "middle" if fmt is ABORTED else "end")


@pytest.mark.parametrize("payload", sorted(FAILING))
@pytest.mark.parametrize("fmt", [ERROR_STACK, GRAMMAR], ids=["log-error-stack", "grammar"])
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_request_id_in_engine_error_lines_changes_nothing(base_name, fmt, payload):
    """--log-error-stack logs `Exception caught. Request id: <id>` at ERROR for a request's error;
    the structured-output manager logs `Failed to compile grammar for request <id>` at ERROR."""
    assert_unchanged(base_name, fmt.format(FAILING[payload]), "middle")


def _multiline_id(fmt: str, request_id: str) -> str:
    header = fmt.split("Request ")[0]
    return "\n".join(header + part for part in fmt[len(header) :].format(request_id).split("\n"))


@pytest.mark.parametrize("base_name", ["local-h200-hostram", "rt-3430-lmcache-qwen3-8b-a5000-long-prompts"])
def test_a_multiline_request_id_cannot_forge_the_end_of_a_traceback(base_name):
    """A body `request_id` with newlines: the continuation lines carry async_llm.py's own header."""
    forged = (
        "a\nTraceback (most recent call last):\n"
        '  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 1, in run\n'
        "    step()\nKeyboardInterruptZZUSERZZ: the engine stopped\nb"
    )
    assert_unchanged(base_name, _multiline_id(ABORTED, forged), "end")


@pytest.mark.parametrize(
    "message",
    [
        "NCCL WARN ZZUSERZZ",
        "Segmentation fault (core dumped) ZZUSERZZ",
        "[Errno 98] ZZUSERZZ",
        "error: argument --x ZZUSERZZ",
        "find the original error: RuntimeError( ZZUSERZZ",
    ],
)
def test_words_inside_a_requests_template_error_do_not_decide(message):
    """A chat template's raise_exception() text in the API server's traceback of that request:
    the base (a cut log, `unknown`) must stay `unknown`, not become a not_oom of the user's choosing."""
    assert_unchanged(
        "rt-3430-lmcache-qwen3-8b-a5000-long-prompts",
        preprocess_error("jinja2.exceptions.TemplateError: " + message),
        "middle",
    )


@pytest.mark.parametrize("payload", ["a EngineCore failed to start ZZUSERZZ", "a in from_engine_args ZZUSERZZ"])
@pytest.mark.parametrize(
    "base_name", ["rt-qwen38flash2x3090-2-first-prompt", "weights-43951-qwen3-235b-sleepmode-gb200"]
)
def test_a_request_id_cannot_say_the_engine_never_started(base_name, payload):
    """An OOM the log does not place is `unknown`; a STARTING marker in a request's id, anywhere in
    the log (even after the crash), must not turn it into a profiling_oom guess."""
    assert_unchanged(base_name, ENGINE_DEAD.format(payload), "end")


# --- Request ids and client values the engine writes over several lines -----------------------------
# Every format below is vLLM 0.32's own (site-packages/vllm, file:line in the header). A payload is
# what an INFO/WARNING line may still carry (a budget, a frame) or what an ERROR line may carry.
ID3_PAYLOADS = {
    "budget": "Available KV cache memory: -1.5 GiB ZZUSERZZ",
    "capture-frame": 'File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model ZZUSERZZ',
}


ID3_FAILING = {
    **ID3_PAYLOADS,
    "cpu-alloc": "DefaultCPUAllocator: not enough memory ZZUSERZZ",
    "sigkill": "SIGKILL ZZUSERZZ",
}


REQUEST_LOGGER = "(APIServer pid=2320) INFO 12-01 04:48:08 [request_logger.py:65] "


LOGGER_PARAMS = ": params: SamplingParams(n=1, temperature=0.7, max_tokens=16), lora_request: None."


@pytest.mark.parametrize("payload", sorted(ID3_PAYLOADS))
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_request_id_with_a_space_in_the_request_loggers_line_is_user_text(base_name, payload):
    """0.32's request logger (entrypoints/serve/utils/request_logger.py) writes `Received request %s:
    params: ...`; an X-Request-Id with a space defeats `^Received request \\S+:` and the line is read
    as the engine's (runtime_oom -> kv_cache_insufficient / cudagraph_capture_oom)."""
    assert_unchanged(
        base_name, REQUEST_LOGGER + "Received request chatcmpl-a " + ID3_PAYLOADS[payload] + LOGGER_PARAMS, "middle"
    )


@pytest.mark.parametrize("payload", sorted(ID3_PAYLOADS))
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_multiline_request_id_in_the_request_loggers_line_is_user_text(base_name, payload):
    """A body request_id with a newline: the first line `Received request chatcmpl-a` has no colon, so
    it is not user text, `_continuations` never starts, and the next line (same header) is the engine's."""
    assert_unchanged(
        base_name,
        vllm_log(REQUEST_LOGGER, "Received request chatcmpl-a\n" + ID3_PAYLOADS[payload] + LOGGER_PARAMS),
        "middle",
    )


@pytest.mark.parametrize("prefix", ["[rank0]: ", "2026-12-01T04:48:08Z ", "svc-1  | ", "(pid=1) "])
@pytest.mark.parametrize("payload", sorted(ID3_FAILING))
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_prefix_inside_a_multiline_request_id_does_not_end_its_message(base_name, payload, prefix):
    """A continuation line of `Exception caught. Request id: <id>` whose id line starts with a prefix
    _PREFIXES strips ([rank0]:, a timestamp, `svc | `, `(pid=1)`): its computed header is longer than
    the first line's, so `_continuations` stops and the line is the engine's ERROR."""
    message = "Exception caught. Request id: chatcmpl-a\n" + prefix + ID3_FAILING[payload] + "\nb"
    assert_unchanged(base_name, vllm_log(ERROR_STACK.split("Exception")[0], message), "middle")


@pytest.mark.parametrize("payload", sorted(ID3_PAYLOADS))
@pytest.mark.parametrize("base_name", ID_BASES)
def test_the_first_line_of_a_multiline_request_id_may_not_be_kept(base_name, payload):
    """`Request cmpl-a` (the first line of AsyncLLM's `Request %s aborted.` with a newline in the id)
    holds no anchor: outside the raw tail (64 KiB / 2000 lines) it is dropped, and its continuation
    lines, which do hold anchors, have no user line before them."""
    assert_unchanged(
        base_name, _multiline_id(ABORTED, "a\n" + ID3_PAYLOADS[payload] + "\n" + "x\n" * 2100 + "b"), "start"
    )


@pytest.mark.parametrize("payload", sorted(ID3_FAILING))
@pytest.mark.parametrize("fmt", sorted(CLIENT_ID_LINES))
@pytest.mark.parametrize("base_name", ID_BASES)
def test_request_ids_in_other_vllm_032_lines_change_nothing(base_name, fmt, payload):
    assert_unchanged(base_name, CLIENT_ID_LINES[fmt](ID3_FAILING[payload]), "middle")


@pytest.mark.parametrize(
    "base_name",
    ["rt-2779-lmeval-qwen72b-logprobs-sampler-oom", "rt-15039-lora-long-input", "weights-636-llama2-70b-single-80g"],
)
def test_long_request_ids_after_the_crash_do_not_push_the_engines_traceback_out(base_name):
    """Nine in-flight requests with an 8000-character X-Request-Id each log `Request <id> failed
    (engine dead).` after the crash: 72 KB, more than the raw tail's 64 KiB, and the engine's
    traceback frames that placed the OOM are gone (runtime_oom / weights_load_oom -> unknown: the
    memory remedy is lost). A busy server's ~700 ordinary ids do the same."""
    base_log = real_log(base_name)
    assert classify(Signals(log=base_log)).cause in MEMORY_CAUSES
    assert_unchanged(base_name, "\n".join(ENGINE_DEAD.format(f"{i}-" + "y" * 8000) for i in range(9)), "end")


@pytest.mark.parametrize(
    "base_name",
    ["rt-2779-lmeval-qwen72b-logprobs-sampler-oom", "rt-15039-lora-long-input", "weights-636-llama2-70b-single-80g"],
)
def test_a_busy_servers_in_flight_requests_after_the_crash_keep_the_memory_cause(base_name):
    """Not even an attack: 700 in-flight requests with vLLM's own ids, each logging `Request <id>
    failed (engine dead).` after the crash (--enable-log-requests), fill the 64 KiB raw tail."""
    assert_unchanged(base_name, "\n".join(ENGINE_DEAD.format(f"{i:04d}-8c1f2a9e7b6d4c3a") for i in range(700)), "end")


def _collector_timestamps(log: str) -> str:
    """`kubectl logs --timestamps`, `docker logs -t`, Loki: each line gets its own RFC 3339 time."""
    return "\n".join(f"2026-12-01T04:48:08.{k:09d}Z {line}" for k, line in enumerate(log.splitlines())) + "\n"


@pytest.mark.parametrize("payload", sorted(ID3_FAILING))
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_collectors_per_line_timestamp_does_not_end_a_multiline_request_id(base_name, payload):
    """The fix's own attack (`Exception caught. Request id: <id with newlines>`), in a log whose lines
    a collector stamped: the stamps differ line to line, so no continuation has the first line's
    header, and the id's lines are the engine's ERROR lines again."""
    base_log = real_log(base_name)
    extra = vllm_log(
        ERROR_STACK.split("Exception")[0], "Exception caught. Request id: chatcmpl-a\n" + ID3_FAILING[payload] + "\nb"
    )
    crafted = classify(Signals(log=_collector_timestamps(with_lines(base_log, extra, "middle"))))
    assert_same(crafted, classify(Signals(log=_collector_timestamps(base_log))))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- Client text in lines without 'request' ---------------------------------------------------------
# Every format is vLLM 0.32's own (site-packages/vllm). None of these lines names a request, and
# none comes from a file _USER_FILES or _REQUEST_FILES lists, so each is read as the engine's.
ID4_PAYLOADS = {
    "runtime-oom": "x torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ",
    "kv": "x To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). ZZUSERZZ",
    "util": "x Free memory on device cuda:0 (3.1/79.2 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 71.3 GiB). ZZUSERZZ",
    "host": "x Memory cgroup out of memory: Killed process 4242 ZZUSERZZ",
    "weights": "x Failed to load model - not enough GPU memory ZZUSERZZ",
}


ID4_BASES = ID_BASES + ["cg-15228-qwen25-v080", "rt-3430-lmcache-qwen3-8b-a5000-long-prompts"]


@pytest.mark.parametrize("newline", [False, True], ids=["one-line", "multi-line"])
@pytest.mark.parametrize("payload", sorted(ID4_PAYLOADS))
@pytest.mark.parametrize("base_name", ID4_BASES)
def test_a_lora_path_in_the_engines_add_lora_failure_is_user_text(base_name, payload, newline):
    """not_oom -> runtime_oom / kv_cache_insufficient / gpu_util_exceeds_free / host_ram_oom /
    weights_load_oom, and runtime_oom -> any other memory cause: the client's path, in an ERROR line
    of EngineCore with core.py's header, is read as the engine's own failure."""
    path = "/adapters/a\n" + ID4_PAYLOADS[payload] + "\nb" if newline else "/adapters/a " + ID4_PAYLOADS[payload]
    assert_unchanged(base_name, add_lora_failure("a", path), "middle")


@pytest.mark.parametrize("payload", sorted(ID4_PAYLOADS))
@pytest.mark.parametrize("base_name", ID4_BASES)
def test_a_lora_path_in_the_hub_download_error_is_user_text(base_name, payload):
    assert_unchanged(base_name, hf_download_failure(ID4_PAYLOADS[payload]), "middle")


@pytest.mark.parametrize("attack", ["add-lora", "hub-download"])
@pytest.mark.parametrize(
    "base_name",
    [
        "rt-15039-lora-long-input",
        "rt-2779-lmeval-qwen72b-logprobs-sampler-oom",
        "local-h200-runtime",
        "rt-13152-benchmark-serving-80gb",
    ],
)
def test_an_honest_failed_lora_load_does_not_hide_a_real_memory_failure(base_name, attack):
    """Not even an attack: a mistyped adapter path (load_lora_adapter) before a real runtime OOM.
    Its 'No such file or directory: .../adapter_config.json' and 'HFValidationError' are read as the
    engine's model_not_found, and runtime_oom becomes unknown (signals_disagree): the remedy is lost.
    8 of the corpus's 13 runtime OOMs do so with the add_lora failure halfway through the log."""
    extra = (
        add_lora_failure("my-adapter", "/models/my-adapter")
        if attack == "add-lora"
        else hf_download_failure("my adapter")
    )
    assert_unchanged(base_name, extra, "middle")


@pytest.mark.parametrize("payload", sorted(ID4_PAYLOADS))
@pytest.mark.parametrize("base_name", ID4_BASES)
def test_a_tool_name_in_the_anthropic_routers_error_is_user_text(base_name, payload):
    """The tool's name is the client's: not_oom (or unknown) -> any memory cause, runtime_oom ->
    another memory cause, with the client's text as evidence. Needs no flag at all."""
    assert_unchanged(base_name, anthropic_tool_removal(ID4_PAYLOADS[payload]), "middle")


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ",
        "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (0.01 GiB). ZZUSERZZ",
        "ValueError: Free memory on device cuda:0 (3.1/79.2 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.3 GiB). ZZUSERZZ",
        "ValueError: Failed to load model - not enough GPU memory ZZUSERZZ",
        "MemoryError: Memory cgroup out of memory: Killed process 1 ZZUSERZZ",
    ],
    ids=["runtime-error", "torch-oom", "kv", "util", "weights", "host"],
)
@pytest.mark.parametrize("base_name", ID4_BASES)
def test_a_line_of_a_requests_error_that_starts_like_the_engines_exception_is_not_the_engines(base_name, line):
    """A request's traceback (serving_chat.py) may carry the engine's error (ENGINE_EXCEPTION, matched
    at the start of a line). An exception message with a newline (a template's raise_exception text,
    any str(e) holding the client's text) puts a line of its own choosing at that start."""
    assert_unchanged(base_name, preprocess_error("jinja2.exceptions.TemplateError: x\n" + line), "middle")


def _compose(log: str) -> str:
    """`docker compose logs`: each line gets the service's prefix, and no line says its process."""
    return "\n".join("vllm-1  | " + line for line in log.splitlines()) + "\n"


@pytest.mark.parametrize("payload", ["runtime-oom", "kv"])
@pytest.mark.parametrize("base_name", ID4_BASES)
def test_another_process_writing_inside_a_long_multiline_request_id_does_not_end_it(base_name, payload):
    """A 5 KB body request_id with newlines is more than one atomic pipe write (PIPE_BUF is 4 KiB): a
    line of EngineCore can land between its lines. Under a compose prefix every header has process ''
    (_process wants a header that starts with '('), so that one line closes the user message and the
    id's next lines are the APIServer's ERROR lines."""
    base_log = real_log(base_name)
    header = ERROR_STACK.split("Exception")[0]
    lines = [
        header + part
        for part in (
            "Exception caught. Request id: chatcmpl-a\n"
            + "y" * 5000
            + "\n"
            + ID4_PAYLOADS[payload].lstrip("x ")
            + "\nb"
        ).split("\n")
    ]
    lines[2:2] = ["(EngineCore_DP0 pid=2441) INFO 12-01 04:48:08 [core.py:300] Batch queue is full"]
    crafted = classify(Signals(log=_compose(with_lines(base_log, "\n".join(lines), "middle"))))
    assert_same(crafted, classify(Signals(log=_compose(base_log))))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# VLLM_DEBUG_LOG_API_SERVER_RESPONSE=true (entrypoints/serve/middleware/log_response.py) logs each
# response body at INFO: `response_body={%s}` (the JSON as sent, line 141) and, for a stream,
# `response_body={streaming_complete: content=%r, chunks=%d}` (line 121). A body holds the client's
# text verbatim: a completion with echo=true, an error's "The model `<model>` does not exist.".
# log_response.py is neither a user file nor a request file, so the line is the engine's INFO line,
# and an INFO line still places a failure (a budget, a frame): runtime_oom -> kv_cache_insufficient,
# cudagraph_capture_oom, weights_load_oom, gpu_util_exceeds_free.
LOG_RESPONSE = "(APIServer pid=2320) INFO 12-01 04:48:08 [log_response.py:141] "


LOG_STREAM = "(APIServer pid=2320) INFO 12-01 04:48:08 [log_response.py:121] "


def _response_body(text: str, streaming: bool) -> str:
    if streaming:
        return LOG_STREAM + f"response_body={{streaming_complete: content={text!r}, chunks=17}}"
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1764564488,
        "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "total_tokens": 21, "completion_tokens": 16},
    }
    return LOG_RESPONSE + "response_body={" + json.dumps(body) + "}"


@pytest.mark.parametrize("streaming", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("payload", sorted(PLACING))
@pytest.mark.parametrize(
    "base_name",
    [
        "rt-15039-lora-long-input",
        "rt-2779-lmeval-qwen72b-logprobs-sampler-oom",
        "cg-15228-qwen25-v080",
        "local-h200-runtime",
    ],
)
def test_a_response_body_logged_by_the_api_server_is_user_text(base_name, payload, streaming):
    assert_unchanged(base_name, _response_body(PLACING[payload], streaming), "middle")


# --- More lines of vLLM 0.32 that carry a client's value ---
# vLLM 0.32's logger calls (site-packages/vllm, file:line in each header) whose arguments a client
# controls, in lines that name no request in a form _REQUEST_IDS knows and come from files neither
# _USER_FILES nor _REQUEST_FILES lists: each line is read as the engine's own. An INFO, DEBUG or
# WARNING line still places a failure (a budget, a frame); an ERROR line names one.
ID5_PLACING = {
    "budget": "Available KV cache memory: -1.5 GiB ZZUSERZZ",
    "zero-blocks": "# GPU blocks: 0 ZZUSERZZ",
    "capture-frame": "a in capture_model ZZUSERZZ",
    "load-frame": "a in load_model ZZUSERZZ",
}


ID5_FAILING = {
    **ID5_PLACING,
    "sigkill": "SIGKILL ZZUSERZZ",
    "oomkilled": "OOMKilled ZZUSERZZ",
    "cpu-alloc": "DefaultCPUAllocator: not enough memory ZZUSERZZ",
    "torch-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ",
}


# An ERROR line that opens a message is still read anywhere in it (vLLM's own errors put the
# failure after their opening words), so the KV connectors' ERROR lines were read as the engine's.
# The ids in them are the API server's (`cmpl-<client id>-0-1a2b`): scan.py tells such a line by
# that id, as it does by the word "request".
ID5_CASES = [
    pytest.param(
        base,
        fmt,
        payload,
        id=f"{base}-{fmt}-{payload}",
    )
    for base in ID_BASES
    for fmt, (level, _) in sorted(LEVELED_CLIENT_LINES.items())
    for payload in sorted(ID5_FAILING if level == "ERROR" else ID5_PLACING)
]


@pytest.mark.parametrize("base_name,fmt,payload", ID5_CASES)
def test_client_text_in_vllm_032_lines_without_a_request_form_changes_nothing(base_name, fmt, payload):
    """ID_BASES holds two real non-memory crashes (an NCCL timeout, a watchdog) and two real
    runtime OOMs: the cause, phase, numbers and evidence stay the base's."""
    assert_unchanged(base_name, LEVELED_CLIENT_LINES[fmt][1](ID5_FAILING[payload]), "middle")


# An ERROR line that goes on a message is read from its opening words (the same call may log again
# in the same second: a separate message); a line shaped like an exception counts wherever it is (a
# log cut by its poster starts anywhere in a traceback). A client's newline in an ERROR line's value
# opens a line of its own: it is user text when its message named a request by its id.
NEWLINE_CASES = [
    pytest.param(base, fmt, payload, id=f"{base}-{fmt}-{payload}")
    for base in ["neg-2734-llama2-70b-tp8-timeout", "rt-27466-busy-loop"]
    for fmt in ["mistral-tool-call-id", "responses-summary-item", "mooncake-group-mismatch"]
    for payload in ["budget", "capture-frame", "torch-oom", "oomkilled"]
]


@pytest.mark.parametrize("base_name,fmt,payload", NEWLINE_CASES)
def test_a_newline_in_the_client_value_does_not_start_an_engine_line(base_name, fmt, payload):
    """The value is a JSON string (a tool call id, an item id, kv_transfer_params' id): with a newline
    in it, vLLM's formatter repeats the header and the client's text opens a line of its own."""
    line = LEVELED_CLIENT_LINES[fmt][1]("a\n" + ID5_FAILING[payload] + "\nb")
    header = line[: line.index("] ") + 2]
    assert_unchanged(base_name, vllm_log(header, line[len(header) :]), "middle")


@pytest.mark.parametrize("base_name", ["rt-27466-busy-loop", "neg-2734-llama2-70b-tp8-timeout"])
def test_a_log_full_of_implausible_figures_keeps_the_diagnosis_small(base_name):
    """Each implausible figure the engine printed (here 6,000 `Available KV cache memory: 5000 GiB`
    lines, each dropped as larger than any device) added a note of its own: 3,397 notes, 207 KB
    in the Diagnosis that goes into the VLLMService's status. A note per kind of number is enough."""
    figures = "\n".join(
        f"(EngineCore_DP0 pid=2441) INFO 12-01 04:{k // 60 % 60:02d}:{k % 60:02d} [gpu_worker.py:{k}] "
        f"Available KV cache memory: {5000 + k}.00 GiB"
        for k in range(6000)
    )
    d = classify(Signals(log=figures + "\n" + real_log(base_name)))
    assert d.cause == classify(Signals(log=real_log(base_name))).cause
    assert len(d.notes) <= 16 and len(json.dumps(d.to_dict())) < 16384


# A whole traceback in a warning's value (a newline in a tool call id, a KV connector's request id):
# its frame places the base's OOM in graph capture, its exception line ends the log's traceback.
FORGED_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model\n'
    "    x()\ntorch.OutOfMemoryError: CUDA out of memory. ZZUSERZZ"
)


FORGED_IN_VALUES = {
    "forged-traceback": FORGED_TRACEBACK,
    "forged-exception": "KeyboardInterruptZZUSERZZ: stop",
    "forged-starting": "EngineCore failed to start ZZUSERZZ",
}


@pytest.mark.parametrize("payload", sorted(FORGED_IN_VALUES))
@pytest.mark.parametrize("fmt", ["mistral-tool-call-id", "lmcache-reqid", "remote-kvs"])
@pytest.mark.parametrize(
    "base_name",
    [
        "rt-27466-busy-loop",
        "neg-2734-llama2-70b-tp8-timeout",
        "rt-qwen38flash2x3090-2-first-prompt",
        "rt-3430-lmcache-qwen3-8b-a5000-long-prompts",
    ],
)
def test_a_traceback_inside_a_warnings_value_is_the_value(base_name, fmt, payload):
    """runtime_oom -> cudagraph_capture_oom, unknown -> cudagraph_capture_oom (a memory change) or
    not_oom: the forged lines repeat the warning's header, as vLLM's formatter writes them."""

    def logged(value: str) -> str:
        line = LEVELED_CLIENT_LINES[fmt][1](value)
        header = line[: line.index("] ") + 2]
        return vllm_log(header, line[len(header) :])

    # The same line with a harmless value: a line about a request may say the server was serving
    # (the engine wrote it); what the value says must change nothing more.
    base_log = real_log(base_name)
    crafted = classify(Signals(log=with_lines(base_log, logged("a\n" + FORGED_IN_VALUES[payload] + "\nb"), "middle")))
    assert_same(crafted, classify(Signals(log=with_lines(base_log, logged("a\nb"), "middle"))))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


WARNING_VALUE = pytest.mark.xfail(
    strict=True,
    reason="a warning's known non-memory failure is a last resort when nothing else decides (it may say "
    "'not memory', never more); dropping it from warnings that do not open with the engine's words costs "
    "the corpus (test 106 -> 103 of 166). A value after a request's id (lmcache) is user text.",
)


@pytest.mark.parametrize("payload", ["NCCL WARN ZZUSERZZ", "Segmentation fault (core dumped) ZZUSERZZ"])
# (mistral.py's lines are a request's report, origin.py: its warnings' values decide nothing, as lmcache's)
@pytest.mark.parametrize("fmt", ["mistral-tool-call-id", "lmcache-reqid"])
def test_a_non_memory_failure_in_a_warnings_value_does_not_decide(fmt, payload):
    """unknown -> not_oom: never a memory change, but a cause the client chose."""
    assert_unchanged("rt-3430-lmcache-qwen3-8b-a5000-long-prompts", LEVELED_CLIENT_LINES[fmt][1](payload), "middle")


# --- Further client values in the engine's lines ---

# vLLM 0.32 makes more request ids from the client's X-Request-Id (or body request_id) than
# cmpl-/chatcmpl-/embd-/classify-/tokenize-: structured decisions ("decision-"), generative scoring
# ("generative-scoring-"), token-in-token-out ("generate-tokens-"), pooling ("pooling-", "score-"),
# speech to text ("transcribe-", "translate-"). A KV connector logs any of them without the word
# "request". (Server-made ids such as "rt-ws-<uuid>", "pool-<uuid>", "trsc-<uuid>" hold no client text.)
ID6_PREFIXES = [
    "decision-",
    "generative-scoring-",
    "generate-tokens-",
    "pooling-",
    "score-",
    "transcribe-",
    "translate-",
]


ID6_PAYLOADS = {
    "oom": "x torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.00 GiB is free. ZZUSERZZ",
    "kv": "x ValueError: No available memory for the cache blocks. ZZUSERZZ",
    "nccl": "x NCCL WARN ZZUSERZZ",
}


@pytest.mark.parametrize("payload", sorted(ID6_PAYLOADS))
@pytest.mark.parametrize("prefix", ID6_PREFIXES)
def test_every_api_request_id_prefix_is_user_text(prefix, payload):
    line = (
        ENGINE_CORE
        + "INFO 12-01 04:48:08 [vllm_v1_adapter.py:1227] Reqid: "
        + prefix
        + ID6_PAYLOADS[payload]
        + "-0-1a2b, Total tokens 12, LMCache hit tokens: 0, need to load: 0"
    )
    assert_unchanged("rt-3430-lmcache-qwen3-8b-a5000-long-prompts", line, "middle")


# The Responses API hands the body's request_id to the engine as it is, with no prefix
# (default "resp_<uuid>"): a KV connector's line then holds the client's text bare.
@pytest.mark.parametrize("payload", sorted(ID6_PAYLOADS))
def test_a_responses_request_id_is_user_text(payload):
    line = (
        ENGINE_CORE
        + "INFO 12-01 04:48:08 [vllm_v1_adapter.py:1227] Reqid: "
        + ID6_PAYLOADS[payload]
        + "-0-1a2b, Total tokens 12, LMCache hit tokens: 0, need to load: 0"
    )
    assert_unchanged("rt-3430-lmcache-qwen3-8b-a5000-long-prompts", line, "middle")


BARE_ID = pytest.mark.xfail(
    strict=True,
    reason="a Responses request_id is the client's whole id, and Mooncake's 'Async Mooncake lookup failed for "
    "<id>: <error>' names it with no word that says so; no general rule tells it from the engine's words.",
)


@pytest.mark.parametrize("payload", [pytest.param("nccl", marks=BARE_ID)])
def test_a_bare_responses_request_id_in_mooncakes_lookup_error(payload):
    line = (
        ENGINE_CORE
        + "ERROR 12-01 04:48:08 [worker.py:2436] Async Mooncake lookup failed for "
        + ID6_PAYLOADS[payload]
        + ": timeout"
    )
    assert_unchanged("rt-3430-lmcache-qwen3-8b-a5000-long-prompts", line, "middle")


# Any client can send the realtime endpoint an event that fails validation: the API server logs
# an ERROR with a traceback (connection.py), a request's error, which must not decide the crash.
@pytest.mark.parametrize("value", ["hello", ID6_PAYLOADS["oom"], ID6_PAYLOADS["nccl"]])
def test_a_realtime_events_error_does_not_decide(value):
    assert_unchanged(
        "rt-3430-lmcache-qwen3-8b-a5000-long-prompts", LEVELED_CLIENT_LINES["realtime-validation"][1](value), "middle"
    )


ID6_WARNING_FORMATS = [
    "mistral-named-tool",
    "tool-call-ast",
    "arg-converter",
    "responses-summary-item",
    "responses-tool-call-id",
    "tokenization-kwargs",
    "error-response",
]


@pytest.mark.parametrize(
    "fmt", [f if f.startswith("mistral-") else pytest.param(f, marks=WARNING_VALUE) for f in ID6_WARNING_FORMATS]
)
def test_a_non_memory_failure_in_other_warnings_values_does_not_decide(fmt):
    """unknown -> not_oom, as the mistral tool call id above: the same last resort."""
    assert_unchanged(
        "rt-3430-lmcache-qwen3-8b-a5000-long-prompts", LEVELED_CLIENT_LINES[fmt][1](ID6_PAYLOADS["nccl"]), "middle"
    )
