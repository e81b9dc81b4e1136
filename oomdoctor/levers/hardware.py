"""Levers the recorded device cannot apply: more GPUs than it has (tensor / pipeline / data parallel), or another GPU
(``larger_gpu``). They are never run by a retest; they are listed last, marked ``needs_hardware`` with the arithmetic.
"""
from __future__ import annotations

from typing import Any, Mapping

from oomdoctor.card.records import Lever, Workload
from oomdoctor.units import human_bytes

PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
ABBR = {"tensor_parallel_size": "TP", "pipeline_parallel_size": "PP", "data_parallel_size": "DP"}


def device_gpus(device: Mapping[str, Any] | None) -> tuple[int, str] | None:
    """(GPU count, what they are) of a captured NVML state; None when it was not captured."""
    if not device or device.get("status") != "captured" or not device.get("gpus"):
        return None
    gpus = device["gpus"]
    names = sorted({str(g.get("name") or "GPU") for g in gpus})
    return len(gpus), ", ".join(names)


def gpus_needed(lever: Mapping[str, Any], wl: Workload | Mapping[str, Any]) -> int:
    """GPUs the workload needs with this lever: the product of its parallel sizes after the change."""
    n = 1
    for v in _sizes_after(lever, wl).values():
        n *= max(1, v)
    return n


def hardware_need(lever: Mapping[str, Any], wl: Workload | Mapping[str, Any], device: Mapping[str, Any] | None) -> str | None:
    """Why this device cannot apply the lever (one line with the arithmetic); None when it can."""
    if lever.get("id") == "larger_gpu":
        need = (lever.get("change") or {}).get("gpu_memory_at_least_bytes")
        have = device_gpus(device)
        total = max((g.get("total_bytes") or 0 for g in (device or {}).get("gpus") or []), default=0)
        return ("another GPU" + (f" with at least {human_bytes(need)}" if need else "")
                + (f"; the recorded device is {have[1]} with {human_bytes(total)}" if have and total else ""))
    if not set(lever.get("change") or {}) & set(PARALLEL):
        return None
    need_n = gpus_needed(lever, wl)
    have = device_gpus(device)
    if have is None or need_n <= have[0]:
        return None
    terms = " x ".join(f"{ABBR[k]} {v}" for k, v in _sizes_after(lever, wl).items())
    return f"{need_n} GPUs ({terms}); the recorded device has {have[0]} ({have[1]})"


def _sizes_after(lever: Mapping[str, Any], wl: Workload | Mapping[str, Any]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for src in (wl.get("parallel") or {}, wl.get("resolved") or {}, wl.get("engine_args") or {}, lever.get("change") or {}):
        for k in PARALLEL:
            if isinstance(src.get(k), int):
                sizes[k] = int(src[k])
    return sizes or {"tensor_parallel_size": 1}


def mark(levers: list[Lever], wl: Workload | Mapping[str, Any], device: Mapping[str, Any] | None) -> list[Lever]:
    """Mark the levers this device cannot apply (``needs_hardware``, ``applies_as: hardware``, the arithmetic)."""
    for lv in levers:
        why = hardware_need(lv, wl, device)
        if why is None:
            continue
        lv["needs_hardware"] = why
        lv["applies_as"] = "hardware"
        ar = list(lv.get("arithmetic") or [])
        line = f"needs other hardware: {why}"
        if line not in ar:
            lv["arithmetic"] = ar + [line]
    return levers
