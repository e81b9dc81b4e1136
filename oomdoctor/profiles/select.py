"""Choosing a serving profile for one engine start (pure): what to set, why, and what to warn about.

:func:`select_profile` takes the profiles, NVML free/total of the engine's GPU(s), the caller's explicit
arguments and an optional forced name, and returns a :class:`Selection`. It changes nothing itself. The
utilization clamp lives in :mod:`oomdoctor.profiles.clamp`.
"""
from __future__ import annotations

from typing import Any, Iterable

from oomdoctor.profiles.clamp import clamp_utilization
from oomdoctor.profiles.reader import DEFAULT_SAFETY_FACTOR, UTIL_FIELD, WINDOW_FIELD, Profile, ProfileSet
from oomdoctor.profiles.selection import Selection, Substitution, _eq


def _requirement(p: Profile, allow_unmeasured: bool) -> tuple[int | None, str | None]:
    if p.status == "measured" and p.requires_free_bytes is not None:
        return p.requires_free_bytes, "measured"
    if allow_unmeasured and p.status != "invalid" and p.declared_free_bytes is not None:
        return p.declared_free_bytes, "declared"
    return None, None


def _fits_phrase(sel: Selection) -> str:
    p = sel.profile
    assert p is not None
    parts = [f"profile {p.name}" + (" forced by OOMDOCTOR_PROFILE" if sel.forced else "")]
    if sel.requirement_bytes is not None:
        kind = "measured" if sel.requirement_kind == "measured" else "UNMEASURED, declared"
        parts.append(f"{kind} {sel.requirement_bytes:,} B free needed")
    else:
        parts.append("no requirement known")
    parts.append(f"{sel.free_bytes:,} B free" if sel.free_bytes is not None else "free memory unknown")
    return ", ".join(parts)


def _version_checked(profiles: list[Profile], engine_version: str | None) -> dict[str, Profile]:
    """name → profile; a ladder on another vLLM is not a measurement of this one."""
    eff: dict[str, Profile] = {}
    for p in profiles:
        mv = (p.measured or {}).get("engine_version")
        if p.status == "measured" and engine_version and mv and str(mv) != str(engine_version):
            p = Profile(**{**p.__dict__, "status": "unmeasured", "requires_free_bytes": None,
                           "declared_free_bytes": p.declared_free_bytes or p.requires_free_bytes,
                           "status_reason": f"measured on vLLM {mv}, this is vLLM {engine_version}: re-run the ladder"})
        eff[p.name] = p
    return eff


def _conflicts(p: Profile, explicit: dict[str, Any]) -> list[str]:
    out = []
    if WINDOW_FIELD in explicit and explicit[WINDOW_FIELD] is not None and p.window is not None \
            and not _eq(explicit[WINDOW_FIELD], p.window):
        out.append(f"window {p.window:,} != your explicit max_model_len {explicit[WINDOW_FIELD]}")
    for k, v in p.settings.items():
        if k in explicit and not _eq(explicit[k], v):
            out.append(f"your explicit {k}={explicit[k]} contradicts the profile's {k}={v} (its requirement was "
                       "measured with the profile's value)")
    return out


def _candidate(p: Profile, free_bytes: int | None, explicit: dict[str, Any], allow_unmeasured: bool) -> dict:
    """One row of the candidates table (reported whatever happens)."""
    req, kind = _requirement(p, allow_unmeasured)
    c = _conflicts(p, explicit)
    fits = None if free_bytes is None or req is None else req <= free_bytes
    why = []
    if p.status != "measured":
        why.append(f"{p.status}: {p.status_reason}")
    why += c
    if fits is False:
        why.append(f"needs {req:,} B free, {free_bytes:,} B free")
    eligible = req is not None and not c and fits is True
    return {"name": p.name, "window": p.window, "status": p.status, "requirement_bytes": req,
            "requirement_kind": kind, "fits": fits, "eligible": eligible,
            "why_not": "; ".join(why) if not eligible else ""}


def _choose_forced(sel: Selection, eff: dict[str, Profile], forced: str, explicit: dict[str, Any]) -> Profile | None:
    chosen = eff.get(forced)
    if chosen is None:
        sel.reasons.append(f"OOMDOCTOR_PROFILE={forced}: no such profile (have: {', '.join(eff) or 'none'}); "
                           "nothing selected, vLLM's defaults left as they are")
        return None
    free_bytes = sel.free_bytes
    req, kind = _requirement(chosen, True)
    sel.requirement_bytes, sel.requirement_kind = req, kind
    sel.reasons.append(f"profile {forced} forced by OOMDOCTOR_PROFILE")
    if chosen.status != "measured":
        sel.warnings.append(f"forced profile {forced} is {chosen.status}: {chosen.status_reason}")
    if free_bytes is None:
        sel.warnings.append("free memory unknown (NVML unavailable): the forced profile's requirement cannot be "
                            "checked and utilization is not clamped")
    elif req is not None and req > free_bytes:
        sel.warnings.append(f"forced profile {forced} needs {req:,} B free ({kind}); only {free_bytes:,} B are "
                            "free: expect the start to fail")
    for c in _conflicts(chosen, explicit):
        sel.warnings.append(f"forced profile {forced}: {c}; your value is kept and the profile's requirement does "
                            "not cover this combination")
    return chosen


def _choose_widest(sel: Selection, eff: dict[str, Profile], explicit: dict[str, Any],
                   allow_unmeasured: bool) -> Profile | None:
    free_bytes = sel.free_bytes
    if not eff:
        sel.reasons.append("no serving profiles")
        return None
    if free_bytes is None:
        sel.reasons.append("NVML unavailable: free memory unknown, so no profile can be checked against it; "
                           "nothing selected, vLLM's defaults left as they are")
        return None
    eligible = {c["name"] for c in sel.candidates if c["eligible"]}
    ok = [p for p in eff.values() if p.name in eligible]
    if not ok:
        sel.reasons.append(_none_fits(eff, sel.candidates, free_bytes, explicit))
        return None
    chosen = max(ok, key=lambda p: (p.window or 0, _requirement(p, allow_unmeasured)[0] or 0))
    req, kind = _requirement(chosen, allow_unmeasured)
    sel.requirement_bytes, sel.requirement_kind = req, kind
    sel.reasons.append(f"profile {chosen.name}: the widest window ({chosen.window:,}) whose "
                       f"{'measured' if kind == 'measured' else 'UNMEASURED declared'} requirement "
                       f"{req:,} B fits {free_bytes:,} B free")
    if kind == "declared":
        sel.warnings.append(f"profile {chosen.name} is unmeasured ({chosen.status_reason}); selected only because "
                            "OOMDOCTOR_PROFILE_ALLOW_UNMEASURED=1")
    return chosen


def select_profile(profiles: Iterable[Profile] | ProfileSet, free_bytes: int | None, total_bytes: int | None,
                   explicit: dict[str, Any], forced: str | None = None, *, defaults: dict[str, Any] | None = None,
                   engine_version: str | None = None, allow_unmeasured: bool = False,
                   safety_factor: float | None = None) -> Selection:
    """Choose a serving profile for one engine start. Pure: returns what to set and why.

    - ``free_bytes`` / ``total_bytes``: NVML free/total of the GPU(s) the engine will use, read at
      selection time (the smallest figures when it uses several); ``None`` when NVML is unavailable.
    - ``explicit``: the arguments the caller set (name -> value). They always win: a profile never
      overrides them, an explicit ``max_model_len`` admits only profiles whose window equals it, and a
      profile whose other settings contradict an explicit value is not eligible (its requirement was
      measured with its own settings).
    - ``forced``: a profile name (``OOMDOCTOR_PROFILE``): selected whatever the free memory, with
      warnings; explicit arguments still win.
    - ``defaults``: vLLM's defaults (field -> value), for the log and as the utilization a profile
      without one starts from (vLLM's own default, 0.92 in 0.25.1).
    - ``engine_version``: the running engine's version; a measurement made on another version is
      treated as unmeasured (defaults such as max_num_seqs change between versions).
    - ``allow_unmeasured``: let unmeasured profiles compete with their ``declared_free_bytes``.
    """
    if isinstance(profiles, ProfileSet):
        if safety_factor is None:
            safety_factor = profiles.safety_factor
        profiles = profiles.profiles
    safety = DEFAULT_SAFETY_FACTOR if safety_factor is None else float(safety_factor)
    defaults = dict(defaults or {})
    explicit = dict(explicit or {})
    sel = Selection(profile=None, free_bytes=free_bytes, total_bytes=total_bytes, forced=forced or None)
    eff = _version_checked(list(profiles), engine_version)
    sel.candidates += [_candidate(p, free_bytes, explicit, allow_unmeasured) for p in eff.values()]
    chosen = _choose_forced(sel, eff, forced, explicit) if forced else \
        _choose_widest(sel, eff, explicit, allow_unmeasured)
    if chosen is None:
        return sel
    sel.profile = chosen
    _fill(sel, chosen, explicit, defaults, safety)
    return sel


def _none_fits(eff: dict[str, Profile], cands: list[dict], free: int, explicit: dict) -> str:
    measured = [c for c in cands if c["requirement_bytes"] is not None and not c["why_not"].startswith(("invalid", "unmeasured"))]
    parts = [f"no profile fits {free:,} B free"]
    if WINDOW_FIELD in explicit and explicit[WINDOW_FIELD] is not None:
        parts.append(f"(only profiles with window {explicit[WINDOW_FIELD]} are eligible: your explicit max_model_len)")
    if measured:
        smallest = min(measured, key=lambda c: c["requirement_bytes"])
        parts.append(f"smallest measured requirement: {smallest['name']} needs {smallest['requirement_bytes']:,} B")
    unm = [c["name"] for c in cands if c["status"] != "measured"]
    if unm:
        parts.append(f"unmeasured/invalid (never selected): {', '.join(unm)}")
    return "; ".join(parts) + "; nothing selected, vLLM's defaults left as they are"


def _fill(sel: Selection, p: Profile, explicit: dict, defaults: dict, safety: float) -> None:
    why = _fits_phrase(sel)
    wanted: dict[str, Any] = {}
    if p.window is not None:
        wanted[WINDOW_FIELD] = p.window
    wanted.update(p.settings)
    for k, v in wanted.items():
        if k in explicit:
            sel.kept_explicit[k] = explicit[k]
            continue
        if k == UTIL_FIELD:
            continue                      # decided with the clamp below
        if k in defaults and _eq(defaults[k], v):
            continue
        sel.changes[k] = v
        sel.substitutions.append(Substitution(k, defaults.get(k), v, why))
    clamp_utilization(sel, p, explicit, defaults, safety, why)


