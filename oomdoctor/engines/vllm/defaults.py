"""vLLM's own numbers that several stages need: one place, one value.

Per-version defaults live in ``DEFAULTS_BY_VERSION`` (a table, not ``== "0.25.1"`` comparisons scattered over
the code); ``defaults_for(version)`` picks the row of the nearest known version at or below it.
"""
from __future__ import annotations

import math

GiB = 1 << 30
MiB = 1 << 20

#: vLLM's own CUDA context on the GPU before its start-up check: a ballast leaving 40.00 GiB free shows as
#: 39.49 GiB in vLLM's "Free memory on device" line on the H200 (0.25.1), i.e. 0.51 GiB.
CUDA_CONTEXT_BYTES = round(0.51 * GiB)

#: the share of free memory a utilization lever keeps below vLLM's start-up check (free >= ceil(total x util)).
CHECK_KEEP_BACK = 0.02


def max_passing_utilization(total_bytes: int, free_bytes: int, keep_back: float = CHECK_KEEP_BACK,
                            decimals: int = 2) -> float:
    """The largest ``gpu_memory_utilization`` (rounded down to ``decimals``) whose request ``ceil(total x util)``
    stays within ``free x (1 - keep_back)``: what passes vLLM's free-memory check with that share kept back.
    0.0 when none does. The one definition that levers, plan and profiles use."""
    if total_bytes <= 0 or free_bytes <= 0:
        return 0.0
    scale = 10 ** decimals
    budget = free_bytes * (1 - keep_back)
    u = math.floor(budget / total_bytes * scale) / scale
    while u > 0 and math.ceil(total_bytes * u) > budget:
        u = round(u - 1 / scale, decimals)
    return max(0.0, min(1.0, u))
