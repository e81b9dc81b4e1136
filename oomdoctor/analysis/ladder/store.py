"""Where the ladder is written (the card's top-level ``ladder``) and whether recorded rungs may be resumed."""
from __future__ import annotations

import copy
from pathlib import Path

from oomdoctor.card import store as cardmod


class _Store:
    """The card the ladder is written to (atomically, under the card's lock), or nothing (``-- CMD`` without --out)."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None

    def write(self, ladder: dict) -> None:
        if self.path is None:
            return
        from oomdoctor.redact import redact_obj

        with cardmod.locked(self.path):
            d = cardmod.load_dict(self.path)
            d["ladder"] = copy.deepcopy(ladder)
            d = redact_obj(d)
            cardmod.check(d, str(self.path))
            cardmod.atomic_write(self.path, cardmod.dumps(d))


def _resume_refusal(old: dict, new: dict, fresh: bool) -> str | None:
    if fresh:
        return "--fresh"
    if old.get("workload_fingerprint") != new["workload_fingerprint"]:
        return (f"the workload changed (fingerprint {str(old.get('workload_fingerprint'))[:19]}… → "
                f"{new['workload_fingerprint'][:19]}…)")
    on, nn = old.get("device"), new.get("device")
    if on and nn and on != nn:
        return f"another device ({on} → {nn})"
    if bool(old.get("ballast", True)) != new["ballast"]:
        return "the ballast mode changed (--no-ballast rungs are not measurements of the device)"
    return None
