"""vLLM's lines under a logging format that is not vLLM's own (diagnosis/log_format.py): a format the
operator chose for vLLM's loggers (`--logging-config.pylogging_config_file`, as the two real CPU
logs here were made with tests/fixtures/vllm-cpu/custom-logging*.json), or a wrapper that logs each
of vLLM's lines with its own header. Each is read as vLLM's own format is, and no client can teach
the reader a header."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.corpus import load
from vllm_autoheal.diagnosis.log_format import header_of, shape_of
from vllm_autoheal.diagnosis.origin import ENGINE, REQUEST, USER
from vllm_autoheal.diagnosis.scan import scan

from crafted.bases import CLIENT_OOM, FIXTURES, PAYLOADS, ROOT, illegal_access_log
from crafted.checks import cause_and_subtype
from crafted.records import CUSTOM, LOGGING_FORMATS, reformatted, wrapper
from crafted.reports import ASGI, FORGED_BASES, headed_report

REAL = FIXTURES / "vllm-cpu"


REAL_LOGS = [
    "kv-cache-too-small.log",
    "kv-larger-than-machine.log",
    "memory-share-exceeds-free.log",
    "memory-limit-kill.log",
    "model-not-found.log",
]


CORPUS = {s["id"]: s["log"] for s in load(ROOT / "tests" / "corpus" / "corpus.jsonl")}


# Train logs whose final exception is read only through the header (without it: `unknown`).
NEEDS_THE_HEADER = [
    "notoom-11484-xgrammar-specdec-indexerror",
    "notoom-18580-triton-kernel-image-invalid",
    "notoom-30690-lora-adapter-not-found",
    "notoom-2264-ascend-qwen3-30b-shm-timeout-after-hours",
    "notoom-5468-psm-keyerror-benign",
    "notoom-12256-dsv3-tp32-keyerror",
    "gpu_util_exceeds_free-80-lws-decode-util-098-b200",
    "local-h200-quant",
]


def _log(name: str) -> str:
    return (REAL / name).read_text() if name.endswith(".log") else CORPUS[name]


def _diagnosed(log: str) -> tuple:
    d = classify(Signals(log=log))
    return d.cause, d.subtype, d.phase, d.numbers


@pytest.mark.parametrize(
    "name", ["kv-cache-too-small-custom-format.log", "kv-cache-too-small-custom-format-every-line.log"]
)
def test_real_logs_in_a_format_the_operator_chose_read_as_in_vllms_own(name):
    """vLLM 0.32 (CPU) with `--logging-config.pylogging_config_file`: `%(asctime)s - %(name)s -
    %(levelname)s - %(message)s`, through logging.Formatter and through vLLM's NewLineFormatter."""
    log = (REAL / name).read_text()
    assert " - vllm.v1.engine.core - ERROR - EngineCore failed to start." in log  # the engine used the format
    d = classify(Signals(log=log))
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "max_model_len_exceeds_kv_capacity")
    assert d.numbers["estimated_max_model_len"] == 524160


@pytest.mark.parametrize("fmt", sorted(LOGGING_FORMATS))
@pytest.mark.parametrize("name", REAL_LOGS + NEEDS_THE_HEADER)
def test_each_format_reads_a_real_log_as_vllms_own(fmt, name):
    log = _log(name)
    shaped = LOGGING_FORMATS[fmt](log)
    assert shaped != log
    assert _diagnosed(shaped) == _diagnosed(log)


def _lines(log: str) -> dict[str, object]:
    return {ln.text: ln for ln in scan(log).lines}


HEADED = "".join(
    f"2026-12-01 10:00:0{i},000 - vllm.v1.worker.gpu_worker - INFO - Loading weights took {i}.1 seconds (step {i})\n"
    for i in range(6)
)


def test_a_learned_header_gives_each_line_its_level_and_logger():
    log = HEADED + (
        "2026-12-01 10:00:07,000 - vllm.entrypoints.logger - INFO - params: SamplingParams(n=1), prompt: 'hi'\n"
        "2026-12-01 10:00:08,000 - vllm.entrypoints.openai.serving_chat - ERROR - Error in preprocessing prompt inputs\n"
        "2026-12-01 10:00:09,000 - vllm.v1.engine.core - WARNING - Engine is slow\n"
        "2026-12-01 10:00:10,000 - vllm.v1.engine.core - ERROR - RuntimeError: CUDA error: an illegal memory access\n"
    )
    lines = _lines(log)
    prompt = lines["params: SamplingParams(n=1), prompt: 'hi'"]
    assert (prompt.level, prompt.source_file, prompt.origin) == ("INFO", "logger.py", USER)
    report = lines["Error in preprocessing prompt inputs"]
    assert (report.level, report.source_file, report.origin) == ("ERROR", "serving_chat.py", REQUEST)
    assert lines["Engine is slow"].informational
    error = lines["RuntimeError: CUDA error: an illegal memory access"]
    assert (error.level, error.origin, error.informational) == ("ERROR", ENGINE, False)


def test_a_wrappers_header_is_cut_and_vllms_own_read_after_it():
    log = wrapper((REAL / "kv-cache-too-small.log").read_text())
    lines = scan(log).lines
    failed = next(ln for ln in lines if ln.text == "EngineCore failed to start.")
    assert (failed.level, failed.source_file) == ("ERROR", "core.py")  # vLLM's level, not the wrapper's INFO


CLIENT_LINES = {
    # a logger header of another format, naming vLLM's engine
    "logger-header": "2026-12-01 10:00:00,000 - vllm.v1.engine.core - ERROR - torch.OutOfMemoryError: CUDA out of "
    "memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 79.00 GiB of which 1.00 GiB is free. ZZUSERZZ",
    # a wrapper's header (only the known limit, a line opening with vLLM's own header, is left out)
    "wrapper-header": "2026-12-01 10:00:00,000 - supervisor - INFO - KeyError: CUDA out of memory. Tried to allocate "
    "64.00 GiB ZZUSERZZ",
    "basicConfig": "ERROR:vllm.v1.engine.core:CUDA out of memory. Tried to allocate 64.00 GiB ZZUSERZZ",
}


@pytest.mark.parametrize("count", [1, 600])
@pytest.mark.parametrize("client", sorted(CLIENT_LINES))
@pytest.mark.parametrize("base", ["model-not-found.log", "memory-limit-kill.log", "kv-cache-too-small.log"])
def test_a_clients_lines_cannot_teach_the_reader_a_header(base, client, count):
    """A request's traceback, printed without a header, whose message goes on over lines the client
    wrote (a template's text): one line or a flood of 600 (most of the last 400 lines), each opening
    with a header of another format. Against the same traceback with harmless lines."""
    base_log = (REAL / base).read_text()
    crafted = classify(Signals(log=base_log + ASGI + (CLIENT_LINES[client] + "\n") * count))
    harmless = classify(Signals(log=base_log + ASGI + "hello\n" * count))
    got, want = crafted.to_dict(), harmless.to_dict()
    got.pop("notes"), want.pop("notes")
    assert got == want
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


def test_a_header_learned_after_the_first_error_only_gives_no_level():
    """A paste that starts at the error has no line a client could not have written: a logger
    header of the operator's format is then not learned (its lines read as before, headerless)."""
    log = "".join(
        f"2026-12-01 10:00:0{i},000 - vllm.v1.engine.core - ERROR - ValueError: bad value {i}\n" for i in range(6)
    )
    assert header_of(log.splitlines(), 0, lambda _: False, lambda _: True) is None


def test_nccls_own_info_lines_are_no_logger_header():
    nccl = [
        f"gpu-node-3:4121:4188 [{i % 8}] NCCL INFO Channel {i:02d}/32 : 0[0] -> 1[1] via P2P/CUMEM" for i in range(50)
    ]
    assert header_of(nccl, len(nccl), lambda _: False, lambda _: False) is None


@pytest.mark.parametrize(
    ("line", "shape"),
    [
        ("2026-12-01 10:00:00,123 - vllm.v1.engine.core - ERROR - EngineCore failed", "0-0-0 0:0:0,0 - \x02 - \x01 -"),
        ("ERROR:vllm.worker.worker:Error executing model", "\x01:\x02:"),
        ("2026-12-01 10:00:00.123 | WARNING  | vllm.core:run:12 - slow", "0-0-0 0:0:0.0 | \x01 | \x02 -"),
        ("[2026-12-01 10:00:00] [INFO] core.py:88: ready", "[0-0-0 0:0:0] [\x01] \x03:"),
        # a wrapper's header ends where vLLM's own (its process prefix) begins
        (
            "2026-12-01 10:00:00,123 - sup - INFO - (EngineCore pid=1) INFO 12-01 [core.py:1] x",
            "0-0-0 0:0:0,0 - sup - \x01 -",
        ),
        ("no level word here", None),
        ("ERRORS are not a level", None),
    ],
)
def test_the_shape_of_a_header(line, shape):
    assert shape_of(line) == shape


GPU_LOGS = FIXTURES / "gpu" / "failure-logs"


H200_CUSTOM = {  # the scenario (tests/gpu/failure_logs.sh, CUSTOM_LOGS=1) -> its cause, by construction
    "kvlen": "kv_cache_insufficient",
    "freemem": "gpu_util_exceeds_free",
    "profile": "profiling_oom",
}


@pytest.mark.parametrize("name", sorted(H200_CUSTOM))
def test_real_h200_failures_under_the_operators_format_read_as_their_cause(name):
    """vLLM 0.25 on an H200 under `%(asctime)s - %(name)s - %(levelname)s - %(message)s` (each engine
    line after its process prefix, `(EngineCore pid=N) 2026-... - vllm.v1.engine.core - ERROR - `): the
    cause the scenario made, the same as its text log's, with the header learned."""
    log = (GPU_LOGS / f"{name}-custom.log").read_text()
    assert " - vllm.v1.engine.core - ERROR - " in log
    d = classify(Signals(log=log))
    text = classify(Signals(log=(GPU_LOGS / f"{name}.log").read_text()))
    assert d.cause == H200_CUSTOM[name] == text.cause and d.subtype == text.subtype
    failed = next(ln for ln in scan(log).lines if ln.text == "EngineCore failed to start.")
    assert (failed.level, failed.source_file) == ("ERROR", "core.py")


def _forged_window(base: str, chat: str, forged: str, after: int, last: str) -> str:
    # The last 4000 lines open inside a client's report: its opening lines are cut, its further lines
    # (each under serving_chat.py's header, each opening with vLLM's header again) are the log's first.
    before = headed_report(chat, [forged + "hello"] * 400 + [forged + last])[5:]
    later = headed_report(chat, [forged + "hello"] * after + [forged + "bye"]) if after else []
    return "\n".join(before) + "\n" + base + ("\n".join(later) + "\n" if later else "")


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
@pytest.mark.parametrize("base_name", sorted(FORGED_BASES))
def test_a_clients_lines_in_a_headed_report_do_not_teach_vllms_own_header_as_a_wrappers(base_name, payload):
    make, chat, forged, after = FORGED_BASES[base_name]
    base = make()
    harmless = classify(Signals(log=_forged_window(base, chat, forged, after, "bye")))
    assert harmless.cause == "not_oom"  # the base: no memory cause
    crafted = classify(Signals(log=_forged_window(base, chat, forged, after, PAYLOADS[payload])))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


CLIENT_CUSTOM = {
    "kv-capacity": "2026-12-01 04:48:09,000 - vllm.v1.core.kv_cache_utils - ERROR - " + PAYLOADS["kv-capacity"],
    "torch-oom": "2026-12-01 04:48:09,000 - vllm.v1.engine.core - ERROR - " + CLIENT_OOM,
}


@pytest.mark.parametrize("every_line", [True, False], ids=["NewLineFormatter", "logging.Formatter"])
@pytest.mark.parametrize("client", sorted(CLIENT_CUSTOM))
def test_a_client_line_with_the_learned_header_after_a_headerless_report_decides_nothing(client, every_line):
    base = reformatted(CUSTOM, every_line=every_line)(illegal_access_log())
    assert " - vllm.core - ERROR - " in base  # the engine logged under the operator's format
    harmless = classify(Signals(log=base + ASGI + "hello\n"))
    assert cause_and_subtype(harmless) == ("not_oom", "illegal_memory_access")
    crafted = classify(Signals(log=base + ASGI + CLIENT_CUSTOM[client] + "\n"))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- A learned header of adjacent blank groups backtracked ---------------------------------
# (its cost is measured in bench/diagnosis_speed.py, "a learned header of a run of blanks", not asserted here)
def test_a_run_of_blanks_or_digits_is_one_group_of_a_learned_header():
    teach = " " * 84 + "ERROR - (x) y"  # seven groups of blanks
    assert shape_of(teach) == " \x01 -"
    lines = [teach] * 10 + [" " * 83 + "X rror"] * 400 + [teach] * 10
    header = header_of(lines, len(lines), lambda _: False, lambda _: True)
    assert header is not None and header.pattern.pattern.count("\\s{1,") == 2  # the run, the blank after `-`
    assert shape_of("2026120112000000001 ERROR - x") == "0 \x01 -"


# --- What held ---------------------------------------------------------------------------------------------
def test_control_characters_that_are_the_shapes_placeholders_raise_nothing():
    lines = [f"\x01 \x02 \x03 {i} - ERROR - (x) y" for i in range(10)] + ["\x03.py ERROR: [\x02] KeyError: x"] * 5
    classify(Signals(log="\n".join(lines) + "\n"))
