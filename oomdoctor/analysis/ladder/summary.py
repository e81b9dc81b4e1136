"""The ladder's result: threshold, margin beyond weights + arena, the declared figure against it."""
from __future__ import annotations

import json
from typing import Any

from oomdoctor import contract
from oomdoctor.analysis.ladder.bisection import bracket_state, next_rung, pinned_arena
from oomdoctor.units import human_bytes


def _fmt(n: int | None) -> str:
    return "?" if n is None else f"{human_bytes(n)} ({n:,} B)"


def _free(r: dict) -> Any:
    """The free memory a rung measured, else its target."""
    return r.get("free_bytes") if r.get("free_bytes") is not None else r["target_free_bytes"]


def _status(ladder: dict) -> str:
    b, rungs = ladder["bracket"], ladder["rungs"]
    act, _, status = next_rung(rungs, b["low_bytes"], b["high_bytes"], ladder["precision_bytes"])
    if act == "run":
        status = "incomplete"
    if rungs and rungs[-1]["outcome"] == "error":
        status = "error"
    return status


def _message(res: dict, ladder: dict, st: dict, by_target: dict[int, dict], passing: dict | None,
             failing: dict | None) -> str:
    status, b, rungs = res["status"], ladder["bracket"], ladder["rungs"]
    if status == "measured":
        return (f"starts at ≥ {_fmt(res['passes_at_bytes'])} free, fails at ≤ {_fmt(res['fails_at_bytes'])}, "
                f"precision {human_bytes(ladder['precision_bytes'])}")
    if status == "no_start":
        everything = b.get("high_source", "").startswith("the free memory")
        msg = ("does not start even with everything free" if everything
               else f"does not start even at --high {_fmt(b['high_bytes'])}: the threshold is above it")
        if res["fails_at_bytes"] is not None:
            msg += f" (fails at {_fmt(res['fails_at_bytes'])})"
        return msg
    if status == "starts_at_low":
        p = by_target.get(st["hi"])
        return (f"starts even at the low end {_fmt(_free(p) if p else b['low_bytes'])}: the threshold is below it "
                "(lower --low to measure it)")
    if status == "error":
        e = rungs[-1]
        dec = e.get("decisive") or {}
        where = f", line {dec['line']}: {dec.get('text', '')[:200]}" if dec else ""
        return (f"rung {e['k']} at {_fmt(e['free_bytes'])} failed for a reason that is not memory "
                f"({e.get('class')}{where}); "
                "the ladder measures memory only: make the workload start with everything free, then run "
                "the ladder again (error rungs are not used)")
    lo_s = _fmt(res["fails_at_bytes"]) if failing else f"{_fmt(st['lo'])} (assumed: low end)"
    hi_s = _fmt(res["passes_at_bytes"]) if passing else f"{_fmt(st['hi'])} (assumed: high end)"
    return f"incomplete: between {lo_s} and {hi_s} so far; run the same command again to resume"


def _notes(res: dict, st: dict, rungs: list[dict], P: int) -> None:
    if st["inconsistent_fails"]:
        res["inconsistent"] = (f"{len(st['inconsistent_fails'])} rung(s) failed at or above the lowest passing rung "
                               f"({', '.join(human_bytes(x) for x in st['inconsistent_fails'])}): the start is not "
                               "deterministic at this precision")
    if any(r["outcome"] == "timeout" for r in rungs):
        res.setdefault("notes", []).append("a rung that timed out counts as a failure (the result is conservative): "
                                           "re-run with a longer --timeout to be sure")
    drift = [r for r in rungs if r.get("free_bytes") is not None and abs(r["free_bytes"] - r["target_free_bytes"]) > P]
    if drift:
        res.setdefault("notes", []).append(
            f"{len(drift)} rung(s) started with free memory further than the precision from their target (e.g. rung "
            f"{drift[0]['k']}: target {human_bytes(drift[0]['target_free_bytes'])}, NVML {human_bytes(drift[0]['free_bytes'])})")


def summarize(ladder: dict, card: dict, workload: dict, declared: dict | None) -> dict:
    rungs = ladder["rungs"]
    b = ladder["bracket"]
    P = ladder["precision_bytes"]
    st = bracket_state(rungs, b["low_bytes"], b["high_bytes"])
    status = _status(ladder)
    by_target: dict[int, dict] = {}
    for r in rungs:
        if r["outcome"] != "error":
            by_target.setdefault(r["target_free_bytes"], r)
    passing = by_target.get(st["hi"]) if st["hi_known"] else None
    failing = by_target.get(st["lo"]) if st["lo_known"] else None
    res: dict[str, Any] = {"status": status, "precision_bytes": P,
                           "passes_at_bytes": _free(passing) if passing else None,
                           "passes_at_target_bytes": passing["target_free_bytes"] if passing else None,
                           "fails_at_bytes": _free(failing) if failing else None,
                           "fails_at_target_bytes": failing["target_free_bytes"] if failing else None,
                           "threshold_bytes": _free(passing) if passing and status == "measured" else None}
    if passing and failing:
        res["interval_bytes"] = res["passes_at_bytes"] - res["fails_at_bytes"]
    res["message"] = _message(res, ladder, st, by_target, passing, failing)
    _notes(res, st, rungs, P)
    res["margin"] = margin(res, passing, card, workload)
    if declared:
        res["declared"] = compare_declared(res, declared)
    return res


def margin(res: dict, passing: dict | None, card: dict, workload: dict) -> dict:
    """threshold - weights - pinned arena: what the start needed beyond what it holds on purpose."""
    led = (passing or {}).get("ledger") or {}
    w = led.get("weights_bytes")
    wsrc = "the passing rung's log (engine figure)"
    if not w:
        w = (card.get("numbers") or {}).get("weights_bytes")
        wsrc = "the card's numbers (engine figure)"
    arena, asrc = pinned_arena(card, workload)
    if not arena and led.get("kv_cache_memory_bytes"):
        arena, asrc = int(led["kv_cache_memory_bytes"]), "the passing rung's log"
    out: dict[str, Any] = {"weights_bytes": int(w) if w else None, "weights_source": wsrc if w else None,
                           "arena_bytes": arena, "arena_source": asrc or None}
    if not w:
        out["note"] = "no weights figure in the card or the rung logs: no margin"
        return out
    if not arena:
        out["note"] = "the KV arena is not pinned (the engine sizes KV from the memory it finds): no fixed margin"
        return out
    base = int(w) + int(arena)
    out["weights_plus_arena_bytes"] = base
    if res.get("threshold_bytes") is not None:
        out["margin_bytes"] = res["threshold_bytes"] - base
        out["at_most_bytes"] = res["threshold_bytes"] - base
    if res.get("fails_at_bytes") is not None:
        out["more_than_bytes"] = res["fails_at_bytes"] - base
    if "margin_bytes" in out:
        more = f"more than {human_bytes(out['more_than_bytes'])} and " if "more_than_bytes" in out else ""
        out["message"] = (f"weights {human_bytes(w)} + arena {human_bytes(arena)} = {human_bytes(base)}; beyond that the "
                          f"start needed {more}at most {human_bytes(out['at_most_bytes'])} "
                          f"(margin {out['margin_bytes']:,} B)")
    return out


def compare_declared(res: dict, declared: dict) -> dict:
    d = int(declared["bytes"])
    out: dict[str, Any] = {"bytes": d, "source": declared.get("source")}
    thr, fail = res.get("threshold_bytes"), res.get("fails_at_bytes")
    if thr is None:
        if res["status"] == "no_start" and fail is not None and d <= fail:
            out.update(verdict="under", by_bytes=None,
                       message=f"declared {_fmt(d)}, but it fails even at {_fmt(fail)}: under-declared")
        else:
            out.update(verdict="unknown", message=f"declared {_fmt(d)}: no measured threshold to compare with")
        return out
    if d < thr and (fail is None or d <= fail):
        out.update(verdict="under", by_bytes=thr - d,
                   message=f"under-declared by {thr - d:,} bytes ({human_bytes(thr - d)}): declared {_fmt(d)}, "
                           f"starts at ≥ {_fmt(thr)}")
    elif d < thr:
        out.update(verdict="within_precision", by_bytes=thr - d,
                   message=f"declared {_fmt(d)} lies between the failing rung {_fmt(fail)} and the passing one "
                           f"{_fmt(thr)}: not decidable at this precision")
    else:
        out.update(verdict="over", by_bytes=d - thr,
                   message=f"over-declared by {d - thr:,} bytes ({human_bytes(d - thr)}): declared {_fmt(d)}, "
                           f"starts at ≥ {_fmt(thr)}")
    return out


def exit_code(ladder: dict) -> int:
    res = ladder.get("result") or {}
    if res.get("status") != "measured":
        return contract.EXIT_FAIL
    if (res.get("declared") or {}).get("verdict") == "under":
        return contract.EXIT_FAIL
    return contract.EXIT_OK


def to_json(ladder: dict, card_path: str | None) -> str:
    return json.dumps({"card": card_path, **ladder}, indent=2, default=str)
