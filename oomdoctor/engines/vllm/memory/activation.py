"""Activation peak and CUDA-graph pool: APPROXIMATIONS of what vLLM measures at start-up (see CALIBRATION)."""
from __future__ import annotations

from typing import Callable

from oomdoctor.engines.vllm.memory.common import (CUDA_GRAPH_BASE_BYTES, CUDA_GRAPH_TOKEN_FACTOR,
                                                  FORWARD_HIDDEN_COPIES, SAMPLER_BYTES_PER_LOGIT, VOCAB_PADDING,
                                                  positive_int, round_up, WARMUP_BYTES_PER_LOGIT, WARMUP_FIXED_BYTES)
from oomdoctor.engines.vllm.memory.model import ModelInfo


def _attention_peak(m: ModelInfo, tp: int) -> int:
    return m.dtype_bytes * (2 * m.num_attention_heads * m.head_dim + 2 * m.num_kv_heads * m.head_dim) // tp


def _mla_peak(m: ModelInfo, tp: int) -> int:
    a = m.mla_dims
    return m.dtype_bytes * m.num_attention_heads * (2 * (a["qk_nope_head_dim"] + a["qk_rope_head_dim"]) +
                                                    a["v_head_dim"]) // tp


def _mamba_peak(m: ModelInfo, tp: int) -> int:
    d, b = m.mamba_dims, m.dtype_bytes
    if d.kind == "mamba2":
        proj = 2 * d.d_inner + 2 * d.n_groups * d.state_size + d.num_heads
        states = d.num_heads * d.head_dim * d.state_size * 4 / d.chunk_size
        return int((b * (proj + d.d_inner) + states) // tp)
    return b * (3 * d.d_inner + 2 * d.state_size) // tp


def _moe_peak(m: ModelInfo, tp: int) -> int:
    moe = m.moe_dims
    k, mi, si = moe["top_k"], moe["moe_intermediate"], moe.get("shared_intermediate", 0)
    return m.dtype_bytes * (k * (3 * mi // tp + m.hidden_size) + 3 * si // tp)


#: per-token activation of one layer's mixer / MLP on one rank, by ModelInfo.layer_kinds / mlp_kinds
MIXER_PEAK: dict[str, Callable[[ModelInfo, int], int]] = {
    "full": _attention_peak, "sliding": _attention_peak, "mla": _mla_peak, "mamba": _mamba_peak,
}
MLP_PEAK: dict[str, Callable[[ModelInfo, int], int]] = {
    "gated": lambda m, tp: m.dtype_bytes * 3 * m.intermediate_size // tp,
    "plain": lambda m, tp: m.dtype_bytes * 2 * m.intermediate_size // tp,
    "moe": _moe_peak,
}


def forward_bytes_per_token(m: ModelInfo, tensor_parallel_size: int = 1) -> int:
    """APPROXIMATION: activation bytes per scheduled token at the forward peak of the profiling run:
    dtype x (4 x hidden) for residual/hidden/norm copies + the largest per-layer intermediate on this rank."""
    tp = positive_int(tensor_parallel_size, "tensor_parallel_size")
    peak = 0
    for kind, mlp in zip(m.layer_kinds, m.mlp_kinds):
        if kind in MIXER_PEAK:
            peak = max(peak, MIXER_PEAK[kind](m, tp))
        if mlp in MLP_PEAK:
            peak = max(peak, MLP_PEAK[mlp](m, tp))
    return m.dtype_bytes * FORWARD_HIDDEN_COPIES * m.hidden_size + peak


def activation_peak_bytes(m: ModelInfo, max_num_batched_tokens: int, max_num_seqs: int,
                          tensor_parallel_size: int = 1) -> int:
    """APPROXIMATION of vLLM's measured ``torch peak memory increase`` in ``profile_run``: the larger of the
    dummy forward over ``max_num_batched_tokens`` tokens and the dummy sampler run over ``min(max_num_seqs,
    max_num_batched_tokens)`` rows of fp32 logits."""
    n = positive_int(max_num_batched_tokens, "max_num_batched_tokens")
    s = min(positive_int(max_num_seqs, "max_num_seqs"), n)
    forward = n * forward_bytes_per_token(m, tensor_parallel_size)
    sampler = s * round_up(m.vocab_size, VOCAB_PADDING) * SAMPLER_BYTES_PER_LOGIT // max(1, tensor_parallel_size)
    return max(forward, sampler)


def warmup_requests(max_num_seqs: int, max_num_batched_tokens: int, num_blocks: int, v2_runner: bool) -> int:
    """How many dummy requests vLLM 0.25.1's warm-up runs after the KV cache: the V1 runner's sampler warm-up
    ``min(max_num_seqs, max_num_batched_tokens)`` (gpu_worker.py ``compile_or_warm_up_model``); the V2 runner's
    ``warmup_kernels`` (gpu/warmup.py) ``min(max_num_seqs, max_num_batched_tokens // 2, num_blocks - 1)``: prompts of
    2 tokens decoding to 3, one block each."""
    if not v2_runner:
        return max(1, min(max_num_seqs, max_num_batched_tokens))
    return max(1, min(max_num_seqs, max_num_batched_tokens // 2, max(1, num_blocks - 1)))


def warmup_bytes(m: ModelInfo, requests: int, v2_runner: bool) -> int:
    """MEASURED (common.WARMUP_*): what the engine allocates beyond the weights and a pinned KV arena up to the
    warm-up's peak: the runner's fixed part + requests x the padded vocabulary x the runner's bytes per logit."""
    key = "v2" if v2_runner else "v1"
    return WARMUP_FIXED_BYTES[key] + int(requests * round_up(m.vocab_size, VOCAB_PADDING) * WARMUP_BYTES_PER_LOGIT[key])


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
