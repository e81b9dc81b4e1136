"""Refuse rule patterns that can backtrack catastrophically, before any log line meets them.

Two shapes are refused (both are what made one 40 KB line take minutes):
- a repeat of a group that itself holds an unbounded repeat, when nothing mandatory in the group separates one
  round from the next: ``(a+)+``, ``(\\w+\\s?)*`` (``(?:[A-Za-z_]\\w*\\.)*`` is fine: every round ends in a ``.``);
- two unbounded repeats in one sequence whose characters overlap, with only optional items between them:
  ``\\d*\\.?\\d+``, ``.*.*``, ``\\S+\\s*\\S+``.
Possessive repeats (``\\d++``) and atomic groups (``(?>...)``) never backtrack and are always accepted: they are
the way to write such a pattern. Everything else is bounded by the per-line match cap (``MATCH_CHARS``).
"""
from __future__ import annotations

from typing import Any

try:  # Python 3.11+: the regex parser moved under re._parser
    from re import _constants as C  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_PROBE = [chr(i) for i in range(9, 127)] + ["\u00e9", "\u4e2d"]
_GREEDY = (C.MAX_REPEAT, C.MIN_REPEAT)
_CATS: dict[Any, Any] = {
    C.CATEGORY_DIGIT: str.isdigit, C.CATEGORY_NOT_DIGIT: lambda c: not c.isdigit(),
    C.CATEGORY_SPACE: str.isspace, C.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
    C.CATEGORY_WORD: lambda c: c.isalnum() or c == "_", C.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
}


def _in_set(items: list, c: str) -> bool:
    neg, hit = False, False
    for op, av in items:
        if op is C.NEGATE:
            neg = True
        elif op is C.LITERAL:
            hit = hit or c == chr(av)
        elif op is C.RANGE:
            hit = hit or av[0] <= ord(c) <= av[1]
        elif op is C.CATEGORY:
            hit = hit or bool(_CATS.get(av, lambda _c: True)(c))
    return hit != neg


def _chars(item: tuple) -> set[str] | None:
    """The probe characters one single-character item matches; None when it is not a one-character item."""
    op, av = item
    if op is C.LITERAL:
        return {chr(av)}
    if op is C.NOT_LITERAL:
        return {c for c in _PROBE if c != chr(av)}
    if op is C.ANY:
        return {c for c in _PROBE if c != "\n"}
    if op is C.IN:
        return {c for c in _PROBE if _in_set(av, c)}
    return None


def _first_chars(seq: Any) -> set[str]:
    """Characters that can start a match of a sub-pattern (over-approximated: every probe when unsure)."""
    for item in seq:
        got = _chars(item)
        if got is not None:
            return got
        op, av = item
        if op in _GREEDY or op is C.POSSESSIVE_REPEAT:
            return _first_chars(av[2]) | (set(_PROBE) if av[0] == 0 else set())
        if op is C.SUBPATTERN:
            return _first_chars(av[3])
        if op is C.AT:
            continue
        return set(_PROBE)
    return set()


def _repeat_chars(item: tuple) -> set[str] | None:
    """The characters an unbounded backtracking repeat can eat (None: not such a repeat)."""
    op, av = item
    if op not in _GREEDY or av[1] is not C.MAXREPEAT:
        return None
    body = list(av[2])
    if len(body) == 1 and _chars(body[0]) is not None:
        return _chars(body[0])
    return _first_chars(body)


def _optional(item: tuple) -> bool:
    op, av = item
    return (op in _GREEDY or op is C.POSSESSIVE_REPEAT) and av[0] == 0


def _has_unbounded(seq: Any) -> bool:
    for op, av in seq:
        if op in _GREEDY and av[1] is C.MAXREPEAT:
            return True
        if op is C.SUBPATTERN and _has_unbounded(av[3]):
            return True
        if op is C.BRANCH and any(_has_unbounded(b) for b in av[1]):
            return True
    return False


def _has_mandatory_literal(seq: Any) -> bool:
    return any(op is C.LITERAL for op, _ in seq)


def _check_seq(seq: Any) -> str | None:
    last: set[str] | None = None            # chars of the last unbounded repeat, while only optional items follow it
    for item in seq:
        op, av = item
        if op in _GREEDY:
            body = av[2]
            if av[1] is C.MAXREPEAT and (_has_unbounded(body) and not _has_mandatory_literal(_flat(body))):
                return "a repeated group holds an unbounded repeat with nothing mandatory between rounds"
            why = _check_seq(body)
            if why:
                return why
        elif op is C.SUBPATTERN:
            why = _check_seq(av[3])
            if why:
                return why
        elif op is C.BRANCH:
            for b in av[1]:
                why = _check_seq(b)
                if why:
                    return why
        elif op in (C.ASSERT, C.ASSERT_NOT):
            why = _check_seq(av[1])
            if why:
                return why
        rc = _repeat_chars(item)
        if rc is not None:
            if last is not None and last & rc:
                return "two unbounded repeats over overlapping characters with only optional items between them"
            last = rc
        elif not _optional(item) and op is not C.AT:
            last = None
    return None


def _flat(seq: Any) -> list:
    """A group's items with plain (capturing or not) sub-groups opened up."""
    out: list = []
    for op, av in seq:
        if op is C.SUBPATTERN:
            out.extend(_flat(av[3]))
        else:
            out.append((op, av))
    return out


def catastrophic(pattern: str) -> str | None:
    """Why ``pattern`` can backtrack catastrophically, or None when it has neither refused shape."""
    return _check_seq(sre_parse.parse(pattern))
