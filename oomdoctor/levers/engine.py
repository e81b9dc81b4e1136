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

The lever set is per engine: vLLM's generators (``by_class``) for vLLM, the table of ``engines/<engine>/levers.yaml``
(``per_engine``) for every other engine; each lever carries ``flag``, its change in the engine's own words.
"""
from __future__ import annotations

from oomdoctor.card.records import Attempt, Lever, Workload
from oomdoctor.levers.by_class import CAUSE_SETTING, GENERATORS
from oomdoctor.levers.context import Ctx
from oomdoctor.levers.flags import flags_for_change
from oomdoctor.levers.hardware import mark
from oomdoctor.levers.per_engine import has_own_levers, propose_engine
from oomdoctor.levers.rank import allowed_only, dedupe, rank

__all__ = ["CAUSE_SETTING", "GENERATORS", "Ctx", "propose"]


def propose(klass: str, numbers: dict, workload: Workload | None = None, device: dict | None = None,
            attempts: list[Attempt] | None = None, allowed: list[str] | None = None,
            engine: str | None = None, version: str | None = None) -> list[Lever]:
    """Ranked levers for a diagnosis of ``engine`` (vLLM when not known) of ``version`` (None: the log names none);
    ``[0]`` is the one to try first. Empty for non-memory classes."""
    c = Ctx(klass, numbers, workload or {}, device or {}, attempts or [], version)
    launcher = (workload or {}).get("launcher")
    if engine and engine != "vllm" and has_own_levers(engine):
        levers = [lv for lv in dedupe(propose_engine(engine, c, launcher)) if not c.tried(lv["id"], lv["change"])]
        return rank(levers, None)
    gen = GENERATORS.get(klass)
    if gen is None:
        return []
    levers = [lv for lv in dedupe(gen(c)) if not c.tried(lv["id"], lv["change"])]
    out = rank(mark(allowed_only(levers, allowed), c.wl, c.device), CAUSE_SETTING.get(klass))
    if engine in (None, "vllm"):
        for lv in out:
            words = flags_for_change("vllm", lv["change"], launcher if launcher != "unknown" else None)
            if words:
                lv["flag"] = " ".join(words)
    return out
