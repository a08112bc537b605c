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
