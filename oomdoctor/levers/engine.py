"""Stage 6 — levers: ONE setting to change, to what value, why, what it costs, what the arithmetic predicts.

Inputs are the diagnosis (class + numbers from the log), the workload (which settings the user set
explicitly, which were left at defaults), the device state and the attempts made so far. Rules that
come from real incidents (../shared/INCIDENTS.md):
- never propose a gpu_memory_utilization above what is free (vLLM checks free >= ceil(total x util));
- lowering utilization is dead when kv_cache_memory_bytes pins the arena (it only moves the start-up check);
- an explicit user value is never silently overridden: a lever on a default ranks first, and a lever
  that changes an explicit value says so (``explicit_override``);
- after a failed attempt, the next proposal comes from what that attempt showed (its own log numbers),
  and a lever already tried with the same change is not proposed again.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable

from oomdoctor.units import human_bytes

GiB = 1 << 30
MiB = 1 << 20
VLLM_DEFAULT_UTIL = 0.92
CHECK_SAFETY = 0.02            # keep 2 % of free memory below vLLM's start-up check
ACTIVATION_GRAPH_RESERVE = GiB  # assumed activations + CUDA graphs when the arena is pinned and nothing measured
WINDOW_MARGIN = 0.02           # keep 2 % of the KV budget free when sizing a window


def _h(n: float | int | None) -> str:
    return human_bytes(n) if n is not None else "?"


class Ctx:
    """What a lever generator may read."""

    def __init__(self, klass: str, numbers: dict, workload: dict, device: dict, attempts: list):
        self.klass = klass
        self.n = numbers
        self.wl = workload or {}
        self.device = device or {}
        self.attempts = attempts or []
        self.args = dict(self.wl.get("engine_args") or {})
        self.resolved = dict(self.wl.get("resolved") or {})
        self.explicit = set(self.wl.get("explicit_args") or self.args.keys())

    def setting(self, key: str, default: Any = None) -> Any:
        if key in self.args:
            return self.args[key]
        if key in self.resolved:
            return self.resolved[key]
        return self.n.get(key, default)

    @property
    def pinned(self) -> int | None:
        v = self.args.get("kv_cache_memory_bytes") or self.n.get("kv_cache_memory_bytes_pinned")
        if v is None and "kv_cache_memory_bytes" in self.n and self.klass != "kv_capacity":
            v = self.n["kv_cache_memory_bytes"]
        try:
            return int(float(v)) if v is not None else None
        except (TypeError, ValueError):
            return None

    @property
    def util(self) -> float:
        v = self.args.get("gpu_memory_utilization", self.n.get("gpu_memory_utilization", VLLM_DEFAULT_UTIL))
        return float(v)

    @property
    def total(self) -> int | None:
        for k in ("gpu_total_bytes",):
            if k in self.n:
                return int(self.n[k])
        if self.wl.get("gpu_total_bytes"):
            return int(self.wl["gpu_total_bytes"])
        return None

    @property
    def free(self) -> int | None:
        """Free memory at the start, as the engine saw it (its own check) or as recorded."""
        for k in ("free_at_start_bytes", "initial_free_bytes"):
            if k in self.n:
                return int(self.n[k])
        if self.wl.get("free_at_start_bytes"):
            return int(self.wl["free_at_start_bytes"])
        return None

    def other_holders(self) -> list[dict]:
        """Processes other than the engine that held GPU memory: from the log, then from NVML."""
        out = []
        if self.n.get("other_process_bytes"):
            out.append({"pid": self.n.get("other_process_pid"), "used_bytes": int(self.n["other_process_bytes"]),
                        "source": "the OOM message in the log"})
            return out
        if self.device.get("status") == "captured":
            idx = int(self.n.get("oom_gpu_index", 0))
            for g in self.device.get("gpus", []):
                if g.get("index") != idx:
                    continue
                for p in g.get("processes") or []:
                    if p.get("pid") == os.getpid() or not p.get("used_bytes"):
                        continue
                    name = p.get("name") or ""
                    leftover = any(k in name for k in ("vllm", "EngineCore", "sglang", "llama-server"))
                    out.append({"pid": p["pid"], "used_bytes": int(p["used_bytes"]), "name": name[:120],
                                "source": f"NVML now on this machine, GPU {idx}"
                                          + (" (looks like a leftover engine)" if leftover else "")})
        return out

    def tried(self, lever_id: str, change: dict) -> bool:
        for a in self.attempts:
            if a.get("lever") == lever_id and a.get("change") == change:
                return True
        return False


def lever(id: str, change: dict, predicted: dict, cost: str, basis: str, applies_as: str = "flag",
          explicit_override: bool = False, arithmetic: list[str] | None = None, score: float = 0.0) -> dict:
    return {"id": id, "change": change, "rank": 0, "predicted": predicted, "cost": cost, "basis": basis,
            "applies_as": applies_as, "explicit_override": explicit_override, "arithmetic": arithmetic or [],
            "_score": score}


def _floor_util(x: float) -> float:
    return math.floor(x * 100) / 100.0


def _align_down(n: int, step: int) -> int:
    return max(step, (n // step) * step) if n >= step else n


# ----------------------------------------------------------------------------- generators
def util_to_fit_free(c: Ctx, score: float) -> dict | None:
    free, total = c.free, c.total
    if not free or not total:
        return None
    new = _floor_util(free * (1 - CHECK_SAFETY) / total)
    if new <= 0:
        return None
    if abs(new - c.util) < 0.005:
        return None
    requested = math.ceil(total * new)
    pinned = c.pinned
    rel = ">" if math.ceil(total * c.util) > free else "<="
    ar = [f"vLLM requests ceil(total x util): {_h(total)} x {c.util} = {_h(math.ceil(total * c.util))} {rel} free {_h(free)}",
          f"largest util with {CHECK_SAFETY:.0%} of free kept back: floor(free x {1 - CHECK_SAFETY} / total, 2) = {new}",
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


def free_others(c: Ctx, score: float, need: int | None = None) -> dict | None:
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


def window_levers(c: Ctx) -> list[dict]:
    n = c.n
    mml = n.get("max_model_len") or c.setting("max_model_len")
    need = n.get("kv_needed_bytes")
    avail = n.get("kv_available_bytes")
    out: list[dict] = []
    if not (mml and need and avail):
        return out
    bpt = need / mml
    fit = int(avail * (1 - WINDOW_MARGIN) / bpt)
    if n.get("estimated_max_model_len"):
        fit = min(fit, int(n["estimated_max_model_len"]))
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
                        f"tokens that fit = {_h(avail)} x (1 - {WINDOW_MARGIN}) / {bpt:,.0f} B = {fit:,}"
                        + (f" (capped at vLLM's estimate {n['estimated_max_model_len']:,})" if n.get("estimated_max_model_len") else ""),
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
        max_util = _floor_util(c.free * (1 - CHECK_SAFETY) / c.total)
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
                arithmetic=[f"util {c.util} → {max_util}: + {_h(gain)} of KV budget"], score=(25 if ok else 70)))
    tp = int(c.setting("tensor_parallel_size", 1) or 1)
    out.append(lever(
        "tensor_parallel_size", {"tensor_parallel_size": tp * 2},
        {"outcome": "fits" if need / 2 <= avail else "short", "kv_needed_per_gpu_bytes": int(need / 2)},
        f"{tp * 2} GPUs instead of {tp}; KV heads are split across them (needs at least {tp * 2} KV heads)",
        "KV per token per GPU halves with twice the ranks", applies_as="flag", score=80))
    return out


def pinned_arena_lever(c: Ctx, reserve: int, why: str, score: float) -> dict | None:
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


def util_step_down(c: Ctx, why: str, score: float) -> dict:
    """Lower utilization by 3 % of total: room for memory the budget did not count (never with a pinned arena)."""
    return lever("gpu_memory_utilization", {"gpu_memory_utilization": round(max(0.05, c.util - 0.03), 2)},
                 {"outcome": "unknown"}, "a smaller KV cache (3 % of total memory)", why,
                 explicit_override="gpu_memory_utilization" in c.explicit, score=score)


def batch_halved(c: Ctx, cost: str, why: str, score: float, arithmetic: list[str] | None = None) -> dict:
    """Halve max_num_batched_tokens (at least 512): the activation peak of the largest step scales with it."""
    mnbt = int(c.setting("max_num_batched_tokens", 8192) or 8192)
    return lever("max_num_batched_tokens", {"max_num_batched_tokens": max(512, mnbt // 2)}, {"outcome": "unknown"},
                 cost, why, explicit_override="max_num_batched_tokens" in c.explicit, arithmetic=arithmetic, score=score)


def larger_gpu(c: Ctx, need: int | None, score: float = 99) -> dict:
    return lever("larger_gpu", {"gpu_memory_at_least_bytes": need} if need else {},
                 {"outcome": "fits" if need else "unknown"},
                 "hardware: the honest last resort when no software lever keeps the required context, concurrency, quality and speed",
                 "last resort", applies_as="hardware", score=score)


def gen_kv_capacity(c: Ctx) -> list[dict]:
    out = window_levers(c)
    if c.n.get("kv_available_bytes") is not None and c.n.get("kv_available_bytes", 0) <= 0 or not out:
        u = util_to_fit_free(c, 30)
        if u and u["change"]["gpu_memory_utilization"] > c.util:
            w = c.n.get("weights_bytes")
            if w and c.total and c.total * c.util < w * 1.5:
                # the budget (total x util) does not even hold the weights: utilization IS the constraint
                u["cause"] = True
                u["arithmetic"].insert(0, f"budget {_h(c.total * c.util)} (total x {c.util}) < 1.5 x weights {_h(w)}")
                u["_score"] = 5
            u["predicted"]["outcome"] = "fits" if u.get("cause") else u["predicted"]["outcome"]
            out.append(u)
        mnbt = c.setting("max_num_batched_tokens")
        if mnbt and int(mnbt) > 2048:
            out.append(lever("max_num_batched_tokens", {"max_num_batched_tokens": max(2048, int(mnbt) // 4)},
                             {"outcome": "unknown"}, "longer prefills are chunked more finely (lower prefill throughput)",
                             "the activation peak grows with max_num_batched_tokens", score=50))
    need = c.n.get("kv_needed_bytes")
    out.append(larger_gpu(c, int(need + (c.n.get("weights_bytes") or 0)) if need else None))
    return out


def gen_free_memory(c: Ctx) -> list[dict]:
    out = []
    u = util_to_fit_free(c, 10)
    if u:
        out.append(u)
    f = free_others(c, 5, need=math.ceil((c.total or 0) * c.util) if c.total else None)
    if f:
        out.append(f)
    elif c.total and c.free is not None:
        held = c.total - c.free
        out.append(lever("free_other_processes", {"stop_pids": []},
                         {"outcome": "unknown", "held_by_others_bytes": held},
                         f"find and stop what holds {_h(held)} (nvidia-smi; a zombie engine is common)",
                         "total - free from the engine's check; the log does not name the holder",
                         applies_as="process", score=20,
                         arithmetic=[f"{_h(c.total)} total - {_h(c.free)} free = {_h(held)} held by others"]))
    out.append(larger_gpu(c, math.ceil(c.total * c.util) if c.total else None))
    return out


def gen_weights(c: Ctx) -> list[dict]:
    out = []
    f = free_others(c, 5, need=c.n.get("tried_to_allocate_bytes"))
    if f:
        out.append(f)
    q = c.setting("quantization")
    if q in (None, "None", ""):
        out.append(lever("quantization", {"quantization": "fp8"}, {"outcome": "unknown", "weights_factor": 0.5},
                         "fp8 weights: about half the weight memory; small quality risk, needs a GPU with fp8 support",
                         "bf16/fp16 weights take 2 bytes per parameter, fp8 one", score=30))
    tp = int(c.setting("tensor_parallel_size", 1) or 1)
    out.append(lever("tensor_parallel_size", {"tensor_parallel_size": tp * 2}, {"outcome": "unknown", "weights_factor": 0.5},
                     f"{tp * 2} GPUs instead of {tp}", "weights are split across ranks", score=40))
    out.append(lever("cpu_offload_gb", {"cpu_offload_gb": 4}, {"outcome": "unknown"},
                     "weights streamed from CPU memory every step: much slower decoding", "UVA offload", score=60))
    out.append(larger_gpu(c, None))
    return out


def gen_kv_alloc(c: Ctx) -> list[dict]:
    out = []
    p = pinned_arena_lever(c, ACTIVATION_GRAPH_RESERVE,
                           "the pinned arena does not fit what is free after the weights; vLLM skipped profiling, so "
                           "oomdoctor keeps a reserve for activations and CUDA graphs", 10)
    if p:
        out.append(p)
    elif not c.pinned:
        u = util_to_fit_free(c, 20)
        if u:
            out.append(u)
    f = free_others(c, 30)
    if f:
        out.append(f)
    out.append(larger_gpu(c, None))
    return out


def gen_cuda_graph(c: Ctx) -> list[dict]:
    out = [lever("enforce_eager", {"enforce_eager": True}, {"outcome": "fits", "frees": "the CUDA graph pool"},
                 "no CUDA graphs: slower decoding at small batch sizes (often 10-30 %)",
                 "the failure happened while capturing CUDA graphs; eager mode captures none",
                 explicit_override="enforce_eager" in c.explicit, score=10)]
    p = pinned_arena_lever(c, ACTIVATION_GRAPH_RESERVE,
                           "leave room for the CUDA graph pool, which the pinned arena's budget did not count", 15)
    if p:
        out.append(p)
    elif not c.pinned:
        out.append(util_step_down(c, "graph memory that profiling did not estimate must fit outside the budget", 20))
    out.append(lever("cuda_graph_sizes", {"max_cudagraph_capture_size": 64}, {"outcome": "unknown"},
                     "graphs only for batches up to 64 sequences; larger batches run eagerly", "fewer, smaller graphs", score=30))
    out.append(larger_gpu(c, None))
    return out


def gen_sampler(c: Ctx) -> list[dict]:
    mns = int(c.setting("max_num_seqs", 1024) or 1024)
    new = max(16, mns // 4)
    out = [lever("max_num_seqs", {"max_num_seqs": new}, {"outcome": "unknown", "sampler_warmup_requests": new},
                 f"at most {new} concurrent sequences instead of {mns}", "the warm-up runs max_num_seqs dummy requests",
                 explicit_override="max_num_seqs" in c.explicit, score=10)]
    if not c.pinned:
        out.append(util_step_down(c, "leave room after the KV cache", 30))
    out.append(larger_gpu(c, None))
    return out


def gen_profiling(c: Ctx) -> list[dict]:
    out = [batch_halved(c, "prefills are split into smaller chunks (lower prefill throughput)",
                        "the profiling forward pass runs max_num_batched_tokens tokens; its activation peak scales with it", 10),
           lever("skip_mm_profiling", {"skip_mm_profiling": True}, {"outcome": "unknown"},
                 "multimodal encoder memory is not reserved: large images can OOM at runtime",
                 "only for multimodal models", score=50)]
    f = free_others(c, 20)
    if f:
        out.append(f)
    out.append(larger_gpu(c, None))
    return out


def gen_autotune(c: Ctx) -> list[dict]:
    out = [batch_halved(c, "smaller prefill chunks", "the autotuner's largest M is max_num_batched_tokens", 10)]
    p = pinned_arena_lever(c, ACTIVATION_GRAPH_RESERVE, "leave room for the autotuner's workspaces", 20)
    if p:
        out.append(p)
    out.append(larger_gpu(c, None))
    return out


def gen_runtime_oom(c: Ctx) -> list[dict]:
    out = []
    if (c.n.get("torch_reserved_unallocated_bytes") or 0) >= (c.n.get("tried_to_allocate_bytes") or 1 << 62):
        out.append(lever("expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                         {"outcome": "fits"}, "none measurable in most workloads",
                         "reserved-but-unallocated memory exceeds the failed request: fragmentation", applies_as="env", score=5))
    mnbt = int(c.setting("max_num_batched_tokens", 8192) or 8192)
    shape = []
    if c.n.get("oom_request_prompt_tokens") is not None:
        shape.append(f"the engine died running a request of {c.n['oom_request_prompt_tokens']:,} prompt tokens"
                     + (f" among {c.n['oom_running_requests']} running, {c.n.get('oom_waiting_requests', 0)} waiting"
                        if c.n.get("oom_running_requests") is not None else ""))
    out.append(batch_halved(c, "smaller prefill chunks", "the largest batch's activations ran out", 10,
                            shape + [f"a step processes at most max_num_batched_tokens = {mnbt:,} tokens; half of it "
                                     "halves the activation peak of the largest prefill step"]))
    out.append(lever("max_num_seqs", {"max_num_seqs": max(8, int(c.setting("max_num_seqs", 256) or 256) // 2)},
                     {"outcome": "unknown"}, "fewer concurrent sequences", "smaller decode batches", score=20))
    if not c.pinned:
        out.append(util_step_down(c, "room outside the budget", 30))
    out.append(lever("expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {"outcome": "unknown"},
                     "none measurable in most workloads", "allocator tuning, only after sizing causes", applies_as="env", score=60))
    return _dedupe(out)


def gen_preemption(c: Ctx) -> list[dict]:
    out = []
    mns = c.setting("max_num_seqs")
    tokens = c.n.get("kv_cache_tokens")
    free = c.n.get("initial_free_bytes") or c.free
    weights = c.n.get("weights_bytes") or 0
    if c.pinned and free:
        room = int(free - weights - (c.n.get("cuda_graph_bytes") or 0) - ACTIVATION_GRAPH_RESERVE)
        grow = min(c.pinned * 2, (room // (100 * MiB)) * 100 * MiB)
        if grow > c.pinned:
            lv = lever("kv_cache_memory_bytes", {"kv_cache_memory_bytes": grow},
                       {"outcome": "unknown", "kv_cache_tokens": int(tokens * grow / c.pinned) if tokens else None},
                       f"the pinned arena grows {_h(c.pinned)} → {_h(grow)}: that memory is no longer free for anything else",
                       "the pinned KV arena is what caps concurrency, and the card had memory free beyond it",
                       explicit_override="kv_cache_memory_bytes" in c.explicit, score=5,
                       arithmetic=[f"free at start {_h(free)} - weights {_h(weights)} - graphs - reserve {_h(ACTIVATION_GRAPH_RESERVE)} "
                                   f"= {_h(room)} available for the arena", f"proposed: min(2 x {_h(c.pinned)}, that) = {_h(grow)}"])
            lv["cause"] = True
            out.append(lv)
    out.append(lever("kv_cache_dtype", {"kv_cache_dtype": "fp8"},
                     {"outcome": "unknown", "kv_cache_tokens": int(tokens * 2) if tokens else None},
                     "fp8 KV cache: quality risk without calibrated scales", "twice the tokens in the same bytes",
                     explicit_override="kv_cache_dtype" in c.explicit, score=20))
    new_seqs = max(1, int(mns) // 2) if mns else 64
    out.append(lever("max_num_seqs", {"max_num_seqs": new_seqs}, {"outcome": "unknown"},
                     "fewer sequences run at once: lower throughput, no recomputation", "admit only what the KV cache holds",
                     explicit_override="max_num_seqs" in c.explicit, score=10 if "max_num_seqs" not in c.explicit else 25))
    out.append(batch_halved(c, "smaller prefill chunks", "less KV claimed per step by prefills", 40))
    return out


def gen_rejection(c: Ctx) -> list[dict]:
    mml = c.n.get("max_model_len") or c.setting("max_model_len")
    asked = (c.n.get("rejected_prompt_tokens") or 0) + (c.n.get("rejected_output_tokens") or 0)
    out = []
    if mml and asked:
        tokens = c.n.get("kv_cache_tokens")
        new = int(math.ceil(asked / 1024) * 1024)
        ok = tokens is None or new <= tokens
        ar = [f"rejected request: {c.n.get('rejected_prompt_tokens', 0):,} prompt + {c.n.get('rejected_output_tokens', 0):,} "
              f"output = {asked:,} tokens > window {int(mml):,}"]
        kv_bytes = c.n.get("kv_cache_memory_bytes") or c.n.get("kv_available_bytes")
        if tokens and kv_bytes:
            bpt = kv_bytes / tokens
            ar.append(f"KV per token ≈ {_h(kv_bytes)} / {int(tokens):,} tokens = {bpt:,.0f} B; this request needs "
                      f"{asked:,} x {bpt:,.0f} B = {_h(asked * bpt)} of a {_h(kv_bytes)} cache")
        out.append(lever("max_model_len", {"max_model_len": new},
                         {"outcome": "fits" if ok else "short", "kv_cache_tokens": tokens},
                         f"window {int(mml):,} → {new:,}: fewer full-length sequences fit at once",
                         "the rejected request needs prompt + output tokens", explicit_override="max_model_len" in c.explicit,
                         arithmetic=ar, score=10 if ok else 50))
    out.append(lever("admission_queue", {"admission_queue": True}, {"outcome": "unknown"},
                     "requests wait instead of failing; latency grows under load",
                     "queue with a deadline derived from measured request durations", applies_as="server", score=20))
    return out


def gen_config(c: Ctx) -> list[dict]:
    out = []
    bs = c.n.get("block_size_tokens")
    mnbt = c.n.get("max_num_batched_tokens")
    if bs and mnbt and bs > mnbt:
        out.append(lever("max_num_batched_tokens", {"max_num_batched_tokens": int(bs)}, {"outcome": "fits"},
                         "a larger prefill chunk: a bigger activation peak", "block_size must be <= max_num_batched_tokens",
                         explicit_override="max_num_batched_tokens" in c.explicit, score=10))
    mns = c.n.get("max_num_seqs")
    if mns and mnbt and mnbt < mns:
        out.append(lever("max_num_batched_tokens", {"max_num_batched_tokens": int(mns)}, {"outcome": "fits"},
                         "a larger batch budget", "max_num_batched_tokens >= max_num_seqs", score=10))
    return out


# the setting a class names as its cause: changing it is the direct fix even when the user set it
CAUSE_SETTING = {"kv_allocation_oom": "kv_cache_memory_bytes", "config_invalid": "max_num_batched_tokens"}

GENERATORS: dict[str, Callable[[Ctx], list[dict]]] = {
    "kv_capacity": gen_kv_capacity,
    "free_memory_below_utilization": gen_free_memory,
    "weights_load_oom": gen_weights,
    "kv_allocation_oom": gen_kv_alloc,
    "cuda_graph_oom": gen_cuda_graph,
    "sampler_warmup_oom": gen_sampler,
    "profiling_oom": gen_profiling,
    "autotuner_oom": gen_autotune,
    "runtime_oom": gen_runtime_oom,
    "kv_preemption": gen_preemption,
    "admission_rejection": gen_rejection,
    "config_invalid": gen_config,
}


def _dedupe(levers: list[dict]) -> list[dict]:
    seen: set[tuple] = set()
    out = []
    for lv in levers:
        key = (lv["id"], repr(sorted(lv["change"].items())))
        if key in seen:
            continue
        seen.add(key)
        out.append(lv)
    return out


def propose(klass: str, numbers: dict, workload: dict | None = None, device: dict | None = None,
            attempts: list | None = None, allowed: list[str] | None = None) -> list[dict]:
    """Ranked levers for a diagnosis; ``[0]`` is the one to try first. Empty for non-memory classes."""
    gen = GENERATORS.get(klass)
    if gen is None:
        return []
    c = Ctx(klass, numbers, workload or {}, device or {}, attempts or [])
    levers = [lv for lv in _dedupe(gen(c)) if not c.tried(lv["id"], lv["change"])]
    if allowed:
        levers = [lv for lv in levers if lv["id"] in allowed or lv["id"] in ("larger_gpu", "free_other_processes")]

    cause = CAUSE_SETTING.get(klass)

    def key(lv: dict) -> tuple:
        last_resort = lv["id"] == "larger_gpu"
        short = lv["predicted"].get("outcome") == "short"
        # an explicit value ranks later, unless that very setting is what the failure names as the cause
        penalised = lv["explicit_override"] and lv["id"] != cause and not lv.get("cause")
        return (last_resort, short, penalised, lv["_score"])

    levers.sort(key=key)
    for i, lv in enumerate(levers, 1):
        lv["rank"] = i
        lv.pop("_score", None)
        lv.pop("cause", None)
        lv["predicted"] = {k: v for k, v in lv["predicted"].items() if v is not None}
        if not lv["arithmetic"]:
            lv.pop("arithmetic")
    return levers
