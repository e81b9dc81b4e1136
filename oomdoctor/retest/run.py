"""Stage 7 — retest: the SAME workload, ONE lever, the real engine, performance rechecked.

``retest(card_path, lever=..., ...)``:
1. picks exactly one lever (``--lever ID``, ``--next`` = the first one not tried yet, default the card's #1);
2. builds the workload: the recorded one + the changes of earlier attempts that made their own failure
   go away + this lever's change (as an engine flag / LLM kwarg, an env var, or removing a co-tenant)
   — ``oomdoctor.retest.plan``;
3. checks that GPU memory is back to the baseline (refuses with the reason if it is not), starts the
   ballast that reproduces the recorded free memory, starts the engine in its own process group with a
   timeout, tees its log, sends the recorded requests, and ends every process it started (success,
   failure, timeout, SIGINT, SIGTERM) — ``oomdoctor.retest.launch``;
4. diagnoses the new log and decides: the original failure signature is gone, the engine served the
   requests, and performance is within tolerance of the baseline (or of the cost the lever announced)
   — ``oomdoctor.retest.decide``;
5. appends the attempt to the card atomically, with the next lever if it still fails.
``--engine twin`` runs no engine: the lever engine's arithmetic predicts the outcome, labelled as such.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

from oomdoctor import __version__
from oomdoctor.card import store as cardmod
from oomdoctor.card.fingerprint import effective_config, fingerprint
from oomdoctor.card.records import Attempt, CardDict, Lever, Workload
from oomdoctor.device import nvml as devmod
from oomdoctor.errors import BadInput, OomdoctorError
from oomdoctor.redact import redact_argv
from oomdoctor.levers.chain import check_chain, expected_chain, first_follow_up
from oomdoctor.retest import inconclusive
from oomdoctor.retest.decide import (PERF_TOLERANCE, SPEED_COST_TOLERANCE, exit_code, next_lever, next_levers, outcome,
                                     perf_check, signature, twin_outcome)
from oomdoctor.retest.launch import RESULT_RE, RunResult, device_slug, free_port, gpu_state, launch_argv, run_engine
from oomdoctor.retest.plan import (UNAPPLIABLE, Plan, apply_change, choose_lever, kept_changes, lever_needs_hardware, plan,
                                   target_free_from_card)
from oomdoctor.retest import runfile
from oomdoctor.retest.procs import wait_memory_back
from oomdoctor.retest.trust import require_trusted, safe_env, untrusted
from oomdoctor.units import human_bytes

__all__ = ["PERF_TOLERANCE", "RESULT_RE", "SPEED_COST_TOLERANCE", "UNAPPLIABLE", "Plan", "RunResult", "apply_change",
           "choose_lever", "device_slug", "free_port", "kept_changes", "launch_argv", "perf_check", "plan", "retest",
           "run_engine", "signature", "summary_rows", "target_free_from_card"]

GiB = 1 << 30
_gpu_state = gpu_state            # the name analysis/ladder.py imports


def _new_attempt(card: CardDict, lever: Lever, p: Plan, mode: str) -> tuple[Attempt, str]:
    """The attempt record before anything runs, and the effective config's fingerprint."""
    eng = card.get("engine") or {}
    eff = effective_config(eng.get("name") or "unknown", eng.get("version"), p.workload.get("model"),
                           p.workload.get("model_revision"), p.workload.get("engine_args") or {}, p.workload.get("env") or {})
    fp = fingerprint(eff)
    attempt: Attempt = {
        "at": cardmod.now_iso(), "lever": lever["id"], "change": lever.get("change", {}),
        "base_changes": p.base_changes, "engine": {"name": eng.get("name") or "unknown", "version": eng.get("version"), "mode": mode},
        "config_fingerprint": fp, "effective_config": eff, "argv": redact_argv(p.argv),
        "emulate_free_bytes": p.emulate_free_bytes, "oomdoctor_version": __version__, "notes": list(p.description),
    }
    return attempt, fp


def _twin(card_path: Path, attempt: Attempt, lever: Lever, p: Plan) -> tuple[int, Attempt, CardDict]:
    attempt["outcome"] = twin_outcome(lever)
    follow_up = first_follow_up(attempt.get("expected_chain") or {})
    if follow_up and follow_up != "fits":
        attempt["outcome"] = "predicted_fail"
        attempt["notes"].append(f"the chain predicts {follow_up} after this lever: it alone will not make the start pass")
    elif follow_up == "fits":
        attempt["outcome"] = "predicted_pass"
    attempt["notes"].append("PREDICTION by the memory model (twin engine), not a run of the real engine")
    attempt["signature_gone"] = None
    attempt["served"] = None
    attempt["target_device"] = p.target_device
    cardmod.append_attempt(card_path, attempt)
    after = cardmod.load_dict(card_path)
    written = (after.get("attempts") or [attempt])[-1]
    return exit_code(written["outcome"]), written, after     # 4: a prediction, never a pass


def _ran_for_real(card: CardDict, fp: str, p: Plan) -> Attempt | None:
    """The last real attempt that ran this very configuration (same fingerprint, same emulated free memory, same
    target device) to a verdict: a twin prediction of the same start would only repeat it, less well."""
    for a in reversed(card.get("attempts") or []):
        if ((a.get("engine") or {}).get("mode") == "real" and a.get("config_fingerprint") == fp
                and a.get("outcome") in ("pass", "fail", "regressed")
                and a.get("emulate_free_bytes") == p.emulate_free_bytes
                and (p.target_device is None or a.get("target_device") == p.target_device)):
            return a
    return None


def _memory_back(st: dict[str, Any], gpu_index: int, memory_timeout_s: float, progress: Callable[[str], None],
                 baseline_free: int | None) -> int | None:
    """Refuse to run on a GPU that others still use (unless OOMDOCTOR_ALLOW_BUSY_GPU); the free memory to return to."""
    g = next((g for g in st["gpus"] if g["index"] == gpu_index), None)
    if g is None:
        raise BadInput(f"--gpu {gpu_index}: no such GPU (NVML sees {len(st['gpus'])})")
    expected = g["total_bytes"] - (2 * GiB)
    if g["free_bytes"] >= expected or os.environ.get("OOMDOCTOR_ALLOW_BUSY_GPU"):
        return baseline_free
    holders = ", ".join(f"pid {x['pid']} ({human_bytes(x.get('used_bytes') or 0)})" for x in g.get("processes", []))
    ok, last = wait_memory_back(expected, lambda: gpu_state(gpu_index)[1], timeout_s=memory_timeout_s, progress=progress)
    if not ok:
        raise OomdoctorError(f"GPU {gpu_index} has only {human_bytes(last)} free of {human_bytes(g['total_bytes'])} "
                             f"(held: {holders or 'unknown holders'}); refusing to run until memory is back "
                             "(set OOMDOCTOR_ALLOW_BUSY_GPU=1 to run anyway)")
    return last


def _run_and_wait(p: Plan, log_path: Path, gpu_index: int, timeout_s: float, progress: Callable[[str], None],
                  watch: Callable[[str], str | None], baseline_free: int | None, memory_timeout_s: float) -> RunResult:
    try:
        return run_engine(p, log_path, gpu_index, timeout_s, progress, watch)
    finally:
        if baseline_free is not None:
            ok, last = wait_memory_back(baseline_free, lambda: gpu_state(gpu_index)[1], timeout_s=memory_timeout_s,
                                        progress=progress)
            if not ok:
                progress(f"warning: GPU memory not back after the run ({human_bytes(last)} free, baseline "
                         f"{human_bytes(baseline_free)})")


def _workload_now(p: Plan, rr: RunResult, st: dict[str, Any], gpu_index: int, n_attempt: int) -> Workload:
    """The workload as this run really had it (its free memory, not what the card recorded)."""
    wl_now: Workload = {**p.workload}
    if rr.free_at_start is not None:
        wl_now["free_at_start_bytes"] = rr.free_at_start
        wl_now["free_at_start_source"] = f"NVML before attempt {n_attempt}"
        g = next((g for g in st.get("gpus", []) if g["index"] == gpu_index), None)
        if g:
            wl_now["gpu_total_bytes"] = g["total_bytes"]
    return wl_now


def _real(card_path: Path, card: CardDict, attempt: Attempt, lever: Lever, p: Plan, gpu_index: int, timeout_s: float,
          tolerance: float, progress: Callable[[str], None], memory_timeout_s: float) -> tuple[int, Attempt, CardDict]:
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.rules import default_rules

    eng = card.get("engine") or {}
    st, baseline_free, gpu_name = gpu_state(gpu_index)
    attempt["device_before"] = st
    attempt["gpu"] = gpu_name
    attempt["target_device"] = p.target_device or device_slug(gpu_name)
    if st.get("status") == "captured":
        baseline_free = _memory_back(st, gpu_index, memory_timeout_s, progress, baseline_free)
    else:
        attempt["notes"].append(f"device state unavailable ({st.get('reason')}): memory could not be checked before/after")
    run_dir = Path(card_path).with_suffix("")
    run_dir = run_dir.parent / (run_dir.name + ".runs")
    n_prev = len(card.get("attempts") or [])
    ruleset = default_rules()
    t_start = time.monotonic()
    with runfile.active(run_dir, progress):
        log_path = runfile.fresh_log(run_dir, f"attempt-{n_prev + 1}-{lever['id']}")
        rr = _run_and_wait(p, log_path, gpu_index, timeout_s, progress,
                           _phase_watcher(ruleset, eng.get("name") or "vllm"), baseline_free, memory_timeout_s)
    attempt["duration_s"] = round(time.monotonic() - t_start, 1)
    attempt["notes"] += rr.notes
    attempt["log_path"] = os.path.relpath(log_path, Path(card_path).parent)
    attempt["log_sha256"] = _sha(log_path)
    if rr.ballast:
        attempt["ballast"] = {k: rr.ballast.get(k) for k in ("target_free", "held_bytes", "nvml_free", "nvml_total")}
    new = diagnose_file(log_path, ruleset, engine=eng.get("name"))
    attempt["classification"] = {**new.classification(), "basis": new.phase_basis}
    attempt["evidence"] = new.evidence[:6]
    attempt["served"] = rr.served
    attempt["phase_reached"] = new.phase_reached
    return _decide(card_path, card, attempt, lever, p, rr, new, (st, gpu_index, n_prev + 1), timeout_s, tolerance)


def _decide(card_path: Path, card: CardDict, attempt: Attempt, lever: Lever, p: Plan, rr: RunResult, new: Any,
            where: tuple[dict[str, Any], int, int], timeout_s: float, tolerance: float) -> tuple[int, Attempt, CardDict]:
    """The verdict on the lever (or why there is none), the next lever, the chain check; the attempt appended."""
    st, gpu_index, n = where
    gone = (new.klass, new.rule) != signature(card)
    attempt["signature_gone"] = gone
    baseline = (card.get("workload") or {}).get("baseline")
    pc = perf_check(rr.perf, baseline, lever["id"], tolerance)
    attempt["perf"] = rr.perf
    attempt["perf_check"] = pc
    inc = inconclusive.check(rr, new, card, timeout_s)
    attempt["outcome"] = outcome(rr, gone, new, pc, inc)
    cc = check_chain(attempt.get("expected_chain"), attempt["outcome"], new.klass)
    if cc:
        attempt["chain_check"] = cc
    updates: dict[str, Any] = {}
    if inc is not None:
        attempt["inconclusive"] = inc.record()
        attempt["next_lever"] = None
        attempt["notes"].append(f"INCONCLUSIVE: {inc.reason}; not a verdict on {lever['id']}, which stays untried. "
                                f"Fix: {inc.fix}")
    elif attempt["outcome"] != "pass" and lever["id"] != "none":
        nxt = next_levers(card, attempt, new, gone, _workload_now(p, rr, st, gpu_index, n), st)
        attempt["next_lever"] = next_lever(nxt)
        if new.is_memory_failure and gone:
            attempt["notes"].append(f"the original failure is gone; a new one appeared: {new.klass} ({new.rule})"
                                    + (" — the follow-up the chain predicted" if cc and cc["status"] == "confirmed" else ""))
        updates["levers"] = nxt or card.get("levers", [])
    elif attempt["outcome"] == "pass" and rr.perf and not baseline:
        updates["workload"] = {**card["workload"], "baseline": {k: v for k, v in rr.perf.items() if isinstance(v, (int, float))}
                               | {"from_attempt": n}}
    cardmod.append_attempt(card_path, attempt, updates)
    after = cardmod.load_dict(card_path)
    written = (after.get("attempts") or [attempt])[-1]      # as written: redacted (a log line may hold a token)
    return exit_code(written["outcome"]), written, after


def retest(card_path: Path, lever_id: str | None = None, next_: bool = False, dry_run: bool = False,
           engine: str = "auto", emulate: str | None = None, no_emulate: bool = False, gpu_index: int = 0,
           timeout_s: float = 900.0, tolerance: float = PERF_TOLERANCE, progress: Callable[[str], None] | None = None,
           memory_timeout_s: float = 120.0, trust_card: bool = False) -> tuple[int, Any, CardDict]:
    """Returns (exit code, attempt — or the dry run's plan —, card dict after the attempt).

    A real run executes only what oomdoctor derived itself unless ``trust_card`` (``--trust-card``): see
    :mod:`oomdoctor.retest.trust`."""
    say: Callable[[str], None] = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    card: CardDict = cardmod.load_dict(card_path)
    mode = engine
    if mode == "auto":
        mode = "real" if _real_engine_available(card) else "twin"
    device_now = _device_now()
    lever = choose_lever(card, lever_id, next_, device_now, mode)
    p = plan(card, lever, emulate, gpu_index, no_emulate)        # a card that cannot run: one error line, nothing before
    for lv in card.get("levers") or []:
        why = lever_needs_hardware(lv, card, device_now)
        if why:
            say(f"never run here (needs other hardware): {lv['id']} — {why}")
    p.env, held_back = safe_env(p.env, trust_card)
    if held_back:
        p.description.append(f"environment from the card not passed to the engine (--trust-card passes it): "
                             f"{', '.join(held_back)}")
    attempt, fp = _new_attempt(card, lever, p, mode)
    chain = expected_chain(card, lever, p.base_changes) if lever["id"] != "none" else None
    if chain:
        attempt["expected_chain"] = chain
    for d in p.description:
        say(d)
    say(f"lever #{lever.get('rank', '-')}: {lever['id']} {json.dumps(lever.get('change', {}))} — predicted: "
        f"{lever.get('predicted', {}).get('outcome', '?')}; cost: {lever.get('cost', '')}")
    if chain:
        say(f"expected: {chain['text']}")
    say(f"engine mode: {mode}; config fingerprint {fp[:19]}…")
    say(f"command: {shlex.join(redact_argv(p.argv))}")
    proven = _ran_for_real(card, fp, p) if mode == "twin" else None
    if proven is not None:          # the real engine has the answer: a prediction of it adds nothing to the card
        say(f"attempt {proven.get('n')} ran this configuration on the real engine ({proven.get('outcome')}, "
            f"{proven.get('at')}): that is the answer, not a prediction; nothing appended")
        return exit_code(str(proven.get("outcome"))), {**proven, "twin_not_run": True}, card
    if dry_run:
        return 0, {"dry_run": True, "lever": lever["id"], "change": lever.get("change", {}), "argv": redact_argv(p.argv),
                   "description": p.description, "config_fingerprint": fp, "mode": mode,
                   "expected_chain": chain, "needs_trust_card": untrusted(p.workload)}, card
    cardmod.refuse_special(Path(card_path), "card")        # the attempt must be writable back: refuse before a run
    if mode == "twin":
        return _twin(card_path, attempt, lever, p)
    require_trusted(p.workload, trust_card)
    return _real(card_path, card, attempt, lever, p, gpu_index, timeout_s, tolerance, say, memory_timeout_s)


def _sha(p: Path) -> str | None:
    from oomdoctor.diagnose.read import file_sha256

    try:
        return file_sha256(p)
    except OomdoctorError:
        return None


def _device_now() -> dict[str, Any]:
    """This machine's GPUs (no processes): what a lever needing more GPUs is checked against when the card has none."""
    return devmod.capture(with_processes=False)


def _real_engine_available(card: CardDict) -> bool:
    import importlib.util

    launcher = (card.get("workload") or {}).get("launcher")
    if launcher == "command":
        return True
    return importlib.util.find_spec("vllm") is not None and devmod.capture(with_processes=False).get("status") == "captured"


def _phase_watcher(ruleset: Any, engine: str) -> Callable[[str], str | None]:
    from oomdoctor.diagnose.parse import parse_line

    ms = [r for r in ruleset.rules if r.engine == engine and r.role == "milestone"]

    def watch(line: str) -> str | None:
        pl = parse_line(0, line)
        for r in ms:
            if r.match(pl):
                return r.reaches
        return None

    return watch


def summary_rows(card: CardDict) -> list[dict[str, Any]]:
    rows = []
    for a in card.get("attempts") or []:
        perf = a.get("perf") or {}
        rows.append({"n": a["n"], "lever": a["lever"], "change": a.get("change"), "mode": a["engine"].get("mode"),
                     "outcome": a["outcome"], "class": (a.get("classification") or {}).get("class"),
                     "duration_s": a.get("duration_s"), "tok_s": perf.get("output_tokens_per_s"),
                     "target": a.get("target_device")})
    return rows
