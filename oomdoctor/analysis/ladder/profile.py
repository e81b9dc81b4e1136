"""The declared free memory of a serving profile, to compare the measured threshold with."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.errors import BadInput
from oomdoctor.units import parse_size


def read_profile(path: str | Path, name: str) -> dict:
    """``requires_free_bytes`` of profile NAME in a YAML/JSON file: ``{profiles: {NAME: {...}}}``,
    ``{profiles: [{name: NAME, ...}]}``, ``{NAME: {...}}`` or ``[{name: NAME, ...}]``."""
    import yaml

    p = Path(path)
    try:
        d = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInput(f"--profile-file {p}: cannot be read ({e.strerror or e})")
    except yaml.YAMLError:
        raise BadInput(f"--profile-file {p}: not YAML/JSON")
    pool = d.get("profiles", d) if isinstance(d, dict) else d
    prof = None
    names: list[str] = []
    if isinstance(pool, dict):
        prof = pool.get(name)
        names = [str(k) for k in pool]
    elif isinstance(pool, list):
        for x in pool:
            if isinstance(x, dict):
                names.append(str(x.get("name")))
                if x.get("name") == name:
                    prof = x
    if not isinstance(prof, dict):
        raise BadInput(f"--profile {name!r} is not in {p} (profiles: {', '.join(names) or 'none'})")
    key = "requires_free_bytes" if prof.get("requires_free_bytes") is not None else "declared_free_bytes"
    v = prof.get(key)
    if v is None:
        raise BadInput(f"profile {name!r} in {p} has no requires_free_bytes (nor declared_free_bytes)")
    n = parse_size(str(v))
    if n <= 0:
        raise BadInput(f"profile {name!r} in {p}: {key} must be positive")
    return {"bytes": n, "source": f"{p} profile {name} {key}"}
