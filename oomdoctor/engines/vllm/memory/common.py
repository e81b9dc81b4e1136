"""Units, dtype sizes, integer helpers and the calibrated constants every part of the memory model shares."""
from __future__ import annotations

from typing import Any

from oomdoctor.engines.vllm.defaults import CUDA_CONTEXT_BYTES, GiB, MiB
from oomdoctor.errors import BadInput

__all__ = ["GiB", "MiB", "CUDA_CONTEXT_BYTES"]

ENGINE = "vllm"
VOCAB_PADDING = 64                             # VocabParallelEmbedding pads the vocabulary to a multiple of 64

# ---------------------------------------------------------------------------------------------------
# Calibrated constants. Each one says where it comes from; none is a guess presented as a measurement.
# CUDA_CONTEXT_BYTES (0.51 GiB: NVML free 40.001 GiB showed as "Free memory ... (39.49/139.8 GiB)", NVML free
# 8.001 GiB as "Initial free memory 7.49 GiB", 139.80 as 139.29 (B_fail, D_pass, E_pass)) lives in defaults.py.
# ---------------------------------------------------------------------------------------------------

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
#: MEASURED on the H200 (tools/gpu/warmup_probe.py: vLLM 0.25.1, the kit's Llama, vocab 32,000, hidden 2,048, a pinned
#: 2.5e9-byte arena, eager, max_num_seqs 64-2,048, incidents/h200-retest-2026-12-02-afternoon/probe/): with a pinned KV
#: arena vLLM skips profiling, and what the engine allocates beyond the weights and the arena up to the warm-up's peak
#: is a fixed part plus per warm-up request x vocabulary bytes (the [requests, vocab] sampling buffers and logits; fit
#: residual under 5 MB). Per model runner: V2 (0.25.1's default for plain decoders) and V1 (VLLM_USE_V2_MODEL_RUNNER=0).
WARMUP_FIXED_BYTES = {"v2": 96_158_000, "v1": 163_738_000}
WARMUP_BYTES_PER_LOGIT = {"v2": 11.886, "v1": 14.703}
#: MEASURED: the engine process's memory beyond its CUDA context and torch's reserved pool at the warm-up (cuBLAS, ...
#: workspaces): 793,575,424 B in use besides the pool, less the 0.51 GiB context, at every max_num_seqs.
NON_TORCH_BYTES = 245_967_094
#: CALIBRATED on real starts of the same settings: what the allocator may lose to fragmentation after a pinned
#: arena. F1b_pass (offline) passed its warm-up with 110 MiB predicted to spare, W1 (served) at max_num_seqs 256 with
#: 127 MiB; G1 (served, the same memory as F1b_pass) ran out with 110 MiB (173 MiB reserved but unallocated at its
#: OOM). A start needs WARMUP_MARGIN_BYTES to spare; under WARMUP_EDGE_BYTES (above the 173 MiB seen) the prediction
#: says that the allocator decides.
WARMUP_MARGIN_BYTES = 100 * MiB
WARMUP_EDGE_BYTES = 192 * MiB
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
    "warmup_after_pinned_arena": "measured on the H200 (tools/gpu/warmup_probe.py, max_num_seqs 64-2048): V2 "
                                 "0.096e9 + 11.89 B per logit, V1 0.164e9 + 14.70 B; non-torch 0.246e9; 100 MiB "
                                 "kept spare (F1b_pass passed at 110 MiB predicted, W1 at 256 at 127 MiB; G1 ran out "
                                 "at 110 MiB: under 192 MiB the prediction says the allocator decides)",
    "rope_cache": "max_position x rotary_dim x dtype per distinct RoPE; 2.6042 GiB predicted vs 'Model loading "
                  "took 2.61 GiB' for the gpu-kit Llama",
}

DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "float64": 8, "double": 8,
}


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (vLLM's ``cdiv``)."""
    return -(-a // b)


def round_down(n: int, multiple: int) -> int:
    return (n // multiple) * multiple


def round_up(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise BadInput(f"{what} must be a positive integer, got {value!r}")
    return int(value)
