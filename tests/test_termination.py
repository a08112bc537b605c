"""The termination message's schema: written in the tenant's container, so validated on read."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify, termination
from vllm_autoheal.diagnosis.model import GpuInfo, GpuProcess, GpuSnapshot
from vllm_autoheal.diagnosis.termination import read
from vllm_autoheal.launcher import termination_message

from crafted.bases import H100

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


# --- 8, 9. The termination message ----------------------------------------------------------------------
def _doc(**extra) -> str:
    return json.dumps({"autoheal": 1, "diagnosis": {"cause": "unknown"}, **extra})


def test_a_huge_integer_figure_is_ignored_not_raised():
    """Unfixed: OverflowError ("int too large to convert to float") out of termination.read
    for a valid JSON integer of 400 digits in diagnosis.numbers under a figure's name; kube/crash.diagnose
    calls read() outside classify's guard. It should be ignored with a note."""
    for numbers in ({"tried_gib": 10**400}, {"process_gib": [10**400]}):
        text = json.dumps({"autoheal": 1, "diagnosis": {"cause": "runtime_oom", "numbers": numbers}})
        doc, note = termination.read(text)
        assert doc is None and note


@pytest.mark.parametrize(
    ("cause", "numbers", "engine"),
    [
        ("profiling_oom", {"tried_gib": 1e-320, "gpu_free_gib": 5.0}, {"maxNumBatchedTokens": 65536}),
        ("profiling_oom", {"tried_gib": 1e-320, "gpu_free_gib": 5.0, "dummy_requests": 256}, {}),
        ("kv_cache_insufficient", {"available_gib": 1e-320, "needed_gib": 4.0, "estimated_max_model_len": 1000}, {}),
    ],
)
def test_a_size_below_one_byte_is_a_forgery_that_sizes_nothing(cause, numbers, engine):
    """High. A pod's forged termination message with 'tried to allocate' 1e-320 GiB: the batch and
    sequence cuts divide by it, and the heal raised OverflowError (the operator's handler retried it
    for ever); a KV raise read 'has 9.99989e-321 GiB'. No tool prints a size below one byte: the
    message is refused, and the heal plans nothing from it."""
    from vllm_autoheal.api import VLLMServiceSpec
    from vllm_autoheal.remedy import Inventory, plan_heal

    text = json.dumps({"autoheal": 1, "diagnosis": {"cause": cause, "numbers": numbers}})
    doc, note = termination.read(text)
    assert doc is None and "less than a byte" in note
    d = classify(Signals(termination_message=text))
    r = plan_heal(VLLMServiceSpec(model="m", engine=engine), d, inventory=Inventory(gpu_total_gib=139.8))
    assert d.cause == "unknown" and r.gives_up


MALFORMED_GPU_START = {
    "bool-index": {"gpus": [[True, H100, 80, 1]]},
    "float-index": {"gpus": [[0.0, H100, 80, 1]]},
    "string-size": {"gpus": [[0, H100, "80", 1]]},
    "free-over-total": {"gpus": [[0, H100, 80, 81]]},
    "negative": {"gpus": [[0, H100, 80, -1]]},
    "huge-int": {"gpus": [[0, H100, 10**400, 1]]},
    "huge-float": {"gpus": [[0, H100, 1e308, 1]]},
    "pid-bool": {"gpus": [[0, H100, 80, 1]], "other_processes": [[False, 0, 1.0]]},
    "pid-over-range": {"gpus": [[0, H100, 80, 1]], "other_processes": [[2**40, 0, 1.0]]},
    "65-gpus": {"gpus": [[i % 8, H100, 80, 1] for i in range(65)]},
    "9-processes": {"gpus": [[0, H100, 80, 1]], "other_processes": [[i, 0, 1.0] for i in range(9)]},
    "short-row": {"gpus": [[0, H100, 80]]},
    "row-object": {"gpus": [{"index": 0}]},
    "gpus-object": {"gpus": {"0": [0, H100, 80, 1]}},
    "error-null": {"error": None},
    "long-name": {"gpus": [[0, "x" * 41, 80, 1]]},
    "not-object": [1, 2],
}


@pytest.mark.parametrize("shape", sorted(MALFORMED_GPU_START))
def test_a_malformed_gpu_start_is_ignored_with_a_note(shape):
    """Each malformed gpu_start makes the whole message ignored, with a note, raising nothing."""
    doc, note = termination.read(_doc(gpu_start=MALFORMED_GPU_START[shape]))
    assert doc is None and note and termination.gpu_snapshot(doc) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": {"gpus": [[0, "x", NaN, 1]]}}',
        '{"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": {"gpus": [[0, "x", Infinity, 1]]}}',
        '{"autoheal": 1, "gpu_start": ' + "[" * 5000 + "]" * 5000 + "}",
        _doc(gpu_start={"gpus": [[0, H100, 80, 1]]}, note="x" * 20000),
    ],
    ids=["nan", "infinity", "deep", "oversize"],
)
def test_non_json_numbers_nesting_and_size_are_ignored(text):
    doc, note = termination.read(text)
    assert doc is None and note


def test_negative_zero_reads_as_an_empty_gpu():
    """-0.0 is a size of 0 (no device: no device size for the classifier)."""
    doc, note = termination.read(_doc(gpu_start={"gpus": [[0, H100, -0.0, -0.0]], "other_processes": [[1, 0, -0.0]]}))
    snap = termination.gpu_snapshot(doc)
    assert note is None and snap is not None and snap.other_process_bytes() == 0 and snap.gpus[0].total_bytes == 0


def test_what_the_launcher_writes_always_validates():
    """Gpu_probe.compact's own form (names cut to 40, 8 processes, 2 decimals) passes."""
    from vllm_autoheal.gpu_probe import compact
    from vllm_autoheal.launcher import termination_message

    snap = GpuSnapshot(
        gpus=[GpuInfo(i, "NVIDIA H200 " + "x" * 60, 150_000_000_000, 149_999_999_999, 1) for i in range(8)],
        processes=[GpuProcess(10_000 + i, i % 8, 3 * 2**30 + i) for i in range(12)] + [GpuProcess(1, 0, 5)],
        own_pids=[1],
    )
    text = termination_message({"cause": "unknown"}, 1, compact(snap), None)
    doc, note = termination.read(text)
    assert note is None and doc is not None
    assert len(termination.gpu_snapshot(doc).processes) == 8


INCONSISTENT_GPU_START = {
    "process-on-an-unlisted-gpu": {"gpus": [[0, H100, 79.15, 78.6]], "other_processes": [[4242, 7, 30.0]]},
    "process-larger-than-its-gpu": {"gpus": [[0, H100, 79.15, 78.6]], "other_processes": [[4242, 0, 99999.0]]},
    "one-index-twice": {"gpus": [[0, H100, 79.15, 78.6], [0, "x", 1.0, 0.0]]},
}


@pytest.mark.parametrize("shape", sorted(INCONSISTENT_GPU_START))
def test_a_gpu_start_no_launcher_writes_is_refused(shape):
    """Unfixed: accepted; the 30 GiB (or 99999 GiB) process counts as another process's memory for any
    OOM. gpu_probe.compact never writes these (a process is listed under the GPU it was read from, NVML
    reports no process larger than its device, indexes are 0..count-1). They should be refused."""
    doc, note = termination.read(_doc(gpu_start=INCONSISTENT_GPU_START[shape]))
    assert doc is None and note, f"accepted: {doc and doc.get('gpu_start')}"


MORE_MALFORMED = {
    "process-on-unlisted-gpu": {"gpus": [[0, H100, 80, 1]], "other_processes": [[7, 3, 1.0]]},
    "process-larger-than-gpu": {"gpus": [[0, H100, 80, 1]], "other_processes": [[7, 0, 81.0]]},
    "duplicate-index": {"gpus": [[0, H100, 80, 1], [0, H100, 80, 1]]},
    "huge-pid": {"gpus": [[0, H100, 80, 1]], "other_processes": [[10**400, 0, 1.0]]},
    "huge-process-size": {"gpus": [[0, H100, 80, 1]], "other_processes": [[7, 0, 10**400]]},
}


@pytest.mark.parametrize("shape", sorted(MORE_MALFORMED))
def test_more_malformed_gpu_start_is_ignored_with_a_note(shape):
    text = json.dumps({"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": MORE_MALFORMED[shape]})
    doc, note = termination.read(text)
    assert doc is None and note and termination.gpu_snapshot(doc) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"autoheal": 1, "diagnosis": {"cause": "unknown", "numbers": {"tried_gib": ' + "9" * 5000 + "}}}",
        '{"autoheal": 1, "diagnosis": {"cause": "unknown"}, "gpu_start": {"gpus": [[0, "\\ud800", 80, 1]]}}',
        '{"autoheal": 1, "diagnosis": {"cause": ["runtime_oom"]}}',
    ],
    ids=["5000-digits", "lone-surrogate-name", "cause-a-list"],
)
def test_odd_json_raises_nothing(text):
    doc, note = termination.read(text)
    assert (doc is None and note) or (doc is not None and note is None)
