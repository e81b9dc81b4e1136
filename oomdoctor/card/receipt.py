"""Retest receipts: the proof, kept in the repository, that one effective serving config started and
served on a given device.

A receipt is a small YAML document (schema ``oomdoctor.receipt/v1``) for exactly ONE effective config
(see :mod:`oomdoctor.fingerprint`). It holds that config, its fingerprint, and a list of attempts shaped
like the incident card's attempts (same fields, same JSON Schema), each with ``outcome``,
``engine`` {name, version, mode}, ``config_fingerprint``, ``effective_config`` and ``target_device``.

API (used by ``oomdoctor record`` to write and by ``oomdoctor gate`` to read):

``write_receipt(path, effective_config, attempt) -> Path``
    Append ``attempt`` to the receipt at ``path`` (a file, or a folder: then ``<folder>/<fingerprint>.yaml``),
    creating it if needed. Atomic (temp file, fsync, rename) and under a lock; the attempt is checked
    against the effective config (fingerprint, engine name and version) before anything is written.
``find_passing(repo_root, fingerprint, targets) -> list[FoundAttempt]``
    Every attempt, in receipts and in incident cards, that counts for ``fingerprint``: outcome 'pass',
    engine mode 'real', a target device among ``targets``, and a recorded effective config (when there is
    one) that really hashes to that fingerprint. Newest first.
``scan(repo_root) -> (list[FoundAttempt], notes)``
    Every attempt found, counting or not (the gate uses it to explain a failure).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from oomdoctor import safeyaml
from oomdoctor.card import store as cardmod
from oomdoctor.errors import BadInput
from oomdoctor.card.fingerprint import fingerprint as _fingerprint

SCHEMA_ID = "oomdoctor.receipt/v1"
CARD_SCHEMA_ID = cardmod.SCHEMA_ID
DEFAULT_DIRS = ("receipts", "incidents")
FINGERPRINT_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_EC_KEYS = ("engine", "engine_version", "model", "model_revision", "settings", "env")

EFFECTIVE_CONFIG_SCHEMA: dict = {
    "type": "object",
    "required": list(_EC_KEYS),
    "properties": {
        "engine": {"type": "string"},
        "engine_version": {"type": ["string", "null"]},
        "model": {"type": ["string", "null"]},
        "model_revision": {"type": ["string", "null"]},
        "settings": {"type": "object"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "conditions": {"type": "object"},
    },
    "additionalProperties": False,
}


def attempt_schema() -> dict:
    """The JSON Schema of one attempt: the incident card's, so that cards and receipts agree."""
    return cardmod.schema()["properties"]["attempts"]["items"]


def receipt_schema() -> dict:
    return {
        "type": "object",
        "required": ["schema", "oomdoctor_version", "config_fingerprint", "effective_config", "attempts"],
        "properties": {
            "schema": {"const": SCHEMA_ID},
            "oomdoctor_version": {"type": "string"},
            "created_at": {"type": "string"},
            "config_fingerprint": {"type": "string", "pattern": FINGERPRINT_RE.pattern},
            "effective_config": EFFECTIVE_CONFIG_SCHEMA,
            "source": {"type": "object"},
            "notes": {"type": "array", "items": {"type": "string"}},
            "attempts": {"type": "array", "items": attempt_schema()},
        },
        "additionalProperties": False,
    }


# ----------------------------------------------------------------------------- versions
_VER_RE = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[-_.]?(a|alpha|b|beta|c|rc|pre|preview|dev)[-_.]?(\d*))?"
                     r"(?:[-_.]?post(\d+))?(?:\+.*)?$", re.I)
_PRE_RANK = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "pre": 3, "preview": 3}


def _version_key(v: str) -> tuple | None:
    m = _VER_RE.match(str(v).strip())
    if not m:
        return None
    rel = [int(x) for x in m.group(1).split(".")]
    while len(rel) > 1 and rel[-1] == 0:
        rel.pop()
    pre = (_PRE_RANK[m.group(2).lower()], int(m.group(3) or 0)) if m.group(2) else (9, 0)
    return (tuple(rel), pre, int(m.group(4) or 0))


def compare_versions(a: str | None, b: str | None) -> int | None:
    """-1, 0, 1 as ``a`` is older than, the same as, newer than ``b`` (PEP 440-ish: '0.11.0rc1' < '0.11.0'
    < '0.11.0.post1'; a local '+cu128' part is ignored). None when either cannot be read as a version."""
    if a is None or b is None:
        return None
    ka, kb = _version_key(a), _version_key(b)
    if ka is None or kb is None:
        return None
    return (ka > kb) - (ka < kb)


# ----------------------------------------------------------------------------- reading
@dataclass
class FoundAttempt:
    """One attempt found in a receipt or an incident card."""

    path: Path                      # the file it was read from
    kind: str                       # 'receipt' | 'card'
    attempt: dict
    fingerprint: str                # the attempt's config_fingerprint
    effective_config: dict | None   # the attempt's (or its receipt's) effective config, when recorded
    consistent: bool = True         # False: the recorded effective config does not hash to the fingerprint
    problems: list[str] = field(default_factory=list)
    _verified: list[str] | None = field(default=None, repr=False, compare=False)

    def unverified(self) -> list[str]:
        """Why the run's own log does not back this attempt ([]: it does); read once, on demand."""
        if self._verified is None:
            from oomdoctor.card.verify import verify_attempt

            self._verified = verify_attempt(self.attempt, self.path, self.effective_config or {}) \
                if self.effective_config is not None else ["it records no effective config"]
        return self._verified

    @property
    def n(self) -> int | None:
        return self.attempt.get("n")

    @property
    def outcome(self) -> str | None:
        return self.attempt.get("outcome")

    @property
    def mode(self) -> str | None:
        return (self.attempt.get("engine") or {}).get("mode")

    @property
    def engine_version(self) -> str | None:
        if self.effective_config is not None:
            return self.effective_config.get("engine_version")
        return (self.attempt.get("engine") or {}).get("version")

    @property
    def target_device(self) -> str | None:
        return self.attempt.get("target_device")

    @property
    def at(self) -> str:
        return str(self.attempt.get("at") or "")

    def on_target(self, targets: Iterable[str] | None) -> bool:
        if targets is None:
            return True
        td = (self.target_device or "").strip().lower()
        return bool(td) and td in {str(t).strip().lower() for t in targets}

    def claims_pass(self, targets: Iterable[str] | None = None) -> bool:
        """Says it passed: pass, real engine, on one of ``targets``, consistent (its log not read yet)."""
        return (self.consistent and not self.problems and self.outcome == "pass" and self.mode == "real"
                and self.on_target(targets))

    def is_passing(self, targets: Iterable[str] | None = None) -> bool:
        """Counts as a receipt for its fingerprint: claims a pass AND its own log shows it (:mod:`.verify`)."""
        return self.claims_pass(targets) and not self.unverified()

    def where(self, root: Path | None = None) -> str:
        p = self.path
        if root is not None:
            try:
                p = self.path.resolve().relative_to(Path(root).resolve())
            except ValueError:
                pass
        return f"{p.as_posix()} attempt {self.n}" if self.n is not None else p.as_posix()

    def describe(self, root: Path | None = None) -> str:
        eng = self.attempt.get("engine") or {}
        bits = [f"{eng.get('name', '?')} {self.engine_version or '?'}", self.mode or "mode ?",
                self.target_device or "no target device", f"outcome {self.outcome}"]
        if self.at:
            bits.append(self.at)
        return f"{self.where(root)} ({', '.join(bits)})"


def _load_yaml(p: Path) -> Any:
    from oomdoctor.diagnose.read import read_capped
    return safeyaml.load(read_capped(p, safeyaml.MAX_BYTES, "receipt").decode("utf-8"))  # FIFOs, devices: BadInput


def _attempt_problems(a: Any, where: str) -> list[str]:
    if not isinstance(a, dict):
        return [f"{where}: not a mapping"]
    return cardmod.validate(a, attempt_schema(), where)


def _from_card(p: Path, d: dict, notes: list[str]) -> list[FoundAttempt]:
    out: list[FoundAttempt] = []
    atts = d.get("attempts")
    if not isinstance(atts, list):
        notes.append(f"{p}: incident card without an attempts list; ignored")
        return out
    for i, a in enumerate(atts):
        errs = _attempt_problems(a, f"attempts[{i}]")
        if errs:
            notes.append(f"{p}: attempt ignored, invalid field {errs[0]}")
            continue
        ec = a.get("effective_config") if isinstance(a.get("effective_config"), dict) else None
        fp = a["config_fingerprint"]
        consistent = ec is None or _fingerprint(ec) == fp
        if not consistent:
            notes.append(f"{p}: attempt {a.get('n')} ignored: its effective_config does not hash to its "
                         f"config_fingerprint (edited by hand?)")
        out.append(FoundAttempt(p, "card", a, fp, ec, consistent))
    return out


def _from_receipt(p: Path, d: dict, notes: list[str]) -> list[FoundAttempt]:
    errs = cardmod.validate(d, receipt_schema())
    if errs:
        notes.append(f"{p}: receipt ignored, invalid field {errs[0]}")
        return []
    ec = d["effective_config"]
    fp = d["config_fingerprint"]
    if _fingerprint(ec) != fp:
        notes.append(f"{p}: receipt ignored: its effective_config does not hash to its config_fingerprint "
                     f"(edited by hand?)")
        return []
    out = []
    for a in d["attempts"]:
        aec = a.get("effective_config") if isinstance(a.get("effective_config"), dict) else ec
        consistent = a["config_fingerprint"] == fp and _fingerprint(aec) == fp
        if not consistent:
            notes.append(f"{p}: attempt {a.get('n')} ignored: its fingerprint or effective_config is not the "
                         f"receipt's")
        out.append(FoundAttempt(p, "receipt", a, a["config_fingerprint"], aec, consistent))
    return out


def read_file(p: str | os.PathLike, notes: list[str] | None = None) -> list[FoundAttempt]:
    """The attempts of one receipt or incident card; any other YAML file gives none (and no note)."""
    notes = notes if notes is not None else []
    p = Path(p)
    try:
        d = _load_yaml(p)
    except (OSError, UnicodeDecodeError, BadInput) as e:
        notes.append(f"{p}: cannot be read ({e}); ignored")
        return []
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        notes.append(f"{p}: malformed YAML{f' at line {mark.line + 1}' if mark else ''}; ignored")
        return []
    if not isinstance(d, dict):
        return []
    if d.get("schema") == CARD_SCHEMA_ID:
        return _from_card(p, d, notes)
    if d.get("schema") == SCHEMA_ID:
        return _from_receipt(p, d, notes)
    return []


def scan(repo_root: str | os.PathLike, dirs: Iterable[str | os.PathLike] | None = None) -> tuple[list[FoundAttempt], list[str]]:
    """Every attempt in every ``*.yaml`` / ``*.yml`` under ``dirs`` (relative to ``repo_root``; default
    ``receipts/`` and ``incidents/``), with notes on the files and attempts that were ignored and why."""
    root = Path(repo_root)
    notes: list[str] = []
    found: list[FoundAttempt] = []
    seen: set[Path] = set()
    for d in (dirs if dirs is not None else DEFAULT_DIRS):
        base = Path(d) if Path(d).is_absolute() else root / d
        if not base.is_dir():
            continue
        files = sorted(f for pat in ("*.yaml", "*.yml") for f in base.rglob(pat))
        for f in files:
            if any(part.startswith(".") for part in f.relative_to(base).parts) or not f.is_file():
                continue
            rf = f.resolve()
            if rf in seen:
                continue
            seen.add(rf)
            found += read_file(f, notes)
    return found, notes


def find_passing(repo_root: str | os.PathLike, fingerprint: str, targets: Iterable[str] | None,
                 dirs: Iterable[str | os.PathLike] | None = None) -> list[FoundAttempt]:
    """The attempts that prove ``fingerprint`` on one of ``targets`` (None: any device), newest first."""
    targets = list(targets) if targets is not None else None
    found, _ = scan(repo_root, dirs)
    hits = [f for f in found if f.fingerprint == fingerprint and f.is_passing(targets)]
    return sorted(hits, key=lambda f: f.at, reverse=True)


def read_receipt(path: str | os.PathLike) -> dict:
    """Load and check one receipt (BadInput naming the field when it is not a valid receipt)."""
    p = Path(path)
    try:
        d = _load_yaml(p)
    except FileNotFoundError:
        raise BadInput(f"{p}: no such receipt")
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise BadInput(f"{p}: cannot be read as YAML ({type(e).__name__})")
    if not isinstance(d, dict) or d.get("schema") != SCHEMA_ID:
        raise BadInput(f"{p}: field 'schema' must be {SCHEMA_ID!r}")
    errs = cardmod.validate(d, receipt_schema())
    if errs:
        raise BadInput(f"{p}: invalid field {errs[0]}")
    if _fingerprint(d["effective_config"]) != d["config_fingerprint"]:
        raise BadInput(f"{p}: effective_config does not hash to config_fingerprint")
    return d


from oomdoctor.card.receipt_write import receipt_filename, write_receipt  # noqa: E402  (uses this module's schema)
