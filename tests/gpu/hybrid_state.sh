#!/usr/bin/env bash
# vLLM 0.25's own sizing of a Mamba hybrid's cache on the H200 machine (device tool), with Nemotron-H
# 8B's shapes (tests/fixtures/configs/nemotron-h-8b.json: 52 layers, 4 attending, 24 Mamba-2, 24 MLP;
# dense, since the payload carries no MoE kernels). Each run gives vLLM a fixed cache
# (--kv-cache-memory-bytes):
#   kv-8k:       an 8,192-token context too long for 100 MiB: vLLM prints what one request needs and
#                the longest that fits (memory.KvNeed counts only the 4 attending layers);
#   blocks-1024: the same context in 1 GiB, CUDA graphs on, 1,024 sequences: vLLM refuses, one state
#                block per sequence, and prints the blocks it has.
#   bash tests/gpu/hybrid_state.sh        (logs in $OUT/hybrid-NAME.log)
#   MODEL=qwen3.5-0.8b bash tests/gpu/hybrid_state.sh [kv-8k] [blocks-1024]
# Needs vLLM 0.25 in $SITE (tests/gpu/payload.sh) and the model folder of tests/gpu/make_models.py in $MODELS.
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
# The same two runs with Qwen3.5-0.8B's shapes (MODEL=qwen3.5-0.8b, logs hybrid-MODEL-NAME.log):
# 6 attending layers, 18 Gated DeltaNet layers (a float32 state).
MODEL=${MODEL:-nemotron-h-8b}
WANTED=" ${*:-kv-8k blocks-1024} "  # the runs asked for (by name, without the prefix)
run() {  # run NAME KV_BYTES ARGS...: one `vllm serve` that stops at a start-up check
  local name=$1 kv=$2 t0=$SECONDS
  shift 2
  case "$WANTED" in *" ${name#"$prefix"} "*) ;; *) return 0 ;; esac
  timeout 420 vllm serve "$MODELS/$MODEL" --load-format dummy --kv-cache-memory-bytes "$kv" \
    --max-model-len 8192 --host 127.0.0.1 --port 8015 $EXTRA "$@" > "$OUT/hybrid-$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s: kv $kv $*" | tee -a "$OUT/summary.txt"
}
prefix=$([ "$MODEL" = nemotron-h-8b ] || echo "$MODEL-")
EXTRA=$([ "$MODEL" = qwen3.5-0.8b ] && echo --language-model-only)  # (its vision tower unused)
run "${prefix}kv-8k" 104857600 --enforce-eager --max-num-seqs 16
run "${prefix}blocks-1024" 1073741824 --max-num-seqs 1024
