#!/usr/bin/env bash
# The oomdoctor vLLM plugin on the real engine: vLLM 0.25.1 at $SITE, the gpu-kit model at $MODEL (random Llama,
# max_position_embeddings 4,000,000, KV 65,536 B/token; fixtures/logs/vllm-0.25.1-h200/ORIGIN.md), one H200.
#
# Runs ON THE GPU MACHINE from the repository root. oomdoctor is NOT pip-installed there, so the plugin is activated
# exactly as `pip install oomdoctor` would: a dist-info folder declaring the entry point
# (vllm.general_plugins: oomdoctor = oomdoctor.engines.vllm.plugin:register) is put on PYTHONPATH, and vLLM's own
# load_general_plugins() calls register() in the front end AND in the spawned/forked engine core.
# (`python -c 'import oomdoctor.engines.vllm.plugin as p; p.register(); ...'` activates the same front-end hooks, but a spawned
# engine core — `vllm serve` always spawns — would then run without the plugin and its lines would be missing.)
#
#   bash tools/gpu/plugin_demo.sh demo     [OUT]   (a) + (b) + (c), about 5-7 minutes
#   bash tools/gpu/plugin_demo.sh measure  [OUT]   the ladder for profile long_262k (about 4-6 minutes), to fill (c)
#
# (a) a flagless LLM(model=$MODEL) under a ballast leaving $BALLAST_FREE: fails; the plugin writes the card by itself
# (b) `oomdoctor retest CARD` (its first lever), then `--next` while the failure changed and attempts remain
#     ($MAX_RETESTS, default 2): with a 4,000,000-token window the first lever (utilization) is expected to turn the
#     start-up check failure into a KV-capacity one, and the second (max_model_len) to start and serve
# (c) the same flagless start with OOMDOCTOR_PROFILES: the plugin selects the widest measured profile that fits,
#     fills only the defaulted fields, and the engine serves a request
#
# Profile requirement for (c), from a ladder result (never from arithmetic), one of:
#   LADDER_CARD=/path/card.yaml   a card whose `ladder` section measured long_262k (`measure` prints it)
#   REQ_262K=<bytes> [FAIL_262K=<bytes>] [RECEIPT_262K=<reference>]   the pass point (and fail point) by hand
# With neither, (c) runs with OOMDOCTOR_PROFILE_ALLOW_UNMEASURED=1 on a DECLARED estimate and says so loudly.
#
# Other knobs: SITE=/root/site MODEL=/root/model PY=python3 BALLAST_FREE=25769803776 (24 GiB) GPU=0
#   TOTAL_S=470 (demo: engine timeouts shrink and retests are skipped to stay within it; `measure` is not capped)
# Every process started here runs in its own process group and is killed by group on exit, error or Ctrl-C.
set -u
MODE=${1:-demo}
OUT=${2:-${OUT:-/tmp/oomdoctor-plugin-demo}}
ROOT=$(pwd)
SITE=${SITE:-/root/site}
MODEL=${MODEL:-/root/model}
PY=${PY:-python3}
GPU=${GPU:-0}
BALLAST_FREE=${BALLAST_FREE:-25769803776}
MAX_RETESTS=${MAX_RETESTS:-2}
TOTAL_S=${TOTAL_S:-470}          # the whole run stays under ~8 minutes: steps shrink or are skipped
T0=$SECONDS
left() { echo $((TOTAL_S - (SECONDS - T0))); }
cap() { local want=$1 l; l=$(( $(left) - 25 )); [ "$l" -lt "$want" ] && want=$l; echo "$want"; }
[ -f "$ROOT/oomdoctor/engines/vllm/plugin/__init__.py" ] || { echo "run from the repository root" >&2; exit 2; }
mkdir -p "$OUT" && rm -rf "$OUT/incidents" "$OUT/ladder-incidents" "$OUT/ep"

# ---- the entry point, as pip would install it
EP="$OUT/ep/oomdoctor_plugin_demo-0.0.dist-info"
mkdir -p "$EP"
printf 'Metadata-Version: 2.1\nName: oomdoctor-plugin-demo\nVersion: 0.0\n' > "$EP/METADATA"
printf '[vllm.general_plugins]\noomdoctor = oomdoctor.engines.vllm.plugin:register\n' > "$EP/entry_points.txt"

export PYTHONPATH="$ROOT:$OUT/ep:$SITE" PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=INFO VLLM_USE_FLASHINFER_SAMPLER=0 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1 NCCL_NVLS_ENABLE=0 \
  CUDA_VISIBLE_DEVICES=$GPU OOMDOCTOR_INCIDENTS="$OUT/incidents"
unset OOMDOCTOR_PLUGIN OOMDOCTOR_PROFILES OOMDOCTOR_PROFILE OOMDOCTOR_PROFILE_ALLOW_UNMEASURED OOMDOCTOR_PLUGIN_LOG VLLM_PLUGINS

# ---- process groups: everything started here is ended here
PGIDS=()
forget() { local keep=() g; for g in "${PGIDS[@]:-}"; do [ -n "$g" ] && [ "$g" != "$1" ] && keep+=("$g"); done; PGIDS=(${keep[@]+"${keep[@]}"}); }
cleanup() {
  for g in "${PGIDS[@]:-}"; do
    [ -n "$g" ] || continue
    kill -INT -- "-$g" 2>/dev/null; sleep 2; kill -TERM -- "-$g" 2>/dev/null; sleep 1; kill -KILL -- "-$g" 2>/dev/null
  done
  PGIDS=()
}
trap 'cleanup' EXIT
trap 'echo "interrupted" >&2; cleanup; exit 130' INT TERM

say() { printf '\n=== [%4ds] %s\n' $((SECONDS - T0)) "$*"; }
nvml() { "$PY" -c "import pynvml as p; p.nvmlInit(); m=p.nvmlDeviceGetMemoryInfo(p.nvmlDeviceGetHandleByIndex($GPU)); print(m.free, m.total)"; }
mem_back() {  # wait until at most 2 GiB of the GPU is used (the previous engine and ballast are gone)
  for _ in $(seq 1 90); do
    read -r f t < <(nvml); [ $((t - f)) -lt $((2 << 30)) ] && return 0; sleep 1
  done
  echo "warning: GPU memory not back after 90 s ($(nvml))" >&2
}
start_ballast() {  # $1 = target free bytes
  rm -f "$OUT/ballast.json"
  setsid "$PY" -m oomdoctor.retest.ballast "$1" "$OUT/ballast.json" --index "$GPU" > "$OUT/ballast.log" 2>&1 &
  BALLAST=$!; PGIDS+=("$BALLAST")
  for _ in $(seq 1 120); do [ -f "$OUT/ballast.json" ] && break; kill -0 "$BALLAST" 2>/dev/null || break; sleep 1; done
  [ -f "$OUT/ballast.json" ] || { echo "ballast not ready:"; tail -5 "$OUT/ballast.log"; exit 1; }
  echo "ballast: $(cat "$OUT/ballast.json")"
}
stop_ballast() {
  kill -TERM -- "-$BALLAST" 2>/dev/null; sleep 1; kill -KILL -- "-$BALLAST" 2>/dev/null; wait "$BALLAST" 2>/dev/null
  forget "$BALLAST"; mem_back
}
run_engine() {  # $1 = log, $2 = timeout s, rest = command; in its own group; returns the command's rc
  local log=$1 to=$2; shift 2
  setsid timeout -k 10 "$to" "$@" > "$log" 2>&1 &
  local pid=$!; PGIDS+=("$pid")
  wait "$pid"; local rc=$?
  kill -KILL -- "-$pid" 2>/dev/null; forget "$pid"
  return $rc
}
decisive() {  # the lines that tell the story
  grep -aE "oomdoctor:|Free memory on device|KV cache is needed|max seq len|CUDA out of memory|Engine core initialization failed|OOMDOCTOR_RESULT|OOMDOCTOR_READY|Using max model len|reserved .* for KV Cache|GPU KV cache size" "$1" \
    | sed -E 's/^(.{0,400}).*/\1/' | tail -n "${2:-25}"
}

# ---- preflight
say "preflight: vLLM, oomdoctor's imports, the entry point, the GPU"
"$PY" - <<'PY' || exit 2
import importlib, importlib.metadata as md
import vllm
print("vLLM", vllm.__version__)
for m in ("yaml", "click", "pynvml", "rich"):
    try:
        importlib.import_module(m)
    except ImportError as e:
        print(f"missing {m}: {e}" + ("  (the CLI's tables need it: `oomdoctor retest/ladder` will end with an "
                                     "internal error after recording)" if m == "rich" else ""))
eps = [(e.name, e.value, e.dist.name) for e in md.entry_points(group="vllm.general_plugins")]
print("vllm.general_plugins:", eps)
assert any(v == "oomdoctor.engines.vllm.plugin:register" for _, v, _ in eps), "the entry point is not visible"
PY
echo "NVML free/total: $(nvml)"
[ -d "$MODEL" ] || { echo "no model at $MODEL (build it with the gpu-kit)" >&2; exit 2; }
mem_back

# ---- the profile file for (c)
write_profiles() {  # $1 = file; uses LADDER_CARD / REQ_262K / FAIL_262K / RECEIPT_262K
  "$PY" - "$1" <<'PY'
import json, os, sys, yaml
out = sys.argv[1]
doc = yaml.safe_load(open(os.path.join(os.environ["ROOT_DIR"], "examples/profiles/gpu-kit-llama.yaml")))
p = doc["profiles"]["long_262k"]
card = os.environ.get("LADDER_CARD")
if card:
    lad = (yaml.safe_load(open(card)) or {}).get("ladder") or {}
    p["requires_free_bytes"] = lad.get("pass_free_bytes")
    p["measured"] = {"receipt": os.path.abspath(card)}            # read and verified by oomdoctor.profiles
elif os.environ.get("REQ_262K"):
    p["requires_free_bytes"] = int(float(os.environ["REQ_262K"]))
    p["measured"] = {"receipt": os.environ.get("RECEIPT_262K", "ladder run by the lead (figures copied by hand)"),
                     "pass_free_bytes": int(float(os.environ["REQ_262K"])), "engine_version": "0.25.1",
                     "device": "nvidia-h200"}
    if os.environ.get("FAIL_262K"):
        p["measured"]["fail_free_bytes"] = int(float(os.environ["FAIL_262K"]))
yaml.safe_dump(doc, open(out, "w"), sort_keys=False)
print(open(out).read())
PY
}
export ROOT_DIR="$ROOT"

if [ "$MODE" = measure ]; then
  # The ladder measures the user's flagless path WITH the plugin forcing long_262k, rung by rung (a ballast leaves
  # each rung's free memory). Its pass point is long_262k's requires_free_bytes.
  say "measure: ladder of the flagless start with profile long_262k forced (precision ${PRECISION:-512MiB})"
  unset LADDER_CARD REQ_262K
  write_profiles "$OUT/profiles.yaml" > /dev/null
  rm -f "$OUT/ladder-262k.yaml"
  OOMDOCTOR_PLUGIN=1 OOMDOCTOR_PROFILES="$OUT/profiles.yaml" OOMDOCTOR_PROFILE=long_262k \
  OOMDOCTOR_INCIDENTS="$OUT/ladder-incidents" \
    COLUMNS=200 setsid "$PY" -m oomdoctor ladder --out "$OUT/ladder-262k.yaml" --low "${LOW:-18GiB}" --high "${HIGH:-26GiB}" \
      --precision "${PRECISION:-512MiB}" --timeout 150 --gpu "$GPU" \
      --profile-file "$OUT/profiles.yaml" --profile long_262k \
      -- "$PY" -m oomdoctor.retest.engine_runner "$MODEL" '{}' '{"prompt_tokens": 8, "max_tokens": 16}' \
      > "$OUT/ladder.log" 2>&1 &
  L=$!; PGIDS+=("$L"); wait "$L"; rc=$?; forget "$L"
  tail -n 30 "$OUT/ladder.log"
  "$PY" - "$OUT/ladder-262k.yaml" <<'PY'
import sys, yaml
lad = (yaml.safe_load(open(sys.argv[1])) or {}).get("ladder") or {}
print("ladder status:", lad.get("status"), "| pass_free_bytes:", lad.get("pass_free_bytes"),
      "| fail_free_bytes:", lad.get("fail_free_bytes"), "|", (lad.get("result") or {}).get("message"))
print(f"next: LADDER_CARD={sys.argv[1]} bash tools/gpu/plugin_demo.sh demo")
PY
  say "done (rc $rc: 0 measured; 1 not measured OR the declared estimate is under the measurement) in $((SECONDS - T0)) s"
  exit $rc
fi

# ---- (a) the flagless start fails under the ballast; the plugin writes the card itself
say "(a) flagless LLM(model=$MODEL) with ${BALLAST_FREE} B left free, plugin on (OOMDOCTOR_PLUGIN=1)"
start_ballast "$BALLAST_FREE"
run_engine "$OUT/a.log" "$(cap 240)" env OOMDOCTOR_PLUGIN=1 \
  "$PY" -m oomdoctor.retest.engine_runner "$MODEL" '{}' '{"prompt_tokens": 8, "max_tokens": 16}'
echo "engine rc: $? (a failure is expected)"
stop_ballast
decisive "$OUT/a.log" 20
CARD=$(ls -t "$OUT"/incidents/*.yaml 2>/dev/null | head -1)
[ -n "$CARD" ] || { echo "NO CARD: the plugin did not write one (see $OUT/a.log)"; exit 1; }
echo "card written by the plugin: $CARD"
"$PY" - "$CARD" <<'PY'
import sys
from oomdoctor.card import store as c
d = c.load_dict(sys.argv[1])
w, p = d["workload"], d.get("plugin", {})
print("class:", d["classification"]["class"], "| rule:", d["classification"]["rule"])
print("workload:", w["launcher"], w["model"], w["engine_args"], "| explicit:", w["explicit_args"],
      "| free at start:", w.get("free_at_start_bytes"))
print("log sources:", p.get("log_sources", {}).get("used"), p.get("log_sources", {}).get("child_processes", {}).get("records_by_pid"))
print("lever #1:", d["levers"][0]["id"], d["levers"][0]["change"] if d["levers"] else None)
PY

# ---- (b) retest that card: its first lever, then the next while the failure changes
say "(b) oomdoctor retest (first lever), the plugin off for the re-runs"
n=0; rc=1
while [ $n -lt "$MAX_RETESTS" ]; do
  n=$((n + 1))
  if [ "$(left)" -lt 170 ]; then echo "skipping retest $n: $(left) s left of TOTAL_S=$TOTAL_S (keep time for (c))"; break; fi
  if [ $n -eq 1 ]; then args=(); else args=(--next); fi
  COLUMNS=200 setsid "$PY" -m oomdoctor retest "$CARD" ${args[@]+"${args[@]}"} --timeout "$(cap 200)" --gpu "$GPU" > "$OUT/b$n.log" 2>&1 &
  R=$!; PGIDS+=("$R"); wait "$R"; rc=$?; forget "$R"
  grep -aE "lever #|ONE change|outcome|engine reached phase|ballast|new one appeared|Attempts|│" "$OUT/b$n.log" | tail -n 14
  echo "retest $n rc: $rc"
  [ $rc -ne 1 ] && break          # 0 pass, 2 bad input / no lever left, 3 inconclusive: the walk stops
done
"$PY" - "$CARD" <<'PY'
import sys
from oomdoctor.card import store as c
for a in c.load_dict(sys.argv[1]).get("attempts", []):
    print(f"attempt {a['n']}: lever {a['lever']} {a.get('change')} → {a['outcome']}"
          f" (class {(a.get('classification') or {}).get('class')}, served {a.get('served')})")
PY
mem_back

# ---- (c) the same flagless start with measured profiles
say "(c) flagless start again, ${BALLAST_FREE} B free, OOMDOCTOR_PROFILES set"
EXTRA=()
if [ -n "${PROFILES_FILE:-}" ]; then      # a ready profile file whose profiles name their own ladder receipts
  cp "$PROFILES_FILE" "$OUT/profiles.yaml"
  sed -i "s#receipt: \.\./\.\./#receipt: $ROOT/#" "$OUT/profiles.yaml"
  "$PY" -m oomdoctor.profiles "$OUT/profiles.yaml" --free "$BALLAST_FREE" --total "$(nvml | cut -d' ' -f2)" | head -8
else
  write_profiles "$OUT/profiles.yaml"
fi
if [ -z "${PROFILES_FILE:-}" ] && [ -z "${LADDER_CARD:-}" ] && [ -z "${REQ_262K:-}" ]; then
  echo "!!! no ladder result given (LADDER_CARD or REQ_262K): profiles are UNMEASURED; running with"
  echo "!!! OOMDOCTOR_PROFILE_ALLOW_UNMEASURED=1 on their DECLARED figures — a demo of the mechanism, not a measurement"
  EXTRA=(OOMDOCTOR_PROFILE_ALLOW_UNMEASURED=1)
fi
[ "$(left)" -lt 90 ] && echo "warning: only $(left) s left of TOTAL_S=$TOTAL_S for (c)"
start_ballast "$BALLAST_FREE"
run_engine "$OUT/c.log" "$(cap 300)" env ${EXTRA[@]+"${EXTRA[@]}"} OOMDOCTOR_PLUGIN=1 OOMDOCTOR_PROFILES="$OUT/profiles.yaml" \
  "$PY" -m oomdoctor.retest.engine_runner "$MODEL" '{}' '{"prompt_tokens": 8, "max_tokens": 16}'
rc_c=$?
stop_ballast
decisive "$OUT/c.log" 30
echo "engine rc: $rc_c (0 = started and served the request)"
tail -n 3 "$OUT/incidents/starts.jsonl" 2>/dev/null | "$PY" -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l); p = r.get('profile') or {}
    print('start', r['id'], r['outcome'], '| profile', p.get('selected'), '| applied', r.get('applied'),
          '| free', r.get('free_bytes'))"
say "done in $((SECONDS - T0)) s; everything is under $OUT"
