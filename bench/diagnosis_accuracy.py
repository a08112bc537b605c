"""Accuracy of the classifier on a labelled corpus (the format of shared/oom-corpus).

    python bench/diagnosis_accuracy.py --corpus ../shared/oom-corpus/oom_logs_dev.jsonl

Each sample is classified from its log plus the deployment context an operator
knows from the spec (tensor/pipeline parallel size, GPU count and names), read
from the sample's `engine_args` and `gpu` fields. Accuracy from the log alone is
printed too.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from vllm_autoheal.diagnosis import CAUSES, MEMORY_CAUSES, Signals, classify  # noqa: E402


def _int(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text, re.IGNORECASE)
    return int(found.group(1)) if found else None


def context(sample: dict) -> dict:
    """Deployment facts from the sample's metadata, as the operator would have them."""
    args, gpu = sample.get("engine_args") or "", sample.get("gpu") or ""
    names = [n.strip() for n in gpu.split("+")] if "+" in gpu else []
    count = _int(r"^(\d+)\s*x\s", gpu) or _int(r"(\d+) GPUs", gpu) or (len(names) or None)
    return {
        "tensor_parallel_size": _int(r"(?:tensor[_-]parallel[_-]size|-tp|\bTP)\s*[=\s]?\s*(\d+)", args),
        "pipeline_parallel_size": _int(r"(?:pipeline[_-]parallel[_-]size|-pp|\bPP)\s*[=\s]?\s*(\d+)", args),
        "gpu_count": count,
        "gpu_names": names,
    }


def evaluate(samples: list[dict], with_context: bool) -> tuple[list[tuple[str, str, str]], Counter]:
    results, confusion = [], Counter()
    for s in samples:
        extra = context(s) if with_context else {}
        got = classify(Signals(log=s.get("log") or "", **extra)).cause
        results.append((s["id"], s["label"], got))
        confusion[(s["label"], got)] += 1
    return results, confusion


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--corpus", required=True, type=Path)
    args = parser.parse_args(argv)
    samples = [json.loads(line) for line in args.corpus.read_text().splitlines() if line.strip()]
    results, confusion = evaluate(samples, with_context=True)
    log_only, _ = evaluate(samples, with_context=False)
    n = len(results)
    right = sum(1 for _, want, got in results if want == got)
    print(f"samples: {n}")
    print(f"accuracy: {right}/{n} = {100 * right / n:.1f}%  (log + deployment context)")
    lo = sum(1 for _, want, got in log_only if want == got)
    print(f"accuracy, log only: {lo}/{n} = {100 * lo / n:.1f}%")
    false_memory = [(i, g) for i, w, g in results if w == "not_oom" and g in MEMORY_CAUSES]
    missed_memory = [(i, w) for i, w, g in results if w in MEMORY_CAUSES and g == "not_oom"]
    print(f"not_oom classified as a memory cause: {len(false_memory)} (must be 0)")
    print(f"memory samples classified not_oom: {len(missed_memory)}")
    labels = [c for c in CAUSES if any(c in k for k in confusion)]
    short = {c: c[:10] for c in labels}
    print("\nconfusion matrix (rows: label, columns: classified as)")
    print(" " * 24 + " ".join(f"{short[c]:>10}" for c in labels))
    for want in labels:
        print(f"{want:24}" + " ".join(f"{confusion[(want, got)] or '.':>10}" for got in labels))
    misses = [(i, w, g) for i, w, g in results if w != g]
    print(f"\nmisses: {len(misses)}")
    for i, w, g in misses:
        print(f"  {i}: label {w}, classified {g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
