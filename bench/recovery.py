"""How many restarts does a memory incident cost, and how much KV capacity survives the heal?

    python bench/recovery.py [--vllm-version X.Y.Z]

Scenarios: model x GPU x starting flags x memory held by another process. The
calibrated memory model plays the world: for each start it says whether vLLM
starts and, if not, the failure, which is rendered as the message vLLM prints
and fed through the real classify -> plan loop. "autoheal" knows the free GPU
memory at start (the launcher's NVML snapshot); "no probe" does not. Compared with the blind ladder
(lower gpu_memory_utilization by 0.01 per restart, as vLLM's own auto-tune
script does) and, for host-RAM incidents, Kubernetes VPA's x1.2 bump. "pre-flight" is the
share of incidents that never happen: pre-flight `Fix` starts with flags the world accepts. Every
action is allowed, tensor parallelism up to 8 (as `serve --max-tensor-parallel-size 8`). The world is
the memory model's figures every release shares, or with `--vllm-version` that release's (its batch
defaults, sampler, windows and where the CUDA graphs go), which the heal and pre-flight then know too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
from vllm_autoheal.api import ALL_ACTIONS, EngineArgs, VLLMServiceSpec  # noqa: E402
from vllm_autoheal.diagnosis import Signals, classify  # noqa: E402
from vllm_autoheal.diagnosis.units import GIB  # noqa: E402
from vllm_autoheal.gpu_catalog import lookup  # noqa: E402
from vllm_autoheal.memory import estimate  # noqa: E402
from vllm_autoheal.preflight import preflight  # noqa: E402
from vllm_autoheal.remedy import Inventory, plan_heal  # noqa: E402
from vllm_autoheal.shape_reader import shape_from_config  # noqa: E402
from vllm_autoheal.vllm_release import Release, parse_version  # noqa: E402

MAX_RESTARTS = 30
MODELS = ["llama-3.1-8b", "qwen2.5-7b", "mistral-7b-v0.1", "qwen2.5-32b", "mixtral-8x7b", "llama-3.1-70b"]
GPUS = ["NVIDIA-L4", "NVIDIA-GeForce-RTX-4090", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"]
STARTS = [  # (label, engine args)
    ("defaults", {}),
    ("util 0.95", {"gpu_memory_utilization": 0.95}),
    ("util 0.5, 32k", {"gpu_memory_utilization": 0.5, "max_model_len": 32768}),
    ("TP 2, util 0.9", {"tensor_parallel_size": 2}),
]
OTHERS = [0.0, 0.3]  # share of the GPU held by another process
RELEASE: Release | None = None  # the world's vLLM release (--vllm-version)


def world(shape, engine: EngineArgs, gpu, free: float | None):
    """What vLLM does with these flags: the memory model under the world's release."""
    return estimate(shape, engine, gpu, free, release=RELEASE)


def vllm_message(est, engine: EngineArgs) -> str:
    """The line vLLM 0.33 prints for the failure the world predicts."""
    if est.failure == "kv_cache_insufficient":
        if est.kv_tokens <= 0:
            return "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
        needed = est.kv_bytes_per_token * est.max_model_len / GIB
        return (
            f"ValueError: To serve at least one request with the model's max seq len ({est.max_model_len}), "
            f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({est.kv_cache_gib:.2f} GiB). Based on the available memory, the estimated maximum model length "
            f"is {est.max_model_len_fit}. Try increasing `gpu_memory_utilization`"
        )
    if est.failure == "gpu_util_exceeds_free":
        free = est.gpu_free_gib - 0.51
        return (
            f"ValueError: Free memory on device cuda:0 ({free:.2f}/{est.gpu_total_gib:.2f} GiB) on startup is "
            f"less than desired GPU memory utilization ({engine.gpu_memory_utilization}, "
            f"{est.requested_gib:.2f} GiB). Decrease GPU memory utilization"
        )
    if est.failure == "weights_load_oom":
        return (
            "ERROR [gpu_model_runner.py:1] Failed to load model - not enough GPU memory. (original error: CUDA "
            "out of memory. Tried to allocate 1.00 GiB.)"
        )
    if est.failure == "cudagraph_capture_oom":
        return (
            '  File "vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB."
        )
    raise ValueError(est.failure)


def heal(shape, gpu, start: EngineArgs, free: float, tp_bound: int, with_probe: bool) -> tuple[bool, int, object]:
    spec = VLLMServiceSpec(
        model="m",
        engine=start,
        heal={
            "maxAttempts": MAX_RESTARTS,
            "bounds": {"maxTensorParallelSize": tp_bound},
            "allowedActions": ALL_ACTIONS,
        },
    )
    engine, history = start, []
    # The launcher's GPU snapshot reports what was free at start (with_probe), else free is unknown.
    inventory = Inventory(
        gpu_total_gib=gpu.memory_gib, shape=shape, gpu_free_gib=free if with_probe else None, release=RELEASE
    )
    for restarts in range(MAX_RESTARTS + 1):
        est = world(shape, engine, gpu, free)
        if est.fits:
            return True, restarts, est
        diag = classify(Signals(log=vllm_message(est, engine), tensor_parallel_size=engine.tensor_parallel_size))
        remedy = plan_heal(spec, diag, history, inventory, engine)
        if remedy.gives_up:
            return False, restarts, est
        history.append({"cause": diag.cause, "action": remedy.action, "numbers": diag.numbers})
        engine = remedy.apply(engine)
    return False, MAX_RESTARTS, est


def prevented(shape, gpu, start: EngineArgs, free: float, tp_bound: int) -> tuple[bool, int, object]:
    """Pre-flight `Fix` with the model's config and the free memory known: the flags it starts with.
    When the world says they start, the incident never happens (0 restarts)."""
    spec = VLLMServiceSpec(
        model="m",
        engine=start,
        image=f"vllm/vllm-openai:v{RELEASE}" if RELEASE else "vllm/vllm-openai:latest",
        preflight="Fix",
        heal={"bounds": {"maxTensorParallelSize": tp_bound}, "allowedActions": ALL_ACTIONS},
    )
    result = preflight(spec, gpu, shape, free)
    est = world(shape, result.engine, gpu, free)
    return est.fits, 0, est


def ladder(shape, gpu, start: EngineArgs, free: float) -> tuple[bool, int, object]:
    engine = start
    for restarts in range(MAX_RESTARTS + 1):
        est = world(shape, engine, gpu, free)
        if est.fits:
            return True, restarts, est
        engine = engine.model_copy(update={"gpu_memory_utilization": round(engine.gpu_memory_utilization - 0.01, 2)})
        if engine.gpu_memory_utilization <= 0.05:
            break
    return False, restarts, est


def best_tokens(shape, gpu, start: EngineArgs, free: float) -> int:
    """KV tokens of the best start that fits: the user's context, highest utilization that fits free memory."""
    best = 0
    for util in [x / 100 for x in range(30, 96)]:
        for length in (start.max_model_len, None):
            e = start.model_copy(update={"gpu_memory_utilization": util, "max_model_len": length})
            est = world(shape, e, gpu, free)
            if est.fits:
                best = max(best, est.kv_tokens)
    return best


def main(argv: list[str] | None = None) -> int:
    global RELEASE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-version", help="the world's vLLM release (default: the figures every release shares)")
    args = parser.parse_args(argv)
    if args.vllm_version:
        RELEASE = parse_version(args.vllm_version)
        if RELEASE is None:
            parser.error(f"--vllm-version {args.vllm_version!r} is not X.Y.Z")
    print(f"vLLM release: {RELEASE or 'not named (the figures every release shares)'}")
    configs = {
        m: shape_from_config(json.loads((ROOT / "tests/fixtures/configs" / f"{m}.json").read_text())) for m in MODELS
    }
    rows = {"pre-flight": [], "autoheal": [], "no probe": [], "ladder": []}
    incidents = 0
    for model, gpu_name, (_label, args), other in itertools.product(MODELS, GPUS, STARTS, OTHERS):
        shape, gpu = configs[model], lookup(gpu_name)
        start = EngineArgs(**args)
        free = gpu.memory_gib * (1 - other)
        if world(shape, start, gpu, free).fits:
            continue
        incidents += 1
        best = best_tokens(shape, gpu, start, free)
        for name, fn in (
            ("pre-flight", lambda: prevented(shape, gpu, start, free, 8)),
            ("autoheal", lambda: heal(shape, gpu, start, free, 8, True)),
            ("no probe", lambda: heal(shape, gpu, start, free, 8, False)),
            ("ladder", lambda: ladder(shape, gpu, start, free)),
        ):
            ok, restarts, est = fn()
            kept = (est.kv_tokens / best) if ok and best else None
            rows[name].append((ok, restarts, kept, best > 0))
    print(f"incidents (starts that fail): {incidents} of {len(MODELS) * len(GPUS) * len(STARTS) * len(OTHERS)}")
    never = [r for r in rows["pre-flight"] if r[0]]
    print(
        f"never happen with pre-flight Fix (config and free memory known): {len(never)} of {incidents} "
        f"({len(never) / incidents:.0%}); the rest are healed after the crash"
    )
    for title, keep in (
        ("the model fits this GPU with some flags", True),
        ("no single-GPU flags fit (only more GPUs help)", False),
    ):
        print(f"\n{title}:")
        print(
            f"{'':10} {'incidents':>9} {'healed':>7} {'in 1 restart':>13} {'mean restarts':>14} {'KV kept vs best':>16}"
        )
        for name, data in rows.items():
            group = [r for r in data if r[3] == keep]
            if not group:
                continue
            healed = [r for r in group if r[0]]
            one = [r for r in group if r[0] and r[1] <= 1]
            mean = statistics.mean(r[1] for r in healed) if healed else float("nan")
            kept = [r[2] for r in healed if r[2] is not None]
            kept_text = f"{statistics.mean(kept):16.0%}" if kept else f"{'-':>16}"
            mean_text = f"{mean:14.2f}" if healed else f"{'-':>14}"
            print(
                f"{name:10} {len(group):9} {len(healed) / len(group):7.0%} {len(one) / len(group):13.0%} "
                f"{mean_text} {kept_text}"
            )
    host_ram()
    return 0


def host_ram() -> None:
    """Host-RAM incidents: a pod needs `need` GiB; it starts with `limit`. VPA: x1.2 (+100 MiB) per OOM;
    autoheal: the same bump, but within the user's bound and recorded; the bound decides give-up."""
    print("\nhost RAM (OOMKilled): limit -> needed, restarts until it fits")
    print(f"{'start':>8} {'needed':>8} {'VPA x1.2':>10} {'autoheal':>10}")
    for limit, need in ((16, 18), (16, 24), (32, 64), (8, 8.5)):
        vpa, n = limit, 0
        while vpa < need and n < MAX_RESTARTS:
            vpa, n = max(vpa * 1.2, vpa + 0.1), n + 1
        spec = VLLMServiceSpec(
            model="m",
            resources={"limits": {"memory": f"{limit}Gi"}},
            heal={"bounds": {"maxMemoryLimit": f"{int(need * 1.5)}Gi"}, "maxAttempts": 30},
        )
        cur, m, history = limit * GIB, 0, []
        while cur < need * GIB and m < MAX_RESTARTS:
            r = plan_heal(
                spec,
                classify(Signals(reason="OOMKilled", exit_code=137)),
                history,
                Inventory(memory_limit_bytes=int(cur)),
            )
            if r.gives_up:
                break
            from vllm_autoheal.quantity import parse_quantity

            cur, m = parse_quantity(r.changes["memory_limit"]), m + 1
            history.append({"cause": "host_ram_oom", "action": r.action})
        print(f"{limit:>7}G {need:>7}G {n:>10} {m:>10}")


if __name__ == "__main__":
    sys.exit(main())
