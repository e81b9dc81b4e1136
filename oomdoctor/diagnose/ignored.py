"""What a log prints that is not the failure of its run, taken out before the root is chosen: an exception that a
report says was ignored (``role: ignored``), and the wrappers a process prints while it is being stopped by a signal
(``role: stopped``)."""
from __future__ import annotations

from bisect import bisect_right

from oomdoctor.diagnose.match import Match
from oomdoctor.diagnose.verdict import _is_cut_reading

IGNORED_WINDOW = 200         # how far an "ignored" report's traceback may run before its exception line


def drop_ignored(matches: list[Match]) -> list[Match]:
    """Take out the exceptions a report says were ignored (``role: ignored`` rules: CPython's unraisable report
    ``Exception ignored in: <function X.__del__ ...>``): the traceback after such a line, in the same process, and its
    exception line are not a failure of the run. Its frames (and a cut-traceback reading of them) are dropped, and
    so are the roots and cascades on the first error line after it, which ends the report; any other match ends it
    too (nothing is dropped from there on), and so does the end of a window of IGNORED_WINDOW lines (an exit-time
    traceback is short: a report whose exception line no rule reads must not swallow a later failure for long).
    A failure printed before the report, or after it, stays."""
    marks = [m for m in matches if m.rule.role == "ignored"]
    if not marks:
        return matches
    order = sorted(range(len(matches)), key=lambda i: matches[i].n)
    lines = [matches[i].n for i in order]
    drop: set[int] = set()
    for mark in marks:
        end: int | None = None
        for i in order[bisect_right(lines, mark.n):]:
            m = matches[i]
            if m.n - mark.n > IGNORED_WINDOW or (end is not None and m.n > end):
                break
            if m.line.process != mark.line.process:
                continue
            if m.rule.role == "frame" or (m.rule.role == "root" and _is_cut_reading(m)):
                drop.add(i)
            elif m.rule.role in ("root", "cascade"):
                drop.add(i)
                end = m.n                   # the exception line: every root/cascade on it goes, then the report ends
            else:
                break
    return [m for i, m in enumerate(matches) if i not in drop]


def drop_after_stop(matches: list[Match]) -> tuple[list[Match], str | None]:
    """The engine was stopped by a signal (``role: stopped``: vLLM's "[shutdown] EngineCore: trigger received
    signal=SIGINT"): the wrappers printed after that line (``EngineDeadError``, "output_handler failed": the output
    handler racing the engine's exit) are the shutdown's, not a cascade of a failure, and are taken out with every
    other reading of their lines (the generic exception rule's) and the cut tracebacks before them in their process.
    A root failure, before or after the stop, stays. Returns the matches kept and the note that says the run was
    stopped (None: no stop line)."""
    stop = min((m for m in matches if m.rule.role == "stopped"), key=lambda m: m.n, default=None)
    if stop is None:
        return matches, None
    sig = stop.groups.get("stop_signal")
    note = (f"the engine was stopped by a signal{f' ({sig})' if sig else ''} at line {stop.n}: what it printed "
            "while shutting down is not a failure")
    wrappers = [m for m in matches if m.rule.role == "cascade" and m.n > stop.n]
    lines = {m.n for m in wrappers}
    last: dict[str, int] = {}     # per process, its last wrapper line: the cut tracebacks before it are its own
    for m in wrappers:
        last[m.line.process] = max(m.n, last.get(m.line.process, 0))
    kept = [m for m in matches if not (m.n in lines and m.rule.role != "stopped")
            and not (m.n > stop.n and _is_cut_reading(m) and m.n < last.get(m.line.process, 0))]
    return kept, note
