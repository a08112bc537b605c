"""The termination message's schema: written in the tenant's container, so validated on read."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.termination import read
from vllm_autoheal.launcher import termination_message

GOOD = {
    "autoheal": 1,
    "exit_code": 1,
    "diagnosis": {
        "cause": "kv_cache_insufficient",
        "phase": "kv-allocation",
        "confidence": "high",
        "subtype": None,
        "numbers": {"estimated_max_model_len": 524160, "needed_gib": 2.0, "process_gib": [60.51]},
        "evidence": ["ValueError: To serve at least one request ..."],
    },
}


def doc(**diagnosis) -> str:
    return json.dumps({**GOOD, "diagnosis": {**GOOD["diagnosis"], **diagnosis}})


def test_a_valid_message_is_read_with_only_the_fields_the_schema_names():
    got, note = read(json.dumps({**GOOD, "extra": "x" * 100}))
    assert note is None and got["diagnosis"]["numbers"]["estimated_max_model_len"] == 524160 and "extra" not in got
    real = termination_message(GOOD["diagnosis"], 1, None, None)  # what the launcher writes
    assert read(real)[0]["diagnosis"]["cause"] == "kv_cache_insufficient"


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"autoheal": 1, "diagnosis": {"cause": "runtime_oom", "numbers": {"tried_gib": NaN}}}', "NaN is not JSON"),
        ('{"autoheal": 1, "diagnosis": {"cause": "runtime_oom", "numbers": {"tried_gib": Infinity}}}', "Infinity"),
        (doc(numbers={"free_gib": "38.69"}), "free_gib is not a number"),
        (doc(numbers={"estimated_max_model_len": 1e30}), "outside"),
        (doc(numbers={"free_gib": -1.0}), "outside"),
        (doc(numbers={"util": 3.0}), "outside"),
        (doc(numbers={"x": True}), "not a number"),
        (doc(numbers={"process_gib": list(range(100))}), "more than 16"),
        (doc(evidence=[1, 2]), "evidence[] is not a string"),
        (doc(evidence="a line"), "not a list"),
        (doc(cause="made_up"), "not a known cause"),
        (doc(phase="elsewhere"), "not a known phase"),
        (doc(confidence="certain"), "confidence"),
        (doc(subtype="a b"), "not a name"),
        (json.dumps({**GOOD, "autoheal": 2}), "schema version"),
        (json.dumps({**GOOD, "autoheal": True}), "schema version"),
        (json.dumps({**GOOD, "exit_code": "1"}), "exit_code"),
        (json.dumps({**GOOD, "diagnosis": "oom"}), "not an object"),
        ("{}", "schema version"),
        ("{" * 100000, "larger than"),
        ('{"autoheal": 1, "diagnosis": ' + "[" * 5000 + "]" * 5000 + "}", "ignored"),
    ],
)
def test_an_invalid_message_is_ignored_with_a_note(text, why):
    got, note = read(text)
    assert got is None and note.startswith("termination message ignored") and why in note, note


def test_a_plain_log_tail_is_not_a_message():
    assert read("ValueError: boom\n") == (None, None) and read("") == (None, None) and read(None) == (None, None)


def test_classify_never_trusts_an_invalid_message_nor_reads_it_as_a_log_tail():
    forged = doc(
        cause="host_ram_oom",
        numbers={"needed_gib": 1e30},
        evidence=["ValueError: To serve at least one request with the model's max seq len (1048576)"],
    )
    d = classify(Signals(termination_message=forged))
    assert d.cause == "unknown" and d.source != "termination-message" and not d.numbers.get("needed_gib")


# --- gpu_start: what the launcher's probe saw before vLLM started ------------------------------

GPU_START = {"gpus": [[0, "NVIDIA H200", 139.8, 79.29]], "other_processes": [[4242, 0, 60.51]]}


def with_gpu(gpu_start) -> str:
    return json.dumps({**GOOD, "gpu_start": gpu_start})


def test_a_valid_gpu_snapshot_is_read_as_other_processes_memory():
    from vllm_autoheal.diagnosis.termination import gpu_snapshot

    got, note = read(with_gpu(GPU_START))
    assert note is None and got["gpu_start"] == GPU_START
    snap = gpu_snapshot(got)
    assert snap.other_process_bytes() == int(60.51 * 2**30) and snap.gpus[0].total_bytes == int(139.8 * 2**30)
    # what the launcher writes is read back whole
    real = termination_message(GOOD["diagnosis"], 1, GPU_START, {"gpus": []})
    assert gpu_snapshot(read(real)[0]).other_process_bytes() == snap.other_process_bytes()
    # no driver, no GPUs listed, or no snapshot: nothing to read
    assert gpu_snapshot(read(with_gpu({"error": "no NVIDIA driver"}))[0]) is None
    assert gpu_snapshot(read(with_gpu({}))[0]) is None and gpu_snapshot(read(json.dumps(GOOD))[0]) is None


@pytest.mark.parametrize(
    "gpu_start, why",
    [
        ("60 GiB", "gpu_start is not an object"),
        ({"gpus": "all"}, "gpu_start.gpus is not a list"),
        ({"gpus": [[0, "H200", 139.8]]}, "not a row of 4"),
        ({"gpus": [[0, "H200", 139.8, 79.0]] * 65}, "at most 64"),
        ({"gpus": [[True, "H200", 139.8, 79.0]]}, "index is not an integer"),
        ({"gpus": [[0, "H" * 41, 139.8, 79.0]]}, "name is longer"),
        ({"gpus": [[0, "H200", 1e9, 79.0]]}, "total is not a size"),
        ({"gpus": [[0, "H200", 139.8, 140.0]]}, "free is not a size"),  # more free than the GPU has
        ({"gpus": [[0, "H200", 139.8, -1]]}, "free is not a size"),
        ({"other_processes": [[1, 0, 1.0]] * 9}, "at most 8"),
        ({**GPU_START, "other_processes": [[1, 0, "60"]]}, "gib is not a size"),
        ({**GPU_START, "other_processes": [[-1, 0, 1.0]]}, "pid is not an integer"),
        ({"other_processes": [[1, 99, 1.0]]}, "gpu is not an integer"),
        ({"error": ["x"]}, "gpu_start.error is not a string"),
    ],
)
def test_an_invalid_gpu_snapshot_makes_the_message_ignored(gpu_start, why):
    got, note = read(with_gpu(gpu_start))
    assert got is None and note.startswith("termination message ignored") and why in note, note
