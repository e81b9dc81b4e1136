"""The memory model's lever source: for a predicted failure, one candidate change per setting, each checked by
re-running the model with it (``oomdoctor plan`` and ``diagnose --model``).

One builder per setting (``CANDIDATES[id]``), the class's preference order in ``LEVER_ORDER``, and the shared
dedupe of ``oomdoctor.levers.rank``. "The largest utilization that passes vLLM's free-memory check" is
``oomdoctor.engines.vllm.defaults.max_passing_utilization``, the same definition the log-driven levers use.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

from oomdoctor.card.records import PlanLever
from oomdoctor.engines.vllm import memory as M
from oomdoctor.engines.vllm.defaults import CHECK_KEEP_BACK, defaults_for, max_passing_utilization
from oomdoctor.errors import BadInput
from oomdoctor.levers.rank import dedupe
from oomdoctor.units import NAMED_CARDS, human_bytes

#: the max_model_len lever keeps this share of the predicted KV arena spare: the end-to-end prediction of
#: "Available KV cache memory" was within 0.02 % on cold-compile ledgers and 1.7 % (under) on a warm one.
LEVER_KV_MARGIN = 0.03
#: a kv_cache_memory_bytes lever leaves this much free memory unclaimed (drift between the plan and the start).
LEVER_FREE_MARGIN_BYTES = 256 * M.MiB

Inputs = dict[str, Any]          # keyword arguments of memory.resolve_settings


class Candidate(NamedTuple):
    change: dict[str, Any]       # what the user sees
    inputs: Inputs               # the new resolve_settings inputs
    cost: str
    source: str


LEVER_ORDER = {
    "config_invalid": ["max_model_len", "max_num_batched_tokens"],
    "free_memory_below_utilization": ["gpu_memory_utilization", "free_other_processes", "larger_gpu"],
    "weights_load_oom": ["free_other_processes", "quantization", "tensor_parallel_size", "cpu_offload_gb",
                         "larger_gpu"],
    "profiling_oom": ["max_num_batched_tokens", "free_other_processes", "max_num_seqs", "tensor_parallel_size",
                      "larger_gpu"],
    "kv_capacity": ["max_model_len", "kv_cache_dtype", "gpu_memory_utilization", "kv_cache_memory_bytes",
                    "max_num_batched_tokens", "quantization", "tensor_parallel_size", "larger_gpu"],
    "kv_allocation_oom": ["kv_cache_memory_bytes", "free_other_processes", "larger_gpu"],
    "cuda_graph_oom": ["enforce_eager", "kv_cache_memory_bytes", "gpu_memory_utilization", "max_num_seqs",
                       "free_other_processes", "larger_gpu"],
    # after a pinned arena (no profiling): the warm-up's dummy requests are max_num_seqs
    "sampler_warmup_oom": ["max_num_seqs", "kv_cache_memory_bytes", "free_other_processes", "larger_gpu"],
}


def run(model: M.ModelInfo, inputs: Inputs) -> M.Prediction:
    return M.evaluate(model, M.resolve_settings(model, **inputs))


def predicted(p: M.Prediction) -> dict[str, Any]:
    return {
        "fits": p.fits,
        "failure": p.failure,
        "weights_bytes": p.weights_on_gpu_bytes,
        "available_kv_bytes": p.available_kv_bytes,
        "kv_tokens": p.capacity.kv_tokens,
        "max_concurrency": round(p.capacity.max_concurrency, 4),
        "max_model_len": p.max_model_len,
        "max_model_len_that_fits": p.max_model_len_that_fits,
        "headroom_bytes": p.headroom_bytes,
    }


def _with(inputs: Inputs, **kw: Any) -> Inputs:
    return {**inputs, **kw}


def _one(key: str, value: Any, inputs: Inputs, cost: str, source: str, **extra: Any) -> Candidate:
    """The candidate that sets ``key`` to ``value`` (``extra``: more resolve_settings inputs it changes)."""
    return Candidate({key: value}, _with(inputs, **{key: value}, **extra), cost, source)


def _first_fitting(model: M.ModelInfo, inputs: Inputs, key: str, values: list[Any], cost: Callable[[Any], str],
                   source: str) -> list[Candidate]:
    """The first of ``values`` for ``key`` with which the start fits (none: empty)."""
    for v in values:
        cand = _with(inputs, **{key: v})
        if run(model, cand).fits:
            return [Candidate({key: v}, cand, cost(v), source)]
    return []


def max_model_len(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    s = p.settings
    if p.failure == "config_invalid" and s.max_model_len > model.derived_max_model_len:
        return [_one("max_model_len", model.derived_max_model_len, inputs, "none beyond the model's own limit",
                     f"the model's {model.max_len_key}")]
    avail = int(p.available_kv_bytes * (1 - LEVER_KV_MARGIN))
    n = M.estimate_max_model_len(p.layout, avail, model.derived_max_model_len, s.max_num_batched_tokens,
                                 defaults_for(s.engine_version).reserves_null_block)
    n = M.round_down(n, p.layout.block_size or 1)
    if n < 1 or n == s.max_model_len:
        return []
    return [_one("max_model_len", n, inputs,
                 f"context: requests longer than {n:,} tokens are refused (was {s.max_model_len:,})",
                 f"the predicted KV arena ({human_bytes(p.available_kv_bytes)}) less a "
                 f"{LEVER_KV_MARGIN:.0%} margin, rounded down to the block size {p.layout.block_size}")]


def kv_cache_dtype(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    if p.settings.kv_cache_dtype not in ("auto", "float16", "bfloat16", "float32"):
        return []
    return [_one("kv_cache_dtype", "fp8", inputs,
                 "quality: FP8 KV without calibrated scales can lose accuracy; needs a GPU/attention backend "
                 "with FP8 KV support", "1 byte per KV element instead of the model dtype's "
                 f"{model.dtype_bytes}")]


def gpu_memory_utilization(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    s = p.settings
    u_max = max_passing_utilization(p.cuda_total_bytes, p.startup_free_bytes)
    seen = (f"{human_bytes(p.startup_free_bytes)} free / {human_bytes(p.cuda_total_bytes)} total as vLLM sees them, "
            f"less {CHECK_KEEP_BACK:.0%} of free kept back")
    if p.failure == "cuda_graph_oom" and s.kv_cache_memory_bytes is None:
        steps = []
        u = round(s.gpu_memory_utilization - 0.01, 2)
        while u > 0.05:
            steps.append(u)
            u = round(u - 0.01, 2)
        return _first_fitting(model, inputs, "gpu_memory_utilization", steps,
                              lambda _: "a smaller KV arena (fewer concurrent tokens)",
                              "leaves room after the budget for the CUDA graphs captured later")
    if p.failure == "free_memory_below_utilization" and 0 < u_max < s.gpu_memory_utilization:
        return [_one("gpu_memory_utilization", u_max, inputs,
                     "a smaller KV arena (vLLM claims a share of TOTAL memory, so it must fit in what is free)",
                     f"free {seen}; vLLM checks free >= ceil(total x util)")]
    if p.failure not in ("free_memory_below_utilization", "cuda_graph_oom") and u_max > s.gpu_memory_utilization \
            and s.kv_cache_memory_bytes is None:
        return [_one("gpu_memory_utilization", u_max, inputs, "less memory left for other processes on this GPU",
                     f"the most the free memory allows: {seen}")]
    return []


def kv_cache_memory_bytes(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    s = p.settings
    if s.kv_cache_memory_bytes is None:
        return []
    bpb = p.layout.bytes_per_block or 1
    cg = 0 if s.enforce_eager else p.cuda_graph_estimate_bytes + p.cuda_graph_unbudgeted_bytes
    comm = M.TP_COMM_OVERHEAD_BYTES if s.tensor_parallel_size > 1 else 0
    # after the arena: the persistent buffers, or the warm-up vLLM does not profile for a pinned arena, if larger
    persistent = max(M.PERSISTENT_OVERHEAD_BYTES, M.NON_TORCH_BYTES + p.warmup_bytes + M.WARMUP_MARGIN_BYTES) + comm
    most = M.round_down(p.startup_free_bytes - p.weights_on_gpu_bytes - persistent - cg - LEVER_FREE_MARGIN_BYTES, bpb)
    if p.failure in ("kv_allocation_oom", "cuda_graph_oom", "sampler_warmup_oom"):
        if 0 < most < s.kv_cache_memory_bytes:
            return [_one("kv_cache_memory_bytes", most, inputs, "a smaller KV arena (fewer concurrent tokens)",
                         f"free {human_bytes(p.startup_free_bytes)} less weights, CUDA graphs and runtime "
                         f"buffers, less {human_bytes(LEVER_FREE_MARGIN_BYTES)}")]
    elif p.failure == "kv_capacity":
        need = M.round_up(p.kv_needed_bytes, bpb)
        if need <= most:
            return [_one("kv_cache_memory_bytes", need, inputs, "less free memory left on the GPU",
                         "one max_model_len request's KV need")]
    return []


def max_num_batched_tokens(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    s = p.settings
    if p.failure == "config_invalid":
        return [_one("max_num_batched_tokens", s.max_num_seqs, inputs, "none",
                     "vLLM requires max_num_batched_tokens >= max_num_seqs")]
    halvings = []
    n, floor = s.max_num_batched_tokens // 2, max(512, p.layout.block_size or 0)
    while n >= floor:
        if inputs.get("max_num_seqs") is None or n >= s.max_num_seqs:
            halvings.append(n)
        n //= 2
    return _first_fitting(model, inputs, "max_num_batched_tokens", halvings,
                          lambda _: "prefill in smaller chunks: slower time-to-first-token for long prompts",
                          "the activation peak of the profiling run scales with max_num_batched_tokens")


def max_num_seqs(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    return _first_fitting(model, inputs, "max_num_seqs",
                          [n for n in (512, 256, 128, 64, 32, 16) if n < p.settings.max_num_seqs],
                          lambda n: f"at most {n} requests run at once",
                          "the sampler warm-up and the CUDA-graph sizes scale with max_num_seqs")


def enforce_eager(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    if p.settings.enforce_eager:
        return []
    return [_one("enforce_eager", True, inputs, "no CUDA graphs: slower decode", "removes the CUDA-graph pool")]


def tensor_parallel_size(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    for tp in (2, 4, 8):
        if tp > p.settings.tensor_parallel_size and model.num_attention_heads % tp == 0:
            cand = _with(inputs, tensor_parallel_size=tp)
            try:
                if run(model, cand).fits:
                    return [Candidate({"tensor_parallel_size": tp}, cand, f"needs {tp} GPUs like this one",
                                      "weights and KV heads are split across the GPUs")]
            except BadInput:
                continue
    return []


def quantization(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    if model.quantization is not None or p.settings.quantization is not None:
        return []
    return [_one("quantization", "fp8", inputs, "quality: small; speed: needs FP8 tensor cores (Ada/Hopper or newer)",
                 "online FP8 weights: linear layers at 1 byte per parameter")]


def cpu_offload_gb(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    for g in range(1, math.ceil(p.weights_on_gpu_bytes / M.GiB) + 1):
        cand = _with(inputs, cpu_offload_bytes=g * M.GiB)
        if run(model, cand).fits:
            return [Candidate({"cpu_offload_gb": g}, cand,
                              "much slower: offloaded weights cross PCIe every forward pass", "the weights that do not fit")]
    return []


def free_other_processes(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    s = p.settings
    idle = s.gpu_memory_bytes - s.driver_reserved_bytes
    held = idle - s.free_bytes
    if held <= M.GiB:
        return []
    return [Candidate({"free_bytes": idle}, _with(inputs, free_bytes=None),
                      f"stop what holds {human_bytes(held)} on this GPU (another process, a zombie engine)",
                      "the difference between the card's idle free memory and the free memory given")]


def larger_gpu(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[Candidate]:
    seen = set()
    for key, (desc, total) in sorted(NAMED_CARDS.items(), key=lambda kv: kv[1][1]):
        if total <= p.settings.gpu_memory_bytes or total in seen:
            continue
        seen.add(total)
        cand = _with(inputs, gpu_memory_bytes=total, gpu_name=key, free_bytes=None)
        if run(model, cand).fits:
            return [Candidate({"gpu": key, "gpu_memory_bytes": total}, cand, f"hardware: a {desc}",
                              "the smallest named card on which the same settings fit")]
    return []


CANDIDATES: dict[str, Callable[[M.ModelInfo, Inputs, M.Prediction], list[Candidate]]] = {
    f.__name__: f for f in (max_model_len, kv_cache_dtype, gpu_memory_utilization, kv_cache_memory_bytes,
                            max_num_batched_tokens, max_num_seqs, enforce_eager, tensor_parallel_size, quantization,
                            cpu_offload_gb, free_other_processes, larger_gpu)
}


def propose_levers(model: M.ModelInfo, inputs: Inputs, p: M.Prediction) -> list[PlanLever]:
    """Levers for a predicted failure, best first: those predicted to make the start fit, in the order of
    LEVER_ORDER[failure]; when none does, those that at least move past the current failure."""
    if p.fits or p.failure is None:
        return []
    fitting: list[PlanLever] = []
    partial: list[PlanLever] = []
    for lever in LEVER_ORDER.get(p.failure, []):
        for cand in CANDIDATES[lever](model, inputs, p):
            try:
                q = run(model, cand.inputs)
            except BadInput:
                continue
            entry: PlanLever = {"id": lever, "change": cand.change, "predicted": predicted(q), "cost": cand.cost,
                                "source": cand.source}
            if q.fits:
                fitting.append(entry)
            elif q.failure != p.failure:
                partial.append(entry)
    return dedupe(fitting or partial)
