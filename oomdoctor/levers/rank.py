"""One ranking and one dedupe for levers: the first one is the one to try.

Both lever sources use them: the log-driven generators (``oomdoctor.levers.engine.propose``) and the memory
model's candidate search (``oomdoctor.levers.search.propose_levers``).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence, TypeVar

from oomdoctor.card.records import Lever

#: levers a rule's list of applicable levers never filters out
ALWAYS_ALLOWED = ("larger_gpu", "free_other_processes")

L = TypeVar("L", bound=Mapping[str, Any])


def lever_key(lv: Mapping[str, Any]) -> tuple[str, str]:
    """What makes two levers the same: the setting and the change."""
    return lv["id"], repr(sorted(lv["change"].items()))


def dedupe(levers: Sequence[L]) -> list[L]:
    """The first lever of each (id, change), in order."""
    seen: set[tuple[str, str]] = set()
    out = []
    for lv in levers:
        key = lever_key(lv)
        if key in seen:
            continue
        seen.add(key)
        out.append(lv)
    return out


def allowed_only(levers: list[Lever], allowed: list[str] | None) -> list[Lever]:
    if not allowed:
        return levers
    return [lv for lv in levers if lv["id"] in allowed or lv["id"] in ALWAYS_ALLOWED]


def _sort_key(lv: Lever, cause: str | None) -> tuple[bool, bool, bool, float]:
    last_resort = lv["id"] == "larger_gpu" or bool(lv.get("needs_hardware"))   # never run: listed last
    short = lv["predicted"].get("outcome") == "short"
    # an explicit value ranks later, unless that very setting is what the failure names as the cause
    penalised = bool(lv["explicit_override"] and lv["id"] != cause and not lv.get("cause"))
    return (last_resort, short, penalised, lv["_score"])


def rank(levers: list[Lever], cause: str | None) -> list[Lever]:
    """Sort (a default before an explicit value, what is predicted short and the larger GPU last), number from 1
    and drop the ranking-only keys and empty predictions/arithmetic."""
    levers = sorted(levers, key=lambda lv: _sort_key(lv, cause))
    for i, lv in enumerate(levers, 1):
        lv["rank"] = i
        lv.pop("_score", None)
        lv.pop("cause", None)
        lv["predicted"] = {k: v for k, v in lv["predicted"].items() if v is not None}
        if not lv["arithmetic"]:
            lv.pop("arithmetic")
    return levers
