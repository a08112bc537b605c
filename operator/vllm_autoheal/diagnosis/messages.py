"""Every vLLM/PyTorch/NCCL message the classifier keys on, old and new wordings side by side.

Sources: vLLM 0.33.0's own strings and the older forms (V0 and early V1) as real logs in the
corpus (tests/corpus/) print them. Named groups carry the numbers; a group
ending in `_gib` holds a size (with its unit, or GiB when the message has none).
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import model as m

# Kinds of message, strongest first.
MEMORY = "memory"  # an explicit vLLM memory message: decides the cause
HOST = "host"  # host RAM exhausted: decides host_ram_oom
NOT_OOM = "not_oom"  # a known non-memory failure (subtype)
NCCL_OOM = "nccl_oom"  # NCCL's CUDA call failed for lack of memory
OOM = "oom"  # a generic GPU out-of-memory: the phase decides the cause
KILLED = "killed"  # a worker died of SIGKILL: host RAM unless something stronger
FRAME = "frame"  # a traceback frame or marker that names the phase of a failure
MILESTONE = "milestone"  # startup progress: the phase reached so far
BUDGET = "budget"  # start-up figures showing no room for any KV cache: decide kv_cache_insufficient
FIGURE = "figure"  # numbers only
WEAK = "weak"  # a FRAME subtype: on more than one phase's path


@dataclass(frozen=True)
class Message:
    kind: str
    regex: re.Pattern[str]
    cause: m.Cause | None = None
    phase: m.EnginePhase | None = None
    subtype: str | None = None
    needles: tuple[str, ...] = ()  # one of these literals is in every match; empty: always try

    def search(self, text: str, lowered: str) -> re.Match[str] | None:
        """The regex runs only on lines holding one of its literal needles (str `in`, C speed)."""
        if self.needles:
            hay = lowered if self.regex.flags & re.IGNORECASE else text
            if not any(n in hay for n in self.needles):
                return None
        return self.regex.search(text)


_SPECIAL = set("\\.^$*+?{}[]()|")
_LITERAL_ESCAPES = set(".()[]{}*+?|^$/-'\" ")


def _top_level_alternatives(pattern: str) -> list[str]:
    parts, depth, cls, cur, i = [], 0, False, "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            cur += pattern[i : i + 2]
            i += 2
            continue
        if cls:
            cls = c != "]"
        elif c == "[":
            cls = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(cur)
            cur = ""
            i += 1
            continue
        cur += c
        i += 1
    return parts + [cur]


def _required_literal(alternative: str) -> str:
    """The longest run of literal characters that every match of this alternative contains."""
    runs, run, i, depth, cls = [], "", 0, 0, False
    while i < len(alternative):
        c = alternative[i]
        nxt = alternative[i + 1] if i + 1 < len(alternative) else ""
        if cls or depth:
            if cls:
                cls = c != "]" or alternative[i - 1] == "\\"
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "\\":
                i += 1
            elif c == "[":
                cls = True
            i += 1
            continue
        if c == "\\" and nxt in _LITERAL_ESCAPES:
            char, width = nxt, 2
        elif c in _SPECIAL:
            runs.append(run)
            run = ""
            depth += c == "("
            cls = c == "["
            i += 1 + (c == "\\")
            continue
        else:
            char, width = c, 1
        follow = alternative[i + width : i + width + 1]
        if follow in ("?", "*", "{"):
            runs.append(run)
            run = ""
        elif follow == "+":
            runs.append(run + char)
            run = ""
        else:
            run += char
        i += width
    runs.append(run)
    return max(runs, key=len)


def needles_of(pattern: str, flags: int = 0) -> tuple[str, ...]:
    found = []
    for alt in _top_level_alternatives(pattern):
        lit = _required_literal(alt).strip()
        if len(lit) < 3:
            return ()  # one alternative has no usable literal: always run the regex
        found.append(lit.lower() if flags & re.IGNORECASE else lit)
    return tuple(dict.fromkeys(found))


def _m(
    kind: str,
    pattern: str,
    cause: m.Cause | None = None,
    phase: m.EnginePhase | None = None,
    subtype: str | None = None,
    flags: int = 0,
    needles: tuple[str, ...] | None = None,
) -> Message:
    """`needles` overrides the literals read off the pattern, where the pattern starts with a group."""
    return Message(
        kind,
        re.compile(pattern, flags),
        cause,
        phase,
        subtype,
        needles if needles is not None else needles_of(pattern, flags),
    )


SIZE = r"[\d.,]{1,30}\s{0,4}(?:[KMGT]i?B|bytes)?"
NUM = r"[\d,]+"
I = re.IGNORECASE  # noqa: E741 - short, as the flag tables below are wide

MESSAGES: tuple[Message, ...] = (
    # --- explicit vLLM memory messages -------------------------------------------------
    # CPU backend; vLLM 0.32 words it "Available memory on node N (...) on startup ...".
    _m(
        MEMORY,
        r"(?:Free memory on device(?: \S+)?|Available memory on node \d+) \((?P<free_gib>[\d.]+)/"
        r"(?P<total_gib>[\d.]+) GiB\) on startup is less than desired CPU memory utilization \((?P<util>[\d.]+), (?P<requested_gib>[\d.]+) GiB\)",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_LOAD,
        "cpu_memory_share_exceeds_free",
    ),
    _m(
        MEMORY,
        r"Free memory on device(?: \S+)? \((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) on startup is "
        r"less than desired (?:GPU|CPU|XPU)? ?memory utilization \((?P<util>[\d.]+), (?P<requested_gib>[\d.]+) GiB\)",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_LOAD,
        "free_memory_below_requested",
    ),
    _m(
        MEMORY,
        r"Externally held weights on device.{0,300}?exceed the desired GPU memory utilization",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_LOAD,
        "external_weights_exceed_budget",
    ),
    _m(
        MEMORY,
        r"Free memory on device.{0,300}?less than the engine's budget after excluding",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_LOAD,
        "free_memory_below_requested",
    ),
    _m(
        MEMORY,
        r"Error in memory profiling\. Initial free memory (?P<initial_free_gib>[\d.]+) GiB, "
        r"current free memory (?P<current_free_gib>[\d.]+) GiB",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_PROFILE,
        "other_process_changed_memory_during_profiling",
    ),
    # CPU backend: KV space requested beyond what the node has free.
    _m(
        MEMORY,
        r"Available memory on node \d+ \((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) on kv cache "
        r"allocation is less than requested memory for kv \((?P<requested_gib>[\d.]+) GiB\)",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_KV,
        "kv_space_exceeds_free_host_memory",
    ),
    _m(
        MEMORY,
        r"To serve at least one request with the models?'s max seq len \((?P<max_seq_len>\d+)\),? "
        r"\(?(?P<needed_gib>[\d.]+) (?:GiB|GB) KV cache is needed, which is larger than the available KV cache "
        r"memory \((?P<available_gib>[\d.]+) (?:GiB|GB)\)(?:\. Based on the available memory, the estimated "
        r"maximum model length is (?P<estimated_max_model_len>\d+))?",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "max_model_len_exceeds_kv_capacity",
    ),
    _m(
        MEMORY,
        r"The model's max seq len \((?P<max_seq_len>\d+)\) is larger than the maximum number of tokens "
        r"that can be stored in KV cache \((?P<kv_tokens>\d+)\)",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "max_model_len_exceeds_kv_capacity",
    ),
    _m(MEMORY, r"No available memory for the cache blocks", m.KV_CACHE_INSUFFICIENT, m.PHASE_KV, "no_cache_blocks"),
    _m(
        MEMORY,
        r"Cannot auto-fit max_model_len: not enough GPU memory",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "no_room_for_one_token",
    ),
    _m(
        MEMORY,
        r"The worker already uses (?P<worker_gib>[\d.]+) GiB .{0,300}?more than the (?P<requested_gib>[\d.]+) GiB "
        r"of CPU memory reserved",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "no_cache_blocks",
    ),
    _m(
        MEMORY,
        r"CUDA out of memory occurred when warming up (?:sampler|pooler).{0,200}? with (?P<dummy_requests>\d+) "
        r"dummy requests",
        m.PROFILING_OOM,
        m.PHASE_PROFILE,
        "sampler_warmup_oom",
    ),
    _m(MEMORY, r"Failed to load model - not enough GPU memory", m.WEIGHTS_LOAD_OOM, m.PHASE_LOAD, "weights_do_not_fit"),
    _m(
        MEMORY,
        r"Failed to create \w{1,40} (?:linear )?weights: .{0,300}?out of memory",
        m.WEIGHTS_LOAD_OOM,
        m.PHASE_LOAD,
        "weights_do_not_fit",
        I,
    ),
    # --- host RAM ------------------------------------------------------------------------
    _m(
        HOST,
        r"killed due to memory pressure \(OOM\)|exceeds the memory usage threshold.{0,400}?Ray killed",
        m.HOST_RAM_OOM,
        None,
        "ray_memory_monitor_killed_worker",
    ),
    _m(HOST, r"Aborted due to the lack of CPU swap space", m.HOST_RAM_OOM, m.PHASE_SERVING, "cpu_swap_exhausted"),
    _m(
        HOST,
        r"Memory cgroup out of memory|Out of memory: Killed process|oom-kill(?:er)?:|OOMKilled",
        m.HOST_RAM_OOM,
        None,
        "kernel_oom_killer",
    ),
    _m(
        HOST,
        r"DefaultCPUAllocator: can't allocate memory|std::bad_alloc|"
        r"^MemoryError\b",
        m.HOST_RAM_OOM,
        None,
        "host_allocation_failed",
    ),
    # ENOMEM from a system call (mmap, fork, ...); not from RDMA registration, where it means the
    # locked-memory limit.
    _m(
        HOST,
        r"^(?!.{0,300}(?:NCCL|ibv_|memlock)).{0,400}?Cannot allocate memory",
        m.HOST_RAM_OOM,
        None,
        "host_allocation_failed",
    ),
    # --- known failures that are not memory ----------------------------------------------
    _m(NOT_OOM, r"an illegal memory access was encountered", subtype="illegal_memory_access"),
    _m(
        NOT_OOM,
        r"Watchdog caught collective operation timeout|Some NCCL operations have failed or timed out|"
        r"NCCL (?:communicator|operation).{0,200}?timed? ?out",
        subtype="nccl_timeout",
    ),
    _m(
        NOT_OOM,
        r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size|"
        r"must be divisible by (?:tensor|pipeline) parallel size|\b\d{1,9} is not divisible by \d{1,9}|"
        r"is not divisible by group_size",
        subtype="parallel_size_does_not_divide_model",
    ),
    _m(NOT_OOM, r"Pipeline parallelism is not supported for this model", subtype="pipeline_parallel_unsupported"),
    _m(
        NOT_OOM,
        r"Quantization method specified in the model config \(\w+\) does not match|"
        r"Unknown quantization method|is not supported for quantization method|"
        r"The quantization method \S{1,60} is not supported for the current GPU",
        subtype="quantization_mismatch",
    ),
    _m(
        NOT_OOM,
        r"only supported on GPUs with compute capability|compute capability below [\d.]+ are not supported|"
        r"is not supported on (?:this|the current) GPU",
        subtype="unsupported_gpu_architecture",
    ),
    _m(
        NOT_OOM,
        r"Model architectures? \[[^\]]{0,300}\] (?:are|is) not supported|"
        r"Cannot find model module|not supported for now\. Supported architectures",
        subtype="unsupported_architecture",
    ),
    _m(NOT_OOM, r"Address already in use|EADDRINUSE", subtype="port_in_use"),
    _m(
        NOT_OOM,
        r"(?:creating|attaching to) shared memory segment|/dev/shm.{0,200}?(?:No space|failed|error)|"
        r"unable to (?:write to|allocate) shared memory|Bus error",
        subtype="shared_memory_dev_shm",
        flags=I,
    ),
    _m(NOT_OOM, r"No available shared memory broadcast block found", subtype="worker_hang_shm_broadcast"),
    _m(
        NOT_OOM,
        r"is too long and exceeds limit of|maximum context length is \d+ tokens|"
        r"is longer than the maximum model length|Please reduce the length of",
        subtype="prompt_too_long",
    ),
    _m(
        NOT_OOM,
        r"max_num_batched_tokens \(\d+\) is smaller than max_model_len|"
        r"must be greater than or equal to max_num_seqs|User-specified max_model_len \(\d+\) is greater than|"
        r"is greater than the derived max_model_len",
        subtype="configuration_error",
    ),
    _m(NOT_OOM, r"Workspace is locked but allocation", subtype="workspace_growth_after_lock"),
    _m(
        NOT_OOM,
        r"Repository Not Found|is not a valid model identifier|does not appear to have a file named "
        r"config\.json|Can't load the configuration of|HFValidationError|Invalid repository ID|"
        r"No such file or directory: .{0,300}?config\.json|(?:model|Model) path .{1,300}? does not exist|"
        r"Cannot connect to|We couldn't connect to",
        subtype="model_not_found",
    ),
    _m(
        NOT_OOM,
        r"CUDA driver version is insufficient|no CUDA-capable device is detected|"
        r"Failed to infer device type|NVIDIA driver on your system is too old|CUDA error: no kernel image",
        subtype="driver_or_device",
    ),
    # CUDA's own error names and strings, NCCL's and vLLM's CUDA checks: any error but out-of-memory.
    _m(
        NOT_OOM,
        r"CUDA error: (?!out of memory)[a-z][\w -]{3,80}|\bcudaError(?!MemoryAllocation)[A-Z]\w{2,60}|"
        r"Cuda failure '(?!out of memory)[^']{3,80}'|\bFailed: \S{1,200}:\d{1,6} '(?!out of memory)[^']{3,80}'|"
        r"device-side assert triggered",
        subtype="cuda_error",
    ),
    _m(
        NOT_OOM,
        r"cannot find -l\w{1,40}|collect2: error|ld returned \d+ exit status|"
        r"(?:InductorError|CompilationError|triton\.compiler\.errors)",
        subtype="compile_toolchain_error",
        needles=(
            "cannot find -l",
            "collect2: error",
            "ld returned",
            "InductorError",
            "CompilationError",
            "triton.compiler.errors",
        ),
    ),
    _m(
        NOT_OOM,
        r"NCCL error.{0,300}?(?:unhandled system error|remote process exited|invalid usage)|"
        r"ncclSystemError|ncclInternalError|ncclInvalidUsage",
        subtype="nccl_error",
    ),
    # --- NCCL failing for lack of GPU memory ---------------------------------------------------
    _m(
        NCCL_OOM,
        r"Cuda failure '?out of memory'?|ncclUnhandledCudaError.{0,300}?out of memory",
        m.MULTI_GPU_OOM,
        None,
        "nccl_cuda_oom",
        I,
    ),
    # --- generic GPU out-of-memory: torch 2.x, older torch, raw CUDA and HIP ---------------------
    _m(
        OOM,
        r"(?:CUDA|HIP|XPU) out of memory\.?(?: Tried to allocate (?P<tried_gib>" + SIZE + r"))?"
        r"(?:\. GPU (?P<oom_gpu>\d+) has a total capacity of (?P<gpu_total_gib>" + SIZE + r") of which "
        r"(?P<gpu_free_gib>" + SIZE + r") is free)?",
    ),
    _m(
        OOM,
        r"out of memory\. Tried to allocate (?P<tried_gib>" + SIZE + r") \(GPU (?P<oom_gpu>\d+); "
        r"(?P<gpu_total_gib>" + SIZE + r") total capacity; (?P<torch_allocated_gib>" + SIZE + r") already allocated; "
        r"(?P<gpu_free_gib>" + SIZE + r") free; (?P<reserved_gib>" + SIZE + r") reserved in total by PyTorch",
    ),
    _m(
        OOM,
        r"OutOfMemoryError|CUDA error: out of memory|CUDA out of\s*(?:\[\.\.\.\])?$|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
        r"RESOURCE_EXHAUSTED|out of memory \(HIP\)",
    ),
    # --- worker killed by the kernel (exit -9) ------------------------------------------------
    _m(
        KILLED,
        r"died unexpectedly \(exit code: -9\)|died, exit code: -9|Failed core proc\(s\): \{[^}]{0,200}-9|"
        r"died with exit code -9|exit code -9|signal 9\b|SIGKILL",
        m.HOST_RAM_OOM,
        None,
        "worker_sigkill",
    ),
    # --- where a failure happened (traceback frames, markers) ----------------------------------
    _m(
        FRAME,
        r"\bin (?:capture_model|_capture_cudagraphs|_warmup_and_capture|capture_end|capture_begin)\b|"
        r"torch\.cuda\.graph\(|cuda_graph\.capture_end|graph_capture|Capturing CUDA graphs?|"
        r"Capturing cudagraphs|\.capture_model\(|Registering \d+ cuda graph addresses",
        phase=m.PHASE_CAPTURE,
        needles=("capture", "Capturing", "cuda.graph("),
    ),
    _m(
        FRAME,
        r"\bin (?:profile_run|_dummy_sampler_run|_dummy_pooler_run|determine_available_memory|"
        r"determine_num_available_blocks|profile_memory|_profile_and_initialize_kv_caches)\b|"
        r"\.(?:profile_run|_dummy_sampler_run|determine_available_memory|"
        r"determine_num_available_blocks)\(",
        phase=m.PHASE_PROFILE,
        needles=("profile_", "_dummy_", "determine_"),
    ),
    # Frames on more than one phase's path: they place a failure only when no other frame does.
    # (V1's warm-up captures graphs and warms the sampler; its `_dummy_run` serves profiling and capture.)
    _m(
        FRAME,
        r"\bin compile_or_warm_up_model\b",
        phase=m.PHASE_CAPTURE,
        subtype=WEAK,
        needles=("compile_or_warm_up_model",),
    ),
    _m(FRAME, r"\bin _dummy_run\b|\._dummy_run\(", phase=m.PHASE_PROFILE, subtype=WEAK, needles=("_dummy_run",)),
    _m(
        FRAME,
        r"\bin (?:initialize_kv_cache|_allocate_kv_cache_tensors|allocate_kv_cache|_init_cache_engine|"
        r"_allocate_kv_cache|initialize_cache|init_kv_cache|reshape_kv_cache_tensors)\b",
        phase=m.PHASE_KV,
        needles=("kv_cache", "cache_engine", "initialize_cache"),
    ),
    _m(
        FRAME,
        r"\bin (?:load_model|get_model|load_weights|_init_model|initialize_model|make_layers|create_weights|"
        r"_initialize_model|load_state_dict|process_weights_after_loading)\b|Loading safetensors checkpoint shards|"
        r"\.(?:load_model|get_model|load_weights)\(|"
        r"Failed to create \w+ weights|"
        r"model_executor/(?:models|layers)/[^\"]{1,200}\", line \d{1,6}, in __init__",
        phase=m.PHASE_LOAD,
        needles=(
            "load_",
            "get_model",
            "_model",
            "make_layers",
            "create_weights",
            "load_state_dict",
            "process_weights",
            "Loading safetensors",
            "Failed to create",
            "in __init__",
        ),
    ),
    _m(
        FRAME,
        r"\bin (?:execute_model|run_busy_loop|_process_engine_step|step_with_batch_queue|"
        r"create_chat_completion|create_completion|generate|_run_workers_async|sample_tokens|step_async|engine_step|get_logprobs)\b|"
        r"Error in model execution|EngineDeadError|AsyncEngineDeadError|MQLLMEngine is already dead|"
        r"Engine loop has died|serving_chat\.py|serving_completion\.py|\.(?:run_busy_loop|execute_model)\(",
        phase=m.PHASE_SERVING,
        needles=(
            "execute_model",
            "busy_loop",
            "engine_step",
            "step_with_batch_queue",
            "create_chat_completion",
            "create_completion",
            "generate",
            "_run_workers",
            "sample_tokens",
            "step_async",
            "get_logprobs",
            "Error in model execution",
            "EngineDeadError",
            "MQLLMEngine",
            "Engine loop",
            "serving_",
        ),
    ),
    # --- startup milestones: the engine got this far --------------------------------------------
    _m(
        MILESTONE,
        r"Initializing an? (?:V1 )?LLM engine|Starting to load model|Loading model from|"
        r"Loading weights on",
        phase=m.PHASE_LOAD,
    ),
    _m(
        MILESTONE,
        r"Starting profile run for multi-modal models|Encoder cache will be initialized with a budget",
        phase=m.PHASE_PROFILE,
    ),
    _m(
        MILESTONE,
        r"Loading (?:model )?weights took (?P<weights_gib>[\d.]+) ?GB|"
        r"Model loading took (?P<weights_gib2>[\d.]+) ?GiB",
        phase=m.PHASE_PROFILE,
    ),
    _m(
        MILESTONE,
        r"Available KV cache memory: (?P<available_kv_gib>-?[\d.]+) GiB|"
        r"# (?:GPU|cuda|CPU) blocks: \d+|KV cache size: (?P<kv_cache_tokens>" + NUM + r") tokens|"
        r"Memory profiling takes",
        phase=m.PHASE_KV,
    ),
    _m(
        MILESTONE,
        r"Graph capturing finished in|init engine \(profile, create kv cache, warmup model\) took|"
        r"Application startup complete|Uvicorn running on|Avg prompt throughput|Starting vLLM API server",
        phase=m.PHASE_SERVING,
    ),
    # --- start-up figures that prove there is no room for the KV cache (decide on their own) ----
    _m(
        BUDGET,
        r"the rest of the memory reserved for KV Cache is (?P<kv_reserved_gib>-[\d.]+|0(?:\.0+)?) ?GiB",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "no_memory_left_for_kv_cache",
    ),
    _m(
        BUDGET,
        r"Available KV cache memory: (?P<available_kv_gib>-[\d.]+|0(?:\.0+)?) GiB",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "no_memory_left_for_kv_cache",
    ),
    _m(BUDGET, r"# (?:GPU|cuda) blocks: (?P<gpu_blocks>0)\b", m.KV_CACHE_INSUFFICIENT, m.PHASE_KV, "zero_gpu_blocks"),
    _m(
        BUDGET,
        r"Maximum concurrency for (?P<max_model_len>[\d,]{1,12}) tokens per request: "
        r"(?P<max_concurrency>0\.00)x",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "kv_cache_below_one_request",
    ),
    # --- figures worth keeping -------------------------------------------------------------
    _m(
        FIGURE,
        r"the current vLLM instance can use total_gpu_memory \((?P<total_gib>[\d.]+) ?GiB\) x "
        r"gpu_memory_utilization \((?P<util>[\d.]+)\) = (?P<requested_gib>[\d.]+) ?GiB",
    ),
    _m(FIGURE, r"model weights take (?P<weights_gib>[\d.]+) ?GiB"),
    _m(
        FIGURE,
        r"Initial free memory: (?P<initial_free_gib>[\d.]+) GiB; Requested memory: "
        r"(?P<util>[\d.]+) \(util\), (?P<requested_gib>[\d.]+) GiB",
    ),
    _m(FIGURE, r"worker init memory snapshot: .{0,80}?total_memory=(?P<total_gib>[\d.]+)GiB"),
    _m(
        FIGURE,
        r"Maximum concurrency for (?P<max_model_len>[\d,]{1,12}) tokens per request: "
        r"(?P<max_concurrency>[\d.]+)x",
    ),
    _m(
        FIGURE,
        r"Memory profiling results: total_gpu_memory=(?P<total_gib>[\d.]+)GiB "
        r"initial_memory_usage=(?P<initial_usage_gib>[\d.]+)GiB",
    ),
    _m(FIGURE, r"the rest of the memory reserved for KV Cache is (?P<kv_reserved_gib>-?[\d.]+) ?GiB"),
    _m(FIGURE, r"Initial free memory:? (?P<initial_free_gib>[\d.]+) GiB"),
    _m(
        FIGURE,
        r"(?P<others>(?:Process \d{1,10} has [\d.]{1,20} [GM]iB memory in use\. ?){1,64})",
        needles=("memory in use",),
    ),
    _m(FIGURE, r"Including non-PyTorch memory, this process has (?P<own_gib>" + SIZE + r") memory in use"),
    _m(
        FIGURE,
        r"Of the allocated memory (?P<torch_allocated_gib>" + SIZE + r") is allocated by PyTorch"
        r"(?:, with (?P<private_pools_gib>" + SIZE + r") allocated in private pools)?",
    ),
    _m(FIGURE, r"Explicitly set \((?P<requested_kv_gib>[\d.]+)/(?P<node_total_gib>[\d.]+)\) GiB for KV cache"),
    _m(
        FIGURE,
        r"(?:tensor_parallel_size|--tensor-parallel-size)[=\s](?P<tp>\d{1,4})",
        needles=("tensor_parallel_size", "tensor-parallel-size"),
    ),
    _m(
        FIGURE,
        r"(?:pipeline_parallel_size|--pipeline-parallel-size)[=\s](?P<pp>\d{1,4})",
        needles=("pipeline_parallel_size", "pipeline-parallel-size"),
    ),
)

# A generic wrapper never decides a cause; the root cause above it does.
WRAPPERS = re.compile(
    r"Engine core initialization failed|EngineDeadError|WorkerProc hit an exception|EngineCore failed to start|"
    r"EngineCore encountered a fatal error|Worker failed with error|please check the stack trace above|"
    r"Got fatal signal from worker processes"
)
