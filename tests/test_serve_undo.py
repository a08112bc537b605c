"""`serve` undoes a heal that made things worse, with a real child process standing in for vLLM:
it replays what vLLM 0.25 printed on an H200 for the flags it is given, and serves /health and a
completion once started with flags that work."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from samples import OPENAI_HANDLER, fake_vllm

RUNS = Path(__file__).parent / "fixtures" / "gpu" / "heal-runs"

# The child: util 0.995 -> the real capture OOM; util 0.95 -> an OOM while loading weights (a new,
# earlier failure: the heal made it worse); --enforce-eager -> a server that answers.
FAKE_VLLM = """
import http.server, json, sys
args = sys.argv[1:]
def flag(name):
    return args[args.index(name) + 1] if name in args else None
if "--enforce-eager" in args:
    port = int(flag("--port"))
{handler}
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
if flag("--gpu-memory-utilization") == "0.995":
    sys.stdout.write(open(CAPTURE).read())
else:
    print('(EngineCore pid=9) ERROR 12-01 02:40:00 [core.py:1]   File "/v/vllm/model_executor/model_loader/base_loader.py", line 50, in load_model')
    print("(EngineCore pid=9) ERROR 12-01 02:40:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 0.50 GiB is free.")
sys.exit(1)
""".replace("{handler}", textwrap.indent(OPENAI_HANDLER, "    "))


def first_start(name: str) -> str:
    text = (RUNS / f"{name}.log").read_text()
    return text.split("[vllm-autoheal] starting: ", 1)[1].split("\n", 1)[1].split("[vllm-autoheal] ", 1)[0]


def test_serve_goes_back_to_the_flags_that_got_further_and_tries_the_next_remedy(tmp_path, monkeypatch):
    (tmp_path / "capture.log").write_text(first_start("capture"))
    source = f"CAPTURE = {str(tmp_path / 'capture.log')!r}\n" + textwrap.dedent(FAKE_VLLM)
    env, port = fake_vllm(tmp_path, source)
    history = tmp_path / "history.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "serve", "m", "--port", str(port), "--history", str(history),
         "--once", "--fresh", "--startup-timeout", "60", "--gpu-memory-utilization", "0.995"],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in history.read_text().splitlines()]
    events = [(r["event"], r.get("action")) for r in records]
    assert events == [
        ("heal", "LowerGpuMemoryUtilization"),  # sized to leave the graphs room: 0.95
        ("undone", "LowerGpuMemoryUtilization"),  # 0.95 failed earlier, loading weights
        ("heal", "EnforceEager"),  # from the flags that got further (0.995)
        ("healthy", None),
    ], events
    assert records[2]["before"]["gpu_memory_utilization"] == 0.995
    assert records[-1]["engine"]["enforce_eager"] is True and records[-1]["engine"]["gpu_memory_utilization"] == 0.995
    assert "made it worse" in proc.stdout
