"""Stage 4 — classify the ROOT failure among the matches (:mod:`oomdoctor.diagnose.match` finds them).

- A *phase tracker* follows the start-up milestones each process reaches (``role: milestone``
  rules) and the traceback frames printed before an error (``role: frame`` rules).
- A generic error (torch's CUDA OOM) takes its class from the phase it happened in
  (``class_by_phase``); a specific message carries its class.
- Precedence: the first fatal cause wins over the errors that cascade from it; within one
  error episode (the lines from that first cause to the next wrapper error) a more
  specific rule (higher ``priority``) beats a generic one; ``fallback`` rules count only
  when nothing else matched.
- No root failure: runtime signals (preemption, rejections, KV pressure) decide, else the
  log is clean → ``unknown`` (never a guessed OOM).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from oomdoctor import contract
from oomdoctor.errors import BadInput
from oomdoctor.diagnose import paste
from oomdoctor.diagnose.read import SourceInfo
from oomdoctor.diagnose.rules import RuleSet, anchors_of, version_in
from oomdoctor.diagnose.rulespec import nearest_covered
from oomdoctor.diagnose.match import Match, Matched, choose_engine, match_lines
from oomdoctor.diagnose.phase import FRAME_WINDOW, frame_names, settle_hint
from oomdoctor.diagnose.ignored import drop_after_stop, drop_ignored
from oomdoctor.diagnose.verdict import Verdict, class_of, classify_root, decide, select_root
from oomdoctor.diagnose.signals import RuntimeTracker
from oomdoctor.diagnose.scan import GREP_OUT_OF_MEMORY, PARALLEL_MIN_COMPRESSED, _grep_for, scan_blocks

__all__ = ["Diagnosis", "FRAME_WINDOW", "Verdict", "class_of", "classify_root", "diagnose_file", "diagnose_lines",
           "select_root"]


@dataclass
class Diagnosis:
    source: SourceInfo
    engine: str | None
    engine_version: str | None
    engine_version_line: int | None
    klass: str
    phase: str
    type: str
    rule: str | None
    message: str
    root: Match | None
    evidence: list[dict]
    numbers: dict[str, Any]
    numbers_source: dict[str, int]
    numbers_by_process: dict[str, dict[str, Any]]
    phase_reached: str | None
    phase_basis: str                       # how the phase was decided
    levers: list[str]
    matches: list[Match] = field(default_factory=list)
    runtime: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    hits: dict[str, dict] = field(default_factory=dict)     # rule id → first line, count, numbers
    phase_basis_kind: str = ""             # frames | message | milestones | serving | likely
    confidence: str = ""                   # high | medium | low
    settle: str = ""                       # the lines that would settle a phase the paste does not show
    fetch: str = ""                        # cascade_only: whose output holds the root cause, and how to get it
    version_caveat: str = ""               # the version is outside what the rules cover: nearest rules were used

    @property
    def is_memory_failure(self) -> bool:
        return self.klass not in contract.NO_MEMORY_FAILURE

    def classification(self) -> dict:
        out = {"class": self.klass, "phase": self.phase, "type": self.type, "rule": self.rule,
               "engine": self.engine, "engine_version": self.engine_version}
        if self.phase_basis_kind:
            out["phase_basis"] = self.phase_basis_kind
            out["confidence"] = self.confidence
        if self.settle:
            out["settled_by"] = self.settle
        if self.fetch:
            out["root_cause_in"] = self.fetch
        if self.version_caveat:
            out["version_caveat"] = self.version_caveat
        return out


# ----------------------------------------------------------------------------- main
def engine_version_of(ruleset: RuleSet, eng: str | None, versions: dict[str, tuple[str, int]],
                      forced: str | None) -> tuple[str | None, int | None, str | None, str]:
    """The engine version (given, else the log's version line), the line it was read from, the version whose rules
    apply, and a caveat when the version is outside the range the rules cover: such a log is still diagnosed, with the
    rules of the nearest covered version (and a lower confidence); only a version that does not parse is refused."""
    ver, ver_line = (forced, None)
    if ver is None and eng in versions:
        ver, ver_line = versions[eng]
    if not (eng and ver):
        return ver, ver_line, ver, ""
    spec = ruleset.engines[eng]
    try:
        ok = version_in(ver, spec.covers)
    except ValueError:
        raise BadInput(f"'{ver}' is not a {spec.name} version")
    if ok:
        return ver, ver_line, ver, ""
    near = nearest_covered(ver, spec.covers)
    where = f" (log line {ver_line})" if ver_line else ""
    caveat = (f"{spec.name} {ver}{where} is outside the versions the rules cover ({spec.covers}): diagnosed with the "
              f"rules of the nearest covered version ({near}); wordings may differ, so the confidence is lowered")
    return ver, ver_line, near, caveat


def preemption_counters(ruleset: RuleSet, eng: str | None) -> list[str]:
    """The Prometheus preemption counters of the log's engine (its engine.yaml), else of every engine."""
    specs = [ruleset.engines[eng]] if eng else list(ruleset.engines.values())
    return [c for spec in specs for c in spec.preemption_counters]


def _closing_notes(notes: list[str], source: SourceInfo, root: Match | None, klass: str,
                   phase_reached: str | None) -> None:
    if source.cut_lines:
        notes.append(f"{len(source.cut_lines)} line(s) longer than 1 MiB were cut (first: line {source.cut_lines[0]})")
    if source.undone:
        notes.append(f"read as {source.read_as}: " + "; ".join(source.undone))
    if root is None and klass == "unknown":
        if phase_reached == "runtime":
            notes.append("the engine started and served; no memory failure in the log")
        elif phase_reached:
            notes.append(f"no failure found; the log ends in phase '{phase_reached}'")


def memory_warnings(v: Any, keep: list[Match], root: Match | None, notes: list[str]) -> None:
    """The note on torch's out-of-memory warnings before a failure of another kind, which is then said with medium
    confidence at most: its own line names its cause, and the memory that ran out may be it."""
    warned = memory_warning_note(keep, root, v.klass)
    if warned:
        notes.append(warned)
        v.confidence = "medium" if v.confidence == "high" else v.confidence


def memory_warning_note(keep: list[Match], root: Match | None, klass: str) -> str | None:
    """A failure that is no memory failure after torch's "CUDA warning: out of memory" lines (a CUDA call that
    returned out of memory while freeing or syncing, warned about and not raised): device memory ran out while it
    ran, and a CUDA error after such warnings can be their consequence. The class stays the error's own."""
    if klass not in contract.NO_MEMORY_FAILURE:
        return None
    # one per line: a rule of no engine is copied into every engine's rules, and each copy matches the line
    warns = list({m.n: m for m in keep if "cuda_warning_oom" in m.groups and (root is None or m.n < root.n)}.values())
    if not warns:
        return None
    fn = re.search(r"\(function (\w{1,80})\)", warns[0].line.text)
    return (f"{len(warns):,} torch warning(s) 'CUDA warning: out of memory'{f' (in {fn.group(1)})' if fn else ''} "
            f"came before it (lines {warns[0].n}-{warns[-1].n}): device memory ran out while the engine ran; the "
            "error can be their consequence. Watch the GPU's memory (nvidia-smi) while reproducing it")


def diagnose_lines(lines: Iterable[tuple[int, bytes | str] | bytes], ruleset: RuleSet, source: SourceInfo,
                   engine: str | None = None, engine_version: str | None = None,
                   metrics_text: str | None = None) -> Diagnosis:
    runtime = RuntimeTracker()
    hits: dict[str, dict] = {}
    matches, counts, versions = match_lines(lines, ruleset.rules, list(ruleset.engines.values()), runtime, hits)
    return diagnose_matched(Matched(matches, counts, versions, runtime, hits), ruleset, source, engine=engine,
                            engine_version=engine_version, metrics_text=metrics_text)


def diagnose_matched(found: Matched, ruleset: RuleSet, source: SourceInfo, engine: str | None = None,
                     engine_version: str | None = None, metrics_text: str | None = None) -> Diagnosis:
    """The diagnosis of what the matcher found (one process: ``diagnose_lines``; several: parallel.py)."""
    matches, counts, versions, runtime, hits = found.matches, found.counts, found.versions, found.runtime, found.hits
    eng = choose_engine(ruleset, counts, versions, engine) or engine_of_hits(ruleset, hits)
    notes: list[str] = []
    ver, ver_line, rver, caveat = engine_version_of(ruleset, eng, versions, engine_version)
    if eng is None:
        notes.append("no engine recognised in the log; rules of every engine were tried")
    if caveat:
        notes.append(caveat)
    fam = ruleset.family(eng)
    keep = [m for m in matches if (fam is None or m.rule.engine in fam) and m.rule.applies_to(rver)]
    runtime.select(lambda e, versions: (fam is None or e in fam) and (rver is None or version_in(rver, versions)))
    if metrics_text is not None:
        runtime.add_metrics(metrics_text, preemption_counters(ruleset, eng))

    keep, stopped = drop_after_stop(drop_ignored(keep))
    milestones = [m for m in keep if m.rule.role == "milestone"]
    root, v = decide(keep, runtime, notes, settle_lines(ruleset, eng, rver), root_rules_of(ruleset, fam, rver))
    if caveat and v.confidence == "high":
        v.confidence = "medium"

    numbers, numbers_source, by_proc = merge_numbers(keep, root)
    if root is None:
        numbers.update({k: n for k, n in runtime.numbers().items() if k not in numbers})
    ms_before = [m for m in milestones if root is None or m.n < root.n]
    phase_reached = ms_before[-1].rule.reaches if ms_before else None
    evidence = build_evidence(root, keep, runtime, phase_reached)
    if eng is None and ruleset.generic:
        v.rule = ruleset.shown_id(v.rule, eng) if v.rule else v.rule
        for e in evidence:
            e["rule"] = ruleset.shown_id(e["rule"], eng)
    _closing_notes(notes, source, root, v.klass, phase_reached)
    notes.extend(filter(None, [stopped]))       # the engine was stopped by a signal: said after what it did
    memory_warnings(v, keep, root, notes)
    return Diagnosis(
        source=source, engine=eng, engine_version=ver, engine_version_line=ver_line, klass=v.klass,
        phase=v.phase, type=contract.CLASSES[v.klass]["type"], rule=v.rule, message=v.message, root=root,
        evidence=evidence, numbers=numbers, numbers_source=numbers_source, numbers_by_process=by_proc,
        phase_reached=phase_reached, phase_basis=v.basis, levers=v.levers, matches=keep,
        runtime=runtime.summary(), notes=notes,
        hits={k: h for k, h in hits.items() if fam is None or h["engine"] in fam},
        phase_basis_kind=v.basis_kind, confidence=v.confidence, settle=v.settle, fetch=v.fetch,
        version_caveat=caveat,
    )


def root_rules_of(ruleset: RuleSet, fam: set[str] | None, ver: str | None) -> list:
    """The root rules of the log's engine (family) and version: they read a wrapper's carried text."""
    return [r for r in ruleset.rules if r.role == "root" and (fam is None or r.engine in fam) and r.applies_to(ver)]


def engine_of_hits(ruleset: RuleSet, hits: dict[str, dict]) -> str | None:
    """No detection string and no version line: the engine whose own messages matched (a wording only that engine
    prints — roots, wrappers, milestones, signals; not generic frames or fallbacks), when exactly one did."""
    own: dict[str, int] = {}
    for rid, h in hits.items():
        r = ruleset.by_id(rid)
        if r.role in ("frame", "ignored") or r.fallback:      # CPython's own reports name no engine
            continue
        own[h["engine"]] = own.get(h["engine"], 0) + h["count"]
    ranked = sorted(own.items(), key=lambda kv: -kv[1])
    if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        return ranked[0][0]
    return None


def settle_lines(ruleset: RuleSet, eng: str | None, ver: str | None) -> str:
    """The lines that would settle a phase, from the engine's own frame and milestone rules."""
    rules = [r for r in ruleset.rules if (eng is None or r.engine == eng) and r.applies_to(ver)]
    by_phase: dict[str, list[str]] = {}
    for r in rules:
        if r.role == "frame" and r.reaches:
            by_phase.setdefault(r.reaches, []).extend(frame_names(r))
    titles = [r.title for r in rules if r.role == "milestone" and r.title]
    return settle_hint(by_phase, titles)


def merge_numbers(matches: list[Match], root: Match | None) -> tuple[dict, dict, dict]:
    """Numbers of the root first; then the last value of every other number printed before it."""
    numbers: dict[str, Any] = {}
    src: dict[str, int] = {}
    by_proc: dict[str, dict[str, Any]] = {}
    limit = root.n if root else None
    for m in matches:
        if m.rule.role == "frame":
            continue
        proc = m.line.process or "-"
        for k, v in m.numbers.items():
            by_proc.setdefault(proc, {})[k] = v
            if limit is None or m.n <= limit:
                numbers[k] = v
                src[k] = m.n
            elif k not in numbers:
                numbers[k] = v
                src[k] = m.n
    if root is not None:
        for k, v in root.numbers.items():
            numbers[k] = v
            src[k] = root.n
    if len(by_proc) <= 1:
        by_proc = {}
    return numbers, src, by_proc


def _ev(m: Match, role: str) -> dict:
    d = {"line": m.n, "text": m.line.text[:2000], "rule": m.rule.id, "role": role}
    if m.line.process:
        d["process"] = m.line.process
    return d


def build_evidence(root: Match | None, matches: list[Match], runtime: RuntimeTracker, phase_reached: str | None) -> list[dict]:
    ev: list[dict] = []
    if root is not None:
        ev.append(_ev(root, "root"))
        seen = {root.line.msg.strip()}
        for m in matches:
            if m.rule.role in ("root", "cascade") and m is not root and m.line.msg.strip() not in seen and len(ev) < 12:
                seen.add(m.line.msg.strip())
                ev.append(_ev(m, "cascade" if m.rule.role == "cascade" or m.n > root.n else "related"))
        ledger = [m for m in matches if m.rule.role in ("milestone", "info") and m.n < root.n and m.numbers]
    else:
        ev.extend(runtime.evidence())
        # no root: the wrappers the paste holds are its evidence (cascade_only names them), each wording once
        wrappers: dict[str, Match] = {}
        for m in matches:
            if m.rule.role == "cascade" and len(wrappers) < 3:
                wrappers.setdefault(m.line.msg.strip(), m)
        ev.extend(_ev(m, "cascade") for m in wrappers.values())
        ledger = [m for m in matches if m.rule.role in ("milestone", "info") and m.numbers]
    seen_rules: set[str] = set()
    for m in reversed(ledger):                 # the latest ledger line of each kind
        if m.rule.id in seen_rules:
            continue
        seen_rules.add(m.rule.id)
        ev.append(_ev(m, "ledger"))
    ev.sort(key=lambda d: (d["role"] != "root", d["line"]))
    return ev


def _maybe_parallel(path: str | Path) -> bool:
    if os.environ.get("OOMDOCTOR_JOBS", "").strip():
        return True
    try:
        return os.stat(path).st_size >= PARALLEL_MIN_COMPRESSED      # parallel.jobs_for decides above
    except OSError:
        return False


def diagnose_file(path: str | Path, ruleset: RuleSet, engine: str | None = None, engine_version: str | None = None,
                  metrics_text: str | None = None, scanner: str = "auto", progress: Any = None) -> Diagnosis:
    """``progress``: a diagnose.progress.Progress for the bytes and lines read (stderr), or None. A small plain log
    is read with what pasting added undone (diagnose/paste.py); the source facts stay the log's own."""
    with paste.readable(path) as pasted:
        diag = _diagnose_path(pasted.path, ruleset, engine, engine_version, metrics_text, scanner, progress,
                              SourceInfo(str(path), undone=pasted.undone, read_as=pasted.read_as))
    if pasted.undone:
        diag.source.sha256, diag.source.size_bytes = pasted.sha256, pasted.size_bytes
    return diag


def _diagnose_path(path: Path, ruleset: RuleSet, engine: str | None, engine_version: str | None,
                   metrics_text: str | None, scanner: str, progress: Any, info: SourceInfo) -> Diagnosis:
    fresh = SourceInfo(info.path, undone=list(info.undone), read_as=info.read_as)
    try:
        return _scan_and_diagnose(path, ruleset, engine, engine_version, metrics_text, scanner, progress, info)
    except BadInput as e:
        # grep holds a whole line in memory and stops at its bound (scan.GREP_MAX_BYTES): the Python scanner,
        # whose memory does not grow with a line, reads the log again from the start
        if scanner != "auto" or GREP_OUT_OF_MEMORY not in str(e):
            raise
    return _scan_and_diagnose(path, ruleset, engine, engine_version, metrics_text, "python", progress, fresh)


def _scan_and_diagnose(path: Path, ruleset: RuleSet, engine: str | None, engine_version: str | None,
                       metrics_text: str | None, scanner: str, progress: Any, info: SourceInfo) -> Diagnosis:
    anchors = anchors_of(ruleset.rules, ruleset.engines.values())
    if scanner != "python" and _maybe_parallel(path):
        from oomdoctor.diagnose import parallel            # imported only for a large log (start-up of small ones)
        grep = _grep_for(list(anchors), scanner, path)
        jobs = parallel.jobs_for(path, grep, anchors)
        if jobs >= 2 and grep is not None:
            found = parallel.scan_and_match(path, anchors, info, ruleset.rules, list(ruleset.engines.values()), grep,
                                            jobs, progress)
            return diagnose_matched(found, ruleset, info, engine=engine, engine_version=engine_version,
                                    metrics_text=metrics_text)
    lines = scan_blocks(path, anchors, info, engine=scanner, progress=progress)
    return diagnose_lines(lines, ruleset, info, engine=engine, engine_version=engine_version, metrics_text=metrics_text)
