"""Exceptions vLLM logs with a client's text in their message (a chat template's error, a request's
ValueError, a LoRA adapter or Hub repo the client named, an Anthropic tool name), a worker's
traceback with real multi-line memory failures, and CLIENT_FORMATS: every such shape by name."""

from __future__ import annotations

from crafted.bases import vllm_log
from crafted.reports import CLIENT_ASGI
from crafted.request_logging import CLIENT_ID_LINES, ERROR_STACK, FORMATS, GRAMMAR

CHAT = "ERROR 07-03 03:19:15 [serving_chat.py:200] "  # the API server's per-request errors (corpus neg-20409)


def preprocess_error(exception_line: str) -> str:
    return vllm_log(
        CHAT,
        "Error in preprocessing prompt inputs\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", '
        "line 183, in create_chat_completion\n    ) = await self._preprocess_chat(\n" + exception_line,
    )


# EngineCoreProc._invoke_utility_method (v1/engine/core.py:1750): logger.exception("Invocation of %s
# method failed", name). POST /v1/load_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) sends the
# client's lora_name and lora_path to the engine's add_lora; a path that is not there raises
# LoRAAdapterNotFoundError (vllm/exceptions.py): "Loading lora {lora_name} failed: No adapter found
# for {lora_path}", after the FileNotFoundError that names the path. Both are JSON strings.
ADD_LORA = "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:08 [core.py:1750] "


def add_lora_failure(name: str, path: str) -> str:
    return vllm_log(
        ADD_LORA,
        "Invocation of add_lora method failed\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/worker_manager.py", line 120, in _load_adapter\n'
        "    peft_helper = PEFTHelper.from_local_dir(\n"
        f"FileNotFoundError: [Errno 2] No such file or directory: '{path}/adapter_config.json'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1740, in '
        "_invoke_utility_method\n    result = get_result()\n"
        f"vllm.exceptions.LoRAAdapterNotFoundError: Loading lora {name} failed: No adapter found for {path}",
    )


# get_adapter_absolute_path (vllm/lora/utils.py:379): a lora_path that is neither absolute nor a
# local folder is taken for a Hub repo; the Hub's HFValidationError names it, under
# logger.exception("Error downloading the HuggingFace model") in the engine's (or a worker's) process.
HF_DOWNLOAD = "(EngineCore_DP0 pid=2441) ERROR 12-01 04:48:08 [utils.py:379] "


def hf_download_failure(path: str) -> str:
    return vllm_log(
        HF_DOWNLOAD,
        "Error downloading the HuggingFace model\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/lora/utils.py", line 376, in '
        "get_adapter_absolute_path\n    local_snapshot_path = download_fn()\n"
        "huggingface_hub.errors.HFValidationError: Repo id must use alphanumeric chars or '-', '_', '.', "
        "'--' and '..' are forbidden, '-' and '.' cannot start or end the name, max length is 96: "
        f"'{path}'.",
    )


# The Anthropic Messages API (vllm/entrypoints/anthropic, on by default): a system message's
# tool_removal block naming a tool not in `tools` raises ValueError(f"{block.type} references tool
# {name!r}, which is not declared in tools") (serving.py:749) before any request id exists, and
# api_router.py:75 logs it with logger.exception("Error in create_messages: %s", e). api_router.py is
# no request file: the message and the traceback's last line are the engine's ERROR lines.
ANTHROPIC = "(APIServer pid=2320) ERROR 12-01 04:48:09 [api_router.py:75] "


def anthropic_tool_removal(name: str) -> str:
    e = f"tool_removal references tool {name!r}, which is not declared in tools"
    return vllm_log(
        ANTHROPIC,
        f"Error in create_messages: {e}\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/anthropic/api_router.py", line 73, '
        "in create_messages\n    generator = await handler.create_messages(request, raw_request)\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/anthropic/serving.py", line 749, '
        f"in _resolve_tools\n    raise ValueError(\nValueError: {e}",
    )


# A worker's start-up failure, and real multi-line memory failures as a worker logs them
WORKER_HEADER = "(Worker_TP1 pid=2441) ERROR 12-01 04:48:08 [multiproc_executor.py:671] "


WORKER_TRACEBACK = [
    "WorkerProc failed to start.",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/parallel_state.py", line 1, in init_group',
    "    torch.distributed.barrier()",
]


REAL_MULTILINE = {
    "nccl-last-error": (
        [
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            "Cuda failure 2 'out of memory'",
        ],
        "multi_gpu_oom",
    ),
    "ray-oom": (
        [
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            "Memory on the node (IP: 10.0.0.1, ID: abc) where the task (actor ID: 1, name=RayWorkerWrapper.__init__, "
            "pid=123, memory used=30.12GB) was running was 61.5GB / 64.0GB (0.961), which exceeds the memory usage "
            "threshold of 0.95.",
        ],
        "host_ram_oom",
    ),
}


# Every place above where a client's text lands, by name: the line (or lines) for a client's text.
CLIENT_FORMATS = {
    **CLIENT_ID_LINES,
    "asgi": lambda p: CLIENT_ASGI.replace("ZZUSERZZ", "x") + p,
    "template": lambda p: preprocess_error("jinja2.exceptions.TemplateError: " + p),
    "request-valueerror": lambda p: preprocess_error("ValueError: " + p),
    "prompt": lambda p: FORMATS[2].format(r=repr(p)),
    "log-error-stack": lambda p: ERROR_STACK.format(p),
    "grammar": lambda p: GRAMMAR.format(p),
    "add-lora": lambda p: add_lora_failure("a\n" + p, "/adapters/a"),
    "add-lora-runtime-error": lambda p: add_lora_failure("a\nRuntimeError: " + p, "/adapters/a"),
    "hub-download": lambda p: hf_download_failure("a\n" + p),
    "anthropic-tool": lambda p: anthropic_tool_removal("a\n" + p),
}
