#!/bin/bash
# Runs ON THE GPU MACHINE (vLLM installed into /root/site, the kit's model in /root/model, the kit in .gpu/kit).
#
# Records a real `vllm serve` log the way a user's server writes it, under the kit's ballast: the ballast leaves
# FREE bytes free, `vllm serve` starts with MAX_NUM_BATCHED_TOKENS, then 64 concurrent completions of 6,000 prompt
# tokens x 512 output tokens arrive (the kit's `preempt` workload, through the OpenAI API). The log starts with
# the capture harness's header lines (`# cmd:`, `# env:`, `# nvml before start:`, `# ballast:`), as scen.py's do;
# the client's own summary goes to NAME_client.txt. The server and the ballast are stopped by process group, and
# the script waits until NVML shows the memory back.
# Usage: bash tools/gpu/serve_runtime_oom.sh LOGDIR NAME FREE_BYTES MAX_NUM_BATCHED_TOKENS
#        FLAGS='--max-model-len 32768 ...' replaces the engine flags (MAX_NUM_BATCHED_TOKENS is then unused)
set -u
L=$1; N=$2; FREE=$3; MNBT=$4; PORT=8012
mkdir -p "$L"
export PYTHONPATH=/root/site VLLM_LOGGING_LEVEL=INFO VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
nvml() { python3 -c "import pynvml as p, json; p.nvmlInit(); m=p.nvmlDeviceGetMemoryInfo(p.nvmlDeviceGetHandleByIndex(0)); print(json.dumps({'free': m.free, 'total': m.total, 'used': m.used}))"; }
rm -f /tmp/ballast_$N.json
setsid python3 .gpu/kit/ballast.py "$FREE" /tmp/ballast_$N.json > /dev/null 2>&1 &
BAL=$!
for i in $(seq 1 180); do [ -s /tmp/ballast_$N.json ] && break; sleep 0.5; done
sleep 0.3
DEFAULT_FLAGS="--max-model-len 32768 --max-num-seqs 64 --max-num-batched-tokens $MNBT --gpu-memory-utilization 0.02 --kv-cache-memory-bytes 2500000000 --enforce-eager --hf-overrides '{\"max_position_embeddings\":32768}'"
FLAGS=${FLAGS:-$DEFAULT_FLAGS}
C="python3 -m vllm.entrypoints.cli.main serve /root/model $FLAGS --port $PORT"
{
  echo "# scenario $N; cmd: $C"
  echo "# env: {\"VLLM_USE_FLASHINFER_SAMPLER\": \"0\", \"VLLM_LOGGING_LEVEL\": \"INFO\", \"PYTHONUNBUFFERED\": \"1\", \"HF_HUB_OFFLINE\": \"1\"}"
  echo "# nvml before start: $(nvml)"
  echo "# ballast: $(cat /tmp/ballast_$N.json)"
} > "$L/$N.log"
T0=$SECONDS
eval "set -- $FLAGS"        # the flags as words (the JSON of --hf-overrides stays one word)
setsid python3 -m vllm.entrypoints.cli.main serve /root/model "$@" --port $PORT >> "$L/$N.log" 2>&1 &
PID=$!
python3 - $PID $PORT > "$L/${N}_client.txt" 2>&1 <<'PY'
import sys, time, json, os, random, urllib.request, urllib.error
from concurrent.futures import ThreadPoolExecutor
pid, port = int(sys.argv[1]), int(sys.argv[2]); t0 = time.time(); ok = False
while time.time() - t0 < 240:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2); ok = True; break
    except Exception:
        try: os.kill(pid, 0)
        except OSError: break
        time.sleep(1)
print(f"server ready={ok} after {time.time()-t0:.1f}s", flush=True)
def one(i):
    rng = random.Random(i)
    body = {"model": "/root/model", "prompt": [rng.randrange(3, 32000) for _ in range(6000)],
            "max_tokens": 512, "ignore_eos": True, "temperature": 0.8}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=300); d = json.loads(r.read()); return r.status, d["usage"]["completion_tokens"]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:300]
    except Exception as e:
        return -1, repr(e)[:300]
if ok:
    t1 = time.time()
    with ThreadPoolExecutor(64) as ex:
        res = list(ex.map(one, range(64)))
    print(f"64 requests done in {time.time()-t1:.1f}s; statuses={sorted(set(r[0] for r in res))}; "
          f"served={sum(1 for r in res if r[0] == 200)}; errors={[r[1] for r in res if r[0] != 200][:2]}", flush=True)
PY
sleep 3
kill -INT -- -$PID 2>/dev/null; for i in $(seq 1 20); do kill -0 $PID 2>/dev/null || break; sleep 1; done
kill -9 -- -$PID 2>/dev/null; wait $PID 2>/dev/null
kill -9 -- -$BAL 2>/dev/null; wait $BAL 2>/dev/null
for i in $(seq 1 60); do
  used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  [ "${used:-0}" -lt 1024 ] && break; sleep 1
done
echo "== $N: $((SECONDS-T0)) s; $(cat "$L/${N}_client.txt" | tail -1); GPU used after: ${used:-?} MiB"
grep -m3 -E "out of memory|OutOfMemoryError|EngineDeadError" "$L/$N.log" | cut -c1-200
