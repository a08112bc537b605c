#!/usr/bin/env bash
# Real vLLM 0.25 failures on the H200 machine (device tool), each a whole log as an operator reads
# it, for the corpus (tests/corpus/, source_kind local-run-h200): the cause is known by construction.
#   bash tests/gpu/failure_logs.sh SCENARIO...     (scenarios below; logs in $OUT/NAME.log)
#   JSON_LOGS=1 bash tests/gpu/failure_logs.sh ... (vLLM logs JSON records, as vLLM 0.32's
#   --logging-config.formatter json writes them, through VLLM_LOGGING_CONFIG_PATH; logs in $OUT/NAME-json.log)
#   CUSTOM_LOGS=1 bash tests/gpu/failure_logs.sh ... (vLLM's loggers under a Python logging format of the
#   operator's own, `%(asctime)s - %(name)s - %(levelname)s - %(message)s`; logs in $OUT/NAME-custom.log)
# Needs what tests/gpu/heal_runs.sh needs: vLLM 0.25 in $SITE (tests/gpu/payload.sh builds it, no network needed there) and the model folders of
# tests/gpu/make_models.py in $MODELS. Plain `vllm serve`, no supervisor: the log is vLLM's alone.
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
L8=$MODELS/llama-3.1-8b
PORT=8013
SUFFIX=""
if [ "${JSON_LOGS:-0}" = 1 ]; then  # vLLM 0.32's json formatter (vllm/logging_utils/formatter.py JSON_FORMAT)
  SUFFIX=-json
  export VLLM_LOGGING_CONFIG_PATH=/tmp/vllm-json-logging.json
  cat > "$VLLM_LOGGING_CONFIG_PATH" <<'JSON'
{"version": 1, "disable_existing_loggers": false,
 "formatters": {"json": {"class": "pythonjsonlogger.json.JsonFormatter",
   "format": "%(asctime)s %(levelname)s %(name)s %(processName)s %(process)d %(message)s"}},
 "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "json", "level": "INFO", "stream": "ext://sys.stdout"}},
 "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": false}}}
JSON
fi

if [ "${CUSTOM_LOGS:-0}" = 1 ]; then  # a logging format of the operator's own (diagnosis/log_format.py)
  SUFFIX=-custom
  export VLLM_LOGGING_CONFIG_PATH=/tmp/vllm-custom-logging.json
  cat > "$VLLM_LOGGING_CONFIG_PATH" <<'JSON'
{"version": 1, "disable_existing_loggers": false,
 "formatters": {"plain": {"format": "%(asctime)s - %(name)s - %(levelname)s - %(message)s"}},
 "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "plain", "level": "INFO", "stream": "ext://sys.stdout"}},
 "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": false}}}
JSON
fi

idle() {  # wait until no process holds GPU memory
  for _ in $(seq 1 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
    [ "${used:-0}" -lt 1000 ] && return 0; sleep 2
  done; echo "GPU still busy: ${used} MiB"
}
run() {  # run NAME SECONDS ARGS...: one `vllm serve`, its output in $OUT/NAME$SUFFIX.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" vllm serve "$@" --host 127.0.0.1 --port $PORT > "$OUT/$name$SUFFIX.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s: vllm serve $*" | tee -a "$OUT/summary.txt"
  idle
}
healthy() {  # wait for /health, at most $1 seconds
  for _ in $(seq 1 "$1"); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0; sleep 1
  done; return 1
}
for scenario in "$@"; do
  case $scenario in
    maxlen)  # a context longer than the model's own: vLLM refuses the config (not memory)
      run maxlen 240 "$L8" --load-format dummy --max-model-len 1048576 ;;
    missing)  # a model folder that does not exist (not memory)
      run missing 240 "$MODELS/no-such-model" ;;
    quant)  # a quantization the checkpoint does not have (not memory)
      run quant 240 "$L8" --load-format dummy --quantization awq ;;
    tp3)  # more tensor-parallel ranks than GPUs (not memory)
      run tp3 300 "$L8" --load-format dummy --tensor-parallel-size 3 ;;
    port)  # the port is taken (not memory)
      python3 -m http.server $PORT --bind 127.0.0.1 > /dev/null 2>&1 & BUSY=$!; sleep 2
      run port 300 "$L8" --load-format dummy --max-model-len 8192 --enforce-eager
      kill $BUSY ;;
    badflag)  # a misspelt flag: argparse refuses the command line (not memory)
      run badflag 120 "$L8" --load-format dummy --max-modle-len 4096 ;;
    batched)  # a batch budget below the context with chunked prefill off (not memory)
      run batched 240 "$L8" --load-format dummy --max-model-len 8192 --max-num-batched-tokens 1024 \
        --no-enable-chunked-prefill --enforce-eager ;;
    hostram)  # a 1.5 GiB memory cgroup, as a container limit: the kernel kills a vLLM process (host_ram_oom)
      if mkdir -p /sys/fs/cgroup/vllm-hostram 2>/dev/null && echo 1536M > /sys/fs/cgroup/vllm-hostram/memory.max \
        && echo 0 > /sys/fs/cgroup/vllm-hostram/memory.swap.max; then
        t0=$SECONDS
        sh -c 'echo $$ > /sys/fs/cgroup/vllm-hostram/cgroup.procs && exec timeout 150 vllm serve "$@"' hostram "$L8" \
          --load-format dummy --max-model-len 8192 --enforce-eager --host 127.0.0.1 --port $PORT > "$OUT/hostram$SUFFIX.log" 2>&1
        echo "hostram: exit $? in $((SECONDS - t0)) s; $(grep oom_kill /sys/fs/cgroup/vllm-hostram/memory.events)" \
          | tee -a "$OUT/summary.txt"
        idle
      else
        echo "hostram: no writable cgroup v2 memory controller here" | tee -a "$OUT/summary.txt"
      fi ;;
    profile)  # a dummy batch of 2M tokens: the start-up profiling forward runs out (profiling_oom)
      run profile 420 "$L8" --load-format dummy --max-model-len 8192 --max-num-batched-tokens 2097152 \
        --max-num-seqs 256 --enforce-eager ;;
    runtime)  # started and serving, then another process takes the free memory: the next batch runs out
      t0=$SECONDS
      vllm serve "$L8" --load-format dummy --max-model-len 8192 --gpu-memory-utilization 0.5 --enforce-eager \
        --host 127.0.0.1 --port $PORT > "$OUT/runtime$SUFFIX.log" 2>&1 & SERVER=$!
      if healthy 400; then
        rm -f /tmp/taker-ready
        setsid python3 -c "import torch,time; free=torch.cuda.mem_get_info()[0]; x=torch.empty(free-64*2**20,dtype=torch.uint8,device='cuda:0'); open('/tmp/taker-ready','w').write('1'); time.sleep(600)" &
        TAKER=$!; for _ in $(seq 1 60); do [ -f /tmp/taker-ready ] && break; sleep 1; done
        python3 - "$PORT" "$L8" <<'PY'
import json, sys, threading, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v1/completions"
def ask():  # 7000 prompt tokens with their logprobs: memory the start-up profile never measured
    body = json.dumps({"model": sys.argv[2], "prompt": [100] * 7000, "max_tokens": 16, "prompt_logprobs": 20, "logprobs": 20, "n": 4}).encode()
    try:
        urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=120)
    except Exception as exc:  # the server dies under it: that is the point
        print("request:", type(exc).__name__)
threads = [threading.Thread(target=ask) for _ in range(64)]
[t.start() for t in threads]; [t.join() for t in threads]
PY
        sleep 5; kill -9 -- -$TAKER 2>/dev/null
      fi
      kill $SERVER 2>/dev/null; wait $SERVER
      echo "runtime: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"; idle ;;
    capture)  # graphs on at a utilization that leaves them no room: CUDA-graph capture runs out (cudagraph_capture_oom)
      run capture 420 "$L8" --load-format dummy --max-model-len 8192 --gpu-memory-utilization 0.995 ;;
    sampler)  # 131,072 sequences: the start-up sampler warm-up asks seqs x vocab x 4 bytes (profiling_oom)
      run sampler 420 "$L8" --load-format dummy --max-model-len 8192 --max-num-seqs 131072 \
        --max-num-batched-tokens 131072 --enforce-eager ;;
    sampler64k)  # 65,536 sequences: the V2 runner's kernel warm-up samples them and runs out (profiling_oom)
      run sampler64k 420 "$L8" --load-format dummy --max-model-len 8192 --max-num-seqs 65536 \
        --max-num-batched-tokens 65536 --enforce-eager ;;
    weights72)  # a 72B bf16 model on one H200: its 135 GiB of weights leave no room for a KV cache (weights_load_oom)
      run weights72 600 "$MODELS/qwen2.5-72b" --load-format dummy --max-model-len 8192 --enforce-eager ;;
    kvlen)  # a 131,072-token context in a 0.2 share of the GPU: one request's KV cache does not fit (kv_cache_insufficient)
      run kvlen 300 "$L8" --load-format dummy --max-model-len 131072 --gpu-memory-utilization 0.2 --enforce-eager ;;
    freemem)  # another process holds 60 GiB before the start: less is free than 0.9 asks (gpu_util_exceeds_free)
      rm -f /tmp/holder-ready
      setsid python3 -c "import torch,time; x=torch.empty(60*2**30,dtype=torch.uint8,device='cuda:0'); open('/tmp/holder-ready','w').write('1'); time.sleep(600)" &
      HOLDER=$!; for _ in $(seq 1 60); do [ -f /tmp/holder-ready ] && break; sleep 1; done
      t0=$SECONDS
      timeout 300 vllm serve "$L8" --load-format dummy --max-model-len 8192 --enforce-eager --host 127.0.0.1 \
        --port $PORT > "$OUT/freemem$SUFFIX.log" 2>&1
      echo "freemem: exit $? in $((SECONDS - t0)) s, another process holding 60 GiB" | tee -a "$OUT/summary.txt"
      kill -9 -- -$HOLDER 2>/dev/null; idle ;;
    *) echo "unknown scenario $scenario" ;;
  esac
done
