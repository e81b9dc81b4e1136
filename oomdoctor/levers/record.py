"""The lever record the lever engine builds, and the constants its generators share."""
from __future__ import annotations

from typing import Any

from oomdoctor.card.records import Lever
from oomdoctor.units import human_bytes

GiB = 1 << 30
MiB = 1 << 20
ACTIVATION_GRAPH_RESERVE = GiB  # assumed activations + CUDA graphs when the arena is pinned and nothing measured
WINDOW_MARGIN = 0.02           # keep 2 % of the KV budget free when sizing a window


def _h(n: float | int | None) -> str:
    return human_bytes(n) if n is not None else "?"


def lever(id: str, change: dict[str, Any], predicted: dict[str, Any], cost: str, basis: str, applies_as: str = "flag",
          explicit_override: bool = False, arithmetic: list[str] | None = None, score: float = 0.0) -> Lever:
    """The one place a lever record is built; ``_score`` orders it until ``rank`` numbers it."""
    return {"id": id, "change": change, "rank": 0, "predicted": predicted, "cost": cost, "basis": basis,
            "applies_as": applies_as, "explicit_override": explicit_override, "arithmetic": arithmetic or [],
            "_score": score}


