"""A log collector's prefix on every line (stern, kubectl --prefix, journald, mpirun, a tag, a
quoted paste) is cut, so the engine's traceback underneath is read; a line with structure of its
own is never changed."""

from __future__ import annotations

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.collector import prefix_of
from vllm_autoheal.diagnosis.scan import scan, structured

TRACEBACK = (
    "INFO 05-01 12:00:00 [gpu_model_runner.py:100] Starting to load model meta-llama/Llama-3.1-8B...\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/site-packages/vllm/model_executor/model_loader/utils.py", line 64, in initialize_model\n'
    "    return model_class(vllm_config=vllm_config, prefix=prefix)\n"
    "KeyError: 'model.layers.0.mlp.gate_proj.weight'\n"
)
KV = (
    "INFO 05-01 12:00:00 model_runner.py:100] Loading model weights took 14.99 GB\n"
    "INFO 05-01 12:00:01 gpu_executor.py:83] # GPU blocks: 0, # CPU blocks: 2048\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.10/site-packages/vllm/engine/llm_engine.py", line 1, in _initialize_kv_caches\n'
    "    self.model_executor.initialize_cache(num_gpu_blocks)\n"
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
    "when initializing the engine.\n"
)
COLLECTORS = {
    "stern": "vllm-7d9f8c-x2x4q vllm ",
    "kubectl --prefix": "[pod/vllm-7d9f8c-x2x4q/vllm] ",
    "journald": "Dec 01 12:00:00 gpu-node-3 vllm[41234]: ",
    "mpirun --tag-output": "[1,0]<stdout>:",
    "a compose tag": "[vllm]: ",
    "a quoted paste": "> ",
}


def prefixed(prefix: str, log: str) -> str:
    return "".join(prefix + line + "\n" for line in log.splitlines())


@pytest.mark.parametrize("collector", COLLECTORS)
def test_the_engine_under_a_collectors_prefix_is_read(collector):
    plain = classify(Signals(log=TRACEBACK))
    assert (plain.cause, plain.subtype) == ("not_oom", "other_error")
    d = classify(Signals(log=prefixed(COLLECTORS[collector], TRACEBACK)))
    assert (d.cause, d.subtype) == ("not_oom", "other_error") and "KeyError" in d.evidence[0]
    kv = classify(Signals(log=prefixed(COLLECTORS[collector], KV)))
    assert kv.cause == "kv_cache_insufficient"


def test_stern_pod_prefix_is_cut_when_its_containers_differ():
    lines = [
        f"vllm-7d9f8c-x2x4q {c} {t}"
        for c, t in zip(["vllm", "sidecar", "vllm", "sidecar", "vllm"], TRACEBACK.splitlines(), strict=True)
    ]
    prefix = prefix_of(lines, structured)
    assert prefix is not None and all(prefix.match(line).end() == len("vllm-7d9f8c-x2x4q vllm ") for line in lines[::2])


def test_no_prefix_on_a_plain_log_nor_a_bare_token_on_a_few_lines():
    assert prefix_of(TRACEBACK.splitlines(), structured) is None
    assert prefix_of(["x y Traceback (most recent call last):", "x y KeyError: 1"], structured) is None


LORA = "ValueError: LoRA rank 64 is greater than max_lora_rank 16.\n"


@pytest.mark.parametrize("collector", ["journald", "kubectl --prefix", "mpirun --tag-output", "a quoted paste"])
def test_a_pasted_line_or_two_under_a_shape_only_a_collector_writes_is_read(collector):
    """A thread's excerpt of one to three lines: too few to tell a bare token (stern's pod name)
    from the first word of a line, but journald's header, a tag or a quote on each of them is a
    collector's."""
    for log in (LORA, "Traceback (most recent call last):\n" + LORA):
        d = classify(Signals(log=prefixed(COLLECTORS[collector], log)))
        assert (d.cause, d.subtype) == ("not_oom", "other_error"), (collector, log, d.explanation)
    assert prefix_of(["> " + LORA.strip(), "ValueError: 1"], structured) is None  # not on every line


def test_a_prefix_on_most_lines_never_changes_a_line_with_structure_of_its_own():
    # Someone else's lines (an app printing raw text) all open with "Traceback x": the engine's
    # own traceback and headed lines are left whole, and the engine's error still decides.
    noise = "".join(f"Traceback x {i}\n" for i in range(60))
    d = classify(Signals(log=noise + TRACEBACK))
    assert (d.cause, d.subtype) == ("not_oom", "other_error")
    texts = {line.text for line in scan(noise + KV).lines}
    assert "Traceback (most recent call last):" in texts
    assert classify(Signals(log=noise + KV)).cause == "kv_cache_insufficient"


def test_srun_labels_every_tasks_lines_with_its_number_and_all_are_cut():
    """srun --label puts the task's number (padded to the widest) before each line; tasks interleave,
    so no one number opens 80 % of the lines: the label's shape is the prefix."""
    lines = KV.splitlines()
    log = "".join(f"{(i % 3) * 5:>2}: {line}\n" for i, line in enumerate(lines))  # tasks 0, 5, 10
    assert classify(Signals(log=log)).cause == "kv_cache_insufficient"
    assert classify(Signals(log=prefixed(" 3: ", TRACEBACK))).cause == "not_oom"


@pytest.mark.parametrize(
    "prefix",
    ["<launcher 12:00:0{i}> ", "job-4711 step {i} :: ", "[gpu-node-{i}]| ", "rollout.{i} >> "],
)
def test_any_collectors_prefix_the_same_words_digits_aside_is_cut(prefix):
    """A prefix of a shape no rule names: the same words on every line, only its digits differ."""

    def shaped(log: str) -> str:
        return "".join(prefix.format(i=i % 10) + line + "\n" for i, line in enumerate(log.splitlines()))

    assert classify(Signals(log=shaped(KV))).cause == "kv_cache_insufficient"
    d = classify(Signals(log=shaped(TRACEBACK)))
    assert (d.cause, d.subtype) == ("not_oom", "other_error") and d.evidence[0].startswith("KeyError")


def test_no_generic_prefix_where_the_engines_lines_open_with_its_own_structure():
    """vLLM's headed lines share their opening words ('INFO 05-01 12:00:0'): that is no prefix."""
    lines = [f"INFO 05-01 12:00:0{i} [core.py:1] step {i}" for i in range(8)] + ["plain text"] * 2
    assert prefix_of(lines, structured) is None


@pytest.mark.parametrize(
    "prefix",
    [
        "2026-12-01T10:00:0{i}+0000 gpu-node-3 vllm[41234]: ",  # journalctl -o short-iso
        '2026-12-01T10:00:0{i}Z {{app="vllm", pod="vllm-7d9f8c-x2x4q"}} ',  # Loki's logcli
        "2026-12-01T10:00:0{i}.000000+00:00 vllm/vllm/3f2a9c ",  # aws logs tail (CloudWatch)
    ],
)
def test_a_log_shippers_tags_after_its_timestamp_are_cut(prefix):
    """A timestamp is a collector's, not the engine's structure: the tags a shipper writes after it
    are a prefix like any other (they were not cut while the timestamp counted as structure)."""

    def shaped(log: str) -> str:
        return "".join(prefix.format(i=i % 10) + line + "\n" for i, line in enumerate(log.splitlines()))

    assert classify(Signals(log=shaped(KV))).cause == "kv_cache_insufficient"
    d = classify(Signals(log=shaped(TRACEBACK)))
    assert (d.cause, d.subtype) == ("not_oom", "other_error") and d.evidence[0].startswith("KeyError")
    assert not structured("2026-12-01T10:00:00Z gpu-node-3 vllm[1]: plain")
    assert structured("2026-12-01T10:00:00Z INFO 05-01 12:00:00 [core.py:1] x")  # kubectl --timestamps
