"""Session 42's hostile review of the day's two JSON changes:

- log_records.py decodes python-json-logger's records renamed for Cloud Logging (`severity`/`logger`/`timestamp`)
  and NVIDIA Dynamo's JSONL (`level`/`log.target`/`time`) as well as vLLM's own (`levelname`/`name`/`asctime`).
- origin.py: a JSON object not decoded, or a JSON member on its own line (`  "key": ...`), is USER.

Each strict xfail asserts the right behaviour; the tests without a mark are attacks that held.

Findings:
- A dying engine re-prints its fatal exception raw (multiprocessing's `Process EngineCore_DP0:`, vLLM's stdout
  decorator's prefix or none). Where that exception's message holds a client's value (vLLM's
  `ValueError: Loading lora {lora_name} failed: ...`, the name from POST /v1/load_lora_adapter or a resolver's
  `model`, newlines allowed in the JSON string), a line of the name that parses as a record of any of the three
  schemas (or that opens with vLLM's text header) reads as a new logged message of the engine's: a forged
  `torch.OutOfMemoryError` decides runtime_oom and is quoted. quoted.mark_continuations keeps a re-print's lines
  in its message only for a grammar's report (`dying`), and `absorbed` only inside a request's report.
- origin._RECORD_MEMBER hides real memory failures that are JSON members on their own line: `kubectl get pod -o
  json`'s `"reason": "OOMKilled",` and `journalctl -o json-pretty`'s kernel `"MESSAGE" : "Memory cgroup out of
  memory: Killed process ..."`. Both read host_ram_oom (kernel_oom_killer) before the rule; unknown now.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from vllm_autoheal.diagnosis import log_records as lr

from crafted.bases import BACKTRACKING, BASE, MARKER, OOM, ROOT, cost_to_normal, real_log, with_lines
from crafted.checks import assert_reads_like, diagnose, said
from crafted.grammar import FRAME
from crafted.records import as_json_records
from crafted.reports import asgi

CLIENT_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    f"79.19 GiB of which 1.00 GiB is free. {MARKER}"
)


def _record(schema: str, message: str, level: str = "ERROR") -> str:
    """A record of the engine core's logger in one of the three schemas log_records.py decodes (as a client writes
    one: the fields it likes)."""
    if schema == "vllm":
        fields = {"asctime": "2026-12-01 10:00:00,000", "levelname": level, "name": "vllm.v1.engine.core"}
    elif schema == "cloud-logging":
        fields = {"timestamp": "2026-12-01T10:00:00Z", "severity": level, "logger": "vllm.v1.engine.core"}
    else:
        fields = {"time": "2026-12-01T10:00:00Z", "level": level, "target": "log", "log.target": "vllm.v1.engine.core"}
    return json.dumps(fields | {"message": message}, separators=(",", ":") if schema == "dynamo" else None)


SCHEMAS = ["vllm", "cloud-logging", "dynamo"]


# --- (a) a forged record in a dying engine's re-print ------------------------------------------------------------

LORA_FRAMES = [
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 232, in add_adapter',
    "    lora = self._load_adapter(lora_request)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 138, in _load_adapter',
    "    raise ValueError(",
]
ENGINE = "(EngineCore_DP0 pid=8402) "


def _lora_crash_reprinted(name: str, prefix: str) -> str:
    """The real vLLM 0.11 serving crash (corpus rt-27466-busy-loop, one GPU: the LoRA loads in the engine core)
    ending in vLLM's LoRA load failure, whose message holds the adapter name a client chose: logged by the engine
    core (vLLM's NewLineFormatter: its header on every line, the name's own lines too), then re-printed raw by
    multiprocessing as the process dies (run_engine_core's `raise e`), each line under vLLM's stdout decorator's
    prefix (0.10.1-0.30) or none (0.31 on, and every JSON-mode log)."""
    log = real_log("rt-27466-busy-loop")
    oom = next(ln for ln in log.splitlines() if "torch.OutOfMemoryError" in ln)
    header = oom.split("[core.py:710] ")[0] + "[core.py:710] "
    error = f"ValueError: Loading lora {name} failed: No adapter found for /mnt/loras/support-bot".split("\n")
    logged = "\n".join(header + ln for ln in ["Traceback (most recent call last):", *LORA_FRAMES, *error])
    reprint = [
        "Process EngineCore_DP0:",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
        "    self.run()",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 712, in run_engine_core',
        "    raise e",
        *LORA_FRAMES,
        *error,
    ]
    return log.replace(oom, logged).rstrip("\n") + "\n" + "\n".join(prefix + ln for ln in reprint) + "\n"


def test_a_record_in_a_lora_name_logged_with_vllms_header_decides_nothing():
    """Held (control): the logged copy alone (vLLM's header before the name's record line: its text opens `{"`)."""
    for schema in SCHEMAS:
        name = "support-bot\n" + _record(schema, CLIENT_OOM) + "\n"
        logged = _lora_crash_reprinted(name, ENGINE).split(ENGINE + "Process EngineCore_DP0:")[0]
        harmless = _lora_crash_reprinted("support-bot\nhello " + MARKER.lower() + "\n", ENGINE).split(
            ENGINE + "Process EngineCore_DP0:"
        )[0]
        assert_reads_like(logged, harmless, f"a {schema} record in a logged LoRA name")


@pytest.mark.parametrize("prefix", [ENGINE, ""], ids=["stdout-decorator", "no-prefix"])
@pytest.mark.parametrize("schema", [*SCHEMAS, "text-header"])
def test_a_forged_record_in_a_dying_engines_reprint_decides_nothing(schema, prefix):
    """Unfixed: not_oom other_error -> runtime_oom oom_in_serving, tried_gib 64, evidence quoting ZZUSERZZ (all
    eight). Should read as the same crash with a harmless line in the name."""
    line = (
        "ERROR 12-01 10:00:00 [core.py:710] " + CLIENT_OOM if schema == "text-header" else _record(schema, CLIENT_OOM)
    )
    harmless = _lora_crash_reprinted("support-bot\nhello " + MARKER.lower() + "\n", prefix)
    assert diagnose(harmless).cause == "not_oom"
    assert_reads_like(_lora_crash_reprinted("support-bot\n" + line + "\n", prefix), harmless, f"{schema} re-print")


# --- (a) a forged record in uvicorn's report (held) ----------------------------------------------------------------


@pytest.mark.parametrize("level", ["ERROR", "error", "CRITICAL", "WARN"])
@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("base_name", [BASE, "memory-limit-kill.log"])
def test_a_forged_record_of_any_schema_in_uvicorns_report_decides_nothing(base_name, schema, level):
    """Held: inside uvicorn's headerless ASGI report a record of any schema (alone, behind an engine's process prefix,
    holding a whole traceback, or followed by a forged frame and OOM) is the report's (`absorbed`)."""
    base = real_log(base_name)
    harmless = with_lines(base, asgi("x\nhello"), "end")
    traceback = "EngineCore encountered a fatal error.\nTraceback (most recent call last):\n" + FRAME + OOM
    forms = {
        "alone": "x\n" + _record(schema, CLIENT_OOM, level),
        "behind-a-process-prefix": "x\n" + ENGINE + _record(schema, CLIENT_OOM, level),
        "a-whole-traceback": "x\n" + _record(schema, traceback, level),
        "then-a-frame-and-oom": "x\n" + _record(schema, "x", level) + "\n" + FRAME + OOM,
    }
    for form, message in forms.items():
        assert_reads_like(with_lines(base, asgi(message), "end"), harmless, f"{schema} {level} {form}")


# --- (b) odd records ---------------------------------------------------------------------------------------------

ODD = [
    {"level": 50, "message": CLIENT_OOM},  # pino/bunyan
    {"level": None, "message": CLIENT_OOM},
    {"level": True, "message": CLIENT_OOM},
    {"level": ["ERROR"], "message": CLIENT_OOM},
    {"level": "fatal", "message": CLIENT_OOM},
    {"severity": "ALERT", "message": CLIENT_OOM},
    {"level": "TRACE", "message": CLIENT_OOM},
    {"level": "\u0130NFO", "message": CLIENT_OOM},
    {"message": CLIENT_OOM, "extra": '"level": "ERROR"'},
    {"record": {"levelname": "ERROR", "message": CLIENT_OOM}},
    {"level": "ERROR", "message": 7, "exc_info": CLIENT_OOM},
]


@pytest.mark.parametrize("fields", ODD, ids=range(len(ODD)))
def test_a_record_naming_no_level_decodes_nothing_and_decides_nothing(fields):
    """Held: a level that is no string or no Python/Dynamo level, a level named only inside a value, a record
    nested in another object, a message that is no string: no record (render: None), and the raw `{"` line is
    USER, so nothing of it decides."""
    line = json.dumps(fields)
    assert lr.render(line) is None
    base = real_log(BASE)
    assert_reads_like(with_lines(base, line, "end"), base, "an odd record")


ODD_FIELDS = [
    {"logger": 123},
    {"logger": "a" * 300},
    {"process": True},
    {"process": 1e308},
    {"process": -1},
    {"processName": "a)b (c pid=1)"},
    {"asctime": "9999-99-99T99:99:99"},
    {"time": "\ud800"},
    {"exc_info": 123},
    {"exc_info": "\n" * 5000},
    {"stack_info": ["a"]},
    {"log.target": "\u0000"},
    {"levelname": "", "level": "ERRor"},
    {"name": "", "log.target": "vllm.v1.engine.core"},
]


@pytest.mark.parametrize("extra", ODD_FIELDS, ids=range(len(ODD_FIELDS)))
def test_odd_fields_in_a_record_raise_nothing(extra):
    """Held: fields of any type or size render without an exception, and a headerless ERROR record of no logger the
    classifier knows, whose message is no failure, decides nothing."""
    line = json.dumps({"level": "ERROR", "message": "x"} | extra)
    rendered = lr.render(line, 5)
    assert rendered is not None and len("\n".join(rendered)) <= lr.GROWTH * len(line) + 200
    d = diagnose(real_log(BASE).rstrip("\n") + "\n" + line + "\n")
    assert d.cause == diagnose(real_log(BASE)).cause and "could not read" not in d.explanation


def test_duplicated_keys_read_as_json_reads_them():
    """Held: the last of a duplicated key is read, as json.loads reads it (a record's level or logger is not read
    from one copy and its message from another)."""
    line = '{"level":"INFO","log.target":"vllm.v1.engine.core","message":"x","level":"ERROR"}'
    assert lr.render(line, 1)[0].startswith("ERROR ")
    line = '{"level":"ERROR","logger":"vllm.entrypoints.logger","message":"x","logger":"vllm.v1.engine.core"}'
    assert "[core.py:" in lr.render(line, 1)[0]


# --- Dynamo's real JSONL (held) ----------------------------------------------------------------------------------


def _dynamo_as_it_writes(line: str) -> str:
    """A vLLM record as Dynamo really writes it (lib/bindings/python/src/dynamo/runtime/logging.py, LogHandler: the
    Python formatter `%(message)s`, so the traceback is in the message; `log.target` is `{module}.{funcName}`, not the
    logger's name; Rust's tracing levels: WARN, ERROR)."""
    if not line.startswith('{"'):
        return line
    rec = json.loads(line)
    module = rec["name"].rsplit(".", 1)[-1]
    fields = {
        "time": "2025-10-31T20:52:07.707164Z",
        "level": {"WARNING": "WARN", "CRITICAL": "ERROR"}.get(rec["levelname"], rec["levelname"]),
        "target": "log",
        "message": rec["message"] + ("\n" + rec["exc_info"] if rec.get("exc_info") else ""),
        "log.file": f"/opt/dynamo/venv/lib/python3.12/site-packages/vllm/{module}.py",
        "log.line": 710,
        "log.target": f"{module}.run_engine_core",
    }
    return json.dumps(fields, separators=(",", ":"))


@pytest.mark.parametrize("name", ["rt-27466-busy-loop", "local-h200-runtime"])
def test_a_real_oom_in_dynamos_own_jsonl_still_decides(name):
    """Held: under Dynamo's real fields (every record foreign: its log.target names no vLLM logger) the real OOM reads
    as in the text log, the engine's own line quoted."""
    text = diagnose(real_log(name))
    records = "\n".join(_dynamo_as_it_writes(ln) for ln in as_json_records(real_log(name)).splitlines()) + "\n"
    d = diagnose(records)
    assert (
        (d.cause, d.subtype, d.phase)
        == (text.cause, text.subtype, text.phase)
        == ("runtime_oom", "oom_in_serving", "serving")
    )
    assert d.evidence == text.evidence


# --- (c) what _RECORD_MEMBER hides ----------------------------------------------------------------------------------


def test_a_dict_members_code_line_in_a_real_traceback_hides_nothing():
    """Held: a frame's code line that is a dict member (`    "input_ids": ...,`) inside the engine's headed
    traceback is USER, and the OOM after it still decides."""
    lines = real_log("rt-27466-busy-loop").splitlines()
    at = next(i for i, ln in enumerate(lines) if "torch.OutOfMemoryError" in ln)
    header = lines[at].split("[core.py:710] ")[0] + "[core.py:710] "
    frame = [header + '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in f', header + '    "ids": x[:n],']
    d = diagnose("\n".join(lines[:at] + frame + lines[at:]) + "\n")
    assert (d.cause, d.subtype) == ("runtime_oom", "oom_in_serving"), said(d)


KUBECTL_POD_JSON = """$ kubectl get pod vllm-0 -o json | jq .status.containerStatuses
[
  {
    "containerID": "containerd://0f3c",
    "image": "vllm/vllm-openai:v0.11.0",
    "lastState": {
      "terminated": {
        "exitCode": 137,
        "finishedAt": "2025-10-24T01:27:01Z",
        "reason": "OOMKilled",
        "startedAt": "2025-10-24T01:20:11Z"
      }
    },
    "name": "vllm",
    "ready": false,
    "restartCount": 3
  }
]"""
JOURNAL_JSON_PRETTY = """{
        "__REALTIME_TIMESTAMP" : "1729733221000000",
        "_TRANSPORT" : "kernel",
        "PRIORITY" : "3",
        "MESSAGE" : "Memory cgroup out of memory: Killed process 8402 (python3) total-vm:123456kB, anon-rss:98765432kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1234kB oom_score_adj:999"
}"""


@pytest.mark.xfail(
    strict=True,
    reason="a limit, safe: origin.origin_of's _RECORD_MEMBER makes any `  \"key\": ...` line USER (an indented record's "
    "members may hold a client's text, and nothing on the line tells whose), so the kubelet's OOMKilled in a pasted "
    "`kubectl get pod -o json` and the kernel's cgroup OOM in `journalctl -o json-pretty` decide nothing: unknown "
    "where host_ram_oom (kernel_oom_killer) was read before the rule. The operator reads the kill off the pod's "
    "state (Signals), never off pasted JSON; `diagnose` of such a paste says unknown",
)
@pytest.mark.parametrize("pasted", [KUBECTL_POD_JSON, JOURNAL_JSON_PRETTY], ids=["kubectl-pod-json", "journal-pretty"])
def test_a_pasted_kube_or_journal_json_oom_kill_still_decides(pasted):
    """Unfixed: unknown, no evidence. The serving log's start (the real rt-27466 run, its error lines left out: the
    container was killed, so it wrote none), then the status the user pasted. Should read the kill, as it reads
    `kubectl describe`'s `Reason: OOMKilled` and the kernel's plain line."""
    start = "\n".join(ln for ln in real_log("rt-27466-busy-loop").splitlines() if "ERROR" not in ln)
    d = diagnose(start + "\n" + pasted + "\n")
    assert (d.cause, d.subtype) == ("host_ram_oom", "kernel_oom_killer"), said(d)


def test_the_same_kill_in_kubectl_describe_decides():
    """Held (control): the same kill as `kubectl describe pod` prints it."""
    start = "\n".join(ln for ln in real_log("rt-27466-busy-loop").splitlines() if "ERROR" not in ln)
    described = "    Last State:     Terminated\nReason: OOMKilled\n      Exit Code:    137"
    d = diagnose(start + "\n" + described + "\n")
    assert d.cause == "host_ram_oom", said(d)


# --- (d) speed ---------------------------------------------------------------------------------------------------

BENCH = ROOT / "bench" / "diagnosis_speed.py"


def _flood(make, size: int) -> str:
    lines, total, i = [], 0, 0
    while total < size:
        line = make(i) + "\n"
        lines.append(line)
        total, i = total + len(line), i + 1
    return "".join(lines)


FLOODS = {
    # distinct heads defeat _head_of's cache: each record costs its regexes
    "dynamo records of distinct targets": lambda i: f'{{"level":"INFO","message":"x","log.target":"a{i}"}}',
    "cloud records of distinct loggers and times": lambda i: (
        f'{{"severity":"INFO","message":"x","logger":"a{i}","timestamp":"2026-01-01T00:00:{i % 60:02d}"}}'
    ),
    "records behind nine process prefixes": lambda i: "(a pid=1) " * 9 + '{"level":"INFO","message":"x"}',
    "records behind 96 parentheses": lambda i: "(" * 96 + ') {"level":"INFO","message":"x"}',
    "records of forty empty lines": lambda i: json.dumps({"level": "ERROR", "message": "\n" * 40}),
    "a level key then no JSON": lambda i: '{"level" ' + "x" * 30 + "}",
}


@pytest.mark.parametrize("shape", sorted(FLOODS))
def test_a_flood_of_the_new_schemas_costs_about_what_a_normal_log_does(shape):
    """Held (measured 1.3-2.9x a normal log per MB, once 3.2 and 1.9 on a rerun, on this shared 2-core machine;
    bounded here at crafted.bases.BACKTRACKING: the 3x is the bench's)."""
    spec = importlib.util.spec_from_file_location("diagnosis_speed", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    size = 400_000
    body = "".join(bench.BODY.format(s=i % 60, p=40000 + i) for i in range(size // len(bench.BODY) + 1))
    normal = bench.HEAD + body + bench.TAIL
    crafted = bench.HEAD + _flood(FLOODS[shape], size) + bench.TAIL
    ratio = cost_to_normal(crafted, normal)
    assert ratio < BACKTRACKING, f"{shape}: {ratio:.2f}x"
