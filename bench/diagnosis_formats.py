"""How the classifier reads the corpus in the shapes a log takes on its way to it.

    python bench/diagnosis_formats.py

Each log of tests/corpus/ that shows its failure and is read right (with the pod's state) is
rewritten the way a collector, a terminal, a notebook or vLLM's own logging options print it, and
read again: the bench prints, for each shape and split, how many of those right answers stay right.
The shapes are the collectors' and tools' own formats, not any sample's; the two last are limits
the classifier does not undo (a terminal's hard wrap at a fixed width, a log viewer's newest-first
order).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "tests"))
from vllm_autoheal.diagnosis import Signals, classify  # noqa: E402
from vllm_autoheal.diagnosis.corpus import context, load  # noqa: E402

from crafted.records import LOGGING_FORMATS as FORMATS  # noqa: E402
from crafted.records import as_json_records  # noqa: E402

# vLLM's text header, after an optional process prefix: where VLLM_LOGGING_PREFIX goes.
_HEADER = re.compile(
    r"^(?P<process>\([\w.:-]{1,60}(?: pid=\d+)?\) )?(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d )"
)
FRAME = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in (\S+)\s*$')


def each_line(prefix: str) -> Callable[[str], str]:
    """`prefix` before every line; `{s}` in it is the line's second (its number modulo 60), `{d}` its last digit."""
    return lambda log: "".join(
        prefix.format(s=f"{i % 60:02d}", d=i % 10) + line + "\n" for i, line in enumerate(log.splitlines())
    )


def stamped(log: str) -> str:
    return "".join(f"2026-12-01T10:00:{i % 60:02d}.{i:09d}Z {line}\n" for i, line in enumerate(log.splitlines()))


def ipython(log: str) -> str:
    """IPython 8's frames: `File PATH:LINE, in NAME(...)`."""
    out = []
    for line in log.splitlines():
        m = FRAME.match(line)
        out.append(f"{m.group(1)}File {m.group(2)}:{m.group(3)}, in {m.group(4)}(self, *args, **kwargs)" if m else line)
    return "\n".join(out) + "\n"


def docker_json(log: str) -> str:
    return "".join(
        json.dumps({"log": line + "\n", "stream": "stderr", "time": "2026-12-01T10:00:00Z"}) + "\n"
        for line in log.splitlines()
    )


def logging_prefix(first: bool) -> Callable[[str], str]:
    """VLLM_LOGGING_PREFIX="[llama-70b] ": before the process prefix (vLLM 0.32) or after it (older)."""

    def shape(log: str) -> str:
        out = []
        for line in log.splitlines():
            m = _HEADER.match(line)
            if m:
                process = m.group("process") or ""
                line = "[llama-70b] " + line if first else process + "[llama-70b] " + line[len(process) :]
            out.append(line)
        return "\n".join(out) + "\n"

    return shape


# vLLM's header's file, where VLLM_LOGGING_LEVEL=DEBUG names it as a path (0.10.2+, NewLineFormatter.shrink_path)
_HEADER_FILE = re.compile(
    r"^((?:\([^)]{1,80}\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:.]+ \[)([\w.-]+?\.py)(?=:\d+\])"
)


def debug_paths(log: str) -> str:
    """The log as vLLM prints it under VLLM_LOGGING_LEVEL=DEBUG: each header's file as a shortened path."""
    return "".join(_HEADER_FILE.sub(r"\1model_executor/.../layers/\2", line) + "\n" for line in log.splitlines())


def k9s(log: str) -> str:
    return "".join("│ " + line.ljust(200) + " │\n" for line in log.splitlines())


def hard_wrap(width: int) -> Callable[[str], str]:
    def shape(log: str) -> str:
        out = []
        for line in log.splitlines():
            while len(line) > width:
                out.append(line[:width])
                line = line[width:]
            out.append(line)
        return "\n".join(out) + "\n"

    return shape


def nccl_debug_info(lines: int) -> Callable[[str], str]:
    """NCCL_DEBUG=INFO: thousands of NCCL's own INFO lines (rings, channels, transports) before the
    rest, as every rank prints them while its communicators come up."""
    noise = "".join(
        f"gpu-node-3:4121:4188 [{i % 8}] NCCL INFO Channel {i % 32:02d}/32 : {i % 8}[{i % 8}] -> "
        f"{(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read\n"
        for i in range(lines)
    )
    return lambda log: noise + log


SHAPES: dict[str, Callable[[str], str]] = {
    "CRLF line ends": lambda log: log.replace("\n", "\r\n"),
    "kubectl logs --timestamps": stamped,
    "docker compose's service tag": each_line("vllm-1  | "),
    "kubectl logs --prefix": each_line("[pod/vllm-7d9f8c-x2x4q/vllm] "),
    "journald": each_line("Dec 01 12:00:00 gpu-node-3 vllm[41234]: "),
    "srun --label (task 3 of 16: padded)": each_line(" 3: "),
    "a quoted paste": each_line("> "),
    "a launcher's prefix no rule names (`<job-7 12:00:0N> `)": each_line("<job-7 12:00:0{d}> "),
    # log shippers' exports: a timestamp, then the shipper's own tags
    "journalctl -o short-iso": each_line("2026-12-01T10:00:{s}+0000 gpu-node-3 vllm[41234]: "),
    "Loki's logcli query": each_line('2026-12-01T10:00:{s}Z {{app="vllm", pod="vllm-7d9f8c-x2x4q"}} '),
    "aws logs tail (CloudWatch)": each_line("2026-12-01T10:00:{s}.000000+00:00 vllm/vllm/3f2a9c "),
    "stern --timestamps": each_line("vllm-7d9f8c-x2x4q vllm 2026-12-01T10:00:{s}.000000000Z "),
    "k9s's log view": k9s,
    "a node's docker json-file": docker_json,
    "vLLM's JSON records (--logging-config.formatter json)": as_json_records,
    "VLLM_LOGGING_PREFIX, before the process prefix": logging_prefix(first=True),
    "VLLM_LOGGING_PREFIX, after it": logging_prefix(first=False),
    "a notebook's traceback (IPython 8 frames)": ipython,
    "VLLM_LOGGING_LEVEL=DEBUG's headers (a path, not a file)": debug_paths,
    # logging formats of the operator's choosing (--logging-config.pylogging_config_file), and a wrapper's
    **{f"logging format: {name}": shape for name, shape in FORMATS.items()},
    "NCCL_DEBUG=INFO (8,000 NCCL lines first, ~0.8 MB)": nccl_debug_info(8000),
    "(limit) a terminal's hard wrap at 200 columns": hard_wrap(200),
    "(limit) newest line first": lambda log: "\n".join(reversed(log.splitlines())) + "\n",
}


def main() -> None:
    samples = [s for s in load(ROOT / "tests" / "corpus" / "corpus.jsonl") if s.get("failure_shown")]
    right = {"train": [], "test": []}
    for s in samples:
        ctx = context(s, pod_state=True)
        if classify(Signals(log=s["log"], **ctx)).cause == s["label"]:
            right[s["split"]].append((s, ctx))
    print(f"right with the pod's state, failure shown: train {len(right['train'])}, test {len(right['test'])}")
    for name, shape in SHAPES.items():
        kept = {
            split: sum(classify(Signals(log=shape(s["log"]), **ctx)).cause == s["label"] for s, ctx in items)
            for split, items in right.items()
        }
        print(
            f"  {name:55s} train {kept['train']:3d}/{len(right['train'])}   test {kept['test']:3d}/{len(right['test'])}"
        )


if __name__ == "__main__":
    main()
