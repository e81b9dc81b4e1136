"""Ladder receipts behind a profile's ``measured`` block: the pass/fail points a card or receipt holds.

A profile is **measured** when it has a ``measured`` block with a ``receipt`` reference and a pass point
(inline, or read from the referenced card/receipt's ``ladder`` section when that file is here), and
``requires_free_bytes`` is not below that pass point. Everything else is unmeasured: a figure from
arithmetic is a declaration, not a measurement.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from oomdoctor.errors import BadInput
from oomdoctor.profiles.files import read_doc, size

# keys of a ladder result (in a card's / receipt's top-level `ladder` section, or inline in `measured`)
LADDER_PASS_KEYS = ("pass_free_bytes", "starts_at_free_bytes", "threshold_bytes", "threshold_free_bytes",
                    "min_pass_free_bytes")
LADDER_FAIL_KEYS = ("fail_free_bytes", "fails_at_free_bytes", "max_fail_free_bytes")
LADDER_META_KEYS = ("precision_bytes", "engine", "engine_version", "device", "config_fingerprint")


def read_ladder(path: Path, profile_name: str | None = None) -> dict:
    """The ``ladder`` section of a card or receipt (YAML/JSON): {pass_free_bytes, fail_free_bytes, ...}.

    Accepts a top-level ``ladder`` mapping, or ``ladder.<profile name>`` when one file holds several."""
    doc = read_doc(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("ladder"), dict):
        raise BadInput(f"{path}: no `ladder` section (a card or receipt with a ladder result is expected)")
    lad = doc["ladder"]
    if profile_name and isinstance(lad.get(profile_name), dict):
        lad = lad[profile_name]
    out = _ladder_fields(lad, str(path))
    if out.get("pass_free_bytes") is None:
        raise BadInput(f"{path}: the ladder section has no pass point ({' / '.join(LADDER_PASS_KEYS)})")
    eng: dict = doc["engine"] if isinstance(doc.get("engine"), dict) else {}
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
                out[name] = size(d[k], f"{where}.{k}")
                break
    for k in LADDER_META_KEYS:
        if d.get(k) is not None:
            out[k] = size(d[k], f"{where}.{k}") if k.endswith("_bytes") else str(d[k])
    return out


def measured(name: str, raw: Any, requires: int | None, base: Path | None, where: str) -> tuple[dict | None, str, str]:
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
