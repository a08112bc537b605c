"""Session 42's hostile review of the three fixes of the day:

- b70ed3a (remedy/host_steps.py, offload_pinned.py): host-memory heals sized to what the flags pin.
- 476567b (diagnosis/origin.py): a line that opens with `{"` (a JSON object log_records.py did not decode) is USER.
- 50a30b7 (diagnosis/quoted.py _VALUED): an exception whose message opens `Loading lora ` names no failure.

Each strict xfail asserts the right behaviour; the tests without a mark are attacks that held.
"""

from __future__ import annotations

import json

import pytest

from test_review_session42_heal import _host_oom as host_oom
from test_review_session42_steer import (
    HARMLESS_QUERY,
    LONG,
    LORA_FRAMES,
    OOM_QUERY,
    OOM_WORDS,
    _access_record,
    _before_crash,
    _json_base,
)
from vllm_autoheal.offload_pinned import HOST_BASE_GIB, HOST_PER_RANK_GIB
from vllm_autoheal.quantity import parse_quantity

from crafted.bases import MARKER, illegal_access_log, real_log
from crafted.checks import assert_reads_like, diagnose
from crafted.records import as_json_records

GIB = 2**30
ONE_RANK = HOST_BASE_GIB + HOST_PER_RANK_GIB  # vLLM's processes for one rank: 3.2 GiB


def _host_oom(limit_gib: float, engine: dict, bound: str | None = None, shape: str = "qwen3-30b-a3b"):
    """A container OOM-killed at `limit_gib` on one H100 (test_review_session42_heal's, Qwen3-30B-A3B by default)."""
    return host_oom(limit_gib, engine, bound, shape)[1]


# --- b70ed3a: the host-memory heals --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["1e300", "1e308"])
def test_a_huge_kv_offloading_size_plans_without_an_exception(size):
    engine = {"maxModelLen": 4096, "extraArgs": ["--kv-offloading-size", size]}
    r = _host_oom(32, engine, bound="256Gi", shape="qwen2.5-32b")
    assert r.action != "RaiseMemoryLimit" or parse_quantity(r.changes["memory_limit"]) <= parse_quantity("256Gi")


@pytest.mark.parametrize("size", ["nan", "inf", "-5", "many"])
def test_an_unreadable_kv_offloading_size_plans_without_an_exception(size):
    """Held: a size that is no finite non-negative number is not counted (besides_offload_gib: None), and the raise
    falls back to VPA's bump within the bound."""
    engine = {"maxModelLen": 4096, "extraArgs": ["--kv-offloading-size", size]}
    r = _host_oom(32, engine, bound="256Gi", shape="qwen2.5-32b")
    assert r.action == "RaiseMemoryLimit", r.summary()
    assert parse_quantity(r.changes["memory_limit"]) <= parse_quantity("256Gi")


# vLLM's external data-parallel load balancing (llm-d's wide-EP, one pod per DP rank): `--data-parallel-rank K`
# (-dpn) makes data_parallel_size_local 1 whatever --data-parallel-size says (vllm/engine/arg_utils.py
# create_engine_config: "data_parallel_external_lb = self.data_parallel_rank is not None ... data_parallel_size_local
# = 1"). This pod runs one engine of one rank.
EXTERNAL_LB = ["--data-parallel-size", "8", "--data-parallel-rank", "3"]


@pytest.mark.parametrize("rank_flag", ["--data-parallel-rank", "-dpn"])
def test_an_external_lb_rank_is_one_local_engine_for_the_offload_cut(rank_flag):
    extra = [*EXTERNAL_LB[:2], rank_flag, "3", "--kv-offloading-size", "8"]
    r = _host_oom(48, {"maxModelLen": 4096, "cpuOffloadGb": 20.0, "extraArgs": extra})
    assert r.action == "LowerCpuOffload", r.summary()
    assert r.changes["cpu_offload_gb"] <= (48 * 0.9 - ONE_RANK - 8) / 2, r.summary()


def test_an_external_lb_rank_is_one_local_engine_for_the_raise():
    extra = [*EXTERNAL_LB, "--kv-offloading-size", "8"]
    r = _host_oom(48, {"maxModelLen": 4096, "cpuOffloadGb": 20.0, "extraArgs": extra}, bound="96Gi")
    assert r.action in ("RaiseMemoryLimit", "LowerCpuOffload"), r.summary()
    if r.action == "RaiseMemoryLimit":
        assert parse_quantity(r.changes["memory_limit"]) <= parse_quantity("96Gi"), r.summary()


def test_a_data_parallel_size_alone_counts_every_local_engine():
    """Held (control): `-dp 2` without a rank runs both engines here: two ranks, two buffers, and the cut is sized
    for both: (48 x 0.9 - (2.6 + 1.2 + 2 x 4)) / 2 ranks / 2 (the rounding's bound) = 7.85 GiB."""
    extra = ["-dp", "2", "--kv-offloading-size", "4"]
    r = _host_oom(48, {"maxModelLen": 4096, "cpuOffloadGb": 20.0, "extraArgs": extra})
    assert r.action == "LowerCpuOffload", r.summary()
    assert r.changes["cpu_offload_gb"] <= (48 * 0.9 - (HOST_BASE_GIB + 2 * HOST_PER_RANK_GIB + 8)) / 2 / 2


KV_CONNECTOR = ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}']


def test_a_cut_is_not_sized_from_a_limit_whose_other_holdings_cannot_be_told():
    r = _host_oom(48, {"maxModelLen": 4096, "cpuOffloadGb": 20.0, "extraArgs": KV_CONNECTOR})
    assert r.action == "LowerCpuOffload", r.summary()
    assert "limit holds 0 " not in r.summary()
    assert r.changes["cpu_offload_gb"] == 10.0, r.summary()  # (the docstring's "else half")


def test_the_offload_ignored_by_a_v2_runner_is_neither_raised_for_nor_cut(monkeypatch):
    """Held: where ctx.offload_ignored() (here forced, as the V2 runner of 0.22-0.27 ignores the flag), the raise
    holds only the KV buffer and vLLM's processes, and no offload cut is planned."""
    from vllm_autoheal.remedy import model as remedy_model

    engine = {"maxModelLen": 4096, "cpuOffloadGb": 40.0, "extraArgs": ["--kv-offloading-size", "20"]}
    monkeypatch.setattr(remedy_model.Context, "offload_ignored", lambda self: True)
    r = _host_oom(16, engine, bound="256Gi")
    assert r.action == "RaiseMemoryLimit", r.summary()
    new = parse_quantity(r.changes["memory_limit"]) / GIB
    assert 20 + ONE_RANK <= new <= (20 + ONE_RANK) / 0.9 + 0.01, r.summary()
    assert "cpu_offload_gb" not in r.summary()


# --- 476567b: a JSON object never decides --------------------------------------------------------------------------


def _dynamo(line: str) -> str:
    """A vLLM JSON record as NVIDIA Dynamo's JSONL logging prints it (DYN_LOGGING_JSONL=true, docs/observability/
    logging.md: `{"time":...,"level":"INFO","target":"log","message":...,"log.file":...,"log.line":...,
    "log.target":...}`), the traceback in the message."""
    if not line.startswith('{"'):
        return line
    rec = json.loads(line)
    message = rec["message"] + ("\n" + rec["exc_info"] if rec.get("exc_info") else "")
    path = "/usr/local/lib/python3.12/dist-packages/" + rec["name"].replace(".", "/") + ".py"
    fields = {"time": "2025-10-31T20:52:07.707164Z", "level": rec["levelname"], "target": "log", "message": message}
    return json.dumps(fields | {"log.file": path, "log.line": 710, "log.target": rec["name"]}, separators=(",", ":"))


def _severity(line: str) -> str:
    """A vLLM JSON record as python-json-logger prints it with rename_fields for Google Cloud Logging."""
    if not line.startswith('{"'):
        return line
    names = {"asctime": "timestamp", "levelname": "severity", "name": "logger"}
    return json.dumps({names.get(k, k): v for k, v in json.loads(line).items()})


@pytest.mark.parametrize("form", [_dynamo, _severity], ids=["dynamo-jsonl", "severity-keyed"])
def test_a_real_engine_oom_in_another_json_schema_still_decides(form):
    log = real_log("rt-27466-busy-loop")
    assert (diagnose(log).cause, diagnose(log).subtype) == ("runtime_oom", "oom_in_serving")
    records = "\n".join(form(line) for line in as_json_records(log).splitlines()) + "\n"
    d = diagnose(records)
    assert (d.cause, d.subtype) == ("runtime_oom", "oom_in_serving")


def _indented(query: str) -> str:
    """uvicorn's access record under python-json-logger's JsonFormatter(json_indent=2): one field a line."""
    return json.dumps(json.loads(_access_record(query, 10)), indent=2)


def test_an_indented_json_access_record_is_no_engine_failure():
    lines = illegal_access_log().splitlines()
    harmless = _before_crash(lines, _indented(HARMLESS_QUERY))
    assert diagnose(harmless).cause == "not_oom"
    assert_reads_like(_before_crash(lines, _indented(OOM_QUERY)), harmless, "an indented JSON access record")


@pytest.mark.parametrize(
    "before",
    [" ", "\t", "\x1b[0m", "[pod/vllm-0/vllm] ", "2026-12-01T04:48:07.123456789Z stdout F "],
    ids=["blank", "tab", "ansi", "kubectl-prefix-every-line", "cri-every-line"],
)
def test_a_long_record_behind_whitespace_colour_or_a_collectors_prefix_is_no_engine_failure(before):
    """Held: a long record behind a blank, a tab, a colour code, or a collector's prefix that stands before every
    line of the log (kubectl logs --prefix, a node's CRI file) is still no engine failure."""
    base = _json_base()
    if before.strip() and not before.startswith("\x1b"):
        base = [before + line for line in base]

    def log(query: str) -> str:
        return _before_crash(base, before + _access_record(query, LONG))

    assert diagnose(log(HARMLESS_QUERY)).cause == "not_oom"
    assert_reads_like(log(OOM_QUERY), log(HARMLESS_QUERY), "a record behind a prefix")


# --- 50a30b7: `Loading lora ` names no failure ---------------------------------------------------------------------


def _tp2_lora_crash(name: str) -> str:
    """The real vLLM 0.11 serving crash (rt-27466-busy-loop) on two TP ranks (MultiprocExecutor): the worker's
    LoRA load failure (an adapter evicted by --max-cpu-loras, loaded again in execute_model), and the engine core's
    fatal error, v1/executor/multiproc_executor.py's `RuntimeError(f"Worker failed with error '{result}', please
    check the stack trace above for the root cause")`, which quotes the worker's message: the client's name."""
    log = real_log("rt-27466-busy-loop")
    oom = next(ln for ln in log.splitlines() if "torch.OutOfMemoryError" in ln)
    core = oom.split("[core.py:710] ")[0] + "[core.py:710] "
    worker = "(Worker_TP1 pid=8481) ERROR 10-24 01:26:57 [multiproc_executor.py:703] "
    message = f"Loading lora {name} failed: No adapter found for /mnt/loras/support-bot"
    lines = [
        *(worker + ln for ln in ["WorkerProc hit an exception.", "Traceback (most recent call last):", *LORA_FRAMES]),
        worker + "ValueError: " + message,
        core + f"RuntimeError: Worker failed with error '{message}', please check the stack trace above for the "
        "root cause",
    ]
    return log.replace(oom, "\n".join(lines))


def test_a_client_chosen_lora_name_quoted_by_the_executor_is_no_oom():
    """(The subtype may differ: the executor's wrapper row reads as 'of another failure' only a quote with no
    allocation words, so the crafted name leaves the worker's own ValueError, other_error, to say not memory.
    Either way: not memory, nothing of the client's quoted.)"""
    harmless = diagnose(_tp2_lora_crash("support-bot-" + MARKER.lower()))
    crafted = diagnose(_tp2_lora_crash(OOM_WORDS))
    assert harmless.cause == crafted.cause == "not_oom", (crafted.cause, crafted.subtype)
    assert MARKER not in json.dumps(crafted.to_dict()) and "OutOfMemory" not in json.dumps(crafted.evidence)


@pytest.mark.parametrize(
    "extra,engines",
    [
        (["--data-parallel-size", "8", "--data-parallel-rank", "3"], 1),
        (["-dp", "8", "-dpn", "3"], 1),
        (["-dp", "4", "--data-parallel-external-lb", "--nnodes", "4", "--node-rank", "1"], 1),
        (["-dp", "8", "--nnodes", "2"], None),  # (vLLM infers the local size from the node's world: not plain)
        (["-dp", "8", "--nnodes", "2", "-dpl", "4"], 4),
        (["-dp", "2"], 2),
    ],
)
def test_the_local_engines_as_vllm_counts_them(extra, engines):
    """vLLM 0.32's create_engine_config: an external load balancer's rank runs one engine here whatever the size;
    several nodes infer the local size (not said plainly: None, so nothing is sized from it); else the local size,
    else the size."""
    from vllm_autoheal.local_ranks import data_parallel_here

    assert data_parallel_here(extra) == engines
