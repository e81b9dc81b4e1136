"""THE YAML reader: cards, receipts, project files, serving profiles, rules and lever tables all load through
:func:`load`, which builds plain data only (YAML's safe tags) and bounds what a file from a stranger can cost:

- its size (``MAX_BYTES``), checked before parsing;
- its nesting depth (``MAX_DEPTH``) and its size once every alias is expanded (``MAX_NODES``): a "billion laughs"
  file is small on disk and shares its lists, so it loads fast — and would then make every walker of the data
  (redaction, validation, JSON) run for minutes; it is refused here, weighed with shared parts counted once;
- integers (``MAX_INT_DIGITS`` digits): a 5,000-digit number is refused, not turned into a crash downstream.

Anything over a bound, and anything YAML or Python refuse while building (a recursion, an int Python will not
convert), is raised as :class:`YAMLLimit`, a ``yaml.YAMLError``: the callers' existing "malformed YAML" handling
turns it into their one-line error (exit 2).
"""
from __future__ import annotations

from typing import Any

import yaml

from oomdoctor.bounds import Exceeded, expanded_weight

MAX_BYTES = 2 << 20                    # the largest committed card is 18 KB; a card with 1,000 attempts ~1 MB
MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_INT_DIGITS = 40
_BIG = 10 ** MAX_INT_DIGITS
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YAMLLimit(yaml.YAMLError):
    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = None


def _weigh(obj: Any) -> int:
    """The number of values in ``obj`` with every shared reference expanded; YAMLLimit past a bound."""
    try:
        return expanded_weight(obj, MAX_DEPTH, MAX_NODES, _BIG)
    except Exceeded as e:
        raise YAMLLimit({"int": f"an integer of more than {MAX_INT_DIGITS} digits",
                         "depth": f"nested deeper than {MAX_DEPTH} levels",
                         "values": f"more than {MAX_NODES:,} values once its aliases are expanded"}[e.kind])


def check(doc: Any) -> Any:
    """``doc`` (e.g. from ``json.loads``) when it is within the depth, size and integer bounds; else YAMLLimit."""
    try:
        _weigh(doc)
    except RecursionError:  # pragma: no cover - MAX_DEPTH is far below the recursion limit
        raise YAMLLimit("nested too deeply")
    return doc


def load(text: str | bytes) -> Any:
    """The document in ``text`` (str, or UTF-8 bytes), or :class:`YAMLLimit` / ``yaml.YAMLError``."""
    if len(text) > MAX_BYTES:
        raise YAMLLimit(f"{len(text):,} bytes; a YAML file read here is at most {MAX_BYTES >> 20} MiB")
    s = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    seps = s.count("\n") + s.count(",")       # every value but one ends at one of these: a cheap upper bound first
    if seps > MAX_NODES:
        raise YAMLLimit(f"{seps:,} lines and items; a YAML file read here holds at most {MAX_NODES:,} values")
    try:
        doc = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        raise
    except RecursionError:
        raise YAMLLimit("nested too deeply")
    except (ValueError, OverflowError, TypeError, MemoryError) as e:
        raise YAMLLimit(f"a value that cannot be read ({type(e).__name__}: {str(e)[:120]})")
    return check(doc)
