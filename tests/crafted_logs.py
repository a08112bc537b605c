"""Real logs that the crafted-log tests build on, and their check that what a client wrote changed
nothing: the diagnosis of the crafted log is the real log's, and the client's marker is nowhere in it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_autoheal.diagnosis import Signals, classify

ROOT = Path(__file__).resolve().parents[1]
CORPUS = {s["id"]: s for s in map(json.loads, (ROOT / "tests/corpus/corpus.jsonl").read_text().splitlines())}
REAL_CPU = ROOT / "tests/fixtures/vllm-cpu"
FROZEN_BASES = ROOT / "tests/fixtures/injection-bases"
MARKER = "ZZUSERZZ"  # in every crafted payload: the client's words, to be found nowhere in a diagnosis


def real_log(name: str) -> str:
    """A real vLLM CPU run's log (NAME.log), else a corpus sample's (as frozen for these tests, if it is)."""
    if name.endswith(".log"):
        return (REAL_CPU / name).read_text()
    frozen = FROZEN_BASES / f"{name}.log"
    return frozen.read_text() if frozen.exists() else CORPUS[name]["log"]


def assert_same_diagnosis(crafted_log: str, real_log: str) -> None:
    crafted, base = classify(Signals(log=crafted_log)).to_dict(), classify(Signals(log=real_log)).to_dict()
    assert MARKER not in json.dumps(crafted)
    crafted.pop("notes"), base.pop("notes")
    assert crafted == base


def seconds_per_byte(log: str, runs: int = 3) -> float:
    """The best of a few classifications of `log`, per byte (timings on a shared machine are noisy:
    only a ratio to a normal log timed alongside says anything)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        classify(Signals(log=log))
        best = min(best, time.perf_counter() - started)
    return best / len(log)
