"""How vLLM and the libraries under it report a failure, version by version, from their source
(tests/fixtures/census/).

Helpers that never saw the classifier read the source and wrote each message as a log would show
it, with what the code says it means (`expected`). None of it comes from the corpus, so this is
how the classifier does on versions and stacks it was not tuned on.
- vLLM's own messages (`vllm-messages.jsonl`): 0.1.0, 0.2, 0.6.1, 0.8.4, 0.11, a main snapshot,
  the installed 0.32, and vllm-ascend and the CPU, XPU, TPU and HPU workers. Every start-up memory
  check, memory figure and phase a failure can happen in.
- The libraries under it (`library-messages.jsonl`): torch's allocator from 1.x to 2.9 (CUDA,
  ROCm, NPU, XPU), NCCL 2.18 to 2.30, the kernel's OOM killer, Ray's memory monitor, Kubernetes,
  Python, and their look-alikes. Each is put inside a vLLM traceback of a known phase.

Where the project decided otherwise on purpose, `DESIGNED` says what it answers and why. `LIMITS`
are known misses, kept as strict expected failures. Every other entry must get the helper's
answer. An `ambiguous` entry (the message alone cannot tell two causes apart) must not be given a
memory cause unless DESIGNED says which and why.
"""

from __future__ import annotations

import json

import pytest

from vllm_autoheal.diagnosis import Signals, classify

from conftest import FIXTURES

CENSUS = [
    json.loads(line)
    for name in ("vllm-messages.jsonl", "library-messages.jsonl")
    for line in (FIXTURES / "census" / name).read_text().splitlines()
]

# id -> (the cause the classifier gives, why the project chose it over the census' reading)
WRAPPER = "a wrapper whose root cause is not in the log says nothing of memory either way: unknown, no change"
NO_FAILURE = "no failure is in the log (an INFO or WARNING line alone): unknown, nothing to heal"
REQUEST_REFUSED = "one request refused with an error answer (HTTP 400): the server goes on, nothing to heal"
JSON_BODY = "a JSON response body decides nothing, not even not-memory: it may quote the client"
DESIGNED: dict[str, tuple[str, str]] = {
    "v0.8.4-v0-engine-process-failed-wrapper": ("unknown", WRAPPER),
    "v0.11-engine-core-init-failed-wrapper": ("unknown", WRAPPER),
    "v0.32-engine-core-init-failed-wrapper": ("unknown", WRAPPER),
    "v0.32-engine-dead-wrapper": ("unknown", WRAPPER),
    "v0.32-kv-cache-memory-bytes-info": ("unknown", NO_FAILURE),
    "v0.32-cudagraph-profiling-util-note": ("unknown", NO_FAILURE),
    "v0.32-cpu-block-size-warning": ("unknown", NO_FAILURE),
    # A JSON object on a line of its own (here the 400's error body the server answered with) is no line of
    # the engine's text formatter: its fields may hold a client's text, so it decides nothing (origin.py)
    "v0.2-openai-context-length": ("unknown", JSON_BODY),
    "v0.32-decoder-prompt-too-long": ("unknown", JSON_BODY),
    "v0.32-max-context-length-request": ("unknown", JSON_BODY),
    # Since 0.11 the assertion fires when free memory went UP during profiling (another process
    # released memory): no shortage, and no memory flag fixes it.
    "v0.11-memory-profiling-assert": ("not_oom", "free memory rose during profiling: no shortage"),
    "v0.32-memory-profiling-assert": ("not_oom", "free memory rose during profiling: no shortage"),
    # An OOM while allocating the KV cache that profiling just sized: memory went elsewhere between
    # the two steps, which is what gpu_util_exceeds_free heals (a lower utilization).
    "v0.11-kv-cache-alloc-oom": ("gpu_util_exceeds_free", "memory vanished between profiling and allocation"),
    "v0.32-kv-cache-alloc-oom": ("gpu_util_exceeds_free", "memory vanished between profiling and allocation"),
    # A worker killed by SIGKILL is the kernel's OOM killer unless something stronger says otherwise.
    "v0.32-worker-died-sigkill": ("host_ram_oom", "SIGKILL of a worker: the OOM killer's signature"),
    # On the CPU backend vLLM's budget is host memory sized by --gpu-memory-utilization (or the KV
    # space): the heal is that flag, which gpu_util_exceeds_free's plan changes; host_ram_oom's
    # plan (a larger container limit) would not help, as vLLM measures the node's free memory.
    "v0.32-cpu-startup-memory-below-utilization": ("gpu_util_exceeds_free", "the CPU share is the flag to lower"),
    # vLLM 0.32's further messages (December 2026 round): warnings and one request's refusals.
    "v0.32.0-auto-fit-max-model-len-reduced-info": ("unknown", NO_FAILURE),
    "v0.32.0-cgroup-memory-preflight-low": ("unknown", NO_FAILURE),
    "v0.32.0-cudagraph-profiling-disabled-warning": ("unknown", NO_FAILURE),
    "v0.32.0-rocm-free-memory-grew-during-profiling": ("unknown", NO_FAILURE),
    "v0.32.0-v2-mixed-warmup-skipped-few-kv-blocks": ("unknown", NO_FAILURE),
    "v0.32.0-rocm-aiter-mla-kv-layer-over-2gib": ("unknown", NO_FAILURE),
    "v0.32.0-mamba-ssd-warmup-failed": ("unknown", NO_FAILURE),
    "v0.32.0-kv-padding-layers-waste": ("unknown", NO_FAILURE),
    "v0.32.0-hybrid-kv-manager-disabled-warning": ("unknown", NO_FAILURE),
    "v0.32.0-safetensors-prefetch-exceeds-ram": ("unknown", NO_FAILURE),
    "v0.32.0-pinned-memory-unavailable-uva-fallback": ("unknown", NO_FAILURE),
    "v0.32.0-kv-offload-host-register-failed": ("unknown", NO_FAILURE),
    "v0.32.0-reset-prefix-cache-blocks-in-use": ("unknown", NO_FAILURE),
    "v0.32.0-batched-tokens-exceed-seqs-times-len-warning": ("unknown", NO_FAILURE),
    "v0.32.0-mm-item-exceeds-encoder-cache-request": ("unknown", REQUEST_REFUSED),
    "v0.32.0-mm-gpu-decode-exceeds-ipc-pool": ("unknown", REQUEST_REFUSED),
    "v0.32.0-audio-decode-memory-limit": ("unknown", REQUEST_REFUSED),
    "v0.32.0-sleep-memory-increased-assert": (
        "unknown",
        "a failed /sleep call, returned to its caller: the server goes on",
    ),
    # The corpus' convention (tests/corpus/README.md): a too-small /dev/shm is a container setting, not RAM
    # running out; no memory flag and no larger memory limit fixes it.
    "v0.32.0-dev-shm-insufficient-space": ("not_oom", "/dev/shm too small: a container setting"),
    "v0.32-cpu-explicit-kv-exceeds-available": ("gpu_util_exceeds_free", "the KV space is the flag to lower"),
    "v0.32-cpu-auto-kv-exceeds-available": ("gpu_util_exceeds_free", "the CPU share is the flag to lower"),
    # vLLM compares --swap-space with the host's total RAM, not the container's limit: no heal the
    # operator has (a larger limit) changes that, so it is not called a memory failure to heal.
    "v0.6.1-swap-space-too-large": ("not_oom", "a start-up check of a flag against host RAM: no heal fits"),
    # --- the libraries' messages
    "shell-killed-exit-137-no-kernel-evidence": ("host_ram_oom", "SIGKILL: the OOM killer's signature"),
    # Another process holding 38.5 GiB of a GPU the weights would fit alone is the cause to heal.
    "torch2.2-2.4-oom-two-processes-weights": ("gpu_util_exceeds_free", "the weights fit the GPU alone"),
    # ENOMEM is what the kernel says when host memory (or the container's limit) is short; an
    # address-space or map-count limit says it too, but far less often in a container.
    "safetensors-mmap-enomem-os-error-12": ("host_ram_oom", "ENOMEM: host memory, as for fork and malloc"),
    # One client's 89 GiB video failed in the API server's handler: a request's error, logged, not a
    # crash of the deployment; raising its memory for one request would be wrong.
    "numpy-arraymemoryerror-video-decode-apiserver": ("unknown", "a request's own error changes nothing"),
    # NCCL warns "Failed to CUDA calloc N bytes" after any failed allocation (alloc.h: the pointer
    # stayed null), an OOM or cuMem's "operation not supported"; without NCCL_DEBUG it is all torch's
    # `Last error:` keeps, so it names no cause.
    "nccl2.20-oom-no-nccl-debug-last-error-only-profile": ("unknown", "NCCL's calloc warning follows any failure"),
    # `kubectl describe`'s events are not a container's log: the classifier reads what the container
    # wrote; an eviction is the pod's status, and the Deployment replaces the pod.
    "k8s-kubelet-eviction-memory-pressure": ("unknown", "an event, not a container's log line"),
    "k8s-kubelet-eviction-memory-old-format": ("unknown", "an event, not a container's log line"),
    "k8s-kubelet-eviction-ephemeral-storage": ("unknown", "an event, not a container's log line"),
}

# id -> why the classifier still misses it (strict: a fix must remove the entry)
LIMITS: dict[str, str] = {
    "v0.32.0-hisparse-host-pool-below-max-model-len": (
        "the HiSparse connector's host pool (host_pool_gib, a connector setting) holds fewer blocks than one "
        "request: a shorter context would fit, but the pool's block size is not printed; no heal"
    ),
    "v0.32.0-hisparse-pinned-host-pool-exceeds-ram": (
        "the HiSparse connector's pinned host pool above the node's available RAM: host memory, but the pool "
        "size is the connector's setting and a larger container limit does not add node RAM; no heal"
    ),
    "torch-pinned-host-alloc-cuda-error-oom-swap-space": (
        "pinned host memory for V0's CPU swap space fails as the GPU's 'CUDA error: out of memory' under "
        'the KV-cache allocation; only a code line (`_allocate_kv_cache(self.num_cpu_blocks, "cpu")`) '
        "says it was host memory, so it reads as memory gone between profiling and allocation"
    ),
}


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=LIMITS[e["id"]])) if e["id"] in LIMITS else e
        for e in CENSUS
    ],
    ids=lambda e: e["id"],
)
def test_source_message(entry):
    diagnosis = classify(Signals(log=entry["log"]))
    designed = DESIGNED.get(entry["id"])
    if designed is not None:
        assert diagnosis.cause == designed[0], (designed[1], diagnosis.explanation)
    elif entry["expected"] == "ambiguous":
        assert not diagnosis.is_memory, (entry["why"], diagnosis.cause, diagnosis.explanation)
    else:
        assert diagnosis.cause == entry["expected"], (entry["why"], diagnosis.subtype, diagnosis.explanation)


def test_the_census_spans_versions_stacks_and_look_alikes():
    """The fixture is what the module docstring says: many versions, other stacks, look-alikes."""
    engines = {e["engine"] for e in CENSUS}
    assert {"V0", "V1", "cpu", "ascend", "tpu", "torch", "torch-rocm", "nccl", "kernel", "ray"} <= engines
    assert len({e["version"] for e in CENSUS}) >= 10
    assert sum(e["expected"] == "not_oom" for e in CENSUS) >= 30
    assert len({e["id"] for e in CENSUS}) == len(CENSUS)
    assert set(DESIGNED) | set(LIMITS) <= {e["id"] for e in CENSUS}
    assert not set(DESIGNED) & set(LIMITS)
