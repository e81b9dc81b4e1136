"""What a rule is: the rule, engine and rule-set records, version ranges, and the literal anchors the scanner
looks for. Loading and checking the YAML files is :mod:`oomdoctor.diagnose.rules`."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

from oomdoctor.diagnose.parse import LogLine
from oomdoctor.errors import RuleError
from oomdoctor.units import convert

try:  # Python 3.11+: the regex parser moved under re._parser
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]


# A rule's regexes see at most the first MATCH_CHARS characters of a line (the message and the whole line alike; a
# pattern with ``window: tail``, the last ones):
# what an engine prints for one event fits in it, and no line, however long, costs a pattern more than this
MATCH_CHARS = 8 << 10


# ----------------------------------------------------------------------------- versions
def parse_version(v: str) -> tuple[int, ...]:
    """'0.25.1' → (0, 25, 1); suffixes like '.dev3+gabc', 'rc1', '+cu130' are ignored."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", str(v).strip())
    if not m:
        raise ValueError(f"not a version: {v!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def version_in(version: str, spec: str | None) -> bool:
    """``version_in('0.25.1', '>=0.11,<0.34')``. An empty spec admits every version."""
    if not spec:
        return True
    v = parse_version(version)
    for part in str(spec).split(","):
        part = part.strip()
        m = re.match(r"(>=|<=|==|!=|>|<)\s*(.+)", part)
        if not m:
            raise ValueError(f"bad version spec {part!r}")
        op, rhs = m.group(1), parse_version(m.group(2))
        c = _cmp(v, rhs)
        ok = {">=": c >= 0, "<=": c <= 0, "==": c == 0, "!=": c != 0, ">": c > 0, "<": c < 0}[op]
        if not ok:
            return False
    return True


def nearest_covered(version: str, spec: str | None) -> str:
    """The covered version nearest to ``version``, which ``spec`` does not admit: a lower bound (``>=0.8`` → ``0.8``)
    or just under an upper bound (``<0.34`` → ``0.33.9999``), so that a log of an older or newer release is read with
    the rules of the closest release they were written for."""
    out = version
    for part in str(spec or "").split(","):
        m = re.match(r"(>=|<=|==|!=|>|<)\s*(.+)", part.strip())
        if not m or version_in(out, part.strip()):
            continue
        op, rhs = m.group(1), parse_version(m.group(2))
        if op in (">=", "==", "<="):
            out = ".".join(map(str, rhs))
        elif op == ">":
            out = ".".join(map(str, rhs + (1,)))
        elif op == "<":
            last = max((i for i, x in enumerate(rhs) if x), default=None)
            below = rhs[:last] + (rhs[last] - 1,) if last is not None else rhs
            out = ".".join(map(str, below + (9999,)))
    return out


# ----------------------------------------------------------------------------- rule fields (rules.build_rule)
def _after(d: dict, role: str, where: str) -> tuple[str, ...]:
    xs = d.get("after")
    if xs is None:
        return ()
    if role != "root" or not isinstance(xs, list) or not xs or not all(isinstance(x, str) and x for x in xs):
        raise RuleError(f"{where}: 'after' is a list of rule ids, for a root rule")
    return tuple(xs)


def _confidence(d: dict, where: str) -> str | None:
    c = d.get("confidence")
    if c is not None and c not in ("high", "medium", "low"):
        raise RuleError(f"{where}: confidence '{c}' is not high, medium or low")
    return c


def _likely(d: dict, cbp: dict, where: str) -> str | None:
    lp = d.get("likely_phase")
    if lp is None:
        return None
    if lp not in cbp:
        raise RuleError(f"{where}: likely_phase '{lp}' is not a phase of its class_by_phase")
    return str(lp)


def _likely_when(d: dict, cbp: dict, numbers: list, where: str) -> tuple[tuple[str, str], ...]:
    """``likely_when``: entries ``{number: N, phase: P}``, in order: when the matched line's number N is above
    zero, P is the most likely phase instead of ``likely_phase`` (a figure of the message that rules out the
    phases before P, e.g. memory in CUDA graphs' private pools: the graphs exist)."""
    xs = d.get("likely_when")
    if xs is None:
        return ()
    names = {n.name for n in numbers}
    if not isinstance(xs, list) or not all(isinstance(x, dict) and set(x) == {"number", "phase"} for x in xs):
        raise RuleError(f"{where}: 'likely_when' is a list of {{number: N, phase: P}}")
    for x in xs:
        if x["number"] not in names:
            raise RuleError(f"{where}: likely_when number '{x['number']}' is not one of the rule's numbers")
        if x["phase"] not in cbp:
            raise RuleError(f"{where}: likely_when phase '{x['phase']}' is not a phase of its class_by_phase")
    return tuple((str(x["number"]), str(x["phase"])) for x in xs)


def _check_spec(spec: Any, where: str) -> None:
    if spec is None:
        return
    try:
        version_in("0.0.0", str(spec))
    except ValueError as e:
        raise RuleError(f"{where}: {e}")


# ----------------------------------------------------------------------------- anchors
def derive_anchor(pattern: str) -> str | None:
    """The longest literal run (≥ 4 chars) that every match of ``pattern`` contains: the longest run of literal
    characters in its top-level sequence (a quantified character, a class, a group, an alternation break it)."""
    items = _top_items(pattern)
    if items is None:                      # a form the quick reader leaves to the regex parser
        try:
            parsed = sre_parse.parse(pattern)
        except re.error:
            return None
        if parsed.state.flags & re.IGNORECASE:
            return None
        items = [chr(av) if op is sre_parse.LITERAL else None for op, av in parsed]
    best, cur = "", []
    for item in items:
        if item is not None:
            cur.append(item)
            continue
        if len(cur) > len(best):
            best = "".join(cur)
        cur = []
    if len(cur) > len(best):
        best = "".join(cur)
    return best if len(best) >= 4 else None


_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_FLAGS_RE = re.compile(r"\(\?[aiLmsux-]")


def _skip_class(p: str, i: int) -> int:
    """The index after the character class that starts at ``p[i]`` ('['), or -1."""
    i += 1
    if p.startswith("^", i):
        i += 1
    if p.startswith("]", i):
        i += 1
    while i < len(p):
        if p[i] == "\\":
            i += 2
        elif p[i] == "[":                  # a nested set (a FutureWarning form): the parser decides
            return -1
        elif p[i] == "]":
            return i + 1
        else:
            i += 1
    return -1


def _skip_group(p: str, i: int) -> int:
    """The index after the group that starts at ``p[i]`` ('('), or -1."""
    depth = 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _skip_class(p, i)
            if i < 0:
                return -1
            continue
        depth += (c == "(") - (c == ")")
        i += 1
        if depth == 0:
            return i
    return -1


def _top_items(p: str) -> list[str | None] | None:
    """What ``sre_parse.parse(p)`` gives at the top level, as a literal character or None (anything else), for the
    plain patterns rules are written in; None for every other form (inline flags, '{', alternation, unknown escapes,
    unbalanced brackets): the parser reads those. tests/diagnose/test_rules_catalogue.py holds it to the parser."""
    if _FLAGS_RE.search(p):
        return None
    items: list[str | None] = []
    i = 0
    while i < len(p):
        c = p[i]
        if c in "([":
            j = _skip_group(p, i) if c == "(" else _skip_class(p, i)
            inner = p[i + 1:j - 1]
            if j < 0 or (c == "[" and len(inner.lstrip("\\")) <= 1):     # '[.]': the parser makes it a literal
                return None
            if p.startswith("(?:", i) and not p.startswith(("*", "+", "?", "{"), j):
                sub = _top_items(inner[2:]) if "|" not in inner else None  # the parser unwraps a plain group
                if sub is None:
                    return None
                items.extend(sub)
                i = j
                continue
            if c == "(" and p.startswith("(?", i) and not p.startswith(("(?:", "(?P<", "(?=", "(?!", "(?<=", "(?<!",
                                                                        "(?>"), i):
                return None                 # a comment, a conditional, a back-reference: the parser decides
            items.append(None)
            i = j
        elif c == "\\":
            e = p[i + 1:i + 2]
            if e in _CONTROL_ESCAPES:
                items.append(_CONTROL_ESCAPES[e])
            elif e and e in "dDsSwWbBAZ":
                items.append(None)
            elif not e or (e.isascii() and e.isalnum()):
                return None
            else:
                items.append(e)
            i += 2
        elif c in ".^$":
            items.append(None)
            i += 1
        elif c in "|){*+?":
            return None
        else:
            items.append(c)
            i += 1
        if i < len(p) and p[i] in "*+?{":   # a quantifier: the item is not a literal of every match
            if p[i] == "{":
                return None
            items[-1] = None
            i += 2 if p[i + 1:i + 2] in ("?", "+") else 1
    return items


# ----------------------------------------------------------------------------- data classes
@dataclass(frozen=True)
class Pattern:
    """A rule's regex (its source) and anchor. The regex is compiled when first used: a diagnosis compiles only the
    patterns whose anchor is in one of its lines (rules from outside the package are compiled, and checked, at load)."""
    source: str
    anchor: str
    tail: bool = False          # ``window: tail``: searched in a line's last MATCH_CHARS characters, not its first

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.source)


@dataclass(frozen=True)
class NumberSpec:
    name: str
    group: str
    unit: str


@dataclass
class Rule:
    id: str
    engine: str
    role: str
    patterns: list[Pattern]
    path: str
    versions: str | None = None
    title: str = ""
    klass: str | None = None
    class_by_phase: dict[str, str] = field(default_factory=dict)
    phase: str | None = None
    reaches: str | None = None
    priority: int = 0
    fallback: bool = False
    message: str = ""
    numbers: list[NumberSpec] = field(default_factory=list)
    levers: list[str] = field(default_factory=list)
    tests: list[dict] = field(default_factory=list)
    likely_phase: str | None = None      # the phase to report when the paste shows none (confidence low)
    likely_when: tuple[tuple[str, str], ...] = ()   # (number, phase): the message's own figure rules phases out
    root_in: str = ""                    # cascade: where the root cause was printed and how to get it
    confidence: str | None = None        # the most a match of this rule can claim (a cut traceback: low)
    after: tuple[str, ...] = ()          # a root only after a line of one of these rules (the evidence it needs)

    def applies_to(self, version: str | None) -> bool:
        return version is None or version_in(version, self.versions)

    def match(self, line: LogLine) -> re.Match[str] | None:
        for p in self.patterns:
            if p.anchor in line.text:
                # a dataclass repr's last fields (vLLM's scheduler dump: total_num_scheduled_tokens) are read from the end
                msg, text = ((line.msg[-MATCH_CHARS:], line.text[-MATCH_CHARS:]) if p.tail
                             else (line.msg[:MATCH_CHARS], line.text[:MATCH_CHARS]))
                m = p.regex.search(msg) or (p.regex.search(text) if line.msg is not line.text else None)
                if m:
                    return m
        return None

    def extract(self, m: re.Match[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        gd = m.groupdict()
        for spec in self.numbers:
            raw = gd.get(spec.group)
            if raw is None:
                continue
            try:
                out[spec.name] = convert(raw, spec.unit)
            except (ValueError, Exception):  # a malformed number in a log is skipped, never guessed
                continue
        return out


@dataclass
class EngineSpec:
    engine: str
    name: str
    covers: str | None
    detect: list[str]
    version_patterns: list[re.Pattern[str]]
    phases: list[str]
    path: str
    # Prometheus counters of preemptions this engine exports (--metrics), the canonical name first
    preemption_counters: list[str] = field(default_factory=list)
    # engines whose output this engine's log carries verbatim (Ollama runs llama.cpp): their rules apply too
    embeds: list[str] = field(default_factory=list)
    # detection strings that are scan anchors too (engine.yaml detect_lines; also in ``detect``)
    detect_lines: list[str] = field(default_factory=list)


@dataclass
class RuleSet:
    engines: dict[str, EngineSpec]
    rules: list[Rule]
    generic: dict[str, str] = field(default_factory=dict)   # an engine's copy of a rule of no engine -> the rule's id

    def shown_id(self, rule_id: str, engine: str | None) -> str:
        """The id to report: a rule of no engine keeps its own id when no engine was recognised (its copies are
        every engine's: the first one would name an engine the log does not show)."""
        return self.generic.get(rule_id, rule_id) if engine is None else rule_id

    def family(self, engine: str | None) -> set[str] | None:
        """The engines whose rules apply to a log of ``engine``: itself and those it embeds (None: every engine)."""
        if engine is None:
            return None
        spec = self.engines.get(engine)
        return {engine, *(spec.embeds if spec else [])}

    def for_engine(self, engine: str, version: str | None = None) -> list[Rule]:
        return [r for r in self.rules if r.engine == engine and r.applies_to(version)]

    def by_id(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)


def anchors_of(rules: Iterable[Rule], engines: Iterable[EngineSpec] = ()) -> set[bytes]:
    """What the scanner looks for: every pattern's anchor, the version lines and the engines' ``detect_lines``. The
    other detection strings are NOT anchors: detection counts them on the lines that pass anyway (a string on every line of a serving log,
    such as a process prefix, would otherwise send the whole log through Python)."""
    out = {p.anchor.encode() for r in rules for p in r.patterns}
    for e in engines:
        out.update(x.encode() for x in e.detect_lines)
        for vp in e.version_patterns:
            a = derive_anchor(vp.pattern)
            if a:
                out.add(a.encode())
    return out
