"""Numbers as engines print them → integers in bytes / tokens, and back for people."""
from __future__ import annotations

import math
import re

from oomdoctor.errors import BadInput

UNIT_BYTES = {
    "b": 1, "bytes": 1, "byte": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,   # torch / llama.cpp style "1.5G"
}
# matched against a stripped text: a trailing \s* after the optional unit made "1", 20,000 blanks, "x" take 4.7 s
# (each split of the blanks between the two \s* was tried)
SIZE_RE = re.compile(r"^(-?\d+(?:[.,]\d+)*(?:\.\d+)?)\s*([KMGT]i?B|[kmgt]i?b|B|bytes?|[KMGTkmgt])?$")

# Named cards: total memory as the driver reports it (bytes) for the boards people ask about.
# Sources: vendor specifications; the H200 figure is NVML's total on the lent H200 (150,754,820,096).
NAMED_CARDS: dict[str, tuple[str, int]] = {
    "rtx3090": ("NVIDIA GeForce RTX 3090 (24 GiB)", 24 << 30),
    "rtx4090": ("NVIDIA GeForce RTX 4090 (24 GiB)", 24 << 30),
    "rtx5090": ("NVIDIA GeForce RTX 5090 (32 GiB)", 32 << 30),
    "a10": ("NVIDIA A10 (24 GiB)", 24 << 30),
    "l4": ("NVIDIA L4 (24 GiB)", 24 << 30),
    "a6000": ("NVIDIA RTX A6000 (48 GiB)", 48 << 30),
    "l40s": ("NVIDIA L40S (48 GiB)", 48 << 30),
    "a100-40": ("NVIDIA A100 40GB", 40 << 30),
    "a100-80": ("NVIDIA A100 80GB", 80 << 30),
    "a100": ("NVIDIA A100 80GB", 80 << 30),
    "h100": ("NVIDIA H100 80GB", 80 << 30),
    "h100-80": ("NVIDIA H100 80GB", 80 << 30),
    "h100-94": ("NVIDIA H100 NVL (94 GB)", 94 * 1000**3),
    "h200": ("NVIDIA H200 (141 GB)", 150_754_820_096),
    "b200": ("NVIDIA B200 (180 GB)", 180 * 1000**3),
    "l40": ("NVIDIA L40 (48 GiB)", 48 << 30),
    "a40": ("NVIDIA A40 (48 GiB)", 48 << 30),
    "rtx6000ada": ("NVIDIA RTX 6000 Ada Generation (48 GiB)", 48 << 30),
    "h800": ("NVIDIA H800 80GB", 80 << 30),
}


def to_bytes(value: str | float | int, unit: str) -> int:
    """``to_bytes("4.84", "GiB")`` → 5196910346. Raises BadInput for an unknown unit."""
    u = unit.strip().lower()
    if u not in UNIT_BYTES:
        raise BadInput(f"unknown size unit {unit!r}")
    n = float(str(value).replace(",", "")) * UNIT_BYTES[u]
    if not math.isfinite(n):
        raise BadInput(f"not a memory size: {value!r} {unit} is not finite")
    return int(round(n))


def parse_size(text: str | int | float, default_unit: str = "B", *, what: str | None = None) -> int:
    """THE size parser: ``150754820096`` (int or text), ``24GiB``, ``24 GB`` (decimal), ``272.00 MiB``, ``1,024 MiB``,
    ``5.2e9``, a float of bytes (truncated), or a named card (``rtx4090``, ``H200``: its total, ``NAMED_CARDS``).
    Raises BadInput for anything else (also for infinities), prefixed with ``what`` when given."""
    try:
        return _parse_size(text, default_unit)
    except BadInput as e:
        if what:
            raise BadInput(f"{what}: {e}") from None
        raise


def _parse_size(text: str | int | float, default_unit: str) -> int:
    s = str(text).strip()
    key = s.lower().replace("_", "").replace(" ", "")
    if key in NAMED_CARDS:
        return NAMED_CARDS[key][1]
    try:
        return int(float(s)) if default_unit == "B" else to_bytes(s, default_unit)
    except OverflowError:
        raise BadInput(f"not a memory size: {text!r} is not finite") from None
    except ValueError:
        pass
    m = SIZE_RE.match(s)
    if not m:
        raise BadInput(f"not a memory size: {text!r} (use bytes, e.g. 25229197312, a size like 24GiB, or a card name: "
                       + ", ".join(sorted(NAMED_CARDS)) + ")")
    return to_bytes(m.group(1), m.group(2) or default_unit)


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{sign}{n / div:.2f} {unit}"
    return f"{sign}{int(n)} B"


def parse_int(text: str) -> int:
    return int(str(text).replace(",", "").replace("_", ""))


def convert(value: str, unit: str) -> int | float | str:
    """Convert a regex group by the unit a rule declares for it."""
    u = unit.lower()
    if u in ("int", "tokens", "count"):
        return parse_int(value)
    if u in ("float", "ratio", "percent", "seconds"):
        return float(str(value).replace(",", ""))
    if u == "str":
        return value
    if u == "size":                      # "272.00 MiB" in one group
        return parse_size(value)
    return to_bytes(value, unit)
