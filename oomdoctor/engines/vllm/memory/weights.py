"""Weights: parameter counts from the config, bytes from the safetensors headers when present, RoPE caches."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from oomdoctor.engines.vllm.memory.common import VOCAB_PADDING, cdiv, positive_int, round_up
from oomdoctor.engines.vllm.memory.model import ModelInfo
from oomdoctor.engines.vllm.memory.model_files import safetensors_index_total, safetensors_summary
from oomdoctor.engines.vllm.memory.quantization import Quantization
from oomdoctor.errors import BadInput


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


#: (linear, other) parameters of one layer's mixer / MLP
Params = tuple[int, int]


def _attention_params(m: ModelInfo) -> Params:
    h = m.hidden_size
    kvd = m.num_kv_heads * m.head_dim
    qd = m.num_attention_heads * m.head_dim
    linear, other = h * (qd + 2 * kvd) + qd * h, h
    if m.attention_bias:
        other += qd + 2 * kvd
    if m.qk_norm:
        other += 2 * m.head_dim
    if m.model_type.startswith(("gemma2", "gemma3")):
        other += 2 * h            # pre/post feed-forward norms besides input/post-attention
    return linear, other


def _mla_params(m: ModelInfo) -> Params:
    h, a, heads = m.hidden_size, m.mla_dims, m.num_attention_heads
    qk_head = a["qk_nope_head_dim"] + a["qk_rope_head_dim"]
    linear = other = 0
    if a["q_lora_rank"]:
        linear += h * a["q_lora_rank"] + a["q_lora_rank"] * heads * qk_head
        other += a["q_lora_rank"]
    else:
        linear += h * heads * qk_head
    linear += h * (a["kv_lora_rank"] + a["qk_rope_head_dim"])
    linear += a["kv_lora_rank"] * heads * (a["qk_nope_head_dim"] + a["v_head_dim"])
    linear += heads * a["v_head_dim"] * h
    return linear, other + a["kv_lora_rank"] + h


def _mamba_params(m: ModelInfo) -> Params:
    h, d = m.hidden_size, m.mamba_dims
    if d.kind == "mamba2":
        conv_dim = d.d_inner + 2 * d.n_groups * d.state_size
        return (h * (d.d_inner + conv_dim + d.num_heads) + d.d_inner * h,
                conv_dim * (d.conv_kernel + 1) + 3 * d.num_heads + d.d_inner + h)
    return (h * 2 * d.d_inner + d.d_inner * (d.dt_rank + 2 * d.state_size) + d.d_inner * h,
            d.d_inner * (d.conv_kernel + 1) + d.dt_rank * d.d_inner + d.d_inner + d.d_inner * d.state_size
            + d.d_inner + h)


def _moe_params(m: ModelInfo) -> Params:
    h, moe = m.hidden_size, m.moe_dims
    mats = 3 if moe.get("gated", True) else 2
    linear = moe["num_experts"] * mats * h * moe["moe_intermediate"] + mats * h * moe.get("shared_intermediate", 0)
    return linear, h * moe["num_experts"] + h


#: parameters per layer kind (ModelInfo.layer_kinds) and per MLP kind (ModelInfo.mlp_kinds); "none": nothing
MIXER_PARAMS: dict[str, Callable[[ModelInfo], Params]] = {
    "full": _attention_params, "sliding": _attention_params, "mla": _mla_params, "mamba": _mamba_params,
}
MLP_PARAMS: dict[str, Callable[[ModelInfo], Params]] = {
    "gated": lambda m: (3 * m.hidden_size * m.intermediate_size, m.hidden_size),
    "plain": lambda m: (2 * m.hidden_size * m.intermediate_size, m.hidden_size),
    "moe": _moe_params,
}


def parameter_counts(m: ModelInfo) -> ParamCounts:
    """Count parameters from the config (the layout vLLM builds; vocab padded to a multiple of 64)."""
    h = m.hidden_size
    vocab = round_up(m.vocab_size, VOCAB_PADDING)
    linear = other = 0
    for kind, mlp in zip(m.layer_kinds, m.mlp_kinds):
        for table, key in ((MIXER_PARAMS, kind), (MLP_PARAMS, mlp)):
            if key in table:
                lin, oth = table[key](m)
                linear, other = linear + lin, other + oth
    other += h   # final norm
    return ParamCounts(embedding=vocab * h, lm_head=0 if m.tie_word_embeddings else vocab * h, linear=linear,
                       other=other)


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


def _from_checkpoint(m: ModelInfo, tp: int, rope: int, params: int) -> WeightsEstimate | None:
    st = safetensors_summary(m.path, m.dtype_bytes)
    if st is not None:
        return WeightsEstimate(cdiv(st.loaded_bytes, tp), rope, "safetensors headers", params)
    total = safetensors_index_total(m.path)
    if total is not None:
        return WeightsEstimate(cdiv(total, tp), rope, "safetensors index (metadata.total_size)", params)
    return None


def weights_bytes(m: ModelInfo, tensor_parallel_size: int = 1, quantization: str | None = None,
                  use_checkpoint: bool = True) -> WeightsEstimate:
    """Weights resident on one GPU. From the safetensors headers when the directory has them (exact for an
    unquantized checkpoint), else from the config: embeddings/lm_head/norms at the model dtype, linear
    layers at the quantization's bits (+ scales). ``quantization='fp8'`` models vLLM's online FP8
    quantization of an unquantized checkpoint. Tensor parallel divides everything (norms, replicated in
    reality, are a rounding error)."""
    tp = positive_int(tensor_parallel_size, "tensor_parallel_size")
    counts = parameter_counts(m)
    rope = rope_cache_bytes(m)
    if use_checkpoint and quantization is None and Path(m.path).is_dir():
        found = _from_checkpoint(m, tp, rope, counts.total)
        if found is not None:
            return found
    q = m.quantization
    if quantization is not None:
        if quantization != "fp8":
            raise BadInput(f"online quantization {quantization!r} is not modelled (fp8 is)")
        q = Quantization("fp8", 8, 0, 0.0)
    dense = (counts.embedding + counts.lm_head + counts.other) * m.dtype_bytes
    lin = counts.linear * (q.bytes_per_param() if q else m.dtype_bytes)
    return WeightsEstimate(cdiv(int(math.ceil(dense + lin)), tp), rope, "config.json", counts.total)
