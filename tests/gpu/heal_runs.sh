#!/usr/bin/env bash
# Real heals on the H200 machine(s) (device tool): `vllm-autoheal serve` supervising real vLLM 0.25
# (`vllm serve`, dummy weights, so memory is real) through the starts of issues 14 and 16.
#   bash tests/gpu/heal_runs.sh SCENARIO...     (scenarios below; output under $OUT)
# Needs: vLLM 0.25 and its dependencies installed into $SITE (pip install --target $SITE vllm==0.25.0), the model folders
# that tests/gpu/make_models.py builds in $MODELS, and this repository's operator/ on PYTHONPATH.
set -u
CODE=${CODE:-$PWD}
. "$(dirname "$0")/vllm_env.sh"
L8=$MODELS/llama-3.1-8b; Q72=$MODELS/qwen2.5-72b

idle() {  # wait until no process holds GPU memory
  for _ in $(seq 1 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
    [ "${used:-0}" -lt 1000 ] && return 0; sleep 2
  done; echo "GPU still busy: ${used} MiB"
}
thief() {  # thief GIB: another process holding GIB GiB of GPU 0, in its own session
  rm -f /tmp/thief-ready
  setsid python3 -c "import os,torch,time; x=torch.empty($1*2**30,dtype=torch.uint8,device='cuda:0'); open('/tmp/thief-ready','w').write(str(os.getpid())); time.sleep(900)" &
  for _ in $(seq 1 120); do [ -s /tmp/thief-ready ] && break; sleep 1; done
  THIEF=$(cat /tmp/thief-ready)
}
unthief() {  # kill the thief by its own pid and wait until it is gone (a group kill once left 30 GiB held
  # into the next scenarios: session 28's thief ran beside 130 GiB)
  kill -9 "$THIEF" 2>/dev/null; for _ in $(seq 1 60); do kill -0 "$THIEF" 2>/dev/null || break; sleep 1; done; idle
}
serve() {  # serve NAME MODEL FLAGS...: one supervised run, its output in $OUT/NAME.log
  local name=$1 model=$2; shift 2
  local t0=$SECONDS
  timeout 900 python3 -m vllm_autoheal serve "$model" --python python3 --port 8011 --once --fresh \
    --history "$OUT/history.jsonl" --startup-timeout 600 --load-format dummy "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s; $(grep -c '^\[vllm-autoheal\] healed' "$OUT/$name.log") heal(s)" \
    | tee -a "$OUT/summary.txt"
  grep '^\[vllm-autoheal\]' "$OUT/$name.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
  idle
}
for scenario in "$@"; do
  case $scenario in
    tp2-launcher)  # the launcher's real termination message for 72B bf16 on one GPU
      t0=$SECONDS
      CUDA_VISIBLE_DEVICES=0 timeout 600 python3 -m vllm_autoheal.launcher --termination-path "$OUT/tm-72b-tp1.json" -- \
        vllm serve "$Q72" --load-format dummy --port 8012 > "$OUT/launcher-72b-tp1.log" 2>&1
      echo "tp2-launcher: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"; idle ;;
    tp2)  # 72B bf16 does not fit one H200: heal to tensor parallelism 2 (issue 16)
      serve tp2 "$Q72" --max-tensor-parallel-size 2 ;;
    tp2-share)  # the same at utilization 0.5: the split's weights fill that share; TP 2 with the least share that fits
      # (session 27; not yet run on the GPU: no device was lent that session)
      serve tp2-share "$Q72" --gpu-memory-utilization 0.5 --max-model-len 32768 --max-tensor-parallel-size 2 ;;
    tp1-giveup)  # the same on one GPU without the bound: a clear give-up naming what would fit (issue 14)
      CUDA_VISIBLE_DEVICES=0 serve tp1-giveup "$Q72" ;;
    kv)  # 8B, utilization 0.2, context 131072: the KV cache is too small (issue 14, row 1)
      CUDA_VISIBLE_DEVICES=0 serve kv "$L8" --gpu-memory-utilization 0.2 --max-model-len 131072 ;;
    thief)  # default utilization with 100 GiB held by another process (row 2)
      thief 100; CUDA_VISIBLE_DEVICES=0 serve thief "$L8" --max-model-len 8192
      unthief ;;
    kv-thief)  # the kv start beside a process holding 107 GiB: a raise to 0.25 is more than is free (session 28)
      thief 107; CUDA_VISIBLE_DEVICES=0 serve kv-thief "$L8" --gpu-memory-utilization 0.2 --max-model-len 131072
      unthief ;;
    capture-thief)  # 30 GiB held, a share that leaves about 0.4 GiB beside it for the graphs (session 28)
      thief 30; CUDA_VISIBLE_DEVICES=0 serve capture-thief "$L8" --gpu-memory-utilization 0.775 --max-model-len 8192
      unthief ;;
    capture)  # utilization 0.995 with CUDA graphs (row 3)
      CUDA_VISIBLE_DEVICES=0 serve capture "$L8" --gpu-memory-utilization 0.995 --max-model-len 8192 ;;
    seqs)  # 131072 sequences: the sampler warm-up runs out (row 4)
      CUDA_VISIBLE_DEVICES=0 serve seqs "$L8" --max-num-seqs 131072 --max-num-batched-tokens 131072 --max-model-len 8192 ;;
    quantize-nvfp4)  # Llama-3.1-70B bf16 (141 GB) on one 80 GB card: the weights do not fit; switch to the
      # NVFP4 checkpoint the options name, weighed (float, 4 bits) before the switch, with the context its
      # cache holds in the same restart (session 37)
      L70=$MODELS/llama-3.1-70b
      CUDA_VISIBLE_DEVICES=0 serve quantize-nvfp4 "$L70" --enforce-eager --quantized-fallback "$L70-nvfp4" \
        --quantized-fallback-method compressed-tensors --quantized-fallback-bits 4 --quantized-fallback-weight-type float ;;
    quantize-awq)  # the same with AutoAWQ's 4-bit checkpoint in groups of 128, declared bits and group (session 37)
      L70=$MODELS/llama-3.1-70b
      CUDA_VISIBLE_DEVICES=0 serve quantize-awq "$L70" --enforce-eager --quantized-fallback "$L70-awq4" \
        --quantized-fallback-method awq_marlin --quantized-fallback-bits 4 --quantized-fallback-group-size 128 ;;
    *) echo "unknown scenario $scenario" ;;
  esac
done
nvidia-smi --query-gpu=index,memory.used --format=csv | tee -a "$OUT/summary.txt"
