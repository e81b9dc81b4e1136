"""Stage 5 — the incident card: a versioned YAML document, validated against the JSON Schema
shipped in ``oomdoctor/card/schemas/incident-card.schema.json``.

Cards are written atomically (temp file in the same folder, fsync, rename), secrets are
redacted before anything is written, and appending an attempt re-reads the card from disk
under a lock so that earlier attempts are never lost.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, cast

import yaml

from oomdoctor import __version__, safeyaml
from oomdoctor.card.locking import atomic_write, locked, refuse_special
from oomdoctor.card.records import Attempt, CardDict, Lever, Workload
from oomdoctor.errors import BadInput, CardError
from oomdoctor.redact import redact_obj

__all__ = ["Card", "SCHEMA_ID", "append_attempt", "atomic_write", "check", "check_replace", "dumps", "load", "refuse_special",
           "load_dict", "locked", "new_id", "now_iso", "save", "schema", "validate"]

SCHEMA_ID = "oomdoctor.incident/v1"
SCHEMA_PATH = Path(__file__).with_name("schemas") / "incident-card.schema.json"


@dataclass
class Card:
    id: str
    created_at: str
    source: dict
    engine: dict
    classification: dict
    evidence: list
    numbers: dict
    device: dict
    workload: Workload
    levers: list[Lever]
    summary: str = ""
    phase_reached: str | None = None
    numbers_source: dict = field(default_factory=dict)
    numbers_printed: dict = field(default_factory=dict)     # byte numbers the log rounded, as it printed them
    numbers_by_process: dict = field(default_factory=dict)
    log_device: list = field(default_factory=list)
    runtime: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    schema: str = SCHEMA_ID
    oomdoctor_version: str = __version__
    _extra: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("_extra", None)
        order = ["schema", "oomdoctor_version", "id", "created_at", "summary", "source", "engine", "classification",
                 "phase_reached", "evidence", "numbers", "numbers_source", "numbers_printed", "numbers_by_process",
                 "device", "log_device", "workload", "levers", "runtime", "notes", "attempts"]
        out = {k: d[k] for k in order if k in d}
        for k in ("numbers_printed", "numbers_by_process", "runtime"):
            if not out.get(k):
                out.pop(k, None)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Card":
        known = set(cls.__dataclass_fields__) - {"_extra"}
        extra = {k: v for k, v in d.items() if k not in known}
        c = cls(**{k: v for k, v in d.items() if k in known})
        c._extra = extra        # ladder results, snapshot, ... kept as written
        return c


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_id(klass: str, sha256: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{klass}-{(sha256 or '0' * 8)[:8]}"


# ----------------------------------------------------------------------------- schema validation
@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(v: Any, t: str) -> bool:
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, _TYPES[t])


def _validate_scalar(obj: Any, sch: dict, path: str, where: str) -> list[str] | None:
    """anyOf, const, enum and type: the first failure ends the check (a list), None when they all pass."""
    if "anyOf" in sch and all(validate(obj, s, path) for s in sch["anyOf"]):
        return [f"{where}: {obj!r} matches none of the allowed forms"]
    if "const" in sch and obj != sch["const"]:
        return [f"{where}: must be {sch['const']!r}, found {obj!r}"]
    if "enum" in sch and obj not in sch["enum"]:
        return [f"{where}: {obj!r} is not one of {', '.join(map(str, sch['enum']))}"]
    t = sch.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_type_ok(obj, x) for x in types):
            return [f"{where}: must be {' or '.join(types)}, found {type(obj).__name__} {obj!r}"[:300]]
    return None


def _validate_object(obj: dict, sch: dict, path: str) -> list[str]:
    errs = [f"{path + '.' if path else ''}{r}: required field is missing" for r in sch.get("required", []) if r not in obj]
    props = sch.get("properties", {})
    extra = sch.get("additionalProperties")
    for k, v in obj.items():
        sub = f"{path}.{k}" if path else str(k)
        if k in props:
            errs += validate(v, props[k], sub)
        elif isinstance(extra, dict):
            errs += validate(v, extra, sub)
        elif extra is False:
            errs.append(f"{sub}: unknown field")
    return errs


def _validate_bounds(obj: Any, sch: dict, where: str) -> list[str]:
    errs = []
    if "minimum" in sch and isinstance(obj, (int, float)) and not isinstance(obj, bool) and obj < sch["minimum"]:
        errs.append(f"{where}: {obj} is below the minimum {sch['minimum']}")
    if "pattern" in sch and isinstance(obj, str) and not re.search(sch["pattern"], obj):
        errs.append(f"{where}: {obj!r} does not match {sch['pattern']}")
    return errs


def validate(obj: Any, sch: dict, path: str = "") -> list[str]:
    """A small JSON-Schema subset (type, enum, const, required, properties, additionalProperties,
    items, minimum, pattern, anyOf) — enough for the card schema, no extra dependency."""
    where = path or "(card)"
    first = _validate_scalar(obj, sch, path, where)
    if first is not None:
        return first
    errs: list[str] = []
    if isinstance(obj, dict):
        errs += _validate_object(obj, sch, path)
    if isinstance(obj, list) and "items" in sch:
        for i, v in enumerate(obj):
            errs += validate(v, sch["items"], f"{path}[{i}]")
    return errs + _validate_bounds(obj, sch, where)


def check(d: Any, origin: str) -> None:
    if not isinstance(d, dict):
        raise CardError(f"{origin}: not an incident card (a YAML mapping is expected)")
    if d.get("schema") != SCHEMA_ID:
        raise CardError(f"{origin}: field 'schema' is {d.get('schema')!r}; this oomdoctor {__version__} reads "
                        f"'{SCHEMA_ID}' cards only")
    errs = validate(d, schema())
    if errs:
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise CardError(f"{origin}: invalid field {errs[0]}{more}")


# ----------------------------------------------------------------------------- files
class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


def dumps(d: dict) -> str:
    return yaml.dump(d, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


def _attempt_keys(d: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    return [(a.get("n"), a.get("at")) for a in d.get("attempts") or [] if isinstance(a, dict)]


def check_replace(path: Path, new: Mapping[str, Any]) -> None:
    """``path`` may be replaced by the card ``new``: it is missing, or a card whose attempts ``new`` all keeps.
    A FIFO, device node, symlink or folder, a file that is not a card, or a card whose attempts would be
    dropped is refused (CardError naming what is there)."""
    refuse_special(path)
    if not path.exists():
        return
    try:
        old = load_dict(path)
    except CardError:
        raise CardError(f"{path}: exists and is not an incident card; not overwritten (give another --out)")
    kept = set(_attempt_keys(new))
    lost = [n for n, at in _attempt_keys(old) if (n, at) not in kept]
    if lost:
        raise CardError(f"{path}: holds {len(_attempt_keys(old))} attempt(s) (n={', '.join(map(str, lost))}) that the new "
                        f"card would drop; not overwritten (give another --out)")


def save(card: Card | CardDict | dict, path: str | os.PathLike) -> Path:
    """Validate, redact and write a card atomically, under the folder lock; see :func:`check_replace`."""
    d = card.to_dict() if isinstance(card, Card) else dict(card)
    if isinstance(card, Card):
        d.update(card._extra)
    d = redact_obj(d)
    check(d, str(path))
    with locked(path):
        check_replace(Path(path), d)
        atomic_write(Path(path), dumps(d))
    return Path(path)


def load_dict(path: str | os.PathLike) -> CardDict:
    from oomdoctor.diagnose.read import read_capped

    p = Path(path)
    refuse_special_read(p)
    if not p.exists():
        raise CardError(f"{p}: no such card")
    try:
        text = read_capped(p, safeyaml.MAX_BYTES, "card").decode("utf-8")
    except BadInput as e:               # a FIFO, a device, a directory, a file too large to be a card
        raise CardError(str(e))
    except UnicodeDecodeError as e:
        raise CardError(f"{p}: cannot be read ({e})")
    try:
        d = safeyaml.load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        why = f": {e.problem}" if isinstance(e, safeyaml.YAMLLimit) else ""
        raise CardError(f"{p}: malformed YAML{f' at line {mark.line + 1}' if mark else ''}{why}{_log_hint(p, text)}")
    if not (isinstance(d, dict) and "schema" in d):
        raise CardError(f"{p}: not an incident card{_log_hint(p, text) or ' (a YAML mapping with schema: is expected)'}")
    check(d, str(p))
    return cast(CardDict, d)


def _log_hint(p: Path, text: str) -> str:
    """When the file given as a card is an engine's log (a user passing the log to retest): what to run first."""
    head = text[:4096]
    if "schema:" in head or not any(w in head for w in ("INFO", "ERROR", "WARNING", "Traceback", "llama_", "] ")):
        return ""
    return f"; it reads as a log: run `oomdoctor diagnose {p}` first, then retest the card it writes"


def refuse_special_read(p: Path) -> None:
    """A card is read from a regular file only (a FIFO would hang the reader, a device node never ends)."""
    try:
        st = os.stat(p)
    except OSError:
        return                      # missing: the reader says "no such card"
    if not stat.S_ISREG(st.st_mode):
        raise CardError(f"{p}: not a regular file; a card is read from a regular file only")


def load(path: str | os.PathLike) -> Card:
    return Card.from_dict(load_dict(path))


def append_attempt(path: str | os.PathLike, attempt: Attempt, updates: dict[str, Any] | None = None) -> Attempt:
    """Re-read the card, append ``attempt`` (numbered after the last one), apply top-level
    ``updates`` (e.g. new levers), validate and write atomically. Earlier attempts stay as they were."""
    with locked(path):
        d = load_dict(path)
        attempts = list(d.get("attempts") or [])
        attempt = cast(Attempt, dict(attempt))
        attempt["n"] = (attempts[-1]["n"] + 1) if attempts else 1
        attempts.append(attempt)
        out: dict[str, Any] = {**d, "attempts": attempts, **(updates or {})}
        out = redact_obj(out)
        check(out, str(path))
        atomic_write(Path(path), dumps(out))
        return attempt
