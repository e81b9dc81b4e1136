"""A measured serving profile applied at the start (``OOMDOCTOR_PROFILES``): select one for the free memory
NVML reads, then fill only the EngineArgs fields the caller left at their defaults, all or nothing."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from oomdoctor.engines.vllm.plugin.record import engine_version
from oomdoctor.engines.vllm.plugin.state import ENV_ALLOW_UNMEASURED, ENV_PROFILE, ENV_PROFILES, log, truthy
from oomdoctor.engines.vllm.plugin.values import jsonable

if TYPE_CHECKING:
    from oomdoctor.profiles import Selection


def apply_profile(ea: Any, explicit: dict[str, Any], defaults: dict[str, Any], minfo: dict[str, Any],
                  free: int | None, total: int | None) -> dict[str, Any]:
    from oomdoctor import profiles as prof  # noqa: PLC0415
    from oomdoctor.errors import BadInput  # noqa: PLC0415

    path = os.environ[ENV_PROFILES]
    try:
        ps = prof.load_profiles(path)
    except BadInput as e:
        log.warning("oomdoctor: profiles %s not used: %s", path, e)
        return {"file": path, "error": str(e), "selected": None}
    shown = dict(defaults)
    if shown.get("max_model_len") is None and (minfo.get("config") or {}).get("max_position_embeddings"):
        shown["max_model_len"] = minfo["config"]["max_position_embeddings"]   # what vLLM derives from (for the log)
    if free is None:
        log.info("oomdoctor: profiles: NVML unavailable, free memory unknown")
    sel = prof.select_profile(ps, free, total, explicit, os.environ.get(ENV_PROFILE) or None, defaults=shown,
                              engine_version=engine_version(), allow_unmeasured=truthy(os.environ.get(ENV_ALLOW_UNMEASURED)))
    _log_selection(sel)
    applied, skipped = _set_fields(ea, sel.changes)
    _log_applied(sel, applied, skipped)
    out = sel.to_dict()
    out.update(file=path, applied=jsonable(applied), skipped=skipped)
    return out


def _log_selection(sel: Selection) -> None:
    for r in sel.reasons:
        log.info("oomdoctor: profiles: %s", r)
    for c in sel.candidates:
        if not c["eligible"]:
            log.info("oomdoctor: profiles: %s not eligible: %s", c["name"], c["why_not"] or "not the widest")


def _set_fields(ea: Any, changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Set the profile's fields on the EngineArgs (all or nothing); fields this vLLM lacks are skipped."""
    applied: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    todo = [(k, v) for k, v in changes.items()]
    unknown = [k for k, _ in todo if not hasattr(ea, k)]
    for k in unknown:
        skipped[k] = f"{type(ea).__name__} has no field {k} in this vLLM"
    old: dict[str, Any] = {}
    try:
        for k, v in todo:
            if k in unknown:
                continue
            old[k] = getattr(ea, k)
            setattr(ea, k, v)
            applied[k] = v
    except Exception:  # noqa: BLE001 - all or nothing
        for k, v in old.items():
            setattr(ea, k, v)
        raise
    return applied, skipped


def _log_applied(sel: Selection, applied: dict[str, Any], skipped: dict[str, str]) -> None:
    for line, s in zip(sel.log_lines(), sel.substitutions):
        if s.field in applied:
            log.info("%s", line)
    for k, why in skipped.items():
        log.warning("oomdoctor: profile field %s not applied: %s", k, why)
    for w in sel.warnings:
        log.warning("oomdoctor: %s", w)
