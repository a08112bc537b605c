"""The shapes a log takes on its way to the classifier besides vLLM's own: a collector's stamp on
every line (`kubectl logs --timestamps`, compose's service tag) under a message a pretty-printer
wrapped, and a notebook's traceback (IPython 8's `File PATH:LINE, in Class.name(args)`, IPython 7's
`PATH in name(args)`). Each is read as the same failure without it; each shape is Python's,
IPython's or the collector's, not a sample's."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_autoheal.diagnosis import Signals, classify
from vllm_autoheal.diagnosis.origin import USER
from vllm_autoheal.diagnosis.scan import scan

from crafted.bases import BASE, OOM, real_log, with_lines
from crafted.checks import assert_reads_like
from crafted.grammar import SITE, assert_json_reads_like, grammar_crash
from crafted.node_logs import COLLECTORS
from crafted.reports import ASGI, asgi

# vLLM's KV check, as a pretty-printer (a notebook, a wrapping console) wrapped it over three lines.
WRAPPED_KV = (
    "ValueError: To serve at least one request with the model's max seq len (1048576),\n"
    "22.5 GiB KV cache is needed, which is larger than the available KV cache memory (17.39 GiB).\n"
    "Based on the available memory, the estimated maximum model length is 810208.\n"
)


STAMPS = {
    "none": "",
    "kubectl --timestamps": "2026-11-30T08:01:02.123456789Z ",
    "compose": "vllm-1  | ",
    "bracketed time": "[2026-11-30 08:01:02,123] ",
}


def stamped(stamp: str, log: str, second: str | None = None) -> str:
    lines = log.splitlines()
    return "".join((stamp if i == 0 or second is None else second) + ln + "\n" for i, ln in enumerate(lines))


@pytest.mark.parametrize("stamp", STAMPS)
def test_a_wrapped_message_under_a_collectors_stamp_on_each_line_is_read_whole(stamp):
    d = classify(Signals(log=stamped(STAMPS[stamp], WRAPPED_KV)))
    assert d.cause == "kv_cache_insufficient", (d.cause, d.subtype, d.explanation)
    assert d.numbers.get("max_seq_len") == 1048576 and d.numbers.get("needed_gib") == 22.5


def test_lines_another_writer_stamped_do_not_complete_the_message():
    """Compose interleaves services: the next lines under another service's tag are not the
    engine's message, so its figures are not read into it."""
    d = classify(Signals(log=stamped("vllm-1  | ", WRAPPED_KV, second="client-1  | ")))
    assert d.cause != "kv_cache_insufficient" and "needed_gib" not in d.numbers


SITE8 = "/opt/conda/lib/python3.11/site-packages"


IPYTHON_8_KV = f"""\
INFO 01-10 09:13:40 model_runner.py:1008] Loading model weights took 14.99 GB
---------------------------------------------------------------------------
OutOfMemoryError                          Traceback (most recent call last)
Cell In[2], line 3
      1 from vllm import LLM
----> 3 llm = LLM(model="meta-llama/Llama-3.1-8B-Instruct", gpu_memory_utilization=0.95)

File {SITE8}/vllm/worker/worker.py:261, in Worker.initialize_cache(self, num_gpu_blocks, num_cpu_blocks)
    258 self.cache_config.num_cpu_blocks = num_cpu_blocks
--> 261 self._init_cache_engine()

File {SITE8}/vllm/worker/cache_engine.py:86, in CacheEngine._allocate_kv_cache(self, num_blocks, device)
     84 for _ in range(self.num_attention_layers):
---> 86     kv_cache.append(torch.zeros(kv_cache_shape, dtype=self.dtype, pin_memory=pin_memory, device=device))

OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 23.65 GiB of \
which 1.20 GiB is free. Including non-PyTorch memory, this process has 22.44 GiB memory in use. Of the allocated \
memory 21.90 GiB is allocated by PyTorch, and 112.00 MiB is reserved by PyTorch but unallocated.
"""


SITE7 = "/usr/local/lib/python3.10/dist-packages"


IPYTHON_7_LOAD = f"""\
---------------------------------------------------------------------------
OutOfMemoryError                          Traceback (most recent call last)
<ipython-input-2-5b1f3e1c2a4d> in <module>
----> 1 llm = LLM(model="meta-llama/Llama-2-70b-hf")

{SITE7}/vllm/engine/llm_engine.py in _init_workers(self, distributed_init_method)
    112         self._run_workers(
--> 113             "init_model",

{SITE7}/vllm/model_executor/models/llama.py in __init__(self, hidden_size, num_heads, num_kv_heads)
    101         self.scaling = self.head_dim**-0.5
--> 103         self.qkv_proj = ColumnParallelLinear(

OutOfMemoryError: CUDA out of memory. Tried to allocate 160.00 MiB (GPU 0; 79.35 GiB total capacity; 78.58 GiB \
already allocated; 145.19 MiB free; 78.58 GiB reserved in total by PyTorch)
"""


@pytest.mark.parametrize(
    ("log", "cause", "phase"),
    [(IPYTHON_8_KV, "gpu_util_exceeds_free", "kv-allocation"), (IPYTHON_7_LOAD, "weights_load_oom", "load")],
    ids=["ipython-8-kv-allocation", "ipython-7-loading"],
)
def test_a_notebooks_traceback_places_the_failure_by_its_frames(log, cause, phase):
    d = classify(Signals(log=log))
    assert (d.cause, d.phase) == (cause, phase), (d.subtype, d.evidence, d.explanation)


def test_a_notebooks_grammar_frame_makes_the_exception_the_requests():
    """A client's words in the exception a grammar library raises, under a notebook's frames, name
    no memory failure (quoted.GRAMMAR_FRAME, in IPython's form)."""
    log = f"""\
---------------------------------------------------------------------------
ValueError                                Traceback (most recent call last)
Cell In[7], line 1
----> 1 outputs = llm.generate(prompts, params)

File {SITE8}/vllm/v1/structured_output/backend_xgrammar.py:129, in XgrammarBackend.compile_grammar(self, request_type, grammar_spec)
--> 129     ctx = self.compiler.compile_structural_tag(tags, triggers)

ValueError: Trigger <fn not found in triggers
CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.00 GiB is free.
"""
    d = classify(Signals(log=log))
    assert not d.is_memory and not any("64.00 GiB" in e for e in d.evidence), (d.cause, d.evidence)


REAL = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu"


def test_a_log_copied_from_k9s_box_is_read_as_the_log():
    """k9s's log view draws a box around each line ("│ <line><padding> │"): the same diagnosis."""
    log = (REAL / "kv-cache-too-small.log").read_text()
    boxed = "".join("│ " + line.ljust(220) + " │\n" for line in log.splitlines())
    plain, d = classify(Signals(log=log)), classify(Signals(log=boxed))
    assert (d.cause, d.numbers) == (plain.cause, plain.numbers) and d.cause == "kv_cache_insufficient"


def test_vllms_logging_prefix_is_read_before_its_header():
    """VLLM_LOGGING_PREFIX="[llama-70b] ": the real CPU engine's log of a KV cache too small, with the
    prefix vLLM's formatter puts before each header, reads as the log without it."""
    log = (REAL / "kv-cache-too-small-prefix.log").read_text()
    assert "[llama-70b] (EngineCore pid=" in log  # (vLLM 0.32 puts it before the process prefix)
    d = classify(Signals(log=log))
    assert d.cause == "kv_cache_insufficient" and d.numbers["estimated_max_model_len"] == 524160
    assert d.evidence[0].startswith("ValueError: To serve")  # the engine's line, read under its header
    lines = scan(log).lines
    assert sum(ln.source_file == "core.py" for ln in lines) > 20


@pytest.mark.parametrize("prefix", ["[llama-70b] ", "prod east "])
@pytest.mark.parametrize("first", [True, False], ids=["before-the-process", "after-the-process"])
def test_a_request_line_under_the_logging_prefix_is_still_user_text(prefix, first):
    def headed(process: str, rest: str) -> str:
        return f"{prefix}{process} {rest}" if first else f"{process} {prefix}{rest}"

    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB."
    request = headed(
        "(APIServer pid=7)", f"INFO 12-01 10:00:01 [request_logger.py:65] Received request c: prompt: '{oom}'"
    )
    crash = headed(
        "(EngineCore_DP0 pid=9)", "ERROR 12-01 10:00:02 [core.py:900] EngineCore encountered a fatal error.\n"
    ) + headed(
        "(EngineCore_DP0 pid=9)",
        "ERROR 12-01 10:00:02 [core.py:900] RuntimeError: CUDA error: an illegal memory access was encountered\n",
    )
    assert scan(request + "\n").lines[0].origin == USER
    d = classify(Signals(log=request + "\n" + crash))
    assert (d.cause, d.subtype) == ("not_oom", "illegal_memory_access") and "64.00" not in " ".join(d.evidence)


# --- The wrapped join takes a client's continued lines -----------------
FREE = (
    "Free memory on device (1.0/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, "
    "71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes. ZZUSERZZ"
)


def _asgi_error(exception_line: str, message_rest: str) -> str:
    return ASGI.replace("jinja2.exceptions.TemplateError: x\n", exception_line + "\n" + message_rest + "\n")


@pytest.mark.parametrize("collector", sorted(COLLECTORS))
@pytest.mark.parametrize("exception", ["ValueError: x", "RuntimeError: x"])
@pytest.mark.parametrize("base_name", [BASE, "memory-limit-kill.log"])
def test_a_wrapped_join_never_takes_a_clients_line(base_name, exception, collector):
    """Unfixed: -> gpu_util_exceeds_free free_memory_below_requested, free_gib 1.0, util 0.9, quoting
    `) = await self._preprocess_chat(` (the code line, joined with the exception line and the client's).
    A plain log reads the same way. Should say what the same
    report says with a harmless line there."""
    base_log = real_log(base_name)
    wrap = COLLECTORS[collector]
    assert_reads_like(
        wrap(with_lines(base_log, _asgi_error(exception, FREE), "end")),
        wrap(with_lines(base_log, _asgi_error(exception, "hello"), "end")),
        collector,
    )


NOTEBOOK_FRAMES = {
    "ipython8": f"File {SITE}/v1/worker/gpu_model_runner.py:1, in GPUModelRunner.execute_model(self)\n    x\n",
    "ipython7": f"{SITE}/v1/worker/gpu_model_runner.py in execute_model(self)\n    x\n",
    "ipython8-init": f"File {SITE}/model_executor/models/llama.py:1, in LlamaModel.__init__(self)\n    x\n",
    "ipython8-traceback": "Traceback (most recent call last):\n"
    f"File {SITE}/v1/worker/gpu_model_runner.py:1, in GPUModelRunner.load_model(self)\n    x\n",
}


@pytest.mark.parametrize("frame", sorted(NOTEBOOK_FRAMES))
def test_a_notebook_frame_in_a_clients_text_names_nothing(frame):
    """In the grammar crash (headed, and the prefixed re-print alone), the ASGI report and
    the JSON-mode crash, a client's notebook-shaped frame does not end the report."""
    base_log = real_log(BASE)
    begin = "<fn\n" + NOTEBOOK_FRAMES[frame] + OOM
    for headed in (True, False):
        assert_reads_like(
            with_lines(base_log, grammar_crash(begin, headed), "end"),
            with_lines(base_log, grammar_crash("<fn\nhello", headed), "end"),
            frame,
        )
    assert_reads_like(
        with_lines(base_log, asgi("x\n" + NOTEBOOK_FRAMES[frame] + OOM), "end"),
        with_lines(base_log, asgi("x"), "end"),
        frame,
    )
    assert_json_reads_like(begin, "<fn\nhello", True, frame)
