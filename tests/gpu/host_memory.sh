#!/usr/bin/env bash
# Host memory vLLM 0.25 holds while it starts, on real weights (device tool, one H100 or H200): what
# --cpu-offload-gb pins in host memory (offload_pinned.py; on the V1 runner, since 0.22-0.27's V2 runner
# ignores the flag), and what each vLLM process holds besides. The weights
# are Llama-3.1-8B's shape in random bf16 (safetensors written here, read back by vLLM's default loader).
# A sampler reads every process of the run's session twice a second: RssAnon (what the kernel cannot drop:
# a container's memory limit counts it), RssShmem (where pinned memory shows), Rss, each process's peak and
# the peak of their sum, and the container's cgroup charge (page cache included).
# Writes $OUT/NAME.log, $OUT/NAME.mem (the sampler's peaks) and one line a run in $OUT/summary.txt.
#   bash tests/gpu/host_memory.sh [NAME...]     (default: every run below)
# Needs vLLM 0.25 in $SITE (tests/gpu/payload.sh) and `tests/gpu/make_models.py DIR llama-3.1-8b` in $MODELS.
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
. "$(dirname "$0")/serve_run.sh"
record_device
W=$MODELS/${MODEL:-llama-3.1-8b}  # (MODEL=qwen2.5-7b: a layer whose MLP blocks pin nearly twice themselves)
TAG=${MODEL:+$MODEL-}  # (its runs named apart)
if ! ls "$W"/*.safetensors > /dev/null 2>&1; then  # random weights of the config's shape, four shards
  python3 - "$W" <<'EOF'
import json, sys, torch
from safetensors.torch import save_file
root = sys.argv[1]; c = json.load(open(f"{root}/config.json"))
h, i, v, n = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
bias = c.get("model_type") == "qwen2" or c.get("attention_bias", False)  # (Qwen2's q, k and v carry biases)
shapes = {"model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,)}
for L in range(n):
    p = f"model.layers.{L}."
    shapes |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
               p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
               p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
               p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    if bias:
        shapes |= {p + "self_attn.q_proj.bias": (h,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)}
names = list(shapes)
for k in range(4):
    part = {m: (torch.randn(*shapes[m], dtype=torch.bfloat16) * 0.02) for m in names[k::4]}
    save_file(part, f"{root}/model-{k:05d}-of-00004.safetensors", metadata={"format": "pt"})
print("weights written")
EOF
fi
sample() {  # sample SID FILE: peaks of RssAnon and Rss (kB) of every process of the session, until it ends
  local sid=$1 file=$2
  python3 - "$sid" "$file" <<'EOF' &
import os, sys, time
sid, out = int(sys.argv[1]), sys.argv[2]
peak_anon = peak_rss = peak_shmem = peak_cg = 0; per = {}
def cgroup_bytes():  # the container's charge (pinned host memory counts whatever the process maps it as)
    try:
        rel = open("/proc/self/cgroup").read().split("::", 1)[1].strip()
        return int(open(f"/sys/fs/cgroup{rel}/memory.current").read())
    except (OSError, IndexError, ValueError):
        return 0
def field(status, name):
    for line in status:
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0
while True:
    anon = rss = shmem = 0; alive = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getsid(int(pid)) != sid:
                continue
            status = open(f"/proc/{pid}/status").read().splitlines()
            comm = open(f"/proc/{pid}/comm").read().strip()
        except (OSError, ProcessLookupError):
            continue
        alive += 1
        a, r = field(status, "RssAnon"), field(status, "VmRSS")
        anon += a; rss += r; shmem += field(status, "RssShmem")
        key = f"{comm}[{pid}]"
        per[key] = max(per.get(key, 0), a)
    peak_anon, peak_rss = max(peak_anon, anon), max(peak_rss, rss)
    peak_shmem, peak_cg = max(peak_shmem, shmem), max(peak_cg, cgroup_bytes())
    with open(out, "w") as f:
        f.write(f"peak RssAnon sum {peak_anon / 2**20:.2f} GiB, peak Rss sum {peak_rss / 2**20:.2f} GiB, "
                f"peak RssShmem sum {peak_shmem / 2**20:.2f} GiB, peak cgroup {peak_cg / 2**30:.2f} GiB\n")
        for key, a in sorted(per.items(), key=lambda kv: -kv[1])[:8]:
            f.write(f"  {key}: RssAnon peak {a / 2**20:.2f} GiB\n")
    if not alive:
        break
    time.sleep(0.5)
EOF
}
memrun() {  # memrun NAME FLAGS...: one `vllm serve` on the random weights, sampled until stopped
  local name=$TAG$1 t0=$SECONDS; shift
  local log="$OUT/$name.log"
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null  # (a cold page cache where allowed)
  setsid vllm serve "$W" --host 127.0.0.1 --port 8015 --max-model-len 4096 --enforce-eager \
    --gpu-memory-utilization 0.5 "$@" > "$log" 2>&1 &
  local pid=$! state=""
  RUNNING=$pid
  sleep 0.2; sample "$(ps -o sid= -p $pid | tr -d ' ')" "$OUT/$name.mem"
  for _ in $(seq 1 300); do
    grep -q "Application startup complete" "$log" && { state=started; break; }
    kill -0 $pid 2>/dev/null || { wait $pid; state="exit $?"; break; }
    sleep 1
  done
  [ -n "$state" ] || state=timeout
  sleep 3  # (serving, settled)
  stop; sleep 1
  echo "$name: $state: $* :: $(head -1 "$OUT/$name.mem" 2>/dev/null)" | tee -a "$OUT/summary.txt"
  grep -hoE "Model loading took [0-9.]+ GiB|Total CPU offloaded parameters: [0-9.]+ GiB|Available KV cache memory: [0-9.]+ GiB|using the V1 model runner instead" "$log" \
    | sed "s/^/  $name: /" | tee -a "$OUT/summary.txt"
  cat "$OUT/$name.mem" 2>/dev/null; echo "($name took $((SECONDS - t0)) s)"
  idle
}
# The V1 runner installs the offloader (uva.py pins each offloaded parameter; torch's pinned allocator rounds each
# block up to a power of two): --enable-prompt-embeds puts the model there in 0.22-0.27 (no effect on memory else)
for name in ${@:-base offload4 offload8 mp v1base v1offload4 v1offload8}; do
  case $name in
    base) memrun base ;;
    offload4) memrun offload4 --cpu-offload-gb 4 ;;
    offload8) memrun offload8 --cpu-offload-gb 8 ;;
    mp) memrun mp --distributed-executor-backend mp ;;  # (a worker process of its own, as each rank of a split)
    v1base) memrun v1base --enable-prompt-embeds ;;
    v1offload4) memrun v1offload4 --enable-prompt-embeds --cpu-offload-gb 4 ;;
    v1offload8) memrun v1offload8 --enable-prompt-embeds --cpu-offload-gb 8 ;;
    *) echo "unknown run $name" >&2 ;;
  esac
done
