"""THE serving-profiles file reader: the gate, the vLLM plugin and the ladder read profile files here.

Format ``oomdoctor.serving-profiles/v1`` (docs/plugin.md, docs/gate.md), YAML or JSON (JSON when the name ends
in ``.json``)::

    schema: oomdoctor.serving-profiles/v1      # optional; another schema is refused
    profiles:                                  # or `serving_profiles` (inside a model's config.json)
      NAME: {window: N, settings: {...}, requires_free_bytes: B, measured: {...}, declared_free_bytes: B,
             note: ..., description: ...}      # or a list of profiles, each with `name`

One decided behaviour, the same for every reader:

- ``serving_profiles`` is accepted beside ``profiles``: a model owner may ship the profiles inside the
  model's ``config.json``, and the gate already fingerprinted such files; the plugin must then apply
  exactly them instead of refusing the file.
- an unknown field in a profile is refused (``PROFILE_FIELDS`` lists the known ones): an engine option
  written beside ``settings`` instead of under it (``max_num_seqs: 8``) would otherwise be silently
  ignored by the plugin and the ladder while the owner believes it is applied, so the measured
  requirement would belong to another config than the one that starts. Top-level fields stay open
  (a model's config.json carries many).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oomdoctor.card import fingerprint as fpmod
from oomdoctor.card.fingerprint import memory_settings
from oomdoctor.errors import BadInput
from oomdoctor.profiles.receipts import measured
from oomdoctor.profiles.files import load_doc, read_doc, size  # noqa: F401  (load_doc: the reader's API, gate/configs.py)

SCHEMA_ID = "oomdoctor.serving-profiles/v1"
PROFILE_FIELDS = ("name", "window", "max_model_len", "settings", "requires_free_bytes", "measured",
                  "declared_free_bytes", "note", "description")
PROFILE_KEYS = ("profiles", "serving_profiles")


@dataclass(frozen=True)
class ProfileEntry:
    """One profile as written, checked for shape: its name, its mapping, and where it sits (for messages)."""

    name: str
    raw: dict[str, Any]
    where: str                      # "profiles.NAME" or "profiles[i]"


def _raw_items(d: dict, origin: str) -> tuple[str, list[tuple[str, Any, str]]]:
    key = next((k for k in PROFILE_KEYS if k in d), None)
    if key is None:
        raise BadInput(f"{origin}: no 'profiles' (or 'serving_profiles') mapping or list; see docs/gate.md")
    profiles = d[key]
    if isinstance(profiles, dict):
        return key, [(str(name), p, f"{key}.{name}") for name, p in profiles.items()]
    if not isinstance(profiles, list):
        raise BadInput(f"{origin}: {key}: must be a mapping (name → profile) or a list of profiles")
    items = []
    for i, p in enumerate(profiles):
        w = f"{key}[{i}]"
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not p["name"].strip():
            raise BadInput(f"{origin}: {w}.name: required field is missing ({w} has no name; each profile in a "
                           f"list needs one)")
        items.append((p["name"].strip(), p, w))
    return key, items


def _check_fields(p: dict, origin: str, w: str) -> None:
    for k in p:
        if k not in PROFILE_FIELDS:
            hint = " (engine options go under `settings`)" if fpmod.canonical_key(str(k)) else ""
            raise BadInput(f"{origin}: {w}.{k}: unknown field{hint}; allowed: {', '.join(PROFILE_FIELDS)}")


def profile_entries(doc: Any, origin: str) -> list[ProfileEntry]:
    """A profiles document → its profiles, in file order; BadInput for any shape problem."""
    if not isinstance(doc, dict):
        raise BadInput(f"{origin}: a serving-profiles file is an object with 'profiles' (see docs/gate.md)")
    if doc.get("schema", SCHEMA_ID) != SCHEMA_ID:
        raise BadInput(f"{origin}: schema {doc.get('schema')!r}; this oomdoctor reads {SCHEMA_ID!r}")
    key, items = _raw_items(doc, origin)
    if not items:
        raise BadInput(f"{origin}: {key}: no profiles")
    out: list[ProfileEntry] = []
    seen: set[str] = set()
    for name, p, w in items:
        if not isinstance(p, dict):
            raise BadInput(f"{origin}: {w}: must be a mapping with settings")
        if name in seen:
            raise BadInput(f"{origin}: {w}.name: profile {name!r} is defined twice")
        seen.add(name)
        _check_fields(p, origin, w)
        out.append(ProfileEntry(name, p, w))
    return out


def settings_of(e: ProfileEntry, origin: str) -> dict[str, Any]:
    """The profile's ``settings`` mapping (engine options, vLLM's snake_case names)."""
    settings = e.raw.get("settings") or {}
    if not isinstance(settings, dict):
        raise BadInput(f"{origin}: {e.where}.settings: must be a mapping of engine options")
    for k in settings:
        if not isinstance(k, str) or not k.isidentifier():
            raise BadInput(f"{origin}: {e.where}.settings.{k}: not an engine argument name (use vLLM's snake_case)")
    return dict(settings)


# ----------------------------------------------------------------------------- the plugin's records
DEFAULT_SAFETY_FACTOR = 0.98
WINDOW_FIELD = "max_model_len"
UTIL_FIELD = "gpu_memory_utilization"
PIN_FIELD = "kv_cache_memory_bytes"
BYTES_SETTINGS = {"kv_cache_memory_bytes"}
INT_SETTINGS = {"max_num_seqs", "max_num_batched_tokens", "block_size", "max_cudagraph_capture_size",
                "tensor_parallel_size", "pipeline_parallel_size", "num_gpu_blocks_override"}
FLOAT_SETTINGS = {"gpu_memory_utilization", "cpu_offload_gb"}


@dataclass
class Profile:
    name: str
    window: int | None
    settings: dict[str, Any]
    requires_free_bytes: int | None
    measured: dict[str, Any] | None          # normalised ladder result (see receipts.measured)
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


def _number(key: str, v: Any, where: str, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise BadInput(f"{where}.{key}: {v!r} is not {what}")
    return float(v)


def _setting(key: str, v: Any, where: str) -> Any:
    if key in BYTES_SETTINGS:
        return size(v, f"{where}.{key}")
    if key in INT_SETTINGS:
        f = _number(key, v, where, "an integer")
        return v if isinstance(v, int) else int(f)
    if key in FLOAT_SETTINGS:
        f = _number(key, v, where, "a number")
        if key == UTIL_FIELD and not 0 < f <= 1:
            raise BadInput(f"{where}.{key}: {f} is not in (0, 1]")
        return f
    return v


def _window(p: dict, settings: dict[str, Any], pw: str) -> int | None:
    window = p.get("window", p.get("max_model_len"))
    if window is not None:
        window = int(window)
    if WINDOW_FIELD in settings:
        if window is not None and int(settings[WINDOW_FIELD]) != window:
            raise BadInput(f"{pw}: settings.max_model_len {settings[WINDOW_FIELD]} differs from window {window}")
        window = int(settings.pop(WINDOW_FIELD))
    return window


def _settings_mismatch(m: dict, settings: dict[str, Any], window: int | None) -> str | None:
    """Why the receipt's ladder measured another config than this profile's, or None."""
    mine = memory_settings({**settings, **({WINDOW_FIELD: window} if window is not None else {})})
    theirs = m["measured_settings"]
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if not diff:
        return None
    return ("the receipt's ladder measured another config (" + ", ".join(
        f"{k}: profile {mine.get(k, '(default)')!r} vs ladder {theirs.get(k, '(default)')!r}" for k in diff)
        + "): its threshold says nothing about this profile")


def _profile(e: ProfileEntry, where: str, base: Path | None) -> Profile:
    p, pw = e.raw, f"{where}: profile {e.name}"
    settings = {k: _setting(k, v, pw) for k, v in settings_of(e, where).items()}
    window = _window(p, settings, pw)
    req = size(p["requires_free_bytes"], f"{pw}.requires_free_bytes") if p.get("requires_free_bytes") is not None else None
    decl = size(p["declared_free_bytes"], f"{pw}.declared_free_bytes") if p.get("declared_free_bytes") is not None else None
    m, status, reason = measured(e.name, p.get("measured"), req, base, pw)
    if status == "measured" and m and m.get("measured_settings") is not None:
        why = _settings_mismatch(m, settings, window)
        if why:
            status, reason = "invalid", why
    if status == "measured" and req is None and m is not None:
        req = m["pass_free_bytes"]        # the receipt's pass point is the requirement
    if status != "measured" and req is not None and decl is None:
        decl = req                        # an unbacked requirement is only a declaration
    return Profile(name=e.name, window=window, settings=settings,
                   requires_free_bytes=req if status == "measured" else None, measured=m,
                   declared_free_bytes=decl, status=status, status_reason=reason, note=str(p.get("note", "")))


def parse_profiles(doc: Any, path: str | None = None) -> ProfileSet:
    """A profiles document → the plugin's :class:`ProfileSet` (each profile measured, unmeasured or invalid)."""
    where = path or "profiles"
    base = Path(path).resolve().parent if path else None
    entries = profile_entries(doc, where)
    safety = float(doc.get("safety_factor", DEFAULT_SAFETY_FACTOR))
    if not 0 < safety <= 1:
        raise BadInput(f"{where}: safety_factor {safety} is not in (0, 1]")
    out = [_profile(e, where, base) for e in entries]
    return ProfileSet(path=path, profiles=out, safety_factor=safety, model=doc.get("model"))


def load_profiles(path: str | os.PathLike) -> ProfileSet:
    p = Path(path)
    return parse_profiles(read_doc(p), str(p))
