"""`vllm-autoheal serve` against a real vLLM engine (the CPU build) and a tiny model made here.

Each memory case must heal in exactly one restart (counted from the history file);
a crash that is not about memory must be reported and left alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def engine_env(tmp_path_factory, vllm_python):
    root = tmp_path_factory.mktemp("vllm")
    model = (
        subprocess.run(
            [vllm_python, str(HERE.parent / "scripts" / "tiny_model.py"), str(root / "tiny-model")],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    cache = root / "cache"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "ind"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "HF_HOME": str(cache / "hf"),
        "TRITON_CACHE_DIR": str(cache / "tr"),
        "PYTHONUNBUFFERED": "1",
    }
    return {"python": vllm_python, "model": model, "env": env}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(engine_env, tmp_path, *flags, prefix=(), port=None):
    history = tmp_path / "history.jsonl"
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "vllm_autoheal",
        "serve",
        engine_env["model"],
        "--python",
        engine_env["python"],
        "--port",
        str(port or _free_port()),
        "--once",
        "--history",
        str(history),
        "--startup-timeout",
        "600",
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=engine_env["env"], timeout=1200)
    records = [json.loads(line) for line in history.read_text().splitlines()] if history.exists() else []
    (tmp_path / "serve.out").write_text(proc.stdout + proc.stderr)
    return proc, records


def heals(records):
    return [r for r in records if r["event"] == "heal"]


def test_kv_cache_too_small_for_the_default_context(engine_env, tmp_path):
    proc, records = serve(engine_env, tmp_path, "--kv-cache-memory-bytes", "1Gi")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert len(heals(records)) == 1
    heal = heals(records)[0]
    assert heal["cause"] == "kv_cache_insufficient" and heal["action"] == "LowerMaxModelLen"
    assert heal["changes"] == {"max_model_len": heal["numbers"]["estimated_max_model_len"]}
    assert records[-1]["event"] == "healthy" and "completion ok" in proc.stdout
    assert "to keep the healed flags" in proc.stdout and "--max-model-len" in proc.stdout


def test_json_logs_heal_the_same(engine_env, tmp_path):
    """vLLM's JSON log records (--logging-config.formatter json), as a platform that ships logs as
    JSON sets them: the same diagnosis and the same one heal as the text log."""
    proc, records = serve(engine_env, tmp_path, "--kv-cache-memory-bytes", "1Gi", "--logging-config.formatter", "json")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [(h["cause"], h["action"]) for h in heals(records)] == [("kv_cache_insufficient", "LowerMaxModelLen")]
    assert heals(records)[0]["changes"] == {"max_model_len": 524160}
    assert records[-1]["event"] == "healthy" and "completion ok" in proc.stdout
    assert '"levelname": "ERROR", "name": "vllm.v1.engine.core"' in proc.stdout  # the engine logged JSON


def test_a_logging_format_of_the_operators_choosing_heals_the_same(engine_env, tmp_path):
    """vLLM's loggers under a Python logging format of the operator's own
    (--logging-config.pylogging_config_file: `%(asctime)s - %(name)s - %(levelname)s - %(message)s`):
    the same diagnosis and the same one heal as vLLM's own format."""
    config = HERE / "fixtures" / "vllm-cpu" / "custom-logging.json"
    proc, records = serve(
        engine_env, tmp_path, "--kv-cache-memory-bytes", "1Gi", "--logging-config.pylogging_config_file", str(config)
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [(h["cause"], h["action"]) for h in heals(records)] == [("kv_cache_insufficient", "LowerMaxModelLen")]
    assert heals(records)[0]["changes"] == {"max_model_len": 524160}
    assert records[-1]["event"] == "healthy" and "completion ok" in proc.stdout
    assert " - vllm.v1.engine.core - ERROR - EngineCore failed to start." in proc.stdout  # the engine used it


def test_kv_cache_larger_than_the_machine(engine_env, tmp_path):
    proc, records = serve(engine_env, tmp_path, "--kv-cache-memory-bytes", "64Gi", "--max-model-len", "4096")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [(h["cause"], h["action"]) for h in heals(records)] == [("gpu_util_exceeds_free", "SetKvCacheMemoryBytes")]
    assert heals(records)[0]["changes"]["kv_cache_memory_bytes"] < 64 * 2**30


def test_memory_share_larger_than_what_is_free(engine_env, tmp_path):
    proc, records = serve(engine_env, tmp_path, "--gpu-memory-utilization", "0.99", "--max-model-len", "4096")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [(h["cause"], h["action"]) for h in heals(records)] == [
        ("gpu_util_exceeds_free", "LowerGpuMemoryUtilization")
    ]
    assert heals(records)[0]["numbers"]["util"] == 0.99


def test_not_memory_is_reported_and_left_alone(engine_env, tmp_path):
    engine_env = {**engine_env, "model": str(tmp_path / "no-such-model")}
    proc, records = serve(engine_env, tmp_path, "--max-model-len", "4096")
    assert proc.returncode == 1
    assert not heals(records)
    assert records[-1]["event"] == "gave_up" and records[-1]["cause"] == "not_oom"
    assert records[-1]["engine"]["max_model_len"] == 4096  # untouched
    assert "not healing" in proc.stdout


def test_port_already_taken_is_not_memory(engine_env, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, records = serve(engine_env, tmp_path, "--max-model-len", "4096", port=port)
    assert proc.returncode == 1 and not heals(records)
    assert records[-1]["cause"] == "not_oom" and records[-1]["subtype"] == "port_in_use"


def _memory_cgroup(tmp_name: str) -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
                child = base / tmp_name
                child.mkdir()
                (child / "memory.limit_in_bytes").write_text(str(3 * 2**30))
                return child
    except OSError:
        return None
    return None


def test_memory_limit_kill_is_host_ram_and_heals_by_shrinking_the_kv_cache(engine_env, tmp_path):
    group = _memory_cgroup(f"autoheal-test-{os.getpid()}")
    if group is None:
        pytest.skip("SKIPPED LOUDLY: no cgroup v1 memory controller to impose a 3 GiB limit on this machine")
    try:
        prefix = ("sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "in-cgroup")
        proc, records = serve(
            engine_env, tmp_path, "--kv-cache-memory-bytes", "4Gi", "--max-model-len", "4096", prefix=prefix
        )
    finally:
        group.rmdir() if group.exists() else None
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [(h["cause"], h["action"]) for h in heals(records)] == [("host_ram_oom", "SetKvCacheMemoryBytes")]
    assert heals(records)[0]["changes"]["kv_cache_memory_bytes"] <= 2**30


def _descendants(pid: int) -> list[int]:
    """The processes under `pid` (from /proc: vLLM's engine core is a grandchild of the launcher)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def test_the_launcher_ends_a_real_server_whose_engine_died_once_health_confirms_it(engine_env, tmp_path):
    """vLLM 0.32 told to keep its server up when its engine dies (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH, the
    behaviour of versions before the server ended itself): its engine core killed, /health answers 503
    and the launcher ends the server, with its note."""
    port, term = _free_port(), tmp_path / "termination-log"
    env = {**engine_env["env"], "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "operator"), *sys.path])}  # fmt: skip
    vllm = [engine_env["python"], "-m", "vllm.entrypoints.openai.api_server", "--model", engine_env["model"],
            "--max-model-len", "2048", "--kv-cache-memory-bytes", "1G", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with open(tmp_path / "out.log", "wb") as out:
        launcher = subprocess.Popen(
            [engine_env["python"], "-m", "vllm_autoheal.launcher", "--termination-path", str(term), "--", *vllm],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            from vllm_autoheal.engine_death import health_status

            url = f"http://127.0.0.1:{port}/health"
            deadline = time.monotonic() + 600
            while health_status(url) != 200 and launcher.poll() is None and time.monotonic() < deadline:
                time.sleep(1)
            assert health_status(url) == 200, (tmp_path / "out.log").read_text()[-3000:]
            cores = [p for p in _descendants(launcher.pid) if b"EngineCore" in Path(f"/proc/{p}/cmdline").read_bytes()]
            assert cores, "no engine core process under the launcher"
            for pid in cores:
                os.kill(pid, signal.SIGKILL)
            code = launcher.wait(timeout=120)
        finally:
            if launcher.poll() is None:
                for pid in [*_descendants(launcher.pid), launcher.pid]:
                    os.kill(pid, signal.SIGKILL)
    log = (tmp_path / "out.log").read_text(errors="replace")
    assert code != 0, log[-3000:]
    assert "ended it" in json.loads(term.read_text())["note"]


# The launcher with a short grace and window (the constants are module globals; a test waits seconds).
SHORT_LAUNCHER = """
import sys
from vllm_autoheal import engine_death, launcher
engine_death.DEAD_GRACE_S, engine_death.CONFIRM_WINDOW_S = 1.0, 3.0
sys.exit(launcher.main(sys.argv[1:]))
"""


def test_a_clients_request_id_that_prints_vllms_report_of_engine_death_does_not_end_the_server(engine_env, tmp_path):
    """A real forge: with --enable-log-requests, vLLM 0.32 logs the client's own `request_id` with %s,
    and its formatter repeats the logger header on each of its lines, so a request_id holding a
    newline prints `(APIServer pid=N) INFO ... [async_llm.py:578] vllm.v1.engine.exceptions.
    EngineDeadError: ...`, a line engine_dead() reads as vLLM's report (before 88eb947 that alone
    ended the server). The launcher asks /health (200) and leaves the server running."""
    from vllm_autoheal.engine_death import direct_opener, engine_dead, health_status

    port = _free_port()
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    vllm = [engine_env["python"], "-m", "vllm.entrypoints.openai.api_server", "--model", engine_env["model"],
            "--max-model-len", "2048", "--kv-cache-memory-bytes", "1G", "--host", "127.0.0.1",
            "--port", str(port), "--enable-log-requests"]  # fmt: skip
    env = {**engine_env["env"], "PYTHONPATH": str(HERE.parent / "operator")}
    cmd = [sys.executable, "-c", SHORT_LAUNCHER, "--termination-path", str(tmp_path / "term"), "--", *vllm]
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=env, start_new_session=True)
    health = f"http://127.0.0.1:{port}/health"
    try:
        deadline = time.monotonic() + 600
        while health_status(health) != 200:
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(1)
        forged = "x\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.\ny"  # noqa: E501
        body = {"model": engine_env["model"], "prompt": "Hello", "max_tokens": 2, "request_id": forged}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with direct_opener().open(req, timeout=120) as answer:
            assert answer.status == 200
        deadline = time.monotonic() + 60
        while "did not confirm" not in err.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.5)
        printed = (out.read_bytes() + err.read_bytes()).decode("utf-8", "replace").splitlines(keepends=True)
        assert any(engine_dead(line) for line in printed)  # the forge is real: the old launcher ended it
        time.sleep(2)
        assert proc.poll() is None and health_status(health) == 200
        assert "EngineDeadError" not in err.read_text().split("did not confirm")[-1]  # never quoted
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
