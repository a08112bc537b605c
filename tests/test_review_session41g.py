"""Session 41's seventh hostile review, end to end: the multi-change remedies of today's heal planner (a cut to what
is free with an fp8 KV cache, share_steps._with_fp8_cache), the notes a declined step leaves (Context.declined), and
the operator's refusal of a heal in flight past the spec's policy (heal_apply._in_flight_refused), driven through
`vllm-autoheal diagnose`, `vllm-autoheal serve` and the operator's heal path rather than plan_heal alone. Each test
asserts the right behaviour and is a strict xfail while the code does otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_review_session41e import _refused_beside_a_grown_process

from samples import OPENAI_HANDLER, fake_vllm

FP8_SERVES = """
import http.server, json, sys
args = sys.argv[1:]
def flag(name):
    return args[args.index(name) + 1] if name in args else None
if flag("--kv-cache-dtype") == "fp8":
    port = int(flag("--port"))
{handler}
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
sys.stdout.write(open(REFUSED).read())
sys.exit(1)
""".replace("{handler}", textwrap.indent(OPENAI_HANDLER, "    "))


def _serve(tmp_path: Path, source: str, *flags: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    (tmp_path / "refused.log").write_text(_refused_beside_a_grown_process())
    env, port = fake_vllm(tmp_path, f"REFUSED = {str(tmp_path / 'refused.log')!r}\n" + textwrap.dedent(source))
    history = tmp_path / "history.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "serve", "m", "--port", str(port), "--history", str(history),
         "--once", "--fresh", "--startup-timeout", "60", *flags],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    records = [json.loads(line) for line in history.read_text().splitlines()] if history.exists() else []
    return proc, records


def test_serve_applies_the_fp8_share_cut_whole_records_it_and_starts_from_it_next_time(tmp_path):
    # Sound (control): 41e's refusal with --min-max-model-len 131072: serve heals to 0.19 with --kv-cache-dtype fp8
    # (the stand-in vLLM serves only with fp8), records both changes, and the next run without --fresh starts from
    # them.
    flags = ("--min-max-model-len", "131072", "--gpu-memory-utilization", "0.24", "--max-model-len", "131072")
    proc, records = _serve(tmp_path, FP8_SERVES, *flags)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [(r["event"], r.get("action")) for r in records] == [
        ("heal", "LowerGpuMemoryUtilization"),
        ("healthy", None),
    ]
    assert records[0]["changes"] == {"gpu_memory_utilization": 0.19, "kv_cache_dtype": "fp8"}
    assert records[-1]["engine"]["kv_cache_dtype"] == "fp8"
    env, port = fake_vllm(tmp_path, f"REFUSED = {str(tmp_path / 'refused.log')!r}\n" + textwrap.dedent(FP8_SERVES))
    again = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "serve", "m", "--port", str(port), "--history",
         str(tmp_path / "history.jsonl"), "--once", "--startup-timeout", "60", *flags],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert again.returncode == 0 and "after 0 restart(s)" in again.stdout and "--kv-cache-dtype fp8" in again.stdout


@pytest.mark.parametrize("mode", ["PatchSpec", "StatusOverrides"])
def test_the_operator_applies_an_fp8_share_cut_in_flight_whole(mode, monkeypatch):
    # Sound (control): a LowerGpuMemoryUtilization heal carrying kv_cache_dtype fp8 passes _in_flight_refused and
    # reaches the Deployment as "--kv-cache-dtype fp8" in both modes (the spec too, in PatchSpec).
    from test_review_session41_tenant import EVENTS, LOG, NS, StubKube, _vsvc
    from vllm_autoheal.api import Deployed, EngineArgs, HealIntent
    from vllm_autoheal.kube import heal_apply
    from vllm_autoheal.kube.config import OperatorConfig

    monkeypatch.setattr(heal_apply, "event", lambda body, **k: EVENTS.append(k))
    spec = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "engine": {"gpuMemoryUtilization": 0.24, "maxModelLen": 131072},
        "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H200", "limits": {"memory": "32Gi"}},
        "heal": {"mode": mode, "bounds": {"minMaxModelLen": 131072}},
    }
    prev = Deployed(engine=EngineArgs.model_validate(spec["engine"]), model=spec["model"], memory_limit="32Gi")
    healed = {**spec["engine"], "gpuMemoryUtilization": 0.19, "kvCacheDtype": "fp8"}
    target = Deployed(engine=EngineArgs.model_validate(healed), model=spec["model"], memory_limit="32Gi")
    intent = HealIntent(
        crash="p/vllm/1", cause="gpu_util_exceeds_free", action="LowerGpuMemoryUtilization", summary="cut",
        target=target, previous=prev, applied=False, time="2026-01-01T00:00:00Z",
    ).wire()  # fmt: skip
    status = {"baseline": spec["engine"], "inFlight": intent}
    if mode == "StatusOverrides":
        status["effective"] = target.engine.wire()
    kube = StubKube(_vsvc(spec, status))
    EVENTS.clear()
    heal_apply.complete(kube, OperatorConfig(), None, NS, "svc", LOG)  # type: ignore[arg-type]
    assert [e["reason"] for e in EVENTS] == ["Healed"]  # (not refused: made, and announced by its mark)
    assert kube.body["status"]["inFlight"]["applied"] is True
    if mode == "PatchSpec":
        assert kube.body["spec"]["engine"]["kvCacheDtype"] == "fp8"
    dep = next(m for m in kube.applied[-1] if m["kind"] == "Deployment")
    command = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert " ".join(command).find("--gpu-memory-utilization 0.19") > 0 and "--kv-cache-dtype fp8" in " ".join(command)
