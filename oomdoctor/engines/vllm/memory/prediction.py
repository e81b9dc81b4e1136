"""The whole prediction: walk vLLM's start-up in order (budget, weights, profiling, KV, CUDA graphs)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from oomdoctor.engines.vllm.defaults import CUDA_CONTEXT_BYTES, defaults_for, max_passing_utilization
from oomdoctor.engines.vllm.memory.activation import (activation_peak_bytes, cuda_graph_bytes, warmup_bytes,
                                                      warmup_requests)
from oomdoctor.engines.vllm.memory.common import (NON_TORCH_BYTES, PERSISTENT_OVERHEAD_BYTES, PROFILE_OVERHEAD_BYTES,
                                                  TP_COMM_OVERHEAD_BYTES, WARMUP_MARGIN_BYTES, GiB, MiB)
from oomdoctor.engines.vllm.memory.kv_pool import KVCapacity, KVLayout, estimate_max_model_len, kv_capacity, kv_layout
from oomdoctor.engines.vllm.memory.kv_specs import kv_bytes_per_token, mamba_state_bytes_per_sequence
from oomdoctor.engines.vllm.memory.model import ModelInfo
from oomdoctor.engines.vllm.memory.settings import Settings
from oomdoctor.engines.vllm.memory.weights import WeightsEstimate, weights_bytes

#: failure classes (CONTRACT.md) in the order vLLM would hit them
FAILURE_PHASES = {
    "config_invalid": "config", "free_memory_below_utilization": "profiling", "weights_load_oom": "weights_load",
    "profiling_oom": "profiling", "kv_capacity": "kv_reservation", "kv_allocation_oom": "kv_reservation",
    "cuda_graph_oom": "cuda_graph", "sampler_warmup_oom": "warmup",
}

#: the log's classes a predicted failure stands for: the model's profiling step is the first forward pass, in which
#: vLLM compiles the model, so torch.compile's kernel autotuning fails there too (a real 0.25.1 start on an H200:
#: fixtures/logs/vllm-0.25.1-h200-evening/P1_profile.log)
SAME_STEP = {"profiling_oom": frozenset({"profiling_oom", "autotuner_oom"})}


def same_step(predicted: str | None, observed: str | None) -> bool:
    """Does the log's class ``observed`` fail in the start-up step of the predicted failure ``predicted``?"""
    return predicted is not None and observed in SAME_STEP.get(predicted, frozenset({predicted}))


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
    warmup_requests: int = 0              # the warm-up's dummy requests after the KV cache
    warmup_bytes: int = 0                 # what it allocates beyond weights + a pinned arena (0: profiled, budgeted)
    warmup_headroom_bytes: int | None = None   # free memory left at the warm-up's peak (None: not pinned)


@dataclass(frozen=True)
class _Ledger:
    """The numbers of one start-up that decide where it fails."""
    cuda_total: int
    vfree: int
    requested: int
    on_gpu: int
    overhead: int
    act: int
    cg: int
    available: int
    check_mem: int
    needed: int
    mml: int
    upper: int
    fit_len: int
    kv_resident: int
    persistent: int
    peak_after: int
    has_kv: bool
    n_warm: int = 0
    peak_warm: int = 0                    # weights + pinned arena + graphs + non-torch + the warm-up (0: not pinned)


def _gib(b: float) -> str:
    return f"{b / GiB:.2f} GiB"


def _config_failure(m: ModelInfo, s: Settings, g: _Ledger) -> str | None:
    if g.mml > g.upper:
        return f"max_model_len {g.mml} exceeds the model's {g.upper} ({m.max_len_key})"
    if s.max_num_batched_tokens < s.max_num_seqs:
        return f"max_num_batched_tokens ({s.max_num_batched_tokens}) must be >= max_num_seqs ({s.max_num_seqs})"
    return None


def _memory_failure(s: Settings, g: _Ledger) -> tuple[str, str] | None:
    """The first memory phase that does not fit, in vLLM's order."""
    if g.vfree < g.requested:
        return "free_memory_below_utilization", (f"free {_gib(g.vfree)} < requested {_gib(g.requested)} = "
                                                 f"ceil({_gib(g.cuda_total)} x {s.gpu_memory_utilization})")
    if g.on_gpu > g.vfree:
        return "weights_load_oom", f"weights {_gib(g.on_gpu)} > free {_gib(g.vfree)}"
    if g.on_gpu + g.overhead + g.act > g.vfree:
        return "profiling_oom", f"weights + activation peak {_gib(g.on_gpu + g.overhead + g.act)} > free {_gib(g.vfree)}"
    if g.has_kv and g.check_mem <= 0:
        return "kv_capacity", f"no memory left for the KV cache ({_gib(g.available)})"
    if g.has_kv and g.needed > g.check_mem:
        return "kv_capacity", (f"one request of {g.mml} tokens needs {_gib(g.needed)} KV, "
                               f"{_gib(g.available)} available (largest that fits: {g.fit_len})")
    if s.kv_cache_memory_bytes is not None and g.on_gpu + g.kv_resident + g.persistent > g.vfree:
        return "kv_allocation_oom", f"pinned KV {_gib(g.kv_resident)} + weights {_gib(g.on_gpu)} > free {_gib(g.vfree)}"
    if g.vfree - g.peak_after < 0:
        return "cuda_graph_oom", (f"CUDA graphs ({_gib(g.cg)}) do not fit after the KV cache: "
                                  f"{_gib(g.peak_after)} needed, {_gib(g.vfree)} free")
    if g.peak_warm and g.vfree - g.peak_warm < WARMUP_MARGIN_BYTES:
        return "sampler_warmup_oom", (f"the warm-up of {g.n_warm:,} dummy requests after the pinned KV cache (which "
                                      f"vLLM does not profile): {_gib(g.peak_warm)} needed and "
                                      f"{_gib(WARMUP_MARGIN_BYTES)} kept spare, {_gib(g.vfree)} free")
    return None


def _first_failure(m: ModelInfo, s: Settings, g: _Ledger) -> tuple[str | None, str]:
    config = _config_failure(m, s, g)
    if config is not None:
        return "config_invalid", config
    memory = _memory_failure(s, g)
    return memory if memory is not None else (None, "fits")


def evaluate(m: ModelInfo, s: Settings) -> Prediction:
    """Walk vLLM's start-up in order and predict where (if anywhere) it fails, plus the KV numbers."""
    tp, row = s.tensor_parallel_size, defaults_for(s.engine_version)
    cuda_total = s.gpu_memory_bytes - s.driver_reserved_bytes
    vfree = max(0, s.free_bytes - CUDA_CONTEXT_BYTES)
    requested = math.ceil(cuda_total * s.gpu_memory_utilization)
    w = weights_bytes(m, tp, s.quantization)
    on_gpu = max(0, w.total - s.cpu_offload_bytes)
    comm = TP_COMM_OVERHEAD_BYTES if tp > 1 else 0
    overhead = PROFILE_OVERHEAD_BYTES + comm
    act = activation_peak_bytes(m, s.max_num_batched_tokens, s.max_num_seqs, tp)
    v2 = m.uses_v2_runner(s.engine_version)
    cg = cuda_graph_bytes(m, s.max_num_seqs, s.max_num_batched_tokens, tp, s.enforce_eager)
    cg_budgeted = 0 if (v2 and not row.v2_runner_budgets_cuda_graphs) else cg
    layout = kv_layout(m, s.kv_cache_dtype, tp, s.block_size)
    if s.kv_cache_memory_bytes is not None:
        available = s.kv_cache_memory_bytes
    else:
        available = requested - on_gpu - overhead - act - cg_budgeted
    reserve = row.reserves_null_block
    fit_len = estimate_max_model_len(layout, available, m.derived_max_model_len, s.max_num_batched_tokens, reserve)
    mml = s.max_model_len
    if mml == -1:          # auto-fit: the largest length that fits, capped by the model
        mml = fit_len if fit_len > 0 else 1
    cap = kv_capacity(layout, available, mml, s.max_num_batched_tokens)
    needed = layout.needed_bytes(mml, s.max_num_batched_tokens)
    kv_resident = cap.num_blocks * layout.bytes_per_block if layout.groups else 0
    persistent = PERSISTENT_OVERHEAD_BYTES + comm
    peak_after = on_gpu + kv_resident + persistent + (cg if s.kv_cache_memory_bytes is not None else cg - cg_budgeted)
    n_warm = warmup_requests(s.max_num_seqs, s.max_num_batched_tokens, cap.num_blocks, v2)
    warm = warmup_bytes(m, n_warm, v2) if s.kv_cache_memory_bytes is not None and layout.groups else 0
    peak_warm = on_gpu + kv_resident + cg + NON_TORCH_BYTES + comm + warm if warm else 0
    g = _Ledger(cuda_total, vfree, requested, on_gpu, overhead, act, cg, available,
                available - (layout.bytes_per_block if reserve and layout.groups else 0), needed, mml,
                m.derived_max_model_len, fit_len, kv_resident, persistent, peak_after, bool(layout.groups), n_warm,
                peak_warm)
    failure, reason = _first_failure(m, s, g)
    return Prediction(
        settings=s, fits=failure is None, failure=failure, reason=reason, cuda_total_bytes=cuda_total,
        startup_free_bytes=vfree, requested_bytes=requested, startup_check_ok=vfree >= requested, weights=w,
        weights_on_gpu_bytes=on_gpu, activation_peak_bytes=act, profile_overhead_bytes=overhead,
        cuda_graph_estimate_bytes=cg_budgeted, cuda_graph_unbudgeted_bytes=cg - cg_budgeted,
        available_kv_bytes=available, layout=layout, capacity=cap,
        kv_bytes_per_token=kv_bytes_per_token(m, s.kv_cache_dtype, tp),
        mamba_state_bytes_per_sequence=mamba_state_bytes_per_sequence(m, tp) if m.mamba else 0,
        kv_needed_bytes=needed, max_model_len=mml, max_model_len_that_fits=fit_len, peak_after_start_bytes=peak_after,
        headroom_bytes=vfree - max(peak_after, peak_warm), v2_runner=v2, warmup_requests=n_warm, warmup_bytes=warm,
        warmup_headroom_bytes=vfree - peak_warm if warm else None,
    )


def max_utilization_for_free(cuda_total_bytes: int, startup_free_bytes: int, margin_bytes: int = 256 * MiB) -> float:
    """The largest ``gpu_memory_utilization`` (2 decimals, rounded down) that passes vLLM's start-up check
    ``free >= ceil(total x util)`` with ``margin_bytes`` to spare. 0.0 when none does. A thin wrapper over the
    one formula, ``defaults.max_passing_utilization``, with a byte margin instead of a kept-back share."""
    return max_passing_utilization(cuda_total_bytes, startup_free_bytes, keep_back=0.0, decimals=2,
                                   margin_bytes=margin_bytes)
