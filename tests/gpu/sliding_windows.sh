#!/usr/bin/env bash
# vLLM 0.25's own sizing of a sliding-window model's KV cache on the H200 machine (device tool): each
# run gives vLLM a fixed KV cache (--kv-cache-memory-bytes) too small for one request of the model's
# context, so it stops at its check and prints what one request needs and the longest that fits.
# memory.KvNeed must say the same (tests/test_memory_windows.py replays the logs).
#   bash tests/gpu/sliding_windows.sh        (logs in $OUT/window-NAME.log)
# Needs what failure_logs.sh needs: vLLM 0.25 in $SITE (tests/gpu/payload.sh) and the model folders of
# tests/gpu/make_models.py in $MODELS (dummy weights: only the config and a tokenizer).
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
MIB=1048576
run() {  # run NAME MODEL KV_MIB BATCHED: one `vllm serve` that stops at the KV check
  local name=$1 model=$2 kv=$(( $3 * MIB )) batched=$4 t0=$SECONDS
  timeout 300 vllm serve "$MODELS/$model" --load-format dummy --enforce-eager --max-num-seqs 16 \
    --max-num-batched-tokens "$batched" --kv-cache-memory-bytes "$kv" --host 127.0.0.1 --port 8014 \
    > "$OUT/window-$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s: $model kv ${3} MiB batched $batched" | tee -a "$OUT/summary.txt"
}
run mistral-400 mistral-7b-v0.1 400 2048
run gemma2-500 gemma-2-2b 500 2048
run gemma3-150 gemma-3-1b 150 2048
run gemma3-150-b8192 gemma-3-1b 150 8192
run gemma3-100 gemma-3-1b 100 2048
