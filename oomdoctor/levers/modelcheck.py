"""The memory model (``oomdoctor.engines.vllm.memory`` through ``plan``) applied to an incident: does the model's arithmetic
reproduce the recorded failure, and what does it predict for each lever? Used by ``diagnose --model DIR``."""
from __future__ import annotations

from typing import Any

from oomdoctor.card.records import CardDict
from oomdoctor.engines.vllm.defaults import CUDA_CONTEXT_BYTES
from oomdoctor.engines.vllm.memory.prediction import same_step
from oomdoctor.errors import BadInput

PLAN_ARGS = ("max_model_len", "gpu_memory_utilization", "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens",
             "kv_cache_memory_bytes", "tensor_parallel_size", "enforce_eager")


def _settings(card: CardDict) -> dict[str, Any]:
    """The start's settings as the memory model takes them, with the model config's overrides the start gave
    (``hf_overrides``: a capped ``max_position_embeddings`` sizes the RoPE cache, so the weights' bytes)."""
    wl = card.get("workload") or {}
    out: dict[str, Any] = {}
    for src in (wl.get("resolved") or {}, wl.get("engine_args") or {}):
        for k in PLAN_ARGS:
            if src.get(k) is not None:
                out[k] = src[k]
    overrides = (wl.get("engine_args") or {}).get("hf_overrides")
    if isinstance(overrides, dict) and overrides:
        out["hf_overrides"] = overrides
    return out


def _device(card: CardDict, gpu_memory: str | int | None) -> tuple[Any, int | None]:
    wl, n = card.get("workload") or {}, card.get("numbers") or {}
    total: Any = gpu_memory or wl.get("gpu_total_bytes")
    if total is None and n.get("gpu_total_bytes"):
        total = int(n["gpu_total_bytes"])          # the engine's figure (torch's total, a little below NVML's)
    if total is None:
        for g in (card.get("device") or {}).get("gpus", []):
            total = g["total_bytes"]
            break
    free = wl.get("free_at_start_bytes")
    if free is None and n.get("free_at_start_bytes"):
        free = int(n["free_at_start_bytes"]) + CUDA_CONTEXT_BYTES
    return total, free


def _short(result: dict) -> dict:
    out = {"fits": result["fits"], "kv_tokens": result.get("kv_tokens"),
           "max_concurrency": result.get("max_concurrency"), "available_kv_bytes": result.get("available_kv_bytes")}
    if result.get("failure"):
        out["failure"] = result["failure"]["class"]
        out["reason"] = result["failure"].get("reason")
    return {k: v for k, v in out.items() if v is not None}


def check(card: CardDict, model_dir: str, gpu_memory: str | int | None = None) -> dict:
    """Attach the model's predictions to ``card`` (``model_check`` and ``levers[i].predicted.model``); returns the
    model_check section. BadInput when the device size is unknown or the model directory is unusable."""
    from oomdoctor.levers.plan import plan

    total, free = _device(card, gpu_memory)
    if total is None:
        raise BadInput("--model: the GPU's total memory is not in the log or the card; give --gpu-memory (e.g. h200)")
    base = _settings(card)
    ctx = "llm" if (card.get("workload") or {}).get("launcher") == "vllm-llm" else "serve"
    version = (card.get("engine") or {}).get("version")

    def run(settings: dict, at_free: int | None = free) -> dict:
        return plan(model_dir, total, free=at_free, engine_version=version, usage_context=ctx, **settings)

    recorded = run(base)
    section = {"model": model_dir, "gpu_total": total, "free_bytes": free, "settings": base, "usage_context": ctx,
               "recorded_config": _short(recorded),
               "agrees_with_log": (not recorded["fits"] and same_step((recorded.get("failure") or {}).get("class"),
                                                                     card["classification"]["class"]))
                                  if card["classification"]["class"]
                                  not in ("unknown", "not_memory") else recorded["fits"]}
    from oomdoctor.levers.chain import _model_change     # the lever as model inputs, as the chain runs it

    for lv in card.get("levers") or []:
        inputs = _model_change(lv["id"], lv.get("change") or {})
        if not inputs or ("free" in inputs and free is None):   # nothing the model can run, or nothing it would change
            continue
        at_free = inputs.pop("free", free)                      # free_other_processes: the GPU's idle free memory
        try:
            lv["predicted"]["model"] = _short(run({**base, **inputs}, at_free))
        except BadInput as e:
            lv["predicted"]["model"] = {"error": str(e)}
    card["model_check"] = section
    if card.get("levers"):
        card["levers"] = model_ranked(card["levers"], card["classification"].get("phase"))
    _chains(card)
    return section


def model_ranked(levers: list, phase: str | None = None) -> list:
    """The levers the model predicts to make the start fit (``predicted.model.fits``) first, the others after them in
    their order; a lever that needs other hardware (a larger GPU, more GPUs) is never moved up. The planner's own
    rule (plan.propose_levers: those predicted to make the start fit first): a real walk (S0 of
    incidents/h200-retest-2026-12-02-dawn/) ran the lever whose own check passed while the model said the start
    would then fail, and the co-tenant's memory, whose freeing the model said starts, came second. A failure while
    serving is past every step the model predicts (each lever "fits" the start): its order stays."""
    from oomdoctor.levers.hardware import PARALLEL

    if phase == "runtime":
        return levers

    def promoted(lv: dict) -> bool:
        hardware = lv["id"] == "larger_gpu" or bool(lv.get("needs_hardware")) \
            or bool(set(lv.get("change") or {}) & set(PARALLEL))
        return not hardware and (lv.get("predicted") or {}).get("model", {}).get("fits") is True

    out = [lv for lv in levers if promoted(lv)] + [lv for lv in levers if not promoted(lv)]
    for n, lv in enumerate(out, 1):
        lv["rank"] = n
    return out


def _chains(card: CardDict) -> None:
    """Each lever's prediction from the start to the end (``predicted.chain``): what comes next when it alone will not do."""
    from oomdoctor.levers.chain import expected_chain

    for lv in card.get("levers") or []:
        if lv["id"] in ("larger_gpu", "admission_queue"):
            continue
        lv["predicted"]["chain"] = expected_chain(card, lv)["text"]
