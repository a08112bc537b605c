"""vLLM 0.34's extensible KV cache (on by default where the driver can map memory): the cache is sized after
warm-up and CUDA-graph capture (v1/worker/extensible_kv_cache.py measure_kv_cache_blocks), so its
"Available KV cache memory" line is the cache's address space, not its size; the "Memory after warmup" line
says how many blocks fit, and the blocks are committed to device memory next (extend_kv_cache), through
driver calls whose failure reads "GPU driver error N: out of memory" (utils/vmm_driver.py). The logs below
are written with the format strings of those files and of v1/core/kv_cache_planning.py."""

from __future__ import annotations

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.remedy import Inventory, plan_heal
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

E = "(EngineCore pid=77) "
ERR = E + "ERROR 12-04 10:01:10 [core.py:1100] "
HINT = (
    "The KV cache gets what is left after the model, its activations, CUDA graphs and warmup within "
    "`gpu_memory_utilization`=0.9; increase it (with the extensible KV cache it defaults to 1.0) or decrease "
    "`max_model_len` or `max_num_seqs`. CUDA graphs take less with fewer or smaller capture sizes in the "
    "compilation config."
)


def start(blocks: int, kv_gib: float) -> str:
    """Llama-3.1-8B on an H100 at 0.9 under 0.34: the address space (55.10 GiB) printed before warm-up,
    then what fits after it."""
    return "\n".join(
        (
            E + "INFO 12-04 10:00:05 [core.py:121] Initializing a V1 LLM engine (v0.34.0) with config: "
            "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072",
            E + "INFO 12-04 10:00:40 [model_runner.py:428] Model loading took 14.99 GiB memory and 30.1 seconds",
            E + "INFO 12-04 10:00:52 [gpu_worker.py:795] Available KV cache memory: 55.10 GiB",
            E + "INFO 12-04 10:01:10 [extensible_kv_cache.py:693] Memory after warmup: 12.60 GiB free, 1.00 GiB "
            "committed to the KV cache, 1.72 GiB kept for transient activations (1.72 GiB allocated at peak, "
            f"0.30 GiB of torch reservation growth); {blocks} KV cache blocks ({kv_gib:.2f} GiB) fit within the "
            "requested 71.27 GiB. Torch may reserve up to 3.50 GiB.",
        )
    )


def plan(log: str):
    d = classify(Signals(log=log, exit_code=1))
    spec = VLLMServiceSpec(model="m", image="vllm/vllm-openai:v0.34.0", engine={"gpuMemoryUtilization": 0.9})
    inv = Inventory(
        gpu_total_gib=79.19,
        gpu_name="NVIDIA-H100-80GB-HBM3",
        shape=config_shape("llama-3.1-8b"),
        release=parse_version("0.34.0"),
    )
    return d, plan_heal(spec, d, inventory=inv)


def test_no_block_after_warmup_is_sized_from_what_fit_not_from_the_address_space():
    """'0 KV cache blocks (0.00 GiB) fit' and 'No available memory for the cache blocks': the budget is
    0. Read as the 55.10 GiB of address space, the heal had cut max_model_len to 127,136 on a cache with no
    block: a certain second crash. Now the raise the empty budget calls for."""
    log = start(0, 0.0) + "\n" + ERR + "ValueError: No available memory for the cache blocks. " + HINT
    d, remedy = plan(log)
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "no_cache_blocks")
    assert d.numbers["available_kv_gib"] == 0.0 and d.numbers["gpu_blocks"] == 0
    assert remedy.action == "RaiseGpuMemoryUtilization", remedy.summary()


def test_no_block_after_warmup_decides_without_the_error():
    """The figures alone say there is no room for the KV cache, as '# GPU blocks: 0' does."""
    d = classify(Signals(log=start(0, 0.0)))
    assert (d.cause, d.subtype, d.phase) == ("kv_cache_insufficient", "zero_gpu_blocks", "kv-allocation")


def test_the_blocks_that_fit_are_the_budget():
    log = (
        start(5120, 10.0) + "\n" + ERR + "ValueError: To serve at least one request with the model's max seq len "
        "(131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (10.00 GiB). "
        "Based on the available memory, the estimated maximum model length is 81904. " + HINT + " Decreasing "
        "`max_model_len` also reduces what is needed. See https://docs.vllm.ai/en/latest/configuration/"
        "conserving_memory/ for more details."
    )
    d, remedy = plan(log)
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "max_model_len_exceeds_kv_capacity")
    assert (d.numbers["available_kv_gib"], d.numbers["requested_gib"]) == (10.0, 71.27)
    assert remedy.changes.get("max_model_len", 81904) <= 81904, remedy.summary()


def test_a_driver_out_of_memory_while_committing_the_blocks_is_memory_that_vanished():
    """The blocks are committed after the measurement: memory another process took in between."""
    frames = (
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 1009, in extend_kv_cache',
        "    extend_kv_cache(self.model_runner, self._kv_cache_config, num_blocks)",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/utils/vmm_driver.py", line 191, in _check',
        '    raise RuntimeError(f"GPU driver error {result}: {self.error_string(result)}")',
        "RuntimeError: GPU driver error 2: out of memory",
    )
    log = start(5120, 10.0) + "\n" + "\n".join(ERR + line for line in frames)
    d, remedy = plan(log)
    assert (d.cause, d.phase) == ("gpu_util_exceeds_free", "kv-allocation")
    assert remedy.action == "LowerGpuMemoryUtilization", remedy.summary()
    # (with no frame, the milestone says the same: graphs captured, the cache committed next)
    bare = start(5120, 10.0) + "\n" + ERR + "RuntimeError: GPU driver error 2: out of memory"
    assert classify(Signals(log=bare)).phase == "kv-allocation"


def test_a_request_quoting_the_driver_error_decides_nothing():
    """The new wording is a failure only where the engine wrote it."""
    client = (
        "(APIServer pid=1) INFO 12-04 10:05:00 [logger.py:41] Received request chatcmpl-1: prompt: "
        "'RuntimeError: GPU driver error 2: out of memory', params: SamplingParams(n=1)"
    )
    d = classify(Signals(log=start(5120, 10.0) + "\n" + client))
    assert d.cause not in ("gpu_util_exceeds_free", "cudagraph_capture_oom", "runtime_oom", "not_oom")


# --- a third review (of ea40d59)


def test_driver_oom_committing_the_blocks_after_the_kv_size_line_is_kv_allocation():
    """Severity: medium.
    Input: a vLLM 0.34 start as its sources order it: 'Memory after warmup: ...; 5120 KV cache blocks (10.0
    GiB) fit within the requested 71.27 GiB' (worker, measure_kv_cache_blocks), then 'GPU KV cache size:
    163,840 tokens, Maximum concurrency for 32,768 tokens per request: 5.00x' (engine core,
    finalize_extensible_kv_cache -> update_kv_cache_capacity, which runs BEFORE model_executor.extend_kv_cache
    in core.py _initialize_kv_caches), then 'RuntimeError: GPU driver error 2: out of memory' with no frame
    (the case the commit's own test covers, minus the line vLLM always prints in between).
    8e9f687: phase.py's SIZED_AFTER_CAPTURE rule only looks at the LAST milestone; the KV-size line is a
    plain KV milestone, mapped to 'after KV sizing comes graph capture': cudagraph_capture_oom, phase
    graph-capture (the capture heal: EnforceEager / room for graphs, for graphs that were already captured).
    What should happen: gpu_util_exceeds_free in kv-allocation, as without the KV-size line."""
    kv_size = (
        E + "INFO 12-04 10:01:11 [kv_cache_utils.py:1169] GPU KV cache size: 163,840 tokens, "
        "Maximum concurrency for 32,768 tokens per request: 5.00x"
    )
    log = start(5120, 10.0) + "\n" + kv_size + "\n" + ERR + "RuntimeError: GPU driver error 2: out of memory"
    d = classify(Signals(log=log))
    assert (d.cause, d.phase) == ("gpu_util_exceeds_free", "kv-allocation"), (d.cause, d.phase)


# --- a review of cc0ee8b


def test_a_raise_is_held_to_the_margin_of_the_warm_up_peak_vllm_printed():
    """Severity: medium.
    Input: Llama-3.1-8B, 0.34 on an H100 at 0.94, max_model_len 131072: 'Memory after warmup: 62.19 GiB free,
    0.00 GiB committed to the KV cache, 6.00 GiB kept for transient activations (6.00 GiB allocated at peak,
    ...); ... (51.70 GiB) fit within the requested 74.44 GiB', then 52.70 GiB needed > 51.70 available.
    measure_kv_cache_bytes caps the cache at what is free after warm-up less max(1 GiB, 0.75 x the peak)
    less what it keeps: 62.19 - 4.50 - 6.00 = 51.69, the cache it had: the free memory binds, not the
    budget, and a higher utilization buys nothing. cc0ee8b sized the margin from the memory model's
    activation and graph estimate (1.86 GiB, margin 1.40): RaiseGpuMemoryUtilization 0.97, the same 51.70
    GiB, the same crash. What should: the margin of the larger, printed peak: no raise; the context that
    fits (vLLM's estimate)."""
    hint = HINT.replace("`gpu_memory_utilization`=0.9;", "`gpu_memory_utilization`=0.94;")
    log = "\n".join(
        (
            E + "INFO 12-04 10:00:05 [core.py:121] Initializing a V1 LLM engine (v0.34.0) with config: "
            "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072",
            E + "INFO 12-04 10:00:40 [model_runner.py:428] Model loading took 14.99 GiB memory and 30.1 seconds",
            E + "INFO 12-04 10:00:52 [gpu_worker.py:795] Available KV cache memory: 57.10 GiB",
            E + "INFO 12-04 10:01:10 [extensible_kv_cache.py:693] Memory after warmup: 62.19 GiB free, 0.00 GiB "
            "committed to the KV cache, 6.00 GiB kept for transient activations (6.00 GiB allocated at peak, "
            "0.30 GiB of torch reservation growth); 105881 KV cache blocks (51.70 GiB) fit within the "
            "requested 74.44 GiB. Torch may reserve up to 9.50 GiB.",
            ERR + "ValueError: To serve at least one request with the model's max seq len (131072), (52.70 GiB KV "
            "cache is needed, which is larger than the available KV cache memory (51.70 GiB). Based on the "
            "available memory, the estimated maximum model length is 128576. " + hint + " Decreasing "
            "`max_model_len` also reduces what is needed.",
        )
    )
    d = classify(Signals(log=log, exit_code=1))
    spec = VLLMServiceSpec(
        model="m",
        image="vllm/vllm-openai:v0.34.0",
        engine={"gpuMemoryUtilization": 0.94, "maxModelLen": 131072},
        heal={"bounds": {"maxGpuMemoryUtilization": 0.99}},
    )
    inv = Inventory(
        gpu_total_gib=79.19,
        gpu_name="NVIDIA-H100-80GB-HBM3",
        shape=config_shape("llama-3.1-8b"),
        release=parse_version("0.34.0"),
    )
    remedy = plan_heal(spec, d, inventory=inv)
    assert d.numbers.get("warmup_peak_gib") == 6.0, d.numbers
    assert "gpu_memory_utilization" not in remedy.changes, remedy.summary()
    assert remedy.action == "LowerMaxModelLen" and remedy.changes["max_model_len"] <= 128576, remedy.summary()
