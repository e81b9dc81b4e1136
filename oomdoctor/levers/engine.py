"""Stage 6 — levers: ONE setting to change, to what value, why, what it costs, what the arithmetic predicts.

Inputs are the diagnosis (class + numbers from the log), the workload (which settings the user set
explicitly, which were left at defaults), the device state and the attempts made so far. Rules that
come from real incidents (docs/incidents.md):
- never propose a gpu_memory_utilization above what is free (vLLM checks free >= ceil(total x util));
- lowering utilization is dead when kv_cache_memory_bytes pins the arena (it only moves the start-up check);
- an explicit user value is never silently overridden: a lever on a default ranks first, and a lever
  that changes an explicit value says so (``explicit_override``);
- after a failed attempt, the next proposal comes from what that attempt showed (its own log numbers),
  and a lever already tried with the same change is not proposed again.
"""
from __future__ import annotations

from oomdoctor.card.records import Attempt, Lever, Workload
from oomdoctor.levers.by_class import CAUSE_SETTING, GENERATORS
from oomdoctor.levers.context import Ctx
from oomdoctor.levers.hardware import mark
from oomdoctor.levers.rank import allowed_only, dedupe, rank

__all__ = ["CAUSE_SETTING", "GENERATORS", "Ctx", "propose"]


def propose(klass: str, numbers: dict, workload: Workload | None = None, device: dict | None = None,
            attempts: list[Attempt] | None = None, allowed: list[str] | None = None) -> list[Lever]:
    """Ranked levers for a diagnosis; ``[0]`` is the one to try first. Empty for non-memory classes."""
    gen = GENERATORS.get(klass)
    if gen is None:
        return []
    c = Ctx(klass, numbers, workload or {}, device or {}, attempts or [])
    levers = [lv for lv in dedupe(gen(c)) if not c.tried(lv["id"], lv["change"])]
    return rank(mark(allowed_only(levers, allowed), c.wl, c.device), CAUSE_SETTING.get(klass))
