"""Regressions found by replaying the train split through the planner at 3d3952d and now: crashes where
today's plan was worse than the one before, by the figures vLLM printed in the crash's own log. Each
test names the old plan, the worse one and the figures that say which is right."""

from __future__ import annotations

from vllm_autoheal.api import VLLMServiceSpec
from vllm_autoheal.diagnosis import Diagnosis, Signals, classify
from vllm_autoheal.diagnosis.corpus import context
from vllm_autoheal.remedy import plan_heal
from vllm_autoheal.remedy.model import Inventory

from crafted.bases import CORPUS, corpus_log
from samples import config_shape

RTX_4090_GIB = 23.65  # the GPU the rl-swarm thread names (gpu_catalog's GEFORCE-RTX-4090)


def diagnose(name: str) -> Diagnosis:
    """The sample's crash as the operator reads it: the log, the spec's TP/PP, the pod's state."""
    return classify(Signals(log=corpus_log(name), **context(CORPUS[name], pod_state=True)))


def test_the_regression_samples_read_as_their_labels():
    """The replays below start from a right classification (a wrong one is the classifier's to fix)."""
    name = "kv_cache_insufficient-334-rlswarm-4090-7b"
    assert CORPUS[name]["split"] == "train"
    d = diagnose(name)
    assert (d.cause, d.subtype) == ("kv_cache_insufficient", "max_model_len_exceeds_kv_capacity")
    assert d.numbers["kv_tokens"] == 112 and d.numbers["max_seq_len"] == 256


def test_a_raise_the_shape_shows_holds_the_context_is_not_given_up():
    """rl-swarm's 7B next to its trainer on a 24 GB GPU: 'The model's max seq len (256) is larger than the
    maximum number of tokens that can be stored in KV cache (112)'. With the model's shape, which the
    operator has from spec.model, the cache's 112 tokens are a size; the raise to 0.93 (the most free
    memory allows) grows that size by 0.71 GiB, far past 256 tokens. Before: that raise. Now: a give-up
    that names no figure ('tried: none'), leaving the spec degraded where one restart heals it."""
    d = diagnose("kv_cache_insufficient-334-rlswarm-4090-7b")
    s = VLLMServiceSpec(model="m", engine={"gpuMemoryUtilization": 0.9, "maxModelLen": 256})
    inv = Inventory(gpu_total_gib=RTX_4090_GIB, gpu_name="GEFORCE-RTX-4090", shape=config_shape("qwen2.5-7b"))
    r = plan_heal(s, d, inventory=inv)
    assert r.action == "RaiseGpuMemoryUtilization", r.summary()
    assert r.changes["gpu_memory_utilization"] > 0.9, r.summary()
    assert r.changes.get("max_model_len", 256) >= 256, r.summary()
