"""A hostile review of c8683e1 (diagnosis/outlived.py: a failure the server outlived does not decide; markers.py's
SERVER_UP milestones `init engine (profile, create kv cache, warmup model) took`, `Application startup complete`,
`Uvicorn running on`, `Avg prompt throughput`).

Each finding was an xfail(strict=True) test that FAILED on c8683e1 and said what the classifier did and what it
should. Severity in brackets; "new" means c8683e1~1 (d559954) answered right on the same input, "older" means it
already answered wrong.

Outcome, in the same session: c8683e1 is reverted (092d6c2). Findings 1, 2, 4 and 5 were its own and pass again
(plain tests now, guarding any later attempt); 5 decided it: a V0 server outlives its engine. Its launcher ends the
server only when a later request finds the engine dead (`AsyncLLMEngine has failed, terminating server process`,
seconds later in the corpus' logs), never with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH, and not at all before those
handlers (vLLM 0.5); its stats timer logs until then, so a real V0 OOM can be followed by stats lines, not only in a
race. "The server went on" is no sign a failure did not stop the engine. 3 is fixed in the shape V1 really prints
(writers.py: every line of the API server's carries its name, and a GPU memory failure on a raw line of the API
server's, where the engine runs apart, is no engine's); without that prefix it stays s14b-2's limit (a strict
xfail), as does the V0 stats case c8683e1 had set aside. 6 is older and stays a strict xfail (s9's limit: a
writer's mark a client can write).

1. [critical, new] In a log whose lines carry no process prefix (vLLM V0's API server, V1 before vLLM's stdout
   decorator: the corpus' rt-13152), a client's line in uvicorn's headerless report that opens with a process
   prefix (`(EngineCore pid=1) `, `[rank0]: `) is another writer's and ends the report (the older problem of 6). With
   uvicorn's level-only `INFO:     Application startup complete.` there and the client's own failure after it, the
   level-only rule ("only where a failure follows it") takes the client's failure as the one that follows: the real
   OOM is set aside and the client's line decides. rt-13152 (runtime_oom) -> not_oom illegal_memory_access quoting
   ZZUSERZZ (no heal); with the client's torch OOM after it, runtime_oom stays but its evidence and figures
   (tried_gib 64) are the client's. d559954: runtime_oom, the engine's own OOM quoted. Should: a failure a level-only
   line is followed by counts only if it is not in the same client-writable stretch (e.g. only a headed failure, or
   one of another process than the line's), or the level-only line never sets aside.
   -> test_a_forged_prefix_and_uvicorns_start_words_do_not_hide_a_real_oom_nor_quote_the_client[...]
2. [high, new] A SERVER_UP line under a forged vLLM header (with a file) in uvicorn's headerless report after the
   real crash (`INFO 12-01 04:48:09 [core.py:1] init engine (...) took 1.0 s`, or `[loggers.py:1] Avg prompt
   throughput`, `Application startup complete`, `Uvicorn running on`, glog-less `x.py:1]` too) sets the real OOM
   aside: local-h200-runtime runtime_oom oom_in_serving -> unknown allocation_failure_unplaced (no heal). It is s9's
   known limit (vLLM's header after a headerless exception) spelled as a progress line, but the limit only let a
   client add a failure before; now one INFO line of theirs hides the engine's. d559954: runtime_oom. Should: a
   single server-up line after a failure is not proof the server outlived it (a real restart prints a start-up, a
   serving server prints its stats again and again; a line in an open report's process may be the client's).
   -> test_a_forged_headed_server_up_line_in_uvicorns_report_does_not_hide_a_real_oom[...]
3. [critical, older: c8683e1's fix of s14b-2/s14c-1 does not reach a real V1 window] The fix sets a client's quote
   aside only when a SERVER_UP line follows it. In the operator's real window on a V1 server (the last N lines of a
   server that has served for a while) what follows the client's report is serving: access lines and V1's stats,
   which vLLM V1 prints as `Engine 000: Avg prompt throughput: ...` (per engine) or `2 Engines Aggregated: Avg prompt
   throughput: ...` (DP, aggregated). The row is the engine's words only at the line's opening, so these INFO lines
   are values (placement.OPENING) and no SERVER_UP: the client's headerless `torch.OutOfMemoryError ... ZZUSERZZ`
   after `[...]` decides again: not_oom illegal_memory_access -> runtime_oom oom_in_serving quoting ZZUSERZZ. The
   tests that now pass (s14b-2, s14c-1) put a whole start-up after the client's line, which one container's log
   never has. d559954: the same. V0's stats line (`Avg prompt throughput` first) does set the quote aside (held,
   below). Should: V1's stats lines count as the server's serving lines.
   -> test_after_a_gap_a_clients_quote_before_v1s_stats_lines_decides_nothing[...]
4. [high, new] Several engines in one log: each DP engine core prints its own `init engine ... took` (vLLM's
   `(EngineCore_DP1 pid=N) INFO ... [core.py] init engine ...`), as does each vLLM instance of an RL framework's Ray
   log (OpenRLHF's LLMRayActor, verl's WorkerDict) or each replica of a Ray Serve deployment. One engine's KV-cache
   failure, followed by another engine's start: the failure is set aside and the answer turns not-memory. The V1
   local-cpu-kv-cache-too-small as DP0 of two, DP1 done after DP0's re-print (before the API server's traceback),
   and a two-actor V0 Ray log whose other actor's start is streamed after the driver's RayTaskError:
   kv_cache_insufficient -> not_oom other_error (the KV message quoted as the evidence of "not memory"). d559954:
   kv_cache_insufficient. Should: a start-up milestone of another process (another process prefix, another DP
   index) says nothing of this one's failure; `init engine` is one engine's, not the server's.
   -> test_another_engines_start_after_one_engines_kv_failure_does_not_set_it_aside[...]
5. [high (a race), new] vLLM V0 with the engine in the API server process (`--disable-frontend-multiprocessing`,
   AsyncLLMEngine: the corpus' rt-13152) logs its stats from the API server's 10 s `_force_log` timer, which runs
   until uvicorn exits; AsyncLLMEngine.do_log_stats does not check that the engine died, and under load the line is
   INFO. When the timer fires between the engine's OOM traceback and the server's exit, `Avg prompt throughput: ...`
   follows the OOM: rt-13152 runtime_oom -> unknown allocation_failure_unplaced. d559954: runtime_oom. Should: a
   stats line is the server's serving only while the engine is alive (e.g. only if the engine printed anything after
   the failure, or two stats lines with throughput, or never for a failure after which nothing of the engine's
   follows).
   -> test_a_v0_stats_line_after_the_engines_oom_does_not_set_it_aside
6. [critical, older] The precondition of 1 on its own: in a log with no process prefixes, a client's line in
   uvicorn's headerless report that opens with a process prefix (or `[rank0]: `) is another writer's, so its own
   torch OOM there is an engine line: neg-2734 not_oom nccl_timeout -> runtime_oom oom_in_serving quoting ZZUSERZZ.
   d559954: the same. One more spelling of s9's known limit (a writer's mark the client writes), with a process
   prefix instead of vLLM's header. -> test_a_forged_process_prefix_in_uvicorns_report_of_a_prefixless_log_decides_nothing

What held (plain tests below): the request logger's echo, a client's line with the operator's learned header in a
headerless report, a JSON record in a prefixed report, a forged vLLM header in a headed (NewLineFormatter) report,
uvicorn's `INFO:` line and a client failure inside the report's own writer, V1's stats lines after a real OOM, and
V0's stats lines after a gap (the quote set aside). outlived.py is three linear passes over the findings (scan's
windows bound them): a 2 MB / 8 MB log of alternating `init engine`, OOM and `Application startup complete` lines
classifies in the same ~0.3-0.5 s as on d559954.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.scan import GAP_LINE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_diagnosis_log_format import reformatted  # noqa: E402
from test_diagnosis_s9_review import ASGI  # noqa: E402  (uvicorn's report of a request, printed without any header)
from test_diagnosis_s14_review import CUSTOM, TORCH_OOM, _corpus, _illegal_access  # noqa: E402
from test_diagnosis_s14_review import _report as s14_report  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GPU = FIXTURES / "gpu" / "failure-logs"
CPU = FIXTURES / "vllm-cpu"
USER = "ZZUSERZZ"
ILLEGAL_QUOTE = "RuntimeError: CUDA error: an illegal memory access was encountered " + USER


def _key(d) -> tuple:
    return d.cause, d.subtype


def _clean(d) -> bool:
    return USER not in json.dumps(d.to_dict())


def _report(*client: str, prefix: str = "") -> str:
    """uvicorn's report of a request (each line after `prefix`: vLLM's stdout decorator's, where it runs), its
    exception's message going on over the client's lines."""
    return "".join(prefix + ln + "\n" for ln in ASGI.splitlines() + list(client))


def _runtime() -> str:
    return (GPU / "runtime.log").read_text()  # corpus local-h200-runtime (train): V1 serving OOM, vLLM 0.25


def _v0_runtime() -> str:
    return _corpus("rt-13152-benchmark-serving-80gb")  # V0, the engine in the API server, no process prefixes


# --- 1. A forged prefix and uvicorn's start words hide a real OOM, quoting the client (critical, new) -------------
CLIENT_FAILURES = {"not-memory": ILLEGAL_QUOTE, "torch-oom": TORCH_OOM}
FORGED_PREFIXES = {"process": "(EngineCore pid=1) ", "rank": "[rank0]: "}


@pytest.mark.parametrize("forged", sorted(FORGED_PREFIXES))
@pytest.mark.parametrize("failure", sorted(CLIENT_FAILURES))
def test_a_forged_prefix_and_uvicorns_start_words_do_not_hide_a_real_oom_nor_quote_the_client(failure, forged):
    base = _v0_runtime()
    harmless = classify(Signals(log=base + _report(FORGED_PREFIXES[forged] + "INFO:     hello", "bye")))
    assert _key(harmless) == ("runtime_oom", "oom_in_serving")
    up = FORGED_PREFIXES[forged] + "INFO:     Application startup complete."
    crafted = classify(Signals(log=base + _report(up, CLIENT_FAILURES[failure])))
    assert _key(crafted) == _key(harmless) and crafted.evidence == harmless.evidence
    assert crafted.numbers == harmless.numbers
    assert _clean(crafted)


# --- 2. A forged headed server-up line hides a real OOM (high, new) ----------------------------------------------
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
    assert _key(harmless) == ("runtime_oom", "oom_in_serving")
    crafted = classify(Signals(log=base + _report(FORGED_UP[line], prefix=prefix)))
    assert _key(crafted) == _key(harmless)


# --- 3. V1's stats lines are no server-up line: the s14b-2 quote decides in a real V1 window (critical, older) ----
API = "(APIServer pid=2320) "
V1_STATS = {
    "per-engine": "Engine 000: Avg prompt throughput: 700.0 tokens/s, Avg generation throughput: 12.0 tokens/s, "
    "Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.9%, Prefix cache hit rate: 0.0%",
    "aggregated": "2 Engines Aggregated: Avg prompt throughput: 700.0 tokens/s, Avg generation throughput: 12.0 "
    "tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.9%, Prefix cache hit rate: 0.0%",
}
V0_STATS = (
    "Avg prompt throughput: 700.0 tokens/s, Avg generation throughput: 12.0 tokens/s, Running: 2 reqs, Swapped: 0 "
    "reqs, Pending: 0 reqs, GPU KV cache usage: 1.9%, CPU KV cache usage: 0.0%."
)


def _serving(stats: str) -> str:
    """A minute of a V1 server's serving, as its API server logs it: access lines and the stats line every 10 s."""
    out = []
    for i in range(6):
        out.append(API + f'INFO:     127.0.0.1:{52100 + i} - "POST /v1/completions HTTP/1.1" 200 OK\n')
        out.append(API + f"INFO 12-01 04:48:{10 + i:02d} [loggers.py:257] {stats}\n")
    return "".join(out)


def _crash() -> str:
    """The illegal-access crash of _illegal_access from the engine's dump of its input on (no start-up)."""
    lines = _illegal_access().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "[dump_input.py:" in ln)
    return "".join(lines[at:])


def _window(last: str, stats: str, prefix: str = "") -> str:
    # the operator's window opens inside the client's headerless report; the server serves on, then crashes
    return GAP_LINE + "\n" + (prefix + "hello\n") * 50 + prefix + last + "\n" + _serving(stats) + _crash()


# (vLLM V1 prefixes every line its API server writes, a web framework's report and the client's newlines in it
# included: the real shape, fixed in session 15 by writers.py; without that prefix it is s14b-2's limit)
CLIENT_LINES = {
    "as-v1-prints-them": API,
    "unprefixed": pytest.param(
        "",
        marks=pytest.mark.xfail(
            strict=True,
            reason="s15-3 [critical, older], s14b-2's limit where the client's lines carry no process prefix: after "
            "a gap a headerless quote cannot be told from a dying engine's raw output",
        ),
    ),
}


@pytest.mark.parametrize("prefix", list(CLIENT_LINES.values()), ids=list(CLIENT_LINES))
@pytest.mark.parametrize("stats", sorted(V1_STATS))
def test_after_a_gap_a_clients_quote_before_v1s_stats_lines_decides_nothing(stats, prefix):
    harmless = classify(Signals(log=_window("bye", V1_STATS[stats], prefix)))
    assert _key(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=_window(TORCH_OOM, V1_STATS[stats], prefix)))
    assert _key(crafted) == _key(harmless)
    assert _clean(crafted)


@pytest.mark.xfail(
    strict=True,
    reason="s14b-2's limit: after a gap a client's headerless quote cannot be told from a dying engine's raw output; "
    "c8683e1 set it aside before V0's stats line, and was reverted (s15-5: V0's server logs its stats after its "
    "engine died)",
)
def test_after_a_gap_a_clients_quote_before_v0s_stats_lines_decides_nothing():
    """Held on c8683e1 (V0's stats line opens with `Avg prompt throughput`); a limit again since its revert."""
    harmless = classify(Signals(log=_window("bye", V0_STATS)))
    assert _key(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=_window(TORCH_OOM, V0_STATS)))
    assert _key(crafted) == _key(harmless)
    assert _clean(crafted)


# --- 4. Another engine's start sets one engine's KV failure aside (high, new) -------------------------------------
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
    assert _key(d) == _key(alone)


# --- 5. V0's stats timer after the engine's OOM (high, a race, new) -----------------------------------------------
V0_STATS_LINE = "INFO 02-12 12:20:25 metrics.py:449] " + V0_STATS.replace("Running: 2", "Running: 12")


def test_a_v0_stats_line_after_the_engines_oom_does_not_set_it_aside():
    base = _v0_runtime()
    want = classify(Signals(log=base))
    assert _key(want) == ("runtime_oom", "oom_in_serving")
    lines = base.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "torch.OutOfMemoryError" in ln) + 1
    d = classify(Signals(log="".join(lines[:at]) + V0_STATS_LINE + "\n" + "".join(lines[at:])))
    assert _key(d) == _key(want)


# --- 6. A forged process prefix ends uvicorn's report in a log without prefixes (critical, older) -----------------
@pytest.mark.xfail(
    strict=True,
    reason="s15-6 [critical, older]: in a log with no process prefixes a client's line that opens with one is "
    "another writer, so uvicorn's report ends there and the client's torch OOM is the engine's (s9's limit spelled "
    "with a process prefix): not_oom nccl_timeout -> runtime_oom quoting ZZUSERZZ",
)
@pytest.mark.parametrize("forged", sorted(FORGED_PREFIXES))
def test_a_forged_process_prefix_in_uvicorns_report_of_a_prefixless_log_decides_nothing(forged):
    base = _corpus("neg-2734-llama2-70b-tp8-timeout")
    harmless = classify(Signals(log=base + _report(FORGED_PREFIXES[forged] + "hello", "bye")))
    assert _key(harmless) == ("not_oom", "nccl_timeout")
    crafted = classify(Signals(log=base + _report(FORGED_PREFIXES[forged] + "hello", TORCH_OOM)))
    assert _key(crafted) == _key(harmless)
    assert _clean(crafted)


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
            assert _key(d) == _key(want) and d.evidence == want.evidence


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
    assert _key(want) == ("runtime_oom", "oom_in_serving")
    d = classify(Signals(log=base + _report(CLIENT_UP[client])))
    assert _key(d) == _key(want) and not any("set aside" in n for n in d.notes)


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
        assert _key(d) == _key(want) and not any("set aside" in n for n in d.notes)


def test_a_forged_header_in_a_headed_report_sets_nothing_aside():
    """serving_chat.py's logger.exception under NewLineFormatter: a second header after its own is the client's."""
    chat = "(APIServer pid=2320) ERROR 12-01 04:48:09 [serving_chat.py:200] "
    base = _runtime()
    want = classify(Signals(log=base))
    for up in (FORGED_UP["init-engine"], "INFO:     Application startup complete."):
        report = "".join(ln + "\n" for ln in s14_report(chat, [up, ILLEGAL_QUOTE]))
        d = classify(Signals(log=base + report))
        assert _key(d) == _key(want) and _clean(d)


@pytest.mark.parametrize("prefix", ["(APIServer pid=2320) ", ""], ids=["decorated", "plain"])
def test_uvicorns_start_words_and_a_failure_in_the_reports_own_lines_set_nothing_aside(prefix):
    """The client's lines under the report's own writer (no forged prefix) are the report's: no SERVER_UP."""
    base = _runtime() if prefix else _v0_runtime()
    want = classify(Signals(log=base))
    for failure in CLIENT_FAILURES.values():
        d = classify(Signals(log=base + _report("INFO:     Application startup complete.", failure, prefix=prefix)))
        assert _key(d) == _key(want) and d.evidence == want.evidence and _clean(d)
