"""Which phase an error happened in, from what a fragment of a log carries, and how sure that is.

A paste is often a tail: a traceback of one rank, no start-up milestones, no version line. The phase is
decided from the strongest evidence present, in this order (``phase_basis`` in the JSON):

- ``frames``: the innermost known frame (``role: frame`` rules) of the error's own traceback — the frames of
  the same process before the error line, or, when the message is printed before its traceback (a
  ``logger.exception`` record), the frames right after it. A ``runtime`` frame nested inside a start-up frame
  of the same traceback is a start-up dummy run (vLLM's V2 runner: ``profile_run → _dummy_run →
  execute_model``). A lone ``runtime`` frame without serving evidence is ``medium``, and a start-up frame of a
  chained exception's outer traceback, or of the calling process's traceback (a driver's RPC into a worker),
  printed after it decides (``medium``).
- ``message``: the rule names its class (``class:``), so its phase — or a phase seen in ``milestones`` /
  ``serving`` that its ``class_by_phase`` maps, when it has both.
- ``milestones``: the last start-up milestone of the same process (``high``), else of any process (``medium``).
- ``serving``: a serving line (``role: serving`` rules, stats and rejection signals) before the error and after
  the last milestone: the engine was serving → ``runtime``.
- a caller's report right after the error that names the step the error ended (a ``cascade`` rule with ``reaches``:
  llama.cpp's "failed to create context with model" after a cudaMalloc failure), like an outer frame: ``frames``,
  ``medium``.
- ``likely``: the rule's ``likely_phase`` (``low``); the card says which lines would settle it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

FRAME_WINDOW = 800           # how far back (and, for a message printed before its traceback, ahead) frames are looked for
CALLER_LINES = 8             # a caller's report follows the allocation failure it reports this close
SERVING_AFTER_LINES = 40     # a server's report of its engine's death while serving follows it this close


@dataclass
class PhaseCall:
    phase: str | None
    basis: str = ""              # frames | message | milestones | serving | likely | "" (none)
    confidence: str = "low"      # high | medium | low
    detail: str = ""             # which line decided it, in words
    line: int | None = None      # that line

    @property
    def seen(self) -> bool:
        return self.basis in ("frames", "milestones", "serving")


def _proc(m) -> str:
    return m.line.process


def frames_of(m, frames: list, prev_error_line: int, next_error_line: int | None) -> list:
    """The frames of ``m``'s own traceback: before it in its process since its previous error; else right after
    it, up to its next error (a message printed before its traceback)."""
    lo = max(prev_error_line, m.n - FRAME_WINDOW)
    before = [f for f in frames if lo < f.n < m.n and _proc(f) == _proc(m)]
    if before:
        return before
    hi = min(next_error_line or m.n + FRAME_WINDOW, m.n + FRAME_WINDOW)
    return [f for f in frames if m.n < f.n < hi and _proc(f) == _proc(m)]


def from_frames(fr: list, serving_line: int | None, m) -> PhaseCall | None:
    if not fr:
        return None
    # innermost known frame: the last one printed before the error, or — for frames after it — the last of them.
    # A serving frame nested in start-up frames is a start-up dummy run: the innermost start-up frame decides. A
    # fallback frame (V2's _dummy_run, run by profile_run, capture and the warm-up alike) decides only when no other
    # start-up frame is there
    f = fr[-1]
    conf = f.rule.confidence or "high"        # a frame that stands for several phases says so (medium)
    startup = [x for x in fr if x.rule.reaches != "runtime"]
    main = [x for x in startup if not x.rule.fallback]
    if f.rule.reaches == "runtime":
        if startup:
            f = (main or startup)[-1]
            conf = f.rule.confidence or "high"
        elif serving_line is None or serving_line > m.n:
            conf = "medium"
    elif f.rule.fallback and main:
        f = main[-1]
        conf = f.rule.confidence or "high"
    return PhaseCall(f.rule.reaches, "frames", conf, f"traceback frame at line {f.n} ({f.rule.id})", f.n)


def from_milestones(m, milestones: list) -> PhaseCall | None:
    own = [x for x in milestones if x.n < m.n and _proc(m) and _proc(x) == _proc(m)]
    if own:
        x = own[-1]
        return PhaseCall(x.rule.reaches, "milestones", "high",
                         f"last milestone of {_proc(m)} at line {x.n} ({x.rule.id})", x.n)
    before = [x for x in milestones if x.n < m.n]
    if before:
        x = before[-1]
        return PhaseCall(x.rule.reaches, "milestones", "high" if len({_proc(y) for y in before}) <= 1 else "medium",
                         f"last milestone at line {x.n} ({x.rule.id})", x.n)
    return None


def phase_of(m, milestones: list, frames: list, prev_error_line: int, next_error_line: int | None,
             serving: tuple[int, str] | None, chain_end: int | None = None, cascades: Sequence = ()) -> PhaseCall:
    """The phase the process of ``m`` was in when ``m`` was printed (the evidence, not the rule's own class)."""
    serving_line = serving[0] if serving else None
    call = from_frames(frames_of(m, frames, prev_error_line, next_error_line), serving_line, m)
    if call and call.phase == "runtime" and call.confidence != "high":
        call = outer_startup_frame(m, frames, chain_end, serving) or call
    if call:
        return call
    ms = from_milestones(m, milestones)
    if serving is not None and serving[0] < m.n and (ms is None or ms.phase == "runtime" or (ms.line or 0) < serving[0]):
        return PhaseCall("runtime", "serving", "high", f"the engine was serving: {serving[1]} at line {serving[0]}",
                         serving[0])
    if ms:
        return ms
    return caller_report(m, cascades) or calling_process_serving(m, frames) or serving_right_after(m, serving) or \
        PhaseCall(None, "", "low", "no frame, milestone or serving line before the error")


def serving_right_after(m, serving: tuple[int, str] | None) -> PhaseCall | None:
    """No frame, no milestone: the first serving line follows the error closely — the server reporting its engine's
    death to the requests it was serving (vLLM's ``AsyncLLM output_handler failed``, access-log 500s). A server that
    never started serves nothing, so the engine was serving when it failed. Like a caller's report: medium."""
    if serving is None or not m.n < serving[0] <= m.n + SERVING_AFTER_LINES:
        return None
    return PhaseCall("runtime", "serving", "medium", f"the engine had been serving: {serving[1]} at line {serving[0]}, "
                     "right after the error", serving[0])


def caller_report(m, cascades: Sequence) -> PhaseCall | None:
    """A caller's report right after ``m`` that names the step ``m`` ended (a cascade rule with ``reaches``): the
    weights were loaded, the context's buffers failed. Like an outer frame: medium."""
    c = next((c for c in cascades if c.rule.reaches and _proc(c) == _proc(m) and m.n < c.n <= m.n + CALLER_LINES),
             None)
    if c is None:
        return None
    return PhaseCall(c.rule.reaches, "frames", "medium", f"the caller's report at line {c.n} ({c.rule.id})", c.n)


def calling_process_serving(m, frames: list) -> PhaseCall | None:
    """No frame of its own, no milestone: the traceback of the process that called this one, printed after it,
    in a serving step (vLLM's ``LLM.generate → _run_engine → step → get_output → EngineDeadError``: the engine
    was serving). A caller at start-up (``LLM.__init__ → wait_for_engine_startup``) shows no serving frame, and
    says nothing of the phase. Like an outer frame: medium."""
    f = next((f for f in frames if m.n < f.n < m.n + FRAME_WINDOW and _proc(f) != _proc(m)
              and f.rule.reaches == "runtime"), None)
    if f is None:
        return None
    # that process's traceback must be a serving one: a start-up frame in it (another rank's profile_run →
    # _dummy_run → execute_model) makes its serving frame a start-up dummy run
    if any(m.n < x.n < m.n + FRAME_WINDOW and _proc(x) == _proc(f) and x.rule.reaches != "runtime" for x in frames):
        return None
    return PhaseCall("runtime", "frames", "medium", f"traceback frame at line {f.n} ({f.rule.id}) of the calling "
                     f"process {_proc(f) or '(no prefix)'}: it was serving", f.n)


def outer_startup_frame(m, frames: list, chain_end: int | None, serving: tuple[int, str] | None) -> PhaseCall | None:
    """A lone serving frame without serving evidence: a start-up frame further out decides — in a chained
    exception's outer traceback, or in the traceback of the process that called this one."""
    # a chained exception: the traceback printed after "The above exception was the direct cause" holds the
    # outer frames (V0 profile_run → execute_model → the OOM)
    outer = [f for f in frames if m.n < f.n < m.n + FRAME_WINDOW and _proc(f) == _proc(m)
             and f.rule.reaches != "runtime" and (chain_end is None or f.n < chain_end)]
    if outer:
        f = outer[-1]
        return PhaseCall(f.rule.reaches, "frames", "medium",
                         f"traceback frame at line {f.n} ({f.rule.id}) of the chained exception", f.n)
    # a worker's step called by the driver over RPC (V0 Ray/multiproc _run_workers, V1 collective_rpc): the
    # caller's traceback, printed after the worker's, shows the start-up step it was in
    caller = [f for f in frames if m.n < f.n < m.n + FRAME_WINDOW and _proc(f) != _proc(m)
              and f.rule.reaches != "runtime"]
    if caller and (serving is None or serving[0] > m.n):
        f = caller[-1]
        return PhaseCall(f.rule.reaches, "frames", "medium", f"traceback frame at line {f.n} ({f.rule.id}) of the "
                         f"calling process {_proc(f) or '(no prefix)'}", f.n)
    return None


def settle_hint(phase_frames: dict[str, list[str]], milestone_titles: list[str]) -> str:
    """Which lines would settle a phase the paste does not show: the frames that place it and the milestones."""
    parts = [f"{ph}: {', '.join(fns[:3])}" for ph, fns in phase_frames.items() if fns]
    out = "the full traceback of the failing process (its innermost frames: " + "; ".join(parts) + ")"
    if milestone_titles:
        out += " or the start-up lines before the error (" + "; ".join(milestone_titles[:4]) + ")"
    return out


_FN_RE = re.compile(r"in \(\?:([\w<>|]+)\)|in ([\w<>]+)\\s")


def frame_names(rule) -> list[str]:
    """The function names a frame rule stands for (read back from its patterns), for the settle hint."""
    out: list[str] = []
    for p in rule.patterns:
        m = _FN_RE.search(p.source)
        if m:
            out.extend(n for n in (m.group(1) or m.group(2)).split("|") if n not in out)
    return out
