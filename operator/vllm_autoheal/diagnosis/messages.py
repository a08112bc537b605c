"""Every vLLM/PyTorch/NCCL failure message the classifier keys on, old and new wordings side by
side; the markers that place a failure are in markers.py, and MESSAGES is both, in order of
strength.

Sources: vLLM 0.33.0's own strings and the older forms (V0 and early V1) as real logs in the
corpus (tests/corpus/) print them. Named groups carry the numbers; a group
ending in `_gib` holds a size (with its unit, or GiB when the message has none).
Standard library only.
"""

from __future__ import annotations

import re

from . import model as m
from .markers import MARKERS
from .pattern import (  # noqa: F401 - the kinds are read as messages.KIND by the classifier
    BUDGET,
    FIGURE,
    FRAME,
    GAP,
    HOST,
    KILLED,
    MEMORY,
    MILESTONE,
    NCCL_OOM,
    NOT_OOM,
    OOM,
    SIZE,
    STARTING,
    WB,
    WEAK,
    I,
    Message,
)
from .pattern import row as _m

# Every wording of a failed allocation (the OOM row's, and rocBLAS's ambiguous memory_error): a
# wrapper quoting none of them quotes another failure.
ALLOCATION_FAILED = (
    r"[Oo]ut of memory|OutOfMemory|OUT_OF_(?:DEVICE_)?MEMORY|allocate memory|ENOMEM|RESOURCE_EXHAUSTED|"
    r"ALLOC(?:ATION)?_FAILED|AllocFailed|MemoryAllocation|memory_error|bad_alloc|not enough memory|"
    r"MemoryError|[Uu]nable to allocate|[Ff]ailed to allocate|[Aa]llocation failed"  # (numpy's, Gaudi's)
)

# A generic wrapper's words (WRAPPERS, below, says why).
WRAPPER_WORDS = (
    r"Engine core initialization failed|EngineDeadError|WorkerProc hit an exception|EngineCore failed to start|"
    r"EngineCore encountered a fatal error|Worker failed with error|please check the stack trace above|"
    r"Got fatal signal from worker processes|[Rr]oot cause|[Ss]ee (?:the )?stack ?trace|"
    r"The actor died|ExceptionGroup: |"  # (Ray's ActorDiedError/RayActorError, with or without its type)
    # the other end of a pipe or socket went away: the process that died there holds the failure
    r"^(?:[\w.]{1,80}\.)?(?:EOFError|BrokenPipeError|ConnectionResetError)\b"
)


def _quoting(opening: str, needle: str, subtype: str, then: str, wrappers: bool = True) -> Message:
    """A wrapper that quotes the failure's message from the line's start (`opening`, a regex): a
    message with no wording of a failed allocation (nor a generic wrapper's words) is another failure."""
    excluded = ALLOCATION_FAILED + (f"|{WRAPPER_WORDS}" if wrappers else "")
    return _m(NOT_OOM, rf"^{opening}(?!.{{0,300}}(?:{excluded})){then}", subtype=subtype, needles=(needle,))


FAILURES: tuple[Message, ...] = (
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
        r"Error in memory profiling\.(?: Initial free memory (?P<initial_free_gib>[\d.]+) GiB, "
        r"current free memory (?P<current_free_gib>[\d.]+) GiB)?",
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
        r"that can be stored in KV cache(?: \((?P<kv_tokens>\d+)\))?",
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
        r"killed due to memory pressure \(OOM\)|exceeds the memory usage threshold(?:(?!exceeds the memory).){0,400}?Ray killed|"
        r"the node running low on memory|ray-oom-prevention",  # the link only the memory monitor prints
        m.HOST_RAM_OOM,
        None,
        "ray_memory_monitor_killed_worker",
    ),
    _m(HOST, r"Aborted due to the lack of CPU swap space", m.HOST_RAM_OOM, m.PHASE_SERVING, "cpu_swap_exhausted"),
    _m(
        HOST,
        r"Memory cgroup out of memory|Out of memory: Killed process|oom-kill(?:er)?:|OOMKilled|"
        # as kubectl describe, systemd and Slurm report the kernel's OOM kill (from the line's start:
        # the `name: ` that opens them is theirs, placement.REPORTER, not an exception type's)
        r"^Reason: {1,40}OOMKilled\b|"
        # (journalctl puts its "Jun 05 10:00:00 host systemd[1]: " first; systemd 252 words it "The kernel ...")
        r"^(?:\w{3} [ \d]\d \d\d:\d\d:\d\d \S{1,100} systemd\[\d{1,10}\]: )?[\w@.:-]{1,200}\.(?:service|scope): "
        r"(?:A process of this unit has been killed by the OOM killer|The kernel OOM killer killed some processes|"
        r"Failed with result 'oom-kill')|"
        r"^slurmstepd(?:-[\w.-]{1,100})?: error: Detected \d{1,9} oom[-_]kill event",
        m.HOST_RAM_OOM,
        None,
        "kernel_oom_killer",
        needles=(
            "Memory cgroup out of memory",
            "Out of memory: Killed process",
            "oom-kill",
            "OOMKilled",
            "OOM killer",
            "oom_kill event",
        ),
    ),
    _m(
        HOST,
        r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)|std::bad_alloc|"
        r"_ArrayMemoryError: Unable to allocate|"  # numpy's
        r"M(?<=^M)emoryError\b",  # ^MemoryError, starting with a literal (see WB)
        m.HOST_RAM_OOM,
        None,
        "host_allocation_failed",
        needles=("DefaultCPUAllocator:", "std::bad_alloc", "MemoryError"),  # (MemoryError: numpy's too)
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
    # CUDA's illegal access, and ROCm's (the HSA runtime's memory access fault).
    _m(
        NOT_OOM,
        r"an illegal memory access was encountered|Memory access fault by GPU node|"
        r"HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION",
        subtype="illegal_memory_access",
    ),
    # The command line refused by argparse ("vllm serve: error: unrecognized arguments: ...").
    _m(
        NOT_OOM,
        r"^[\w./-]{1,80}(?: \w{1,30})?: error: (?:unrecognized arguments|argument |the following arguments)",
        subtype="invalid_arguments",
        needles=(": error: ",),
    ),
    # The engine-dead error a request gets names the engine's own error: another type than OOM.
    _m(
        NOT_OOM,
        r"find the original error: (?!.{0,80}(?:OutOfMemory|out of memory))[\w.]{1,80}(?:Error|Exception)\(",
        subtype="engine_died_of_other_error",
        needles=("find the original error",),
    ),
    # V1's executor quotes the failed worker's exception message ("Worker failed with error '<str(e)>',
    # please check the stack trace above"): a message that is not an out-of-memory one is another failure.
    # Only a message that ends on the same line: str(e) may go on over more lines (torch's NCCL error
    # names the CUDA failure, 'out of memory', on its last), and its first line alone tells nothing.
    # Any wording of a failed allocation (the OOM row's, and rocBLAS's ambiguous memory_error) is let be.
    # (anchored where the executor writes it, an exception's message: a line repeating the needle
    # would otherwise cost a lookahead at every occurrence; its own closing words are a wrapper's)
    _quoting(
        r"(?:[\w.]{1,80}: ){0,2}Worker failed with error '(?!')",
        "Worker failed with error '",
        "worker_failed_of_other_error",
        then=r"(?=.{0,2000}', please check the stack trace)",
        wrappers=False,
    ),
    # KServe's model server logs what stopped it as "Failed to start model server: <str(e)>": a message
    # that is neither an out-of-memory one nor a wrapper's is another failure (an engine's memory
    # message there is read by its own row, which decides before any non-memory one).
    _quoting(
        "Failed to start model server: ", "Failed to start model server: ", "model_server_failed_of_other_error", r"\S"
    ),
    # Triton's Python backend (its vLLM backend) reports an exception its model's initialize() raised
    # as "Failed to initialize Python stub: <Type>: <message>" (from where its glog header ends).
    _quoting(
        '"?Failed to initialize Python stub: ',
        "Failed to initialize Python stub: ",
        "triton_stub_failed_of_other_error",
        r"[A-Za-z_][\w.]{0,80}: ",
    ),
    # A crash of the process itself (CPython's fatal-error banner, faulthandler, the shell, glog): a
    # bug, never a shortage, except CPython's own "Cannot recover from MemoryErrors".
    _m(
        NOT_OOM,
        r"Fatal Python error: (?!Cannot recover from MemoryError|Aborted)|"
        # the shell's report of SIGSEGV, absl's and tvm_ffi's (FlashInfer's) signal handlers
        r"Segmentation fault \(core dumped\)|\*\*\* SIGSEGV received|Caught signal 11 \(Segmentation fault|"
        r"!!!!!!! Segfault encountered !!!!!!!|"
        # torch elastic's and V0's reports of a process ended by SIGSEGV, and the shell's job report
        r"Signal 11 \(SIGSEGV\) received by PID|died, exit code: -11\b|"
        r"^(?:\S{1,200}: )?line \d{1,7}: {1,8}\d{1,10} Segmentation fault\b",
        subtype="process_crash",
        needles=(
            "Fatal Python error: ",
            "Segmentation fault",
            "*** SIGSEGV received",
            "Caught signal 11",
            "Segfault encountered",
            "received by PID",
            "died, exit code: -",
        ),
    ),
    # SIGABRT: a C++ terminate or an assert, and what NCCL's watchdog does to the other ranks when one
    # died (a consequence: classify.CONSEQUENCES). A CUDA OOM there prints its what() first.
    _m(
        NOT_OOM,
        r"Fatal Python error: Aborted|Aborted \(core dumped\)|Signal 6 \(SIGABRT\) received by PID|"
        r"died, exit code: -6\b|^(?:\S{1,200}: )?line \d{1,7}: {1,8}\d{1,10} Aborted\b",
        subtype="process_abort",
        needles=("Fatal Python error: Aborted", "Aborted", "received by PID", "died, exit code: -"),
    ),
    _m(
        NOT_OOM,
        r"Watchdog caught collective operation timeout|Some NCCL operations have failed or timed out|"
        r"NCCL (?:communicator|operation)(?:(?!NCCL ).){0,200}?timed? ?out",
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
        r"is not supported on (?:this|the current) GPU|not supported in this architecture|"
        # PyTorch's own check of a GPU newer than its build (torch/cuda/__init__.py)
        # (\s+ keeps "CUDA capability", an anchor, the longest literal: the row's needle)
        r"with CUDA capability sm_\d{2,3}a? is not compatible\s+with\s+the\s+current\s+PyTorch installation",
        subtype="unsupported_gpu_architecture",
    ),
    _m(
        NOT_OOM,
        r"Model architectures? \[[^\]]{0,300}\] (?:are|is) not supported|"
        r"Cannot find model module|not supported for now\. Supported architectures",
        subtype="unsupported_architecture",
    ),
    _m(
        NOT_OOM,
        r"Address already in use|address already in use|EADDRINUSE|\[Errno 98\]",
        subtype="port_in_use",
        needles=("ddress already in use", "EADDRINUSE", "[Errno 98]"),
    ),
    _m(
        NOT_OOM,
        r"(?:creating|attaching to) shared memory segment|/dev/shm(?:(?!/dev/shm).){0,200}?(?:No space|failed|error)|"
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
        r"No such file or directory: (?:(?!No such file).){0,300}?config\.json|"
        r"model path .{1,300}? does not exist|Model path .{1,300}? does not exist|"
        r"Cannot connect to|We couldn't connect to",
        subtype="model_not_found",
    ),
    _m(
        NOT_OOM,
        r"CUDA driver version is insufficient|no CUDA-capable device is detected|"
        r"Failed to infer device type|NVIDIA driver on your system is too old|CUDA error: no kernel image|"
        r"Unexpected error from cudaGetDeviceCount",
        subtype="driver_or_device",
    ),
    # CUDA's own error names and strings, NCCL's and vLLM's CUDA checks: any error but out-of-memory.
    _m(
        NOT_OOM,
        # (every alternative starts with a literal: see WB)
        r"CUDA [Ee]rror: (?!out of memory)[a-z][\w -]{3,80}|HIP [Ee]rror: (?!out of memory)[a-z][\w -]{3,80}|"
        r"CUDA driver [Ee]rror: (?!out of memory)[a-z][\w -]{3,80}|"
        r"c" + WB + r"udaError(?!MemoryAllocation)[A-Z]\w{2,60}|h" + WB + r"ipError(?!OutOfMemory)[A-Z]\w{2,60}|"
        r"Cuda failure (?:\d{1,4} )?'(?!out of memory)[^']{3,80}'|"
        r"F" + WB + r"ailed: (?:Cuda error )?\S{1,200}:\d{1,6} '(?!out of memory)[^']{3,80}'|"
        # the CUDACHECK macro's print (vLLM's custom all-reduce, NCCL's tests): "Cuda error <file>:<line> '<error>'"
        r"C" + WB + r"uda error \S{1,200}:\d{1,6} '(?!out of memory)[^']{3,80}'|"
        r"device-side assert triggered|"
        # the kernel's own assert print (CUDA: "block: [..], thread: [..] Assertion `x` failed."; HIP)
        r"Device-side assertion `|thread: \[\d{1,6},\d{1,6},\d{1,6}\] Assertion `",
        subtype="cuda_error",
        needles=(
            "rror:",
            "cudaError",
            "hipError",
            "Cuda failure",
            "Failed:",
            "Cuda error ",
            "device-side assert triggered",
            "Device-side assertion `",
            "] Assertion `",
        ),
    ),
    _m(
        NOT_OOM,
        r"cannot find -l\w{1,40}|collect2: error|ld returned \d+ exit status|"
        r"InductorError|CompilationError|triton\.compiler\.errors|"
        # a kernel asking for more on-chip shared memory than the GPU has: a kernel config, not VRAM
        r"OutOfResources: out of resource",
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
        r"NCCL error(?:(?!NCCL error).){0,300}?(?:unhandled system error|remote process exited|invalid usage)|"
        r"ncclSystemError|ncclInternalError|ncclInvalidUsage|NCCL WARN",
        subtype="nccl_error",
    ),
    # --- NCCL failing for lack of GPU memory ---------------------------------------------------
    _m(
        NCCL_OOM,
        r"Cuda failure (?:\d{1,4} )?'?out of memory'?|ncclUnhandledCudaError(?:(?!ncclUnhandled).){0,300}?out of memory",
        m.MULTI_GPU_OOM,
        None,
        "nccl_cuda_oom",
        I,
    ),
    # --- generic GPU out-of-memory: torch 2.x, older torch, raw CUDA and HIP ---------------------
    _m(
        OOM,
        r"(?:CUDA|HIP|XPU|NPU) out of memory\.?(?: Tried to allocate (?P<tried_gib>" + SIZE + r"))?"
        # ("capacty": torch 2.0 and 2.1 printed it so)
        r"(?:\. GPU (?P<oom_gpu>\d+) has a total capac(?:i)?ty of (?P<gpu_total_gib>" + SIZE + r") of which "
        r"(?P<gpu_free_gib>" + SIZE + r") is free)?",
    ),
    _m(
        OOM,
        # (torch before 2.2; torch_npu adds "current active", IPEX's XPU leaves "free" out)
        r"out of memory\. Tried to allocate (?P<tried_gib>" + SIZE + r") \((?:GPU|NPU|XPU) (?P<oom_gpu>\d+); "
        r"(?P<gpu_total_gib>" + SIZE + r") total capacity; (?P<torch_allocated_gib>" + SIZE + r") already allocated; "
        r"(?:" + SIZE + r" current active; )?(?:(?P<gpu_free_gib>" + SIZE + r") free; )?"
        r"(?P<reserved_gib>" + SIZE + r") reserved in total by PyTorch",
    ),
    _m(
        OOM,
        # The runtime's own "out of memory" as torch, the driver API, vLLM's cumem allocator and ROCm
        # word it (cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY / hipErrorOutOfMemory).
        r"OutOfMemoryError|CUDA [Ee]rror: out of memory|HIP [Ee]rror: out of memory|CUDA driver [Ee]rror: out of memory|"
        r"Triton Error \[(?:CUDA|HIP)\]: out of memory|"  # Triton's wording of the driver's CUDA_ERROR_OUT_OF_MEMORY
        r"CUDA out of\s*(?:\[\.\.\.\])?$|"
        r"cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|"
        # (the CUDA and ROCm math libraries report a failed device allocation as a status of their own)
        r"(?:CU|HIP)(?:BLAS|DNN|SPARSE|SOLVER)_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED|CURAND_STATUS_ALLOCATION_FAILED|"
        # (not rocBLAS's rocblas_status_memory_error: "failed internal memory allocation, copy or
        # dealloc", and what a kernel launch's hipErrorLaunchOutOfResources becomes)
        r"miopenStatusAllocFailed|RESOURCE_EXHAUSTED|out of memory \(HIP\)",
        needles=(
            "OutOfMemoryError",
            "rror: out of memory",
            "]: out of memory",
            "CUDA out of",
            "cudaErrorMemoryAllocation",
            "CUDA_ERROR_OUT_OF_MEMORY",
            "hipErrorOutOfMemory",
            "UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
            "_STATUS_ALLOC_FAILED",
            "CUFFT_ALLOC_FAILED",
            "CURAND_STATUS_ALLOCATION_FAILED",
            "miopenStatusAllocFailed",
            "RESOURCE_EXHAUSTED",
            "out of memory (HIP)",
        ),
    ),
    # --- worker killed by the kernel (exit -9) ------------------------------------------------
    _m(
        KILLED,
        r"died unexpectedly \(exit code: -9\)|died, exit code: -9|Failed core proc\(s\): \{[^}]{0,200}-9|"
        # (not Ray's list of what may have ended a worker: "(1) ... killed by SIGKILL by OOM killer ...")
        r"died with exit code -9|exit code -9|signal 9\b|SIGKILL(?! by OOM killer due to)|exitcode\s{0,4}: -9\b|"
        r"^Killed$|^(?:\S{1,200}: )?line \d{1,7}: {1,8}\d{1,10} Killed\b|exited with code 137\b|"
        r"^(?:\w{3} [ \d]\d \d\d:\d\d:\d\d \S{1,100} systemd\[\d{1,10}\]: )?[\w@.:-]{1,200}\.service: "
        r"Main process exited, code=killed, status=9/KILL|"  # systemd
        r"is killed by signal: Killed\b",  # torch's report of a DataLoader worker
        m.HOST_RAM_OOM,
        None,
        "worker_sigkill",
    ),
)

MESSAGES: tuple[Message, ...] = FAILURES + MARKERS

# A generic wrapper never decides a cause; the root cause above it does. Besides vLLM's named
# wrappers, any exception that sends the reader elsewhere for its cause is one ("See root cause
# above", "See stack trace for root cause": V0's engine process, V1's WorkerProc and frontend),
# and so is Ray's news that an actor died, which only lists what may have killed it, an
# exception group (anyio, starlette), whose sub-exceptions are printed under it, and a pipe or
# socket whose other end died (the engine's IPC when a worker was killed).
WRAPPERS = re.compile(WRAPPER_WORDS)
