"""Accuracy of the classifier on the labelled corpus in tests/corpus/ (train and test splits).

    python bench/diagnosis_accuracy.py [--corpus tests/corpus/corpus.jsonl] [--show-misses train|test|all|none]

Each sample is classified twice. "Log alone": from its log plus the deployment context an
operator knows from the spec (tensor/pipeline parallel size, GPU count), read from the sample's
`engine_args` and `gpu` fields; this is `vllm-autoheal diagnose FILE`. "With the pod's state":
plus what the operator also reads off the crashed pod, whether the run had been Ready and how
the container ended, as a blind reviewer read them from the thread (`ready_before`, `exit`;
null where the thread does not say); this is what the operator decides on. Prints the accuracy of each split, not-memory crashes called memory, the
test split's confusion matrix, and breakdowns by vLLM version and by source kind. "Where the log
shows a failure" counts only samples whose `failure_shown` is true: a reviewer who read the
thread, but never the classifier's answer, judged that the posted log holds the failure itself
(the poster did not cut it before the error). Only the
train split's misses are listed by default: the test split is never used for tuning.

Last, the source census (tests/fixtures/census/): vLLM's own memory messages and those of the
libraries under it (torch, NCCL, the kernel, Ray, ...) with their look-alikes, from their source,
version by version, as helpers who never saw the classifier read them; how often the classifier
agrees with that reading (tests/test_diagnosis_census.py lists
where it differs on purpose, and why).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
from vllm_autoheal.diagnosis import CAUSES, MEMORY_CAUSES, Diagnosis, Signals, classify  # noqa: E402
from vllm_autoheal.diagnosis.corpus import context, load  # noqa: E402


def version_bucket(sample: dict) -> str:
    found = re.search(r"(\d+)\.(\d+)", sample.get("vllm_version") or "")
    if not found:
        return "not stated"
    major, minor = int(found.group(1)), int(found.group(2))
    if major == 0 and minor < 4:
        return "0.1-0.3"
    if major == 0 and minor < 7:
        return "0.4-0.6"
    if major == 0 and minor < 11:
        return "0.7-0.10"
    return "0.11+"


def diagnose_all(samples: list[dict], pod_state: bool = False) -> list[tuple[dict, Diagnosis]]:
    return [(s, classify(Signals(log=s.get("log") or "", **context(s, pod_state=pod_state)))) for s in samples]


def splits(results: list[tuple[dict, str]]) -> dict[str, list[tuple[dict, str]]]:
    return {
        "train": [r for r in results if r[0].get("split", "train") == "train"],
        "test": [r for r in results if r[0].get("split") == "test"],
    }


def summary(name: str, results: list[tuple[dict, str]]) -> str:
    n = len(results)
    right = sum(1 for s, got in results if got == s["label"])
    false_memory = sum(1 for s, got in results if s["label"] == "not_oom" and got in MEMORY_CAUSES)
    missed = sum(1 for s, got in results if s["label"] in MEMORY_CAUSES and got == "not_oom")
    pct = 100 * right / n if n else 0.0
    decided = [(s, got) for s, got in results if s["failure_shown"]]
    d_right = sum(1 for s, got in decided if got == s["label"])
    d_pct = 100 * d_right / len(decided) if decided else 0.0
    return (
        f"{name:6} {right:3}/{n:<3} = {pct:5.1f}%   where the log shows a failure: {d_right}/{len(decided)} = "
        f"{d_pct:5.1f}%   not-memory called memory: {false_memory}   memory called not-memory: {missed}"
    )


def outcomes(name: str, results: list[tuple[dict, str]]) -> str:
    """What a heal would do with each answer: the right change, none (`unknown`, or `not_oom` for
    a memory crash: a missed heal), or a wrong memory change (another memory cause, or memory for
    a crash that is not about memory), which is worse than none."""
    right = sum(1 for s, got in results if got == s["label"])
    wrong_change = sum(1 for s, got in results if got != s["label"] and got in MEMORY_CAUSES)
    no_change = len(results) - right - wrong_change
    return f"{name:6} right {right}   no change {no_change}   wrong memory change {wrong_change}   (of {len(results)})"


def confusion(results: list[tuple[dict, str]]) -> list[str]:
    counts = Counter((s["label"], got) for s, got in results)
    labels = [c for c in CAUSES if any(c in k for k in counts)]
    out = [" " * 22 + "".join(f"{c[:9]:>10}" for c in labels)]
    for want in labels:
        if any(k[0] == want for k in counts):
            out.append(f"{want:22}" + "".join(f"{counts[(want, got)] or '.':>10}" for got in labels))
    return out


UNKNOWN_WHY = {
    "traceback_without_error": "a traceback that stops before its error line",
    "wrapper_without_cause": "only a wrapper of a failure printed elsewhere",
    "oom_phase_unknown": "an out-of-memory error that nothing places",
    "signals_disagree": "a non-memory failure before an out-of-memory error",
    "allocation_failure_unplaced": "an allocation failure in words that do not say which memory",
    "oom_of_torch_or_ray": "an OutOfMemoryError named only by its class, under Ray",
    None: "no failure message at all",
}


def miss_reasons(diagnosed: list[tuple[dict, Diagnosis]]) -> list[str]:
    """The misses of each split, by what the log showed and what was answered: counts only, so the
    test split's are read without reading its logs."""
    counts: dict[str, Counter] = {"train": Counter(), "test": Counter()}
    for s, diag in diagnosed:
        if diag.cause == s["label"]:
            continue
        if diag.cause == "unknown":
            answer = "unknown: " + UNKNOWN_WHY.get(diag.subtype, str(diag.subtype))
        elif diag.cause == "not_oom":
            answer = "a memory failure called not-memory"
        elif s["label"] == "not_oom":
            answer = "a not-memory crash called memory"
        else:
            answer = "another memory cause"
        shown = "shows its failure" if s.get("failure_shown") else "cut before it"
        counts[s.get("split", "train")][f"{shown:18s} {answer}"] += 1
    return [
        f"  {split:5} {n:4}  {why}"
        for split, c in counts.items()
        for why, n in sorted(c.items(), key=lambda kv: -kv[1])
    ]


def breakdown(results: list[tuple[dict, str]], key) -> list[str]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for s, got in results:
        groups[key(s)].append(got == s["label"])
    return [f"  {g:22} {sum(v):3}/{len(v):<3} = {100 * sum(v) / len(v):5.1f}%" for g, v in sorted(groups.items())]


def census(path: Path) -> None:
    """Agreement with the census' reading; an `ambiguous` entry agrees when no memory cause is named."""
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_engine: dict[str, list[bool]] = defaultdict(list)
    for e in entries:
        got = classify(Signals(log=e["log"])).cause
        by_engine[e["engine"]].append(
            got == e["expected"] or (e["expected"] == "ambiguous" and got not in MEMORY_CAUSES)
        )
    agree = sum(sum(v) for v in by_engine.values())
    versions = len({e["version"] for e in entries})
    print(f"\ncensus {path.stem}: {agree}/{len(entries)} agree with the census' reading ({versions} versions)")
    print("\n".join(f"  {g:22} {sum(v):3}/{len(v):<3}" for g, v in sorted(by_engine.items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "corpus" / "corpus.jsonl")
    parser.add_argument("--show-misses", choices=("train", "test", "all", "none"), default="train")
    args = parser.parse_args(argv)
    samples = load(args.corpus)
    print(f"corpus: {len(samples)} samples, {len({s['source_url'] for s in samples})} source threads")
    print(f"labels: {dict(Counter(s['label'] for s in samples).most_common())}")
    known = Counter(
        ("ready" if s.get("ready_before") else "not ready") if isinstance(s.get("ready_before"), bool) else "unknown"
        for s in samples
    )
    exits = sum(1 for s in samples if s.get("exit") is not None)
    print(f"pod state known: {dict(known)}; exit known: {exits}")
    for view, pod_state in (("log alone", False), ("with the pod's state", True)):
        diagnosed = diagnose_all(samples, pod_state)
        results = [(s, diag.cause) for s, diag in diagnosed]
        by_split = splits(results)
        print(f"\n== {view}")
        for name in ("train", "test"):
            print(summary(name, by_split[name]))
        print(summary("all", results))
        print("what a heal would do")
        for name in ("train", "test"):
            print(outcomes(name, by_split[name]))
        print("test split, confusion matrix (rows: label, columns: classified as)")
        print("\n".join(confusion(by_split["test"])))
    # The breakdowns and misses below are of the operator's view (with the pod's state).
    print("\nby vLLM version (all samples)")
    print("\n".join(breakdown(results, version_bucket)))
    print("\nby source kind (all samples)")
    print("\n".join(breakdown(results, lambda s: s.get("source_kind") or "unknown")))
    print("\nby engine (all samples)")
    print("\n".join(breakdown(results, lambda s: s.get("engine") or "not stated")))
    print("\nmisses by what the log showed and what was answered (with the pod's state)")
    print("\n".join(miss_reasons(diagnosed)))
    for name in ("vllm-messages", "library-messages"):
        census(ROOT / "tests" / "fixtures" / "census" / f"{name}.jsonl")
    shown = results if args.show_misses == "all" else [] if args.show_misses == "none" else by_split[args.show_misses]
    misses = [(s, got) for s, got in shown if got != s["label"]]
    print(f"\nmisses in {args.show_misses}: {len(misses)}")
    for s, got in misses:
        print(f"  {s['id']}: label {s['label']}, classified {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
