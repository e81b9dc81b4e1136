"""The bracket and the bisection over it: pure functions of the recorded rungs."""
from __future__ import annotations

import math
from typing import Any

from oomdoctor.card.fingerprint import normalize_value
from oomdoctor.errors import BadInput
from oomdoctor.units import human_bytes

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_PRECISION = 64 * MiB
DEFAULT_FLOOR = 512 * MiB


def _gpu(device: dict | None, index: int) -> dict | None:
    if not device or device.get("status") != "captured":
        return None
    return next((g for g in device.get("gpus") or [] if g.get("index") == index), None)


def pinned_arena(card: dict, workload: dict | None = None) -> tuple[int | None, str]:
    """The pinned KV arena: the exact ``kv_cache_memory_bytes`` setting, else the figure the engine printed."""
    args = (workload or card.get("workload") or {}).get("engine_args") or {}
    if args.get("kv_cache_memory_bytes") not in (None, ""):
        v = normalize_value(args["kv_cache_memory_bytes"])
        if isinstance(v, (int, float)) and v > 0:
            return int(v), "workload.engine_args.kv_cache_memory_bytes"
    n = card.get("numbers") or {}
    if n.get("kv_cache_memory_bytes"):
        return int(n["kv_cache_memory_bytes"]), "the engine's 'reserved ... for KV Cache' line (card numbers)"
    return None, ""


def derive_bracket(card: dict, workload: dict, low: int | None, high: int | None, floor: int, precision: int,
                   device: dict | None, gpu_index: int) -> tuple[int, str, int, str]:
    if high is not None:
        h, hsrc = int(high), "--high"
    else:
        g = _gpu(device, gpu_index)
        if g is None:
            why = (device or {}).get("reason") or "no device state"
            raise BadInput(f"--high is needed: the device's free memory cannot be read ({why})")
        h, hsrc = int(g["free_bytes"]), f"the free memory of GPU {gpu_index} now (NVML)"
    if low is not None:
        lo, lsrc = int(low), "--low"
    else:
        w = (card.get("numbers") or {}).get("weights_bytes")
        arena, asrc = pinned_arena(card, workload)
        if w:
            lo = int(w) + (arena or 0)
            lsrc = "weights" + (" + pinned KV arena" if arena else "") + " (card numbers): it cannot start with less"
            lo = (lo // precision) * precision
        else:
            lo, lsrc = int(floor), "--floor"
    if precision <= 0:
        raise BadInput(f"--precision must be positive (got {precision})")
    if lo < 0 or h <= 0:
        raise BadInput("the bracket needs positive sizes")
    if lo >= h:
        raise BadInput(f"low ({human_bytes(lo)}, {lsrc}) must be below high ({human_bytes(h)}, {hsrc})")
    return lo, lsrc, h, hsrc


def bracket_state(rungs: list[dict], low: int, high: int) -> dict:
    """What the recorded rungs (and the assumed ends) say: the open interval and whether each side is measured."""
    passes = sorted(r["target_free_bytes"] for r in rungs if r["outcome"] == "pass")
    fails = sorted(r["target_free_bytes"] for r in rungs if r["outcome"] in ("fail", "timeout"))
    hi_k = passes[0] if passes else None
    below = [f for f in fails if hi_k is None or f < hi_k]
    lo_k = below[-1] if below else None
    inconsistent = [f for f in fails if hi_k is not None and f >= hi_k]
    st: dict[str, Any] = {"inconsistent_fails": inconsistent}
    if hi_k is not None and hi_k <= high:
        st.update(hi=hi_k, hi_known=True)
    else:
        st.update(hi=high, hi_known=False)
    if lo_k is not None and lo_k >= low:
        st.update(lo=lo_k, lo_known=True)
    else:
        st.update(lo=low, lo_known=False)
    if st["lo"] >= st["hi"]:
        if st["lo_known"] and not st["hi_known"]:          # a failure at or above the assumed high end
            if hi_k is not None:
                st.update(hi=hi_k, hi_known=True)
            else:
                st["status"] = "no_start"
        elif st["hi_known"] and not st["lo_known"]:        # a pass at or below the assumed low end
            if lo_k is not None:
                st.update(lo=lo_k, lo_known=True)
            else:
                st["status"] = "starts_at_low"
    return st


def next_rung(rungs: list[dict], low: int, high: int, precision: int) -> tuple[str, int | None, str]:
    """("run", target, role) or ("done", None, status). The grid is anchored at ``low``."""
    st = bracket_state(rungs, low, high)
    if st.get("status"):
        return "done", None, st["status"]
    lo, hi = st["lo"], st["hi"]
    measured = {r["target_free_bytes"] for r in rungs if r["outcome"] in ("pass", "fail", "timeout")}
    if hi - lo <= precision:
        if not st["hi_known"] and high not in measured:
            return "run", high, "verify_high"
        if not st["lo_known"] and low not in measured:
            return "run", low, "verify_low"
        return "done", None, "measured"
    i_lo = math.floor((lo - low) / precision)
    i_hi = math.ceil((hi - low) / precision)
    t = low + ((i_lo + i_hi) // 2) * precision
    if not lo < t < hi:                                      # cannot happen when hi - lo > precision; be safe
        t = lo + (hi - lo) // 2
    return "run", int(t), "bisect"


def expected_starts(low: int, high: int, precision: int) -> int:
    """Starts of a bisection whose threshold lies strictly inside the bracket (no end to verify)."""
    m = math.ceil((high - low) / precision)
    return max(0, math.ceil(math.log2(m))) if m > 1 else 0
