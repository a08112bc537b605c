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
from .not_memory import ALLOCATION_FAILED, NOT_MEMORY, WRAPPER_WORDS
from .pattern import (  # noqa: F401 - the kinds are read as messages.KIND by the classifier
    BUDGET,
    FIGURE,
    FRAME,
    GAP,
    HOST,
    JOB_REPORT,
    KILLED,
    MEMORY,
    MILESTONE,
    NCCL_OOM,
    NOT_OOM,
    OOM,
    SIZE,
    SIZED_AFTER_CAPTURE,
    STARTING,
    SYSTEMD_UNIT,
    WB,
    WEAK,
    WEB_SERVER,
    I,
    Message,
)
from .pattern import row as _m

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
    # The model's own weights, held by an external loader (vLLM 0.32's IPC weight cache), take more than the
    # utilization's share: "(held/total GiB) ... (utilization, share GiB). Increase GPU memory utilization".
    # The weights do not fit what vLLM may use; they are on the GPU already, so a larger share, where the
    # GPU has one, holds them and the cache (remedy/plan.py SUBTYPE_PLANS; a smaller one only makes it worse).
    _m(
        MEMORY,
        r"Externally held weights on device(?: \S+)?(?: \((?P<external_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\))?"
        r".{0,300}?exceed the desired GPU memory utilization(?: \((?P<util>[\d.]+), (?P<requested_gib>[\d.]+) GiB\))?",
        m.WEIGHTS_LOAD_OOM,
        m.PHASE_LOAD,
        "external_weights_exceed_budget",
    ),
    # ... and the budget left beside them is more than is free: "(free/total GiB) ... (utilization, the
    # engine's budget GiB)"; the weights held outside are utilization x total less that budget.
    _m(
        MEMORY,
        r"Free memory on device(?: \S+)?(?: \((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\))?.{0,300}?"
        r"less than the engine's budget after excluding(?: external process's weights "
        r"\((?P<util>[\d.]+), (?P<engine_budget_gib>[\d.]+) GiB\))?",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_LOAD,
        "free_memory_below_engine_budget",
    ),
    _m(
        MEMORY,
        r"Error in memory profiling\.(?: Initial free memory (?P<initial_free_gib>[\d.]+) GiB, "
        r"current free memory (?P<current_free_gib>[\d.]+) GiB)?",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_PROFILE,
        "other_process_changed_memory_during_profiling",
    ),
    # CPU backend: KV space requested beyond what the node has free, explicitly ("for kv (40.0 GiB)")
    # or as the worker's budget less what it already uses ("for kv (98.5/115.66 GiB)", vLLM 0.32).
    _m(
        MEMORY,
        r"Available memory on node \d+ \((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) on kv cache "
        r"allocation is less than requested memory for kv \((?P<requested_gib>[\d.]+)(?:/(?P<worker_budget_gib>[\d.]+))? GiB\)",
        m.GPU_UTIL_EXCEEDS_FREE,
        m.PHASE_KV,
        "kv_space_exceeds_free_host_memory",
    ),
    # ... the same check when the worker already uses its whole budget: nothing is left for the KV cache.
    _m(
        MEMORY,
        r"on kv cache allocation is less than requested memory for kv \((?:-[\d.]+|0(?:\.0+)?)/[\d.]+ GiB\)",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "no_cache_blocks",
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
    # 0.32's frontend multimodal (video) decoding takes its GPU memory out of the KV cache's budget
    # (multimodal/gpu_ipc_memory.py): more than the whole budget leaves the cache none.
    _m(
        MEMORY,
        r"frontend multimodal GPU decoding reserves (?P<mm_reserved_gib>[\d.]{1,12}) GiB.{0,300}?but only "
        r"(?P<available_kv_gib>-?[\d.]{1,12}) GiB is available for the KV cache",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "mm_decoding_reserves_kv_budget",
    ),
    # A Mamba or linear-attention hybrid keeps one state block per running sequence, from the same cache
    # pool: vLLM (since PR #38270, 2026) refuses to capture graphs for more sequences than it has blocks.
    _m(
        MEMORY,
        r"max_num_seqs \((?P<max_num_seqs>\d+)\) exceeds available Mamba cache blocks \((?P<mamba_blocks>\d+)\)",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "state_blocks_below_max_num_seqs",
    ),
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
    # (0.34's standalone CPU runner words it "Out of memory while warming up the pooler": cpu/pooling_runner.py)
    _m(
        MEMORY,
        r"(?:CUDA out of memory occurred when warming up|Out of memory while warming up the) (?:sampler|pooler)"
        r".{0,200}? with (?P<dummy_requests>\d+) dummy requests",
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
        r"the node running low on memory|ray-oom-prevention|"  # the link only the memory monitor prints
        # (Ray raises its own OutOfMemoryError only from its memory monitor, whatever the message)
        r"ray\.exceptions\.OutOfMemoryError",
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
        r"^Reason: {1,40}OOMKilled\b|" + SYSTEMD_UNIT + r"(?:service|scope): "
        # (journalctl puts its "Jun 05 10:00:00 host systemd[1]: " first; systemd 252 words it "The kernel ...")
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
    # vLLM 0.34 pre-faulting its CPU offload buffer (v1/simple_kv_offload/host_buffer.py): whatever the errno
    # (EFAULT where a hugetlb pool runs dry), its own words say the memory or hugetlb limit is too small.
    _m(
        HOST,
        r"Cannot populate [\d.]{1,12} GiB of [\w ]{1,40} pages: .{0,200}?The container's memory or hugetlb "
        r"limit is too small",
        m.HOST_RAM_OOM,
        None,
        "host_pages_unavailable",
        needles=("memory or hugetlb limit",),
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
    *NOT_MEMORY,
    # --- NCCL failing for lack of GPU memory ---------------------------------------------------
    _m(
        NCCL_OOM,
        # (Not NCCL's "Failed to CUDA calloc N bytes": it follows any failed allocation, an OOM or not,
        # and without NCCL_DEBUG it is all `Last error:` keeps.)
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
        r"(?<!ray\.exceptions\.)OutOfMemoryError|CUDA [Ee]rror: out of memory|HIP [Ee]rror: out of memory|CUDA driver [Ee]rror: out of memory|"
        r"Triton Error \[(?:CUDA|HIP)\]: out of memory|"  # Triton's wording of the driver's CUDA_ERROR_OUT_OF_MEMORY
        r"CUDA out of\s*(?:\[\.\.\.\])?$|"
        r"cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|"
        # (the CUDA and ROCm math libraries report a failed device allocation as a status of their own)
        r"(?:CU|HIP)(?:BLAS|DNN|SPARSE|SOLVER)_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED|CURAND_STATUS_ALLOCATION_FAILED|"
        # (not rocBLAS's rocblas_status_memory_error: "failed internal memory allocation, copy or
        # dealloc", and what a kernel launch's hipErrorLaunchOutOfResources becomes)
        r"miopenStatusAllocFailed|RESOURCE_EXHAUSTED|out of memory \(HIP\)|"
        # (vLLM 0.34's driver calls for its extensible KV cache: vmm_driver.py, the driver's own string)
        r"GPU driver error \d{1,4}: out of memory|"
        r"MODULE:PT_DEVMEM Allocation failed",  # Gaudi's device memory (HabanaAI's vLLM fork)
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
            "PT_DEVMEM Allocation failed",
            "GPU driver error ",
        ),
    ),
    # --- worker killed by the kernel (exit -9) ------------------------------------------------
    _m(
        KILLED,
        r"died unexpectedly \(exit code: -9\)|died, exit code: -9|Failed core proc\(s\): \{[^}]{0,200}-9|"
        # (not Ray's list of what may have ended a worker: "(1) ... killed by SIGKILL by OOM killer ...")
        r"died with exit code -9|exit code -9|signal 9\b|SIGKILL(?! by OOM killer due to)|exitcode\s{0,4}: -9\b|"
        r"^Killed$|" + JOB_REPORT + r"Killed\b|exited with code 137\b|" + SYSTEMD_UNIT + r"service: "
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
# Signs that Ray runs the workers (its executor, its actors' prefixes, its own exceptions and
# daemons). Ray's memory monitor raises an OutOfMemoryError too: where Ray runs them, the class's
# bare name (a notebook's traceback header, with its message cut) does not tell torch's from Ray's.
RAY_RUNS_WORKERS = re.compile(
    r"\(Ray\w{0,40} pid=|\(raylet\)|ray\.exceptions\.|/ray/_private/|Ray\w{0,20}Executor|ray_\w{0,20}executor|"
    r"distributed_executor_backend=.?ray\b|Started a local Ray instance|Connected to Ray cluster|Ray cluster"
)
# The class's name alone, without torch's module and without torch's message after it.
BARE_OOM_TYPE = "OutOfMemoryError"
# Any wording of a failed allocation: an exception that names one is not known to be "not memory",
# even where no row places it (an NPU's or a library's own words for it).
ALLOCATION = re.compile(ALLOCATION_FAILED)
