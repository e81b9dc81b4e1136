#!/bin/bash
# Runs ON THE GPU MACHINE after the kit's install.sh: flagless offline starts of PUBLISHED model configs
# (fixtures/models/NAME/config.json) with vLLM's dummy weights (load_format=dummy: the weights are allocated and
# filled at random on the GPU, so the memory is the real checkpoint's), to measure the memory model at real sizes.
# The kit's tokenizer (32,000 ids) is copied beside each config; vLLM accepts a model vocabulary larger than the
# tokenizer's, and the warm-up and sampler buffers follow the model's vocab_size.
#
# Usage: bash tools/gpu/realsize.sh OUTDIR BUDGET_S NAME[:JSON_KWARGS] ...
#   e.g. bash tools/gpu/realsize.sh /root/real 540 llama-3-8b gemma-3-1b-it 'llama-3-8b:{"max_num_seqs":256}'
# Each start is one scenario of the kit's scen.py (ballast none, workload short, its own process group, memory
# checked back), logged at DEBUG so that vLLM's profiling breakdown is in the log; the scenario is named
# NAME (and _K for the K-th kwargs variant of it). REALSIZE_ENV='{"VLLM_USE_V2_MODEL_RUNNER": "0"}' (JSON) adds
# environment variables to every start of the call, and REALSIZE_TAG a suffix to every scenario's name.
set -e
OUT=$1; BUDGET=$2; shift 2
mkdir -p "$OUT" /root/m
t_end=$(( $(date +%s) + BUDGET ))
k=0
for spec in "$@"; do
  name=${spec%%:*}; kw='{}'; [ "$spec" != "$name" ] && kw=${spec#*:}
  src=fixtures/models/$name/config.json
  [ -f "$src" ] || { echo "no config $src"; exit 2; }
  d=/root/m/$name; mkdir -p $d; cp $src $d/; cp .gpu/s/tok/* $d/
  scen=$name; [ "$kw" != '{}' ] && { k=$((k+1)); scen=${name}_$k; }
  scen=$scen${REALSIZE_TAG:-}
  left=$(( t_end - $(date +%s) ))
  [ $left -lt 70 ] && { echo "== $scen: SKIPPED (budget)"; continue; }
  all=$(python3 -c 'import json,sys; d={"load_format":"dummy"}; d.update(json.loads(sys.argv[1])); print(json.dumps(d))' "$kw")
  extra=$(python3 -c 'import json,sys; e={"VLLM_LOGGING_LEVEL": "DEBUG"}; e.update(json.loads(sys.argv[3] or "{}")); print(json.dumps({sys.argv[1]: [None, json.loads(sys.argv[2]), "short", "pass", 300, e]}))' "$scen" "$all" "${REALSIZE_ENV:-}")
  MODEL_DIR=$d SCEN_EXTRA="$extra" python3 .gpu/kit/scen.py "$OUT" "$left" "$scen"
done
