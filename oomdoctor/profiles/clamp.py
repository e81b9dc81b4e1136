"""The utilization clamp: lower ``gpu_memory_utilization`` so that the budget tracks free memory.

The cap is the largest utilization that passes vLLM's free-memory check with ``free x (1 - safety_factor)``
kept back (:func:`oomdoctor.engines.vllm.defaults.max_passing_utilization`, 3 decimals): the profile file's
``safety_factor`` keeps its documented meaning (the clamp keeps free x (1 - safety) back).
"""
from __future__ import annotations

import math
from typing import Any

from oomdoctor.engines.vllm.defaults import max_passing_utilization
from oomdoctor.profiles.reader import DEFAULT_SAFETY_FACTOR, PIN_FIELD, UTIL_FIELD, Profile
from oomdoctor.profiles.selection import Selection, Substitution, _eq


def floor3(x: float) -> float:
    """Utilization rounded DOWN to 3 decimals (rounding up could fail vLLM's check by a few bytes)."""
    return math.floor(x * 1000 + 1e-9) / 1000.0


def budget(total: int, free: int, util: float, safety: float = DEFAULT_SAFETY_FACTOR) -> int:
    """The clamped budget ``min(total x util, free x safety)`` (what the clamp lets vLLM request)."""
    return min(math.ceil(total * util), math.floor(free * safety))


def saturation_range(total: int, util: float, safety: float = DEFAULT_SAFETY_FACTOR) -> tuple[int, int] | None:
    """Free-memory range over which ``budget`` is the constant ``total x util`` (None when util >= safety)."""
    if util >= safety:
        return None
    return math.ceil(total * util / safety), total


def cap_utilization(free: int, total: int, safety: float) -> float:
    """The clamp's cap: the largest utilization (3 decimals) whose request fits ``free x safety``."""
    return max_passing_utilization(total, free, keep_back=1 - safety, decimals=3)


def _pinned(p: Profile, explicit: dict) -> int | None:
    if PIN_FIELD not in explicit:
        return p.pinned_bytes
    return int(explicit[PIN_FIELD]) if explicit[PIN_FIELD] else None


def _explicit_util(sel: Selection, clamp: dict[str, Any], explicit: dict) -> None:
    free, total = sel.free_bytes, sel.total_bytes
    u = float(explicit[UTIL_FIELD])
    clamp.update(base=u, base_source="your explicit value", result=u, note="explicit: not touched")
    if free is not None and total and math.ceil(total * u) > free:
        sel.warnings.append(f"your explicit gpu_memory_utilization={u} requests ceil(total x {u}) = "
                            f"{math.ceil(total * u):,} B > {free:,} B free: vLLM's start-up check will refuse the "
                            "start; oomdoctor does not override an explicit value")


def _base_util(sel: Selection, p: Profile, defaults: dict) -> tuple[float, str] | None:
    """(the utilization the clamp starts from, where it comes from), or None when none is known."""
    default_util = defaults.get(UTIL_FIELD)
    if UTIL_FIELD in p.settings:
        return float(p.settings[UTIL_FIELD]), f"profile {p.name}"
    if default_util is None:
        return None
    sel.warnings.append(f"profile {p.name} has no gpu_memory_utilization: vLLM's default {default_util} is the base "
                        "(incident 1: without the clamp, a missing utilization failed vLLM's start-up check)")
    return float(default_util), "vLLM's default (the profile has none)"


def _pinned_check_only(sel: Selection, p: Profile, clamp: dict[str, Any], pinned: int, base: float, new: float,
                       defaults: dict, why: str, arith: str) -> None:
    # vLLM reserves exactly kv_cache_memory_bytes and skips profiling: utilization sizes nothing.
    # It still drives the start-up check (free >= ceil(total x util)), so lower it only for that.
    clamp["note"] = (f"kv_cache_memory_bytes={pinned:,} pins the KV arena: a utilization clamp would size nothing "
                     "(vLLM reserves exactly that and skips memory profiling); whether the start fits rests on "
                     "the measured requirement alone")
    sel.warnings.append(f"no clamp for profile {p.name}: {clamp['note']}")
    if new < base:
        clamp["check_only"] = True
        _set_util(sel, new, defaults, f"{why}; {base} lowered to {arith} ONLY so that vLLM's start-up check "
                                      f"(free >= total x util) passes: NOT a clamp, the arena is pinned at "
                                      f"{pinned:,} B")
    else:
        _set_util(sel, base, defaults, f"{why}; the arena is pinned at {pinned:,} B: utilization sizes nothing")


def _saturation_warning(sel: Selection, clamp: dict[str, Any], total: int, base: float, safety: float) -> None:
    sat = saturation_range(total, base, safety)
    if not sat:
        return
    lo, hi = sat
    msg = (f"budget saturates: min(total x {base}, free x {safety}) = total x {base} = {math.ceil(total * base):,} B "
           f"for every free value from {lo:,} to {hi:,} B; it no longer tracks free memory between {lo:,} and "
           f"{hi:,} B (utilization {base} < safety factor {safety})")
    if sel.requirement_bytes is not None and lo <= sel.requirement_bytes <= hi:
        msg += (f"; the requirement {sel.requirement_bytes:,} B lies in that range: there a failing and a working "
                "start get the same budget, so what decides them is memory outside the budget")
    clamp["saturates"] = {"from_free_bytes": lo, "to_free_bytes": hi, "budget_bytes": math.ceil(total * base)}
    sel.warnings.append(msg)


def clamp_utilization(sel: Selection, p: Profile, explicit: dict, defaults: dict, safety: float, why: str) -> None:
    """Decide ``gpu_memory_utilization`` for the selected profile: explicit wins, else min(base, cap)."""
    free, total = sel.free_bytes, sel.total_bytes
    pinned = _pinned(p, explicit)
    clamp: dict[str, Any] = {"safety_factor": safety, "pinned_kv_cache_memory_bytes": pinned, "applied": False,
                             "check_only": False}
    sel.clamp = clamp
    if UTIL_FIELD in explicit:
        _explicit_util(sel, clamp, explicit)
        return
    based = _base_util(sel, p, defaults)
    if based is None:
        clamp.update(note="no utilization known (no profile value, no vLLM default given): nothing to clamp")
        return
    base, src = based
    clamp.update(base=base, base_source=src)
    if free is None or not total:
        clamp.update(result=base, note="free memory unknown: not clamped")
        _set_util(sel, base, defaults, f"{why}; not clamped: free memory unknown")
        return
    cap = cap_utilization(free, total, safety)
    clamp["cap"] = cap
    new = min(base, cap)
    clamp["result"] = new
    arith = f"free x {safety} / total = {free:,} x {safety} / {total:,} = {cap}"
    if pinned:
        _pinned_check_only(sel, p, clamp, pinned, base, new, defaults, why, arith)
        return
    if new < base:
        clamp["applied"] = True
        _set_util(sel, new, defaults, f"{why}; {src} {base} clamped to {arith}")
    else:
        _set_util(sel, base, defaults, f"{why}; {src} {base} is within {arith}")
    _saturation_warning(sel, clamp, total, base, safety)


def _set_util(sel: Selection, value: float, defaults: dict, why: str) -> None:
    d = defaults.get(UTIL_FIELD)
    if d is not None and _eq(d, value):
        return
    sel.changes[UTIL_FIELD] = value
    sel.substitutions.append(Substitution(UTIL_FIELD, d, value, why))
