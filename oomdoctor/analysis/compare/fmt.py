"""Formatting values and deltas, and deciding whether a ledger difference is beyond the engine's rounding."""
from __future__ import annotations

from typing import Any

from oomdoctor.analysis.compare.tables import MiB
from oomdoctor.units import human_bytes


def fmt_value(v: Any, kind: str = "") -> str:
    if v is None:
        return "—"
    if kind == "bytes" and isinstance(v, (int, float)):
        return f"{human_bytes(v)} ({int(v):,} B)"
    if kind == "tokens" and isinstance(v, (int, float)):
        return f"{int(v):,}"
    if kind == "ratio":
        return f"{v}x"
    if kind == "seconds":
        return f"{v} s"
    return str(v)


def fmt_delta(a: Any, b: Any, kind: str) -> str:
    if a is None and b is None:
        return ""
    if a is None or b is None:
        return "only in " + ("failing" if a is None else "proven")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool):
        return "changed" if a != b else ""
    d = b - a
    if d == 0:
        return ""
    pct = f" ({d / a * 100:+.1f}%)" if a else ""
    if kind == "bytes":
        return f"{'+' if d > 0 else '-'}{human_bytes(abs(d))} ({d:+,} B){pct}"
    if kind == "tokens":
        return f"{d:+,}{pct}"
    return f"{d:+.4g}{pct}"


def _significant(a: Any, b: Any, kind: str) -> bool:
    if a is None or b is None:
        return a is not b
    if not isinstance(a, (int, float)) or isinstance(a, bool):
        return a != b
    d = abs(b - a)
    if kind == "bytes":
        return d > max(32 * MiB, 0.005 * max(abs(a), abs(b)))      # the engine prints GiB with 2 decimals
    if kind == "tokens":
        return d > 0
    if kind == "ratio":
        return d > 0.011
    if kind == "seconds":
        return d > 0.1 * max(a, b)
    return d != 0


