"""The rows compare lines up: settings, ledger entries, and what is known about each engine version's defaults."""
from __future__ import annotations

from typing import Any

GiB = 1 << 30
MiB = 1 << 20

# (name, label, kind, aligned across engine versions)
SETTINGS: list[tuple[str, str]] = [
    ("max_model_len", "window (max_model_len)"),
    ("max_num_seqs", "max_num_seqs"),
    ("max_num_batched_tokens", "max_num_batched_tokens"),
    ("kv_cache_dtype", "kv_cache_dtype"),
    ("gpu_memory_utilization", "gpu_memory_utilization"),
    ("kv_cache_memory_bytes", "pinned KV arena (kv_cache_memory_bytes)"),
    ("tensor_parallel_size", "tensor_parallel_size"),
    ("pipeline_parallel_size", "pipeline_parallel_size"),
    ("cpu_offload_gb", "cpu_offload_gb"),
    ("enforce_eager", "enforce_eager"),
    ("quantization", "quantization"),
    ("dtype", "dtype"),
]
LEDGER: list[tuple[str, str, str, bool]] = [
    ("free_before_start_bytes", "free before the start (NVML, capture header)", "bytes", True),
    ("engine_free_at_start_bytes", "free at start (engine's figure)", "bytes", False),
    ("gpu_total_bytes", "GPU total", "bytes", True),
    ("weights_bytes", "weights (model loading)", "bytes", True),
    ("activation_peak_bytes", "activation peak", "bytes", False),
    ("non_torch_bytes", "non-torch memory", "bytes", False),
    ("cuda_graph_bytes", "CUDA graph memory", "bytes", False),
    ("kv_available_bytes", "KV available (profiled budget)", "bytes", False),
    ("kv_cache_memory_bytes", "KV arena reserved (pinned)", "bytes", True),
    ("kv_cache_tokens", "KV tokens", "tokens", True),
    ("kv_bytes_per_token", "KV bytes per token (derived)", "bytes", True),
    ("max_concurrency", "max concurrency (x window)", "ratio", True),
    ("engine_init_seconds", "engine init", "seconds", False),
]
CONDITIONS = {"free_before_start_bytes", "gpu_total_bytes"}   # start conditions, not results of the settings
TIMINGS = {"engine_init_seconds"}
# defaults known per engine version range (value, versions, where it comes from)
KNOWN_DEFAULTS: dict[str, tuple[Any, str, str]] = {
    "gpu_memory_utilization": (0.92, ">=0.25,<0.34", "vLLM 0.25–0.33 CacheConfig default"),
    "kv_cache_memory_bytes": (None, ">=0.8", "not pinned"),
    "enforce_eager": (False, ">=0.8", "vLLM default"),
    "cpu_offload_gb": (0, ">=0.8", "vLLM default"),
    "kv_cache_dtype": ("auto", ">=0.8", "vLLM default"),
    "tensor_parallel_size": (1, ">=0.8", "vLLM default"),
    "pipeline_parallel_size": (1, ">=0.8", "vLLM default"),
    "quantization": (None, ">=0.8", "vLLM default"),
}
DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1}


