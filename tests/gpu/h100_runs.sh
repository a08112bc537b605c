#!/usr/bin/env bash
# vLLM 0.25's own memory figures on an H100 80GB (device tool, kind nvidia-h100-x1): the memory model
# was calibrated on an H200 only, so these runs check it on a GPU it was not built on (its total, the
# batch defaults of an 80 GiB card, the activation peak, graphs beside the budget, real refusals).
# Each `vllm serve` (dummy weights) is stopped once it serves or has exited; logs in $OUT/NAME.log,
# one line per run in $OUT/summary.txt. tests/test_memory_h100.py replays them.
#   bash tests/gpu/h100_runs.sh [NAME...]      (default: every run below)
# Needs what sliding_windows.sh needs: vLLM 0.25 in $SITE (tests/gpu/payload.sh) and the model folders
# of tests/gpu/make_models.py in $MODELS.
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
. "$(dirname "$0")/serve_run.sh"
thief() {  # thief GIB: another process holding GIB GiB of GPU 0
  rm -f /tmp/thief-ready
  setsid python3 -c "import os,torch,time; x=torch.empty($1*2**30,dtype=torch.uint8,device='cuda:0'); open('/tmp/thief-ready','w').write(str(os.getpid())); time.sleep(600)" &
  for _ in $(seq 1 120); do [ -s /tmp/thief-ready ] && break; sleep 1; done
  THIEF=$(cat /tmp/thief-ready)
}
unthief() { kill -9 "$THIEF" 2>/dev/null; for _ in $(seq 1 60); do kill -0 "$THIEF" 2>/dev/null || break; sleep 1; done; THIEF=""; idle; }
record_device
ALL="l8-eager l8-graphs l8-kv131k q32-eager q32-095 q72 mistral-eager gemma2-eager l8-thief30"
for name in ${@:-$ALL}; do
  case $name in
    l8-eager) run l8-eager llama-3.1-8b --max-model-len 8192 --enforce-eager ;;
    l8-graphs) run l8-graphs llama-3.1-8b --max-model-len 8192 ;;
    l8-kv131k) run l8-kv131k llama-3.1-8b --max-model-len 131072 --gpu-memory-utilization 0.3 --enforce-eager ;;
    q32-eager) run q32-eager qwen2.5-32b --max-model-len 8192 --enforce-eager ;;
    q32-095) run q32-095 qwen2.5-32b --max-model-len 8192 --gpu-memory-utilization 0.95 ;;
    q72) run q72 qwen2.5-72b --max-model-len 8192 --enforce-eager ;;
    mistral-eager) run mistral-eager mistral-7b-v0.1 --max-model-len 32768 --enforce-eager ;;
    gemma2-eager) run gemma2-eager gemma-2-2b --max-model-len 8192 --enforce-eager ;;
    l8-thief30) thief 30; run l8-thief30 llama-3.1-8b --max-model-len 8192 --enforce-eager; unthief ;;
    *) echo "unknown run $name" >&2 ;;
  esac
done
