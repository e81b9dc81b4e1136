"""The records a profile selection produces: what to set (substitutions), why, and what to warn about."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from oomdoctor.profiles.reader import Profile


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
