"""``oomdoctor plan``: memory arithmetic before any failure -- will this model start on this card, and with what.

``plan(...) -> dict`` is the reusable core (the JSON object ``plan --json`` prints); ``command`` is the click
verb (in oomdoctor/commands/plan.py). Exit 0 when the start is predicted to fit, 1 when not, 2 for bad input (BadInput, turned into one line
by oomdoctor.cli). The arithmetic lives in ``oomdoctor.memory``; this module resolves the inputs, runs it,
and searches for single-setting changes (levers) that make a failing start fit.
"""
from __future__ import annotations

import math
import re
from typing import Any, Union

from oomdoctor.engines.vllm import memory as M
from oomdoctor.errors import BadInput
from oomdoctor.units import NAMED_CARDS, human_bytes, parse_size

#: the max_model_len lever keeps this share of the predicted KV arena spare: the end-to-end prediction of
#: "Available KV cache memory" was within 0.02 % on cold-compile ledgers and 1.7 % (under) on a warm one.
LEVER_KV_MARGIN = 0.03
#: a utilization lever leaves this much free memory unclaimed (drift between the plan and the start).
LEVER_FREE_MARGIN_BYTES = 256 * M.MiB

_HUMAN_INT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT])?\s*$")


def parse_human_int(text: Union[str, int, None], what: str) -> int | None:
    """vLLM's human-readable ints: ``32768``, ``32k`` (x1000), ``32K`` (x1024), ``1.5M``; None stays None."""
    if text is None or isinstance(text, int):
        return text
    m = _HUMAN_INT.match(str(text).replace(",", "").replace("_", ""))
    if not m:
        raise BadInput(f"{what}: not a number: {text!r} (use e.g. 32768, 32k or 32K)")
    num, suf = float(m.group(1)), m.group(2)
    if suf:
        num *= (1000 if suf.islower() else 1024) ** ("kmgt".index(suf.lower()) + 1)
    if num != int(num):
        raise BadInput(f"{what}: {text!r} is not a whole number")
    return int(num)


def parse_kv_bytes(text: Union[str, int, None]) -> int | None:
    """``kv_cache_memory_bytes``: bytes, ``5.2e9``, ``8GiB``, or vLLM's ``8G`` (binary) / ``8g`` (decimal)."""
    if text is None or isinstance(text, int):
        return text
    s = str(text).strip()
    if _HUMAN_INT.match(s):
        return parse_human_int(s, "kv_cache_memory_bytes")
    return parse_size(s)


def resolve_gpu(gpu_memory: Union[str, int]) -> tuple[int, str]:
    """(total bytes, card key or '') from bytes, a size (``24GiB``) or a named card (``h200``)."""
    if isinstance(gpu_memory, bool):
        raise BadInput(f"not a GPU memory size: {gpu_memory!r}")
    if isinstance(gpu_memory, (int, float)):
        return int(gpu_memory), ""
    key = str(gpu_memory).strip().lower().replace("_", "").replace(" ", "")
    total = parse_size(str(gpu_memory))
    return total, key if key in NAMED_CARDS else ""


def _predicted(p: M.Prediction) -> dict:
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


def _run(model: M.ModelInfo, inputs: dict) -> M.Prediction:
    return M.evaluate(model, M.resolve_settings(model, **inputs))


# ---------------------------------------------------------------------------------------------------
# Levers: one setting changed in one direction, with the value, its source, its cost and the prediction
# ---------------------------------------------------------------------------------------------------

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
}


def _candidates(lever: str, model: M.ModelInfo, inputs: dict, p: M.Prediction) -> list[tuple[dict, dict, str, str]]:
    """(change shown to the user, new resolve_settings inputs, cost, source) for one lever id."""
    s = p.settings
    out: list[tuple[dict, dict, str, str]] = []

    def with_(**kw: Any) -> dict:
        d = dict(inputs)
        d.update(kw)
        return d

    if lever == "max_model_len":
        if p.failure == "config_invalid" and s.max_model_len > model.derived_max_model_len:
            n = model.derived_max_model_len
            out.append(({"max_model_len": n}, with_(max_model_len=n), "none beyond the model's own limit",
                        f"the model's {model.max_len_key}"))
        else:
            avail = int(p.available_kv_bytes * (1 - LEVER_KV_MARGIN))
            n = M.estimate_max_model_len(p.layout, avail, model.derived_max_model_len, s.max_num_batched_tokens,
                                         s.engine_version == "0.33.0")
            n = M.round_down(n, p.layout.block_size or 1)
            if n >= 1 and n != s.max_model_len:
                out.append(({"max_model_len": n}, with_(max_model_len=n),
                             f"context: requests longer than {n:,} tokens are refused (was {s.max_model_len:,})",
                             f"the predicted KV arena ({human_bytes(p.available_kv_bytes)}) less a "
                             f"{LEVER_KV_MARGIN:.0%} margin, rounded down to the block size {p.layout.block_size}"))
    elif lever == "kv_cache_dtype":
        if s.kv_cache_dtype in ("auto", "float16", "bfloat16", "float32"):
            out.append(({"kv_cache_dtype": "fp8"}, with_(kv_cache_dtype="fp8"),
                        "quality: FP8 KV without calibrated scales can lose accuracy; needs a GPU/attention backend "
                        "with FP8 KV support", "1 byte per KV element instead of the model dtype's "
                        f"{model.dtype_bytes}"))
    elif lever == "gpu_memory_utilization":
        u_max = M.max_utilization_for_free(p.cuda_total_bytes, p.startup_free_bytes, LEVER_FREE_MARGIN_BYTES)
        if p.failure == "cuda_graph_oom" and s.kv_cache_memory_bytes is None:
            u = round(s.gpu_memory_utilization - 0.01, 2)
            while u > 0.05:
                if _run(model, with_(gpu_memory_utilization=u)).fits:
                    out.append(({"gpu_memory_utilization": u}, with_(gpu_memory_utilization=u),
                                "a smaller KV arena (fewer concurrent tokens)",
                                "leaves room after the budget for the CUDA graphs captured later"))
                    break
                u = round(u - 0.01, 2)
        elif p.failure == "free_memory_below_utilization" and 0 < u_max < s.gpu_memory_utilization:
            out.append(({"gpu_memory_utilization": u_max}, with_(gpu_memory_utilization=u_max),
                        "a smaller KV arena (vLLM claims a share of TOTAL memory, so it must fit in what is free)",
                        f"free {human_bytes(p.startup_free_bytes)} / total {human_bytes(p.cuda_total_bytes)} as vLLM "
                        f"sees them, less {human_bytes(LEVER_FREE_MARGIN_BYTES)}; vLLM checks free >= ceil(total x util)"))
        elif p.failure not in ("free_memory_below_utilization", "cuda_graph_oom") and u_max > s.gpu_memory_utilization \
                and s.kv_cache_memory_bytes is None:
            out.append(({"gpu_memory_utilization": u_max}, with_(gpu_memory_utilization=u_max),
                        "less memory left for other processes on this GPU",
                        f"the most the free memory allows: {human_bytes(p.startup_free_bytes)} free / "
                        f"{human_bytes(p.cuda_total_bytes)} total, less {human_bytes(LEVER_FREE_MARGIN_BYTES)}"))
    elif lever == "kv_cache_memory_bytes":
        bpb = p.layout.bytes_per_block or 1
        cg = 0 if s.enforce_eager else p.cuda_graph_estimate_bytes + p.cuda_graph_unbudgeted_bytes
        persistent = M.PERSISTENT_OVERHEAD_BYTES + (M.TP_COMM_OVERHEAD_BYTES if s.tensor_parallel_size > 1 else 0)
        most = M.round_down(p.startup_free_bytes - p.weights_on_gpu_bytes - persistent - cg - LEVER_FREE_MARGIN_BYTES, bpb)
        if p.failure in ("kv_allocation_oom", "cuda_graph_oom") and s.kv_cache_memory_bytes is not None:
            if most > 0 and most < s.kv_cache_memory_bytes:
                out.append(({"kv_cache_memory_bytes": most}, with_(kv_cache_memory_bytes=most),
                            "a smaller KV arena (fewer concurrent tokens)",
                            f"free {human_bytes(p.startup_free_bytes)} less weights, CUDA graphs and runtime "
                            f"buffers, less {human_bytes(LEVER_FREE_MARGIN_BYTES)}"))
        elif p.failure == "kv_capacity" and s.kv_cache_memory_bytes is not None:
            need = M.round_up(p.kv_needed_bytes, bpb)
            if need <= most:
                out.append(({"kv_cache_memory_bytes": need}, with_(kv_cache_memory_bytes=need),
                            "less free memory left on the GPU", "one max_model_len request's KV need"))
    elif lever == "max_num_batched_tokens":
        if p.failure == "config_invalid":
            n = s.max_num_seqs
            out.append(({"max_num_batched_tokens": n}, with_(max_num_batched_tokens=n),
                        "none", "vLLM requires max_num_batched_tokens >= max_num_seqs"))
        else:
            n = s.max_num_batched_tokens // 2
            floor = max(512, p.layout.block_size or 0)
            while n >= floor:
                if inputs.get("max_num_seqs") is None or n >= s.max_num_seqs:
                    cand = with_(max_num_batched_tokens=n)
                    if _run(model, cand).fits:
                        out.append(({"max_num_batched_tokens": n}, cand,
                                    "prefill in smaller chunks: slower time-to-first-token for long prompts",
                                    "the activation peak of the profiling run scales with max_num_batched_tokens"))
                        break
                n //= 2
    elif lever == "max_num_seqs":
        for n in (512, 256, 128, 64, 32, 16):
            if n < s.max_num_seqs:
                cand = with_(max_num_seqs=n)
                if _run(model, cand).fits:
                    out.append(({"max_num_seqs": n}, cand, f"at most {n} requests run at once",
                                "the sampler warm-up and the CUDA-graph sizes scale with max_num_seqs"))
                    break
    elif lever == "enforce_eager":
        if not s.enforce_eager:
            out.append(({"enforce_eager": True}, with_(enforce_eager=True),
                        "no CUDA graphs: slower decode", "removes the CUDA-graph pool"))
    elif lever == "tensor_parallel_size":
        for tp in (2, 4, 8):
            if tp > s.tensor_parallel_size and model.num_attention_heads % tp == 0:
                cand = with_(tensor_parallel_size=tp)
                try:
                    if _run(model, cand).fits:
                        out.append(({"tensor_parallel_size": tp}, cand, f"needs {tp} GPUs like this one",
                                    "weights and KV heads are split across the GPUs"))
                        break
                except BadInput:
                    continue
    elif lever == "quantization":
        if model.quantization is None and s.quantization is None:
            out.append(({"quantization": "fp8"}, with_(quantization="fp8"),
                        "quality: small; speed: needs FP8 tensor cores (Ada/Hopper or newer)",
                        "online FP8 weights: linear layers at 1 byte per parameter"))
    elif lever == "cpu_offload_gb":
        top = math.ceil(p.weights_on_gpu_bytes / M.GiB)
        for g in range(1, top + 1):
            cand = with_(cpu_offload_bytes=g * M.GiB)
            if _run(model, cand).fits:
                out.append(({"cpu_offload_gb": g}, cand, "much slower: offloaded weights cross PCIe every forward pass",
                            "the weights that do not fit"))
                break
    elif lever == "free_other_processes":
        idle = s.gpu_memory_bytes - s.driver_reserved_bytes
        held = idle - s.free_bytes
        if held > M.GiB:
            out.append(({"free_bytes": idle}, with_(free_bytes=None),
                        f"stop what holds {human_bytes(held)} on this GPU (another process, a zombie engine)",
                        "the difference between the card's idle free memory and the free memory given"))
    elif lever == "larger_gpu":
        seen = set()
        for key, (desc, total) in sorted(NAMED_CARDS.items(), key=lambda kv: kv[1][1]):
            if total <= s.gpu_memory_bytes or total in seen:
                continue
            seen.add(total)
            cand = with_(gpu_memory_bytes=total, gpu_name=key, free_bytes=None)
            if _run(model, cand).fits:
                out.append(({"gpu": key, "gpu_memory_bytes": total}, cand,
                            f"hardware: a {desc}", "the smallest named card on which the same settings fit"))
                break
    return out


def propose_levers(model: M.ModelInfo, inputs: dict, p: M.Prediction) -> list[dict]:
    """Levers for a predicted failure, best first: those predicted to make the start fit, in the order of
    LEVER_ORDER[failure]; when none does, those that at least move past the current failure."""
    if p.fits or p.failure is None:
        return []
    fitting, partial = [], []
    for lever in LEVER_ORDER.get(p.failure, []):
        for change, cand, cost, source in _candidates(lever, model, inputs, p):
            try:
                q = _run(model, cand)
            except BadInput:
                continue
            entry = {"id": lever, "change": change, "predicted": _predicted(q), "cost": cost, "source": source}
            if q.fits:
                fitting.append(entry)
            elif q.failure != p.failure:
                partial.append(entry)
    return fitting or partial


# ---------------------------------------------------------------------------------------------------
# plan()
# ---------------------------------------------------------------------------------------------------

def plan(model: str, gpu_memory: Union[str, int], free: Union[str, int, None] = None,
         max_model_len: Union[str, int, None] = None, gpu_memory_utilization: float | None = None,
         kv_cache_dtype: str | None = None, max_num_seqs: Union[str, int, None] = None,
         max_num_batched_tokens: Union[str, int, None] = None, kv_cache_memory_bytes: Union[str, int, None] = None,
         tensor_parallel_size: int | None = None, engine_version: str | None = None,
         usage_context: str = "serve", block_size: int | None = None, enforce_eager: bool = False) -> dict:
    """Predict a vLLM start of the model in directory ``model`` on a GPU of ``gpu_memory`` total (NVML's
    figure: bytes, a size like ``24GiB`` or a card name like ``h200``) with ``free`` bytes free (default:
    an idle card). Returns the ``plan --json`` object. Raises BadInput for unusable input."""
    info = M.describe_model(model)
    total, card = resolve_gpu(gpu_memory)
    free_b = parse_size(str(free)) if isinstance(free, str) else free
    mml: Union[int, str, None]
    if isinstance(max_model_len, str) and max_model_len.strip().lower() in ("auto", "-1"):
        mml = "auto"
    else:
        mml = parse_human_int(max_model_len, "max_model_len")
    inputs = dict(
        gpu_memory_bytes=total, free_bytes=free_b, max_model_len=mml, gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype, max_num_seqs=parse_human_int(max_num_seqs, "max_num_seqs"),
        max_num_batched_tokens=parse_human_int(max_num_batched_tokens, "max_num_batched_tokens"),
        kv_cache_memory_bytes=parse_kv_bytes(kv_cache_memory_bytes), tensor_parallel_size=tensor_parallel_size,
        engine_version=engine_version, usage_context=usage_context, gpu_name=card, block_size=block_size,
        enforce_eager=enforce_eager,
    )
    settings = M.resolve_settings(info, **inputs)
    p = M.evaluate(info, settings)
    levers = propose_levers(info, inputs, p)
    return to_json(info, p, levers)


def to_json(info: M.ModelInfo, p: M.Prediction, levers: list[dict]) -> dict:
    s = p.settings
    kinds = {"full_attention": info.layer_kinds.count("full"), "sliding_window": info.layer_kinds.count("sliding"),
             "mla": info.layer_kinds.count("mla"), "mamba": info.layer_kinds.count("mamba")}
    q = info.quantization
    return {
        "fits": p.fits,
        "engine": M.ENGINE,
        "engine_version": s.engine_version,
        "failure": None if p.fits else {"class": p.failure, "phase": M.FAILURE_PHASES.get(p.failure, "none"),
                                         "reason": p.reason},
        "weights_bytes": p.weights_on_gpu_bytes,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "available_kv_bytes": p.available_kv_bytes,
        "kv_tokens": p.capacity.kv_tokens,
        "max_concurrency": round(p.capacity.max_concurrency, 4),
        "max_model_len_that_fits": p.max_model_len_that_fits,
        "max_model_len": p.max_model_len,
        "levers": levers,
        "model": {
            "path": info.path, "architecture": info.architecture, "dtype": info.dtype,
            "parameters": p.weights.parameters, "layers": kinds, "derived_max_model_len": info.derived_max_model_len,
            "max_len_key": info.max_len_key,
            "quantization": None if q is None else {"method": q.method, "bits": q.bits, "group_size": q.group_size},
        },
        "gpu": {"name": s.gpu_name or None, "total_bytes": s.gpu_memory_bytes, "cuda_total_bytes": p.cuda_total_bytes,
                "free_bytes": s.free_bytes, "startup_free_bytes": p.startup_free_bytes},
        "settings": {
            "gpu_memory_utilization": s.gpu_memory_utilization, "max_model_len": p.max_model_len,
            "max_model_len_source": s.max_model_len_source, "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens, "kv_cache_dtype": s.kv_cache_dtype,
            "kv_cache_memory_bytes": s.kv_cache_memory_bytes, "tensor_parallel_size": s.tensor_parallel_size,
            "block_size": p.layout.block_size, "enforce_eager": s.enforce_eager, "usage_context": s.usage_context,
            "model_runner": "v2" if p.v2_runner else "v1",
        },
        "parameter_bytes": p.weights.parameter_bytes,
        "rope_cache_bytes": p.weights.rope_cache_bytes,
        "weights_source": p.weights.source,
        "mamba_state_bytes_per_sequence": p.mamba_state_bytes_per_sequence,
        "kv_cache_groups": len(p.layout.groups),
        "bytes_per_block": p.layout.bytes_per_block,
        "num_gpu_blocks": p.capacity.num_blocks,
        "kv_needed_bytes": p.kv_needed_bytes,
        "requested_bytes": p.requested_bytes,
        "startup_check_ok": p.startup_check_ok,
        "activation_peak_bytes": p.activation_peak_bytes,
        "profile_overhead_bytes": p.profile_overhead_bytes,
        "cuda_graph_estimate_bytes": p.cuda_graph_estimate_bytes,
        "cuda_graph_unbudgeted_bytes": p.cuda_graph_unbudgeted_bytes,
        "peak_after_start_bytes": p.peak_after_start_bytes,
        "headroom_bytes": p.headroom_bytes,
        "approximations": [
            "activation peak, profiling overhead, CUDA-graph pool and runtime buffers are estimates calibrated on "
            "real vLLM 0.25.1 H200 ledgers (see oomdoctor.engines.vllm.memory.CALIBRATION); the rest is vLLM's arithmetic",
            "the CUDA total is NVML's total less a driver reserve (measured on the H200, 0.5 GiB assumed elsewhere)",
        ] + list(info.notes)
          + (["weights from config.json (no *.safetensors in the directory)"] if p.weights.source == "config.json" else [])
          + (["tensor parallel: NCCL buffers are an uncalibrated 256 MiB per rank"] if s.tensor_parallel_size > 1 else []),
    }
