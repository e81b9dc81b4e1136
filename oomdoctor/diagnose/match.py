"""Stage 3 — run the rules over the scanner's candidate lines: which rule matches which line, which engine
printed the log (detection strings and version lines come from each engine's rules file), which version."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from oomdoctor.diagnose.parse import LogLine, parse_line
from oomdoctor.diagnose.rules import EngineSpec, Rule, RuleSet
from oomdoctor.diagnose.rulespec import MATCH_CHARS
from oomdoctor.diagnose.signals import RuntimeTracker
from oomdoctor.errors import BadInput

MAX_STORED_MATCHES = 200_000


@dataclass
class Match:
    rule: Rule
    line: LogLine
    numbers: dict[str, Any]
    groups: dict[str, str]

    @property
    def n(self) -> int:
        return self.line.n



def match_lines(lines: Iterable[tuple[int, bytes | str]], rules: list[Rule], engines: list[EngineSpec],
                runtime: RuntimeTracker, hits: dict[str, dict]) -> tuple[list[Match], dict[str, int], dict[str, tuple[str, int]]]:
    """Run every rule over the candidate lines. Returns (matches, engine detection counts, versions);
    ``hits`` receives, per rule id, the first matching line, its numbers and the match count.

    The lines are the scanner's candidates (each holds a rule anchor or a version-line literal), so they are few:
    0.6 % of a serving log. Each is parsed once and tried against the rules whose anchor it holds."""
    from sys import intern

    matches: list[Match] = []
    detect_counts = {e.engine: 0 for e in engines}
    versions: dict[str, tuple[str, int]] = {}
    by_anchor: dict[str, list[Rule]] = {}
    for r in rules:
        for p in r.patterns:
            by_anchor.setdefault(p.anchor, []).append(r)
    anchor_items = list(by_anchor.items())
    for n, raw in lines:
        line = parse_line(n, raw)
        text = line.text
        for e in engines:
            if any(s in text for s in e.detect):
                detect_counts[e.engine] += 1
            if e.engine not in versions:
                for vp in e.version_patterns:
                    m = vp.search(text[:MATCH_CHARS])
                    if m:
                        versions[e.engine] = (m.group("version"), n)
                        break
        tried: set[str] = set()
        for anchor, rs in anchor_items:
            if anchor not in text:
                continue
            for r in rs:
                if r.id in tried:
                    continue
                tried.add(r.id)
                m = r.match(line)
                if not m:
                    continue
                # group values (counts, percentages) repeat across thousands of stats lines: share them
                mt = Match(r, line, r.extract(m), {k: intern(v) for k, v in m.groupdict().items() if v is not None})
                h = hits.get(r.id)
                if h is None:
                    hits[r.id] = {"line": n, "count": 1, "numbers": mt.numbers, "engine": r.engine}
                else:
                    h["count"] += 1
                if r.role == "signal":
                    runtime.add(mt)
                elif len(matches) < MAX_STORED_MATCHES:
                    matches.append(mt)
    return matches, detect_counts, versions


def choose_engine(ruleset: RuleSet, counts: dict[str, int], versions: dict[str, tuple[str, int]],
                  forced: str | None) -> str | None:
    if forced:
        if forced not in ruleset.engines:
            raise BadInput(f"unknown engine '{forced}' (rules exist for: {', '.join(sorted(ruleset.engines))})")
        return forced
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0] in versions), default=(None, 0))
    if best[1] > 0:
        return best[0]
    if versions:
        return next(iter(versions))
    return None
