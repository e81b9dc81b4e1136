"""Stage 3 — run the rules over the scanner's candidate lines: which rule matches which line, which engine
printed the log (detection strings and version lines come from each engine's rules file), which version.

The first line of each *shape* (the line with its digits masked, :mod:`oomdoctor.diagnose.shapes`) goes through
the full matcher (:meth:`LineMatcher.add`); when all it matched is runtime signals, the next lines of that shape
cost one ``bytes.translate`` and one dict lookup each, and their numbers are folded in bulk at the end of each
block. The result is the same as the full matcher's on every line (tests/diagnose/test_match_engine.py)."""
from __future__ import annotations

import re
from bisect import bisect_left
from functools import partial
from dataclasses import dataclass, field
from sys import intern
from typing import Any, Iterable

from oomdoctor.diagnose import parse
from oomdoctor.diagnose.parse import LogLine, parse_line
from oomdoctor.diagnose.rules import EngineSpec, Rule, RuleSet
from oomdoctor.diagnose.rulespec import MATCH_CHARS, derive_anchor
from oomdoctor.diagnose.shapes import (COARSE, HEX_RUN, MASK, SLOW, HexPlan, Plan, SignalSlot, digit_uniform,
                                       fixed_in_key, gaps_of, mask, number_slots, ts_span)
from oomdoctor.diagnose.signals import (TRACKED_NUMBERS, LazySample, RuntimeTracker, Sample, fold_many,
                                        samples_numbers)
from oomdoctor.errors import BadInput

MAX_STORED_MATCHES = 200_000
MAX_PLANS = 1 << 16              # shapes remembered; a later new shape takes the full matcher (bounded memory)
PAIRS_BATCH = 4096


def _record_number(rec: bytes) -> int:
    """The line number of a grep -n record ``N:line``."""
    return int(rec[:rec.find(b":")])


def _seek(recs: list[bytes], start: int, j: int, n: int) -> int:
    """The first index >= ``j`` (< ``n``) of the records (in line order) whose number is >= ``start``, or ``n``:
    an exponential search from ``j``, as the next sample is mostly near."""
    if j >= n or _record_number(recs[j]) >= start:
        return j
    bound = 1
    while j + bound < n and _record_number(recs[j + bound]) < start:
        bound *= 2
    return bisect_left(recs, start, j + bound // 2 + 1, min(j + bound + 1, n), key=_record_number)


@dataclass
class Match:
    rule: Rule
    line: LogLine
    numbers: dict[str, Any]
    groups: dict[str, str]

    @property
    def n(self) -> int:
        return self.line.n


@dataclass
class Matched:
    """What the matcher found over a whole log: the input of classify.diagnose_matched."""
    matches: list[Match]
    counts: dict[str, int]
    versions: dict[str, tuple[str, int]]
    runtime: RuntimeTracker
    hits: dict[str, dict] = field(default_factory=dict)


class LineMatcher:
    """The rules of every engine over a stream of candidate lines, with the shape cache in front."""

    def __init__(self, rules: list[Rule], engines: list[EngineSpec], runtime: RuntimeTracker, hits: dict[str, dict]):
        self.engines, self.runtime, self.hits = engines, runtime, hits
        self.matches: list[Match] = []
        self.base = 0            # added to the line numbers of records and pairs (a piece of a log: parallel.py)
        self.counts = {e.engine: 0 for e in engines}
        self.versions: dict[str, tuple[str, int]] = {}
        by_anchor: dict[str, list[Rule]] = {}
        for r in rules:
            for p in r.patterns:
                by_anchor.setdefault(p.anchor, []).append(r)
        self._anchor_items = list(by_anchor.items())
        self._plans: dict[bytes, Plan] = {}
        self._dirty: list[Plan] = []                # the plans with pending lines
        self._hex: dict[bytes, list[HexPlan]] = {}   # a shape with its run characters masked → the plans of its runs
        self._n_hex = 0
        self._order: dict[int, tuple[RuntimeTracker, list[bytes]]] = {}
        self._uniform: dict[str, bool] = {}         # rule id → all its patterns digit-uniform (asked lazily)
        self._rules = {r.id: r for r in rules}
        self._cache = all(digit_uniform(rx) for rx in (parse.VLLM_RE, parse.SGLANG_RE, parse.ANSI_RE, parse.WRAPPER_RE,
                                                       parse.RAY_DEDUP_RE)) and \
            all(digit_uniform(vp) for e in engines for vp in e.version_patterns)
        # a literal holding '#' is as digit-sensitive as one holding a digit: '#' in a shape may stand for either
        with_digits = [a for a in by_anchor if re.search(r"[\d#]", a)] + \
                      [s for e in engines for s in e.detect if re.search(r"[\d#]", s)]
        self._digit_masks = [mask(s.encode()) for s in with_digits]
        self._literals = sorted({a.encode() for a in by_anchor} | {s.encode() for e in engines for s in e.detect})
        vp_anchors = {e.engine: [derive_anchor(vp.pattern) for vp in e.version_patterns] for e in engines}
        self._vp_anchors = {e: [a.encode() if a else None for a in anchors] for e, anchors in vp_anchors.items()}

    # -- the full matcher ----------------------------------------------------------------
    def _match(self, n: int, raw: bytes | str) -> tuple[LogLine, list[tuple[Rule, re.Match]], list[str], set[str]]:
        line = parse_line(n, raw)
        text = line.text
        detected = []
        for e in self.engines:
            if any(s in text for s in e.detect):
                self.counts[e.engine] += 1
                detected.append(e.engine)
            if e.engine not in self.versions:
                for vp in e.version_patterns:
                    m = vp.search(text[:MATCH_CHARS])
                    if m:
                        self.versions[e.engine] = (m.group("version"), n)
                        break
        found: list[tuple[Rule, re.Match]] = []
        tried: set[str] = set()
        for anchor, rs in self._anchor_items:
            if anchor not in text:
                continue
            for r in rs:
                if r.id in tried:
                    continue
                tried.add(r.id)
                m = r.match(line)
                if m:
                    found.append((r, m))
        return line, found, detected, tried

    def _record(self, line: LogLine, found: list[tuple[Rule, re.Match]]) -> None:
        for r, m in found:
            # group values (counts, percentages) repeat across thousands of stats lines: share them
            mt = Match(r, line, r.extract(m), {k: intern(v) for k, v in m.groupdict().items() if v is not None})
            h = self.hits.get(r.id)
            if h is None:
                self.hits[r.id] = {"line": line.n, "count": 1, "numbers": mt.numbers, "engine": r.engine}
            elif r.role != "serving":          # serving evidence is its first line: the count of one stays 1
                h["count"] += 1
            if r.role in ("signal", "serving"):   # folded as they stream by: bounded memory
                self.runtime.add(mt)
            elif len(self.matches) < MAX_STORED_MATCHES:
                self.matches.append(mt)

    def add(self, n: int, raw: bytes | str) -> None:
        """One line through the full matcher."""
        line, found, _, _ = self._match(n, raw)
        self._record(line, found)

    # -- shapes ----------------------------------------------------------------------------
    def _plan(self, key: bytes, k: int, raw: bytes, line: LogLine, found: list[tuple[Rule, re.Match]],
              detected: list[str], tried: set[str]) -> Plan:
        if not self._cache or not raw.isascii() or b"\x1b" in raw or not line.text.endswith(line.msg):
            return SLOW
        if any(r.role not in ("signal", "serving") for r, _ in found) or not all(self._is_uniform(rid) for rid in tried):
            return SLOW
        if any(dm in key for dm in self._digit_masks):
            return SLOW
        msg_at = len(line.text) - len(line.msg)
        signals = []
        for r, m in found:
            slots = number_slots(r, m, msg_at if m.string is line.msg else 0, raw)
            if slots is None or any(not x.plain for x in slots if x.name in TRACKED_NUMBERS):
                return SLOW
            signals.append(SignalSlot(r, slots, self.runtime.bucket(r)))
        samplers = [s for s in signals if samples_numbers(s)]
        if len(samplers) > 1:
            return SLOW
        plan = Plan(k, tuple(detected), signals, samplers[0] if samplers else None, ts_span(line.text), [])
        if plan.sampler is not None:
            plan.order = self._order.setdefault(id(plan.sampler.bucket), (plan.sampler.bucket, []))[1]
        return plan

    def _is_uniform(self, rule_id: str) -> bool:
        u = self._uniform.get(rule_id)
        if u is None:
            u = self._uniform[rule_id] = all(digit_uniform(p.source) for p in self._rules[rule_id].patterns)
        return u

    def _learn(self, key: bytes, rec: bytes, known: HexPlan | None = None) -> None:
        k = key.find(b":") + 1
        n, raw = int(rec[:k - 1]) + self.base, rec[k:]
        line, found, detected, tried = self._match(n, raw)
        self._record(line, found)
        if known is None and self._hex_learn(key, raw, line, detected, tried):
            return
        if len(self._plans) < MAX_PLANS:
            self._plans[key] = self._plan(key, k, raw, line, found, detected, tried)

    def _hex_learn(self, key: bytes, raw: bytes, line: LogLine, detected: list[str], tried: set[str]) -> bool:
        """After the full matcher's run on a line: a HexPlan for its hex key when one can be made (shapes.py)."""
        if not self._cache or not tried <= self._serving_seen() or not raw.isascii() or b"\x1b" in raw:
            return False
        runs = [m.span() for m in HEX_RUN.finditer(key)]
        if not runs or self._n_hex >= MAX_PLANS:
            return False
        plan = HexPlan(gaps_of(key, runs))
        self._hex.setdefault(key.translate(COARSE), []).append(plan)
        self._n_hex += 1
        vp_anchors = [a or b"" for e, anchors in self._vp_anchors.items() if e not in self.versions for a in anchors]
        if b"" in vp_anchors or any(a.decode() in line.text for a in vp_anchors):
            return False                      # a version pattern without an anchor, or one that may match
        if not all(fixed_in_key(lit, key, runs) for lit in self._literals + vp_anchors):
            return False
        plan.detect, plan.ok = tuple(detected), True
        return True

    def _serving_seen(self) -> set[str]:
        return {rid for rid in self.hits if self._rules[rid].role == "serving"}

    def _hex_plan(self, key: bytes) -> HexPlan | None:
        """The HexPlan of a digit-masked record's runs, if one was made (``ok`` or not)."""
        for plan in self._hex.get(key.translate(COARSE), ()):
            if plan.fits(key):
                return plan
        return None

    def _slow(self, key: bytes, rec: bytes) -> None:
        k = key.find(b":") + 1
        self.add(int(rec[:k - 1]) + self.base, rec[k:])

    def _materialize(self, slot: SignalSlot, rec: bytes, k: int) -> Match | None:
        line = parse_line(int(rec[:k - 1]) + self.base, rec[k:])
        m = slot.rule.match(line)
        if m is None:  # pragma: no cover - the shape guarantees the match
            return None
        return Match(slot.rule, line, slot.rule.extract(m),
                     {g: intern(v) for g, v in m.groupdict().items() if v is not None})

    def _sample_of(self, rec: bytes, base: int) -> Sample:
        key = rec.translate(MASK)
        plan = self._plans[key]
        slot, k = plan.sampler, plan.offset
        assert slot is not None
        nums: dict[str, Any] = {x.name: (int if x.unit.lower() in ("int", "tokens", "count") else float)(rec[x.start + k:x.end + k])
                for x in slot.numbers if x.name in TRACKED_NUMBERS}
        ts = rec[plan.ts[0] + k:plan.ts[1] + k].decode() if plan.ts else ""
        return Sample(int(rec[:k - 1]) + base, ts, nums.get("kv_usage_percent"), nums.get("running_reqs"),
                      nums.get("waiting_reqs"), nums.get("preemptions"))

    def _flush_samples(self) -> None:
        """Each bucket's timeline takes the first stats line of every window (RuntimeTracker._sample); the fast
        lines of all shapes of a bucket wait here in line order, and only the ones it takes are read: the next one
        is found by bisection on the line numbers (``next_window``), and its numbers are read only if it stays in
        the timeline (LazySample)."""
        base = self.base
        for b, recs in self._order.values():
            if not recs:
                continue
            j, n = 0, len(recs)
            while j < n:
                j = _seek(recs, b.next_window() - base, j, n)
                if j >= n:
                    break
                rec = recs[j]
                b.keep_sample(LazySample(_record_number(rec) + base, partial(self._sample_of, rec, base)))
                j += 1
            b._seen += n
            recs.clear()

    def add_records(self, keys: list[bytes], recs: list[bytes]) -> None:
        """Records ``N:line`` (grep -n's form; no newline, no carriage return, not cut) with their masks."""
        get, dirty = self._plans.get, self._dirty
        for key, rec in zip(keys, recs):
            plan = get(key)
            if plan is None or plan.pending is None:
                hp = self._hex_plan(key) if plan is None and self._hex else None
                if hp is not None and hp.ok:          # e.g. a request line of a serving rule already seen
                    for e in hp.detect:
                        self.counts[e] += 1
                    continue
                self._flush_samples()                 # the full matcher samples in place: the waiting ones first
                if plan is None:
                    self._learn(key, rec, hp)
                else:
                    self._slow(key, rec)
                continue
            if not plan.pending:
                dirty.append(plan)
            plan.pending.append(rec)
            if plan.order is not None:
                plan.order.append(rec)
        self.flush()

    def add_block(self, block: bytes) -> None:
        """grep -n records joined by newlines (see add_records)."""
        self.add_records(block.translate(MASK).split(b"\n"), block.split(b"\n"))

    def flush(self) -> None:
        self._flush_samples()
        for plan in self._dirty:
            pending = plan.pending
            if not pending:
                continue
            for e in plan.detect:
                self.counts[e] += len(pending)
            for slot in plan.signals:
                if slot.rule.role != "serving":
                    self.hits[slot.rule.id]["count"] += len(pending)
                fold_many(slot, pending, plan.offset, lambda rec, s=slot, k=plan.offset: self._materialize(s, rec, k),
                          self.base)
            pending.clear()
        self._dirty.clear()

    def add_pairs(self, lines: Iterable[tuple[int, bytes | str]]) -> None:
        """(line number, line) pairs, e.g. from the pure-Python scanner; bytes lines take the shape cache. The numbers
        are counted from ``base``, as the records' are."""
        keys: list[bytes] = []
        recs: list[bytes] = []
        for n, raw in lines:
            if isinstance(raw, (bytes, bytearray)) and b"\n" not in raw:
                rec = b"%d:%s" % (n, raw)
                keys.append(rec.translate(MASK))
                recs.append(rec)
                if len(recs) >= PAIRS_BATCH:
                    self.add_records(keys, recs)
                    keys, recs = [], []
                continue
            if recs:
                self.add_records(keys, recs)
                keys, recs = [], []
            self.add(n + self.base, raw)
        if recs:
            self.add_records(keys, recs)


def match_lines(lines: Iterable[tuple[int, bytes | str] | bytes], rules: list[Rule], engines: list[EngineSpec],
                runtime: RuntimeTracker, hits: dict[str, dict]) -> tuple[list[Match], dict[str, int], dict[str, tuple[str, int]]]:
    """Run every rule over the candidate lines. Returns (matches, engine detection counts, versions);
    ``hits`` receives, per rule id, the first matching line, its numbers and the match count.
    ``lines`` are (number, line) pairs, or blocks of grep -n records (``bytes`` items: see LineMatcher.add_block)."""
    lm = LineMatcher(rules, engines, runtime, hits)
    pairs: list[tuple[int, bytes | str]] = []
    for item in lines:
        if isinstance(item, (bytes, bytearray)):
            lm.add_pairs(pairs)
            pairs = []
            lm.add_block(item)
            continue
        pairs.append(item)
        if len(pairs) >= PAIRS_BATCH:
            lm.add_pairs(pairs)
            pairs = []
    lm.add_pairs(pairs)
    return lm.matches, lm.counts, lm.versions


def choose_engine(ruleset: RuleSet, counts: dict[str, int], versions: dict[str, tuple[str, int]],
                  forced: str | None) -> str | None:
    if forced:
        if forced not in ruleset.engines:
            raise BadInput(f"unknown engine '{forced}' (rules exist for: {', '.join(sorted(ruleset.engines))})")
        return forced
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0] in versions), default=(None, 0))
    if best[1] > 0:
        # a log of an engine that embeds another (Ollama's runner prints llama.cpp's lines) is that engine's
        wrappers = [e for e, spec in ruleset.engines.items() if best[0] in spec.embeds and counts.get(e, 0) > 0]
        return max(wrappers, key=lambda e: counts[e]) if wrappers else best[0]
    if versions:
        return next(iter(versions))
    return None
