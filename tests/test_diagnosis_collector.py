"""A log collector's prefix on every line (stern, kubectl --prefix, journald, mpirun, a tag, a
quoted paste) is cut, so the engine's traceback underneath is read; a line with structure of its
own is never changed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis import scan as scan_module
from vllm_autoheal.diagnosis.collector import prefix_of
from vllm_autoheal.diagnosis.scan import scan, structured

from crafted.bases import CORPUS, PAYLOADS, ROOT, illegal_access_log, real_log, with_lines
from crafted.checks import assert_same, cause_and_subtype, cause_of, client_text_absent, diagnose
from crafted.reports import ASGI
from crafted.request_logging import FORMATS, OOM_IN_REQUEST_ID

TRACEBACK = (
    "INFO 05-01 12:00:00 [gpu_model_runner.py:100] Starting to load model meta-llama/Llama-3.1-8B...\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/site-packages/vllm/model_executor/model_loader/utils.py", line 64, in initialize_model\n'
    "    return model_class(vllm_config=vllm_config, prefix=prefix)\n"
    "KeyError: 'model.layers.0.mlp.gate_proj.weight'\n"
)


KV = (
    "INFO 05-01 12:00:00 model_runner.py:100] Loading model weights took 14.99 GB\n"
    "INFO 05-01 12:00:01 gpu_executor.py:83] # GPU blocks: 0, # CPU blocks: 2048\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.10/site-packages/vllm/engine/llm_engine.py", line 1, in _initialize_kv_caches\n'
    "    self.model_executor.initialize_cache(num_gpu_blocks)\n"
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
    "when initializing the engine.\n"
)


COLLECTORS = {
    "stern": "vllm-7d9f8c-x2x4q vllm ",
    "kubectl --prefix": "[pod/vllm-7d9f8c-x2x4q/vllm] ",
    "journald": "Dec 01 12:00:00 gpu-node-3 vllm[41234]: ",
    "mpirun --tag-output": "[1,0]<stdout>:",
    "a compose tag": "[vllm]: ",
    "a quoted paste": "> ",
}


def prefixed(prefix: str, log: str) -> str:
    return "".join(prefix + line + "\n" for line in log.splitlines())


@pytest.mark.parametrize("collector", COLLECTORS)
def test_the_engine_under_a_collectors_prefix_is_read(collector):
    plain = classify(Signals(log=TRACEBACK))
    assert (plain.cause, plain.subtype) == ("not_oom", "other_error")
    d = classify(Signals(log=prefixed(COLLECTORS[collector], TRACEBACK)))
    assert (d.cause, d.subtype) == ("not_oom", "other_error") and "KeyError" in d.evidence[0]
    kv = classify(Signals(log=prefixed(COLLECTORS[collector], KV)))
    assert kv.cause == "kv_cache_insufficient"


def test_stern_pod_prefix_is_cut_when_its_containers_differ():
    lines = [
        f"vllm-7d9f8c-x2x4q {c} {t}"
        for c, t in zip(["vllm", "sidecar", "vllm", "sidecar", "vllm"], TRACEBACK.splitlines(), strict=True)
    ]
    prefix = prefix_of(lines, structured)
    assert prefix is not None and all(prefix.match(line).end() == len("vllm-7d9f8c-x2x4q vllm ") for line in lines[::2])


def test_no_prefix_on_a_plain_log_nor_a_bare_token_on_a_few_lines():
    assert prefix_of(TRACEBACK.splitlines(), structured) is None
    assert prefix_of(["x y Traceback (most recent call last):", "x y KeyError: 1"], structured) is None


LORA = "ValueError: LoRA rank 64 is greater than max_lora_rank 16.\n"


@pytest.mark.parametrize("collector", ["journald", "kubectl --prefix", "mpirun --tag-output", "a quoted paste"])
def test_a_pasted_line_or_two_under_a_shape_only_a_collector_writes_is_read(collector):
    """A thread's excerpt of one to three lines: too few to tell a bare token (stern's pod name)
    from the first word of a line, but journald's header, a tag or a quote on each of them is a
    collector's."""
    for log in (LORA, "Traceback (most recent call last):\n" + LORA):
        d = classify(Signals(log=prefixed(COLLECTORS[collector], log)))
        assert (d.cause, d.subtype) == ("not_oom", "other_error"), (collector, log, d.explanation)
    assert prefix_of(["> " + LORA.strip(), "ValueError: 1"], structured) is None  # not on every line


def test_a_prefix_on_most_lines_never_changes_a_line_with_structure_of_its_own():
    # Someone else's lines (an app printing raw text) all open with "Traceback x": the engine's
    # own traceback and headed lines are left whole, and the engine's error still decides.
    noise = "".join(f"Traceback x {i}\n" for i in range(60))
    d = classify(Signals(log=noise + TRACEBACK))
    assert (d.cause, d.subtype) == ("not_oom", "other_error")
    texts = {line.text for line in scan(noise + KV).lines}
    assert "Traceback (most recent call last):" in texts
    assert classify(Signals(log=noise + KV)).cause == "kv_cache_insufficient"


def test_srun_labels_every_tasks_lines_with_its_number_and_all_are_cut():
    """srun --label puts the task's number (padded to the widest) before each line; tasks interleave,
    so no one number opens 80 % of the lines: the label's shape is the prefix."""
    lines = KV.splitlines()
    log = "".join(f"{(i % 3) * 5:>2}: {line}\n" for i, line in enumerate(lines))  # tasks 0, 5, 10
    assert classify(Signals(log=log)).cause == "kv_cache_insufficient"
    assert classify(Signals(log=prefixed(" 3: ", TRACEBACK))).cause == "not_oom"


@pytest.mark.parametrize(
    "prefix",
    ["<launcher 12:00:0{i}> ", "job-4711 step {i} :: ", "[gpu-node-{i}]| ", "rollout.{i} >> "],
)
def test_any_collectors_prefix_the_same_words_digits_aside_is_cut(prefix):
    """A prefix of a shape no rule names: the same words on every line, only its digits differ."""

    def shaped(log: str) -> str:
        return "".join(prefix.format(i=i % 10) + line + "\n" for i, line in enumerate(log.splitlines()))

    assert classify(Signals(log=shaped(KV))).cause == "kv_cache_insufficient"
    d = classify(Signals(log=shaped(TRACEBACK)))
    assert (d.cause, d.subtype) == ("not_oom", "other_error") and d.evidence[0].startswith("KeyError")


def test_no_generic_prefix_where_the_engines_lines_open_with_its_own_structure():
    """vLLM's headed lines share their opening words ('INFO 05-01 12:00:0'): that is no prefix."""
    lines = [f"INFO 05-01 12:00:0{i} [core.py:1] step {i}" for i in range(8)] + ["plain text"] * 2
    assert prefix_of(lines, structured) is None


@pytest.mark.parametrize(
    "prefix",
    [
        "2026-12-01T10:00:0{i}+0000 gpu-node-3 vllm[41234]: ",  # journalctl -o short-iso
        '2026-12-01T10:00:0{i}Z {{app="vllm", pod="vllm-7d9f8c-x2x4q"}} ',  # Loki's logcli
        "2026-12-01T10:00:0{i}.000000+00:00 vllm/vllm/3f2a9c ",  # aws logs tail (CloudWatch)
    ],
)
def test_a_log_shippers_tags_after_its_timestamp_are_cut(prefix):
    """A timestamp is a collector's, not the engine's structure: the tags a shipper writes after it
    are a prefix like any other (they were not cut while the timestamp counted as structure)."""

    def shaped(log: str) -> str:
        return "".join(prefix.format(i=i % 10) + line + "\n" for i, line in enumerate(log.splitlines()))

    assert classify(Signals(log=shaped(KV))).cause == "kv_cache_insufficient"
    d = classify(Signals(log=shaped(TRACEBACK)))
    assert (d.cause, d.subtype) == ("not_oom", "other_error") and d.evidence[0].startswith("KeyError")
    assert not structured("2026-12-01T10:00:00Z gpu-node-3 vllm[1]: plain")
    assert structured("2026-12-01T10:00:00Z INFO 05-01 12:00:00 [core.py:1] x")  # kubectl --timestamps


# --- Collector prefixes: attacks that hold ---------------------------------------------------
STERN = "vllm-7d9f8c-x2x4q vllm "


def test_a_v0_log_of_request_lines_gets_no_prefix_cut():
    """V0's header opens with 'INFO 01-10 ' on every line (stern's two-token shape), and a log may be
    mostly request lines: a line with a header is structured, so no witness, no cut."""
    lines = [fmt.format(r=repr(OOM_IN_REQUEST_ID)) for fmt in FORMATS[:3]] * 200
    lines.append("INFO 01-10 12:00:00 async_llm_engine.py:379] x")
    assert prefix_of(lines, structured) is None


def test_a_collector_never_changes_a_line_that_has_a_header_of_its_own():
    """The prefix is cut only from lines without structure of their own: a request line whose text
    starts with the prefix keeps its header, stays user text, and decides nothing."""
    base_log = real_log("neg-6042-watchdog-worker-died")
    log = "".join(STERN + line + "\n" for line in base_log.splitlines())
    forged = FORMATS[2].format(r=repr(STERN + OOM_IN_REQUEST_ID))
    crafted = classify(Signals(log=log + STERN + forged + "\n"))
    assert_same(crafted, classify(Signals(log=log)))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())
    assert {ln.origin for ln in scan(log + STERN + forged + "\n").lines if "ZZUSERZZ" in ln.raw} == {"user"}


@pytest.mark.parametrize("prefix", [STERN, "[pod/vllm-7d9f8c-x2x4q/vllm] ", "Dec 01 12:00:00 node vllm[4]: ", "> "])
@pytest.mark.parametrize("base_name", ["neg-2734-llama2-70b-tp8-timeout", "rt-27466-busy-loop"])
def test_request_echoes_under_a_collector_prefix_change_nothing(prefix, base_name):
    """The injection suite's request and response lines, every line under a collector's prefix."""
    base_log = "".join(prefix + line + "\n" for line in real_log(base_name).splitlines())
    base = classify(Signals(log=base_log))
    for fmt in FORMATS:
        crafted = classify(Signals(log=base_log + prefix + fmt.format(r=repr(OOM_IN_REQUEST_ID)) + "\n"))
        assert_same(crafted, base)
        assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


# --- The new rules against how the tools really print -------------------------------------------------
# bash 5.2 pads the pid of its job report to five columns (run here: `bash -c 'sh -c "kill -SEGV \$\$"'`
# in a fresh pid namespace prints "bash: line 1:     2 Segmentation fault      sh -c ..."): a container's
# small pids put five blanks after "line 1:", and the rows allow four.
@pytest.mark.parametrize(
    "line,cause",
    [
        ("bash: line 1:     7 Segmentation fault      vllm serve m", "not_oom"),
        ("bash: line 1:     7 Aborted                 vllm serve m", "not_oom"),
        ("bash: line 1:     7 Killed                  vllm serve m", "host_ram_oom"),
    ],
    ids=["segv", "abrt", "killed"],
)
def test_the_shells_job_report_with_a_containers_small_pid(line, cause):
    """unknown when unfixed (two-digit pids are read)."""
    assert cause_of(line + "\n") == cause


# `journalctl -u vllm` prints systemd's lines after a date, the host and `systemd[1]: `, which scan.py
# strips nowhere, so the `^<unit>.service:` rows never see them; systemd 252 and later also word the
# first one "The kernel OOM killer killed some processes in this unit."
@pytest.mark.parametrize(
    "log",
    [
        "Jun 05 10:00:00 gpu-node systemd[1]: vllm.service: A process of this unit has been killed by the OOM killer.\n"
        "Jun 05 10:00:00 gpu-node systemd[1]: vllm.service: Failed with result 'oom-kill'.\n",
        "Aug 07 01:00:57 gpu-node systemd[1]: vllm.service: Main process exited, code=killed, status=9/KILL\n",
        "vllm.service: The kernel OOM killer killed some processes in this unit.\n",
    ],
    ids=["journal-oom-killer", "journal-status-9", "systemd-252-wording"],
)
def test_systemds_reports_as_journalctl_prints_them(log):
    """unknown when unfixed."""
    assert cause_of(log) == "host_ram_oom"


def test_a_markdown_paste_reads_as_the_lines_it_quotes():
    """Each line wrapped in backticks: the same cause, phase, subtype and numbers (only the trailing
    backtick stays in the evidence)."""
    base_log = real_log("rt-27466-busy-loop")
    pasted = "```\n" + "\n".join("`" + line + "`" for line in base_log.splitlines()) + "\n```\n"
    got, want = classify(Signals(log=pasted)).to_dict(), classify(Signals(log=base_log)).to_dict()
    assert {k: got[k] for k in ("cause", "phase", "subtype", "numbers")} == {
        k: want[k] for k in ("cause", "phase", "subtype", "numbers")
    }


# --- cost of FIRST_TYPED: measured in bench/diagnosis_speed.py ("word runs, then an exception named
# late", and two process prefixes that almost parse), not asserted here (these machines are noisy). The
# search for that exception now starts from where its name ends, a literal: linear in the line's opening.


# --- what held: the general prefix rule gives a client nothing new ------------------------------------------
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
    "79.10 GiB of which 1.00 GiB is free. ZZUSERZZ"
)


HEADER = "ERROR 10-24 01:26:57 [core.py:710] "


ENGINE_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 380, in run_engine_core',
    "    engine_core.run_busy_loop()",
    OOM,
]


BASES = ["neg-2734-llama2-70b-tp8-timeout", "model-not-found.log", "neg-6042-watchdog-worker-died"]


CLIENT_PREFIXES = ["ZZ: ", "ZZ| ", "[ZZ] ", "0: ", "zz> "]


def _flooded(base: str, prefix: str, lines: list[str]) -> str:
    flood = "\n".join(prefix + "x" for _ in range(420))
    return with_lines(base, ASGI + flood + "\n" + "\n".join(prefix + ln for ln in lines), "end")


@pytest.mark.parametrize("prefix", CLIENT_PREFIXES)
@pytest.mark.parametrize("base_name", BASES)
def test_a_client_prefix_flood_forges_no_headerless_engine_line(base_name, prefix):
    base = real_log(base_name)
    control = diagnose(with_lines(base, ASGI + "hello", "end"))
    for payload in (ENGINE_TRACEBACK, [OOM]):
        crafted = diagnose(_flooded(base, prefix, payload))
        assert (crafted.cause, crafted.subtype) == (control.cause, control.subtype)
        assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


@pytest.mark.parametrize("prefix", CLIENT_PREFIXES)
@pytest.mark.parametrize("base_name", BASES)
def test_a_client_prefix_flood_forges_no_more_than_a_raw_header_does(base_name, prefix):
    """The forged vLLM header under a cut prefix decides exactly what it decides without one (the known limit),
    or nothing (a prefix the lines before the first error do not open is not learned)."""
    base = real_log(base_name)
    raw = diagnose(with_lines(base, ASGI + HEADER + OOM, "end"))
    crafted = diagnose(_flooded(base, prefix, [HEADER + OOM]))
    assert (crafted.cause, crafted.subtype) == (raw.cause, raw.subtype) or not crafted.is_memory


# --- what held: corpus answers, srun labels, wrappers quoting a real OOM ------------------------------------
CORPUS_SAMPLES = [json.loads(x) for x in (ROOT / "tests/corpus/corpus.jsonl").read_text().splitlines() if x.strip()]


def test_the_general_rule_cuts_a_header_it_cannot_read_without_moving_the_answer():
    s = next(x for x in CORPUS_SAMPLES if x["id"] == "notoom-352-devshm-nccl-crashloop")
    d = diagnose(s["log"])
    assert (d.cause, d.subtype) == ("not_oom", "nccl_error")


FIXTURE_LOGS = [
    "kv-cache-too-small.log",
    "memory-limit-kill.log",
    "model-not-found.log",
    "memory-share-exceeds-free.log",
]


@pytest.mark.parametrize("name", FIXTURE_LOGS)
@pytest.mark.parametrize("label", ["0: ", "  3: ", "12: "])
def test_srun_labels_on_real_logs_keep_the_answer(name, label):
    log = (ROOT / "tests/fixtures/vllm-cpu" / name).read_text()
    labelled = "".join(label + ln + "\n" for ln in log.splitlines())
    a, b = diagnose(log), diagnose(labelled)
    assert (b.cause, b.subtype) == (a.cause, a.subtype)


# --- A client's stamped lines teach the general prefix rule a prefix ----------------------------
LOKI_QUOTE = '2026-12-01T10:00:00Z {app="vllm"} ERROR 12-01 10:00:00 [core.py:1233] torch.OutOfMemoryError: '


@pytest.mark.xfail(
    strict=True,
    reason="a client's lines that open with a timestamp teach the classifier a collector's prefix; they should teach nothing",
)
def test_a_clients_stamped_lines_do_not_teach_a_collectors_prefix():
    base = illegal_access_log()
    harmless = classify(Signals(log=base + ASGI + "hello there\n" * 451))
    assert cause_and_subtype(harmless) == ("not_oom", "illegal_memory_access")
    client = "".join(LOKI_QUOTE + "hello there\n" for _ in range(450)) + LOKI_QUOTE + PAYLOADS["cuda-oom"] + "\n"
    crafted = classify(Signals(log=base + ASGI + client))
    assert cause_and_subtype(crafted) == cause_and_subtype(harmless)
    assert client_text_absent(crafted)


FIXTURES = Path(__file__).resolve().parent / "fixtures"


_ESC_ONLY = re.compile(
    r"(?:\x1b|\^\[|#033|\\u001b|\\033|\\x1b)\[[0-9;]{0,20}[A-Za-z]"
)  # (the colour rule as it was before bare codes were stripped)


_BARE_COLOUR = re.compile(r"(?<![\x1b\[])\[\d{1,3}(?:;\d{1,3}){0,4}m")


def _logs_with_bare_colours() -> dict[str, str]:
    logs = {name: s["log"] for name, s in CORPUS.items() if s["split"] == "train"}
    for path in sorted((FIXTURES / "gpu" / "failure-logs").glob("*.log")) + sorted(
        (FIXTURES / "vllm-cpu").glob("*.log")
    ):
        logs[path.name] = path.read_text()
    return {name: log for name, log in logs.items() if _BARE_COLOUR.search(log)}


def test_stripping_colour_codes_without_their_esc_changes_no_train_or_fixture_answer(monkeypatch):
    logs = _logs_with_bare_colours()
    assert logs  # (Ray's coloured actor prefixes, as a tool left them)
    for name, log in logs.items():
        now = diagnose(log)
        monkeypatch.setattr(scan_module, "_ANSI", _ESC_ONLY)
        before = diagnose(log)
        monkeypatch.undo()
        assert (now.cause, now.subtype, now.numbers) == (before.cause, before.subtype, before.numbers), name


def test_a_bare_colour_code_cannot_open_or_hide_a_vllm_header():
    # a client's `[0m` inside a forged header only spells what they could write without it; a real header holds
    # no `[<digits>m`, so the strip leaves `[core.py:1233]` and `[rank0]:` as they are
    assert scan_module._ANSI.sub("", "ERROR 12-01 04:48:09 [core.py:1233] x") == "ERROR 12-01 04:48:09 [core.py:1233] x"
    assert scan_module._ANSI.sub("", "[rank0]: x [1024m] [1;2;3;4;5;6m") == "[rank0]: x [1024m] [1;2;3;4;5;6m"
