"""Append mined samples to tests/corpus/corpus.jsonl, the way its README says.

    python scripts/corpus_add.py NEW.jsonl [--audit AUDIT.jsonl ...] [--corpus tests/corpus/corpus.jsonl]

NEW.jsonl holds samples with the miner's fields (id, source_url, vllm_version, gpu, model,
engine_args, label, subtype, fix_that_worked, log, source_kind, engine, executor, features).
Each AUDIT.jsonl row (`id`, `failure_shown`, `label_ok`, `label_concern`, and optionally the
pod's state the thread states: `ready_before`, `exit`, `context_why`) is a blind reviewer's
verdict; a sample without one is refused, as is one whose thread is already in the
corpus. The split follows the thread (sha256 of source_url, odd: test); origin is `mined`.
Prints what was added and refused; exit 2 with a message on malformed input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINED = (
    "id source_url vllm_version gpu model engine_args label subtype fix_that_worked log "
    "source_kind engine executor features"
).split()
LABELS = {
    "weights_load_oom",
    "kv_cache_insufficient",
    "profiling_oom",
    "cudagraph_capture_oom",
    "runtime_oom",
    "multi_gpu_oom",
    "host_ram_oom",
    "gpu_util_exceeds_free",
    "not_oom",
}


def split_of(url: str) -> str:
    return "test" if int(hashlib.sha256(url.encode()).hexdigest(), 16) % 2 else "train"


def pod_state(verdict: dict) -> dict:
    """What the reviewer read of the crashed run (null where the thread does not say); a value of
    the wrong type is dropped, not guessed."""
    ready, end = verdict.get("ready_before"), verdict.get("exit")
    return {
        "ready_before": ready if isinstance(ready, bool) else None,
        "exit": end if isinstance(end, (int, str)) and not isinstance(end, bool) else None,
        "context_why": str(verdict.get("context_why") or "")[:300] or None,
        # The model's weights on one GPU are judged in a separate blind pass (tests/corpus/README.md).
        "weights_gib_per_gpu": None,
        "weights_basis": None,
    }


def read_jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        print(f"corpus_add: cannot read {path}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new", type=Path)
    parser.add_argument("--audit", type=Path, action="append", default=[])
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "corpus" / "corpus.jsonl")
    args = parser.parse_args()
    corpus = read_jsonl(args.corpus)
    verdicts: dict[str, dict] = {}  # one sample's rows from several reviews are merged
    for path in args.audit:
        for row in read_jsonl(path):
            verdicts.setdefault(row.get("id"), {}).update(row)
    threads = {s["source_url"] for s in corpus}
    ids = {s["id"] for s in corpus}
    added, refused = [], Counter()
    for sample in read_jsonl(args.new):
        verdict = verdicts.get(sample.get("id"))
        if set(sample) != set(MINED) or sample["label"] not in LABELS or not str(sample["log"]).strip():
            refused["malformed"] += 1
        elif sample["source_url"] in threads or sample["id"] in ids:
            refused["thread or id already in the corpus"] += 1
        elif verdict is None or not isinstance(verdict.get("failure_shown"), bool):
            refused["no blind verdict"] += 1
        elif verdict.get("label_ok") is False:
            refused["label doubted by the reviewer"] += 1
        else:
            row = {k: sample[k] for k in MINED}
            row.update(failure_shown=verdict["failure_shown"], split=split_of(sample["source_url"]), origin="mined")
            row.update(pod_state(verdict))
            added.append(row)
            threads.add(sample["source_url"])
            ids.add(sample["id"])
    with args.corpus.open("a") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in added)
    print(f"added {len(added)}: {dict(Counter(r['split'] for r in added))} {dict(Counter(r['label'] for r in added))}")
    for why, n in refused.items():
        print(f"refused {n}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
