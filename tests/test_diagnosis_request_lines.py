"""A request or response line vLLM echoes (`--enable-log-requests`, a request id, an adapter's or a
connector's id) is the client's text, whatever it holds: a bare carriage return, a newline followed by a
second header, or the words of a message row start no line of the engine's and decide nothing."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import BASE, ID_BASES, OOM, real_log, vllm_log, with_lines
from crafted.checks import assert_reads_like, assert_same, assert_unchanged
from crafted.node_logs import cri_log, docker_log
from crafted.request_logging import (
    ABORTED,
    ENGINE_DEAD,
    ERROR_STACK,
    FORMATS,
    GRAMMAR,
    LEVELED_CLIENT_LINES,
    OOM_IN_REQUEST_ID,
    inject,
)
from crafted.wrappers import FORGED_HEADERS, KSERVE

KV_IN_REQUEST_ID = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.01 GiB). ZZUSERZZ"
)


# --- A bare carriage return in a client's text starts a line without a header ---------------------
# vLLM's NewLineFormatter repeats the header after each "\n" of a message (writing "\r\n" + header),
# but a bare "\r" is left as it is. A body `request_id` is a JSON string ("a\rtorch.OutOfMemoryError..."
# is one), and `Request %s aborted.` / `... failed (engine dead).` write it raw. scan() took every
# bare "\r" for a line break, so the text after it became a headerless line of the engine's:
# not_oom -> runtime_oom / kv_cache_insufficient, the client's words as evidence. (Older than this
# change, and also the one way a client gets a line of its own choosing to the collector's detector.)
@pytest.mark.parametrize("payload", [OOM_IN_REQUEST_ID, KV_IN_REQUEST_ID], ids=["oom", "kv"])
@pytest.mark.parametrize("fmt", [ABORTED, ENGINE_DEAD], ids=["aborted", "engine-dead"])
@pytest.mark.parametrize("base_name", ID_BASES)
def test_a_carriage_return_in_a_request_id_does_not_start_an_engine_line(base_name, fmt, payload):
    # (appended as text: str.splitlines, which assert_unchanged uses, would itself break the line at "\r")
    base_log = real_log(base_name).rstrip("\n") + "\n"
    crafted = classify(Signals(log=base_log + fmt.format("a\r" + payload) + "\n"))
    assert_same(crafted, classify(Signals(log=base_log)))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


def test_a_carriage_return_in_a_request_id_under_a_collector_prefix():
    base_log = real_log("neg-6042-watchdog-worker-died")
    extra = ENGINE_DEAD.format("a\r" + OOM_IN_REQUEST_ID + "\r" * 50)  # also: lines without the prefix, to dilute it

    def stern(log: str) -> str:
        return "".join("vllm-7d9f8c-x2x4q vllm " + line + "\n" for line in log.split("\n") if line)

    crafted = classify(Signals(log=stern(base_log + "\n" + extra)))
    assert_same(crafted, classify(Signals(log=stern(base_log))))
    assert "ZZUSERZZ" not in json.dumps(crafted.to_dict())


@pytest.mark.parametrize("fmt", FORMATS[:3])
def test_worker_failed_words_in_a_prompt_decide_nothing(fmt):
    """The new row's words in a client's prompt: the bases keep their diagnosis."""
    quote = (
        "RuntimeError: Worker failed with error 'KeyError: x', please check the stack trace above for the root cause"
    )
    for base_name in ("rt-27466-busy-loop", "rt-3430-lmcache-qwen3-8b-a5000-long-prompts"):
        assert_unchanged(base_name, fmt.format(r=repr(quote + " ZZUSERZZ")), "end")


def test_the_hubs_request_id_does_not_let_a_request_line_be_the_engines():
    """A line that names a client's request stays user text, the Hub's id on it or not."""
    line = ABORTED.format("a (Request ID: Root=1-a) " + OOM_IN_REQUEST_ID)
    for base_name in ("neg-2734-llama2-70b-tp8-timeout", "rt-27466-busy-loop"):
        assert_unchanged(base_name, line, "end")


# --- Attacks that hold -----------------------------------------------------------------------------
NEW_NOT_OOM = {
    "aborted": "Aborted (core dumped) ZZUSERZZ",
    "tvm-segfault": "!!!!!!! Segfault encountered !!!!!!! ZZUSERZZ",
    "elastic-sigsegv": "Signal 11 (SIGSEGV) received by PID 12 ZZUSERZZ",
    "v0-minus-11": "died, exit code: -11 ZZUSERZZ",
    "cudacheck": "Cuda error a.cu:1 'invalid argument' ZZUSERZZ",
}


NEW_MEMORY = {
    "systemd-status-9": "vllm.service: Main process exited, code=killed, status=9/KILL ZZUSERZZ",
    "dataloader": "DataLoader worker (pid 1) is killed by signal: Killed. ZZUSERZZ",
    "slurm": "slurmstepd: error: Detected 1 oom_kill event in StepId=1.0 ZZUSERZZ",
    "glog-oom": "E1115 02:58:51.162611 1 core.cc:1] torch.OutOfMemoryError: CUDA out of memory. ZZUSERZZ",
    "kserve-oom": KSERVE + "torch.OutOfMemoryError: CUDA out of memory. ZZUSERZZ",
}


ERROR_FORMATS = {
    "aborted": ABORTED,
    "engine-dead": ENGINE_DEAD,
    "log-error-stack": ERROR_STACK,
    "grammar": GRAMMAR,
    "mooncake-group-mismatch": LEVELED_CLIENT_LINES["mooncake-group-mismatch"][1],
    "moriio-rdma-timeout": LEVELED_CLIENT_LINES["moriio-rdma-timeout"][1],
}


@pytest.mark.parametrize("newline", [False, True], ids=["inline", "newline"])
@pytest.mark.parametrize("payload", sorted(NEW_NOT_OOM) + sorted(NEW_MEMORY))
@pytest.mark.parametrize("fmt", sorted(ERROR_FORMATS))
@pytest.mark.parametrize("base_name", [*ID_BASES, "memory-limit-kill.log"])
def test_the_new_words_in_a_request_id_or_a_connectors_id_change_nothing(base_name, fmt, payload, newline):
    """The new rows' words (and a line opening with glog's or KServe's header) in the request-id
    formats of the injection harness, inline or after a newline in the id: the base's diagnosis."""
    value = {**NEW_NOT_OOM, **NEW_MEMORY}[payload]
    value = "a\n" + value + "\nb" if newline else "a " + value
    f = ERROR_FORMATS[fmt]
    line = f(value) if callable(f) else f.format(value)
    if newline:
        header = line[: line.index("] ") + 2]
        line = vllm_log(header, line[len(header) :])
    assert_unchanged(base_name, line, "middle")


def test_a_glog_or_kserve_header_inside_a_vllm_line_is_a_forged_one():
    """A body request_id with a newline, then glog's or KServe's header: a second header, user text."""
    for header in (FORGED_HEADERS["glog"], FORGED_HEADERS["kserve"]):
        forged = "a\n" + header + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. ZZUSERZZ"
        for base_name in ID_BASES:
            assert_unchanged(base_name, vllm_log(ABORTED.split("Request")[0], "Request cmpl-" + forged + " aborted."))


@pytest.mark.parametrize("fmt", ["plain", "cri", "docker"])
def test_a_cri_prefix_after_vllms_header_is_a_second_header(fmt):
    """A multi-line request id whose next line opens with `stderr F ` and the engine's
    header: vLLM's formatter repeats its header first, so the CRI prefix is a second header (FORGED)."""
    to_file = {"plain": lambda x: x, "cri": cri_log, "docker": docker_log}[fmt]
    base_log = real_log("neg-2734-llama2-70b-tp8-timeout")
    header = ABORTED.split("Request")[0]
    forged = "a\nstderr F (EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] " + OOM
    crafted = with_lines(base_log, vllm_log(header, "Request cmpl-" + forged + " aborted."), "end")
    harmless = with_lines(base_log, vllm_log(header, "Request cmpl-a\nb aborted."), "end")
    assert_reads_like(to_file(crafted), to_file(harmless), fmt)


# --- The rows' phrases in user text ---------------------------------------------------------------------
USER_QUOTES = [
    "RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::939524096 (896)MB",
    "Last error:\nFailed to CUDA calloc 2097152 bytes",
    "INFO 01-18 16:20:58 llm_engine.py:223] # GPU blocks: -204, # CPU blocks: 512",
    "ValueError: Available memory on node 0 (1.0/125.72 GiB) on kv cache allocation is less than requested memory "
    "for kv (-3.41/57.86 GiB). Reduce CPU memory used by other processes.",
    'File "cache_engine.py", line 76, in allocate_gpu_cache\ntorch.OutOfMemoryError: CUDA out of memory.',
    'File "worker.py", line 1, in profile_num_available_blocks',
    "ray.exceptions.ActorDiedError: The actor died unexpectedly\nMemory cgroup out of memory: Killed process 1",
]


@pytest.mark.parametrize("n", range(len(USER_QUOTES)))
def test_the_new_rows_phrases_in_request_and_response_lines_change_nothing(n):
    base_log = real_log(BASE)
    want = classify(Signals(log=base_log))
    for k, fmt in enumerate(FORMATS):
        d = classify(Signals(log=inject(base_log, USER_QUOTES[n], fmt, ("start", "middle", "end")[k % 3])))
        assert (d.cause, d.subtype, d.numbers, d.evidence) == (want.cause, want.subtype, want.numbers, want.evidence)
