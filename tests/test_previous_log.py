"""The operator reads a crashed container's log through the kubelet, which keeps the first
`limitBytes` of the last `tailLines`: the end of the log, where a vLLM crash's root cause is, must
survive long lines, and a log that is not whole is marked so (its first lines may be the middle of a
message, a client's)."""

from __future__ import annotations

import pytest
import urllib3

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.scan import GAP_LINE
from vllm_autoheal.kube import client as kc

from crafted.node_logs import Kubelet

CRASH = "ERROR 12-01 10:00:09 [core.py:1] RuntimeError: CUDA error: an illegal memory access was encountered\n"


def test_a_short_log_is_read_whole_and_unmarked():
    output = "INFO 12-01 10:00:00 [core.py:1] starting\n" * 10 + CRASH
    kube = Kubelet(output)
    assert kube.previous_log("ns", "pod", "vllm") == output
    assert kube.asked == [kc.LOG_TAIL_LINES]


def test_the_end_survives_lines_too_long_for_the_byte_limit():
    """4,000 request lines of 2 KiB overflow 2 MiB: the kubelet would keep their first 2 MiB and cut
    the crash off. Fewer lines are asked for until the end fits."""
    echo = "INFO 12-01 10:00:00 [logger.py:39] Received request cmpl-1: prompt: '" + "x" * 2000 + "'\n"
    kube = Kubelet(echo * 6000 + CRASH)
    log = kube.previous_log("ns", "pod", "vllm")
    assert log.endswith(CRASH) and log.startswith(GAP_LINE + "\n")
    assert kube.asked[:3] == [4000, 1000, 250] and len(kube.asked) <= 3 + kc.LOG_REFINE
    kept = log.count("\n") - 1  # (the gap line aside)
    assert 250 < kept < 1000 and len(log.encode()) < kc.LOG_LIMIT_BYTES  # as many lines as fit, found in a few calls
    assert classify(Signals(log=log)).subtype == "illegal_memory_access"


@pytest.mark.parametrize("lines", [kc.LOG_TAIL_LINES, kc.LOG_TAIL_LINES + 1, 10 * kc.LOG_TAIL_LINES])
def test_a_log_cut_at_its_head_opens_with_a_gap(lines):
    output = "INFO 12-01 10:00:00 [core.py:1] step\n" * (lines - 1) + CRASH
    log = Kubelet(output).previous_log("ns", "pod", "vllm")
    assert log.startswith(GAP_LINE + "\n") and log.endswith(CRASH)
    assert log.count("\n") == kc.LOG_TAIL_LINES + 1


class StallingKubelet(Kubelet):
    """A kubelet that stops answering after `answers` calls: the client's read times out."""

    def __init__(self, output: str, answers: int) -> None:
        super().__init__(output)
        self.answers = answers

    def request(self, method, path, body=None, content_type="", query=None, raw=False, timeout=None):
        if len(self.asked) >= self.answers:
            self.asked.append(dict(query or [])["tailLines"])
            raise urllib3.exceptions.ReadTimeoutError(None, path, "Read timed out.")
        return super().request(method, path, body, content_type, query, raw, timeout)


def test_a_log_the_kubelet_never_sends_is_no_log_and_no_error():
    """A timeout raised out of the crash handler and lost the crash (kopf does not retry events)."""
    assert StallingKubelet(CRASH, answers=0).previous_log("ns", "pod", "vllm") == ""


def test_a_stall_while_refining_keeps_the_lines_already_read():
    output = ("INFO 12-01 10:00:00 [api.py:1] request " + "x" * 2048 + "\n") * 4000 + CRASH
    kube = StallingKubelet(output, answers=3)  # 4000 and 1000 lines overflow, 250 fit, then no answer
    log = kube.previous_log("ns", "pod", "vllm")
    assert log.startswith(GAP_LINE) and log.endswith(CRASH)
    assert kube.asked == [4000, 1000, 250, 625]
