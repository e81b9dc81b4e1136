#!/bin/bash
# Runs ON THE GPU MACHINE (vLLM 0.25.1 installed into /root/site as fixtures/logs/vllm-0.25.1-h200/ORIGIN.md says, model in /root/model).
#
# For each real failing log: diagnose it into a FRESH card (no hand edits: the workload, its env and the levers
# are what oomdoctor read from the log alone; --model /root/model lets each lever carry its expected chain), then
# let `oomdoctor retest` itself walk: reproduce the recorded failure (lever 'none'), then lever #1, then --next
# while it still fails (exit 1). The walk of an incident stops at a pass (0), an inconclusive run (3), or when no
# lever is left that this device can apply (2). Levers that need other hardware are never run.
#
# Then one more card, from a copy of A_fail.log without the env the log names (its FlashInfer line and the
# header's VLLM_USE_FLASHINFER_SAMPLER): its first attempt must be `inconclusive` (the engine cannot import
# flashinfer) and no lever may be marked tried or failed.
#
# Prints per attempt its time and outcome, per incident the number of engine starts.
# Usage: bash tools/gpu/retest_fixtures.sh OUTDIR [LOG ...]      (default: fixtures/logs/vllm-0.25.1-h200/*_fail.log)
#        ENV_DEMO=0 skips the env-less card; MAX_LEVERS (default 4) bounds the levers per incident;
#        TIMEOUT (default 420) is retest's --timeout per attempt; RETEST_ARGS are added to every retest.
set -u
OUT=$1; shift
LOGS=("$@")
[ ${#LOGS[@]} -eq 0 ] && LOGS=(fixtures/logs/vllm-0.25.1-h200/*_fail.log)
MAX_LEVERS=${MAX_LEVERS:-4}
TIMEOUT=${TIMEOUT:-420}
MODEL=${MODEL:-/root/model}
mkdir -p "$OUT/cards" "$OUT/out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
unset VLLM_USE_FLASHINFER_SAMPLER            # the card's env, and only it, says what the engine gets
PY=${PY:-python3}

last_attempt() {   # CARD: "outcome duration lever" of its last attempt
  "$PY" - "$1" <<'EOF'
import sys
from oomdoctor.card import store
a = (store.load_dict(sys.argv[1]).get("attempts") or [{}])[-1]
chain = (a.get("chain_check") or {}).get("status", "")
inc = (a.get("inconclusive") or {}).get("reason", "")
print(f"{a.get('outcome', '?')} {a.get('duration_s', '?')}s lever={a.get('lever', '?')} {a.get('change', {})}"
      + (f" chain={chain}" if chain else "") + (f" — {inc[:200]}" if inc else ""))
EOF
}

summary() {        # CARD: engine starts, and the levers marked tried
  "$PY" - "$1" <<'EOF'
import sys
from oomdoctor.card import store
from oomdoctor.levers.context import counts_as_tried
c = store.load_dict(sys.argv[1])
atts = c.get("attempts") or []
starts = sum(1 for a in atts if (a.get("engine") or {}).get("mode") == "real" and a.get("log_path"))
tried = [f"{a['lever']}:{a['outcome']}" for a in atts if a["lever"] != "none" and counts_as_tried(a)]
print(f"engine starts: {starts}; attempts: {' → '.join(a['outcome'] for a in atts)}; levers tried: {tried or 'none'}")
EOF
}

walk() {           # CARD NAME
  local card=$1 name=$2 rc t1 i
  t1=$SECONDS
  "$PY" -m oomdoctor retest "$card" --engine real --lever none --timeout "$TIMEOUT" ${RETEST_ARGS:-} > "$OUT/out/$name.reproduce.txt" 2>&1; rc=$?
  echo "  reproduce: rc=$rc $((SECONDS-t1)) s wall; $(last_attempt "$card")"
  grep -E "^(inconclusive|oomdoctor: error)" "$OUT/out/$name.reproduce.txt" | head -2 | sed 's/^/    /'
  [ $rc -eq 3 ] && return 3
  [ $rc -eq 0 ] && { echo "  not reproduced: the recorded failure did not happen again"; return 0; }
  [ $rc -eq 2 ] && return 2
  for i in $(seq 1 "$MAX_LEVERS"); do
    t1=$SECONDS
    if [ "$i" -eq 1 ]; then "$PY" -m oomdoctor retest "$card" --engine real --timeout "$TIMEOUT" ${RETEST_ARGS:-} > "$OUT/out/$name.try$i.txt" 2>&1; rc=$?
    else "$PY" -m oomdoctor retest "$card" --engine real --next --timeout "$TIMEOUT" ${RETEST_ARGS:-} > "$OUT/out/$name.try$i.txt" 2>&1; rc=$?; fi
    grep -E "^expected: " "$OUT/out/$name.try$i.txt" | head -1 | cut -c1-300 | sed 's/^/    /'
    echo "  lever try $i: rc=$rc $((SECONDS-t1)) s wall; $(last_attempt "$card")"
    grep -E "^(inconclusive|chain|next lever|oomdoctor: error)" "$OUT/out/$name.try$i.txt" | head -3 | cut -c1-300 | sed 's/^/    /'
    [ $rc -ne 1 ] && return $rc
  done
  return 1
}

for log in "${LOGS[@]}"; do
  name=$(basename "$log" .log)
  card="$OUT/cards/h200-$name.yaml"
  rm -rf "$card" "$OUT/cards/h200-$name.runs"
  echo "=== $name $(date +%T)"
  "$PY" -m oomdoctor diagnose "$log" --out "$card" --model "$MODEL" > "$OUT/out/$name.diagnose.txt" 2>&1; rc=$?
  if [ $rc -ne 0 ]; then echo "  diagnose rc=$rc (no memory failure to retest)"; continue; fi
  "$PY" -c "import sys; from oomdoctor.card import store; c = store.load_dict(sys.argv[1]); \
print('  card:', c['classification']['class'], '| env:', sorted(c['workload'].get('env', {})), '| levers:', \
[l['id'] + (' (needs other hardware)' if l.get('needs_hardware') else '') for l in c['levers']])" "$card"
  t0=$SECONDS
  walk "$card" "$name"; rc=$?
  echo "=== $name: walk rc=$rc, $((SECONDS-t0)) s; $(summary "$card")"
done

if [ "${ENV_DEMO:-1}" != "0" ]; then
  name=A_fail-without-env
  src=fixtures/logs/vllm-0.25.1-h200/A_fail.log
  log="$OUT/$name.log"
  # the same real log without what names VLLM_USE_FLASHINFER_SAMPLER=0: the engine's line and the header's entry
  grep -v "FlashInfer top-p/top-k sampling disabled via" "$src" | sed 's/"VLLM_USE_FLASHINFER_SAMPLER": "0", //' > "$log"
  card="$OUT/cards/h200-$name.yaml"
  rm -rf "$card" "$OUT/cards/h200-$name.runs"
  echo "=== $name $(date +%T) (expect: inconclusive on the first attempt, no lever tried)"
  "$PY" -m oomdoctor diagnose "$log" --out "$card" --model "$MODEL" > "$OUT/out/$name.diagnose.txt" 2>&1
  t0=$SECONDS
  walk "$card" "$name"; rc=$?
  echo "=== $name: walk rc=$rc (3 = inconclusive), $((SECONDS-t0)) s; $(summary "$card")"
fi
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
