"""vllm-autoheal: keeps vLLM inference servers alive when they run out of memory."""

__version__ = "0.1.0"
