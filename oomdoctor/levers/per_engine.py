"""Levers of an engine other than vLLM, as data: ``engines/<engine>/levers.yaml`` says, per failure class, which
contract levers apply, which of the engine's own settings each one moves, in which direction and by how much,
and what it costs. This module only computes the values from the diagnosis's numbers and writes the flag.

vLLM keeps its own generators (:mod:`oomdoctor.levers.by_class`, driven by its memory model); every other engine
gets the levers its table lists, so an SGLang log is answered in SGLang's flags (``--mem-fraction-static``), never
in vLLM's.
"""
from __future__ import annotations

import math
from typing import Any


from oomdoctor.card.records import Lever
from oomdoctor.levers.context import Ctx
from oomdoctor.levers.flags import flag_for, lever_table
from oomdoctor.levers.record import lever
from oomdoctor.levers.settings import free_others, larger_gpu

#: the keys a lever's entry in levers.yaml may carry (a class's entry may override any of them)
SPEC_KEYS = frozenset({"setting", "current", "default", "default_basis", "set", "add", "scale", "round", "min", "max",
                       "at_least", "cost", "basis", "applies_as", "generic"})


def engine_table(engine: str) -> dict[str, Any]:
    """``engines/<engine>/levers.yaml`` as read ({} when the engine has none)."""
    return lever_table(engine)


def has_own_levers(engine: str | None) -> bool:
    """True when the engine's levers.yaml lists levers per class (every engine but vLLM)."""
    return bool(engine) and bool(engine_table(str(engine)).get("by_class"))


def _spec(table: dict[str, Any], entry: Any) -> tuple[str, dict[str, Any]]:
    """A class's entry (a lever id, or a mapping with ``id`` and overrides) → (id, the merged spec)."""
    if isinstance(entry, str):
        lid, over = entry, {}
    else:
        lid, over = str(entry["id"]), {k: v for k, v in entry.items() if k != "id"}
    base = dict((table.get("levers") or {}).get(lid) or {})
    base.update(over)
    unknown = set(base) - SPEC_KEYS
    if unknown:
        raise ValueError(f"engines/{table.get('engine')}/levers.yaml: lever {lid}: unknown key(s) {sorted(unknown)}")
    return lid, base


def _current(spec: dict[str, Any], c: Ctx) -> tuple[Any, str]:
    """The setting's value now and where it comes from: the log's numbers, the workload, else the engine default."""
    for key in spec.get("current") or []:
        v = c.setting(key)
        if v is not None:
            return v, f"the log's {key}"
    if spec.get("default") is not None:
        return spec["default"], str(spec.get("default_basis") or "the engine's default")
    return None, ""


def _floor(spec: dict[str, Any], c: Ctx) -> tuple[float | None, str]:
    """``at_least``: a number of the diagnosis, or the sum of several (a request's prompt + output tokens)."""
    names = spec.get("at_least")
    if not names:
        return None, ""
    names = [names] if isinstance(names, str) else list(names)
    if any(c.n.get(k) is None for k in names):
        return None, ""
    return float(sum(float(c.n[k]) for k in names)), " + ".join(f"{k} {c.n[k]}" for k in names)


def _rounded(v: float, spec: dict[str, Any]) -> float | int:
    r = spec.get("round", "int")
    if r == "int":
        return int(v)
    return round(v, int(r))


def value_of(spec: dict[str, Any], c: Ctx) -> tuple[Any, str | None]:
    """The new value of the lever's setting and the arithmetic behind it (None: it cannot be computed)."""
    if "set" in spec:
        return spec["set"], None
    cur, src = _current(spec, c)
    try:
        cur_f = float(cur)
    except (TypeError, ValueError):
        return None, None
    if spec.get("scale") is not None:
        new = cur_f * float(spec["scale"])
        op = f"x {spec['scale']}"
    else:
        new = cur_f + float(spec.get("add", 0))
        op = f"{float(spec.get('add', 0)):+g}"
    floor, what = _floor(spec, c)
    if floor is not None and new < floor:
        new = math.ceil(floor * 100) / 100
        op += f", at least what the log printed: {what}"
    if spec.get("min") is not None:
        new = max(new, float(spec["min"]))
    if spec.get("max") is not None:
        new = min(new, float(spec["max"]))
    out = _rounded(new, spec)
    if out == _rounded(cur_f, spec):
        return None, None
    return out, f"{spec['setting']}: {cur} ({src}) {op} → {out}"


def engine_lever(engine: str, lid: str, spec: dict[str, Any], c: Ctx, launcher: str | None, score: float) -> Lever | None:
    """One lever in the engine's words; None when its value cannot be computed from what is known."""
    setting = spec.get("setting")
    if not setting:
        return None
    value, arith = value_of(spec, c)
    if value is None:
        return None
    change = {str(setting): value}
    lv = lever(lid, change, {"outcome": "unknown"}, str(spec.get("cost", "")).strip(), str(spec.get("basis", "")).strip(),
               applies_as=str(spec.get("applies_as", "flag")), explicit_override=str(setting) in c.explicit,
               arithmetic=[arith] if arith else [], score=score)
    flag = flag_for(engine, str(setting), value, launcher)
    if flag:
        lv["flag"] = flag
    return lv


def propose_engine(engine: str, c: Ctx, launcher: str | None = None) -> list[Lever]:
    """The levers of ``engine``'s table for the diagnosis's class, in the table's order (the first is tried first);
    the engine-neutral ones (stop the process that holds the memory, a larger GPU) come from the shared builders."""
    table = engine_table(engine)
    out: list[Lever] = []
    for i, entry in enumerate((table.get("by_class") or {}).get(c.klass) or []):
        lid, spec = _spec(table, entry)
        score = 10.0 * (i + 1)
        if lid == "free_other_processes":
            f = free_others(c, score) or (generic_free(c, spec, score) if spec.get("generic") else None)
            if f:
                out.append(f)
        elif lid == "larger_gpu":
            out.append(larger_gpu(c, None))
        else:
            lv = engine_lever(engine, lid, spec, c, launcher or table.get("launcher"), score)
            if lv:
                out.append(lv)
    return out


def generic_free(c: Ctx, spec: dict[str, Any], score: float) -> Lever:
    """Free the GPU when the log says another process holds memory but not which one."""
    return lever("free_other_processes", {"stop_pids": []}, {"outcome": "unknown"},
                 str(spec.get("cost") or "find and stop what holds the GPU's memory (nvidia-smi; a leftover engine is common)"),
                 str(spec.get("basis") or "the engine's check says memory is taken on this GPU; the log does not name the holder"),
                 applies_as="process", score=score)
