"""The failures that are not memory, as vLLM, PyTorch, NCCL, the CUDA runtime, the kernel, the shell
and the stacks that run vLLM report them (illegal access, NCCL errors, crashes, configuration and
start-up errors), and the wrappers that quote another failure. A row here decides only when
no memory failure is named (classify.py); rows in CONSEQUENCES there never outvote one named
elsewhere. messages.py puts these rows in its table, in this order. Standard library only.
"""

from __future__ import annotations

from .pattern import JOB_REPORT, NOT_OOM, WB, I, Message
from .pattern import row as _m

# Every wording of a failed allocation (the OOM row's, and rocBLAS's ambiguous memory_error): a
# wrapper quoting none of them quotes another failure.
ALLOCATION_FAILED = (
    r"[Oo]ut of memory|OutOfMemory|OUT_OF_(?:DEVICE_)?MEMORY|allocate memory|ENOMEM|RESOURCE_EXHAUSTED|"
    r"ALLOC(?:ATION)?_FAILED|AllocFailed|MemoryAllocation|memory_error|bad_alloc|not enough memory|"
    r"MemoryError|[Uu]nable to allocate|[Ff]ailed to allocate|[Aa]llocation failed|"  # (numpy's, Gaudi's)
    # a need set against what is left (vLLM 0.34's frontend decoding reserve and HiSparse host pool: "but
    # only 2.00 GiB is available", AMD's W4A16 cache: "Not enough room in the ... budget")
    r"\bonly [\d.]{1,12} ?[KMGT]i?B\b.{0,40}?\b(?:available|free)\b|[Nn]ot enough room in"
)

# A generic wrapper's words (WRAPPERS, below, says why).
WRAPPER_WORDS = (
    r"Engine core initialization failed|EngineDeadError|WorkerProc hit an exception|EngineCore failed to start|"
    r"EngineCore encountered a fatal error|Worker failed with error|please check the stack trace above|"
    r"Got fatal signal from worker processes|[Rr]oot cause|[Ss]ee (?:the )?stack ?trace|"
    r"The actor died|ExceptionGroup: |"  # (Ray's ActorDiedError/RayActorError, with or without its type)
    # the other end of a pipe or socket went away: the process that died there holds the failure
    # (a bare EOFError: pickle's `EOFError: Ran out of input` on a cut checkpoint is a failure of its own)
    r"^(?:[\w.]{1,80}\.)?(?:EOFError\s*$|BrokenPipeError\b|ConnectionResetError\b)|"
    # NCCL names the CUDA call's failure on its "Last error:" line ('out of memory' or another)
    r"unhandled cuda error"
)


def _quoting(opening: str, needle: str, subtype: str, then: str, wrappers: bool = True) -> Message:
    """A wrapper that quotes the failure's message from the line's start (`opening`, a regex): a
    message with no wording of a failed allocation (nor a generic wrapper's words) is another failure."""
    excluded = ALLOCATION_FAILED + (f"|{WRAPPER_WORDS}" if wrappers else "")
    return _m(NOT_OOM, rf"^{opening}(?!.{{0,300}}(?:{excluded})){then}", subtype=subtype, needles=(needle,))


NOT_MEMORY: tuple[Message, ...] = (
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
        # (V0's CPU swap space running out is the engine's memory failure too: cpu_swap_exhausted)
        r"find the original error: (?!.{0,80}(?:OutOfMemory|out of memory|swap space))[\w.]{1,80}(?:Error|Exception)\(",
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
        r"Signal 11 \(SIGSEGV\) received by PID|died, exit code: -11\b|" + JOB_REPORT + r"Segmentation fault\b",
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
        r"died, exit code: -6\b|" + JOB_REPORT + r"Aborted\b",
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
            "OutOfResources",
        ),
    ),
    _m(
        NOT_OOM,
        r"NCCL error(?:(?!NCCL error).){0,300}?(?:unhandled system error|remote process exited|invalid usage)|"
        r"ncclSystemError|ncclInternalError|ncclInvalidUsage|NCCL WARN",
        subtype="nccl_error",
    ),
)
