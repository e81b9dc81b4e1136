"""How big a parsed document really is: values counted with every shared reference expanded (each shared part
weighed once, so a billion-laughs document costs its real size to measure, not its expanded one), its depth, and
its integers. One walk for YAML/JSON documents (safeyaml) and unpickled snapshots (analysis/pickleguard)."""
from __future__ import annotations

from typing import Any

CONTAINERS = (dict, list, tuple, set, frozenset)


class Exceeded(Exception):
    """``kind`` is ``int``, ``depth`` or ``values``; the reader turns it into its own one-line error."""

    def __init__(self, kind: str, obj: Any = None):
        super().__init__(kind)
        self.kind, self.obj = kind, obj


def expanded_weight(obj: Any, max_depth: int, max_values: int, int_bound: int) -> int:
    """The number of values in ``obj`` with shared references expanded; Exceeded past a bound."""
    return _weigh(obj, 0, {}, max_depth, max_values, int_bound)


def _weigh(obj: Any, depth: int, memo: dict[int, int], max_depth: int, max_values: int, int_bound: int) -> int:
    if isinstance(obj, int) and not isinstance(obj, bool) and not -int_bound < obj < int_bound:
        raise Exceeded("int", obj)
    if not isinstance(obj, CONTAINERS):
        return 1
    if depth > max_depth:
        raise Exceeded("depth")
    seen = memo.get(id(obj))
    if seen is not None:
        return seen
    memo[id(obj)] = 1                      # a self-reference (``&a [*a]``) weighs 1, not forever
    w = 1
    items = (x for kv in obj.items() for x in kv) if isinstance(obj, dict) else iter(obj)
    for it in items:
        w += _weigh(it, depth + 1, memo, max_depth, max_values, int_bound)
        if w > max_values:
            raise Exceeded("values")
    memo[id(obj)] = w
    return w
