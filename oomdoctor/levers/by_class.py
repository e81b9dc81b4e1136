"""The lever generators per failure class: which settings' levers a class gets, in which preference."""
from __future__ import annotations

import math
from typing import Callable

from oomdoctor.card.records import Lever
from oomdoctor.levers.context import Ctx
from oomdoctor.levers.rank import dedupe
from oomdoctor.levers.record import ACTIVATION_GRAPH_RESERVE, MiB, _h, lever
from oomdoctor.engines.vllm.defaults import largest_default_batched_tokens
from oomdoctor.levers.settings import (batch_halved, free_others, larger_gpu, pinned_arena_lever, util_step_down,
                                       unmeasured_room, unmeasured_room_warning, util_to_fit_free, window_levers)


def gen_kv_capacity(c: Ctx) -> list[Lever]:
    out = window_levers(c)
    if c.n.get("kv_available_bytes") is not None and c.n.get("kv_available_bytes", 0) <= 0 or not out:
        u = util_to_fit_free(c, 30)
        if u and u["change"]["gpu_memory_utilization"] > c.util:
            w = c.n.get("weights_bytes")
            if w and c.total and c.total * c.util < w * 1.5:
                # the budget (total x util) does not even hold the weights: utilization IS the constraint
                u["cause"] = True
                u["arithmetic"].insert(0, f"budget {_h(c.total * c.util)} (total x {c.util_said}) < 1.5 x weights {_h(w)}")
                u["_score"] = 5
            u["predicted"]["outcome"] = "fits" if u.get("cause") else u["predicted"]["outcome"]
            out.append(u)
        out += no_room_levers(c, out)
        smaller = smaller_prefills(c)
        if smaller:
            out.append(smaller)
    need = c.n.get("kv_needed_bytes")
    out.append(larger_gpu(c, int(need + (c.n.get("weights_bytes") or 0)) if need else None))
    return out


def no_room_levers(c: Ctx, have: list[Lever]) -> list[Lever]:
    """No room at all for the cache, and no KV figures to size a window by ("No available memory for the cache
    blocks", nine field-guide pastes): what is taken before the cache, and vLLM's own advice. The CUDA graphs'
    estimate, when the log gives it, is reserved before the cache; else more of the GPU (smaller prefills:
    ``smaller_prefills``)."""
    out: list[Lever] = []
    graphs = c.n.get("cuda_graph_estimate_bytes")
    if graphs and graphs >= 1 << 30 and not c.setting("enforce_eager"):
        out.append(lever("enforce_eager", {"enforce_eager": True}, {"outcome": "unknown"},
                         "no CUDA graphs: slower decoding", "vLLM estimated the CUDA graphs at "
                         f"{_h(graphs)}, reserved before the KV cache", score=5,
                         arithmetic=[f"estimated CUDA graph memory {_h(graphs)} (the log) leaves no cache blocks"]))
    if not any(lv["id"] == "gpu_memory_utilization" for lv in have) and c.util < 0.95:
        new = round(min(0.95, c.util + 0.05), 2)
        out.append(lever("gpu_memory_utilization", {"gpu_memory_utilization": new}, {"outcome": "unknown"},
                         "the engine takes more of the GPU: only where that memory is free (the start-up check says so)",
                         "vLLM's own advice: the memory left for the cache at this utilization is none", score=30,
                         explicit_override="gpu_memory_utilization" in c.explicit,
                         arithmetic=[f"gpu_memory_utilization {c.util_said} → {new}: {new - c.util:.2f} of the GPU "
                                     "more for the cache"]))
        # an explicit utilization under vLLM's defaults (0.9, 0.92) is what left no room (vLLM's message: "Try
        # increasing `gpu_memory_utilization`"): the first suspect, not a setting to leave alone
        out[-1]["cause"] = c.util < 0.9
    return out


def smaller_prefills(c: Ctx) -> Lever | None:
    """A quarter of the token budget (at least 2,048): the profiling peak, taken before the cache, grows with it. The
    budget is the start's, or vLLM's largest default when the log does not give it."""
    mnbt = c.setting("max_num_batched_tokens")
    budget = int(mnbt) if mnbt else largest_default_batched_tokens()
    if budget <= 2048:
        return None
    basis = ("the activation peak grows with max_num_batched_tokens" if mnbt else
             "the profiling peak, taken before the cache, grows with the token budget (the log does not give it; "
             f"vLLM's largest default is {budget:,})")
    return lever("max_num_batched_tokens", {"max_num_batched_tokens": max(2048, budget // 4)}, {"outcome": "unknown"},
                 "longer prefills are chunked more finely (lower prefill throughput)", basis, score=50)


def gen_free_memory(c: Ctx) -> list[Lever]:
    out: list[Lever] = []
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


def gen_weights(c: Ctx) -> list[Lever]:
    out: list[Lever] = []
    _and_free_others(c, out, 5, need=c.n.get("tried_to_allocate_bytes"))
    q = c.setting("quantization")
    if q in (None, "None", ""):
        out.append(lever("quantization", {"quantization": "fp8"}, {"outcome": "unknown", "weights_factor": 0.5},
                         "fp8 weights: about half the weight memory; small quality risk, needs a GPU with fp8 support",
                         "bf16/fp16 weights take 2 bytes per parameter, fp8 one", score=30))
    tp = int(c.setting("tensor_parallel_size", 1) or 1)
    if c.setting("tensor_parallel_size") is not None or not (c.wl.get("parallel") or {}).get("ranks_seen"):
        # (a paste of rank 5's lines ran on 6 GPUs or more, of a size it does not give: no size to double)
        out.append(lever("tensor_parallel_size", {"tensor_parallel_size": tp * 2},
                         {"outcome": "unknown", "weights_factor": 0.5}, f"{tp * 2} GPUs instead of {tp}",
                         "weights are split across ranks", score=40))
    out.append(lever("cpu_offload_gb", {"cpu_offload_gb": 4}, {"outcome": "unknown"},
                     "weights streamed from CPU memory every step: much slower decoding", "UVA offload", score=60))
    out.append(larger_gpu(c, None))
    return out


def gen_kv_alloc(c: Ctx) -> list[Lever]:
    out: list[Lever] = []
    p = pinned_arena_lever(c, ACTIVATION_GRAPH_RESERVE,
                           "the pinned arena does not fit what is free after the weights; vLLM skipped profiling, so "
                           "oomdoctor keeps a reserve for activations and CUDA graphs", 10)
    if p:
        out.append(p)
    elif not c.pinned:
        # without the free/total figures (a paste's tail, another accelerator's wording) the step down that leaves
        # room outside the budget, rather than no software lever at all
        out.append(util_to_fit_free(c, 20) or util_step_down(
            c, "the KV cache allocation did not fit what was free; the log gives no figure to size it by", 20))
    _and_free_others(c, out, 30)
    out.append(larger_gpu(c, None))
    return out


def gen_cuda_graph(c: Ctx) -> list[Lever]:
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
    _and_free_others(c, out, 40, need=c.n.get("tried_to_allocate_bytes"))
    out.append(larger_gpu(c, None))
    unmeasured_room_warning(c, out)
    return out


def _and_free_others(c: Ctx, out: list[Lever], score: float, need: int | None = None) -> None:
    """Freeing what the OOM message names as holding the GPU (a co-tenant, a zombie engine), when it names one: at
    every class's own rank (start-up allocations first; the capture, the warm-up and a serving step, which run out
    beside it as the start's allocations do, after their own levers)."""
    f = free_others(c, score, need=need)
    if f:
        out.append(f)


def gen_sampler(c: Ctx) -> list[Lever]:
    # the message's own count of dummy requests is the max_num_seqs the engine ran with (vLLM: "warming up sampler
    # with 256 dummy requests"); vLLM's default 1024 only when neither the log nor the message says
    mns = int(c.setting("max_num_seqs", c.n.get("sampler_warmup_requests", 1024)) or 1024)
    new = max(16, mns // 4)
    out = [lever("max_num_seqs", {"max_num_seqs": new}, {"outcome": "unknown", "sampler_warmup_requests": new},
                 f"at most {new} concurrent sequences instead of {mns}", "the warm-up runs max_num_seqs dummy requests",
                 explicit_override="max_num_seqs" in c.explicit, score=10)]
    out[0]["cause"] = True      # the warm-up is sized by max_num_seqs: an explicit value of it is the cause, not a taste
    room = unmeasured_room(c)
    if room:
        out[0]["arithmetic"] += [f"the warm-up runs max_num_seqs ({mns:,}) dummy requests", room]
    if not c.pinned:
        out.append(util_step_down(c, "leave room after the KV cache", 30))
    _and_free_others(c, out, 40, need=c.n.get("tried_to_allocate_bytes"))
    out.append(larger_gpu(c, None))
    return out


def gen_profiling(c: Ctx) -> list[Lever]:
    out = [batch_halved(c, "prefills are split into smaller chunks (lower prefill throughput)",
                        "the profiling forward pass runs max_num_batched_tokens tokens; its activation peak scales with it", 10),
           lever("skip_mm_profiling", {"skip_mm_profiling": True}, {"outcome": "unknown"},
                 "multimodal encoder memory is not reserved: large images can OOM at runtime",
                 "only for multimodal models", score=50)]
    _and_free_others(c, out, 20)
    out.append(larger_gpu(c, None))
    return out


def gen_autotune(c: Ctx) -> list[Lever]:
    # torch.compile's inductor benchmarking its kernels (vllm.cuda_oom.inductor_autotune): eager mode compiles
    # nothing, so nothing is autotuned; a kernel library's autotuner (FlashInfer, FP4) runs in eager mode too
    inductor = c.n.get("compile_autotune_tried_bytes") is not None
    out: list[Lever] = []
    _and_free_others(c, out, 5, need=c.n.get("tried_to_allocate_bytes"))
    if inductor and not c.setting("enforce_eager"):
        out.append(lever("enforce_eager", {"enforce_eager": True}, {"outcome": "unknown"},
                         "no torch.compile and no CUDA graphs: slower decoding (often 10-30 %)",
                         "torch.compile's inductor ran out while benchmarking the kernels it generated; eager mode "
                         "compiles nothing", explicit_override="enforce_eager" in c.explicit, score=10))
    out.append(batch_halved(c, "smaller prefill chunks", "the autotuner's largest M is max_num_batched_tokens",
                            20 if inductor else 10))
    p = pinned_arena_lever(c, ACTIVATION_GRAPH_RESERVE, "leave room for the autotuner's workspaces", 30)
    if p:
        out.append(p)
    out.append(larger_gpu(c, None))
    return out


def gen_runtime_oom(c: Ctx) -> list[Lever]:
    out: list[Lever] = []
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
    known = "" if c.setting("max_num_batched_tokens") is not None else " (vLLM's usual default: the log does not say)"
    step = int(c.n.get("oom_step_scheduled_tokens") or 0)
    target = min(mnbt // 2, max(2048, step // 2 // 2048 * 2048)) if step >= 4096 else None
    if target is not None and target < mnbt // 2:
        # the failing step was smaller than the budget: halving the budget would build the same step again (a real
        # served walk: the dump's 30,001 tokens, budget 65,536 → 32,768 failed, 16,384 passed)
        sizing = [f"the failing step scheduled {step:,} tokens (vLLM's dump), under the budget of {mnbt:,}{known}: a "
                  f"budget of {target:,} (half of that step, in steps of 2,048) halves its activation peak"]
    else:
        sizing = [f"a step processes at most max_num_batched_tokens = {mnbt:,} tokens{known}; half of it halves the "
                  "activation peak of the largest prefill step"]
    halved = batch_halved(c, "smaller prefill chunks", "the largest batch's activations ran out", 10, shape + sizing)
    if target is not None:
        halved["change"] = {"max_num_batched_tokens": target}
    top_default = largest_default_batched_tokens()
    if "max_num_batched_tokens" in c.explicit and mnbt > top_default:
        # the user raised the step's token budget beyond anything vLLM picks by itself: the first suspect
        halved["cause"] = True
        halved["arithmetic"].insert(0, f"max_num_batched_tokens {mnbt:,} was set explicitly, above vLLM's largest "
                                       f"default ({top_default:,})")
    out.append(halved)
    out.append(lever("max_num_seqs", {"max_num_seqs": max(8, int(c.setting("max_num_seqs", 256) or 256) // 2)},
                     {"outcome": "unknown"}, "fewer concurrent sequences", "smaller decode batches", score=20))
    if not c.pinned:
        out.append(util_step_down(c, "room outside the budget", 30))
    _and_free_others(c, out, 40, need=c.n.get("tried_to_allocate_bytes"))
    out.append(lever("expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {"outcome": "unknown"},
                     "none measurable in most workloads", "allocator tuning, only after sizing causes", applies_as="env", score=60))
    return dedupe(out)


def gen_preemption(c: Ctx) -> list[Lever]:
    out: list[Lever] = []
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


def gen_rejection(c: Ctx) -> list[Lever]:
    mml = c.n.get("max_model_len") or c.setting("max_model_len")
    asked = (c.n.get("rejected_prompt_tokens") or 0) + (c.n.get("rejected_output_tokens") or 0)
    out: list[Lever] = []
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


def gen_config(c: Ctx) -> list[Lever]:
    out: list[Lever] = []
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

GENERATORS: dict[str, Callable[[Ctx], list[Lever]]] = {
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

