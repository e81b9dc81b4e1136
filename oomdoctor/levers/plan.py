"""``oomdoctor plan``: memory arithmetic before any failure -- will this model start on this card, and with what.

``plan(...) -> dict`` is the reusable core (the JSON object ``plan --json`` prints); ``command`` is the click
verb (in oomdoctor/commands/plan.py). Exit 0 when the start is predicted to fit, 1 when not, 2 for bad input (BadInput, turned into one line
by oomdoctor.cli). The arithmetic lives in ``oomdoctor.engines.vllm.memory``; this module resolves the inputs, runs it,
and asks the lever search (``oomdoctor.levers.search``) for single-setting changes that make a failing start fit.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Union

from oomdoctor.card.records import PlanLever
from oomdoctor.engines.vllm import memory as M
from oomdoctor.errors import BadInput
from oomdoctor.levers.search import LEVER_FREE_MARGIN_BYTES, LEVER_KV_MARGIN, LEVER_ORDER, propose_levers
from oomdoctor.units import NAMED_CARDS, parse_size

__all__ = ["LEVER_FREE_MARGIN_BYTES", "LEVER_KV_MARGIN", "LEVER_ORDER", "parse_human_int", "parse_kv_bytes", "plan",
           "propose_levers", "resolve_gpu", "to_json"]

_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgtKMGT])?$")      # on a stripped text (see units.SIZE_RE)


def parse_human_int(text: Union[str, int, None], what: str) -> int | None:
    """vLLM's human-readable ints: ``32768``, ``32k`` (x1000), ``32K`` (x1024), ``1.5M``; None stays None."""
    if text is None or isinstance(text, int):
        return text
    m = _HUMAN_INT.match(str(text).replace(",", "").replace("_", "").strip())
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


# ---------------------------------------------------------------------------------------------------
# plan()
# ---------------------------------------------------------------------------------------------------

def plan(model: str, gpu_memory: Union[str, int], free: Union[str, int, None] = None,
         max_model_len: Union[str, int, None] = None, gpu_memory_utilization: float | None = None,
         kv_cache_dtype: str | None = None, max_num_seqs: Union[str, int, None] = None,
         max_num_batched_tokens: Union[str, int, None] = None, kv_cache_memory_bytes: Union[str, int, None] = None,
         tensor_parallel_size: int | None = None, engine_version: str | None = None,
         usage_context: str = "serve", block_size: int | None = None, enforce_eager: bool = False,
         hf_overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Predict a vLLM start of the model in directory ``model`` on a GPU of ``gpu_memory`` total (NVML's
    figure: bytes, a size like ``24GiB`` or a card name like ``h200``) with ``free`` bytes free (default:
    an idle card); ``hf_overrides``: the start's overrides of the model's config (vLLM's ``hf_overrides``).
    Returns the ``plan --json`` object. Raises BadInput for unusable input."""
    info = M.describe_model(model, overridden_config(model, hf_overrides) if hf_overrides else None)
    total, card = resolve_gpu(gpu_memory)
    free_b = parse_size(str(free)) if isinstance(free, str) else free
    mml: Union[int, str, None]
    if isinstance(max_model_len, str) and max_model_len.strip().lower() in ("auto", "-1"):
        mml = "auto"
    else:
        mml = parse_human_int(max_model_len, "max_model_len")
    inputs: dict[str, Any] = dict(
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


def overridden_config(model: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The model's config.json as the engine sees it with ``hf_overrides`` applied: a key replaced, a mapping merged
    into the sub-config of its name (vLLM updates the loaded config the same way); nothing else is read from it."""
    def merged(base: dict[str, Any], over: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            if isinstance(v, Mapping) and isinstance(out.get(k), dict) and depth < 4:
                out[k] = merged(out[k], v, depth + 1)
            else:
                out[str(k)] = v
        return out
    return merged(M.read_config(model), overrides)


def to_json(info: M.ModelInfo, p: M.Prediction, levers: list[PlanLever]) -> dict[str, Any]:
    s = p.settings
    kinds = {"full_attention": info.layer_kinds.count("full"), "sliding_window": info.layer_kinds.count("sliding"),
             "mla": info.layer_kinds.count("mla"), "mamba": info.layer_kinds.count("mamba")}
    q = info.quantization
    return {
        "fits": p.fits,
        "engine": M.ENGINE,
        "engine_version": s.engine_version,
        "failure": None if p.fits else {"class": p.failure, "phase": M.FAILURE_PHASES.get(p.failure or "", "none"),
                                         "reason": p.reason},
        "weights_bytes": p.weights_on_gpu_bytes,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "available_kv_bytes": p.available_kv_bytes,
        "kv_tokens": p.capacity.kv_tokens,
        "max_concurrency": round(p.capacity.max_concurrency, 4),
        "max_model_len_that_fits": p.max_model_len_that_fits,
        "max_model_len": p.max_model_len,
        "warmup": None if p.warmup_headroom_bytes is None else {
            "requests": p.warmup_requests, "bytes": p.warmup_bytes, "headroom_bytes": p.warmup_headroom_bytes,
            "at_the_edge": p.warmup_headroom_bytes < M.WARMUP_EDGE_BYTES},
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
