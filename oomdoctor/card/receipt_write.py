"""Writing a receipt: only for a run — its log is copied beside the receipt (``<receipt>.runs/attempt-N.log``),
hashed, and for a passing attempt verified as the gate will (:mod:`oomdoctor.card.verify`) before anything is
written. See :mod:`oomdoctor.card.receipt` for the format."""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from oomdoctor import __version__
from oomdoctor.card import store as cardmod
from oomdoctor.card.fingerprint import fingerprint as _fingerprint
from oomdoctor.card.receipt import EFFECTIVE_CONFIG_SCHEMA, SCHEMA_ID, _load_yaml, receipt_schema
from oomdoctor.errors import BadInput
from oomdoctor.redact import redact_obj


def receipt_filename(effective_config: dict) -> str:
    return _fingerprint(effective_config).split(":", 1)[1][:16] + ".yaml"


def _check_effective_config(ec: Any) -> None:
    if not isinstance(ec, dict):
        raise BadInput("receipt: effective_config must be the dict made by oomdoctor.card.fingerprint.effective_config")
    errs = cardmod.validate(ec, EFFECTIVE_CONFIG_SCHEMA, "effective_config")
    if errs:
        raise BadInput(f"receipt: invalid field {errs[0]}")


def _prepare_attempt(ec: dict, fp: str, attempt: dict) -> dict:
    if not isinstance(attempt, dict):
        raise BadInput("receipt: the attempt must be a dict")
    a = copy.deepcopy(attempt)
    if a.get("config_fingerprint") not in (None, fp):
        raise BadInput(f"receipt: the attempt's config_fingerprint {a['config_fingerprint']} is not the effective "
                       f"config's {fp}")
    if a.get("effective_config") not in (None, ec):
        raise BadInput("receipt: the attempt's effective_config is not the receipt's")
    eng = a.get("engine")
    if not isinstance(eng, dict) or not eng.get("name"):
        raise BadInput("receipt: attempt.engine: required field is missing ({name, version, mode})")
    if eng.get("name") != ec["engine"]:
        raise BadInput(f"receipt: attempt.engine.name {eng.get('name')!r} is not the config's engine {ec['engine']!r}")
    if "version" in eng and eng.get("version") != ec["engine_version"]:
        raise BadInput(f"receipt: attempt.engine.version {eng.get('version')!r} is not the version in the effective "
                       f"config {ec['engine_version']!r}")
    eng.setdefault("version", ec["engine_version"])
    if not a.get("target_device"):
        raise BadInput("receipt: attempt.target_device: required field is missing (the device it ran on, or the "
                       "named card it emulated)")
    a.setdefault("at", cardmod.now_iso())
    a.setdefault("lever", "none")
    a.setdefault("change", {})
    a.setdefault("oomdoctor_version", __version__)
    a["config_fingerprint"] = fp
    a["effective_config"] = copy.deepcopy(ec)
    return a


def _copy_log(log: Path, p: Path, n: int) -> tuple[str, str]:
    """Copy the run's log to ``<receipt stem>.runs/attempt-N.log`` (a new file); (its path relative to the receipt, sha256)."""
    from oomdoctor.card.locking import refuse_linked_dir, refuse_special
    from oomdoctor.diagnose.read import file_sha256

    refuse_special(log, "log")
    if not log.is_file():
        raise BadInput(f"receipt: the run's log {log} does not exist; a receipt is written for a run, with its log")
    dest_dir = p.parent / (p.stem + ".runs")
    refuse_linked_dir(dest_dir)
    dest = dest_dir / f"attempt-{n}.log"
    k = 1
    while os.path.lexists(dest):
        k += 1
        dest = dest_dir / f"attempt-{n}.{k}.log"
    dest_dir.mkdir(parents=True, exist_ok=True)
    if log.resolve() != dest.resolve():
        from oomdoctor.redact import redact_text

        # the copy travels with the receipt (committed, read by CI): redacted line by line, numbers untouched
        with open(log, encoding="utf-8", errors="surrogateescape", newline="") as src, \
                open(dest, "x", encoding="utf-8", errors="surrogateescape", newline="") as dst:
            for line in src:
                dst.write(redact_text(line))
    return dest.relative_to(p.parent).as_posix(), file_sha256(dest)


def _existing(p: Path, fp: str) -> tuple[dict, list]:
    try:
        d = _load_yaml(p)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise BadInput(f"{p}: an existing file that is not a readable receipt ({type(e).__name__}); not overwritten")
    if not isinstance(d, dict) or d.get("schema") != SCHEMA_ID:
        raise BadInput(f"{p}: exists and is not an {SCHEMA_ID} receipt; not overwritten")
    if d.get("config_fingerprint") != fp:
        raise BadInput(f"{p}: is the receipt of {d.get('config_fingerprint')}, not of {fp}; one receipt "
                       f"holds one effective config")
    return d, list(d.get("attempts") or [])


def write_receipt(path: str | os.PathLike, effective_config: dict, attempt: dict, *, log: str | os.PathLike,
                  source: dict | None = None) -> Path:
    """Append ``attempt`` — the run whose log is ``log`` — to the receipt for ``effective_config`` at ``path``.

    ``path`` is a file, or an existing folder (or one ending in '/'), in which case the file is
    ``<folder>/<first 16 hex of the fingerprint>.yaml``. The attempt needs ``outcome`` and ``engine``
    ({name, version, mode}) and ``target_device``; ``n``, ``at``, ``lever`` ('none'), ``change`` ({}),
    ``config_fingerprint``, ``effective_config``, ``log_path`` and ``log_sha256`` are filled in. The log is copied
    beside the receipt; an attempt that says ``pass`` is verified from it (served, no failure, the fingerprint of
    its own config lines) exactly as the gate will, and refused when it is not. Raises BadInput when the attempt
    does not belong to the effective config, the log does not back it, or the file at ``path`` is something else.
    """
    from oomdoctor.card.locking import locked
    from oomdoctor.card.verify import verify_log

    _check_effective_config(effective_config)
    ec = copy.deepcopy(effective_config)
    fp = _fingerprint(ec)
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", os.sep)):
        p = p / receipt_filename(ec)
    a = _prepare_attempt(ec, fp, attempt)
    log = Path(log)
    if a.get("outcome") == "pass":
        from oomdoctor.diagnose.read import file_sha256

        problems = verify_log(log, file_sha256(log) if log.is_file() else None, ec)
        if problems:
            raise BadInput(f"receipt: not written: the run's log does not show a pass of this config: {problems[0]}")
    with locked(p):
        if p.exists() or os.path.lexists(p):
            cardmod.refuse_special(p, "receipt")
            d, attempts = _existing(p, fp)
        else:
            d = {"schema": SCHEMA_ID, "oomdoctor_version": __version__, "created_at": cardmod.now_iso(),
                 "config_fingerprint": fp, "effective_config": ec}
            if source:
                d["source"] = dict(source)
            attempts = []
        ns: list[int] = [x["n"] for x in attempts if isinstance(x, dict) and isinstance(x.get("n"), int)]
        n = (max(ns) + 1) if ns else 1
        a["log_path"], a["log_sha256"] = _copy_log(log, p, n)
        a = {"n": n, **{k: v for k, v in a.items() if k != "n"}}
        attempts.append(a)
        d["attempts"] = attempts
        d = redact_obj(d)
        if d["effective_config"] != ec or _fingerprint(d["effective_config"]) != fp:
            raise BadInput("receipt: the effective config holds what looks like a secret; it cannot be written "
                           "without changing its fingerprint")
        errs = cardmod.validate(d, receipt_schema())
        if errs:
            raise BadInput(f"{p}: invalid field {errs[0]}")
        cardmod.atomic_write(p, cardmod.dumps(d), "receipt")
    return p
