# `vllm serve` runs for the device scripts (sourced after vllm_env.sh): run NAME MODEL FLAGS... starts one
# server on dummy weights in its own session, stops it once it serves or has exited, writes $OUT/NAME.log and
# one line "NAME: outcome: model flags" to $OUT/summary.txt (what the replay tests read), then waits for an idle GPU.
idle() {  # wait until no process holds GPU memory
  for _ in $(seq 1 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
    [ "${used:-0}" -lt 1000 ] && return 0; sleep 2
  done; echo "GPU still busy: ${used} MiB"
}
RUNNING=""
stop() {  # stop the run's session (setsid): the server and every process it started, its engine core too
  [ -n "$RUNNING" ] || return 0
  pkill -TERM -s "$RUNNING" 2>/dev/null; sleep 3; pkill -KILL -s "$RUNNING" 2>/dev/null
  wait "$RUNNING" 2>/dev/null; RUNNING=""
}
# a run in its own session outlives this script (the device call's time limit): stop it on the way out
trap 'stop; [ -n "${THIEF:-}" ] && kill -9 "$THIEF" 2>/dev/null' EXIT  # (THIEF: a run script's other process)
trap 'exit 1' INT TERM
run() {  # run NAME MODEL FLAGS...: one `vllm serve`, stopped once it serves
  local name=$1 model=$2 t0=$SECONDS; shift 2
  local log="$OUT/$name.log"
  setsid vllm serve "$MODELS/$model" --load-format dummy --host 127.0.0.1 --port 8015 "$@" > "$log" 2>&1 &
  local pid=$! state=""
  RUNNING=$pid
  for _ in $(seq 1 300); do
    grep -q "Application startup complete" "$log" && { state=started; break; }
    kill -0 $pid 2>/dev/null || { wait $pid; state="exit $?"; break; }
    sleep 1
  done
  [ -n "$state" ] || state=timeout
  # (the whole session, not only the process group: an engine core that outlived its server held 64.6 GiB
  # into the next starts; never every GPU process: on a shared host those are others', and in a container
  # nvidia-smi's PIDs are the host's)
  stop
  echo "$name: $state: $model $*" | tee -a "$OUT/summary.txt"; echo "($name took $((SECONDS - t0)) s)"
  idle
}
record_device() {  # the GPU, its driver and CUDA's own total, once per $OUT (the replays read device.txt)
  [ -s "$OUT/device.txt" ] && return 0
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
  python3 -c 'import torch; f, t = torch.cuda.mem_get_info(); print(f"cuda total {t} bytes = {t / 2**30:.2f} GiB, free {f / 2**30:.2f} GiB; torch {torch.__version__}")' | tee -a "$OUT/device.txt"
}
