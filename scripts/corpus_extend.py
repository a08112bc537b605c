"""Give cut samples of tests/corpus/corpus.jsonl the rest of their log, the way its README says.

    python scripts/corpus_extend.py EXTENDED.jsonl --audit AUDIT.jsonl [--audit STATE.jsonl] [--corpus PATH]

Many posted excerpts were copied from one search excerpt of a thread and stop before the error.
EXTENDED.jsonl rows (`id`, `extended_log`, `join`, `evidence`) carry the same post's further lines,
found in other excerpts of the thread: the old log must be a part of the new one, verbatim (a line
`[...]` where the two could not be shown to be adjacent). The sample's reviewers' fields are read
again from the new log: each AUDIT row is a blind verdict (`failure_shown`, `label_ok`, and the
pod's state `ready_before`, `exit`, `context_why`), as for a new sample. A sample without a verdict,
whose old log is not in the new one, or whose label the reviewer now doubts is left as it was and
listed. The split, the label and the weights figures never change here.
Exit 2 with a message on malformed input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from corpus_add import ROOT, pod_state, read_jsonl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extended", type=Path)
    parser.add_argument("--audit", type=Path, action="append", default=[])
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "corpus" / "corpus.jsonl")
    args = parser.parse_args()
    corpus = read_jsonl(args.corpus)
    by_id = {s["id"]: s for s in corpus}
    verdicts: dict[str, dict] = {}
    for path in args.audit:
        for row in read_jsonl(path):
            verdicts.setdefault(row.get("id"), {}).update(row)
    changed, left = Counter(), Counter()
    for row in read_jsonl(args.extended):
        sample, new_log = by_id.get(row.get("id")), row.get("extended_log")
        verdict = verdicts.get(row.get("id"))
        if new_log is None:
            left["nothing found"] += 1
        elif sample is None or not isinstance(new_log, str):
            left["malformed or unknown id"] += 1
        elif sample["log"] not in new_log or new_log == sample["log"]:
            left["old log not part of the new one"] += 1
        elif verdict is None or not isinstance(verdict.get("failure_shown"), bool):
            left["no blind verdict"] += 1
        elif verdict.get("label_ok") is False:
            left["label doubted by the reviewer"] += 1
            print(f"  label doubted: {sample['id']}: {verdict.get('label_concern', '')}")
        else:
            now_shown = verdict["failure_shown"] and not sample["failure_shown"]
            sample["log"] = new_log
            sample["failure_shown"] = verdict["failure_shown"]
            weights = {k: sample.get(k) for k in ("weights_gib_per_gpu", "weights_basis")}
            sample.update(pod_state(verdict), **weights)
            changed["now shown" if now_shown else "longer, still not shown"] += 1
    args.corpus.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in corpus))
    print(f"extended: {dict(changed)}")
    for why, n in left.items():
        print(f"left as it was {n}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
