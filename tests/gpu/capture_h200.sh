#!/usr/bin/env bash
# Run on the project's H200 machine (device tool): records the NVML probe with a second
# process holding ~60 GiB, and a real torch.OutOfMemoryError, as test fixtures.
# Output goes to $OUT; copy it into tests/fixtures/gpu/.
set -u
export PYTHONPATH=$PWD/operator PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee $OUT/nvidia-smi.csv
python3 -c 'import torch, pynvml; print("torch", torch.__version__)'
rm -f /tmp/holder-ready  # a warm machine keeps /tmp between runs
# 1. a second process holds ~60 GiB
python3 - <<'PY' &
import time, torch
x = torch.empty(60 * 2**30, dtype=torch.uint8, device="cuda")
open("/tmp/holder-ready", "w").write("1")
time.sleep(300)
PY
HOLDER=$!
for i in $(seq 1 120); do [ -f /tmp/holder-ready ] && break; sleep 1; done
echo "holder pid $HOLDER"
python3 - <<PY | tee $OUT/probe-second-process-60g.txt
import json, os
from vllm_autoheal.gpu_probe import snapshot, describe, compact
s = snapshot(own_pids=[os.getpid()])
print(describe(s))
json.dump({"holder_pid": $HOLDER, "snapshot": {"gpus": [g.__dict__ for g in s.gpus],
           "processes": [p.__dict__ for p in s.processes], "own_pids": s.own_pids, "error": s.error},
           "compact": compact(s)}, open("$OUT/probe-second-process-60g.json", "w"), indent=1)
PY
# 2. a real CUDA OOM, uncaught, under the launcher: the real traceback and termination message
cat > /tmp/oom.py <<'PY'
import torch
keep = torch.empty(70 * 2**30, dtype=torch.uint8, device="cuda")   # with the holder: ~130 GiB in use
more = torch.empty(20 * 2**30, dtype=torch.uint8, device="cuda")   # does not fit
PY
python3 -m vllm_autoheal.launcher --termination-path $OUT/termination-message.json -- python3 /tmp/oom.py \
  > $OUT/torch-oom.log 2>&1
echo "launcher exit $?"
python3 -m json.tool $OUT/termination-message.json
python3 - <<PY
from vllm_autoheal.diagnosis import classify, Signals
d = classify(Signals(log=open("$OUT/torch-oom.log").read()))
print("classified on the H200:", d.cause, d.phase, d.subtype, d.numbers)
PY
kill $HOLDER; wait 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv
