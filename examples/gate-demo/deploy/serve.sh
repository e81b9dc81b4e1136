#!/usr/bin/env bash
# Starts the long-context service. Variables come from deploy/serve.env.
set -euo pipefail

GPU_UTIL="${GPU_UTIL:-0.92}"

exec vllm serve "$MODEL" \
    --host 0.0.0.0 --port "${PORT}" \
    --max-model-len "$MAX_MODEL_LEN" \
    --gpu-memory-utilization "$GPU_UTIL" \
    --max-num-seqs 32 \
    --enforce-eager \
    --no-enable-prefix-caching \
    --trust-remote-code
