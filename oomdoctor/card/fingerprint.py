"""The effective-config fingerprint shared by ``retest`` (attempts) and ``gate`` (receipts).

It covers every memory-shaping setting, the model and its revision, the engine and its version.
Two configs with the same fingerprint start the same way on the same device; any difference in
one of these settings gives another fingerprint, so a receipt cannot be reused by accident.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

# engine argument → canonical name (snake_case). Aliases map to one name.
MEMORY_SETTINGS: dict[str, str] = {
    "max_model_len": "max_model_len",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "device_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "kv_cache_memory": "kv_cache_memory_bytes",
    "kv_cache_dtype": "kv_cache_dtype",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enforce_eager": "enforce_eager",
    "cuda_graph_sizes": "cuda_graph_sizes",
    "cudagraph_capture_sizes": "cuda_graph_sizes",
    "max_cudagraph_capture_size": "max_cudagraph_capture_size",
    "quantization": "quantization",
    "dtype": "dtype",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "cpu_offload_gb": "cpu_offload_gb",
    "block_size": "block_size",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "skip_mm_profiling": "skip_mm_profiling",
    "limit_mm_per_prompt": "limit_mm_per_prompt",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "kv_offloading_size": "kv_offloading_size",
    "enable_flashinfer_autotune": "enable_flashinfer_autotune",
    "performance_mode": "performance_mode",
    "hf_overrides": "hf_overrides",
    "speculative_config": "speculative_config",
    "max_num_queued_reqs": "max_num_queued_reqs",
    "max_num_queued_tokens": "max_num_queued_tokens",
}
MEMORY_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
              "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ATTENTION_BACKEND", "CUDA_VISIBLE_DEVICES", "VLLM_ENABLE_STARTUP_PLAN")
HUMAN_INT_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmgtKMGT])$")


def canonical_key(k: str) -> str | None:
    k = k.strip().lstrip("-").replace("-", "_")
    if k.startswith("no_") and k[3:] in MEMORY_SETTINGS:
        return MEMORY_SETTINGS[k[3:]]
    return MEMORY_SETTINGS.get(k)


def normalize_value(v: Any) -> Any:
    """'32768' → 32768, '8G' → 8·2^30 (vLLM: K/M/G/T binary, k/m/g/t decimal), 'true' → True."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return int(v) if isinstance(v, float) and v.is_integer() and abs(v) >= 1 else v
    if isinstance(v, str):
        s = v.strip()
        if s.lower() in ("true", "false"):
            return s.lower() == "true"
        if s.lower() in ("none", "null", ""):
            return None
        m = HUMAN_INT_RE.match(s)
        if m:
            mult = {"k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}[m.group(2).lower()]
            if m.group(2).isupper():
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]
            return int(float(m.group(1)) * mult)
        try:
            return normalize_value(int(s))
        except ValueError:
            pass
        try:
            return normalize_value(float(s))
        except ValueError:
            return s
    if isinstance(v, (list, tuple)):
        return [normalize_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): normalize_value(x) for k, x in sorted(v.items())}
    return str(v)


def memory_settings(args: dict[str, Any]) -> dict[str, Any]:
    """Keep the memory-shaping settings of an engine-args dict, canonical names, normalized values."""
    out: dict[str, Any] = {}
    for k, v in args.items():
        ck = canonical_key(str(k))
        if ck is None:
            continue
        if str(k).lstrip("-").replace("-", "_").startswith("no_") and v in (True, None, ""):
            v = False
        out[ck] = normalize_value(v)
    return out


def effective_config(engine: str, engine_version: str | None, model: str | None, model_revision: str | None,
                     args: dict[str, Any], env: dict[str, str] | None = None, *,
                     conditions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The memory-shaping identity of one engine start.

    ``conditions`` (optional) are the start conditions a serving config promises on top of its settings,
    e.g. ``{"requires_free_bytes": 25769803776}`` for a serving profile that must start with only that much
    free memory. They are added under ``"conditions"`` only when present, so every config without them keeps
    exactly the fingerprint it had before conditions existed.
    """
    env = env or {}
    cfg: dict[str, Any] = {
        "engine": engine,
        "engine_version": engine_version,
        "model": model,
        "model_revision": model_revision,
        "settings": dict(sorted(memory_settings(args).items())),
        "env": {k: env[k] for k in MEMORY_ENV if k in env and k != "CUDA_VISIBLE_DEVICES"},
    }
    cond = {str(k): normalize_value(v) for k, v in sorted((conditions or {}).items()) if v is not None}
    if cond:
        cfg["conditions"] = cond
    return cfg


def fingerprint(config: dict[str, Any]) -> str:
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two effective configs, for messages ('settings.max_model_len: 32768 → 65536')."""
    out = []
    for key in ("engine", "engine_version", "model", "model_revision"):
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)!r} → {b.get(key)!r}")
    for sec in ("settings", "env", "conditions"):
        sa, sb = a.get(sec) or {}, b.get(sec) or {}
        for k in sorted(set(sa) | set(sb)):
            if sa.get(k) != sb.get(k):
                out.append(f"{sec}.{k}: {sa.get(k, '(default)')!r} → {sb.get(k, '(default)')!r}")
    return out
