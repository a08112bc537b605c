"""The evidence a diagnosis quotes shows the engine's own words that named the failure (a re-printed
failure's message, not its frame; a further line that named the allocation) and withholds the message of
an exception that may carry a client's text, never the engine's words where no exception is named."""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.corpus import context

from crafted.bases import CORPUS, real_log, startup_failure
from crafted.checks import diagnose


# --- A frame quoted as the evidence of a re-printed failure ------------------------------
@pytest.mark.parametrize("sample_id", ["kv-xinf4926-qwen3vl-262k", "util-club3090-4-097"])
def test_the_evidence_of_a_reprinted_failure_is_its_message_not_a_frame(sample_id):
    """Unfixed: evidence[0] `File ".../kv_cache_utils.py", line 641, in _check_enough_kv_cache_memory` (and
    `File ".../v1/worker/utils.py", line 413, in request_memory`). The cause is
    right; the line shown as the failure is a frame. Should: the ValueError's line."""
    s = CORPUS[sample_id]
    d = classify(Signals(log=s["log"], **context(s, pod_state=True)))
    assert d.cause == s["label"]
    assert d.evidence and d.evidence[0].startswith("ValueError: "), f"evidence {d.evidence[:2]}"


# --- The evidence does not show what named the allocation ----------------------------------------
def test_the_evidence_shows_the_engines_words_that_named_the_allocation():
    d = classify(
        Signals(
            log=startup_failure(
                "torch.distributed.DistBackendError: communicator setup failed",
                "workspace allocation failed (2147483648 bytes)",
            )
        )
    )
    assert (d.cause, d.subtype) == ("unknown", "allocation_failure_unplaced")
    assert any("allocation failed" in e for e in d.evidence)


# --- the evidence quotes a client's KeyError text after an uncut prefix -------------------------------
@pytest.mark.parametrize("prefix", ["[w0] 12:00 ", "w0> "])
def test_evidence_withholds_the_message_of_an_exception_named_after_a_prefix(prefix):
    d = diagnose(prefix + "KeyError: 'ZZUSERZZ address already in use'\n")
    assert d.cause == "not_oom"
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


def test_the_same_line_without_a_prefix_withholds_the_message():
    d = diagnose("KeyError: 'ZZUSERZZ address already in use'\n")
    assert "ZZUSERZZ" not in json.dumps(d.to_dict())


def test_a_prefix_is_not_shown_as_the_exceptions_type():
    d = diagnose("wrap: KeyError: 'ZZUSERZZ address already in use'\n")
    assert d.evidence and d.evidence[0].startswith("KeyError")


# --- the withholding hides the engine's own words ---------------------------------------------------
@pytest.mark.parametrize(
    "sample,words",
    [
        ("local-h200-badflag", "unrecognized arguments"),
        ("notoom-42609-custom-allreduce-ipc-expandable-segments-dp-tp", "Cuda error"),
    ],
)
def test_evidence_keeps_the_engines_words_where_no_exception_is_named(sample, words):
    d = diagnose(real_log(sample))
    assert any(words in e for e in d.evidence), d.evidence
