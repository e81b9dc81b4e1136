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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from oomdoctor import contract
from oomdoctor.errors import BadInput
from oomdoctor.diagnose.read import SourceInfo
from oomdoctor.diagnose.rules import RuleSet, anchors_of, version_in
from oomdoctor.diagnose.match import Match, choose_engine, match_lines
from oomdoctor.diagnose.signals import RuntimeTracker
from oomdoctor.diagnose.scan import scan_blocks

EPISODE_LINES = 600          # how far a chained/cascading error can be from its first cause
FRAME_WINDOW = 800           # how far back traceback frames are looked for


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

    @property
    def is_memory_failure(self) -> bool:
        return self.klass not in contract.NO_MEMORY_FAILURE

    def classification(self) -> dict:
        return {"class": self.klass, "phase": self.phase, "type": self.type, "rule": self.rule,
                "engine": self.engine, "engine_version": self.engine_version}


# ----------------------------------------------------------------------------- phases
def phase_at(m: Match, milestones: list[Match], frames: list[Match], prev_error_line: int) -> tuple[str | None, str]:
    """The phase the process of ``m`` was in when ``m`` was printed, and how that was decided."""
    lo = max(prev_error_line, m.n - FRAME_WINDOW)
    fr = [f for f in frames if lo < f.n < m.n and f.line.process == m.line.process]
    if fr:
        f = fr[-1]                         # innermost known frame of the traceback
        if f.rule.reaches == "runtime":
            # a start-up step can run the serving code path (vLLM's V2 runner: profile_run → _dummy_run →
            # execute_model): a start-up frame further out in the same traceback decides
            startup = [x for x in fr if x.rule.reaches != "runtime"]
            if startup:
                f = startup[-1]
        return f.rule.reaches, f"traceback frame at line {f.n} ({f.rule.id})"
    own = [x for x in milestones if x.n < m.n and m.line.process and x.line.process == m.line.process]
    if own:
        x = own[-1]
        return x.rule.reaches, f"last milestone of {m.line.process} at line {x.n} ({x.rule.id})"
    before = [x for x in milestones if x.n < m.n]
    if before:
        x = before[-1]
        return x.rule.reaches, f"last milestone at line {x.n} ({x.rule.id})"
    return None, "no milestone before the error"


def class_of(m: Match, phase: str | None) -> tuple[str | None, str | None]:
    r = m.rule
    if r.klass:
        return r.klass, contract.CLASSES[r.klass]["phase"]
    if phase and phase in r.class_by_phase:
        k = r.class_by_phase[phase]
        return k, contract.CLASSES[k]["phase"]
    return None, phase


def select_root(roots: list[Match], cascades: list[Match]) -> Match | None:
    primary = [m for m in roots if not m.rule.fallback]
    cascade_lines = {c.n for c in cascades}
    pool = primary or [m for m in roots if m.rule.fallback and m.n not in cascade_lines]
    if not pool:
        return None
    first = pool[0]
    end = first.n + EPISODE_LINES
    nxt = [c.n for c in cascades if c.n > first.n]
    if nxt:
        end = min(end, nxt[0])
    episode = [m for m in pool if first.n <= m.n <= end]
    return max(episode, key=lambda m: (m.rule.priority, -m.n))


# ----------------------------------------------------------------------------- main
def engine_version_of(ruleset: RuleSet, eng: str | None, versions: dict[str, tuple[str, int]],
                      forced: str | None) -> tuple[str | None, int | None]:
    """The engine version (given, else the log's version line) and the line it was read from; refuses a
    version the rules of that engine do not cover."""
    ver, ver_line = (forced, None)
    if ver is None and eng in versions:
        ver, ver_line = versions[eng]
    if eng and ver:
        spec = ruleset.engines[eng]
        try:
            ok = version_in(ver, spec.covers)
        except ValueError:
            raise BadInput(f"'{ver}' is not a {spec.name} version")
        if not ok:
            where = f" (log line {ver_line})" if ver_line else ""
            raise BadInput(f"{spec.name} {ver}{where} is outside the versions the rules cover ({spec.covers}); "
                           f"pass --engine-version with a covered version to match it anyway")
    return ver, ver_line


def preemption_counters(ruleset: RuleSet, eng: str | None) -> list[str]:
    """The Prometheus preemption counters of the log's engine (its engine.yaml), else of every engine."""
    specs = [ruleset.engines[eng]] if eng else list(ruleset.engines.values())
    return [c for spec in specs for c in spec.preemption_counters]


@dataclass
class Verdict:
    """The class of a log and what decided it: its root line, else the runtime signals."""
    klass: str = "unknown"
    phase: str = "none"
    basis: str = ""
    rule: str | None = None
    message: str = ""
    levers: list[str] = field(default_factory=list)


def classify_root(root: Match | None, roots: list[Match], cascades: list[Match], milestones: list[Match],
                  frames: list[Match], runtime: RuntimeTracker, notes: list[str]) -> Verdict:
    v = Verdict()
    if root is not None:
        prev_err = max([c.n for c in roots + cascades if c.n < root.n and c.line.process == root.line.process] or [0])
        ph, v.basis = phase_at(root, milestones, frames, prev_err)
        k, p = class_of(root, ph)
        if k is None:
            k, p = "unknown", "none"
            notes.append(f"rule {root.rule.id} matched at line {root.n} but the phase ({ph or 'unknown'}) "
                         "has no class in it: not guessing")
        v.klass, v.phase, v.rule, v.message, v.levers = k, p or "none", root.rule.id, root.rule.message, list(root.rule.levers)
        return v
    sig = runtime.classify()
    if sig is not None:
        v.klass, v.rule, v.message = sig["class"], sig.get("rule"), sig.get("message", "")
        v.levers, v.basis = sig.get("levers", []), sig.get("basis", "")
        v.phase = contract.CLASSES[v.klass]["phase"]
    elif cascades:
        notes.append("a wrapper error was found but not its root cause: the log is cut, or the cause was "
                     "printed by another process whose output is missing")
    return v


def _closing_notes(notes: list[str], source: SourceInfo, root: Match | None, klass: str,
                   phase_reached: str | None) -> None:
    if source.cut_lines:
        notes.append(f"{len(source.cut_lines)} line(s) longer than 1 MiB were cut (first: line {source.cut_lines[0]})")
    if root is None and klass == "unknown":
        if phase_reached == "runtime":
            notes.append("the engine started and served; no memory failure in the log")
        elif phase_reached:
            notes.append(f"no failure found; the log ends in phase '{phase_reached}'")


def diagnose_lines(lines: Iterable[tuple[int, bytes | str] | bytes], ruleset: RuleSet, source: SourceInfo,
                   engine: str | None = None, engine_version: str | None = None,
                   metrics_text: str | None = None) -> Diagnosis:
    runtime = RuntimeTracker()
    hits: dict[str, dict] = {}
    matches, counts, versions = match_lines(lines, ruleset.rules, list(ruleset.engines.values()), runtime, hits)
    eng = choose_engine(ruleset, counts, versions, engine)
    notes: list[str] = []
    ver, ver_line = engine_version_of(ruleset, eng, versions, engine_version)
    if eng is None:
        notes.append("no engine recognised in the log; rules of every engine were tried")
    keep = [m for m in matches if (eng is None or m.rule.engine == eng) and m.rule.applies_to(ver)]
    runtime.select(lambda e, versions: (eng is None or e == eng) and (ver is None or version_in(ver, versions)))
    if metrics_text is not None:
        runtime.add_metrics(metrics_text, preemption_counters(ruleset, eng))

    milestones = [m for m in keep if m.rule.role == "milestone"]
    frames = [m for m in keep if m.rule.role == "frame"]
    cascades = [m for m in keep if m.rule.role == "cascade"]
    roots = [m for m in keep if m.rule.role == "root"]
    root = select_root(roots, cascades)
    v = classify_root(root, roots, cascades, milestones, frames, runtime, notes)

    numbers, numbers_source, by_proc = merge_numbers(keep, root)
    if root is None:
        numbers.update({k: n for k, n in runtime.numbers().items() if k not in numbers})
    ms_before = [m for m in milestones if root is None or m.n < root.n]
    phase_reached = ms_before[-1].rule.reaches if ms_before else None
    evidence = build_evidence(root, keep, runtime, phase_reached)
    _closing_notes(notes, source, root, v.klass, phase_reached)
    return Diagnosis(
        source=source, engine=eng, engine_version=ver, engine_version_line=ver_line, klass=v.klass,
        phase=v.phase, type=contract.CLASSES[v.klass]["type"], rule=v.rule, message=v.message, root=root,
        evidence=evidence, numbers=numbers, numbers_source=numbers_source, numbers_by_process=by_proc,
        phase_reached=phase_reached, phase_basis=v.basis, levers=v.levers, matches=keep,
        runtime=runtime.summary(), notes=notes,
        hits={k: h for k, h in hits.items() if eng is None or h["engine"] == eng},
    )


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
        ledger = [m for m in matches if m.rule.role in ("milestone", "info") and m.numbers]
    seen_rules: set[str] = set()
    for m in reversed(ledger):                 # the latest ledger line of each kind
        if m.rule.id in seen_rules:
            continue
        seen_rules.add(m.rule.id)
        ev.append(_ev(m, "ledger"))
    ev.sort(key=lambda d: (d["role"] != "root", d["line"]))
    return ev


def diagnose_file(path: str | Path, ruleset: RuleSet, engine: str | None = None, engine_version: str | None = None,
                  metrics_text: str | None = None, scanner: str = "auto", progress: Any = None) -> Diagnosis:
    """``progress``: a diagnose.progress.Progress for the bytes and lines read (stderr), or None."""
    info = SourceInfo(str(path))
    anchors = anchors_of(ruleset.rules, ruleset.engines.values())
    lines = scan_blocks(path, anchors, info, engine=scanner, progress=progress)
    return diagnose_lines(lines, ruleset, info, engine=engine, engine_version=engine_version, metrics_text=metrics_text)
