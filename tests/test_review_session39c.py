"""Hostile review (session 39c) of two changes: --cpu-offload-gb ignored by the V2 model runner of vLLM 0.22-0.27
(2ed9c9d: model_runner.offload_ignored, used by memory.estimate, steps.cpu_offload, resource_steps.lower_cpu_offload /
offload_ignored_note / split_offload and plan's give-up), and the speed refactor of diagnosis/ (f7f8278..fd5dc54:
nearest.Figures for arithmetic.numbers, writers.clients_lines, needles.finder's follower test, scan/origin pre-checks).

Ground truth: vLLM 0.25's config/vllm.py (/work/main/.gpu/dl/site/vllm): use_v2_model_runner returns False unless
_is_default_v2_model_runner_model, which is False for any model_config.runner_type other than "generate" (`--runner
pooling`, `--convert embed`, and by default an architecture named *ForSequenceClassification / *EmbeddingModel / *Model:
config/model.py _SUFFIX_TO_DEFAULTS); _get_v2_model_runner_unsupported_features falls back to V1 for
compilation_config.mode == STOCK_TORCH_COMPILE (1), which `-cc` (engine/arg_utils.py: "--compilation-config", "-cc")
sets as well as --compilation-config. On V1 the weight offloader is installed (v1/worker/gpu_model_runner.py
set_offloader): the offload is real there, so claiming it ignored drops a working heal and over-weighs the GPU.

The xfail(strict) tests are defects: each asserts the right behaviour and fails now. The plain tests pin what
withstood: a differential fuzz of the old diagnosis/ (1c76b2e) against the new on 32,000 mutated corpus logs
(shuffled, duplicated, split and joined lines, figures replaced by -0.0/nan/inf/1e309/1,024.00, JSON and CRI
wrappers, Unicode case-folding letters, lines past 256 characters) found no difference in cause, subtype, numbers
(in order), notes or evidence; the plain tests below check the cheap parts of that here."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.diagnosis import Signals, arithmetic, classify
from vllm_autoheal.diagnosis.findings import findings_of
from vllm_autoheal.diagnosis.nearest import Figures
from vllm_autoheal.diagnosis.needles import finder
from vllm_autoheal.diagnosis.scan import _TIMES, _without_times, scan
from vllm_autoheal.gpu_catalog import lookup
from vllm_autoheal.memory import estimate
from vllm_autoheal.model_runner import offload_ignored
from vllm_autoheal.vllm_release import parse_version

from samples import config_shape

LLAMA8 = config_shape("llama-3.1-8b")
H100 = lookup("NVIDIA-H100-80GB-HBM3")
V025, V023 = parse_version("0.25.0"), parse_version("0.23.0")
CORPUS = Path(__file__).parent / "corpus" / "corpus.jsonl"

# --- Change A: offload_ignored claims V2 where vLLM 0.25 runs V1 ----------------------------------------------


@pytest.mark.parametrize(
    "extra", [["--runner", "pooling"], ["--runner=pooling"], ["--convert", "embed"], ["--convert=classify"]]
)
def test_a_pooling_runner_is_on_v1_and_offloads(extra):
    assert not offload_ignored(LLAMA8, V025, extra)
    engine = EngineArgs(max_model_len=4096, cpu_offload_gb=4.0, extra_args=extra)
    no_offload = EngineArgs(max_model_len=4096, extra_args=extra)
    est, base = estimate(LLAMA8, engine, H100, release=V025), estimate(LLAMA8, no_offload, H100, release=V025)
    assert est.weights_gib == pytest.approx(base.weights_gib - 4.0, abs=0.1)


@pytest.mark.parametrize(
    "arch", ["Qwen3ForSequenceClassification", "LlamaForSequenceClassification", "Qwen2ForRewardModel", "LlamaModel"]
)
def test_a_pooling_architecture_is_on_v1(arch):
    assert not offload_ignored(dataclasses.replace(LLAMA8, architecture=arch), V025, [])


@pytest.mark.parametrize("extra", [["-cc", '{"mode": 1}'], ["-cc.mode=1"], ['-cc={"mode":1}']])
def test_the_compilation_config_alias_falls_back_to_v1(extra):
    assert not offload_ignored(LLAMA8, V025, extra)


@pytest.mark.parametrize(
    "extra",
    [
        ["--compilation-config", '{"mode": 1}'],
        ['--compilation_config={"mode":1}'],
        ["--enable_prompt_embeds"],
        ["--enable-prompt-embeds=true"],
        ["-pcp=2"],
        ["--speculative_config", '{"method": "ngram"}'],
        ["--logprobs-mode", "raw_logits"],
    ],
)
def test_underscore_and_equals_forms_of_the_fallback_flags_withstood(extra):
    assert not offload_ignored(LLAMA8, V025, extra)
    assert not offload_ignored(LLAMA8, V023, extra)


def test_enforce_eager_keeps_v2_withstood():
    # (--enforce-eager is CompilationMode.NONE, not STOCK_TORCH_COMPILE: V2 still runs, the offload still ignored)
    assert offload_ignored(LLAMA8, V025, ["--enforce-eager"])


# --- Change B: the refactor returns what the old code did ---------------------------------------------------------


def _corpus_logs(limit: int = 200) -> list[str]:
    logs = [json.loads(line).get("log") or "" for line in CORPUS.read_text().splitlines()[:limit]]
    return [log for log in logs if log]


def test_nearest_figures_are_the_walks_on_the_corpus_withstood():
    for log in _corpus_logs():
        findings = findings_of(scan(log).lines)
        figs = Figures(findings, 79.19)
        for first in [None, *findings[:40]]:
            old_notes, new_notes = [], []
            old = arithmetic.numbers(findings, first, 79.19, old_notes)
            new = figs.numbers(first, new_notes)
            assert list(new.items()) == list(old.items()) and new_notes == old_notes


@pytest.mark.parametrize(
    "header",
    ["INFO 01-02 03:04:05.6 [x.py:1]", " 2025-01-01T00:00:00Z\u00a0W\x1cE 12-31  23:59:59 ", "\u2028a\u3000b 01-02\t9"],
)
def test_times_then_blanks_is_the_old_one_pass_withstood(header):
    old = re.compile(_TIMES.pattern + r"|\s+")
    assert _without_times(header) == old.sub("", header)


def test_the_finder_follower_test_withstood():
    needles = ["abc", "bcd", "cde", "bc", "cdef", "xbcq", "b\u0130", "\u0130x"]
    find = finder(needles)
    for text in ["abcdef", "xbcqabcde", "ab\u0130x", "abcd" * 80 + " .:_1acdeghilmnoprstuy", "abc", "bcdx"]:
        assert find(text) == {n for n in needles if n in text}


def test_a_wrapped_oom_with_figures_out_of_order_withstood():
    log = (
        "INFO 01-02 03:04:06 [gpu_worker.py:1] Available KV cache memory: 5.00 GiB\n"
        "INFO 01-02 03:04:05 [gpu_worker.py:1] Available KV cache memory: -0.0 GiB\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of\n"
        "79.19 GiB of which 1.00 GiB is free.\n"
    )
    d = classify(Signals(log=log))
    assert d.is_memory
