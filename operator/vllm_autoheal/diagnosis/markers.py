"""Where and how far the engine got: traceback frames that name a phase, start-up milestones,
the start-up figures that by themselves leave no room for a KV cache, and figures worth keeping.
They place a failure; they never name one. Standard library only."""

from __future__ import annotations

from . import model as m
from .pattern import (
    BUDGET,
    FIGURE,
    FRAME,
    GAP,
    MILESTONE,
    NUM,
    SIZE,
    SIZED_AFTER_CAPTURE,
    STARTING,
    WB,
    WEAK,
    WEB_SERVER,
    Message,
)
from .pattern import row as _m

# The class a notebook's traceback (IPython 8) names before a frame's function: `in Worker.load_model(self)`.
QUALIFIED = r"(?:[A-Za-z_]\w{0,79}\.){0,3}"

MARKERS: tuple[Message, ...] = (
    # --- where a failure happened (traceback frames, markers) ----------------------------------
    # A frame `in NAME`, or the RPC a worker was running when it failed: V0's "Exception in worker
    # ... while processing method NAME" and Ray's "Error executing method NAME".
    _m(
        FRAME,
        # (V1 measures graphs' memory by capturing some, after the profiling run: profile_cudagraph_memory)
        r"i"
        + WB
        + r"n '?"
        + QUALIFIED
        + r"(?:capture_model|_capture_cudagraphs|_warmup_and_capture|capture_end|capture_begin|"
        r"_?profile_cudagraph_memory)\b|"
        r"m" + WB + r"ethod '?(?:capture_model|_capture_cudagraphs|_warmup_and_capture|capture_end|capture_begin)\b|"
        r"torch\.cuda\.graph\(|cuda_graph\.capture_end|graph_capture|Capturing CUDA graphs?|"
        r"Capturing cudagraphs|\.capture_model\(|Registering \d+ cuda graph addresses|Profiling CUDA graph memory|"
        r"\.profile_cudagraph_memory\(",
        phase=m.PHASE_CAPTURE,
        needles=(
            "capture",
            "Capturing",
            "cuda.graph(",
            "cudagraph_memory",
            "CUDA graph memory",
            "cuda graph addresses",
        ),
    ),
    _m(
        FRAME,
        # (profile_num_available_blocks: vLLM 0.1 and 0.2. The kernel warm-ups run the model and the sampler on
        # a dummy batch at start-up, through execute_model and sample_tokens: kernel_warmup, and the V2
        # runner's warmup_kernels, vllm/v1/worker/gpu/warmup.py)
        r"i"
        + WB
        + r"n '?"
        + QUALIFIED
        + r"(?:profile_run|_dummy_sampler_run|_dummy_pooler_run|determine_available_memory|"
        r"determine_num_available_blocks|profile_num_available_blocks|profile_memory|_profile_and_initialize_kv_caches|"
        r"_?warmup_kernels|kernel_warmup)\b|"
        r"m" + WB + r"ethod '?(?:profile_run|_dummy_sampler_run|_dummy_pooler_run|determine_available_memory|"
        r"determine_num_available_blocks|profile_num_available_blocks|profile_memory|_profile_and_initialize_kv_caches)\b|"
        r"\.(?:profile_run|_dummy_sampler_run|determine_available_memory|"
        r"determine_num_available_blocks)\(",
        phase=m.PHASE_PROFILE,
        needles=("profile_", "_dummy_", "determine_", "warmup_kernels", "kernel_warmup"),
    ),
    # Frames on more than one phase's path: they place a failure only when no other frame does.
    # (V1's warm-up captures graphs and warms the sampler; its `_dummy_run` serves profiling and capture.)
    _m(
        FRAME,
        r"i" + WB + r"n " + QUALIFIED + r"compile_or_warm_up_model\b",
        phase=m.PHASE_CAPTURE,
        subtype=WEAK,
        needles=("compile_or_warm_up_model",),
    ),
    _m(
        FRAME,
        r"i" + WB + r"n " + QUALIFIED + r"_dummy_run\b|\._dummy_run\(",
        phase=m.PHASE_PROFILE,
        subtype=WEAK,
        needles=("_dummy_run",),
    ),
    _m(
        FRAME,
        # (init_cache_engine and CacheEngine.allocate_gpu_cache: V0 up to 0.4; extend_kv_cache and
        # ensure_kv_cache_blocks: 0.34's extensible KV cache committing device memory to its blocks)
        r"i"
        + WB
        + r"n '?"
        + QUALIFIED
        + r"(?:initialize_kv_cache(?:_tensors)?|_allocate_kv_cache_tensors|allocate_kv_cache|_?init_cache_engine|"
        r"_allocate_kv_cache|initialize_cache|init_kv_cache|reshape_kv_cache_tensors|allocate_gpu_cache|"
        r"extend_kv_cache|ensure_kv_cache_blocks)\b|"
        r"m" + WB + r"ethod '?(?:initialize_kv_cache|_allocate_kv_cache_tensors|allocate_kv_cache|_?init_cache_engine|"
        r"_allocate_kv_cache|initialize_cache|init_kv_cache|reshape_kv_cache_tensors|allocate_gpu_cache)\b",
        phase=m.PHASE_KV,
        needles=("kv_cache", "cache_engine", "initialize_cache", "allocate_gpu_cache"),
    ),
    _m(
        FRAME,
        r"i"
        + WB
        + r"n '?"
        + QUALIFIED
        + r"(?:load_model|get_model|load_weights|_init_model|initialize_model|make_layers|create_weights|"
        r"_initialize_model|load_state_dict|process_weights_after_loading)\b|"
        r"m"
        + WB
        + r"ethod '?(?:load_model|get_model|load_weights|_init_model|initialize_model|make_layers|create_weights|"
        r"_initialize_model|load_state_dict|process_weights_after_loading)\b|Loading safetensors checkpoint shards|"
        r"\.(?:load_model|get_model|load_weights)\(|"
        r"Failed to create \w+ weights|"
        r"model_executor/(?:models|layers)/(?:[^\"]{1,200}\", line \d{1,6},|\S{1,200}?\.py(?::\d{1,6},)?) in "
        + QUALIFIED
        + r"__init__",
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
            "model_executor/",
        ),
    ),
    _m(
        FRAME,
        r"i" + WB + r"n '?" + QUALIFIED + r"(?:execute_model|run_busy_loop|_process_engine_step|step_with_batch_queue|"
        r"create_chat_completion|create_completion|generate|_run_workers_async|sample_tokens|step_async|engine_step|get_logprobs)\b|"
        r"m" + WB + r"ethod '?(?:execute_model|run_busy_loop|_process_engine_step|step_with_batch_queue|"
        r"create_chat_completion|create_completion|generate|_run_workers_async|sample_tokens|step_async|engine_step|get_logprobs)\b|"
        r"Error in model execution|EngineDeadError|AsyncEngineDeadError|MQLLMEngine is already dead|"
        r"Engine loop has died|serving_chat\.py|serving_completion\.py|\.(?:run_busy_loop|execute_model)\(|"
        # V0's background loop runs only once the engine is up: its failure is a serving failure
        r"_log_task_completion|Engine background task failed|"
        # V1's busy loop failing (at start-up the wrapper is "EngineCore failed to start")
        r"EngineCore encountered a fatal error|AsyncLLM output_handler failed",
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
            "_log_task_completion",
            "background task",
            "encountered a fatal error",
            "output_handler failed",
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
        # (the pools before "KV cache size": "GPU" or the device type, " + host" under HiSparse: 0.33 on)
        r"# (?:GPU|cuda|CPU) blocks: \d+|(?:\b[A-Z]{2,4}(?: \+ host)? )?KV cache size: (?P<kv_cache_tokens>"
        + NUM
        + r") tokens|"
        r"Memory profiling takes",
        phase=m.PHASE_KV,
    ),
    # vLLM 0.34's extensible KV cache is sized after warm-up and graph capture (extensible_kv_cache.py
    # measure_kv_cache_blocks): what follows commits its blocks. Its "Available KV cache memory" before
    # then is the cache's address space, not its size: the blocks that fit are (the smallest decides).
    # (Read where the engine's message opens, as it logs it: a line repeating the words costs one try.)
    _m(
        MILESTONE,
        r"^Memory after warmup: (?:.{0,200}?\((?P<warmup_peak_gib>[\d.]{1,12}) GiB allocated at peak, )?.{0,400}?; "
        r"(?P<gpu_blocks>\d{1,12}) KV cache blocks \((?P<available_kv_gib>[\d.]+) GiB\) "
        r"fit within the requested (?P<requested_gib>[\d.]+) GiB",
        phase=m.PHASE_KV,
        subtype=SIZED_AFTER_CAPTURE,
        needles=("Memory after warmup: ",),
    ),
    # V0's capture_model announces itself (0.2.5-0.6: "Capturing the model for CUDA graphs. This may lead to
    # unexpected consequences ..."): what fails after it and before "Graph capturing finished" fails capturing.
    # (A milestone, not a frame: a frame counts where it is printed after the failure too.)
    _m(MILESTONE, r"Capturing the model for CUDA graphs", phase=m.PHASE_CAPTURE),
    _m(
        MILESTONE,
        r"Graph capturing finished in|init engine \(profile, create kv cache, warmup model\) took|"
        r"Avg prompt throughput|Starting vLLM API server",
        phase=m.PHASE_SERVING,
    ),
    # uvicorn's start-up words: vLLM's API server starts uvicorn once the engine is up, but any other
    # web server in the stream (a router, a proxy, a frontend started next to vLLM) prints the same
    # words whenever it starts: they count only where vLLM wrote them (phase.py, writers.vllms_own)
    _m(MILESTONE, r"Application startup complete|Uvicorn running on", phase=m.PHASE_SERVING, subtype=WEB_SERVER),
    # A line that only says lines were left out (a pasted excerpt): the milestones before it are
    # a lower bound of how far the engine got, not where it failed.
    _m(GAP, r"^\s*(?:\[\s*(?:\.{3,}|…)\s*\]|\.{3,}|…)\s*$", needles=("...", "…")),
    # --- the engine failed while starting: V1's start-up wrappers, and the frames of the
    # constructors every version starts the engine through (never on a serving path) --------------
    _m(
        STARTING,
        r"EngineCore failed to start|Engine core initialization failed|Engine process failed to start|"
        r"i"
        + WB
        + r"n "
        + QUALIFIED
        + r"(?:build_async_engine_client\w{0,40}|from_engine_args|from_vllm_config|_init_executor)\b",
        needles=("failed to start", "initialization failed", "build_async_engine_client", "from_", "_init_executor"),
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
    # (vLLM 0.1 printed the count unclamped: a negative one is the budget overdrawn)
    _m(BUDGET, r"# (?:GPU|cuda) blocks: (?:0|-\d{1,12})\b", m.KV_CACHE_INSUFFICIENT, m.PHASE_KV, "zero_gpu_blocks"),
    _m(
        BUDGET,
        r"^Memory after warmup: .{0,400}?; 0 KV cache blocks \(",
        m.KV_CACHE_INSUFFICIENT,
        m.PHASE_KV,
        "zero_gpu_blocks",
        needles=("Memory after warmup: ",),
    ),
    # (below 1x, one request of max_model_len does not fit: vLLM's own arithmetic, blocks x block
    # size over max_model_len, whatever the error that follows, or its absence in a cut log)
    _m(
        BUDGET,
        r"Maximum concurrency for (?P<max_model_len>[\d,]{1,12}) tokens per request: "
        r"(?P<max_concurrency>0\.\d{1,4})x",
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
    # The release the engine says it is (the engine's first line, the API server's banner), from the
    # line's start, as the engine's own words open it (placement.py). A dev, rc or vendor build
    # ("0.11.1rc2", "+dc1a3e10.nv25.05", "+rocm641") names none: its figures may be any release's.
    _m(
        FIGURE,
        r"^(?:Initializing an? (?:V[01] )?LLM engine \(v|vLLM API server version |[\u2580-\u2588 ]{8,60}version )"
        r"0\.(?P<vllm_minor>\d{1,3})\."
        r"(?P<vllm_patch>\d{1,3})(?:\.\d{1,3}|\.post\d{1,3})?(?:\+cu\d{2,3})?(?![\w.+])",
        needles=("Initializing a", "API server version", "\u2588  version"),
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
    # The CUDA graphs' share a release reserves inside the budget (gpu_worker determine_available_memory,
    # from 0.20): the V1 runner's estimate, and the utilization it equals without the graphs (every runner
    # that reserves them). Read where the engine's message opens.
    _m(FIGURE, r"^Estimated CUDA graph memory: (?P<graphs_gib>[\d.]{1,12}) GiB total"),
    _m(
        FIGURE,
        r"^CUDA graph memory profiling is enabled .{0,60}?The current --gpu-memory-utilization="
        r"(?P<util_with_graphs>[\d.]{1,12}) is equivalent to --gpu-memory-utilization=(?P<util_without_graphs>[\d.]{1,12}) "
        r"without CUDA graph memory profiling",
        needles=("CUDA graph memory profiling is enabled",),
    ),
    _m(FIGURE, r"Initial free memory:? (?P<initial_free_gib>[\d.]+) GiB"),
    # The KV cache's size fixed by --kv-cache-memory-bytes (or 0.32's persisted startup plan, which sets it):
    # "This does not respect the gpu_memory_utilization config" (gpu_worker determine_available_memory).
    _m(FIGURE, r"reserved (?P<kv_fixed_gib>[\d.]{1,12}) GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
    _m(
        FIGURE,
        # (X{1,64} written X X{0,63}: the regex then starts with the literal "Process ")
        r"(?P<others>Process \d{1,10} has [\d.]{1,20} [GM]iB memory in use\. ?"
        r"(?:Process \d{1,10} has [\d.]{1,20} [GM]iB memory in use\. ?){0,63})",
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
