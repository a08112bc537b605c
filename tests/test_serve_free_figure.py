"""`serve` bounds a heal by the memory other processes leave, as the operator does with the launcher's probe:
the free memory NVML saw on vLLM's GPUs before the start that crashed. Before, `serve` took a GPU to be vLLM's
alone, and a raise beside another process was a certain refusal and another restart."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_autoheal import local, local_ranks, serve_sizing
from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.cli import main
from vllm_autoheal.diagnosis import GpuInfo, GpuSnapshot, Signals, classify
from vllm_autoheal.engine import parse_args
from vllm_autoheal.gpu_catalog import least_cuda_free_gib
from vllm_autoheal.gpu_probe import gpus_for
from vllm_autoheal.remedy import Inventory, plan_heal

from samples import OPENAI_HANDLER, config_shape

MIB = 2**20
GIB = 2**30


def gpus(*free_gib: float, names: tuple[str, ...] = ()) -> GpuSnapshot:
    return GpuSnapshot(
        gpus=[
            GpuInfo(
                index=i,
                name=(names[i] if names else "NVIDIA H200"),
                total_bytes=143771 * MIB,
                free_bytes=int(f * GIB),
                used_bytes=143771 * MIB - int(f * GIB),
            )
            for i, f in enumerate(free_gib)
        ]
    )


def least_free_gib(snap: GpuSnapshot, count: int, env: dict) -> float | None:
    return least_cuda_free_gib(gpus_for(snap, count, env) or [])


# --- which GPUs, as NVML numbers them --------------------------------------------------------------------


def test_without_cuda_visible_devices_vllm_takes_the_first_gpus():
    snap = gpus(100, 20, 140)
    assert least_free_gib(snap, 1, {}) == 100
    assert least_free_gib(snap, 2, {}) == 20
    assert least_free_gib(snap, 4, {}) is None  # (vLLM fails short of devices: no figure to size by)


def test_cuda_visible_devices_picks_and_orders_them():
    snap = gpus(100, 20, 140, 60)
    assert least_free_gib(snap, 1, {"CUDA_VISIBLE_DEVICES": "2"}) == 139.8  # (an idle H200: see below)
    assert least_free_gib(snap, 2, {"CUDA_VISIBLE_DEVICES": "3, 2"}) == 60
    assert [g.index for g in gpus_for(snap, 2, {"CUDA_VISIBLE_DEVICES": "3,0,1"})] == [3, 0]
    # CUDA stops at an entry it cannot read, and shows none where the first is such
    assert least_free_gib(snap, 1, {"CUDA_VISIBLE_DEVICES": "2,x,0"}) == 139.8
    assert least_free_gib(snap, 2, {"CUDA_VISIBLE_DEVICES": "2,x,0"}) is None
    assert least_free_gib(snap, 1, {"CUDA_VISIBLE_DEVICES": ""}) is None
    assert least_free_gib(snap, 1, {"CUDA_VISIBLE_DEVICES": "-1"}) is None
    assert least_free_gib(snap, 1, {"CUDA_VISIBLE_DEVICES": "7"}) is None  # (no such GPU)
    assert least_free_gib(snap, 2, {"CUDA_VISIBLE_DEVICES": "1,1"}) is None  # (CUDA refuses it)


@pytest.mark.parametrize("listed", ["GPU-8f3c2a1e-0000-0000-0000-000000000000", "MIG-GPU-8f3c/1/0", "0,GPU-8f3c"])
def test_a_gpu_named_by_uuid_gives_no_figure(listed):
    """NVML's snapshot keeps no UUID: which GPU it names cannot be told, so no figure (the GPU is taken
    to be vLLM's alone, as before), never another GPU's."""
    assert least_free_gib(gpus(100, 20), 2 if "," in listed else 1, {"CUDA_VISIBLE_DEVICES": listed}) is None


def test_unlike_gpus_in_cudas_default_order_give_no_figure():
    """CUDA numbers unlike GPUs fastest first, NVML by PCI bus: CUDA's 0 may be NVML's 1."""
    snap = gpus(100, 20, names=("NVIDIA H200", "NVIDIA L4"))
    assert least_free_gib(snap, 1, {}) is None
    assert least_free_gib(snap, 1, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == 100
    assert least_free_gib(GpuSnapshot(error="no NVIDIA driver"), 1, {}) is None


def test_no_gpu_has_more_free_than_cuda_can_take():
    """NVML counts the driver's reserve as free on an idle GPU (140.40 GiB of an H200, CUDA's total 139.80)
    and as used beside another process (the real probe with a 60.51 GiB neighbour: 79.29 free, which
    vLLM 0.25's own figure matches less its CUDA context). A share sized on 140.40 asks for 0.6 GiB
    that is not there."""
    import json

    from conftest import FIXTURES

    idle = gpus(143771 / 1024)
    assert round(idle.gpus[0].free_bytes / GIB, 2) == 140.40 and least_free_gib(idle, 1, {}) == 139.8
    probe = json.loads((FIXTURES / "gpu" / "probe-second-process-60g.json").read_text())["snapshot"]
    beside = GpuSnapshot(gpus=[GpuInfo(**g) for g in probe["gpus"]])
    assert least_free_gib(beside, 1, {}) == 79.29
    unknown = gpus(50.0, names=("Some New GPU",))
    assert least_free_gib(unknown, 1, {}) == 50.0  # (no catalog figure: NVML's total is the bound)


# --- serve, end to end -------------------------------------------------------------------------------------

# A fake `vllm serve` with vLLM 0.25's own words on an H200 (tests/fixtures/gpu/heal-runs/kv.log and
# thief.log): Llama-3.1-8B's cache at utilization u is 11.63 GiB + (u - 0.2) x 139.8, and another process
# leaves 31.77 GiB free for vLLM (32.9 GiB as NVML counts it, before vLLM's own CUDA context).
FAKE_8B = """
import http.server, json, sys
args = sys.argv[1:]
def flag(name, default):
    return args[args.index(name) + 1] if name in args else default
util, length = float(flag("--gpu-memory-utilization", 0.9)), int(flag("--max-model-len", 131072))
FREE, TOTAL = 31.77, 139.8
head = "(EngineCore pid=5449) ERROR 12-01 02:41:49 [core.py:1231] "
if util * TOTAL > FREE:
    print(head + f"ValueError: Free memory on device cuda:0 ({FREE}/{TOTAL} GiB) on startup is less than desired "
          f"GPU memory utilization ({util}, {util * TOTAL:.2f} GiB). Decrease GPU memory utilization or reduce GPU "
          "memory used by other processes.")
    sys.exit(1)
cache = round(11.63 + (util - 0.2) * TOTAL, 2)
need = round(16.0 * length / 131072, 2)
print(f"(EngineCore pid=5449) INFO 12-01 02:41:49 [gpu_worker.py:538] Available KV cache memory: {cache} GiB")
if need > cache:
    print(head + f"ValueError: To serve at least one request with the model's max seq len ({length}), ({need} GiB KV "
          f"cache is needed, which is larger than the available KV cache memory ({cache} GiB). Based on the available "
          f"memory, the estimated maximum model length is {int(cache / 16.0 * 131072)}. Try increasing "
          "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
          "`max_model_len` when initializing the engine.")
    sys.exit(1)
port = int(flag("--port", 8000))
{handler}
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_serve_sizes_a_kv_heal_by_what_another_process_leaves(tmp_path, monkeypatch, capsys):
    """Llama-3.1-8B at utilization 0.2 and 128k beside a process holding 107 GiB of the H200 (heal_runs.sh's
    kv-thief). Before: the KV heal raised to 0.25, which vLLM refused (31.77 GiB free), a second heal cut
    to what was free, and a third the context: three restarts. Now one, within the free memory."""
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "fake" / "vllm", tmp_path / "fake" / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(textwrap.dedent(FAKE_8B).replace("{handler}", textwrap.dedent(OPENAI_HANDLER)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fake"), *sys.path]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(local, "snapshot", lambda own_pids=None: gpus(32.9))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    history = tmp_path / "history.jsonl"
    code = main(
        ["serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", str(port), "--history", str(history), "--once",
         "--fresh", "--startup-timeout", "60", "--gpu-memory-utilization", "0.2", "--max-model-len", "131072"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    records = [json.loads(line) for line in history.read_text().splitlines()]
    heals = [r for r in records if r["event"] == "heal"]
    assert len(heals) == 1, out[-3000:]
    engine = records[-1]["engine"]
    assert records[-1]["event"] == "healthy"
    assert engine["gpu_memory_utilization"] * 139.8 <= 31.77, engine
    assert heals[0]["gpu_free_gib"] == 32.9  # (kept, as the operator's heal record keeps what sized it)


# --- a hostile review of the above (session 28) ------------------------------------------------------------
IDLE = 143771 * MIB  # NVML's total (and free) on an idle H200


def _h200s(*free_gib: float) -> GpuSnapshot:
    return GpuSnapshot(
        gpus=[
            GpuInfo(index=i, name="NVIDIA H200", total_bytes=IDLE, free_bytes=min(IDLE, int(f * GIB)),
                    used_bytes=IDLE - min(IDLE, int(f * GIB)))
            for i, f in enumerate(free_gib)
        ]
    )  # fmt: skip


# (the two-GPU fakes' shared parts: their flags, vLLM 0.25's start-up refusal on cuda:1, and the server once it starts)
HEADER = """import http.server, json, sys
args = sys.argv[1:]
def flag(name, default=None):
    return args[args.index(name) + 1] if name in args else default
tp, util = int(flag("--tensor-parallel-size", 1)), float(flag("--gpu-memory-utilization", 0.9))
head = "(EngineCore pid=5449) ERROR 12-01 02:41:49 [core.py:1231] "
"""
REFUSE_ON_CUDA1 = """    print(head + f"ValueError: Free memory on device cuda:1 ({GPU1_FREE}/{TOTAL} GiB) on startup is less than "
          f"desired GPU memory utilization ({util}, {util * TOTAL:.2f} GiB). Decrease GPU memory utilization or "
          "reduce GPU memory used by other processes.")
    sys.exit(1)"""
SERVE = """if True:
    port = int(flag("--port"))
{handler}
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()"""


def _fake_vllm(tmp_path: Path, monkeypatch, script: str) -> None:
    script = script.replace("{header}", HEADER).replace("{refuse}", REFUSE_ON_CUDA1).replace("{serve}", SERVE)
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "fake" / "vllm", tmp_path / "fake" / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(
        textwrap.dedent(script).replace("{handler}", textwrap.indent(OPENAI_HANDLER, "    "))
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fake"), *sys.path]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _qwen72b(tmp_path: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    from make_models import QWEN25_72B

    model = tmp_path / "qwen2.5-72b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_72B))
    return model


# A fake `vllm serve` on two H200s where GPU 1 has only GPU1_FREE GiB free for vLLM (another process
# holds the rest): TP 1 fails to load the 72B's weights; TP 2 is refused by vLLM's start-up check on
# cuda:1 when its share asks for more than that, and serves otherwise.
FAKE_TWO_GPUS = """
{header}
GPU1_FREE, TOTAL = 58.78, 139.8
if tp == 1:
    print(head + "Failed to load model - not enough GPU memory. (original error: CUDA out of memory. "
          "Tried to allocate 1.00 GiB.)")
    sys.exit(1)
if util * TOTAL > GPU1_FREE:
{refuse}
{serve}
"""


def test_a_split_is_sized_past_what_another_process_leaves_on_the_gpu_it_adds(tmp_path, monkeypatch, capsys):
    """Medium. serve's snapshot holds every GPU, but the free figure it gives the planner is the least over
    the GPUs the engine that crashed used (TP x PP = 1: GPU 0 only). A heal that splits the model over
    GPU 1 too is then sized as though GPU 1 were idle, while the snapshot in hand says another process
    holds 80 GiB of it: utilization 0.9 on a GPU with 59.29 GiB free, a certain start-up refusal on
    cuda:1 (one more restart) that the numbers already showed. README: 'a larger share is never sized
    past what other processes leave'."""
    _fake_vllm(tmp_path, monkeypatch, FAKE_TWO_GPUS)
    model = _qwen72b(tmp_path)
    monkeypatch.setattr(local, "snapshot", lambda own_pids=None: _h200s(140.40, 59.29))
    history = tmp_path / "history.jsonl"
    main(
        ["serve", str(model), "--port", str(_port()), "--history", str(history), "--once", "--fresh",
         "--startup-timeout", "60", "--max-model-len", "8192", "--max-tensor-parallel-size", "2",
         "--max-attempts", "1"]
    )  # fmt: skip
    out = capsys.readouterr().out
    heals = [r for r in map(json.loads, history.read_text().splitlines()) if r["event"] == "heal"]
    for heal in heals:
        after = heal["after"]
        if after["tensor_parallel_size"] == 2:
            asked = after["gpu_memory_utilization"] * 139.8
            assert asked <= 59.29 - 0.51, f"the split asks {asked:.2f} GiB of GPU 1, which has 58.78 free: {heal}"
    # (67.7 GiB of weights a GPU at TP 2 fit no share of GPU 1's 58.78: a give-up, no restart wasted)
    events = [r["event"] for r in map(json.loads, history.read_text().splitlines())]
    assert events == ["gave_up"], out[-3000:]


# Llama-3.1-8B's KV refusal at 0.2 and 128k on an H200 (as tests/test_serve_free_figure.py's fake); with TP 2,
# vLLM's start-up check on cuda:1, where another process leaves 20 GiB.
FAKE_8B_BESIDE = """
{header}
GPU1_FREE, TOTAL = 20.0, 139.8
if tp == 2 and util * TOTAL > GPU1_FREE:
{refuse}
if tp == 1:
    print("(EngineCore pid=5449) INFO 12-01 02:41:49 [gpu_worker.py:538] Available KV cache memory: 11.63 GiB")
    print(head + "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
          "cache is needed, which is larger than the available KV cache memory (11.63 GiB). Based on the available "
          "memory, the estimated maximum model length is 95272. Try increasing `gpu_memory_utilization` (which also "
          "controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.")
    sys.exit(1)
{serve}
"""


def test_after_an_undone_split_the_free_figure_is_of_the_gpus_the_restored_flags_use(tmp_path, monkeypatch, capsys):
    """Low. When a heal 'made it worse', serve goes back to the flags that got furthest (TP 1 here) but
    sizes the next remedy by the free figure of the GPUs the undone flags used (TP 2: GPUs 0 and 1), taken
    before the revert: GPU 1's 20.51 GiB, where the restored TP 1 runs on GPU 0 alone (idle: 139.80). Every
    bound that reads gpu_free_gib (raise limit, share, the memory model's veto, the give-up's advice) is
    then another GPU's."""
    _fake_vllm(tmp_path, monkeypatch, FAKE_8B_BESIDE)
    monkeypatch.setattr(local, "snapshot", lambda own_pids=None: _h200s(140.40, 20.51))
    seen: list[tuple[int, float | None]] = []
    real = local.plan_heal

    def spy(spec, diag, heals, inventory, engine, **kw):
        seen.append((engine.tensor_parallel_size * engine.pipeline_parallel_size, inventory.gpu_free_gib))
        return real(spec, diag, heals, inventory, engine, **kw)

    monkeypatch.setattr(local, "plan_heal", spy)
    history = tmp_path / "history.jsonl"
    main(
        ["serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", str(_port()), "--history", str(history), "--once",
         "--fresh", "--startup-timeout", "60", "--gpu-memory-utilization", "0.2", "--max-model-len", "131072",
         "--max-gpu-memory-utilization", "0.2", "--min-max-model-len", "131072", "--kv-cache-dtype", "fp8",
         "--enforce-eager", "--max-tensor-parallel-size", "2"]
    )  # fmt: skip
    events = [r["event"] for r in map(json.loads, history.read_text().splitlines())]
    assert "undone" in events, events
    planned_after_undo = seen[-1]
    assert planned_after_undo[0] == 1, seen
    assert planned_after_undo[1] == 139.8, f"TP 1 (GPU 0, idle) planned with GPU 1's free figure: {seen}"


# --- a second hostile review (session 28) ------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
HEAD = "(EngineCore_DP1 pid=5449) ERROR 12-01 02:41:49 [core.py:1231] "
h200s = _h200s


# vLLM 0.25's KV refusal for Llama-3.1-8B at 0.2 and 128k (tests/fixtures/gpu/heal-runs/kv.log), from data-parallel
# rank 1's engine core.
KV_DP1 = (
    "(EngineCore_DP1 pid=5449) INFO 12-01 02:41:49 [gpu_worker.py:538] Available KV cache memory: 11.63 GiB\n"
    + HEAD
    + "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (11.63 GiB). Based on the available memory, the estimated "
    "maximum model length is 95272. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the "
    "CPU backend) or decreasing `max_model_len` when initializing the engine.\n"
)


def test_data_parallel_ranks_gpus_are_left_out_of_the_free_figure():
    """Medium. `vllm serve --data-parallel-size 2` (TP 1) takes GPUs 0 and 1: vLLM gives each local DP rank its
    own TP x PP devices. serve_sizing.inventory takes only TP x PP = 1 GPU, so GPU 1, where another process holds
    107 GiB (32.9 GiB free, as in the kv-thief run), never bounds the heal: the KV heal raises utilization to
    0.25 (34.95 GiB), which vLLM's start-up check refuses on cuda:1 (the very refusal session 28 fixed for one GPU:
    two more heals). With GPU 1's figure the plan is the context cut that healed kv-thief in one restart."""
    engine = parse_args("--data-parallel-size 2 --gpu-memory-utilization 0.2 --max-model-len 131072").engine
    spec = VLLMServiceSpec(model="meta-llama/Llama-3.1-8B-Instruct", engine=engine)
    diag = classify(Signals(log=KV_DP1, exit_code=1))
    snap = h200s(140.40, 32.9)
    inventory = serve_sizing.inventory(snap, snap, engine, None, diag, {})
    remedy = plan_heal(spec, diag, [], inventory, engine)
    util = remedy.changes.get("gpu_memory_utilization", engine.gpu_memory_utilization)
    assert util * 139.8 <= 32.9 - 0.51, (
        f"DP rank 1 runs on GPU 1 (32.9 GiB free) but the heal was sized by GPU 0 ({inventory.gpu_free_gib}): "
        f"{remedy.summary()}"
    )


def test_give_up_advice_ignores_cpu_offload():
    """Low. weights_beyond_free compares the memory model's weights per GPU with what others leave, but the
    estimate keeps every weight on the GPU: with --cpu-offload-gb 100, Llama-3.1-70B keeps about 31.5 GiB on the
    GPU, well inside the 59 GiB free, yet the give-up says 'The weights take 131.5 GiB per GPU ... no share makes
    them fit'. (The give-up itself comes from remedy_gate.utilization_floor, which also ignores the offload:
    older, but the new sentence tells the user the false reason.)"""
    flags = "--gpu-memory-utilization 0.9 --max-model-len 8192 --cpu-offload-gb 100"
    engine = parse_args(flags).engine
    log = HEAD.replace("_DP1", "") + (
        "ValueError: Free memory on device cuda:0 (59.0/139.8 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    diag = classify(Signals(log=log, exit_code=1))
    assert diag.cause == "gpu_util_exceeds_free"
    spec = VLLMServiceSpec(model="m", engine=engine)
    inv = Inventory(gpu_total_gib=139.8, gpu_free_gib=60.0, shape=config_shape("llama-3.1-70b"))
    remedy = plan_heal(spec, diag, [], inv, engine)
    assert "no share makes them fit" not in remedy.reason, remedy.reason


def test_readme_quotes_a_give_up_sentence_the_gpu_run_never_printed():
    """Low. README's GPU table (session 28) says the 130 GiB run 'gives up at once: "the weights take 15.0 GiB
    per GPU, more than the 8.26 GiB other processes leave"'. The run's own output
    (tests/fixtures/gpu/heal-runs/thief-130g.log) says only 'no allowed change is left ... (tried: none).': the
    sentence is what test_gpu_heal_runs.py gets by re-planning the fixture with 29cfc62's advice, not what
    vllm-autoheal did on the GPU."""
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if "beside 130 GiB held (session 28)" in line)
    quoted = re.search(r'"([^"]+)"', row).group(1)
    run = (ROOT / "tests/fixtures/gpu/heal-runs/thief-130g.log").read_text()
    assert quoted.lower() in run.lower(), f"README quotes {quoted!r}; the run printed: " + next(
        line for line in run.splitlines() if "not healing" in line
    )


@pytest.mark.parametrize(
    "args,ranks",
    [
        ([], 1),
        (["--data-parallel-size", "2"], 2),
        (["-dp", "4"], 4),
        (["--data-parallel-size=4", "--data-parallel-size-local", "2"], 2),  # (the ranks on this machine)
        (["-dpl=2", "--data-parallel-size", "8"], 2),
        (["--data_parallel_size", "3"], 3),
        (["--data-parallel-start-rank", "2", "-dp", "2"], 2),
        (["--data-parallel-size", "two"], None),
        (["--data-parallel-size", "0"], None),
        (["--data-parallel-size", "٢"], None),  # (a digit Python's int() reads, a count no flag parser gives)
        (["--data-parallel-s", "2"], None),  # (an abbreviation: size or size-local is argparse's to say)
        (["--data-parallel-size"], None),
    ],
)
def test_the_data_parallel_ranks_here_are_read_plainly_or_not_at_all(args, ranks):
    assert local_ranks.data_parallel_here(args) == ranks
