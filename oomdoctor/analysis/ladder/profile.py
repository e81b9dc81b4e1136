"""The declared free memory of a serving profile, to compare the measured threshold with."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.errors import BadInput
from oomdoctor.units import parse_size


def read_profile(path: str | Path, name: str) -> dict:
    """``requires_free_bytes`` (else ``declared_free_bytes``) of profile NAME in a serving-profiles file, read by
    THE profiles reader (:mod:`oomdoctor.profiles.reader`)."""
    from oomdoctor.profiles.reader import profile_entries, read_doc

    p = Path(path)
    try:
        entries = profile_entries(read_doc(p), str(p))
    except BadInput as e:
        raise BadInput(f"--profile-file {e}")
    prof = next((e.raw for e in entries if e.name == name), None)
    if prof is None:
        raise BadInput(f"--profile {name!r} is not in {p} (profiles: {', '.join(e.name for e in entries) or 'none'})")
    key = "requires_free_bytes" if prof.get("requires_free_bytes") is not None else "declared_free_bytes"
    v = prof.get(key)
    if v is None:
        raise BadInput(f"profile {name!r} in {p} has no requires_free_bytes (nor declared_free_bytes)")
    n = parse_size(str(v))
    if n <= 0:
        raise BadInput(f"profile {name!r} in {p}: {key} must be positive")
    return {"bytes": n, "source": f"{p} profile {name} {key}"}
