"""Model-owned serving profiles, measured instead of estimated.

A model owner ships a few serving profiles (a context window plus the engine settings that go with
it); oomdoctor's vLLM plugin (:mod:`oomdoctor.plugin`) picks the widest one whose MEASURED start-up
requirement fits the free memory of the GPU(s) the engine will use, and fills only the settings the
caller left at vLLM's defaults. Incident 1 (../shared/INCIDENTS.md) is why every rule below exists:
declared requirements were under the measured thresholds by about 1.5 GB, a utilization clamp did
nothing against a pinned KV arena, a profile without a utilization of its own failed vLLM's start-up
check, and a utilization below the clamp's safety factor made the budget stop tracking free memory.

No ``oomdoctor/gate.py`` serving-profiles format existed when this was written, so the format is
defined here (``oomdoctor.serving-profiles/v1``); docs/plugin.md documents it. A file is YAML or
JSON::

    schema: oomdoctor.serving-profiles/v1
    model: /models/my-model            # optional, informative
    safety_factor: 0.98                # the clamp keeps free x (1 - 0.98) back (default 0.98)
    profiles:
      long_393k:                       # a mapping name -> profile, or a list of profiles with `name`
        window: 393216                 # -> max_model_len
        settings:                      # EngineArgs fields (vLLM's names)
          gpu_memory_utilization: 0.95
          kv_cache_memory_bytes: 5200000000   # pins the KV arena (sizes accept 5.2e9, 4.84GiB, ...)
        requires_free_bytes: 25571033088      # NVML free before the start: the ladder's pass point
        measured:                      # the ladder result that requires_free_bytes comes from
          receipt: ../incidents/20261129T150000Z-ladder-long_393k.yaml  # card/receipt with a `ladder`
          pass_free_bytes: 25571033088 # smallest free memory that started (inline copy of the receipt)
          fail_free_bytes: 25371803648 # largest free memory that failed
          engine_version: 0.25.1
          device: rtx5090
        declared_free_bytes: 24053735802      # the owner's estimate: never used unless allowed

A profile is **measured** when it has a ``measured`` block with a ``receipt`` reference and a pass
point (inline, or read from the referenced card/receipt's ``ladder`` section when that file is here),
and ``requires_free_bytes`` is not below that pass point. Everything else is **unmeasured** and is
never selected unless ``allow_unmeasured`` (``OOMDOCTOR_PROFILE_ALLOW_UNMEASURED=1``); a figure from
arithmetic is a declaration, not a measurement.

:func:`select_profile` is pure: it takes the profiles, NVML free/total of the engine's GPU(s), the
caller's explicit arguments and an optional forced name, and returns a :class:`Selection` that says
what to set, why, and what to warn about. It changes nothing itself.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from oomdoctor.errors import BadInput
from oomdoctor.card.fingerprint import memory_settings

SCHEMA_ID = "oomdoctor.serving-profiles/v1"
DEFAULT_SAFETY_FACTOR = 0.98
WINDOW_FIELD = "max_model_len"
UTIL_FIELD = "gpu_memory_utilization"
PIN_FIELD = "kv_cache_memory_bytes"
BYTES_SETTINGS = {"kv_cache_memory_bytes"}
INT_SETTINGS = {"max_num_seqs", "max_num_batched_tokens", "block_size", "max_cudagraph_capture_size",
                "tensor_parallel_size", "pipeline_parallel_size", "num_gpu_blocks_override"}
FLOAT_SETTINGS = {"gpu_memory_utilization", "cpu_offload_gb"}
# keys of a ladder result (in a card's / receipt's top-level `ladder` section, or inline in `measured`)
LADDER_PASS_KEYS = ("pass_free_bytes", "starts_at_free_bytes", "threshold_bytes", "threshold_free_bytes",
                    "min_pass_free_bytes")
LADDER_FAIL_KEYS = ("fail_free_bytes", "fails_at_free_bytes", "max_fail_free_bytes")
LADDER_META_KEYS = ("precision_bytes", "engine", "engine_version", "device", "config_fingerprint")


# ----------------------------------------------------------------------------- the file
@dataclass
class Profile:
    name: str
    window: int | None
    settings: dict[str, Any]
    requires_free_bytes: int | None
    measured: dict[str, Any] | None          # normalised ladder result (see _measured)
    declared_free_bytes: int | None
    status: str                              # measured | unmeasured | invalid
    status_reason: str
    note: str = ""

    @property
    def pinned_bytes(self) -> int | None:
        v = self.settings.get(PIN_FIELD)
        return int(v) if v else None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ProfileSet:
    path: str | None
    profiles: list[Profile]
    safety_factor: float = DEFAULT_SAFETY_FACTOR
    model: str | None = None
    notes: list[str] = field(default_factory=list)


def _size(v: Any, what: str) -> int:
    from oomdoctor.units import parse_size

    if isinstance(v, bool):
        raise BadInput(f"{what}: {v!r} is not a size in bytes")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if v != int(v):
            raise BadInput(f"{what}: {v!r} is not a whole number of bytes")
        return int(v)
    return parse_size(str(v))


def _setting(key: str, v: Any, where: str) -> Any:
    if not isinstance(key, str) or not key.isidentifier():
        raise BadInput(f"{where}: setting name {key!r} is not an engine argument name (use vLLM's snake_case)")
    if key in BYTES_SETTINGS:
        return _size(v, f"{where}.{key}")
    if key in INT_SETTINGS:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise BadInput(f"{where}.{key}: {v!r} is not an integer")
        return int(float(v)) if not isinstance(v, int) else v
    if key in FLOAT_SETTINGS:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise BadInput(f"{where}.{key}: {v!r} is not a number")
        f = float(v)
        if key == UTIL_FIELD and not 0 < f <= 1:
            raise BadInput(f"{where}.{key}: {f} is not in (0, 1]")
        return f
    return v


def _read_doc(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror or e})")
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except ValueError as e:
            raise BadInput(f"{path}: malformed JSON ({e})")
    import yaml  # noqa: PLC0415 - only when a YAML file is read

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise BadInput(f"{path}: malformed YAML{f' at line {mark.line + 1}' if mark else ''}")


def read_ladder(path: Path, profile_name: str | None = None) -> dict:
    """The ``ladder`` section of a card or receipt (YAML/JSON): {pass_free_bytes, fail_free_bytes, ...}.

    Accepts a top-level ``ladder`` mapping, or ``ladder.<profile name>`` when one file holds several."""
    doc = _read_doc(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("ladder"), dict):
        raise BadInput(f"{path}: no `ladder` section (a card or receipt with a ladder result is expected)")
    lad = doc["ladder"]
    if profile_name and isinstance(lad.get(profile_name), dict):
        lad = lad[profile_name]
    out = _ladder_fields(lad, str(path))
    if out.get("pass_free_bytes") is None:
        raise BadInput(f"{path}: the ladder section has no pass point ({' / '.join(LADDER_PASS_KEYS)})")
    eng = doc.get("engine") if isinstance(doc.get("engine"), dict) else {}
    out.setdefault("engine_version", eng.get("version"))
    ec = lad.get("effective_config")
    if isinstance(ec, dict) and isinstance(ec.get("settings"), dict):
        out["measured_settings"] = dict(ec["settings"])     # what the ladder really ran (fingerprint's names)
    return out


def _ladder_fields(d: dict, where: str) -> dict:
    out: dict[str, Any] = {}
    for keys, name in ((LADDER_PASS_KEYS, "pass_free_bytes"), (LADDER_FAIL_KEYS, "fail_free_bytes")):
        for k in keys:
            if d.get(k) is not None:
                out[name] = _size(d[k], f"{where}.{k}")
                break
    for k in LADDER_META_KEYS:
        if d.get(k) is not None:
            out[k] = _size(d[k], f"{where}.{k}") if k.endswith("_bytes") else str(d[k])
    return out


def _measured(name: str, raw: Any, requires: int | None, base: Path | None, where: str) -> tuple[dict | None, str, str]:
    """→ (normalised measurement or None, status, reason)."""
    if raw is None:
        if requires is not None:
            return None, "unmeasured", ("requires_free_bytes has no ladder receipt (`measured`): a declared figure "
                                        "is not a measurement")
        return None, "unmeasured", "no requires_free_bytes and no ladder receipt"
    if not isinstance(raw, dict):
        raise BadInput(f"{where}.measured: a mapping is expected")
    m = _ladder_fields(raw, f"{where}.measured")
    receipt = raw.get("receipt")
    if not receipt:
        return None, "unmeasured", "`measured` names no receipt (a card or receipt with the ladder result)"
    m["receipt"] = str(receipt)
    m["verified"] = False
    rp = Path(str(receipt))
    if not rp.is_absolute() and base is not None:
        rp = base / rp
    if rp.is_file():
        try:
            lad = read_ladder(rp, name)
        except BadInput as e:
            return None, "invalid", f"receipt {receipt}: {e}"
        if m.get("pass_free_bytes") is not None and m["pass_free_bytes"] != lad["pass_free_bytes"]:
            m["inline_pass_free_bytes"] = m["pass_free_bytes"]
        m.update({k: v for k, v in lad.items() if v is not None})
        m["verified"] = True
        m["source"] = "receipt file"
    else:
        m["source"] = "inline copy (the receipt file is not on this machine)"
    if m.get("pass_free_bytes") is None:
        return None, "unmeasured", f"receipt {receipt}: no pass point (pass_free_bytes) inline or readable here"
    if m.get("fail_free_bytes") is not None:
        if m["fail_free_bytes"] >= m["pass_free_bytes"]:
            return m, "invalid", (f"the ladder's fail point {m['fail_free_bytes']:,} B is not below its pass point "
                                  f"{m['pass_free_bytes']:,} B")
        m.setdefault("precision_bytes", m["pass_free_bytes"] - m["fail_free_bytes"])
    if requires is not None and requires < m["pass_free_bytes"]:
        return m, "invalid", (f"requires_free_bytes {requires:,} B is below the ladder's pass point "
                              f"{m['pass_free_bytes']:,} B (receipt {receipt})")
    return m, "measured", ("ladder pass point " + f"{m['pass_free_bytes']:,} B" +
                           (f", fail point {m['fail_free_bytes']:,} B" if m.get("fail_free_bytes") is not None else "") +
                           f" ({'verified against' if m['verified'] else 'inline copy of'} receipt {receipt})")


def parse_profiles(doc: Any, path: str | None = None) -> ProfileSet:
    where = path or "profiles"
    base = Path(path).resolve().parent if path else None
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: a mapping with `profiles` is expected")
    sch = doc.get("schema", SCHEMA_ID)
    if sch != SCHEMA_ID:
        raise BadInput(f"{where}: schema {sch!r}; this oomdoctor reads {SCHEMA_ID!r}")
    raw = doc.get("profiles")
    items: list[tuple[str, Any]] = []
    if isinstance(raw, dict):
        items = [(str(k), v) for k, v in raw.items()]
    elif isinstance(raw, list):
        for i, p in enumerate(raw):
            if not isinstance(p, dict) or not p.get("name"):
                raise BadInput(f"{where}: profiles[{i}] has no name")
            items.append((str(p["name"]), p))
    else:
        raise BadInput(f"{where}: `profiles` must be a mapping (name -> profile) or a list")
    if not items:
        raise BadInput(f"{where}: no profiles")
    safety = float(doc.get("safety_factor", DEFAULT_SAFETY_FACTOR))
    if not 0 < safety <= 1:
        raise BadInput(f"{where}: safety_factor {safety} is not in (0, 1]")
    out: list[Profile] = []
    seen: set[str] = set()
    for name, p in items:
        pw = f"{where}: profile {name}"
        if name in seen:
            raise BadInput(f"{pw}: defined twice")
        seen.add(name)
        if not isinstance(p, dict):
            raise BadInput(f"{pw}: a mapping is expected")
        settings_raw = p.get("settings") or {}
        if not isinstance(settings_raw, dict):
            raise BadInput(f"{pw}: `settings` must be a mapping")
        settings = {k: _setting(k, v, pw) for k, v in settings_raw.items()}
        window = p.get("window", p.get("max_model_len"))
        if window is not None:
            window = int(window)
        if WINDOW_FIELD in settings:
            if window is not None and int(settings[WINDOW_FIELD]) != window:
                raise BadInput(f"{pw}: settings.max_model_len {settings[WINDOW_FIELD]} differs from window {window}")
            window = int(settings.pop(WINDOW_FIELD))
        req = p.get("requires_free_bytes")
        req = _size(req, f"{pw}.requires_free_bytes") if req is not None else None
        decl = p.get("declared_free_bytes")
        decl = _size(decl, f"{pw}.declared_free_bytes") if decl is not None else None
        m, status, reason = _measured(name, p.get("measured"), req, base, pw)
        if status == "measured" and m and m.get("measured_settings") is not None:
            mine = memory_settings({**settings, **({WINDOW_FIELD: window} if window is not None else {})})
            theirs = m["measured_settings"]
            diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            if diff:
                status, reason = "invalid", ("the receipt's ladder measured another config (" + ", ".join(
                    f"{k}: profile {mine.get(k, '(default)')!r} vs ladder {theirs.get(k, '(default)')!r}" for k in diff)
                    + "): its threshold says nothing about this profile")
        if status == "measured" and req is None:
            req = m["pass_free_bytes"]        # the receipt's pass point is the requirement
        if status != "measured" and req is not None and decl is None:
            decl = req                        # an unbacked requirement is only a declaration
        out.append(Profile(name=name, window=window, settings=settings,
                           requires_free_bytes=req if status == "measured" else None, measured=m,
                           declared_free_bytes=decl, status=status, status_reason=reason, note=str(p.get("note", ""))))
    return ProfileSet(path=path, profiles=out, safety_factor=safety, model=doc.get("model"))


def load_profiles(path: str | os.PathLike) -> ProfileSet:
    p = Path(path)
    return parse_profiles(_read_doc(p), str(p))


# ----------------------------------------------------------------------------- arithmetic
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


# ----------------------------------------------------------------------------- selection
@dataclass
class Substitution:
    field: str
    default: Any
    value: Any
    why: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Selection:
    profile: Profile | None
    free_bytes: int | None
    total_bytes: int | None
    forced: str | None
    changes: dict[str, Any] = field(default_factory=dict)          # field -> value to set (defaults only)
    substitutions: list[Substitution] = field(default_factory=list)
    kept_explicit: dict[str, Any] = field(default_factory=dict)    # profile field the caller set: theirs wins
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)
    clamp: dict[str, Any] = field(default_factory=dict)
    requirement_bytes: int | None = None
    requirement_kind: str | None = None                           # measured | declared (unmeasured)

    @property
    def selected(self) -> bool:
        return self.profile is not None

    def to_dict(self) -> dict:
        return {"selected": self.profile.name if self.profile else None, "forced": self.forced,
                "free_bytes": self.free_bytes, "total_bytes": self.total_bytes,
                "requirement_bytes": self.requirement_bytes, "requirement_kind": self.requirement_kind,
                "changes": dict(self.changes), "substitutions": [s.to_dict() for s in self.substitutions],
                "kept_explicit": dict(self.kept_explicit), "reasons": list(self.reasons),
                "warnings": list(self.warnings), "candidates": list(self.candidates), "clamp": dict(self.clamp)}

    def log_lines(self) -> list[str]:
        """One line per substitution, then the warnings; the plugin logs them at INFO / WARNING."""
        out = []
        for s in self.substitutions:
            out.append(f"oomdoctor: {s.field} default {_show(s.default)} -> {_show(s.value)} ({s.why})")
        return out


def _show(v: Any) -> str:
    return str(v)


def _eq(a: Any, b: Any) -> bool:
    try:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
            return float(a) == float(b)
    except (TypeError, ValueError):
        pass
    return a == b


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
    profiles = list(profiles)
    safety = DEFAULT_SAFETY_FACTOR if safety_factor is None else float(safety_factor)
    defaults = dict(defaults or {})
    explicit = dict(explicit or {})
    sel = Selection(profile=None, free_bytes=free_bytes, total_bytes=total_bytes, forced=forced or None)

    # engine-version check: a ladder on another vLLM is not a measurement of this one
    eff: dict[str, Profile] = {}
    for p in profiles:
        mv = (p.measured or {}).get("engine_version")
        if p.status == "measured" and engine_version and mv and str(mv) != str(engine_version):
            p = Profile(**{**p.__dict__, "status": "unmeasured", "requires_free_bytes": None,
                           "declared_free_bytes": p.declared_free_bytes or p.requires_free_bytes,
                           "status_reason": f"measured on vLLM {mv}, this is vLLM {engine_version}: re-run the ladder"})
        eff[p.name] = p

    def conflicts(p: Profile) -> list[str]:
        out = []
        if WINDOW_FIELD in explicit and explicit[WINDOW_FIELD] is not None and p.window is not None \
                and not _eq(explicit[WINDOW_FIELD], p.window):
            out.append(f"window {p.window:,} != your explicit max_model_len {explicit[WINDOW_FIELD]}")
        for k, v in p.settings.items():
            if k in explicit and not _eq(explicit[k], v):
                out.append(f"your explicit {k}={explicit[k]} contradicts the profile's {k}={v} (its requirement was "
                           "measured with the profile's value)")
        return out

    # candidates table (reported whatever happens)
    for p in eff.values():
        req, kind = _requirement(p, allow_unmeasured)
        c = conflicts(p)
        fits = None if free_bytes is None or req is None else req <= free_bytes
        why = []
        if p.status != "measured":
            why.append(f"{p.status}: {p.status_reason}")
        if c:
            why += c
        if fits is False:
            why.append(f"needs {req:,} B free, {free_bytes:,} B free")
        eligible = req is not None and not c and fits is True
        sel.candidates.append({"name": p.name, "window": p.window, "status": p.status, "requirement_bytes": req,
                               "requirement_kind": kind, "fits": fits, "eligible": eligible,
                               "why_not": "; ".join(why) if not eligible else ""})

    chosen: Profile | None = None
    if forced:
        chosen = eff.get(forced)
        if chosen is None:
            sel.reasons.append(f"OOMDOCTOR_PROFILE={forced}: no such profile (have: {', '.join(eff) or 'none'}); "
                               "nothing selected, vLLM's defaults left as they are")
            return sel
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
        for c in conflicts(chosen):
            sel.warnings.append(f"forced profile {forced}: {c}; your value is kept and the profile's requirement does "
                                "not cover this combination")
    else:
        if not eff:
            sel.reasons.append("no serving profiles")
            return sel
        if free_bytes is None:
            sel.reasons.append("NVML unavailable: free memory unknown, so no profile can be checked against it; "
                               "nothing selected, vLLM's defaults left as they are")
            return sel
        ok = [p for p in eff.values() if next(c for c in sel.candidates if c["name"] == p.name)["eligible"]]
        if not ok:
            sel.reasons.append(_none_fits(eff, sel.candidates, free_bytes, explicit))
            return sel
        chosen = max(ok, key=lambda p: (p.window or 0, _requirement(p, allow_unmeasured)[0] or 0))
        req, kind = _requirement(chosen, allow_unmeasured)
        sel.requirement_bytes, sel.requirement_kind = req, kind
        sel.reasons.append(f"profile {chosen.name}: the widest window ({chosen.window:,}) whose "
                           f"{'measured' if kind == 'measured' else 'UNMEASURED declared'} requirement "
                           f"{req:,} B fits {free_bytes:,} B free")
        if kind == "declared":
            sel.warnings.append(f"profile {chosen.name} is unmeasured ({chosen.status_reason}); selected only because "
                                "OOMDOCTOR_PROFILE_ALLOW_UNMEASURED=1")
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
    _clamp(sel, p, explicit, defaults, safety, why)


def _clamp(sel: Selection, p: Profile, explicit: dict, defaults: dict, safety: float, why: str) -> None:
    free, total = sel.free_bytes, sel.total_bytes
    pinned = p.pinned_bytes if PIN_FIELD not in explicit else (int(explicit[PIN_FIELD]) if explicit[PIN_FIELD] else None)
    default_util = defaults.get(UTIL_FIELD)
    clamp: dict[str, Any] = {"safety_factor": safety, "pinned_kv_cache_memory_bytes": pinned, "applied": False,
                             "check_only": False}
    sel.clamp = clamp
    if UTIL_FIELD in explicit:
        u = float(explicit[UTIL_FIELD])
        clamp.update(base=u, base_source="your explicit value", result=u, note="explicit: not touched")
        if free is not None and total and math.ceil(total * u) > free:
            sel.warnings.append(f"your explicit gpu_memory_utilization={u} requests ceil(total x {u}) = "
                                f"{math.ceil(total * u):,} B > {free:,} B free: vLLM's start-up check will refuse the "
                                "start; oomdoctor does not override an explicit value")
        return
    if UTIL_FIELD in p.settings:
        base, src = float(p.settings[UTIL_FIELD]), f"profile {p.name}"
    elif default_util is not None:
        base, src = float(default_util), "vLLM's default (the profile has none)"
        sel.warnings.append(f"profile {p.name} has no gpu_memory_utilization: vLLM's default {default_util} is the base "
                            "(incident 1: without the clamp, a missing utilization failed vLLM's start-up check)")
    else:
        clamp.update(note="no utilization known (no profile value, no vLLM default given): nothing to clamp")
        return
    clamp.update(base=base, base_source=src)
    if free is None or not total:
        clamp.update(result=base, note="free memory unknown: not clamped")
        _set_util(sel, base, defaults, f"{why}; not clamped: free memory unknown")
        return
    cap = floor3(free * safety / total)
    clamp["cap"] = cap
    new = min(base, cap)
    clamp["result"] = new
    arith = f"free x {safety} / total = {free:,} x {safety} / {total:,} = {cap}"
    if pinned:
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
        return
    if new < base:
        clamp["applied"] = True
        _set_util(sel, new, defaults, f"{why}; {src} {base} clamped to {arith}")
    else:
        _set_util(sel, base, defaults, f"{why}; {src} {base} is within {arith}")
    sat = saturation_range(total, base, safety)
    if sat:
        lo, hi = sat
        msg = (f"budget saturates: min(total x {base}, free x {safety}) = total x {base} = {math.ceil(total * base):,} B "
               f"for every free value from {lo:,} to {hi:,} B; it no longer tracks free memory between {lo:,} and "
               f"{hi:,} B (utilization {base} < safety factor {safety})")
        if sel.requirement_bytes is not None and lo <= sel.requirement_bytes <= hi:
            msg += (f"; the requirement {sel.requirement_bytes:,} B lies in that range: there a failing and a working "
                    "start get the same budget, so what decides them is memory outside the budget")
        clamp["saturates"] = {"from_free_bytes": lo, "to_free_bytes": hi, "budget_bytes": math.ceil(total * base)}
        sel.warnings.append(msg)


def _set_util(sel: Selection, value: float, defaults: dict, why: str) -> None:
    d = defaults.get(UTIL_FIELD)
    if d is not None and _eq(d, value):
        return
    sel.changes[UTIL_FIELD] = value
    sel.substitutions.append(Substitution(UTIL_FIELD, d, value, why))


# ----------------------------------------------------------------------------- a small CLI for dry runs
def report(ps: ProfileSet, sel: Selection) -> str:
    lines = [f"profiles: {ps.path or '(inline)'} (safety factor {ps.safety_factor})"]
    for c in sel.candidates:
        req = f"{c['requirement_bytes']:,} B ({c['requirement_kind']})" if c["requirement_bytes"] is not None else "-"
        lines.append(f"  {c['name']:<16} window {c['window'] if c['window'] is not None else '-':>9}  {c['status']:<10} "
                     f"needs {req:<34} {'ELIGIBLE' if c['eligible'] else c['why_not']}")
    lines += [f"reason: {r}" for r in sel.reasons]
    lines += sel.log_lines()
    lines += [f"warning: {w}" for w in sel.warnings]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m oomdoctor.profiles.core FILE [--free BYTES --total BYTES] [--explicit k=v ...] [--forced NAME]
    [--engine-version V] [--allow-unmeasured] [--json]`` — what the plugin would select (no engine)."""
    import argparse
    import sys

    from oomdoctor.units import parse_size

    ap = argparse.ArgumentParser(prog="python -m oomdoctor.profiles.core", description=main.__doc__)
    ap.add_argument("file")
    ap.add_argument("--free", default=None, help="free bytes of the engine's GPU (default: NVML now)")
    ap.add_argument("--total", default=None, help="total bytes of the engine's GPU (default: NVML now)")
    ap.add_argument("--explicit", action="append", default=[], metavar="K=V")
    ap.add_argument("--forced", default=None)
    ap.add_argument("--engine-version", default=None)
    ap.add_argument("--default-util", type=float, default=0.92, help="vLLM's default utilization (0.92 in 0.25.1)")
    ap.add_argument("--allow-unmeasured", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        ps = load_profiles(a.file)
        free = parse_size(a.free) if a.free else None
        total = parse_size(a.total) if a.total else None
        if free is None or total is None:
            from oomdoctor.device import nvml as device

            st = device.capture(with_processes=False)
            if st.get("status") == "captured" and st["gpus"]:
                g = st["gpus"][0]
                free = g["free_bytes"] if free is None else free
                total = g["total_bytes"] if total is None else total
        explicit: dict[str, Any] = {}
        for kv in a.explicit:
            k, _, v = kv.partition("=")
            try:
                explicit[k] = json.loads(v)
            except ValueError:
                explicit[k] = v
    except BadInput as e:
        print(f"oomdoctor: error: {e}", file=sys.stderr)
        return 2
    sel = select_profile(ps, free, total, explicit, a.forced, defaults={UTIL_FIELD: a.default_util},
                         engine_version=a.engine_version, allow_unmeasured=a.allow_unmeasured)
    if a.json:
        print(json.dumps(sel.to_dict(), indent=1, default=str))
    else:
        print(report(ps, sel))
    return 0 if sel.selected else 1


if __name__ == "__main__":
    raise SystemExit(main())
