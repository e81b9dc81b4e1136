"""Runs ON THE GPU MACHINE (vLLM 0.25.1 in /root/site, the kit's model in /root/model): what vLLM's warm-up after a
pinned KV arena takes, per runner and max_num_seqs, measured in the engine's own process.

With ``kv_cache_memory_bytes`` vLLM skips memory profiling, so nothing budgets the warm-up that follows the KV cache
(``Worker.compile_or_warm_up_model``: V1's dummy run + ``_dummy_sampler_run`` over min(max_num_seqs,
max_num_batched_tokens) rows, V2's ``warmup_kernels`` over its ``num_reqs``). Each start runs in a fresh process with
the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and ``compile_or_warm_up_model`` wrapped: torch's peak
allocated/reserved bytes and the device's free bytes before and after it.

Usage: python3 tools/gpu/warmup_probe.py OUT.jsonl [RUNNER:N ...]    (default v1 and v2 at 64, 256, 1024, 2048)
Another model: PROBE_MODEL=DIR (default /root/model), PROBE_MAX_MODEL_LEN (default 32768, also its
max_position_embeddings), PROBE_DUMMY=1 for vLLM's dummy weights (a published config without its checkpoint,
tools/gpu/realsize.sh), PROBE_ARENA bytes (default 2.5e9).
Prints one ``PROBE {...}`` line per start and appends it to OUT.jsonl.
"""
from __future__ import annotations

import os
import subprocess
import sys

ARENA = 2_500_000_000            # the kit's pinned arena (W1, S1, S3 of the 2026-12-02 walks)
CHILD = r'''
import json, os, sys
runner, n, arena = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
import torch
from vllm.v1.worker import gpu_worker
rec = {"runner": runner, "max_num_seqs": n, "arena": arena}
orig = gpu_worker.Worker.compile_or_warm_up_model
def wrapped(self):
    torch.cuda.synchronize()
    rec["alloc_before"] = torch.cuda.memory_allocated()
    rec["reserved_before"] = torch.cuda.memory_reserved()
    rec["free_before"], rec["total"] = torch.cuda.mem_get_info()
    torch.cuda.reset_peak_memory_stats()
    out = orig(self)
    torch.cuda.synchronize()
    rec["peak_alloc"] = torch.cuda.max_memory_allocated()
    rec["peak_reserved"] = torch.cuda.max_memory_reserved()
    rec["alloc_after"] = torch.cuda.memory_allocated()
    rec["reserved_after"] = torch.cuda.memory_reserved()
    rec["free_after"] = torch.cuda.mem_get_info()[0]
    rec["v2_runner"] = bool(getattr(self, "use_v2_model_runner", False))
    return out
gpu_worker.Worker.compile_or_warm_up_model = wrapped
from vllm import LLM
model = os.environ.get("PROBE_MODEL", "/root/model")
maxlen = int(os.environ.get("PROBE_MAX_MODEL_LEN", "32768"))
extra = {"load_format": "dummy"} if os.environ.get("PROBE_DUMMY") else {}
rec.update(model=model, max_model_len=maxlen, **extra)
llm = LLM(model=model, max_model_len=maxlen, hf_overrides={"max_position_embeddings": maxlen},
          enforce_eager=True, kv_cache_memory_bytes=arena, max_num_seqs=n, **extra)
rec["warmup_peak_alloc"] = rec["peak_alloc"] - rec["alloc_before"]
rec["warmup_peak_reserved"] = rec["peak_reserved"] - rec["reserved_before"]
rec["non_torch_growth"] = (rec["free_before"] - rec["free_after"]) - (rec["reserved_after"] - rec["reserved_before"])
print("PROBE " + json.dumps(rec), flush=True)
'''


def main() -> int:
    out = sys.argv[1]
    runs = sys.argv[2:] or [f"{r}:{n}" for r in ("v1", "v2") for n in (64, 256, 1024, 2048)]
    for spec in runs:
        runner, n = spec.split(":")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        arena = os.environ.get("PROBE_ARENA", str(ARENA))
        p = subprocess.run([sys.executable, "-c", CHILD, runner, n, arena], capture_output=True, text=True,
                           env=env, timeout=240)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")), None)
        if line is None:
            print(f"FAILED {spec} rc={p.returncode}: {(p.stderr or p.stdout)[-1500:]}", flush=True)
            continue
        print(line, flush=True)
        with open(out, "a", encoding="utf-8") as f:
            f.write(line[len("PROBE "):] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
