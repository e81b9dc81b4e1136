#!/bin/bash
# Runs ON THE GPU MACHINE (vLLM 0.25.1 installed into /root/site as fixtures/logs/vllm-0.25.1-h200/ORIGIN.md says, model in /root/model).
# For each incident card given: reproduce the recorded failure (lever 'none'), then apply the card's first
# lever, then up to two next levers while it still fails. Every run is oomdoctor's own `retest`.
# Usage: bash tools/gpu/retest_fixtures.sh OUTDIR CARD [CARD ...]
set -u
OUT=$1; shift
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for card in "$@"; do
  name=$(basename "$card" .yaml)
  echo "=== $name $(date +%T)"
  t0=$SECONDS
  python3 -m oomdoctor retest "$card" --engine real --lever none --timeout 420 2>&1 | grep -vE "^\s*$" | tail -4
  echo "--- reproduce: $((SECONDS-t0)) s"
  for i in 1 2 3; do
    t1=$SECONDS
    if [ $i -eq 1 ]; then python3 -m oomdoctor retest "$card" --engine real --timeout 420 > "$OUT/$name.try$i.txt" 2>&1; rc=$?
    else python3 -m oomdoctor retest "$card" --engine real --next --timeout 420 > "$OUT/$name.try$i.txt" 2>&1; rc=$?; fi
    grep -E "ONE change|predicted|next lever|error" "$OUT/$name.try$i.txt" | head -4
    echo "--- lever try $i: rc=$rc $((SECONDS-t1)) s"
    [ $rc -eq 0 ] && break
    [ $rc -eq 2 ] && break
  done
  echo "=== $name total $((SECONDS-t0)) s"
done
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
