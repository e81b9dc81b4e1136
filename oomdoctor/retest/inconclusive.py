"""Retest, step 3a: was the run conclusive? A run that failed for a reason that is not the lever's — a non-memory
error (an import error, a missing file), a crash with no failure in its log, a timeout before any start-up phase —
says nothing about the lever. Such an attempt is ``inconclusive``: it carries the reason, what to fix and its
evidence lines, it does not count as a tried lever, its change is not kept, and the walk stops there.

A run whose log shows a memory failure is always conclusive (the original one: the lever did not fix it; another
one: the next lever comes from it), and so is a start that served the requests.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from oomdoctor import contract
from oomdoctor.levers.context import NOT_TRIED, counts_as_tried

__all__ = ["NOT_TRIED", "Inconclusive", "check", "counts_as_tried"]

if TYPE_CHECKING:
    from oomdoctor.diagnose.classify import Diagnosis
    from oomdoctor.retest.launch import RunResult

NO_MODULE_RE = re.compile(r"No module named '(?P<module>[\w.]{1,200})'")


@dataclass
class Inconclusive:
    reason: str                     # one line: why this run says nothing about the lever
    fix: str                        # one line: what to fix before running it again
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"reason": self.reason, "fix": self.fix, "evidence": self.evidence}


def _phase_index(phase: str | None) -> int:
    return contract.PHASES.index(phase) if phase in contract.PHASES[:-2] else -1


def _where(new: "Diagnosis", original_phase: str | None) -> str:
    reached = new.phase_reached
    if reached is None:
        return "before the engine reached any start-up phase"
    if 0 <= _phase_index(reached) < _phase_index(original_phase):
        return f"in phase {reached}, before {original_phase} where the original failure happened"
    return f"in phase {reached}"


def _root_text(new: "Diagnosis") -> str:
    if new.root is not None:
        return (new.root.line.msg or new.root.line.text).strip()[:240]
    return new.message.split(". ")[0][:240] if new.message else ""


def _module_fix(module: str, card: Mapping[str, Any]) -> str:
    """What to fix for a missing module: the env variable of the original run that kept the engine from importing it."""
    wl = card.get("workload") or {}
    env = wl.get("env") or {}
    stem = "_" + module.split(".")[0].upper()        # VLLM_USE_FLASHINFER_SAMPLER names flashinfer; VLLM_* is not 'vllm'
    named = [r for r in wl.get("env_revealed") or [] if stem in str(r.get("name", "")).upper()]
    missing = [r for r in named if env.get(r["name"]) != r["value"]]
    if missing:
        r = missing[0]
        return (f"the original run had {r['name']}={r['value']} (log line {r['line']}): set it in the card's "
                f"workload.env, or install '{module}' into the engine's Python")
    hint = [f"{k}={v}" for k, v in env.items() if stem in k.upper()]
    return (f"install '{module}' into the engine's Python"
            + (f" (the card's env already has {', '.join(hint)}: check that it reaches the engine)" if hint else
               ", or give the card's workload.env what the original run had"))


def _fix(new: "Diagnosis", text: str, card: Mapping[str, Any], timed_out: bool) -> str:
    if timed_out:
        return "check that the engine starts at all here (model path, imports, a visible GPU); raise --timeout if it is only slow"
    m = NO_MODULE_RE.search(text)
    if m:
        return _module_fix(m.group("module"), card)
    if new.klass == "cascade_only":
        return "the root cause was printed by another process: fetch the engine core's / worker's output"
    if new.klass == "not_memory":
        return "fix that error in the environment (the lever did not run far enough to be judged), then retest again"
    return "read the attempt's log: the engine stopped without printing why (a signal, a crash in native code?)"


def check(rr: "RunResult", new: "Diagnosis", card: Mapping[str, Any], timeout_s: float) -> Inconclusive | None:
    """None when the run decides the lever; else why it does not."""
    if new.is_memory_failure:
        return None
    original_phase = (card.get("classification") or {}).get("phase")
    ev = [e for e in new.evidence[:6] if isinstance(e, dict)]
    if rr.timed_out:
        if new.phase_reached is not None:
            return None                          # it got somewhere and hung there: a 'timeout', counted
        return Inconclusive(f"timed out after {timeout_s:.0f} s before the engine reached any start-up phase",
                            _fix(new, "", card, True), ev)
    if rr.served:
        return None
    text = _root_text(new)
    where = _where(new, original_phase)
    if new.klass == "not_memory":
        reason = f"not a memory failure: {text} (the run stopped {where})"
    elif new.klass == "cascade_only":
        reason = f"only wrapper errors in the log: {text} (the run stopped {where})"
    else:
        reason = f"the engine exited (status {rr.rc}) {where} without serving and without a failure in its log"
    return Inconclusive(reason, _fix(new, text, card, False), ev)
