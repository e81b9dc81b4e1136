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
functions marked APPROXIMATION below, each calibrated on the real vLLM 0.25.1 H200 ledgers in
``fixtures/logs/vllm-0.25.1-h200/`` (see ``CALIBRATION``).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

from oomdoctor.errors import BadInput

GiB = 1 << 30
MiB = 1 << 20

ENGINE = "vllm"
DEFAULT_ENGINE_VERSION = "0.25.1"
SUPPORTED_ENGINE_VERSIONS = ("0.25.1", "0.33.0")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92          # CacheConfig, 0.25.1 and 0.33.0
DEFAULT_BLOCK_SIZE = 16                        # CacheConfig.DEFAULT_BLOCK_SIZE (FlashAttention: MultipleOf(16))
VOCAB_PADDING = 64                             # VocabParallelEmbedding pads the vocabulary to a multiple of 64

# ---------------------------------------------------------------------------------------------------
# Calibrated constants. Each one says where it comes from; none is a guess presented as a measurement.
# ---------------------------------------------------------------------------------------------------

#: vLLM's own CUDA context, in bytes: NVML free 40.001 GiB showed as "Free memory ... (39.49/139.8 GiB)",
#: NVML free 8.001 GiB as "Initial free memory 7.49 GiB", 139.80 as 139.29 (B_fail, D_pass, E_pass).
CUDA_CONTEXT_BYTES = round(0.51 * GiB)

#: NVML total minus the total CUDA reports (cudaMemGetInfo): the driver keeps it. H200 measured:
#: NVML total 150,754,820,096 B, NVML free on the idle card 150,109,880,320 B = vLLM's "139.8 GiB" total.
DRIVER_RESERVED_BYTES = {"h200": 150_754_820_096 - 150_109_880_320}
#: APPROXIMATION for other cards (published torch/NVML totals differ by 0.35-0.6 GiB on 4090/H100/5090).
DEFAULT_DRIVER_RESERVED_BYTES = 512 * MiB

#: APPROXIMATION: non-torch memory + torch.compile/cuBLAS/Triton growth during the profiling run, beyond
#: the activation peak. Fitted on the cold-compile ledgers A_pass, A_fail, F2 (residual 0.69-0.74 GiB).
PROFILE_OVERHEAD_BYTES = round(0.72 * GiB)
#: APPROXIMATION: what stays allocated after profiling besides weights and KV (non-torch beyond the context
#: + torch buffers): from F1b_fail's OOM text (7.98 GiB in use, 7.01 allocated, 0.24 reserved-unallocated,
#: weights 2.61 + KV 4.10 GiB, context 0.51 GiB): 0.22 non-torch + 0.30 torch = 0.52 GiB.
PERSISTENT_OVERHEAD_BYTES = round(0.52 * GiB)
#: APPROXIMATION: the dummy sampler run holds about 5 fp32 copies of the [max_num_seqs, vocab] logits.
SAMPLER_BYTES_PER_LOGIT = 20
#: APPROXIMATION: the forward peak per scheduled token is dtype x (4 x hidden + the largest per-layer
#: intermediate: 3 x intermediate for a gated MLP, top_k x (3 x moe_intermediate + hidden) for MoE, the
#: in_proj output + chunked fp32 states for Mamba2).
FORWARD_HIDDEN_COPIES = 4
#: APPROXIMATION: CUDA-graph pool = base + capture_size x factor x forward bytes per token. Two real
#: captures of the gpu-kit Llama: "took 0.42 GiB" (largest capture size 512) and "took 0.16 GiB" (128).
CUDA_GRAPH_BASE_BYTES = round(0.0733 * GiB)
CUDA_GRAPH_TOKEN_FACTOR = 14.49
#: APPROXIMATION, uncalibrated (no multi-GPU ledger yet): NCCL buffers per rank when tensor_parallel_size > 1.
TP_COMM_OVERHEAD_BYTES = 256 * MiB

CALIBRATION = {
    "cuda_context_bytes": "0.51 GiB: NVML free vs vLLM's printed free (B_fail, D_pass, E_pass)",
    "driver_reserved_bytes": "H200: NVML total - NVML free on the idle card (manifest.yaml); others 0.5 GiB",
    "profile_overhead_bytes": "0.72 GiB fitted on A_pass/A_fail/F2 (cold torch.compile); a warm compile cache "
                              "(B_pass) used 0.5 GiB less, so predictions are conservative there",
    "activation_peak": "max(forward peak, sampler dummy run); see activation_peak_bytes()",
    "cuda_graph": "0.0733 GiB + capture_size x 14.49 x forward bytes/token (captures of 0.42 and 0.16 GiB)",
    "persistent_overhead_bytes": "0.52 GiB from F1b_fail's OOM message",
    "rope_cache": "max_position x rotary_dim x dtype per distinct RoPE; 2.6042 GiB predicted vs 'Model loading "
                  "took 2.61 GiB' for the gpu-kit Llama",
}

# ---------------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------------

DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "float64": 8, "double": 8,
}
#: safetensors dtype tags -> bytes per element (F4 packs two values per byte).
SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2,
    "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FN": 1, "F4": 0.5,
    "F6_E2M3": 0.75, "F6_E3M2": 0.75, "E8M0": 1,
}
_FLOAT_TAGS = {"F64", "F32", "F16", "BF16"}


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (vLLM's ``cdiv``)."""
    return -(-a // b)


def round_down(n: int, multiple: int) -> int:
    return (n // multiple) * multiple


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise BadInput(f"{what} must be a positive integer, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------
# Reading a model directory
# ---------------------------------------------------------------------------------------------------

def read_config(model_dir: Union[str, Path]) -> dict:
    """Read ``model_dir/config.json``. Raises BadInput naming the file when it is missing or malformed."""
    path = Path(model_dir)
    cfg_path = path / "config.json" if path.is_dir() or not path.name.endswith(".json") else path
    if not path.exists():
        raise BadInput(f"model directory not found: {model_dir}")
    if not cfg_path.is_file():
        raise BadInput(f"no config.json in {model_dir} (a HF-style model directory needs one)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {cfg_path}: {e}") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"malformed JSON in {cfg_path}: {e.msg} at line {e.lineno}") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{cfg_path} must hold a JSON object, not {type(cfg).__name__}")
    return cfg


def read_safetensors_header(path: Union[str, Path]) -> dict:
    """The JSON header of one ``.safetensors`` file: 8-byte little-endian length, then that many bytes
    of JSON. Tensor data is never read."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise BadInput(f"{p}: too short for a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            size = p.stat().st_size
            if n <= 0 or 8 + n > size or n > 100 * MiB:
                raise BadInput(f"{p}: implausible safetensors header length {n} for a {size}-byte file")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise BadInput(f"cannot read {p}: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{p}: malformed safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise BadInput(f"{p}: safetensors header is not a JSON object")
    return header


@dataclass(frozen=True)
class SafetensorsSummary:
    files: int
    tensors: int
    file_bytes: int              # sizes on disk (headers included)
    tensor_bytes: int            # sum of the tensors' data, as stored
    loaded_bytes: int            # floating tensors counted at the model dtype (vLLM casts them on load)
    bytes_by_dtype: dict


def safetensors_summary(model_dir: Union[str, Path], model_dtype_bytes: int | None = None) -> SafetensorsSummary | None:
    """Sum the tensor sizes declared in the headers of every ``*.safetensors`` in ``model_dir``.
    None when there are none. ``loaded_bytes`` counts 16/32/64-bit float tensors at ``model_dtype_bytes``
    (vLLM loads them into parameters of the model dtype); quantized/int tensors count as stored."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    tensors = tensor_bytes = loaded = file_bytes = 0
    by_dtype: dict[str, int] = {}
    for fp in files:
        header = read_safetensors_header(fp)
        file_bytes += fp.stat().st_size
        for name, t in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(t, dict) or "dtype" not in t or "shape" not in t:
                raise BadInput(f"{fp}: tensor {name!r} lacks dtype/shape in the header")
            tag = str(t["dtype"]).upper()
            if tag not in SAFETENSORS_DTYPE_BYTES:
                raise BadInput(f"{fp}: tensor {name!r} has an unknown dtype {tag!r}")
            numel = math.prod(int(d) for d in t["shape"])
            offs = t.get("data_offsets")
            nbytes = int(offs[1]) - int(offs[0]) if isinstance(offs, list) and len(offs) == 2 else \
                math.ceil(numel * SAFETENSORS_DTYPE_BYTES[tag])
            tensors += 1
            tensor_bytes += nbytes
            by_dtype[tag] = by_dtype.get(tag, 0) + nbytes
            lowered = name.lower()
            if (model_dtype_bytes and tag in _FLOAT_TAGS and "scale" not in lowered and "zero" not in lowered):
                loaded += numel * model_dtype_bytes
            else:
                loaded += nbytes
    return SafetensorsSummary(len(files), tensors, file_bytes, tensor_bytes, loaded, by_dtype)


def safetensors_index_total(model_dir: Union[str, Path]) -> int | None:
    """``metadata.total_size`` of ``model.safetensors.index.json`` (when only the index was fetched)."""
    idx = Path(model_dir) / "model.safetensors.index.json"
    if not idx.is_file():
        return None
    try:
        total = json.loads(idx.read_text(encoding="utf-8")).get("metadata", {}).get("total_size")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise BadInput(f"malformed {idx}: {e}") from None
    return int(total) if isinstance(total, (int, float)) and total > 0 else None


# ---------------------------------------------------------------------------------------------------
# Model description from config.json
# ---------------------------------------------------------------------------------------------------

DENSE_ARCHS = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Phi3ForCausalLM",
    "GraniteForCausalLM",
}
MOE_ARCHS = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}
MLA_ARCHS = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}
HYBRID_ARCHS = {"NemotronHForCausalLM", "JambaForCausalLM"}
SUPPORTED_ARCHS = DENSE_ARCHS | MOE_ARCHS | MLA_ARCHS | HYBRID_ARCHS
#: vLLM's _PREVIOUSLY_SUPPORTED_MODELS (0.25.1 registry): architecture -> last version that had it.
REMOVED_ARCHS = {"BambaForCausalLM": "0.23.0", "MiniMaxForCausalLM": "0.23.0"}
#: vLLM 0.25.1 DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES (MoE models that still get the V2 runner).
V2_RUNNER_MOE_ARCHS = {"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}


@dataclass(frozen=True)
class Quantization:
    """Weight quantization read from ``quantization_config`` (or ``compression_config``)."""
    method: str
    bits: float                     # bits per quantized weight element
    group_size: int = 0             # elements per scale (0: per channel / per tensor)
    scale_bytes: float = 2.0        # bytes of one scale (+ zero point) per group
    kv_cache_dtype: str | None = None   # a kv cache scheme the checkpoint declares ('fp8'), if any

    def bytes_per_param(self) -> float:
        extra = self.scale_bytes / self.group_size if self.group_size else 0.0
        return self.bits / 8 + extra


@dataclass(frozen=True)
class MambaDims:
    kind: str                       # "mamba1" | "mamba2"
    d_inner: int                    # mamba heads x head dim (mamba2) or expand x hidden (mamba1)
    state_size: int
    conv_kernel: int
    n_groups: int = 1               # mamba2
    num_heads: int = 0              # mamba2
    head_dim: int = 0               # mamba2
    dt_rank: int = 0                # mamba1
    chunk_size: int = 128
    ssm_dtype_bytes: int = 2        # NemotronH: float32 in vLLM 0.25.1 (NemotronHForCausalLMConfig)
    conv_dtype_bytes: int = 2


@dataclass(frozen=True)
class ModelInfo:
    """What the memory model needs from a config.json, normalised across architectures."""
    path: str
    architecture: str
    model_type: str
    dtype: str
    dtype_bytes: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    layer_kinds: tuple                      # per layer: "full" | "sliding" | "mla" | "mamba" | "none"
    sliding_windows: tuple                  # per layer: window or 0
    mlp_kinds: tuple                        # per layer: "gated" | "plain" | "moe" | "none"
    intermediate_size: int
    derived_max_model_len: int
    max_len_key: str
    rope_caches: tuple                      # ((rows, rotary_dim), ...), one per distinct RoPE
    attention_bias: bool = False
    qk_norm: bool = False
    moe: dict = field(default_factory=dict)  # num_experts, top_k, moe_intermediate, shared_intermediate, gated
    mla: dict = field(default_factory=dict)  # kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, q_lora_rank
    mamba: MambaDims | None = None
    quantization: Quantization | None = None
    notes: tuple = ()

    @property
    def is_hybrid(self) -> bool:
        return "mamba" in self.layer_kinds and any(k in ("full", "sliding", "mla") for k in self.layer_kinds)

    @property
    def is_moe(self) -> bool:
        return "moe" in self.mlp_kinds

    def uses_v2_runner(self, engine_version: str = DEFAULT_ENGINE_VERSION) -> bool:
        """0.25.1 picks its V2 model runner for plain decoders that are not hybrid and not MoE (except a few)."""
        if engine_version != "0.25.1":
            return not self.is_hybrid
        return not self.is_hybrid and (not self.is_moe or self.architecture in V2_RUNNER_MOE_ARCHS)


def _get(cfg: dict, *names: str, default: Any = None) -> Any:
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def _need(cfg: dict, name: str, where: str, *alts: str) -> Any:
    v = _get(cfg, name, *alts)
    if v is None:
        alt = f" (or {', '.join(alts)})" if alts else ""
        raise BadInput(f"{where}: config.json lacks {name!r}{alt}, which the memory model needs")
    return v


def _need_int(cfg: dict, name: str, where: str, *alts: str) -> int:
    return _positive_int(_need(cfg, name, where, *alts), f"{where}: {name}")


def _dtype_of(cfg: dict, top: dict) -> str:
    d = _get(cfg, "dtype", "torch_dtype") or _get(top, "dtype", "torch_dtype")
    if d is None:
        return "float32"   # vLLM: a config without dtype loads as float32 -> downcast below
    d = str(d).replace("torch.", "").lower()
    if d not in DTYPE_BYTES:
        raise BadInput(f"config.json: unsupported dtype {d!r}")
    # vLLM's dtype 'auto' keeps fp16/bf16 and downcasts a float32 checkpoint to bfloat16.
    return "bfloat16" if DTYPE_BYTES[d] >= 4 else d


def _rope_params(cfg: dict) -> dict:
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        rp = rp.get("full_attention") or next(iter(rp.values()))
    if not isinstance(rp, dict) or not rp:
        rp = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
    rp = dict(rp or {})
    if "type" in rp and "rope_type" not in rp:
        rp["rope_type"] = rp["type"]
    rp.setdefault("rope_type", "default")
    return rp


def derive_max_model_len(cfg: dict, model_type: str) -> tuple[int, str]:
    """vLLM's ``_get_and_verify_max_len`` default: the smallest of the HF length keys, times the RoPE
    scaling factor (``original_max_position_embeddings * factor`` for YaRN; no scaling for llama3/longrope
    and for Gemma-3, whose length is already scaled). 2048 with a warning when no key is present."""
    keys = ["max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
            "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len"]
    best, key = math.inf, "default"
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < best:
            best, key = v, k
    if isinstance(cfg.get("model_max_length"), (int, float)) and cfg["model_max_length"]:
        best, key = cfg["model_max_length"], "model_max_length"
    if best == math.inf:
        return 2048, "default (no length key in config.json; vLLM assumes 2048)"
    rp = _rope_params(cfg)
    rtype = rp.get("rope_type", "default")
    if "gemma3" not in model_type and rtype not in ("default", "su", "longrope", "llama3"):
        factor = rp.get("factor") or 1.0
        if rtype == "yarn" and rp.get("original_max_position_embeddings"):
            best = rp["original_max_position_embeddings"]
        best = best * factor
    if best <= 0:
        raise BadInput(f"config.json: {key} must be positive, got {best}")
    return int(best), key


def rope_cache_rows(cfg: dict, max_position: int) -> int:
    """Rows of vLLM's ``cos_sin_cache`` (``get_rope``): sized by the config's positions, not by max_model_len."""
    rp = _rope_params(cfg)
    rtype = rp.get("rope_type", "default")
    factor = float(rp.get("factor") or 1.0)
    if rtype in ("yarn", "deepseek_yarn", "deepseek_llama_scaling"):
        orig = rp.get("original_max_position_embeddings") or max_position
        return int(orig * factor)
    if rtype in ("linear", "dynamic"):
        return int(max_position * factor)
    return int(max_position)


def parse_quantization(cfg: dict) -> Quantization | None:
    """Weight bits from ``quantization_config``: fp8, awq, gptq, bitsandbytes (4/8-bit), compressed-tensors,
    modelopt (fp8 / nvfp4), mxfp4. Raises BadInput when the bits cannot be derived."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise BadInput("config.json: quantization_config must be an object")
    method = str(qc.get("quant_method", "")).lower().replace("compressed_tensors", "compressed-tensors")
    kv = None
    kv_scheme = qc.get("kv_cache_scheme") or qc.get("kv_cache_quant_algo")
    if isinstance(kv_scheme, dict) and kv_scheme.get("num_bits") == 8:
        kv = "fp8"
    elif isinstance(kv_scheme, str) and "fp8" in kv_scheme.lower():
        kv = "fp8"
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        block = qc.get("weight_block_size")
        if isinstance(block, list) and len(block) == 2:
            return Quantization(method, 8, int(block[0]) * int(block[1]), 4.0, kv)
        return Quantization(method, 8, 0, 0.0, kv)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "auto-round", "auto_round"):
        bits = qc.get("bits", qc.get("w_bit"))
        group = qc.get("group_size", qc.get("q_group_size", 128))
        if not isinstance(bits, (int, float)) or bits <= 0:
            raise BadInput(f"config.json: {method} quantization_config lacks 'bits'")
        group = int(group) if isinstance(group, (int, float)) and group > 0 else 0
        # fp16 scale + packed zero point per group (per output channel when group_size is -1)
        return Quantization(method, float(bits), group, 2 + bits / 8, kv)
    if method == "bitsandbytes":
        if qc.get("load_in_4bit") or qc.get("bnb_4bit_quant_type"):
            return Quantization(method, 4, 64, 1.0 if qc.get("bnb_4bit_use_double_quant") else 4.0, kv)
        if qc.get("load_in_8bit"):
            return Quantization(method, 8, 0, 0.0, kv)
        raise BadInput("config.json: bitsandbytes quantization_config says neither load_in_4bit nor load_in_8bit")
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        bits_seen = []
        for g in groups.values() if isinstance(groups, dict) else []:
            w = (g or {}).get("weights") or {}
            if isinstance(w.get("num_bits"), (int, float)):
                gs = w.get("group_size") if w.get("strategy") in ("group", "tensor_group") else 0
                bits_seen.append((float(w["num_bits"]), int(gs or 0), str(w.get("type", "int"))))
        if not bits_seen:
            raise BadInput("config.json: compressed-tensors quantization_config has no config_groups.*.weights.num_bits")
        bits, gs, typ = max(bits_seen)
        scale = 1.0 if (typ == "float" and bits == 4) else 2.0
        return Quantization(method, bits, gs, scale, kv)
    if method in ("modelopt", "modelopt_fp4", "modelopt_mxfp8"):
        algo = str((qc.get("quantization") or qc).get("quant_algo", "")).upper()
        if "FP4" in algo:
            return Quantization(method, 4, 16, 1.0, kv)
        if "FP8" in algo:
            return Quantization(method, 8, 0, 0.0, kv)
        raise BadInput(f"config.json: modelopt quant_algo {algo!r}: cannot derive the weight bits")
    if method == "mxfp4":
        return Quantization(method, 4, 32, 1.0, kv)
    raise BadInput(f"config.json: quantization method {method or '(none)'!r}: cannot derive the weight bits "
                   "from the config; put the *.safetensors files (or model.safetensors.index.json) in the directory")


def _text_config(cfg: dict, arch: str) -> dict:
    if arch.endswith("ForConditionalGeneration") and isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        for k in ("dtype", "torch_dtype", "quantization_config", "tie_word_embeddings"):
            if k not in text and k in cfg:
                text[k] = cfg[k]
        return text
    return cfg


def _attention_layout(cfg: dict, arch: str, model_type: str, n: int) -> tuple[list, list]:
    """Per-layer attention kind ('full' / 'sliding') and window, the way vLLM 0.25.1 builds the layers."""
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    layer_types = cfg.get("layer_types")
    kinds, windows = ["full"] * n, [0] * n
    if isinstance(layer_types, list) and layer_types:
        if len(layer_types) < n:
            raise BadInput(f"config.json: layer_types has {len(layer_types)} entries for {n} layers")
        for i in range(n):
            if layer_types[i] == "sliding_attention" and window:
                kinds[i], windows[i] = "sliding", int(window)
        return kinds, windows
    if not window:
        return kinds, windows
    if model_type.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        sliding = [bool((i + 1) % pattern) for i in range(n)]
    elif model_type.startswith("gemma2"):
        sliding = [i % 2 == 0 for i in range(n)]
    elif model_type.startswith("qwen2") or model_type.startswith("qwen3"):
        mwl = int(cfg.get("max_window_layers") or 0)
        sliding = [i >= mwl for i in range(n)]
    else:   # Mistral-style: one model-level window applies to every layer (CacheConfig.sliding_window)
        sliding = [True] * n
    for i in range(n):
        if sliding[i]:
            kinds[i], windows[i] = "sliding", int(window)
    return kinds, windows


def describe_model(model_dir: Union[str, Path], config: dict | None = None) -> ModelInfo:
    """Normalise a config.json into a ModelInfo. Raises BadInput for unknown/removed architectures and for
    missing fields (naming them)."""
    cfg0 = read_config(model_dir) if config is None else config
    archs = cfg0.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise BadInput(f"{model_dir}: config.json has no 'architectures' list; cannot tell what the model is")
    arch = archs[0]
    if arch in REMOVED_ARCHS:
        raise BadInput(f"{arch} was removed from vLLM in {REMOVED_ARCHS[arch]}; vLLM 0.25.1 cannot load it")
    if arch not in SUPPORTED_ARCHS:
        raise BadInput(f"unknown architecture {arch!r} (the memory model knows: {', '.join(sorted(SUPPORTED_ARCHS))})")
    where = f"{model_dir} ({arch})"
    cfg = _text_config(cfg0, arch)
    model_type = str(cfg.get("model_type") or cfg0.get("model_type") or "")
    dtype = _dtype_of(cfg, cfg0)
    hidden = _need_int(cfg, "hidden_size", where)
    vocab = _need_int(cfg, "vocab_size", where)
    heads = _need_int(cfg, "num_attention_heads", where)
    kv_heads = _positive_int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads), f"{where}: num_key_value_heads")
    hd = cfg.get("head_dim")
    head_dim = int(hd) if isinstance(hd, (int, float)) and hd and hd > 0 else hidden // heads
    if head_dim <= 0:
        raise BadInput(f"{where}: head_dim must be positive")
    derived, key = derive_max_model_len(cfg, model_type)
    notes: list[str] = []
    if cfg is not cfg0:
        notes.append(f"{arch}: only the text model is counted from config.json (vision tower weights and the "
                     "multimodal encoder's profiling peak are not; safetensors shards would include the weights)")
    quant = parse_quantization(cfg)
    tie = bool(cfg.get("tie_word_embeddings", model_type.startswith("gemma")))
    rp = _rope_params(cfg)
    max_pos = int(cfg.get("max_position_embeddings") or derived)
    partial = float(rp.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0)
    rope_caches: list[tuple[int, int]] = []
    mla: dict = {}
    moe: dict = {}
    mamba = None
    intermediate = int(cfg.get("intermediate_size") or 0)

    if arch in HYBRID_ARCHS:
        n, kinds, mlps, windows, mamba, moe = _hybrid_layout(cfg, arch, where, hidden, dtype)
    else:
        n = _need_int(cfg, "num_hidden_layers", where)
        if arch in MLA_ARCHS:
            kinds, windows = ["mla"] * n, [0] * n
            mla = {
                "kv_lora_rank": _need_int(cfg, "kv_lora_rank", where),
                "qk_rope_head_dim": _need_int(cfg, "qk_rope_head_dim", where),
                "qk_nope_head_dim": _need_int(cfg, "qk_nope_head_dim", where),
                "v_head_dim": _need_int(cfg, "v_head_dim", where),
                "q_lora_rank": int(cfg.get("q_lora_rank") or 0),
            }
            kv_heads = 1       # one latent per token, shared by all heads (get_num_kv_heads -> 1 for MLA)
            head_dim = mla["kv_lora_rank"] + mla["qk_rope_head_dim"]
            rope_caches.append((rope_cache_rows(cfg, max_pos), mla["qk_rope_head_dim"]))
        else:
            kinds, windows = _attention_layout(cfg, arch, model_type, n)
            rope_caches.append((rope_cache_rows(cfg, max_pos), int(head_dim * partial)))
            if model_type.startswith("gemma3") and "sliding" in kinds:
                # Gemma-3 builds a second (local, unscaled) RoPE for its sliding layers.
                rope_caches.append((max_pos, int(head_dim * partial)))
        mlps = ["gated"] * n
        if arch in MOE_ARCHS or arch in MLA_ARCHS:
            moe, mlps = _moe_layout(cfg, arch, where, n, intermediate)
        elif intermediate <= 0:
            raise BadInput(f"{where}: config.json lacks 'intermediate_size', which the memory model needs")
    return ModelInfo(
        path=str(model_dir), architecture=arch, model_type=model_type, dtype=dtype, dtype_bytes=DTYPE_BYTES[dtype],
        hidden_size=hidden, num_layers=n, vocab_size=vocab, tie_word_embeddings=tie, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, layer_kinds=tuple(kinds), sliding_windows=tuple(windows),
        mlp_kinds=tuple(mlps), intermediate_size=intermediate, derived_max_model_len=derived, max_len_key=key,
        rope_caches=tuple(rope_caches), attention_bias=bool(cfg.get("attention_bias") or model_type == "qwen2"),
        qk_norm=model_type.startswith(("qwen3", "gemma3")), moe=moe, mla=mla, mamba=mamba, quantization=quant,
        notes=tuple(notes),
    )


def _moe_layout(cfg: dict, arch: str, where: str, n: int, intermediate: int) -> tuple[dict, list]:
    if arch == "MixtralForCausalLM":
        e = _need_int(cfg, "num_local_experts", where)
        moe = {"num_experts": e, "top_k": _need_int(cfg, "num_experts_per_tok", where),
               "moe_intermediate": _need_int(cfg, "intermediate_size", where), "shared_intermediate": 0, "gated": True}
        return moe, ["moe"] * n
    if arch in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        e = _need_int(cfg, "num_experts", where)
        step = int(cfg.get("decoder_sparse_step") or 1)
        only = set(cfg.get("mlp_only_layers") or [])
        moe = {"num_experts": e, "top_k": _need_int(cfg, "num_experts_per_tok", where),
               "moe_intermediate": _need_int(cfg, "moe_intermediate_size", where),
               "shared_intermediate": int(cfg.get("shared_expert_intermediate_size") or 0), "gated": True}
        mlps = ["moe" if (i not in only and (i + 1) % step == 0) else "gated" for i in range(n)]
        if "gated" in mlps and intermediate <= 0:
            raise BadInput(f"{where}: config.json lacks 'intermediate_size' for its dense layers")
        return moe, mlps
    # DeepSeek V2/V3
    e = int(cfg.get("n_routed_experts") or 0)
    if e <= 0:
        if intermediate <= 0:
            raise BadInput(f"{where}: config.json lacks 'intermediate_size'")
        return {}, ["gated"] * n
    first = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    moe_i = _need_int(cfg, "moe_intermediate_size", where)
    moe = {"num_experts": e, "top_k": _need_int(cfg, "num_experts_per_tok", where), "moe_intermediate": moe_i,
           "shared_intermediate": int(cfg.get("n_shared_experts") or 0) * moe_i, "gated": True}
    mlps = ["moe" if (i >= first and i % freq == 0) else "gated" for i in range(n)]
    if "gated" in mlps and intermediate <= 0:
        raise BadInput(f"{where}: config.json lacks 'intermediate_size' for its dense layers")
    return moe, mlps


def _hybrid_layout(cfg: dict, arch: str, where: str, hidden: int, dtype: str):
    if arch == "NemotronHForCausalLM":
        pattern = cfg.get("hybrid_override_pattern")
        types = cfg.get("layers_block_type") or cfg.get("layer_types")
        if isinstance(pattern, str) and pattern:
            mapping = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
            if any(c not in mapping for c in pattern):
                raise BadInput(f"{where}: hybrid_override_pattern has characters other than M * - E: {pattern!r}")
            blocks = [mapping[c] for c in pattern]
        elif isinstance(types, list) and types:
            alias = {"linear_attention": "mamba", "full_attention": "attention"}
            blocks = [alias.get(t, t) for t in types]
        else:
            raise BadInput(f"{where}: config.json lacks 'hybrid_override_pattern' (or layers_block_type)")
        n = len(blocks)
        kinds = ["mamba" if b == "mamba" else "full" if b == "attention" else "none" for b in blocks]
        mlps = ["plain" if b == "mlp" else "moe" if b == "moe" else "none" for b in blocks]
        heads = _need_int(cfg, "mamba_num_heads", where)
        hdim = _need_int(cfg, "mamba_head_dim", where)
        ssm_dtype = str(cfg.get("mamba_ssm_cache_dtype") or "float32")
        mamba = MambaDims("mamba2", heads * hdim, _need_int(cfg, "ssm_state_size", where), _need_int(cfg, "conv_kernel", where),
                          n_groups=_need_int(cfg, "n_groups", where), num_heads=heads, head_dim=hdim,
                          chunk_size=int(cfg.get("chunk_size") or 128), ssm_dtype_bytes=DTYPE_BYTES.get(ssm_dtype, 4),
                          conv_dtype_bytes=DTYPE_BYTES[dtype])
        moe = {}
        if "moe" in mlps:
            i_moe = _need_int(cfg, "moe_intermediate_size", where)
            moe = {"num_experts": _need_int(cfg, "n_routed_experts", where), "top_k": _need_int(cfg, "num_experts_per_tok", where),
                   "moe_intermediate": i_moe,
                   "shared_intermediate": int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_shared_expert_intermediate_size") or i_moe),
                   "gated": False}
        if "plain" in mlps:
            _need_int(cfg, "intermediate_size", where)
        return n, kinds, mlps, [0] * n, mamba, moe
    # Jamba
    n = _need_int(cfg, "num_hidden_layers", where)
    ap, ao = int(cfg.get("attn_layer_period") or 8), int(cfg.get("attn_layer_offset") or 4)
    ep, eo = int(cfg.get("expert_layer_period") or 2), int(cfg.get("expert_layer_offset") or 1)
    e = int(cfg.get("num_experts") or 1)
    kinds = ["full" if i % ap == ao else "mamba" for i in range(n)]
    mlps = ["moe" if (e > 1 and i % ep == eo) else "gated" for i in range(n)]
    expand = _need_int(cfg, "mamba_expand", where)
    dt_rank = cfg.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank in (None, "auto") else int(dt_rank)
    mamba = MambaDims("mamba1", expand * hidden, _need_int(cfg, "mamba_d_state", where), _need_int(cfg, "mamba_d_conv", where),
                      dt_rank=dt_rank, ssm_dtype_bytes=DTYPE_BYTES[dtype], conv_dtype_bytes=DTYPE_BYTES[dtype])
    moe = {}
    if "moe" in mlps:
        moe = {"num_experts": e, "top_k": _need_int(cfg, "num_experts_per_tok", where),
               "moe_intermediate": _need_int(cfg, "intermediate_size", where), "shared_intermediate": 0, "gated": True}
    _need_int(cfg, "intermediate_size", where)
    return n, kinds, mlps, [0] * n, mamba, moe


# ---------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts; ``linear`` is what weight quantization applies to."""
    embedding: int
    lm_head: int
    linear: int
    other: int

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.linear + self.other


def parameter_counts(m: ModelInfo) -> ParamCounts:
    """Count parameters from the config (the layout vLLM builds; vocab padded to a multiple of 64)."""
    h = m.hidden_size
    vocab = round_up(m.vocab_size, VOCAB_PADDING)
    emb = vocab * h
    head = 0 if m.tie_word_embeddings else vocab * h
    linear = other = 0
    for i in range(m.num_layers):
        kind, mlp = m.layer_kinds[i], m.mlp_kinds[i]
        if kind in ("full", "sliding"):
            kvd = m.num_kv_heads * m.head_dim
            qd = m.num_attention_heads * m.head_dim
            linear += h * (qd + 2 * kvd) + qd * h
            other += h
            if m.attention_bias:
                other += qd + 2 * kvd
            if m.qk_norm:
                other += 2 * m.head_dim
            if m.model_type.startswith(("gemma2", "gemma3")):
                other += 2 * h            # pre/post feed-forward norms besides input/post-attention
        elif kind == "mla":
            a = m.mla
            qk_head = a["qk_nope_head_dim"] + a["qk_rope_head_dim"]
            if a["q_lora_rank"]:
                linear += h * a["q_lora_rank"] + a["q_lora_rank"] * m.num_attention_heads * qk_head
                other += a["q_lora_rank"]
            else:
                linear += h * m.num_attention_heads * qk_head
            linear += h * (a["kv_lora_rank"] + a["qk_rope_head_dim"])
            linear += a["kv_lora_rank"] * m.num_attention_heads * (a["qk_nope_head_dim"] + a["v_head_dim"])
            linear += m.num_attention_heads * a["v_head_dim"] * h
            other += a["kv_lora_rank"] + h
        elif kind == "mamba":
            d = m.mamba
            if d.kind == "mamba2":
                conv_dim = d.d_inner + 2 * d.n_groups * d.state_size
                linear += h * (d.d_inner + conv_dim + d.num_heads) + d.d_inner * h
                other += conv_dim * (d.conv_kernel + 1) + 3 * d.num_heads + d.d_inner + h
            else:
                linear += h * 2 * d.d_inner + d.d_inner * (d.dt_rank + 2 * d.state_size) + d.d_inner * h
                other += d.d_inner * (d.conv_kernel + 1) + d.dt_rank * d.d_inner + d.d_inner + \
                    d.d_inner * d.state_size + d.d_inner + h
        if mlp == "gated":
            linear += 3 * h * m.intermediate_size
            other += h
        elif mlp == "plain":
            linear += 2 * h * m.intermediate_size
            other += h
        elif mlp == "moe":
            mats = 3 if m.moe.get("gated", True) else 2
            linear += m.moe["num_experts"] * mats * h * m.moe["moe_intermediate"]
            linear += mats * h * m.moe.get("shared_intermediate", 0)
            other += h * m.moe["num_experts"] + h
    other += h   # final norm
    return ParamCounts(embedding=emb, lm_head=head, linear=linear, other=other)


def round_up(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


def rope_cache_bytes(m: ModelInfo) -> int:
    """vLLM's RoPE ``cos_sin_cache`` buffers: rows x rotary_dim x dtype for each distinct RoPE. Sized by
    the config's ``max_position_embeddings`` (x the scaling factor), NOT by max_model_len: the gpu-kit Llama
    (4,000,000 positions x 128 x 2 B = 0.95 GiB) made "Model loading took 2.61 GiB" for 1.65 GiB of weights."""
    return sum(rows * dim * m.dtype_bytes for rows, dim in m.rope_caches)


@dataclass(frozen=True)
class WeightsEstimate:
    parameter_bytes: int     # the weights on ONE rank (after tensor parallel), before any CPU offload
    rope_cache_bytes: int
    source: str              # "safetensors headers" | "safetensors index" | "config.json"
    parameters: int          # parameter count of the whole model (config) or 0 when only bytes are known

    @property
    def total(self) -> int:
        """What vLLM's "Model loading took X GiB" measures: weights + RoPE cache."""
        return self.parameter_bytes + self.rope_cache_bytes


def weights_bytes(m: ModelInfo, tensor_parallel_size: int = 1, quantization: str | None = None,
                  use_checkpoint: bool = True) -> WeightsEstimate:
    """Weights resident on one GPU. From the safetensors headers when the directory has them (exact for an
    unquantized checkpoint), else from the config: embeddings/lm_head/norms at the model dtype, linear
    layers at the quantization's bits (+ scales). ``quantization='fp8'`` models vLLM's online FP8
    quantization of an unquantized checkpoint. Tensor parallel divides everything (norms, replicated in
    reality, are a rounding error)."""
    tp = _positive_int(tensor_parallel_size, "tensor_parallel_size")
    counts = parameter_counts(m)
    rope = rope_cache_bytes(m)
    if use_checkpoint and quantization is None and Path(m.path).is_dir():
        st = safetensors_summary(m.path, m.dtype_bytes)
        if st is not None:
            return WeightsEstimate(cdiv(st.loaded_bytes, tp), rope, "safetensors headers", counts.total)
        total = safetensors_index_total(m.path)
        if total is not None:
            return WeightsEstimate(cdiv(total, tp), rope, "safetensors index (metadata.total_size)", counts.total)
    q = m.quantization
    if quantization is not None:
        if quantization != "fp8":
            raise BadInput(f"online quantization {quantization!r} is not modelled (fp8 is)")
        q = Quantization("fp8", 8, 0, 0.0)
    dense = (counts.embedding + counts.lm_head + counts.other) * m.dtype_bytes
    lin = counts.linear * (q.bytes_per_param() if q else m.dtype_bytes)
    return WeightsEstimate(cdiv(int(math.ceil(dense + lin)), tp), rope, "config.json", counts.total)


# ---------------------------------------------------------------------------------------------------
# KV cache specs (one small dataclass per layer kind, like vllm/v1/kv_cache_interface.py)
# ---------------------------------------------------------------------------------------------------

KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
                   "fp8_ds_mla", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "nvfp4")


@dataclass(frozen=True)
class KVFormat:
    """How one head of K (or V) for one token is stored, for a ``kv_cache_dtype``."""
    name: str
    elem_bytes: int
    per_token_head_scales: bool = False
    packing: str = ""     # "" | "int4" | "nvfp4"

    def head_bytes(self, head_size: int) -> int:
        if self.packing == "nvfp4":
            return head_size // 2 + head_size // 16     # fp4 data + fp8 block scales (nvfp4_kv_cache_full_dim)
        if self.packing == "int4":
            return head_size // 2
        return head_size * self.elem_bytes


def kv_format(kv_cache_dtype: str, model_dtype: str) -> KVFormat:
    """``auto`` = the model dtype; fp8 variants 1 byte; nvfp4 packed 4-bit + fp8 scales per 16."""
    d = (kv_cache_dtype or "auto").lower()
    if d not in KV_CACHE_DTYPES:
        raise BadInput(f"unknown kv_cache_dtype {kv_cache_dtype!r} (use one of: {', '.join(KV_CACHE_DTYPES)})")
    if d == "auto":
        return KVFormat(model_dtype, DTYPE_BYTES[model_dtype])
    if d in ("float16", "bfloat16", "float32"):
        return KVFormat(d, DTYPE_BYTES[d])
    if d in ("int8_per_token_head", "fp8_per_token_head"):
        return KVFormat(d, 1, per_token_head_scales=True)
    if d == "int4_per_token_head":
        return KVFormat(d, 1, per_token_head_scales=True, packing="int4")
    if d == "nvfp4":
        return KVFormat(d, 1, packing="nvfp4")
    return KVFormat(d, 1)


@dataclass(frozen=True)
class FullAttentionSpec:
    """Full attention (MHA/GQA): K and V for every token, ``cdiv(max_model_len, block_size)`` pages."""
    block_size: int
    num_kv_heads: int
    head_bytes: int                       # one head of K for one token
    scale_bytes: int = 0                  # per-token-head scales (K and V), bytes per token
    page_size_padded: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_bytes + self.scale_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded or self.block_size * self.bytes_per_token

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes

    def with_block_size(self, block_size: int):
        return replace(self, block_size=block_size)


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Sliding-window attention: a request holds ``cdiv(min(window - 1 + max_num_batched_tokens,
    max_model_len), block_size) + 1`` pages (the last window plus the chunk being prefilled)."""
    sliding_window: int = 0

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return (cdiv(tokens, self.block_size) + 1) * self.page_size_bytes


@dataclass(frozen=True)
class MLASpec(FullAttentionSpec):
    """Multi-head latent attention (DeepSeek-V2/V3): ONE latent of kv_lora_rank + qk_rope_head_dim per
    token and layer, no K/V factor 2. ``fp8_ds_mla`` is vLLM's 656-byte custom layout."""
    fixed_bytes_per_token: int = 0

    @property
    def bytes_per_token(self) -> int:
        return self.fixed_bytes_per_token or self.num_kv_heads * self.head_bytes


@dataclass(frozen=True)
class MambaSpec:
    """Mamba state: conv state + SSM state per SEQUENCE (not per token). One page per request with prefix
    caching off (vLLM 0.25.1's default for hybrid models: mamba_cache_mode 'none')."""
    shapes: tuple
    dtype_bytes: tuple
    block_size: int = 0
    page_size_padded: int | None = None

    bytes_per_token = 0

    @property
    def state_bytes(self) -> int:
        return sum(math.prod(s) * b for s, b in zip(self.shapes, self.dtype_bytes))

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded or self.state_bytes

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return self.page_size_bytes

    def with_block_size(self, block_size: int):
        return replace(self, block_size=block_size)


Spec = Union[FullAttentionSpec, SlidingWindowSpec, MLASpec, MambaSpec]


def _divide(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise BadInput(f"{what} ({n}) is not divisible by tensor_parallel_size {tp}; vLLM would refuse the model")
    return n // tp


def mamba_state_shapes(d: MambaDims, tp: int) -> tuple:
    """vLLM's MambaStateShapeCalculator (conv layout 'SD'): mamba2 conv (k-1, (d_inner+2*G*S)/tp) and ssm
    (H/tp, P, S); mamba1 conv (k-1, d_inner/tp) and ssm (d_inner/tp, S)."""
    if d.kind == "mamba2":
        groups = d.n_groups + (0 if d.n_groups % tp == 0 else tp - d.n_groups)
        conv_dim = d.d_inner + 2 * groups * d.state_size
        return ((d.conv_kernel - 1, _divide(conv_dim, tp, "mamba conv dim")),
                (_divide(d.num_heads, tp, "mamba_num_heads"), d.head_dim, d.state_size))
    inner = _divide(d.d_inner, tp, "mamba intermediate size")
    return ((d.conv_kernel - 1, inner), (inner, d.state_size))


def layer_specs(m: ModelInfo, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
                block_size: int | None = None) -> list:
    """One spec per layer that holds cache, on one TP rank, with vLLM 0.25.1's hybrid block-size alignment
    applied (attention block raised so an attention page >= a Mamba page; the Mamba page padded to equal)."""
    tp = _positive_int(tensor_parallel_size, "tensor_parallel_size")
    bs = _positive_int(block_size or DEFAULT_BLOCK_SIZE, "block_size")
    fmt = kv_format(kv_cache_dtype, m.dtype)
    if m.mla and fmt.name == "nvfp4":
        raise BadInput("nvfp4 KV cache is not supported with MLA models in vLLM 0.25.1 (use fp8 or auto)")
    if fmt.name == "fp8_ds_mla" and not m.mla:
        raise BadInput("kv_cache_dtype fp8_ds_mla only applies to MLA (DeepSeek) models")
    kvh = max(1, m.num_kv_heads // tp)
    specs: list = []
    for i, kind in enumerate(m.layer_kinds):
        scales = 2 * kvh * 4 if fmt.per_token_head_scales else 0
        if kind == "full":
            specs.append(FullAttentionSpec(bs, kvh, fmt.head_bytes(m.head_dim), scales))
        elif kind == "sliding":
            specs.append(SlidingWindowSpec(bs, kvh, fmt.head_bytes(m.head_dim), scales,
                                           sliding_window=m.sliding_windows[i]))
        elif kind == "mla":
            fixed = 656 if fmt.name == "fp8_ds_mla" else 0
            hb = m.head_dim // 2 if fmt.packing == "int4" else m.head_dim * fmt.elem_bytes
            specs.append(MLASpec(bs, 1, hb, 0, fixed_bytes_per_token=fixed))
        elif kind == "mamba":
            d = m.mamba
            specs.append(MambaSpec(mamba_state_shapes(d, tp), (d.conv_dtype_bytes, d.ssm_dtype_bytes)))
    return align_hybrid_block_size(specs, bs)


def align_hybrid_block_size(specs: list, kernel_block_alignment: int = DEFAULT_BLOCK_SIZE) -> list:
    """``Platform._align_hybrid_block_size`` (mamba_cache_mode 'none'): attention block size =
    alignment x cdiv(mamba_page, alignment x attention_page_per_token); the Mamba page padded to match."""
    mambas = [s for s in specs if isinstance(s, MambaSpec)]
    attns = [s for s in specs if not isinstance(s, MambaSpec)]
    if not mambas or not attns:
        return specs
    mamba_page = max(s.state_bytes for s in mambas)
    per_token = attns[0].bytes_per_token
    block = attns[0].block_size
    new_block = kernel_block_alignment * cdiv(mamba_page, kernel_block_alignment * per_token)
    block = max(block, new_block)
    attn_page = block * per_token
    out = []
    for s in specs:
        if isinstance(s, MambaSpec):
            out.append(replace(s, block_size=block, page_size_padded=attn_page if attn_page != s.state_bytes else None))
        else:
            out.append(s.with_block_size(block))
    return out


def kv_bytes_per_token(m: ModelInfo, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    """Bytes one token costs across all attention layers of one rank (sliding layers included, while the
    token is inside the window). Mamba state is per sequence: see ``mamba_state_bytes_per_sequence``."""
    return sum(s.bytes_per_token for s in layer_specs(m, kv_cache_dtype, tensor_parallel_size)
               if not isinstance(s, MambaSpec))


def mamba_state_bytes_per_sequence(m: ModelInfo, tensor_parallel_size: int = 1) -> int:
    """Conv + SSM state of all Mamba layers for one sequence on one rank (unpadded)."""
    return sum(s.state_bytes for s in layer_specs(m, "auto", tensor_parallel_size) if isinstance(s, MambaSpec))


# ---------------------------------------------------------------------------------------------------
# Grouping into the shared block pool, block count, capacity (vllm/v1/core/kv_cache_utils.py, 0.25.1)
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KVGroup:
    spec: Any
    num_layers: int


@dataclass(frozen=True)
class KVLayout:
    """How the layers share one block pool. ``uniform_type``: one group of same-type layers with different
    page sizes (UniformTypeKVCacheSpecs); otherwise every group's page is ``page_size_bytes``."""
    groups: tuple
    group_size: int
    page_size_bytes: int
    uniform_type: bool = False
    layer_specs: tuple = ()

    @property
    def block_size(self) -> int:
        return self.groups[0].spec.block_size if self.groups else 0

    @property
    def bytes_per_block(self) -> int:
        """One block of the pool across all layers (``_pool_bytes_per_block``)."""
        if self.uniform_type:
            return sum(s.page_size_bytes for s in self.layer_specs)
        return self.page_size_bytes * self.group_size

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens needs (all groups)."""
        if self.uniform_type:
            return max(cdiv(s.max_memory_usage_bytes(max_model_len, max_num_batched_tokens), s.page_size_bytes)
                       for s in self.layer_specs)
        return sum(cdiv(g.spec.max_memory_usage_bytes(max_model_len, max_num_batched_tokens), self.page_size_bytes)
                   for g in self.groups)

    def needed_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """``_max_memory_usage_bytes_from_groups``: KV bytes for ONE request of max_model_len (the number in
        "To serve at least one request ... (X GiB KV cache is needed ...")."""
        if not self.groups:
            return 0
        if self.uniform_type:
            return sum(s.max_memory_usage_bytes(max_model_len, max_num_batched_tokens) for s in self.layer_specs)
        return self.bytes_per_block * self.blocks_per_request(max_model_len, max_num_batched_tokens)

    def num_blocks(self, available_bytes: int) -> int:
        if not self.groups:
            return 1
        return max(0, int(available_bytes) // self.bytes_per_block)


def _same_type(specs: list) -> bool:
    first = specs[0]
    if any(s.block_size != first.block_size for s in specs):
        return False
    if isinstance(first, SlidingWindowSpec):
        return all(isinstance(s, SlidingWindowSpec) and s.sliding_window == first.sliding_window for s in specs)
    if isinstance(first, MambaSpec):
        return all(isinstance(s, MambaSpec) for s in specs)
    return all(type(s) in (FullAttentionSpec, MLASpec) and type(s) is type(first) for s in specs)


def group_layers(specs: list) -> KVLayout:
    """vLLM's ``get_kv_cache_groups``: identical specs -> one group; same type with different sizes -> one
    UniformType group; otherwise page sizes are unified (larger block size for smaller pages) and layers
    are grouped by spec with ``group_size`` = the smallest type's layer count (or the largest one when
    they are within 1.5x), padding the last group of each type."""
    if not specs:
        return KVLayout((), 0, 0)
    if all(s == specs[0] for s in specs):
        return KVLayout((KVGroup(specs[0], len(specs)),), len(specs), specs[0].page_size_bytes, False, tuple(specs))
    if _same_type(specs):
        return KVLayout((KVGroup(specs[0], len(specs)),), len(specs), 0, True, tuple(specs))
    pages = {s.page_size_bytes for s in specs}
    top = max(pages)
    unified = []
    for s in specs:
        if s.page_size_bytes == top:
            unified.append(s)
        elif top % s.page_size_bytes == 0 and not isinstance(s, MambaSpec):
            unified.append(s.with_block_size(s.block_size * (top // s.page_size_bytes)))
        else:
            raise BadInput("the layers' KV page sizes cannot be unified (vLLM raises NotImplementedError)")
    by_spec: dict = {}
    for s in unified:
        by_spec.setdefault(s, []).append(s)
    counts = [len(v) for v in by_spec.values()]
    gs = min(counts)
    if max(counts) < gs * 1.5:
        gs = max(counts)
    groups = []
    for spec, layers in by_spec.items():
        n = len(layers)
        for i in range(cdiv(n, gs)):
            groups.append(KVGroup(spec, len(range(i, n, cdiv(n, gs)))))
    return KVLayout(tuple(groups), gs, top, False, tuple(unified))


def kv_layout(m: ModelInfo, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
              block_size: int | None = None) -> KVLayout:
    return group_layers(layer_specs(m, kv_cache_dtype, tensor_parallel_size, block_size))


@dataclass(frozen=True)
class KVCapacity:
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    kv_tokens: int            # "GPU KV cache size: N tokens" (0.25.1: int(max_concurrency * max_model_len))


def kv_capacity(layout: KVLayout, available_bytes: int, max_model_len: int, max_num_batched_tokens: int) -> KVCapacity:
    """Blocks, max concurrency and the logged token count for an arena of ``available_bytes``."""
    if not layout.groups:
        return KVCapacity(1, 1, 0.0, 0)
    nb = layout.num_blocks(available_bytes)
    per_req = layout.blocks_per_request(max_model_len, max_num_batched_tokens)
    conc = nb / per_req
    return KVCapacity(nb, per_req, conc, int(conc * max_model_len))


def estimate_max_model_len(layout: KVLayout, available_bytes: int, upper: int, max_num_batched_tokens: int,
                           reserve_block: bool = False) -> int:
    """vLLM's ``estimate_max_model_len``: the largest length in [1, upper] whose one-request need fits
    (binary search). 0 when not even one token fits. ``reserve_block``: 0.33.0 keeps one null block back."""
    avail = available_bytes - (layout.bytes_per_block if reserve_block and layout.groups else 0)
    if not layout.groups:
        return upper

    def fits(n: int) -> bool:
        return layout.needed_bytes(n, max_num_batched_tokens) <= avail

    if upper < 1 or not fits(1):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


# ---------------------------------------------------------------------------------------------------
# Activation, overheads, CUDA graphs (APPROXIMATIONS, calibrated; see CALIBRATION)
# ---------------------------------------------------------------------------------------------------

def forward_bytes_per_token(m: ModelInfo, tensor_parallel_size: int = 1) -> int:
    """APPROXIMATION: activation bytes per scheduled token at the forward peak of the profiling run:
    dtype x (4 x hidden) for residual/hidden/norm copies + the largest per-layer intermediate on this rank."""
    tp = _positive_int(tensor_parallel_size, "tensor_parallel_size")
    h, b = m.hidden_size, m.dtype_bytes
    peak = 0
    for i, kind in enumerate(m.layer_kinds):
        mlp = m.mlp_kinds[i]
        if kind in ("full", "sliding"):
            peak = max(peak, b * (2 * m.num_attention_heads * m.head_dim + 2 * m.num_kv_heads * m.head_dim) // tp)
        elif kind == "mla":
            a = m.mla
            peak = max(peak, b * m.num_attention_heads * (2 * (a["qk_nope_head_dim"] + a["qk_rope_head_dim"]) +
                                                         a["v_head_dim"]) // tp)
        elif kind == "mamba":
            d = m.mamba
            if d.kind == "mamba2":
                proj = 2 * d.d_inner + 2 * d.n_groups * d.state_size + d.num_heads
                states = d.num_heads * d.head_dim * d.state_size * 4 / d.chunk_size
                peak = max(peak, int((b * (proj + d.d_inner) + states) // tp))
            else:
                peak = max(peak, b * (3 * d.d_inner + 2 * d.state_size) // tp)
        if mlp == "gated":
            peak = max(peak, b * 3 * m.intermediate_size // tp)
        elif mlp == "plain":
            peak = max(peak, b * 2 * m.intermediate_size // tp)
        elif mlp == "moe":
            k, mi, si = m.moe["top_k"], m.moe["moe_intermediate"], m.moe.get("shared_intermediate", 0)
            peak = max(peak, b * (k * (3 * mi // tp + h) + 3 * si // tp))
    return b * FORWARD_HIDDEN_COPIES * h + peak


def activation_peak_bytes(m: ModelInfo, max_num_batched_tokens: int, max_num_seqs: int,
                          tensor_parallel_size: int = 1) -> int:
    """APPROXIMATION of vLLM's measured ``torch peak memory increase`` in ``profile_run``: the larger of the
    dummy forward over ``max_num_batched_tokens`` tokens and the dummy sampler run over ``min(max_num_seqs,
    max_num_batched_tokens)`` rows of fp32 logits."""
    n = _positive_int(max_num_batched_tokens, "max_num_batched_tokens")
    s = min(_positive_int(max_num_seqs, "max_num_seqs"), n)
    forward = n * forward_bytes_per_token(m, tensor_parallel_size)
    sampler = s * round_up(m.vocab_size, VOCAB_PADDING) * SAMPLER_BYTES_PER_LOGIT // max(1, tensor_parallel_size)
    return max(forward, sampler)


def cuda_graph_capture_size(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """0.25.1's default largest capture size: min(2 x max_num_seqs, 512, max_num_batched_tokens)."""
    return min(2 * max_num_seqs, 512, max_num_batched_tokens)


def cuda_graph_bytes(m: ModelInfo, max_num_seqs: int, max_num_batched_tokens: int,
                     tensor_parallel_size: int = 1, enforce_eager: bool = False) -> int:
    """APPROXIMATION of the CUDA-graph pool: base + capture size x factor x forward bytes per token
    (calibrated on the gpu-kit Llama's captures: 0.42 GiB at size 512, 0.16 GiB at 128). 0 when eager."""
    if enforce_eager:
        return 0
    size = cuda_graph_capture_size(max_num_seqs, max_num_batched_tokens)
    return CUDA_GRAPH_BASE_BYTES + int(size * CUDA_GRAPH_TOKEN_FACTOR * forward_bytes_per_token(m, tensor_parallel_size))


# ---------------------------------------------------------------------------------------------------
# Settings and vLLM's defaults
# ---------------------------------------------------------------------------------------------------

def batch_defaults(gpu_total_bytes: int, usage_context: str = "serve", engine_version: str = DEFAULT_ENGINE_VERSION,
                   gpu_name: str = "") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that ``EngineArgs.get_batch_defaults`` picks from the NVML
    total memory and the usage context ('serve' = OPENAI_API_SERVER, 'llm' = LLM_CLASS)."""
    if usage_context not in ("serve", "llm"):
        raise BadInput(f"usage_context must be 'serve' or 'llm', got {usage_context!r}")
    big = gpu_total_bytes >= 70 * GiB and "a100" not in gpu_name.lower()
    if engine_version == "0.33.0" and gpu_total_bytes >= 160 * GiB:
        return (16384, 1024)
    if big:
        return (8192, 1024) if usage_context == "serve" else (16384, 1024)
    return (2048, 256) if usage_context == "serve" else (8192, 256)


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


def resolve_settings(m: ModelInfo, gpu_memory_bytes: int, free_bytes: int | None = None,
                     max_model_len: Union[int, str, None] = None, gpu_memory_utilization: float | None = None,
                     kv_cache_dtype: str | None = None, max_num_seqs: int | None = None,
                     max_num_batched_tokens: int | None = None, kv_cache_memory_bytes: int | None = None,
                     tensor_parallel_size: int | None = None, engine_version: str | None = None,
                     usage_context: str = "serve", gpu_name: str = "", block_size: int | None = None,
                     enforce_eager: bool = False, quantization: str | None = None,
                     cpu_offload_bytes: int = 0) -> Settings:
    """Validate the inputs and fill in what vLLM would default. Raises BadInput for nonsense."""
    version = engine_version or DEFAULT_ENGINE_VERSION
    if version not in SUPPORTED_ENGINE_VERSIONS:
        raise BadInput(f"engine version {version!r} is not modelled (supported: {', '.join(SUPPORTED_ENGINE_VERSIONS)})")
    total = _positive_int(gpu_memory_bytes, "gpu memory (total bytes)")
    reserved = DRIVER_RESERVED_BYTES.get(gpu_name.lower(), DEFAULT_DRIVER_RESERVED_BYTES)
    if total <= reserved + CUDA_CONTEXT_BYTES:
        raise BadInput(f"gpu memory {total} bytes is too small to hold even the driver reserve and a CUDA context")
    if free_bytes is None:
        free = total - reserved
    else:
        if isinstance(free_bytes, bool) or not isinstance(free_bytes, (int, float)) or free_bytes < 0:
            raise BadInput(f"free memory must be a non-negative size, got {free_bytes!r}")
        free = int(free_bytes)
        if free > total:
            raise BadInput(f"free memory ({free} bytes) cannot exceed the GPU's total ({total} bytes)")
    util = DEFAULT_GPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not (0 < util <= 1):
        raise BadInput(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    tp = _positive_int(tensor_parallel_size or 1, "tensor_parallel_size")
    if m.num_attention_heads % tp:
        raise BadInput(f"num_attention_heads ({m.num_attention_heads}) is not divisible by tensor_parallel_size {tp}; "
                       "vLLM would refuse the model")
    kvd = kv_format(kv_cache_dtype or "auto", m.dtype).name if (kv_cache_dtype or "auto") != "auto" else "auto"
    if (kv_cache_dtype or "auto") == "auto" and m.quantization and m.quantization.kv_cache_dtype:
        kvd = m.quantization.kv_cache_dtype          # resolve_kv_cache_dtype_string: the checkpoint's scheme
    if max_model_len in (None, ""):
        mml, src = m.derived_max_model_len, f"config ({m.max_len_key})"
    elif isinstance(max_model_len, str) and max_model_len.lower() in ("auto", "-1"):
        mml, src = -1, "auto"
    else:
        mml, src = _positive_int(max_model_len, "max_model_len"), "user"
    d_mbt, d_seqs = batch_defaults(total, usage_context, version, gpu_name)
    seqs = _positive_int(max_num_seqs, "max_num_seqs") if max_num_seqs is not None else d_seqs
    if max_num_batched_tokens is not None:
        mbt = _positive_int(max_num_batched_tokens, "max_num_batched_tokens")
    else:
        mbt = d_mbt if mml == -1 else min(seqs * mml, d_mbt)
    if max_num_seqs is None:
        seqs = min(seqs, mbt)
    pinned = None
    if kv_cache_memory_bytes is not None:
        pinned = _positive_int(kv_cache_memory_bytes, "kv_cache_memory_bytes")
    if block_size is not None:
        _positive_int(block_size, "block_size")
    if cpu_offload_bytes < 0:
        raise BadInput("cpu_offload_gb must not be negative")
    return Settings(total, free, float(util), mml, seqs, mbt, kvd, pinned, tp, block_size, bool(enforce_eager),
                    version, usage_context, gpu_name, quantization, int(cpu_offload_bytes), reserved, src)


# ---------------------------------------------------------------------------------------------------
# The whole prediction
# ---------------------------------------------------------------------------------------------------

#: failure classes (CONTRACT.md) in the order vLLM would hit them
FAILURE_PHASES = {
    "config_invalid": "config", "free_memory_below_utilization": "profiling", "weights_load_oom": "weights_load",
    "profiling_oom": "profiling", "kv_capacity": "kv_reservation", "kv_allocation_oom": "kv_reservation",
    "cuda_graph_oom": "cuda_graph",
}


@dataclass(frozen=True)
class Prediction:
    settings: Settings
    fits: bool
    failure: str | None
    reason: str
    cuda_total_bytes: int
    startup_free_bytes: int               # free memory as vLLM's start-up snapshot sees it
    requested_bytes: int
    startup_check_ok: bool
    weights: WeightsEstimate
    weights_on_gpu_bytes: int             # weights + RoPE cache - cpu offload
    activation_peak_bytes: int
    profile_overhead_bytes: int
    cuda_graph_estimate_bytes: int        # subtracted from the budget (V1 runner / 0.33.0)
    cuda_graph_unbudgeted_bytes: int      # captured after the KV cache without a reservation (0.25.1 V2 runner)
    available_kv_bytes: int
    layout: KVLayout
    capacity: KVCapacity
    kv_bytes_per_token: int
    mamba_state_bytes_per_sequence: int
    kv_needed_bytes: int
    max_model_len: int
    max_model_len_that_fits: int
    peak_after_start_bytes: int
    headroom_bytes: int
    v2_runner: bool


def evaluate(m: ModelInfo, s: Settings) -> Prediction:
    """Walk vLLM's start-up in order and predict where (if anywhere) it fails, plus the KV numbers."""
    tp = s.tensor_parallel_size
    cuda_total = s.gpu_memory_bytes - s.driver_reserved_bytes
    vfree = max(0, s.free_bytes - CUDA_CONTEXT_BYTES)
    requested = math.ceil(cuda_total * s.gpu_memory_utilization)
    w = weights_bytes(m, tp, s.quantization)
    on_gpu = max(0, w.total - s.cpu_offload_bytes)
    overhead = PROFILE_OVERHEAD_BYTES + (TP_COMM_OVERHEAD_BYTES if tp > 1 else 0)
    act = activation_peak_bytes(m, s.max_num_batched_tokens, s.max_num_seqs, tp)
    v2 = m.uses_v2_runner(s.engine_version)
    cg = cuda_graph_bytes(m, s.max_num_seqs, s.max_num_batched_tokens, tp, s.enforce_eager)
    cg_budgeted = 0 if (v2 and s.engine_version == "0.25.1") else cg
    cg_unbudgeted = cg - cg_budgeted
    layout = kv_layout(m, s.kv_cache_dtype, tp, s.block_size)
    if s.kv_cache_memory_bytes is not None:
        available = s.kv_cache_memory_bytes
    else:
        available = requested - on_gpu - overhead - act - cg_budgeted
    reserve = s.engine_version == "0.33.0"
    upper = m.derived_max_model_len
    fit_len = estimate_max_model_len(layout, available, upper, s.max_num_batched_tokens, reserve)
    mml = s.max_model_len
    if mml == -1:          # auto-fit: the largest length that fits, capped by the model
        mml = fit_len if fit_len > 0 else 1
    cap = kv_capacity(layout, available, mml, s.max_num_batched_tokens)
    needed = layout.needed_bytes(mml, s.max_num_batched_tokens)
    check_mem = available - (layout.bytes_per_block if reserve and layout.groups else 0)
    kv_resident = cap.num_blocks * layout.bytes_per_block if layout.groups else 0
    persistent = PERSISTENT_OVERHEAD_BYTES + (TP_COMM_OVERHEAD_BYTES if tp > 1 else 0)
    peak_after = on_gpu + kv_resident + persistent + cg_unbudgeted
    if s.kv_cache_memory_bytes is not None:
        peak_after = on_gpu + kv_resident + persistent + cg
    headroom = vfree - peak_after
    failure, reason = None, "fits"
    gib = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
    if mml > upper:
        failure, reason = "config_invalid", f"max_model_len {mml} exceeds the model's {upper} ({m.max_len_key})"
    elif s.max_num_batched_tokens < s.max_num_seqs:
        failure, reason = "config_invalid", (f"max_num_batched_tokens ({s.max_num_batched_tokens}) must be >= "
                                             f"max_num_seqs ({s.max_num_seqs})")
    elif vfree < requested:
        failure, reason = "free_memory_below_utilization", (
            f"free {gib(vfree)} < requested {gib(requested)} = ceil({gib(cuda_total)} x {s.gpu_memory_utilization})")
    elif on_gpu > vfree:
        failure, reason = "weights_load_oom", f"weights {gib(on_gpu)} > free {gib(vfree)}"
    elif on_gpu + overhead + act > vfree:
        failure, reason = "profiling_oom", f"weights + activation peak {gib(on_gpu + overhead + act)} > free {gib(vfree)}"
    elif layout.groups and check_mem <= 0:
        failure, reason = "kv_capacity", f"no memory left for the KV cache ({gib(available)})"
    elif layout.groups and needed > check_mem:
        failure, reason = "kv_capacity", (f"one request of {mml} tokens needs {gib(needed)} KV, "
                                          f"{gib(available)} available (largest that fits: {fit_len})")
    elif s.kv_cache_memory_bytes is not None and on_gpu + kv_resident + persistent > vfree:
        failure, reason = "kv_allocation_oom", (f"pinned KV {gib(kv_resident)} + weights {gib(on_gpu)} > free "
                                                f"{gib(vfree)}")
    elif headroom < 0:
        failure, reason = "cuda_graph_oom", (f"CUDA graphs ({gib(cg)}) do not fit after the KV cache: "
                                             f"{gib(peak_after)} needed, {gib(vfree)} free")
    return Prediction(
        settings=s, fits=failure is None, failure=failure, reason=reason, cuda_total_bytes=cuda_total,
        startup_free_bytes=vfree, requested_bytes=requested, startup_check_ok=vfree >= requested, weights=w,
        weights_on_gpu_bytes=on_gpu, activation_peak_bytes=act, profile_overhead_bytes=overhead,
        cuda_graph_estimate_bytes=cg_budgeted, cuda_graph_unbudgeted_bytes=cg_unbudgeted, available_kv_bytes=available,
        layout=layout, capacity=cap, kv_bytes_per_token=kv_bytes_per_token(m, s.kv_cache_dtype, tp),
        mamba_state_bytes_per_sequence=mamba_state_bytes_per_sequence(m, tp) if m.mamba else 0,
        kv_needed_bytes=needed, max_model_len=mml, max_model_len_that_fits=fit_len, peak_after_start_bytes=peak_after,
        headroom_bytes=headroom, v2_runner=v2,
    )


def max_utilization_for_free(cuda_total_bytes: int, startup_free_bytes: int, margin_bytes: int = 256 * MiB) -> float:
    """The largest ``gpu_memory_utilization`` (2 decimals, rounded down) that passes vLLM's start-up check
    ``free >= ceil(total x util)`` with ``margin_bytes`` to spare. 0.0 when none does."""
    if cuda_total_bytes <= 0:
        return 0.0
    u = math.floor((startup_free_bytes - margin_bytes) / cuda_total_bytes * 100) / 100
    while u > 0 and math.ceil(cuda_total_bytes * u) > startup_free_bytes - margin_bytes:
        u = round(u - 0.01, 2)
    return max(0.0, min(1.0, u))
