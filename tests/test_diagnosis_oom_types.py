"""Two libraries raise an `OutOfMemoryError`: torch for the GPU, Ray's memory monitor for host RAM.
The class's module tells them apart (`torch.OutOfMemoryError`, `ray.exceptions.OutOfMemoryError`);
a notebook's traceback header prints the bare name, so where Ray runs the workers and the message
is cut, the log does not say which memory ran out: `unknown`, and no memory setting changes."""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import Signals, classify

RAY = "INFO 01-01 10:00:00 [ray_utils.py:120] Connecting to existing Ray cluster at address: 10.0.0.1:6379\n"


NOTEBOOK = """INFO 01-01 10:00:01 [model_runner.py:1015] Starting to load model meta-llama/Llama-2-13b-hf...
---------------------------------------------------------------------------
OutOfMemoryError                          Traceback (most recent call last)
Cell In[3], line 1
----> 1 llm = LLM(model="meta-llama/Llama-2-13b-hf", tensor_parallel_size=4)
File /usr/lib/python3.10/site-packages/vllm/model_executor/model_loader/loader.py:300, in DefaultModelLoader.load_model(self)
    299 with torch.device(self.device_config.device):
--> 300     model = _initialize_model(vllm_config=vllm_config)
"""


TORCH_END = "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 15.77 GiB of which 120.00 MiB is free.\n"


RAY_END = "OutOfMemoryError: Task was killed due to the node running low on memory.\n"


RAY_SIGNS = [
    RAY,
    "(RayWorkerWrapper pid=4645) INFO 01-01 10:00:00 [worker.py:1] Loading weights\n",
    "INFO 01-01 10:00:00 [llm_engine.py:100] Initializing an LLM engine with config: distributed_executor_backend='ray'\n",
    "(raylet) A worker died or was killed while executing a task by an unexpected system error.\n",
]


@pytest.mark.parametrize("sign", RAY_SIGNS)
def test_a_bare_oom_header_under_ray_with_its_message_cut_changes_nothing(sign):
    d = classify(Signals(log=sign + NOTEBOOK))
    assert (d.cause, d.subtype) == ("unknown", "oom_of_torch_or_ray")
    assert not d.is_memory


def test_without_ray_the_bare_header_is_torchs():
    d = classify(Signals(log=NOTEBOOK))
    assert d.cause == "weights_load_oom"


@pytest.mark.parametrize(("end", "cause"), [(TORCH_END, "weights_load_oom"), (RAY_END, "host_ram_oom")])
def test_the_message_tells_them_apart_under_ray(end, cause):
    assert classify(Signals(log=RAY + NOTEBOOK + end)).cause == cause


@pytest.mark.parametrize(
    "message",
    [
        "Task was killed due to the node running low on memory.",
        # a message the memory monitor's rows do not know: Ray raises this type only from that monitor
        "Memory on the node (IP: 10.0.0.1, ID: 7f3a) where the task (task ID: 9c1e) was running was 60.2GB / 62.0GB",
        "",
    ],
)
def test_rays_own_out_of_memory_error_is_host_memory_whatever_its_message(message):
    line = "ray.exceptions.OutOfMemoryError" + (f": {message}" if message else "")
    d = classify(Signals(log=RAY + line + "\n"))
    assert d.cause == "host_ram_oom"


def test_torchs_error_by_its_module_is_gpu_memory_under_ray():
    log = RAY + NOTEBOOK.replace("OutOfMemoryError   ", "torch.OutOfMemoryError")
    assert classify(Signals(log=log)).cause == "weights_load_oom"


def test_a_prompt_naming_ray_does_not_make_a_torch_oom_ambiguous():
    """Ray's signs count only on the engine's own lines: a request's echo is the client's text."""
    echo = (
        "INFO 01-01 10:00:00 [logger.py:39] Received request chatcmpl-1: prompt: "
        "'(RayWorkerWrapper pid=1) Started a local Ray instance ray.exceptions.', params: SamplingParams(n=1)\n"
    )
    assert classify(Signals(log=echo + NOTEBOOK)).cause == "weights_load_oom"


def test_a_ray_workers_bare_named_torch_oom_with_its_message_stays_a_gpu_oom():
    w = "(RayWorkerWrapper pid=1234, ip=10.0.0.2) ERROR 12-01 10:00:05 [worker_base.py:620] "
    log = (
        "INFO 12-01 10:00:00 [ray_distributed_executor.py:100] Using Ray for the workers\n"
        + w
        + "Error executing method 'determine_available_memory'. This might cause deadlock in distributed execution.\n"
        + w
        + "Traceback (most recent call last):\n"
        + w
        + '  File "/usr/local/lib/python3.12/dist-packages/vllm/worker/worker_base.py", line 612, in execute_method\n'
        + w
        + "    return run_method(self, method, args, kwargs)\n"
        + w
        + "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB "
        "of which 1.10 GiB is free.\n"
    )
    assert classify(Signals(log=log)).cause == "profiling_oom"
