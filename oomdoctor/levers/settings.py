"""One builder per setting: the lever that changes it, with its value, cost, basis and arithmetic.

The per-class generators (``oomdoctor.levers.by_class``) combine these; "the largest utilization that passes
vLLM's free-memory check" is ``oomdoctor.engines.vllm.defaults.max_passing_utilization`` here as in ``plan``.
"""
from __future__ import annotations

import math
from typing import Any

from oomdoctor.card.records import Lever
from oomdoctor.engines.vllm.defaults import CHECK_KEEP_BACK, max_passing_utilization
from oomdoctor.levers.context import Ctx
from oomdoctor.levers.record import ACTIVATION_GRAPH_RESERVE, MiB, WINDOW_MARGIN, _h, lever


def _align_down(n: int, step: int) -> int:
    return max(step, (n // step) * step) if n >= step else n



def util_to_fit_free(c: Ctx, score: float) -> Lever | None:
    free, total = c.free, c.total
    if not free or not total:
        return None
    new = max_passing_utilization(total, free)
    if new <= 0:
        return None
    if abs(new - c.util) < 0.005:
        return None
    requested = math.ceil(total * new)
    pinned = c.pinned
    rel = ">" if math.ceil(total * c.util) > free else "<="
    ar = [f"vLLM requests ceil(total x util): {_h(total)} x {c.util_said} = {_h(math.ceil(total * c.util))} {rel} free {_h(free)}",
          f"largest util with {CHECK_KEEP_BACK:.0%} of free kept back: floor(free x {1 - CHECK_KEEP_BACK} / total, 2) = {new}",
          f"requested at {new}: {_h(requested)} <= free {_h(free)}"]
    if pinned:
        ar.append(f"kv_cache_memory_bytes pins the KV arena at {_h(pinned)}: utilization only moves the start-up check, "
                  "the arena does not shrink")
        cost = "none for the KV cache (the arena is pinned); the start-up check passes"
        pred = {"outcome": "passes_startup_check", "requested_bytes": requested, "free_bytes": free}
    elif new > c.util:
        lost = math.ceil(total * c.util) - requested
        cost = f"the KV cache budget grows by about {_h(-lost)}; less memory is left for anything else on the GPU"
        pred = {"outcome": "passes_startup_check", "requested_bytes": requested, "free_bytes": free,
                "kv_budget_change_bytes": -lost}
    else:
        lost = math.ceil(total * c.util) - requested
        cost = f"the KV cache budget shrinks by about {_h(lost)} (fewer tokens and concurrent sequences)"
        pred = {"outcome": "passes_startup_check", "requested_bytes": requested, "free_bytes": free,
                "kv_budget_change_bytes": -lost}
    return lever("gpu_memory_utilization", {"gpu_memory_utilization": new}, pred, cost,
                 "free memory at start from the log (vLLM's own figure)",
                 explicit_override="gpu_memory_utilization" in c.explicit, arithmetic=ar, score=score)


def free_others(c: Ctx, score: float, need: int | None = None) -> Lever | None:
    holders = c.other_holders()
    if not holders:
        return None
    held = sum(h["used_bytes"] for h in holders)
    pids = ", ".join(str(h["pid"]) for h in holders if h.get("pid"))
    free_after = (c.n.get("gpu_free_bytes") or c.free or 0) + held
    ar = [f"process(es) {pids or '?'} hold {_h(held)} ({holders[0]['source']})",
          f"free after stopping them ≈ {_h(free_after)}"]
    pred: dict[str, Any] = {"outcome": "fits" if need is None or free_after >= need else "short",
                            "free_after_bytes": free_after}
    if need is not None:
        ar.append(f"needed ≈ {_h(need)}")
    util = c.util
    total = c.total
    if "gpu_memory_utilization" in c.explicit and total and c.n.get("weights_bytes") is None:
        budget = math.ceil(total * util)
        pred["warning"] = (f"your explicit gpu_memory_utilization={util} gives a budget of {_h(budget)}; once the memory "
                           "is free, that budget must still hold weights, activations and the KV cache")
    return lever("free_other_processes", {"stop_pids": [h["pid"] for h in holders if h.get("pid")]}, pred,
                 f"stop the process(es) holding {_h(held)} (or run the engine on a GPU no one else uses)",
                 "the OOM message names the process and its memory", applies_as="process", arithmetic=ar, score=score)


def window_in_tokens(c: Ctx) -> Lever | None:
    """The engine said how many tokens its KV cache holds and not how many bytes (V0's "The model's max seq len
    (131072) is larger than the maximum number of tokens that can be stored in KV cache (21840)", the CPU backend's
    among them, where no utilization of a GPU applies): the window is those tokens, aligned down."""
    mml, cap = c.n.get("max_model_len") or c.setting("max_model_len"), c.n.get("kv_capacity_tokens")
    if not (mml and cap) or cap >= mml:
        return None
    step = 1024 if cap >= 8192 else 16
    new = _align_down(int(cap * (1 - WINDOW_MARGIN)), step)
    if new <= 0:
        return None
    return lever("max_model_len", {"max_model_len": new}, {"outcome": "fits", "kv_capacity_tokens": int(cap)},
                 f"context window {mml:,} → {new:,} tokens ({100 * (1 - new / mml):.0f}% shorter); longer requests "
                 "are rejected", "the engine's error gives the tokens its KV cache holds",
                 explicit_override="max_model_len" in c.explicit,
                 arithmetic=[f"the KV cache holds {cap:,} tokens (the engine's error) x (1 - {WINDOW_MARGIN}), "
                             f"aligned down to a multiple of {step}: {new:,}"],
                 score=10 if "max_model_len" not in c.explicit else 40)


def window_levers(c: Ctx) -> list[Lever]:
    n = c.n
    mml = n.get("max_model_len") or c.setting("max_model_len")
    need = n.get("kv_needed_bytes")
    avail = n.get("kv_available_bytes")
    out: list[Lever] = []
    if not (mml and need and avail):
        w = window_in_tokens(c)
        return [w] if w else out
    bpt = need / mml
    fit = int(avail * (1 - WINDOW_MARGIN) / bpt)
    est = int(n.get("estimated_max_model_len") or 0)
    est_note = ((f" (capped at vLLM's estimate {est:,})" if est < fit else f" (within vLLM's estimate {est:,})")
                if est else "")
    if est:
        fit = min(fit, est)
    step = 1024 if fit >= 8192 else 16
    new = _align_down(fit, step)
    if new > 0 and new < mml:
        pct = 100 * (1 - new / mml)
        out.append(lever(
            "max_model_len", {"max_model_len": new},
            {"outcome": "fits", "kv_needed_bytes": int(new * bpt), "kv_available_bytes": int(avail),
             "full_length_sequences": round(avail / (new * bpt), 2)},
            f"context window {mml:,} → {new:,} tokens ({pct:.0f}% shorter); longer requests are rejected",
            "KV bytes per token = needed / max_model_len from the engine's error; available from the same line",
            explicit_override="max_model_len" in c.explicit,
            arithmetic=[f"KV per token = {_h(need)} / {mml:,} = {bpt:,.0f} B",
                        f"tokens that fit = {_h(avail)} x (1 - {WINDOW_MARGIN}) / {bpt:,.0f} B = "
                        f"{int(avail * (1 - WINDOW_MARGIN) / bpt):,}{est_note}",
                        f"aligned down to a multiple of {step}: {new:,}"],
            score=10 if "max_model_len" not in c.explicit else 40))
    dtype = str(c.setting("kv_cache_dtype", "auto"))
    if dtype in ("auto", "bfloat16", "float16", "None"):
        half = need / 2
        ok = half <= avail
        out.append(lever(
            "kv_cache_dtype", {"kv_cache_dtype": "fp8"},
            {"outcome": "fits" if ok else "short", "kv_needed_bytes": int(half), "kv_available_bytes": int(avail),
             **({} if ok else {"short_by_bytes": int(half - avail)})},
            "fp8 KV cache: quality risk without calibrated scales; keeps the full window",
            "fp8 stores 1 byte per element instead of 2 (a real 0.25.1 run doubled its token count)",
            explicit_override="kv_cache_dtype" in c.explicit,
            arithmetic=[f"needed at fp8 = {_h(need)} / 2 = {_h(half)} vs available {_h(avail)}"],
            score=(20 if ok else 60)))
    if c.total and c.free is not None:
        max_util = max_passing_utilization(c.total, c.free)
        gain = (max_util - c.util) * c.total
        if max_util > c.util and not c.pinned:
            ok = avail + gain >= need
            out.append(lever(
                "gpu_memory_utilization", {"gpu_memory_utilization": max_util},
                {"outcome": "fits" if ok else "short", "kv_available_bytes": int(avail + gain),
                 **({} if ok else {"short_by_bytes": int(need - avail - gain)})},
                "less memory left for anything else on the GPU",
                "free memory allows it: floor(free x 0.98 / total, 2)",
                explicit_override="gpu_memory_utilization" in c.explicit,
                arithmetic=[f"util {c.util_said} → {max_util}: + {_h(gain)} of KV budget"], score=(25 if ok else 70)))
    grow = pinned_to_fit(c, need)
    if grow:
        out.append(grow)
    arena_warning(c, out)
    tp = int(c.setting("tensor_parallel_size", 1) or 1)
    out.append(lever(
        "tensor_parallel_size", {"tensor_parallel_size": tp * 2},
        {"outcome": "fits" if need / 2 <= avail else "short", "kv_needed_per_gpu_bytes": int(need / 2)},
        f"{tp * 2} GPUs instead of {tp}; KV heads are split across them (needs at least {tp * 2} KV heads)",
        "KV per token per GPU halves with twice the ranks", applies_as="flag", score=80))
    return out


def _arena_room(c: Ctx) -> tuple[Any, Any, Any, int | None]:
    """(pinned KV budget, free memory at start, weights, the room a pinned arena has beside the weights and the
    reserve for activations and graphs: free - weights - reserve; None when free or weights is not known)."""
    pinned, free, weights = c.pinned, c.n.get("initial_free_bytes") or c.free, c.n.get("weights_bytes")
    return pinned, free, weights, (int(free - weights - ACTIVATION_GRAPH_RESERVE) if free and weights else None)


def arena_warning(c: Ctx, levers: list[Lever]) -> None:
    """A pinned KV arena that the free memory cannot hold beside the weights and the reserve: a lever that keeps it
    (a shorter window, an fp8 cache) passes the capacity check and then fails allocating it (a real H200 walk, R1a:
    fp8 → kv_allocation_oom); the prediction says so."""
    pinned, free, weights, room = _arena_room(c)
    if not pinned or room is None or pinned <= room:
        return
    for lv in levers:
        if lv["id"] in ("max_model_len", "kv_cache_dtype") and lv["predicted"].get("outcome") == "fits":
            lv["predicted"]["warning"] = (f"the pinned KV arena ({_h(pinned)}) is still allocated whole: free "
                                          f"{_h(free)} - weights {_h(weights)} - {_h(ACTIVATION_GRAPH_RESERVE)} "
                                          f"reserve leaves {_h(max(room, 0))}, so allocating it runs out next "
                                          f"(kv_cache_memory_bytes must shrink too)")
            lv["predicted"]["then"] = "kv_allocation_oom"


def unmeasured_room_warning(c: Ctx, levers: list[Lever]) -> None:
    """A pinned arena that fits beside the weights but leaves less than the reserve: vLLM skips memory profiling
    for it (0.25.1 gpu_worker.py: "... as specified by kv_cache_memory_bytes config and skipped memory profiling"), so
    the graphs, the warm-up's max_num_seqs dummy requests and the activations get what is left, which nothing
    measured. A lever that only drops the graphs then meets the warm-up (a real served H200 walk, G1: enforce_eager
    → sampler_warmup_oom with 0.78 GiB left, then max_num_seqs 256 passed); the prediction says so."""
    pinned, _free, _weights, room = _arena_room(c)
    left = _unmeasured_left(c)
    if left is None or room is None or pinned <= room:
        return
    mns = int(c.setting("max_num_seqs", 1024) or 1024)
    for lv in levers:
        if lv["id"] in ("enforce_eager", "cuda_graph_sizes"):
            lv["predicted"]["outcome"] = "unknown"      # not "fits" beside a warning that it may not
            lv["predicted"]["warning"] = (
                f"vLLM does not profile a pinned KV arena: this {_h(pinned)} one leaves {_h(left)} beside the weights, "
                f"under a {_h(ACTIVATION_GRAPH_RESERVE)} reserve: the warm-up of {mns:,} dummy requests can run out "
                "next (then max_num_seqs)")


def _unmeasured_left(c: Ctx) -> int | None:
    """What a pinned arena leaves of the free memory beside the weights (vLLM measures none of it: it skips
    profiling for a pinned arena); None when nothing is pinned, a figure is not in the log, or the arena does not fit."""
    pinned, free, weights, _room = _arena_room(c)
    if not (pinned and free and weights) or free - weights - pinned < 0:
        return None
    return int(free - weights - pinned)


def unmeasured_room(c: Ctx) -> str | None:
    """``_unmeasured_left`` in words, for a lever's arithmetic."""
    left = _unmeasured_left(c)
    if left is None:
        return None
    pinned, free, weights, _room = _arena_room(c)
    return (f"vLLM did not profile the pinned KV arena: free {_h(free)} - weights {_h(weights)} - arena {_h(pinned)} "
            f"leaves {_h(left)} for the warm-up and activations")


def pinned_to_fit(c: Ctx, need: float) -> Lever | None:
    """A pinned KV budget (kv_cache_memory_bytes) too small for one sequence of the window: grow it to what one
    needs, rounded up to 100 MiB — predicted to fit only when the free memory holds it beside the weights and the
    reserve for activations and graphs (a real H200 start pinned at 2.5e9 with 4.8 GiB free ran out allocating it)."""
    pinned, free, weights, room = _arena_room(c)
    if not (pinned and need > pinned):
        return None
    new = math.ceil(need / (100 * MiB)) * 100 * MiB
    ok = room is not None and new <= room
    pred: dict[str, Any] = {"outcome": "fits" if ok else ("short" if room is not None else "unknown"),
                            "kv_cache_memory_bytes": new}
    ar = [f"one sequence needs {_h(need)} of KV; the pinned budget is {_h(pinned)}"]
    if room is not None:
        ar.append(f"room = free {_h(free)} - weights {_h(weights)} - {_h(ACTIVATION_GRAPH_RESERVE)} for activations "
                  f"and graphs = {_h(room)}" + ("" if ok else f": short by {_h(new - room)}"))
        if not ok:
            pred["short_by_bytes"] = int(new - room)
    return lever("kv_cache_memory_bytes", {"kv_cache_memory_bytes": new}, pred,
                 f"the KV cache takes {_h(new - pinned)} more of the GPU", "the pinned KV budget is what is too small",
                 explicit_override=False, arithmetic=ar, score=15 if ok else 65)


def pinned_arena_lever(c: Ctx, reserve: int, why: str, score: float) -> Lever | None:
    pinned = c.pinned
    free = c.n.get("initial_free_bytes") or c.free
    weights = c.n.get("weights_bytes")
    if not (pinned and free and weights):
        return None
    non_torch = 0
    if c.n.get("process_in_use_bytes") and c.n.get("torch_allocated_bytes") is not None:
        non_torch = max(0, int(c.n["process_in_use_bytes"]) - int(c.n["torch_allocated_bytes"])
                        - int(c.n.get("torch_reserved_unallocated_bytes") or 0))
    fit = int(free - weights - non_torch - reserve)
    if fit <= 0:
        return None
    new = (fit // (100 * MiB)) * 100 * MiB
    if new >= pinned:
        return None
    pred = {"outcome": "fits", "kv_cache_memory_bytes": new, "headroom_bytes": int(free - weights - non_torch - new)}
    tokens = c.n.get("kv_cache_tokens")
    if tokens:
        pred["kv_cache_tokens"] = int(tokens * new / pinned)
    return lever(
        "kv_cache_memory_bytes", {"kv_cache_memory_bytes": new}, pred,
        f"KV arena {_h(pinned)} → {_h(new)}" + (f" (≈{pred['kv_cache_tokens']:,} tokens instead of {int(tokens):,})" if tokens else ""),
        why, explicit_override="kv_cache_memory_bytes" in c.explicit,
        arithmetic=[f"initial free {_h(free)} - weights {_h(weights)} - non-torch {_h(non_torch)} - reserve for "
                    f"activations/graphs {_h(reserve)} = {_h(fit)}", f"rounded down to 100 MiB: {_h(new)}"],
        score=score)


def util_step_down(c: Ctx, why: str, score: float) -> Lever:
    """Lower utilization by 3 % of total: room for memory the budget did not count (never with a pinned arena)."""
    return lever("gpu_memory_utilization", {"gpu_memory_utilization": round(max(0.05, c.util - 0.03), 2)},
                 {"outcome": "unknown"}, "a smaller KV cache (3 % of total memory)", why,
                 explicit_override="gpu_memory_utilization" in c.explicit, score=score)


def batch_halved(c: Ctx, cost: str, why: str, score: float, arithmetic: list[str] | None = None) -> Lever:
    """Halve max_num_batched_tokens (at least 512): the activation peak of the largest step scales with it."""
    mnbt = int(c.setting("max_num_batched_tokens", 8192) or 8192)
    return lever("max_num_batched_tokens", {"max_num_batched_tokens": max(512, mnbt // 2)}, {"outcome": "unknown"},
                 cost, why, explicit_override="max_num_batched_tokens" in c.explicit, arithmetic=arithmetic, score=score)


def larger_gpu(c: Ctx, need: int | None, score: float = 99) -> Lever:
    return lever("larger_gpu", {"gpu_memory_at_least_bytes": need} if need else {},
                 {"outcome": "fits" if need else "unknown"},
                 "hardware: the honest last resort when no software lever keeps the required context, concurrency, quality and speed",
                 "last resort", applies_as="hardware", score=score)

