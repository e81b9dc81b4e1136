"""The free-memory ladder: measure, don't estimate, the smallest free memory at which a workload starts
AND serves its requests.

``run_ladder(card_path, runner=...)`` bisects over the free memory a ballast leaves on the GPU:

- bracket ``[low, high]``: given (``--low/--high``) or derived — high = the device's free memory now,
  low = the card's arithmetic (weights + the pinned KV arena; a start with less than what it must hold
  cannot succeed), else a configurable floor;
- each rung targets a point of the grid ``low + i x precision`` (the midpoint of what is still open,
  rounded to the precision) and records: the free memory NVML measured after the ballast, pass/fail,
  the class of the rung's log, its decisive line and that line's numbers;
- the bracket ends are started only when they decide the answer: ``high`` when every rung below it failed
  ("does not start even with everything free"), ``low`` when every rung above it passed. So an interior
  threshold takes exactly ceil(log2((high - low) / precision)) starts;
- every rung is written to the card (top-level ``ladder``) as soon as it is measured; a ladder with the
  same workload fingerprint resumes from the recorded rungs (they narrow the bracket, none is re-run); a
  different fingerprint (or device, or ballast mode) starts afresh and says so.

The runner is injectable: a function of the target free bytes returning ``True``/``False`` or a rung dict
(``outcome``: pass/fail/timeout, optionally ``free_bytes``, ``class``, ``decisive`` ...). The default one,
:class:`EngineRunner`, runs the card's workload through :func:`oomdoctor.retest.run.run_engine` with a ballast
leaving the rung's target free (and the target in env ``OOMDOCTOR_LADDER_FREE_BYTES``).

Modules: ``identity`` (what is measured), ``bisection`` (bracket and next rung), ``runner`` (the default rung
runner), ``store`` (writing and resuming), ``summary`` (result, margin, declared), ``profile`` (the declared
figure), ``core`` (run_ladder).
"""
from oomdoctor.analysis.ladder.bisection import (DEFAULT_FLOOR, DEFAULT_PRECISION, bracket_state, derive_bracket,
                                                 expected_starts, next_rung, pinned_arena)
from oomdoctor.analysis.ladder.core import LADDER_FORMAT, run_ladder
from oomdoctor.analysis.ladder.identity import NONE_LEVER, card_for_command, workload_identity
from oomdoctor.analysis.ladder.profile import read_profile
from oomdoctor.analysis.ladder.runner import FREE_ENV, LEDGER_KEYS, EngineRunner, Runner, decisive_line
from oomdoctor.analysis.ladder.summary import compare_declared, exit_code, margin, summarize, to_json

__all__ = ["DEFAULT_FLOOR", "DEFAULT_PRECISION", "FREE_ENV", "LADDER_FORMAT", "LEDGER_KEYS", "NONE_LEVER",
           "EngineRunner", "Runner", "bracket_state", "card_for_command", "compare_declared", "decisive_line",
           "derive_bracket", "exit_code", "expected_starts", "margin", "next_rung", "pinned_arena", "read_profile",
           "run_ladder", "summarize", "to_json", "workload_identity"]
