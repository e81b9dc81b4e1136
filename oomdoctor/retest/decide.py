"""Retest, step 3: decide — is the original failure signature gone, did the engine serve, is performance within
tolerance; and when it still fails, which lever comes next (from what this attempt showed)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from oomdoctor import contract
from oomdoctor.card.records import Attempt, CardDict, Lever, NextLever, Workload
from oomdoctor.levers import engine as levermod
from oomdoctor.levers.chain import _value, chain_next_step
from oomdoctor.levers.flags import flags_for_change

if TYPE_CHECKING:
    from oomdoctor.diagnose.classify import Diagnosis
    from oomdoctor.retest.inconclusive import Inconclusive
    from oomdoctor.retest.launch import RunResult

PERF_TOLERANCE = 0.10
SPEED_COST_TOLERANCE = {"enforce_eager": 0.35, "cpu_offload_gb": 0.9, "max_num_batched_tokens": 0.25, "max_num_seqs": 0.5,
                        "cuda_graph_sizes": 0.25}
PASSING_PREDICTIONS = ("fits", "passes_startup_check")


def perf_check(perf: dict | None, baseline: dict | None, lever_id: str, tolerance: float) -> dict[str, Any]:
    if not perf:
        return {"status": "no_figures"}
    if not baseline:
        return {"status": "no_baseline", "note": "no performance baseline recorded; these figures become the baseline"}
    tol = max(tolerance, SPEED_COST_TOLERANCE.get(lever_id, 0.0))
    out: dict[str, Any] = {"status": "ok", "tolerance": tol, "checks": []}
    for key, higher_is_better in (("output_tokens_per_s", True), ("ttft_p50_s", False), ("latency_p50_s", False),
                                  ("latency_p99_s", False)):
        b, v = baseline.get(key), perf.get(key)
        if not b or v is None:
            continue
        ratio = v / b
        bad = ratio < 1 - tol if higher_is_better else ratio > 1 + tol
        out["checks"].append({"metric": key, "baseline": b, "value": v, "ratio": round(ratio, 3), "ok": not bad})
        if bad:
            out["status"] = "regressed"
    return out


def signature(card_or_class: Mapping[str, Any]) -> tuple[str, str | None]:
    c = card_or_class.get("classification", card_or_class)
    return c.get("class"), c.get("rule")


def twin_outcome(lever: Lever) -> str:
    """A twin attempt's outcome: the lever's own prediction, labelled as one."""
    outcome = lever.get("predicted", {}).get("outcome")
    return ("predicted_pass" if outcome in PASSING_PREDICTIONS
            else "predicted_fail" if outcome == "short" else "predicted_unknown")


def outcome(rr: "RunResult", gone: bool, new: "Diagnosis", pc: Mapping[str, Any],
            inconclusive: "Inconclusive | None" = None) -> str:
    if inconclusive is not None:
        return "inconclusive"
    if rr.timed_out:
        return "timeout"
    if gone and rr.served and not new.is_memory_failure:
        return "regressed" if pc.get("status") == "regressed" else "pass"
    return "fail"


def exit_code(outcome_: str) -> int:
    """retest's exit code for an attempt's outcome (docs/contract.md)."""
    if outcome_ == "pass":
        return contract.EXIT_OK
    if outcome_ == "inconclusive":
        return contract.EXIT_INCONCLUSIVE
    if outcome_.startswith("predicted_"):
        return contract.EXIT_PREDICTION
    return contract.EXIT_FAIL


def next_levers(card: CardDict, attempt: Attempt, new: "Diagnosis", gone: bool, wl_now: Workload,
                device: dict[str, Any]) -> list[Lever]:
    """The levers after a failed attempt: from the NEW failure when the original one is gone, else from the card's,
    with this run's free memory and without what was already tried."""
    moved_on = new.is_memory_failure and gone
    attempts_so_far = list(card.get("attempts") or []) + [attempt]
    src_class = new.klass if moved_on else card["classification"]["class"]
    src_nums = new.numbers if moved_on else card.get("numbers", {})
    allowed = (new.levers if moved_on else None) or None
    levers = levermod.propose(src_class, src_nums, wl_now, device, attempts_so_far, allowed=allowed,
                              version=(card.get("engine") or {}).get("version"))
    return chain_first(levers, attempt) if moved_on else levers


def chain_first(levers: list[Lever], attempt: Attempt) -> list[Lever]:
    """When this attempt confirmed its chain (the new failure is the one the chain expected), the lever the chain
    planned next goes first: the memory model walked the whole way to a pass, and the run agreed with its first step
    (a real H200 walk, P2 of incidents/h200-retest-2026-12-02/, spent a start on the ranking's choice instead)."""
    if (attempt.get("chain_check") or {}).get("status") != "confirmed":
        return levers
    step = chain_next_step(attempt.get("expected_chain") or {})
    i = next((i for i, lv in enumerate(levers) if step and lv["id"] == step["lever"]), None)
    if i is None or step is None:
        return levers
    out = [levers[i]] + levers[:i] + levers[i + 1:]
    out[0] = {**out[0], "basis": f"{out[0].get('basis', '')}; the last lever's chain planned it next".lstrip("; ")}
    if step["change"] and step["change"] != out[0].get("change") and set(step["change"]) == set(out[0]["change"]):
        # the chain's value, not the one re-read from the new failure's log: the model sized it to reach the start
        # (a real walk, R1a of incidents/h200-retest-2026-12-02-dawn/, ran the log's 300 MiB KV arena, which the
        # model itself said falls short, instead of the chain's 1.36 GiB)
        out[0] = {**out[0], "change": step["change"],
                  "predicted": {"outcome": "fits" if step["then_fits"] else "unknown", "source": "the last lever's chain"},
                  "arithmetic": [f"the last lever's chain: {attempt['expected_chain'].get('text', '')}"[:400]],
                  "cost": f"the value the last lever's chain sized ({_value(step['change'], step['lever'])}), "
                          f"{'with which the start fits' if step['then_fits'] else 'past the failure it names'}"}
        out[0].pop("flag", None)
        words = flags_for_change("vllm", out[0]["change"], None)
        if words:
            out[0]["flag"] = " ".join(words)
    for n, lv in enumerate(out, 1):
        lv["rank"] = n
    return out


def next_lever(levers: list[Lever]) -> NextLever | None:
    if not levers:
        return None
    lv = levers[0]
    return {"id": lv["id"], "change": lv["change"], "predicted": lv["predicted"], "cost": lv["cost"]}
