"""A split (more tensor parallelism) that needs another share of the GPU to fit, planned in one change:
each test names what the planner did before, and what the memory model says of the change now."""

from __future__ import annotations

from pathlib import Path

from vllm_autoheal.api import ALL_ACTIONS, VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.remedy import GIVE_UP, Inventory, plan_heal

from samples import config_shape

L4 = lookup("NVIDIA-L4")
A100 = lookup("NVIDIA-A100-SXM4-80GB")
MIXTRAL, QWEN32, LLAMA70 = config_shape("mixtral-8x7b"), config_shape("qwen2.5-32b"), config_shape("llama-3.1-70b")
LLAMA8 = config_shape("llama-3.1-8b")
WEIGHTS_OOM = (
    "ERROR [gpu_model_runner.py:1] Failed to load model - not enough GPU memory. "
    "(original error: CUDA out of memory. Tried to allocate 1.00 GiB.)"
)
# vLLM's start-up check with another process holding 30 % of an A100 (55 of 79 GiB free)
FREE_55 = (
    "ValueError: Free memory on device cuda:0 (54.90/79.15 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 71.24 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
SPLIT_UP_TO_8 = {"bounds": {"maxTensorParallelSize": 8}, "allowedActions": ALL_ACTIONS}


def spec(heal: dict, **engine) -> VLLMServiceSpec:
    return VLLMServiceSpec(model="m", engine=engine, heal=heal)


def after(engine_spec: VLLMServiceSpec, changes: dict):
    return engine_spec.engine.model_copy(update=changes)


def test_a_split_whose_weights_fill_a_low_share_comes_with_the_share_that_fits():
    """Mixtral (87 GiB) on L4s at utilization 0.5 and 32k, split allowed up to 8. Before: every split
    kept 0.5, where 8 GPUs' 10.9 GiB of weights leave the KV cache nothing, so the planner gave up and
    said to allow tensor parallelism 8, which was allowed. Now: TP 8 and the least share that fits, in
    one change."""
    s = spec(SPLIT_UP_TO_8, gpuMemoryUtilization=0.5, maxModelLen=32768)
    d = classify(Signals(log=WEIGHTS_OOM))
    assert d.cause == "weights_load_oom"
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=MIXTRAL, gpu_free_gib=L4.memory_gib))
    assert r.action == "IncreaseTensorParallel", r.summary()
    assert r.changes["tensor_parallel_size"] == 8 and 0.5 < r.changes["gpu_memory_utilization"] <= 0.95, r.changes
    assert "max_model_len" not in r.changes  # the whole context is kept
    new = after(s, r.changes)
    assert estimate(MIXTRAL, new, L4, L4.memory_gib).fits
    # the least share: 0.01 below it (less the 0.01 margin) the split still falls short
    below = new.model_copy(update={"gpu_memory_utilization": round(new.gpu_memory_utilization - 0.02, 2)})
    assert not estimate(MIXTRAL, below, L4, L4.memory_gib).fits


def test_without_a_raise_allowed_the_split_keeps_its_share_and_cuts_the_context_or_gives_up():
    """The share moves only where its own action is allowed: with RaiseGpuMemoryUtilization left out,
    no share is raised."""
    actions = [a for a in ALL_ACTIONS if a != "RaiseGpuMemoryUtilization"]
    s = spec(
        {"bounds": {"maxTensorParallelSize": 8}, "allowedActions": actions}, gpuMemoryUtilization=0.5, maxModelLen=32768
    )
    r = plan_heal(
        s,
        classify(Signals(log=WEIGHTS_OOM)),
        inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=MIXTRAL, gpu_free_gib=L4.memory_gib),
    )
    assert "gpu_memory_utilization" not in r.changes, r.summary()
    if r.action == GIVE_UP:  # the advice asks for what the split lacks, not for what is allowed
        assert "allow RaiseGpuMemoryUtilization" in r.reason and "allow it with" not in r.reason, r.reason


def test_weights_that_do_not_fit_beside_another_process_are_split_at_the_share_of_what_is_free():
    """Qwen2.5-32B (61 GiB) on an A100 with 55 GiB free, split allowed up to 8. Before: the free-memory
    refusal's plan only cut the share, which the weights' floor refused, and gave up (under vLLM 0.34,
    where the same start fails on the KV cache, the KV plan split it). Now: TP 2 at the share of
    what is free, taking each GPU of the split to have as little free, in one change."""
    s = spec(SPLIT_UP_TO_8)
    d = classify(Signals(log=FREE_55))
    assert d.cause == "gpu_util_exceeds_free"
    r = plan_heal(s, d, inventory=Inventory(gpu_total_gib=A100.memory_gib, shape=QWEN32))
    assert r.action == "IncreaseTensorParallel", r.summary()
    assert r.changes["tensor_parallel_size"] == 2, r.changes
    util = r.changes["gpu_memory_utilization"]
    assert util * A100.memory_gib < 54.9, util  # asks for less than was free
    assert estimate(QWEN32, after(s, r.changes), A100, 54.9 + 0.5).fits


def test_a_free_memory_refusal_is_never_split_blind_or_where_no_split_fits_beside_the_others():
    """Without the model's shape nothing says a split fits beside the others (a split keeping the share
    that asked for more than was free is a certain second refusal); with it, Llama-3.1-70B on L4s with
    30 % held elsewhere does not fit at TP 8 either: no change."""
    held = "ValueError: Free memory on device cuda:0 (15.44/22.05 GiB) on startup is less than desired GPU " + (
        "memory utilization (0.9, 19.85 GiB). Decrease GPU memory utilization"
    )
    d = classify(Signals(log=held))
    assert d.cause == "gpu_util_exceeds_free"
    blind = plan_heal(spec(SPLIT_UP_TO_8), d, inventory=Inventory(gpu_total_gib=L4.memory_gib))
    assert "tensor_parallel_size" not in blind.changes, blind.summary()
    none = plan_heal(spec(SPLIT_UP_TO_8), d, inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA70))
    assert none.action == GIVE_UP, none.summary()


def test_a_free_memory_split_is_only_where_the_split_is_allowed():
    d = classify(Signals(log=FREE_55))
    heal = {"bounds": {"maxTensorParallelSize": 8}}  # IncreaseTensorParallel is not allowed by default
    r = plan_heal(spec(heal), d, inventory=Inventory(gpu_total_gib=A100.memory_gib, shape=QWEN32))
    assert r.action == GIVE_UP, r.summary()


def test_a_context_cut_the_model_says_stops_at_capture_comes_with_the_graphs_room():
    """Llama-3.1-8B on an L4 at utilization 0.95 and 128k: vLLM estimates 44,960 tokens. Before: the
    context was cut to that, with the planner's own verdict 'still fails: CUDA graphs need about 0.99 GiB
    beyond the 20.95 GiB requested', and a capture crash and a second heal followed. Now: the cut
    comes with the share that leaves the graphs room and the context the smaller cache holds."""
    kv = (
        "ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (5.49 GiB). Based on the available memory, "
        "the estimated maximum model length is 44960. Try increasing `gpu_memory_utilization`"
    )
    s = spec({}, gpuMemoryUtilization=0.95)
    llama = config_shape("llama-3.1-8b")
    r = plan_heal(
        s,
        classify(Signals(log=kv)),
        inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=llama, gpu_free_gib=L4.memory_gib),
    )
    assert r.action == "LowerMaxModelLen", r.summary()
    assert r.changes["gpu_memory_utilization"] < 0.95 and r.changes["max_model_len"] < 44960, r.changes
    assert estimate(llama, after(s, r.changes), L4, L4.memory_gib).fits, r.summary()
    assert "still fails" not in r.expected


# `serve`'s child for Qwen2.5-72B's config: vLLM 0.25's own output on an H200 (tests/gpu/heal_runs.sh's tp2
# run) with the KV budget utilization 0.5 leaves; a server once split over 2 GPUs at a share >= 0.52.
FAKE_72B = """
import http.server, json, sys
args = sys.argv[1:]
def flag(name):
    return args[args.index(name) + 1] if name in args else None
if flag("--tensor-parallel-size") == "2" and float(flag("--gpu-memory-utilization") or 0.9) >= 0.52:
    port = int(flag("--port"))
{handler}
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
sys.stdout.write(open(FIRST).read())
sys.exit(1)
"""


def test_serve_reads_a_local_models_shape_and_splits_with_the_share_in_one_restart(tmp_path, monkeypatch, capsys):
    """`serve` gave its planner no model shape (the operator does, from the model's config): the 72B at
    utilization 0.5 was split blind, keeping 0.5, where the split's 67.7 GiB of weights leave its KV
    cache nothing: a certain second crash. Now a model on disk is read once, and one heal sets both."""
    import json
    import os
    import socket
    import sys
    import textwrap

    from test_gpu_heal_runs import attempts
    from vllm_autoheal import local
    from vllm_autoheal.cli import main
    from vllm_autoheal.diagnosis import GpuInfo, GpuSnapshot

    from samples import OPENAI_HANDLER

    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    from make_models import QWEN25_72B

    first = attempts("tp2")[0][0].replace(
        "Available KV cache memory: -12.41 GiB", "Available KV cache memory: -68.57 GiB"
    )
    (tmp_path / "first.log").write_text(first)
    model = tmp_path / "qwen2.5-72b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_72B))
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "fake" / "vllm", tmp_path / "fake" / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    script = FAKE_72B.replace("{handler}", textwrap.indent(OPENAI_HANDLER, "    "))
    (pkg / "api_server.py").write_text(f"FIRST = {str(tmp_path / 'first.log')!r}\n" + textwrap.dedent(script))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fake"), *sys.path]))
    idle = 143771 * 2**20  # (NVML's total and free on an idle H200)
    h200s = GpuSnapshot(
        gpus=[GpuInfo(index=i, name="NVIDIA H200", total_bytes=idle, free_bytes=idle) for i in range(2)]
    )
    monkeypatch.setattr(local, "snapshot", lambda own_pids=None: h200s)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    history = tmp_path / "history.jsonl"
    code = main(
        ["serve", str(model), "--port", str(port), "--history", str(history), "--once", "--fresh",
         "--startup-timeout", "60", "--gpu-memory-utilization", "0.5", "--max-model-len", "32768",
         "--max-tensor-parallel-size", "2"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    records = [json.loads(line) for line in history.read_text().splitlines()]
    heals = [r for r in records if r["event"] == "heal"]
    assert len(heals) == 1 and heals[0]["action"] == "IncreaseTensorParallel", out[-3000:]
    assert records[-1]["event"] == "healthy"
    engine = records[-1]["engine"]
    assert engine["tensor_parallel_size"] == 2 and 0.52 <= engine["gpu_memory_utilization"] <= 0.6, engine


# --- a hostile review of the above (session 27) ----------------------------------------------------


def test_a_weights_load_oom_on_weights_an_empty_gpu_holds_raises_no_share_blind():
    """High. The operator knows no free figure, and a raise sized as though the GPU were the pod's alone
    asked for memory the crash itself shows is not there: Llama-3.1-8B's 15 GiB at 0.6 of an L4 fit an
    empty one, yet failed to load (another process holds 30 %). Before: TP 2 and 0.76, a certain
    free-memory refusal. Now: no raise; the split with the context its cache holds, as before."""
    s = spec({"bounds": {"maxTensorParallelSize": 2}, "allowedActions": ALL_ACTIONS}, gpuMemoryUtilization=0.6)
    r = plan_heal(s, classify(Signals(log=WEIGHTS_OOM)), inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8))
    assert "gpu_memory_utilization" not in r.changes, r.summary()
    assert r.changes.get("tensor_parallel_size") == 2
    world = estimate(LLAMA8, after(s, r.changes), L4, L4.memory_gib * 0.7)
    assert world.fits, world.reasons


def test_the_split_share_starts_at_the_splits_floor():
    """Medium. With minGpuMemoryUtilization 0.75 the least share that fits (0.56) was offered and the gate
    refused it: a give-up where TP 8 at 0.75 fits (and a KV refusal lost its shorter-context split)."""
    bounds = {"maxTensorParallelSize": 8, "minGpuMemoryUtilization": 0.75}
    s = spec({"bounds": bounds, "allowedActions": ALL_ACTIONS}, gpuMemoryUtilization=0.5, maxModelLen=32768)
    r = plan_heal(
        s,
        classify(Signals(log=WEIGHTS_OOM)),
        inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=MIXTRAL, gpu_free_gib=L4.memory_gib),
    )
    assert r.changes.get("tensor_parallel_size") == 8 and r.changes["gpu_memory_utilization"] >= 0.75, r.summary()


def test_the_cpu_backends_free_memory_refusal_is_never_split():
    """Medium. CPU ranks of one node share its memory: a split asks for more of it, not less (and the
    operator would ask for GPUs). Before: TP 2 at 0.46 of a node with 80 of 128 GiB free."""
    cpu = (
        "ValueError: Free memory on device cpu (80.00/128.00 GiB) on startup is less than desired CPU memory "
        "utilization (0.9, 115.20 GiB). Decrease"
    )
    d = classify(Signals(log=cpu))
    assert d.cause == "gpu_util_exceeds_free"
    r = plan_heal(spec(SPLIT_UP_TO_8), d, inventory=Inventory(shape=QWEN32))
    assert "tensor_parallel_size" not in r.changes, r.summary()


def test_the_graphs_room_in_a_context_cut_keeps_to_the_cache_vllm_printed():
    """Medium. The cut's context came from the memory model alone, where the cut it merges into was sized
    from vLLM's estimate: with vLLM's cache smaller than the model's (4.00 GiB printed), 32,768 tokens at
    0.93 left vLLM 3.56 GiB, about 29,155 tokens: a certain KV refusal. Now the merged context is what
    vLLM's own cache holds after the cut (3% margin), and with minMaxModelLen above that, no merge."""
    llama_kv = (
        "ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (4.00 GiB). Based on the available memory, "
        "the estimated maximum model length is 32768. Try increasing `gpu_memory_utilization`"
    )
    inv = Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8, gpu_free_gib=L4.memory_gib)
    d = classify(Signals(log=llama_kv))
    r = plan_heal(spec({}, gpuMemoryUtilization=0.95), d, inventory=inv)
    cut = 0.95 - r.changes.get("gpu_memory_utilization", 0.95)
    vllm_tokens = (4.00 - cut * L4.memory_gib) * 2**30 / 131072  # Llama-3.1-8B: 128 KiB a token
    assert r.changes["max_model_len"] <= vllm_tokens * 0.97, r.summary()
    held = plan_heal(spec({"bounds": {"minMaxModelLen": 32768}}, gpuMemoryUtilization=0.95), d, inventory=inv)
    assert held.changes == {"max_model_len": 32768}, held.summary()


def test_the_give_up_names_the_action_a_split_lacks():
    """Low. With RaiseGpuMemoryUtilization not allowed the advice said the split was allowed and fit no
    share; it now says the split's cache needs a larger share and names the action."""
    actions = [a for a in ALL_ACTIONS if a not in ("RaiseGpuMemoryUtilization", "LowerMaxModelLen")]
    s = spec(
        {"bounds": {"maxTensorParallelSize": 8}, "allowedActions": actions}, gpuMemoryUtilization=0.5, maxModelLen=32768
    )
    r = plan_heal(
        s,
        classify(Signals(log=WEIGHTS_OOM)),
        inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=MIXTRAL, gpu_free_gib=L4.memory_gib),
    )
    assert r.action == GIVE_UP and "allow RaiseGpuMemoryUtilization" in r.reason, r.reason


def test_the_gate_lets_these_moves_through_only_with_a_split():
    """A weights heal's share or context, and a free-memory refusal's split, move only together."""
    from vllm_autoheal.api import HealBounds
    from vllm_autoheal.remedy_gate import Limits, check

    engine, limits = spec({}).engine, Limits(HealBounds(maxTensorParallelSize=8))
    assert "only with tensor_parallel_size" in check(
        "weights_load_oom", {"gpu_memory_utilization": 0.95}, engine, "m", None, limits
    )
    assert "only with gpu_memory_utilization" in check(
        "gpu_util_exceeds_free", {"tensor_parallel_size": 2}, engine, "m", None, limits
    )
    assert (
        check(
            "gpu_util_exceeds_free",
            {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5},
            engine,
            "m",
            None,
            limits,
        )
        is None
    )


# --- a second review (session 27) -------------------------------------------------------------------


def test_a_free_figure_one_rank_printed_never_outbids_the_launchers_least():
    """Medium. At TP 2 the rank that printed its GPU's free figure (54.90 GiB) is not the one with least
    free (40.5 GiB by the launcher's probe): the cut to 0.66 asked 52 GiB of a GPU with 40. The least
    of the two sizes the cut now."""
    free_rank0 = (
        "ValueError: Free memory on device cuda:0 (54.90/79.15 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.24 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    s = spec({}, tensorParallelSize=2)
    r = plan_heal(s, classify(Signals(log=free_rank0)), inventory=Inventory(gpu_total_gib=79.15, gpu_free_gib=40.5))
    assert r.action == "LowerGpuMemoryUtilization", r.summary()
    assert r.changes["gpu_memory_utilization"] * 79.15 < 40.0, r.summary()


def test_serve_sizes_a_known_gpu_as_vllm_counts_it():
    """Medium. `serve` took NVML's total (140.40 GiB on an H200, 22.49 on an L4), which counts what the
    driver reserves; vLLM's share is of torch's (139.80, 22.05). With the model's shape now sizing shares,
    0.44 GiB on an L4 is more than the 0.01 margin a share keeps."""
    from vllm_autoheal.gpu_catalog import gpu_total_gib

    assert gpu_total_gib("NVIDIA H200", 143771 * 2**20) == 139.80
    assert gpu_total_gib("NVIDIA L4", int(22.49 * 2**30)) == 22.05
    assert gpu_total_gib("Some New GPU", 96 * 2**30) == 96.0  # unknown: NVML's figure


def test_the_graphs_room_keeps_to_the_token_count_vllm_v0_printed():
    """Medium. V0 prints the cache's size in tokens only ("maximum number of tokens that can be stored in KV
    cache (32768)"): the merged cut's context was the memory model's alone, 32,768 at 0.93 where vLLM's own
    cache then holds about 29,155. It is held to vLLM's count now (or the cut is not merged)."""
    v0 = (
        "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
        "stored in KV cache (32768). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."
    )
    d = classify(Signals(log=v0))
    assert d.cause == "kv_cache_insufficient" and d.numbers.get("kv_tokens") == 32768, d.numbers
    inv = Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8, gpu_free_gib=L4.memory_gib)
    r = plan_heal(spec({}, gpuMemoryUtilization=0.95), d, inventory=inv)
    cut = 0.95 - r.changes.get("gpu_memory_utilization", 0.95)
    vllm_tokens = 32768 - cut * L4.memory_gib * 2**30 / 131072  # Llama-3.1-8B: 128 KiB a token
    assert r.changes["max_model_len"] <= vllm_tokens, r.summary()


def test_a_capture_heal_counts_only_what_another_process_left_outside_the_budget():
    """Low (a review). The room outside the budget was (1 - utilization) x the GPU, with another process's
    memory counted in it: at 0.85 of an L4 with 2.5 GiB held elsewhere the graphs had 0.81 GiB, not 3.31,
    yet the room was judged enough and the graphs given up (--enforce-eager). With the launcher's free
    figure the room is what the other process left, and the cut gives the graphs theirs."""
    capture = (
        '  File "vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.\n"
    )
    d = classify(Signals(log=capture))
    assert d.cause == "cudagraph_capture_oom"
    s = spec({}, gpuMemoryUtilization=0.85, maxModelLen=8192)
    blind = plan_heal(s, d, inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8))
    assert blind.action == "EnforceEager", blind.summary()
    seen = plan_heal(s, d, inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8, gpu_free_gib=19.55))
    assert seen.action == "LowerGpuMemoryUtilization", seen.summary()
    util = seen.changes["gpu_memory_utilization"]
    assert 19.55 - util * L4.memory_gib >= 0.99 + 0.5, seen.summary()  # the graphs' share and its margin


# --- a third review (session 27) --------------------------------------------------------------------


def test_the_cpu_backends_share_of_host_memory_is_never_sized_by_a_gpus_free_figure():
    """Medium. A CPU-backend pod that can see a GPU: the launcher's GPU figure (22 GiB) sized the share of
    a node with 200 of 251 GiB free: 0.06 where the host's own figure gives 0.59."""
    cpu = (
        "ValueError: Free memory on device cpu (200.00/251.00 GiB) on startup is less than desired CPU memory "
        "utilization (0.9, 225.90 GiB). Decrease"
    )
    d = classify(Signals(log=cpu))
    assert d.subtype == "cpu_memory_share_exceeds_free"
    alone = plan_heal(spec({}), d, inventory=Inventory())
    beside = plan_heal(spec({}), d, inventory=Inventory(gpu_free_gib=22.0))
    assert beside.changes == alone.changes and alone.changes["gpu_memory_utilization"] > 0.5, beside.summary()


def test_a_capture_heal_beside_another_process_is_one_the_memory_model_says_captures():
    """Medium. Beside another process the leaner room (the graphs and 0.5 GiB, whose margin holds vLLM's CUDA
    context on an idle GPU) left none: at 0.8 of an L4 with 18.47 GiB free the cut to 0.77 left the graphs
    too little by the memory model's own verdict. The leaner room is taken there only where the model says
    the graphs fit beside the others. And a figure that leaves less than the budget and vLLM's context (an
    earlier heal's, from before a raise) is stale: the start reached capture."""
    capture = (
        '  File "vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.\n"
    )
    d = classify(Signals(log=capture))
    s = spec({}, gpuMemoryUtilization=0.8, maxModelLen=8192)
    inv = Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8, gpu_free_gib=18.47)
    r = plan_heal(s, d, inventory=inv)
    if r.action == "LowerGpuMemoryUtilization":
        assert estimate(LLAMA8, after(s, r.changes), L4, 18.47).fits, r.summary()
    stale = Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8, gpu_free_gib=12.0)
    high = spec({}, gpuMemoryUtilization=0.85, maxModelLen=8192)
    r = plan_heal(high, d, inventory=stale)
    blind = plan_heal(high, d, inventory=Inventory(gpu_total_gib=L4.memory_gib, shape=LLAMA8))
    assert (r.action, r.changes) == (blind.action, blind.changes) and "out of the -" not in r.reason, r.summary()


def test_serve_never_takes_a_gpu_as_larger_than_nvml_says():
    """Low. The catalog's RTX A6000 figure (47.38 GiB) is a size NVML's 44.99 does not reach (another
    variant): torch's total is never above NVML's."""
    from vllm_autoheal.gpu_catalog import gpu_total_gib

    assert gpu_total_gib("NVIDIA RTX A6000", 46068 * 2**20) == 46068 / 1024


def test_a_gpu_figure_no_heal_record_can_keep_is_not_used():
    """High. The launcher's message passes GPU sizes up to 1e5 GiB; the heal record keeps at most 4096, and
    a 5000 GiB free figure made recording the crash raise on every pod event: no heal, no record."""
    from vllm_autoheal.kube.crash import launcher_free_gib as least_free_gib
    from vllm_autoheal.kube.status import heal_record
    from vllm_autoheal.remedy import Remedy

    assert least_free_gib({"gpu_start": {"gpus": [[0, "Some GPU", 5000.0, 5000.0]], "other_processes": []}}) is None
    # (a known product is never taken to have more free than CUDA's total for it)
    assert least_free_gib({"gpu_start": {"gpus": [[0, "NVIDIA L4", 5000.0, 5000.0]], "other_processes": []}}) == 22.05
    assert least_free_gib({"gpu_start": {"gpus": [[0, "NVIDIA L4", 22.05, 12.05]], "other_processes": []}}) == 12.05
    record = heal_record("p", "u", "vllm", 1, classify(Signals(log="")), Remedy("NoChange"), {}, None, 1, 5000.0)
    assert record.get("gpuFreeGib") is None
