"""The verdict: which matched line is the ROOT failure, its class and the phase call behind it; else the runtime
signals; else, with only wrappers in the paste, ``cascade_only`` (where the root cause was printed)."""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field, replace
from typing import Iterable

from oomdoctor import contract
from oomdoctor.diagnose.match import Match
from oomdoctor.diagnose.rulespec import Rule
from oomdoctor.diagnose.phase import FRAME_WINDOW, PhaseCall, from_frames, phase_of
from oomdoctor.diagnose.signals import RuntimeTracker

RANK = {"low": 0, "medium": 1, "high": 2}
EPISODE_LINES = 600          # how far a chained/cascading error can be from its first cause
PHASE_AT = {p: i for i, p in enumerate(contract.PHASES)}
REVERSED_LINES = 40          # a traceback exported newest-first: its exception line is printed just before its frames


def class_of(m: Match, call: PhaseCall) -> tuple[str | None, PhaseCall]:
    """The class of root ``m`` and the phase call that decided it. A phase seen (frames, milestones, serving) that
    the rule's ``class_by_phase`` maps decides; else the rule's own ``class`` (the message names its phase);
    else its ``likely_phase`` (confidence low); else no class (``None``)."""
    r = m.rule
    if call.phase and call.seen and call.phase in r.class_by_phase:
        return r.class_by_phase[call.phase], call
    if r.klass:
        ph = contract.CLASSES[r.klass]["phase"]
        return r.klass, PhaseCall(ph, "message", "high", f"the message names it ({r.id} at line {m.n})", m.n)
    if r.likely_phase:
        seen = f"; the phase seen ({call.phase}) has no class in it" if call.phase else ""
        ph, why = likely_phase(m)
        return r.class_by_phase[ph], PhaseCall(
            ph, "likely", "low", f"most likely phase of {r.id} ({why}nothing in the paste shows it{seen})", m.n)
    return None, call


def likely_phase(m: Match) -> tuple[str, str]:
    """The rule's most likely phase for ``m``, and why: the first ``likely_when`` figure of the line above zero
    rules out the phases before its phase; else ``likely_phase``."""
    for number, phase in m.rule.likely_when:
        v = m.numbers.get(number)
        if isinstance(v, (int, float)) and v > 0:
            return phase, f"the line's {number} is above zero; "
    return str(m.rule.likely_phase), ""


# a traceback's source line that raises: after nothing, a logger's header ("[core.py:396] ") or a prefix ("... ")
_RAISE_RE = re.compile(r"(?:^|[\]) ]) {0,40}raise [A-Za-z_][\w.]{0,80}\(")


def select_root(roots: list[Match], cascades: list[Match]) -> Match | None:
    primary = [m for m in roots if not m.rule.fallback]
    cascade_lines = {c.n for c in cascades}
    pool = primary or [m for m in roots if m.rule.fallback and m.n not in cascade_lines]
    # a traceback's source line that quotes the message ('raise ValueError("No available memory for the cache
    # blocks. "') is not the exception line that the same rule reads right below it
    at = {(id(m.rule), m.n) for m in pool}          # one pass: a log of many tracebacks stays linear
    pool = [m for m in pool if not (_RAISE_RE.search(m.line.text[:2000]) and any(
        (id(m.rule), m.n + d) in at for d in range(1, TRACEBACK_TAIL_LINES + 1)))] or pool
    if not pool:
        return None
    first = pool[0]
    end = first.n + EPISODE_LINES
    nxt = [c.n for c in cascades if c.n > first.n]
    if nxt:
        end = min(end, nxt[0])
    episode = [m for m in pool if first.n <= m.n <= end]
    # the earliest line of the episode; of a cut traceback (its frames stand for the missing exception line), the
    # innermost frame, which says where it failed
    return max(episode, key=lambda m: (m.rule.priority, m.n if _is_cut_reading(m) else -m.n))


@dataclass
class Verdict:
    """The class of a log and what decided it: its root line, else the runtime signals, else its wrappers."""
    klass: str = "unknown"
    phase: str = "none"
    basis: str = ""                       # in words: which line decided the phase
    basis_kind: str = ""                  # contract: frames | message | milestones | serving | likely
    confidence: str = ""                  # contract: high | medium | low
    rule: str | None = None
    message: str = ""
    levers: list[str] = field(default_factory=list)
    settle: str = ""                      # the lines that would settle a phase the paste does not show
    fetch: str = ""                       # cascade_only: whose output holds the root cause, and how to get it


def _is_frame_line(m: Match) -> bool:
    t = m.line.text
    return 'File "' in t and '", line ' in t


def _is_cut_reading(m: Match) -> bool:
    """A match that stands for an exception line the paste lacks (a cut traceback's frame, a worker's exception
    header with its traceback cut: a fallback root of confidence low). It is part of a traceback, not an error that
    bounds one."""
    return _is_frame_line(m) or (m.rule.fallback and m.rule.confidence == "low")


def _error_lines(root: Match, roots: list[Match], cascades: list[Match]) -> tuple[int, int | None, int | None]:
    """The previous and next error lines of ``root``'s process (they bound its traceback)."""
    # a frame line or a worker's exception header is part of a traceback, not an error that bounds one
    same = [c.n for c in roots + cascades if c.line.process == root.line.process and c.rule.id != root.rule.id
            and not _is_cut_reading(c)]
    prev = max([n for n in same if n < root.n] or [0])
    after = sorted(n for n in same if n > root.n)
    nxt = after[0] if after else None
    chain_end = next((n for n in after if n > (nxt or 0) + 1), None)   # the end of a chained exception's traceback
    return prev, nxt, chain_end


def callee_frames(root: Match, roots: list[Match], frames: list[Match]) -> list[Match]:
    """The frames of the process whose failure a relay carries, when its traceback is in the paste without its
    exception line: the last cut traceback (``_is_cut_reading``) of another process before the relay. They are inner
    to the relay's own frames (the engine core's RPC into the worker), so they place the failure."""
    cut = [m for m in roots if m.n < root.n and _is_cut_reading(m) and m.line.process != root.line.process]
    if not cut:
        return []
    proc = cut[-1].line.process
    return [f for f in frames if f.line.process == proc and root.n - FRAME_WINDOW < f.n < root.n]


def classify_root(root: Match | None, roots: list[Match], cascades: list[Match], milestones: list[Match],
                  frames: list[Match], runtime: RuntimeTracker, notes: list[str], settle: str = "",
                  callee: list[Match] | None = None) -> Verdict:
    v = Verdict()
    if root is not None:
        prev_err, next_err, chain_end = _error_lines(root, roots, cascades)
        serving = runtime.first_serving
        call = from_frames(callee, serving[0] if serving else None, root) if callee else None
        if call is not None and callee:   # which cut traceback the relay speaks for is read from the line order: medium
            call = PhaseCall(call.phase, call.basis, "medium" if call.confidence == "high" else call.confidence,
                             f"{call.detail} of the process whose failure the relay carries "
                             f"({callee[-1].line.process})",
                             call.line)
        else:
            call = phase_of(root, milestones, frames, prev_err, next_err, serving, chain_end, cascades)
        k, call = class_of(root, call)
        if root.rule.confidence and RANK[root.rule.confidence] < RANK.get(call.confidence, 2):
            call = PhaseCall(call.phase, call.basis, root.rule.confidence, call.detail, call.line)
        if k is None:
            k = "unknown"
            notes.append(f"rule {root.rule.id} matched at line {root.n} but the phase ({call.phase or 'unknown'}) "
                         "has no class in it: not guessing")
            call = PhaseCall("none", call.basis, call.confidence, call.detail, call.line)
        v.klass, v.rule, v.message, v.levers = k, root.rule.id, root.rule.message, list(root.rule.levers)
        v.phase, v.basis, v.basis_kind, v.confidence = call.phase or "none", call.detail, call.basis, call.confidence
        fixed = contract.CLASSES.get(k, {}).get("phase", "none")
        if fixed != "none" and fixed != v.phase:
            # the contract fixes a class's phase; the phase seen is the engine's step that maps to it
            # (llama.cpp's cuBLAS handle made at the end of its load is the warm-up of the contract)
            v.basis = f"{call.detail}; the engine's step seen ({v.phase}) is the contract's {fixed}"
            v.phase = fixed
        if call.basis == "likely" or (call.confidence == "low" and k not in contract.NO_MEMORY_FAILURE):
            v.settle = settle
            notes.append(f"phase {v.phase} is the most likely one, not seen in the paste; lines that would settle it: "
                         f"{settle}")
        return v
    sig = runtime.classify()
    if sig is not None:
        v.klass, v.rule, v.message = sig["class"], sig.get("rule"), sig.get("message", "")
        v.levers, v.basis = sig.get("levers", []), sig.get("basis", "")
        v.phase = contract.CLASSES[v.klass]["phase"]
        v.basis_kind, v.confidence = "serving", "high" if "inferred" not in v.basis else "medium"
    elif cascades:
        cascade_verdict(v, cascades, notes)
    return v


def cascade_verdict(v: Verdict, cascades: list[Match], notes: list[str]) -> None:
    """Only wrappers in the paste: ``cascade_only`` — the root cause was printed by another process (or above the
    paste); say whose output to fetch and how."""
    c = cascades[0]
    proc = c.groups.get("failed_proc") or c.line.proc or ""
    where = (c.rule.root_in or "the output of the process that failed, above this wrapper {process}").replace(
        "{process}", f"({proc})" if proc else "")
    where = " ".join(where.split())
    v.klass, v.phase, v.rule = "cascade_only", "none", c.rule.id
    v.fetch = where
    v.message = f"The root cause is not in this paste: only the wrapper '{c.line.msg.strip()[:160]}' (line {c.n}). Fetch {where}."
    notes.append(f"the root cause is not in this paste: fetch {where}")


# a logged stack, not a failure's traceback: frames inside an INFO/DEBUG/WARNING record of glog's format
# ("I0204 23:56:14.567000 380022 torch/_dynamo/convert_frame.py:1701]   File ..."), as torch's own logging prints
_LOGGED_STACK = re.compile(r'(?<![A-Za-z0-9])[IWD]\d{4} \d\d:\d\d:\d\d\.\d{1,9} {1,8}\d{1,10} [^\]\s]{1,300}:\d{1,9}\] {1,40}File "')
TRACEBACK_TAIL_LINES = 8     # an exception line follows its traceback's last frame (source line, carets) this close


def _logged_stack(m: Match) -> bool:
    return m.line.level in ("DEBUG", "INFO", "WARNING") or _LOGGED_STACK.search(m.line.text) is not None


def _complete_tracebacks(keep: list[Match]) -> set[int]:
    """The ids of the cut-traceback readings (frame lines) whose traceback is NOT cut: an exception line of the same
    process ends it (a wrapper's own stack ending in `EngineDeadError`, an operator stop's): its frames are that
    error's, not a root's. With a process prefix the process says which traceback a frame is in (no gap over
    FRAME_WINDOW lines between its frames); without one, the exception line must follow a run of frames whose gaps
    are no longer than a frame's lines. One pass per process over its matches in line order (linear: a log of
    many tracebacks costs no more than its matches)."""
    by_proc: dict[str, list[Match]] = {}
    for c in sorted(keep, key=lambda c: c.n):
        if c.rule.role in ("root", "cascade", "frame"):
            by_proc.setdefault(c.line.process, []).append(c)
    complete: set[int] = set()
    for proc, ms in by_proc.items():
        window = FRAME_WINDOW if proc else TRACEBACK_TAIL_LINES
        pending: list[Match] = []            # the frames of the current run, undecided
        last = 0                             # the line of the run's last frame
        for c in ms:
            if pending and c.n - last > window:
                pending = []                 # the run ends with no exception line: cut
            if _is_frame_line(c):
                pending.append(c)
                last = c.n
            elif pending and c.rule.role != "frame" and not _is_cut_reading(c):   # an exception line (not a frame's code
                # line, not another cut reading: a worker header)
                if proc or c.n - last <= TRACEBACK_TAIL_LINES:
                    complete.update(id(f) for f in pending)
                pending = []
    return complete


def _roots(keep: list[Match], runtime: RuntimeTracker) -> list[Match]:
    """The root candidates. A generic fallback ("any FooError: line", a cut traceback) that a rejected request of
    the same process explains — the rejection is its exception line — is not one; nor a cut traceback's frame that
    is no cut traceback: a logged stack, or frames whose own exception line the paste holds."""
    explained = [(r.n, r.line.process) for r in runtime.rejections]

    def explained_by_rejection(m: Match) -> bool:
        # its exception line after it; or just before it when a collector exported the lines in reverse order
        return any(p == m.line.process and -REVERSED_LINES <= n - m.n <= FRAME_WINDOW for n, p in explained)

    complete = _complete_tracebacks(keep)

    def not_a_cut_traceback(m: Match) -> bool:
        return _is_frame_line(m) and (_logged_stack(m) or id(m) in complete)

    def without_its_evidence(m: Match) -> bool:     # `after:` the line that makes it this failure came before it
        return bool(m.rule.after) and not any(x.n < m.n and x.rule.id in m.rule.after for x in keep)

    steps = StepRuns([m for m in keep if m.rule.role == "milestone"])
    return [m for m in keep if m.rule.role == "root" and not without_its_evidence(m) and not (
        m.rule.fallback and (explained_by_rejection(m) or not_a_cut_traceback(m) or steps.went_on_after(m)))]


class StepRuns:
    """The start-up steps each process reached, as runs of one phase in line order (a serving log's thousands of
    per-request milestones are one run), so that what came before and after a line is found by bisection."""

    def __init__(self, milestones: list[Match]) -> None:
        self._runs: dict[str, tuple[list[int], list[int]]] = {}
        for x in milestones:            # every process's own, and all of them under "" (a line of no process)
            ph = PHASE_AT.get(x.rule.reaches or "")
            if ph is None:
                continue
            for key in {"", x.line.process}:
                starts, phases = self._runs.setdefault(key, ([], []))
                if not phases or phases[-1] != ph:
                    starts.append(x.n)
                    phases.append(ph)

    def went_on_after(self, m: Match) -> bool:
        """A generic exception line (a fallback of no memory class) after which its process went on to a later
        start-up step than the one it had reached: a library that logged an exception it caught (xformers' "No module
        named 'triton'" before vLLM loaded its weights and captured its graphs). A later step only: a restart begins
        again from the first one, and its first run's exception stays the root."""
        if m.rule.klass != "not_memory" or _is_cut_reading(m):
            return False
        starts, phases = self._runs.get(m.line.process, ([], []))
        i = bisect.bisect_left(starts, m.n)          # runs[i:] start after the line
        reached = phases[i - 1] if i else -1         # none before: a warning at the start (an optional import)
        # the next run is of another phase than the one the line is in: higher, the start went on; lower, a new start
        return i < len(phases) and phases[i] > reached


def carried_roots(carriers: list[Match], roots: list[Match], root_rules: Iterable[Rule]) -> list[Match]:
    """The root candidates the first wrapper that carries a readable text holds: the root rules that read its line (an
    OOM text a pattern finds anywhere) or its quoted text (the named group ``carried``: the worker's ``str(exception)``,
    V0's ``repr(exception)``) as if it were the exception line. Later wrappers are read only when an earlier one
    yields nothing (a serving log can hold one relay per request)."""
    rules = [r for r in root_rules if r.role == "root"]
    for c in carriers:
        text = c.groups["carried"].strip()
        quoted = replace(c.line, msg=text, text=text)
        out = [m for m in roots if m.n == c.n]
        seen = {m.rule.id for m in out}
        for r in rules:
            if r.id in seen:
                continue
            rm = r.match(quoted)
            if rm:
                out.append(Match(r, c.line, r.extract(rm), {k: v for k, v in rm.groupdict().items() if v is not None}))
        if out:
            return out
    return []


def _pick_carried(cands: list[Match]) -> Match | None:
    """The wrapper's specific rules (highest priority) before its fallbacks."""
    if not cands:
        return None
    pool = [m for m in cands if not m.rule.fallback] or cands
    return max(pool, key=lambda m: m.rule.priority)


def decide(keep: list[Match], runtime: RuntimeTracker, notes: list[str], settle: str,
           root_rules: Iterable[Rule] = ()) -> tuple[Match | None, Verdict]:
    """The root line and the verdict of the matches of one engine (and version).

    A wrapper that carries its root's text (``Worker failed with error '<text>'``) stands for the exception line only
    when the paste holds no exception line of its own: no root outside the wrappers' lines, other than a cut traceback's
    reading (``_is_cut_reading``). Then the text is read with the same root rules; a log that prints the
    real exception line keeps it as the root."""
    milestones = [m for m in keep if m.rule.role == "milestone"]
    frames = [m for m in keep if m.rule.role == "frame"]
    cascades = [m for m in keep if m.rule.role == "cascade"]
    roots = _roots(keep, runtime)
    carriers = [c for c in cascades if (c.groups.get("carried") or "").strip()]
    carried_at, cascade_at = {c.n for c in carriers}, {c.n for c in cascades}
    # an exception line of the paste's own: not on a carrying wrapper, not a cut traceback's reading, not a fallback on
    # another wrapper's line (the front end's "RuntimeError: Engine core initialization failed ..." is no root either)
    own = [m for m in roots if m.n not in carried_at and not _is_cut_reading(m)
           and not (m.rule.fallback and m.n in cascade_at)]
    root = _pick_carried(carried_roots(carriers, roots, root_rules)) if carriers and not own else None
    if root is not None:
        v = classify_root(root, roots, cascades, milestones, frames, runtime, notes, settle,
                          callee_frames(root, roots, frames))
        if v.klass != "unknown":
            return root, v
        notes.clear()
    root = select_root(roots, cascades)
    v = classify_root(root, roots, cascades, milestones, frames, runtime, notes, settle)
    if root is not None and root.rule.fallback and v.klass == "unknown":
        # a generic fallback that nothing places (a cut traceback in unknown frames) is no root: try without it
        notes.clear()
        roots = [m for m in roots if m.rule is not root.rule]
        root = select_root(roots, cascades)
        v = classify_root(root, roots, cascades, milestones, frames, runtime, notes, settle)
    return root, v
