"""Engine settings: the user's values validated, vLLM's defaults (per version, ``defaults.py``) filled in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from oomdoctor.engines.vllm.defaults import (CUDA_CONTEXT_BYTES, DEFAULT_ENGINE_VERSION, SUPPORTED_ENGINE_VERSIONS,
                                             default_utilization, defaults_for)
from oomdoctor.engines.vllm.memory.common import DEFAULT_DRIVER_RESERVED_BYTES, DRIVER_RESERVED_BYTES, positive_int
from oomdoctor.engines.vllm.memory.kv_specs import kv_format
from oomdoctor.engines.vllm.memory.model import ModelInfo
from oomdoctor.errors import BadInput

DEFAULT_GPU_MEMORY_UTILIZATION = defaults_for(DEFAULT_ENGINE_VERSION).gpu_memory_utilization


def batch_defaults(gpu_total_bytes: int, usage_context: str = "serve", engine_version: str = DEFAULT_ENGINE_VERSION,
                   gpu_name: str = "") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that ``EngineArgs.get_batch_defaults`` picks from the NVML
    total memory and the usage context ('serve' = OPENAI_API_SERVER, 'llm' = LLM_CLASS)."""
    if usage_context not in ("serve", "llm"):
        raise BadInput(f"usage_context must be 'serve' or 'llm', got {usage_context!r}")
    return defaults_for(engine_version).batch_defaults(gpu_total_bytes, usage_context, gpu_name)


@dataclass(frozen=True)
class Settings:
    """Engine settings after vLLM's defaults are applied. Sizes in bytes, per GPU."""
    gpu_memory_bytes: int                  # NVML total of one GPU
    free_bytes: int                        # NVML free before the start
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    tensor_parallel_size: int = 1
    block_size: int | None = None
    enforce_eager: bool = False
    engine_version: str = DEFAULT_ENGINE_VERSION
    usage_context: str = "serve"
    gpu_name: str = ""
    quantization: str | None = None        # online quantization ('fp8') of an unquantized checkpoint
    cpu_offload_bytes: int = 0
    driver_reserved_bytes: int = DEFAULT_DRIVER_RESERVED_BYTES
    max_model_len_source: str = "config"


def _version(engine_version: str | None) -> str:
    version = engine_version or DEFAULT_ENGINE_VERSION
    if version not in SUPPORTED_ENGINE_VERSIONS:
        raise BadInput(f"engine version {version!r} is not modelled (supported: {', '.join(SUPPORTED_ENGINE_VERSIONS)})")
    return version


def _memory(gpu_memory_bytes: int, free_bytes: int | None, gpu_name: str) -> tuple[int, int, int]:
    """(NVML total, NVML free, driver reserve), checked against each other."""
    total = positive_int(gpu_memory_bytes, "gpu memory (total bytes)")
    reserved = DRIVER_RESERVED_BYTES.get(gpu_name.lower(), DEFAULT_DRIVER_RESERVED_BYTES)
    if total <= reserved + CUDA_CONTEXT_BYTES:
        raise BadInput(f"gpu memory {total} bytes is too small to hold even the driver reserve and a CUDA context")
    if free_bytes is None:
        return total, total - reserved, reserved
    if isinstance(free_bytes, bool) or not isinstance(free_bytes, (int, float)) or free_bytes < 0:
        raise BadInput(f"free memory must be a non-negative size, got {free_bytes!r}")
    free = int(free_bytes)
    if free > total:
        raise BadInput(f"free memory ({free} bytes) cannot exceed the GPU's total ({total} bytes)")
    return total, free, reserved


def _utilization(gpu_memory_utilization: float | None, version: str) -> float:
    util = default_utilization(version) if gpu_memory_utilization is None else gpu_memory_utilization
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not (0 < util <= 1):
        raise BadInput(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    return float(util)


def _kv_cache_dtype(m: ModelInfo, kv_cache_dtype: str | None) -> str:
    if (kv_cache_dtype or "auto") != "auto":
        return kv_format(kv_cache_dtype or "auto", m.dtype).name
    if m.quantization and m.quantization.kv_cache_dtype:
        return m.quantization.kv_cache_dtype          # resolve_kv_cache_dtype_string: the checkpoint's scheme
    return "auto"


def _max_model_len(m: ModelInfo, max_model_len: Union[int, str, None]) -> tuple[int, str]:
    """(max_model_len, where it came from); -1 for 'auto' (fit to memory)."""
    if max_model_len in (None, ""):
        return m.derived_max_model_len, f"config ({m.max_len_key})"
    if isinstance(max_model_len, str) and max_model_len.lower() in ("auto", "-1"):
        return -1, "auto"
    return positive_int(max_model_len, "max_model_len"), "user"


def _batch(max_num_seqs: int | None, max_num_batched_tokens: int | None, mml: int,
           defaults: tuple[int, int]) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) as vLLM settles them."""
    d_mbt, d_seqs = defaults
    seqs = positive_int(max_num_seqs, "max_num_seqs") if max_num_seqs is not None else d_seqs
    if max_num_batched_tokens is not None:
        mbt = positive_int(max_num_batched_tokens, "max_num_batched_tokens")
    else:
        mbt = d_mbt if mml == -1 else min(seqs * mml, d_mbt)
    if max_num_seqs is None:
        seqs = min(seqs, mbt)
    return seqs, mbt


def resolve_settings(m: ModelInfo, gpu_memory_bytes: int, free_bytes: int | None = None,
                     max_model_len: Union[int, str, None] = None, gpu_memory_utilization: float | None = None,
                     kv_cache_dtype: str | None = None, max_num_seqs: int | None = None,
                     max_num_batched_tokens: int | None = None, kv_cache_memory_bytes: int | None = None,
                     tensor_parallel_size: int | None = None, engine_version: str | None = None,
                     usage_context: str = "serve", gpu_name: str = "", block_size: int | None = None,
                     enforce_eager: bool = False, quantization: str | None = None,
                     cpu_offload_bytes: int = 0) -> Settings:
    """Validate the inputs and fill in what vLLM would default. Raises BadInput for nonsense."""
    version = _version(engine_version)
    total, free, reserved = _memory(gpu_memory_bytes, free_bytes, gpu_name)
    util = _utilization(gpu_memory_utilization, version)
    tp = positive_int(tensor_parallel_size or 1, "tensor_parallel_size")
    if m.num_attention_heads % tp:
        raise BadInput(f"num_attention_heads ({m.num_attention_heads}) is not divisible by tensor_parallel_size {tp}; "
                       "vLLM would refuse the model")
    kvd = _kv_cache_dtype(m, kv_cache_dtype)
    mml, src = _max_model_len(m, max_model_len)
    seqs, mbt = _batch(max_num_seqs, max_num_batched_tokens, mml,
                       batch_defaults(total, usage_context, version, gpu_name))
    pinned = None
    if kv_cache_memory_bytes is not None:
        pinned = positive_int(kv_cache_memory_bytes, "kv_cache_memory_bytes")
    if block_size is not None:
        positive_int(block_size, "block_size")
    if cpu_offload_bytes < 0:
        raise BadInput("cpu_offload_gb must not be negative")
    return Settings(total, free, util, mml, seqs, mbt, kvd, pinned, tp, block_size, bool(enforce_eager),
                    version, usage_context, gpu_name, quantization, int(cpu_offload_bytes), reserved, src)
