"""Line shapes: the fast path of :mod:`oomdoctor.diagnose.match`.

The *shape* of a candidate line is the line with every ASCII digit replaced by ``#`` (one C-level
``bytes.translate``). Two lines of one shape differ only in which digits stand where. When every test
that the parse regexes, the version patterns and the patterns of the rules tried on the line make
treats the ten digits alike (no literal digit, no class holding some digits but not all, no
backreference: :func:`digit_uniform`), the regex engine takes the same steps on both lines: the same
rules match, at the same spans, the same engines are detected. So the first line of a shape goes
through the full matcher, and what it found becomes the shape's :class:`Plan`; the next lines of that
shape only add their numbers, sliced at the plan's spans and converted lazily, in bulk
(:meth:`oomdoctor.diagnose.signals.RuntimeTracker.fold_many`).

A plan is *fast* only when all of this holds for its first line: ASCII, no colour code, every rule
that matched is a ``signal`` (the periodic stats lines, the rejections: they are folded, not kept),
every rule tried is digit-uniform, and no anchor or detection string that holds a digit can occur
in a line of that shape. Otherwise every line of the shape takes the full matcher (a slow plan).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

try:  # Python 3.11+: the regex parser moved under re._parser
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

DIGITS = frozenset(range(48, 58))
MASK = bytes.maketrans(b"0123456789", b"##########")
_CATEGORIES_WITHOUT_DIGITS = {"CATEGORY_SPACE", "CATEGORY_NOT_DIGIT", "CATEGORY_LINEBREAK", "CATEGORY_UNI_SPACE",
                              "CATEGORY_UNI_NOT_DIGIT", "CATEGORY_UNI_LINEBREAK", "CATEGORY_NOT_WORD",
                              "CATEGORY_UNI_NOT_WORD"}
_CATEGORIES_WITH_DIGITS = {"CATEGORY_DIGIT", "CATEGORY_NOT_SPACE", "CATEGORY_WORD", "CATEGORY_NOT_LINEBREAK",
                           "CATEGORY_UNI_DIGIT", "CATEGORY_UNI_NOT_SPACE", "CATEGORY_UNI_WORD",
                           "CATEGORY_UNI_NOT_LINEBREAK"}


def mask(data: bytes) -> bytes:
    return data.translate(MASK)


def _class_uniform(items: list) -> bool:
    """A character class [...]: it holds all ten digits or none of them."""
    held: set[int] = set()
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            if av in DIGITS:
                held.add(av)
        elif name == "RANGE":
            lo, hi = av
            held |= {d for d in DIGITS if lo <= d <= hi}
        elif name == "CATEGORY":
            cat = str(av)
            if cat in _CATEGORIES_WITH_DIGITS:
                held |= DIGITS
            elif cat not in _CATEGORIES_WITHOUT_DIGITS:
                return False
        elif name == "NEGATE":
            continue
        else:                                   # BIGCHARSET / CHARSET (compiled forms) are not seen in parse trees
            return False
    return not held or held == DIGITS


def _uniform(tree: Iterable) -> bool:
    for op, av in tree:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL"):
            if av in DIGITS:
                return False
        elif name == "IN":
            if not _class_uniform(av):
                return False
        elif name in ("ANY", "AT"):
            continue
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if not _uniform(av[2]):
                return False
        elif name == "SUBPATTERN":
            if not _uniform(av[-1]):
                return False
        elif name == "ATOMIC_GROUP":
            if not _uniform(av):
                return False
        elif name == "BRANCH":
            if not all(_uniform(b) for b in av[1]):
                return False
        elif name in ("ASSERT", "ASSERT_NOT"):
            if not _uniform(av[1]):
                return False
        elif name == "GROUPREF_EXISTS":
            if not all(b is None or _uniform(b) for b in av[1:]):
                return False
        else:                                   # GROUPREF (a backreference compares the digits themselves), ...
            return False
    return True


def digit_uniform(rx: re.Pattern | str | bytes) -> bool:
    """True when every test ``rx`` makes treats the ten ASCII digits alike (see the module docstring)."""
    pattern = rx.pattern if isinstance(rx, re.Pattern) else rx
    if isinstance(pattern, bytes):
        pattern = pattern.decode("latin-1")
    try:
        return _uniform(sre_parse.parse(pattern))
    except (re.error, TypeError, ValueError):   # pragma: no cover - patterns were compiled before
        return False


@dataclass
class NumberSlot:
    name: str
    start: int          # byte offsets in the raw line (the record's prefix is added by the plan)
    end: int
    unit: str
    plain: bool         # digits (and one '.') only: int()/float() of the bytes equal units.convert


@dataclass
class SignalSlot:
    rule: Any                       # the Rule
    numbers: list[NumberSlot]
    bucket: Any = None              # the RuntimeTracker bucket it folds into


@dataclass
class Plan:
    """What the first line of a shape found. ``pending`` is None for a slow plan (the full matcher on every line)."""
    offset: int = 0                             # bytes of the record's "N:" prefix
    detect: tuple[str, ...] = ()
    signals: list[SignalSlot] = field(default_factory=list)
    sampler: SignalSlot | None = None           # the one signal whose bucket's timeline samples this line
    ts: tuple[int, int] | None = None           # the span of the logging header's time stamp
    pending: list[bytes] | None = None
    order: list[bytes] | None = None            # the sampler bucket's lines in line order (LineMatcher._order)


SLOW = Plan()


# ----------------------------------------------------------------------------- request ids
# A serving log prints a unique request id (32 hex digits, a UUID) on each request line: every such line would be a
# shape of its own. A *run* is a stretch of 16 or more of "#abcdef-" in a shape (hex digits and dashes, after the
# digit mask). Lines whose shapes have runs of the same lengths at the same places and the same bytes between them
# (their *gaps*) share a HexPlan (found by the line with every run character masked, then the gaps compared). A line
# takes it only when nothing it can change does so (LineMatcher._hex_learn): every rule tried on it is a serving rule
# already seen (only a serving rule's first line counts), and every literal the full matcher looks for (anchors,
# detection strings, the version patterns' anchors) is in all those lines or in none (:func:`fixed_in_key`). The
# runs of two such lines are maximal in both (the same gap bytes border them), so they are the same runs.
HEX_RUN = re.compile(rb"[#a-f-]{16,}")
COARSE = bytes.maketrans(b"0123456789abcdef-", b"#" * 17)
_RUN_CHARS = frozenset(b"#abcdef-")


@dataclass
class HexPlan:
    gaps: list[tuple[int, bytes]]               # (offset, bytes) of the shape between its runs
    detect: tuple[str, ...] = ()                # the engines whose detection strings are in every line of it
    ok: bool = False                            # False: no plan can be made (every line takes the full matcher)

    def fits(self, key: bytes) -> bool:
        """``key`` (of the same masked form) has these gaps. The first starts the key, the last ends it."""
        gaps = self.gaps
        if not (key.startswith(gaps[0][1]) and key.endswith(gaps[-1][1])):
            return False
        return len(gaps) == 2 or all(key.startswith(piece, at) for at, piece in gaps[1:-1])


def gaps_of(key: bytes, runs: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
    ends = [0] + [e for _, e in runs]
    starts = [s for s, _ in runs] + [len(key)]
    return [(a, key[a:b]) for a, b in zip(ends, starts)]


def _segments(m: bytes) -> list[tuple[int, int]]:
    """The maximal stretches of run characters in ``m``."""
    out, start = [], None
    for i, c in enumerate(m):
        if c in _RUN_CHARS:
            start = i if start is None else start
        elif start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(m)))
    return out


def _fits(piece: bytes, key: bytes, lo: int, runs: list[tuple[int, int]]) -> bool:
    """Could ``piece`` (masked) stand at ``key[lo:]`` in some line of the key? A window that reaches into a run: yes."""
    hi = lo + len(piece)
    if lo < 0 or hi > len(key):
        return False
    if any(s < hi and lo < e for s, e in runs):
        return True
    return key[lo:hi] == piece


def fixed_in_key(literal: bytes, key: bytes, runs: list[tuple[int, int]]) -> bool:
    """True when ``literal`` is in every line of the hex key of ``key`` (a digit-masked line with ``runs``) exactly
    when it is in the line of ``key`` itself. Outside the runs the lines differ only in their digits, so a literal
    without a digit or '#' that cannot overlap a run is in all of them or in none; one holding a digit or '#' must
    not occur outside the runs at all. A literal overlaps a run when a stretch of its run characters can lie in the
    run with the rest of it, if any, next to the run: a stretch not at the literal's start must start the run (the
    character before a run is none of "#abcdef"), one not at its end must end the run."""
    m = mask(literal)
    if b"#" in m and m in key:
        return False
    for a, b in _segments(m):
        left = a == 0 or any(_fits(m[:a], key, s - a, runs) for s, _ in runs)
        right = b == len(m) or any(_fits(m[b:], key, e, runs) for _, e in runs)
        if left and right:
            return False
    return True


def ts_span(text: str) -> tuple[int, int] | None:
    """Where parse.parse_line takes a line's time stamp from (parse.header: behind wrapper prefixes too)."""
    from oomdoctor.diagnose.parse import header

    m, at, _, _ = header(text)
    if m is None or m.group("ts") is None:
        return None
    return m.start("ts") + at, m.end("ts") + at


def number_slots(rule: Any, m: re.Match, text_offset: int, raw: bytes) -> list[NumberSlot] | None:
    """The byte spans of ``rule``'s numbers in the line, from the match on its first line; None if a number of
    that line does not convert (then the shape takes the full matcher, which skips such numbers)."""
    from oomdoctor.units import convert

    slots = []
    for spec in rule.numbers:
        if spec.group not in m.re.groupindex or m.group(spec.group) is None:
            continue
        s, e = m.span(spec.group)
        s, e = s + text_offset, e + text_offset
        value = raw[s:e]
        try:
            convert(value.decode(), spec.unit)
        except Exception:  # noqa: BLE001 - the full matcher skips a malformed number; so does the slow plan
            return None
        shape = mask(value)
        plain = spec.unit.lower() in ("int", "tokens", "count", "float", "ratio", "percent", "seconds") and \
            shape.strip(b"#") in (b"", b".") and shape.startswith(b"#") and shape.endswith(b"#")
        slots.append(NumberSlot(spec.name, s, e, spec.unit, plain))
    return slots
