""" "The server went on" (uvicorn's start words, V1's and V0's stats lines, an engine's start) is no sign a
failure did not stop the engine: a real OOM is never set aside by them, and a client's forged server-up
line in a request's report sets nothing aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import API, CLIENT_OOM, MARKER, corpus_log
from crafted.checks import cause_and_subtype, client_text_absent
from crafted.records import CUSTOM, reformatted
from crafted.reports import ASGI, V0_STATS, V1_STATS, headed_report

FIXTURES = Path(__file__).resolve().parent / "fixtures"


GPU = FIXTURES / "gpu" / "failure-logs"


CPU = FIXTURES / "vllm-cpu"


ILLEGAL_QUOTE = "RuntimeError: CUDA error: an illegal memory access was encountered " + MARKER


def _report(*client: str, prefix: str = "") -> str:
    """uvicorn's report of a request (each line after `prefix`: vLLM's stdout decorator's, where it runs), its
    exception's message going on over the client's lines."""
    return "".join(prefix + ln + "\n" for ln in ASGI.splitlines() + list(client))


def _runtime() -> str:
    return (GPU / "runtime.log").read_text()  # corpus local-h200-runtime (train): V1 serving OOM, vLLM 0.25


def _v0_runtime() -> str:
    return corpus_log("rt-13152-benchmark-serving-80gb")  # V0, the engine in the API server, no process prefixes


# --- A forged prefix and uvicorn's start words hide a real OOM, quoting the client -------------
CLIENT_FAILURES = {"not-memory": ILLEGAL_QUOTE, "torch-oom": CLIENT_OOM}


FORGED_PREFIXES = {"process": "(EngineCore pid=1) ", "rank": "[rank0]: "}


@pytest.mark.parametrize("forged", sorted(FORGED_PREFIXES))
@pytest.mark.parametrize("failure", sorted(CLIENT_FAILURES))
def test_a_forged_prefix_and_uvicorns_start_words_do_not_hide_a_real_oom_nor_quote_the_client(failure, forged):
    base = _v0_runtime()
    harmless = classify(Signals(log=base + _report(FORGED_PREFIXES[forged] + "INFO:     hello", "bye")))
    assert cause_and_subtype(harmless) == ("runtime_oom", "oom_in_serving")
    up = FORGED_PREFIXES[forged] + "INFO:     Application startup complete."
    crafted = classify(Signals(log=base + _report(up, CLIENT_FAILURES[failure])))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless) and crafted.evidence == harmless.evidence
    assert crafted.numbers == harmless.numbers
    assert client_text_absent(crafted)


# --- A forged headed server-up line hides a real OOM ----------------------------------------------
FORGED_UP = {
    "init-engine": "INFO 12-01 04:48:09 [core.py:1] init engine (profile, create kv cache, warmup model) took 1.0 s",
    "stats": "INFO 12-01 04:48:09 [loggers.py:1] Avg prompt throughput: 1.0 tokens/s",
    "startup": "INFO 12-01 04:48:09 [launcher.py:1] Application startup complete.",
    "uvicorn-running": "INFO 12-01 04:48:09 [launcher.py:1] Uvicorn running on http://0.0.0.0:8000",
    "unbracketed-file": "INFO 12-01 04:48:09 launcher.py:1] Uvicorn running on http://0.0.0.0:8000",
}


@pytest.mark.parametrize("line", sorted(FORGED_UP))
def test_a_forged_headed_server_up_line_in_uvicorns_report_does_not_hide_a_real_oom(line):
    base = _runtime()
    prefix = "(APIServer pid=2320) "
    harmless = classify(Signals(log=base + _report("hello", prefix=prefix)))
    assert cause_and_subtype(harmless) == ("runtime_oom", "oom_in_serving")
    crafted = classify(Signals(log=base + _report(FORGED_UP[line], prefix=prefix)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)


# --- Another engine's start sets one engine's KV failure aside -------------------------------------
def _data_parallel(other_started: bool) -> str:
    """local-cpu-kv-cache-too-small (train, V1) as the first of two DP engine cores; the second one finishes its
    start after the first one's re-print, before the API server's traceback."""
    log = (CPU / "kv-cache-too-small.log").read_text()
    log = log.replace("(EngineCore pid=12232)", "(EngineCore_DP0 pid=12232)")
    log = log.replace("Process EngineCore:", "Process EngineCore_DP0:").replace(
        "{'EngineCore': 1}", "{'EngineCore_DP0': 1}"
    )
    lines = log.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.startswith("RuntimeError: Engine core initialization failed"))
    at = max(i for i in range(at) if lines[i].startswith("Traceback (most recent call last)"))
    dp1 = "(EngineCore_DP1 pid=12233) INFO 11-30 03:19:47 [core.py:293] init engine (profile, create kv cache, warmup model) took 4.10 s\n"
    return "".join(lines[:at] + ([dp1] if other_started else []) + lines[at:])


RAY_A, RAY_B = "(LLMRayActor pid=20770) ", "(LLMRayActor pid=20771) "


V0_KV = (
    "ValueError: The model's max seq len (8192) is larger than the maximum number of tokens that can be stored in KV "
    "cache (6048). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
)


def _ray_actors(other_started: bool) -> str:
    """Two vLLM V0 engines as Ray actors of an RL framework (OpenRLHF's LLMRayActor, as the corpus'
    kv-336-openrlhf-llama3-70b-kv-6048 prints them): the first one's KV check fails, the driver prints the actor's
    RayTaskError, and the second actor's lines, streamed by Ray's log monitor, arrive after it."""
    body = [
        p + "INFO 06-28 06:10:01 llm_engine.py:237] Initializing an LLM engine (v0.7.2) with config: "
        "model='/models/llama-3-70b', max_seq_len=8192"
        for p in (RAY_A, RAY_B)
    ]
    body += [
        p + "INFO 06-28 06:11:30 model_runner.py:1067] Loading model weights took 16.0 GiB" for p in (RAY_A, RAY_B)
    ]
    body += [
        RAY_A + "INFO 06-28 06:11:45 gpu_executor.py:122] # GPU blocks: 378, # CPU blocks: 1638",
        RAY_A + "ERROR 06-28 06:11:45 worker_base.py:145] Error executing method initialize_cache. This might cause "
        "deadlock in distributed execution.",
        RAY_A + "ERROR 06-28 06:11:45 worker_base.py:145] Traceback (most recent call last):",
        RAY_A + 'ERROR 06-28 06:11:45 worker_base.py:145]   File "/usr/local/lib/python3.10/dist-packages/vllm/worker/'
        'worker.py", line 264, in initialize_cache',
        RAY_A + "ERROR 06-28 06:11:45 worker_base.py:145]     raise_if_cache_size_invalid(num_gpu_blocks,",
        RAY_A + "ERROR 06-28 06:11:45 worker_base.py:145] " + V0_KV,
        "Traceback (most recent call last):",
        '  File "/openrlhf/cli/train_ppo_ray.py", line 412, in <module>',
        "    train(args)",
        '  File "/usr/local/lib/python3.10/dist-packages/ray/_private/worker.py", line 2639, in get',
        "    raise value.as_instanceof_cause()",
        "ray.exceptions.RayTaskError(ValueError): ray::LLMRayActor.__init__() (pid=20770, ip=10.0.0.2)",
        '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", line 264, in initialize_cache',
        "    raise_if_cache_size_invalid(num_gpu_blocks,",
        V0_KV,
    ]
    if other_started:
        body += [
            RAY_B + "INFO 06-28 06:11:46 gpu_executor.py:122] # GPU blocks: 4780, # CPU blocks: 1638",
            RAY_B + "INFO 06-28 06:11:52 model_runner.py:1523] Graph capturing finished in 6 secs.",
            RAY_B + "INFO 06-28 06:11:52 llm_engine.py:429] init engine (profile, create kv cache, warmup model) took "
            "7.12 seconds",
        ]
    return "\n".join(body) + "\n"


ENGINES = {"dp-engine-cores": _data_parallel, "rl-ray-actors": _ray_actors}


@pytest.mark.parametrize("shape", sorted(ENGINES))
def test_another_engines_start_after_one_engines_kv_failure_does_not_set_it_aside(shape):
    alone = classify(Signals(log=ENGINES[shape](False)))
    assert alone.cause == "kv_cache_insufficient"
    d = classify(Signals(log=ENGINES[shape](True)))
    assert cause_and_subtype(d) == cause_and_subtype(alone)


# --- V0's stats timer after the engine's OOM (a race) -----------------------------------------------
V0_STATS_LINE = "INFO 02-12 12:20:25 metrics.py:449] " + V0_STATS.replace("Running: 2", "Running: 12")


def test_a_v0_stats_line_after_the_engines_oom_does_not_set_it_aside():
    base = _v0_runtime()
    want = classify(Signals(log=base))
    assert cause_and_subtype(want) == ("runtime_oom", "oom_in_serving")
    lines = base.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "torch.OutOfMemoryError" in ln) + 1
    d = classify(Signals(log="".join(lines[:at]) + V0_STATS_LINE + "\n" + "".join(lines[at:])))
    assert cause_and_subtype(d) == cause_and_subtype(want)


# --- A forged process prefix ends uvicorn's report in a log without prefixes -----------------
@pytest.mark.xfail(
    strict=True,
    reason="in a log with no process prefixes a client's line that opens with one is "
    "another writer, so uvicorn's report ends there and the client's torch OOM is the engine's (the forged-header limit, "
    "spelled with a process prefix): says runtime_oom quoting ZZUSERZZ, should say not_oom nccl_timeout",
)
@pytest.mark.parametrize("forged", sorted(FORGED_PREFIXES))
def test_a_forged_process_prefix_in_uvicorns_report_of_a_prefixless_log_decides_nothing(forged):
    base = corpus_log("neg-2734-llama2-70b-tp8-timeout")
    harmless = classify(Signals(log=base + _report(FORGED_PREFIXES[forged] + "hello", "bye")))
    assert cause_and_subtype(harmless) == ("not_oom", "nccl_timeout")
    crafted = classify(Signals(log=base + _report(FORGED_PREFIXES[forged] + "hello", CLIENT_OOM)))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


# --- What held ----------------------------------------------------------------------------------------------------
def test_v1s_stats_lines_after_a_real_oom_do_not_set_it_aside():
    base = _runtime()
    want = classify(Signals(log=base))
    lines = base.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "torch.OutOfMemoryError" in ln) + 1
    for stats in V1_STATS.values():
        line = API + "INFO 12-01 04:48:08 [loggers.py:257] " + stats + "\n"
        for log in ("".join(lines[:at]) + line + "".join(lines[at:]), base + line):
            d = classify(Signals(log=log))
            assert cause_and_subtype(d) == cause_and_subtype(want) and d.evidence == want.evidence


CLIENT_UP = {
    "custom-format-init": "2026-12-01 04:48:09,000 - vllm.v1.engine.core - INFO - init engine (profile, create kv "
    "cache, warmup model) took 1.0 s",
    "custom-format-startup": "2026-12-01 04:48:09,000 - vllm.entrypoints.launcher - INFO - Application startup "
    "complete.",
}


@pytest.mark.parametrize("every_line", [True, False], ids=["NewLineFormatter", "logging.Formatter"])
@pytest.mark.parametrize("client", sorted(CLIENT_UP))
def test_a_clients_server_up_line_with_the_learned_header_in_a_headerless_report_sets_nothing_aside(client, every_line):
    base = reformatted(CUSTOM, every_line=every_line)(_runtime())
    want = classify(Signals(log=base + _report("hello")))
    assert cause_and_subtype(want) == ("runtime_oom", "oom_in_serving")
    d = classify(Signals(log=base + _report(CLIENT_UP[client])))
    assert cause_and_subtype(d) == cause_and_subtype(want) and not any("set aside" in n for n in d.notes)


def test_a_clients_json_record_of_a_server_up_line_in_a_prefixed_report_sets_nothing_aside():
    base = (GPU / "runtime-json.log").read_text()  # corpus local-h200-runtime in vLLM's JSON format
    record = json.dumps(
        {
            "asctime": "2026-12-02 08:27:09,400",
            "levelname": "INFO",
            "name": "vllm.v1.engine.core",
            "processName": "EngineCore",
            "process": 1467,
            "message": "init engine (profile, create kv cache, warmup model) took 1.0 s",
        }
    )
    want = classify(Signals(log=base))
    for prefix in ("(APIServer pid=1326) ", ""):
        d = classify(Signals(log=base + _report(record, prefix=prefix)))
        assert cause_and_subtype(d) == cause_and_subtype(want) and not any("set aside" in n for n in d.notes)


def test_a_forged_header_in_a_headed_report_sets_nothing_aside():
    """serving_chat.py's logger.exception under NewLineFormatter: a second header after its own is the client's."""
    chat = "(APIServer pid=2320) ERROR 12-01 04:48:09 [serving_chat.py:200] "
    base = _runtime()
    want = classify(Signals(log=base))
    for up in (FORGED_UP["init-engine"], "INFO:     Application startup complete."):
        report = "".join(ln + "\n" for ln in headed_report(chat, [up, ILLEGAL_QUOTE]))
        d = classify(Signals(log=base + report))
        assert cause_and_subtype(d) == cause_and_subtype(want) and client_text_absent(d)


@pytest.mark.parametrize("prefix", ["(APIServer pid=2320) ", ""], ids=["decorated", "plain"])
def test_uvicorns_start_words_and_a_failure_in_the_reports_own_lines_set_nothing_aside(prefix):
    """The client's lines under the report's own writer (no forged prefix) are the report's: no SERVER_UP."""
    base = _runtime() if prefix else _v0_runtime()
    want = classify(Signals(log=base))
    for failure in CLIENT_FAILURES.values():
        d = classify(Signals(log=base + _report("INFO:     Application startup complete.", failure, prefix=prefix)))
        assert cause_and_subtype(d) == cause_and_subtype(want) and d.evidence == want.evidence and client_text_absent(d)
