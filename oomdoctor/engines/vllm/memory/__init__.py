"""The memory model: what an engine (vLLM 0.25.1 first) will do with a model on a card, before any start.

Pure functions over a model's HF-style ``config.json`` (and, when present, the safetensors *headers*),
the engine settings and the device's memory. No GPU, no torch, no vllm import.

The arithmetic follows vLLM 0.25.1 (``vllm/v1/kv_cache_interface.py``, ``vllm/v1/core/kv_cache_utils.py``,
``vllm/v1/worker/gpu_worker.py``, ``vllm/platforms/interface.py``), read from the published wheel:

* budget (``Worker.determine_available_memory``)::

      requested     = ceil(cuda_total * gpu_memory_utilization)       # a fraction of TOTAL, not of free
      start-up check: cuda_free >= requested                           # runs even with kv_cache_memory_bytes
      available_kv  = requested - weights - activation_peak - non_torch - cuda_graph_estimate
      (kv_cache_memory_bytes set: profiling is skipped and available_kv = kv_cache_memory_bytes)

* KV pool (``get_kv_cache_config_from_groups``): layers are grouped by spec; one block of the shared pool
  costs ``page_size_bytes * group_size``; ``num_blocks = available_kv // bytes_per_block``.
* capacity (``get_max_concurrency_for_kv_cache_config``): ``max_concurrency = num_blocks /
  blocks_per_request``; the logged "GPU KV cache size" is ``int(max_concurrency * max_model_len)`` tokens.

What is measured exactly (block arithmetic, page sizes, the budget rule) is computed exactly; what vLLM
*measures* at start-up (activation peak, non-torch memory, CUDA-graph pool) is approximated by the
functions marked APPROXIMATION, each calibrated on the real vLLM 0.25.1 H200 ledgers in
``fixtures/logs/vllm-0.25.1-h200/`` (see ``CALIBRATION``).

The stages, one module each (read top to bottom)::

    model_files    config.json, safetensors headers          -> dicts, SafetensorsSummary
    quantization   quantization_config, one reader per method -> Quantization
    config_fields  HF fields as vLLM reads them (dtype, RoPE, max length)
    model          ModelInfo and its parts (MoEDims, MLADims, MambaDims), architecture sets
    architectures  per-layer layout of each family (attention / sliding / MLA / Mamba, MLP kinds)
    describe       config.json -> ModelInfo
    weights        parameter counts, WeightsEstimate
    kv_specs       KVSpec base + one class per layer kind; layer_specs
    kv_pool        grouping into the block pool, capacity, estimate_max_model_len
    activation     activation peak, CUDA-graph pool (APPROXIMATIONS)
    settings       Settings, resolve_settings (vLLM's defaults per version: ../defaults.py)
    prediction     evaluate -> Prediction
"""
from __future__ import annotations

from oomdoctor.engines.vllm.defaults import (CUDA_CONTEXT_BYTES, DEFAULT_ENGINE_VERSION, SUPPORTED_ENGINE_VERSIONS,
                                             GiB, MiB)
from oomdoctor.engines.vllm.memory.activation import (activation_peak_bytes, cuda_graph_bytes,
                                                      cuda_graph_capture_size, forward_bytes_per_token, warmup_bytes,
                                                      warmup_requests)
from oomdoctor.engines.vllm.memory.common import (CALIBRATION, CUDA_GRAPH_BASE_BYTES, CUDA_GRAPH_TOKEN_FACTOR,
                                                  DEFAULT_DRIVER_RESERVED_BYTES, DRIVER_RESERVED_BYTES, DTYPE_BYTES,
                                                  ENGINE, FORWARD_HIDDEN_COPIES, NON_TORCH_BYTES,
                                                  PERSISTENT_OVERHEAD_BYTES, WARMUP_EDGE_BYTES, WARMUP_MARGIN_BYTES,
                                                  PROFILE_OVERHEAD_BYTES, SAMPLER_BYTES_PER_LOGIT,
                                                  TP_COMM_OVERHEAD_BYTES, VOCAB_PADDING, cdiv, round_down, round_up)
from oomdoctor.engines.vllm.memory.config_fields import derive_max_model_len, rope_cache_rows
from oomdoctor.engines.vllm.memory.describe import describe_model
from oomdoctor.engines.vllm.memory.kv_pool import (KVCapacity, KVGroup, KVLayout, estimate_max_model_len,
                                                   group_layers, kv_capacity, kv_layout)
from oomdoctor.engines.vllm.memory.kv_specs import (DEFAULT_BLOCK_SIZE, KV_CACHE_DTYPES, SPEC_BY_LAYER_KIND,
                                                    FullAttentionSpec, KVFormat, KVSpec, MambaSpec, MLASpec,
                                                    SlidingWindowSpec, Spec, align_hybrid_block_size,
                                                    kv_bytes_per_token, kv_format, layer_specs,
                                                    mamba_state_bytes_per_sequence, mamba_state_shapes)
from oomdoctor.engines.vllm.memory.model import (DENSE_ARCHS, HYBRID_ARCHS, MLA_ARCHS, MOE_ARCHS, REMOVED_ARCHS,
                                                 SUPPORTED_ARCHS, V2_RUNNER_MOE_ARCHS, MambaDims, MLADims, ModelInfo,
                                                 MoEDims)
from oomdoctor.engines.vllm.memory.model_files import (SAFETENSORS_DTYPE_BYTES, SafetensorsSummary, read_config,
                                                       read_safetensors_header, safetensors_index_total,
                                                       safetensors_summary)
from oomdoctor.engines.vllm.memory.prediction import FAILURE_PHASES, Prediction, evaluate, max_utilization_for_free
from oomdoctor.engines.vllm.memory.quantization import Quantization, parse_quantization
from oomdoctor.engines.vllm.memory.settings import (DEFAULT_GPU_MEMORY_UTILIZATION, Settings, batch_defaults,
                                                    resolve_settings)
from oomdoctor.engines.vllm.memory.weights import (ParamCounts, WeightsEstimate, parameter_counts, rope_cache_bytes,
                                                   weights_bytes)

__all__ = [
    "CUDA_CONTEXT_BYTES", "DEFAULT_ENGINE_VERSION", "SUPPORTED_ENGINE_VERSIONS", "GiB", "MiB",
    "activation_peak_bytes", "cuda_graph_bytes", "cuda_graph_capture_size", "forward_bytes_per_token",
    "CALIBRATION", "CUDA_GRAPH_BASE_BYTES", "CUDA_GRAPH_TOKEN_FACTOR", "DEFAULT_DRIVER_RESERVED_BYTES",
    "DRIVER_RESERVED_BYTES", "DTYPE_BYTES", "ENGINE", "FORWARD_HIDDEN_COPIES", "PERSISTENT_OVERHEAD_BYTES",
    "NON_TORCH_BYTES", "WARMUP_EDGE_BYTES", "WARMUP_MARGIN_BYTES", "warmup_bytes", "warmup_requests",
    "PROFILE_OVERHEAD_BYTES", "SAMPLER_BYTES_PER_LOGIT", "TP_COMM_OVERHEAD_BYTES", "VOCAB_PADDING", "cdiv",
    "round_down", "round_up", "derive_max_model_len", "rope_cache_rows", "describe_model", "KVCapacity", "KVGroup",
    "KVLayout", "estimate_max_model_len", "group_layers", "kv_capacity", "kv_layout", "DEFAULT_BLOCK_SIZE",
    "KV_CACHE_DTYPES", "SPEC_BY_LAYER_KIND", "FullAttentionSpec", "KVFormat", "KVSpec", "MambaSpec", "MLASpec",
    "SlidingWindowSpec", "Spec", "align_hybrid_block_size", "kv_bytes_per_token", "kv_format", "layer_specs",
    "mamba_state_bytes_per_sequence", "mamba_state_shapes", "DENSE_ARCHS", "HYBRID_ARCHS", "MLA_ARCHS", "MOE_ARCHS",
    "REMOVED_ARCHS", "SUPPORTED_ARCHS", "V2_RUNNER_MOE_ARCHS", "MambaDims", "MLADims", "ModelInfo", "MoEDims",
    "SAFETENSORS_DTYPE_BYTES", "SafetensorsSummary", "read_config", "read_safetensors_header",
    "safetensors_index_total", "safetensors_summary", "FAILURE_PHASES", "Prediction", "evaluate",
    "max_utilization_for_free", "Quantization", "parse_quantization", "DEFAULT_GPU_MEMORY_UTILIZATION", "Settings",
    "batch_defaults", "resolve_settings", "ParamCounts", "WeightsEstimate", "parameter_counts", "rope_cache_bytes",
    "weights_bytes",
]
