#!/usr/bin/env bash
# vLLM 0.25's own memory figures for architectures the memory model was not fitted to (device tool, one
# H200 or H100): the MLP forms of model_layers.mlp_of (two matrices 4 x hidden wide: GPT-2, GPT-J,
# GPTBigCode with one KV head, GPT-NeoX; StarCoder2's), and a --max-model-len above the model's positions.
# Each `vllm serve` (dummy weights) is stopped once it serves or has exited; logs in $OUT/NAME.log, one
# line per run in $OUT/summary.txt. tests/test_memory_unseen_gpu.py replays them.
#   bash tests/gpu/unseen_runs.sh [NAME...]      (default: every run below)
# Needs vLLM 0.25 in $SITE (tests/gpu/payload.sh) and the model folders of
# `tests/gpu/make_models.py DIR gpt2 gpt-j-6b santacoder-gpt-bigcode redpajama-incite-3b starcoder2-7b phi-4-mini` in $MODELS.
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
. "$(dirname "$0")/serve_run.sh"
record_device
ALL="gpt2 gpt2-4096 gptj santacoder redpajama starcoder2 phi4mini"
for name in ${@:-$ALL}; do
  case $name in
    gpt2) run gpt2 gpt2 --max-model-len 1024 --enforce-eager ;;
    gpt2-4096) run gpt2-4096 gpt2 --max-model-len 4096 --enforce-eager ;;  # (n_positions is 1024)
    gptj) run gptj gpt-j-6b --max-model-len 2048 --enforce-eager ;;
    santacoder) run santacoder santacoder-gpt-bigcode --max-model-len 2048 --enforce-eager ;;
    redpajama) run redpajama redpajama-incite-3b --max-model-len 2048 --enforce-eager ;;
    starcoder2) run starcoder2 starcoder2-7b --max-model-len 16384 --enforce-eager ;;
    phi4mini) run phi4mini phi-4-mini --max-model-len 32768 --enforce-eager ;;
    *) echo "unknown run $name" >&2 ;;
  esac
done
