#!/usr/bin/env bash
# What --enable-lora's adapter slots take on the GPU, measured (device tool, one H100 or H200): vLLM 0.25 starts of
# Llama-3.1-8B and Qwen2.5-7B (dummy weights, eager) without LoRA and with 1 slot of rank 16 (vLLM's defaults), 4 of
# rank 64 and 8 of rank 256. vLLM allocates the slots inside "Model loading took" (lora_slots.py); the difference
# of that figure, and of "Available KV cache memory", from the plain start is what the memory model must weigh.
# Logs in $OUT/NAME.log, one line per run in $OUT/summary.txt (a replay test is to be written from them).
# Predicted before any run (lora_slots.lora_slots_gib, session 43; not run yet: no device machine could be
# started that session): Llama-3.1-8B 1x16 0.078 GiB, 4x64 1.250, 8x256 10.000; Qwen2.5-7B 4x64 1.203,
# 8x256 9.625 - the rise of "Model loading took" over the plain start. Embedding and lm_head slots are not
# counted (a known gap): a rise beyond these figures measures them.
#   bash tests/gpu/lora_runs.sh [NAME...]      (default: every run below)
# Needs vLLM 0.25 in $SITE (tests/gpu/payload.sh) and `tests/gpu/make_models.py DIR llama-3.1-8b qwen2.5-7b` in $MODELS.
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
. "$(dirname "$0")/serve_run.sh"
record_device
ALL="l8-base l8-lora-1x16 l8-lora-4x64 l8-lora-8x256 q7-base q7-lora-4x64 q7-lora-8x256"
BASE="--max-model-len 8192 --enforce-eager"
for name in ${@:-$ALL}; do
  case $name in
    l8-base) run l8-base llama-3.1-8b $BASE ;;
    l8-lora-1x16) run l8-lora-1x16 llama-3.1-8b $BASE --enable-lora ;;
    l8-lora-4x64) run l8-lora-4x64 llama-3.1-8b $BASE --enable-lora --max-loras 4 --max-lora-rank 64 ;;
    l8-lora-8x256) run l8-lora-8x256 llama-3.1-8b $BASE --enable-lora --max-loras 8 --max-lora-rank 256 ;;
    q7-base) run q7-base qwen2.5-7b $BASE ;;
    q7-lora-4x64) run q7-lora-4x64 qwen2.5-7b $BASE --enable-lora --max-loras 4 --max-lora-rank 64 ;;
    q7-lora-8x256) run q7-lora-8x256 qwen2.5-7b $BASE --enable-lora --max-loras 8 --max-lora-rank 256 ;;
    *) echo "unknown run $name" >&2 ;;
  esac
done
