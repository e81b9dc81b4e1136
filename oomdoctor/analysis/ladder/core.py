"""run_ladder: derive the bracket, resume or start afresh, run rung after rung, write each, summarize."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, cast

from oomdoctor import __version__
from oomdoctor.analysis.ladder.bisection import (DEFAULT_FLOOR, DEFAULT_PRECISION, _gpu, bracket_state,
                                                 derive_bracket, expected_starts, next_rung)
from oomdoctor.analysis.ladder.identity import workload_identity
from oomdoctor.analysis.ladder.runner import EngineRunner, Runner, _normalize
from oomdoctor.analysis.ladder.store import _resume_refusal, _Store
from oomdoctor.analysis.ladder.summary import _fmt, summarize
from oomdoctor.card import store as cardmod
from oomdoctor.card.records import CardDict
from oomdoctor.errors import BadInput
from oomdoctor.units import human_bytes

LADDER_FORMAT = 1
Progress = Callable[[str], None]


def _device_record(g: dict | None, device: dict | None, gpu_index: int) -> dict[str, Any]:
    if g:
        return {"index": gpu_index, "name": g.get("name"), "total_bytes": g.get("total_bytes"),
                "free_at_ladder_start_bytes": g.get("free_bytes")}
    return {"index": gpu_index, "status": (device or {}).get("status", "unavailable"),
            "reason": (device or {}).get("reason", "")}


def _resume(ladder: dict, old: dict, ident: dict, fresh: bool, now: str, progress: Progress) -> None:
    """Take over the recorded rungs of the same workload, or say why they are not used."""
    L, H = ladder["bracket"]["low_bytes"], ladder["bracket"]["high_bytes"]
    why = _resume_refusal(old, ladder, fresh)
    if why is None:
        ladder["rungs"] = list(old.get("rungs") or [])
        ladder["started_at"] = old.get("started_at", now)
        ladder["previous"] = old.get("previous") or []
        st = bracket_state(ladder["rungs"], L, H)
        msg = (f"resuming: {len(ladder['rungs'])} rung(s) already measured for workload "
               f"{ident['workload_fingerprint'][:19]}…; open interval now {human_bytes(st['lo'])}"
               f"{'' if st['lo_known'] else ' (assumed)'} – {human_bytes(st['hi'])}{'' if st['hi_known'] else ' (assumed)'}")
        ladder["notes"] = (list(old.get("notes") or []) + [msg])[-20:]
        progress(msg)
        return
    msg = f"starting afresh: {why}; the {len(old.get('rungs') or [])} recorded rung(s) are not used"
    progress(msg)
    ladder["notes"].append(msg)
    ladder["previous"] = (old.get("previous") or [])[-4:] + [{
        "workload_fingerprint": old.get("workload_fingerprint"), "device": old.get("device"),
        "rungs": len(old.get("rungs") or []), "result": old.get("result"), "replaced_at": now, "reason": why}]


def _runs_dir(card_path: str | Path | None, runs_dir: str | Path | None, now: str) -> Path:
    if runs_dir:
        return Path(runs_dir)
    if card_path is not None:
        rd = Path(card_path).with_suffix("")
        return rd.parent / (rd.name + ".runs")
    from oomdoctor.paths import default_incidents_dir

    return default_incidents_dir() / f"ladder-{now.replace(':', '')}.runs"


def _rung(runner: Runner, k: int, role: str, target: int, card_path: str | Path | None) -> dict[str, Any]:
    """Run one rung and turn the runner's answer into the recorded rung."""
    t0 = time.monotonic()
    res = _normalize(runner(int(target)), int(target))
    rung = {"k": k, "at": cardmod.now_iso(), "role": role, "target_free_bytes": int(target),
            "free_bytes": int(res["free_bytes"]), "free_source": res.get("free_source", "target"),
            "outcome": res["outcome"], "class": res.get("class"), "rule": res.get("rule"),
            "decisive": res.get("decisive"), "served": res.get("served"),
            "duration_s": round(time.monotonic() - t0, 1)}
    for key in ("ledger", "log_path", "ballast", "rc"):
        if res.get(key) is not None:
            rung[key] = res[key]
    if card_path is not None and rung.get("log_path"):
        rung["log_path"] = os.path.relpath(rung["log_path"], Path(card_path).parent)
    if res.get("notes"):
        rung["notes"] = list(res["notes"])
    return rung


def _climb(ladder: dict, runner: Runner, store: _Store, card_path: str | Path | None, max_starts: int | None,
           progress: Progress) -> None:
    """Rung after rung until the bisection is done, --max-starts is reached or a rung fails for another reason."""
    L, H = ladder["bracket"]["low_bytes"], ladder["bracket"]["high_bytes"]
    session = 0
    t_ladder = time.monotonic()
    while True:
        act, target, role = next_rung(ladder["rungs"], L, H, ladder["precision_bytes"])
        if act == "done" or target is None:
            break
        if max_starts is not None and session >= max_starts:
            ladder["notes"].append(f"stopped after --max-starts {max_starts}; run again to resume")
            break
        k = len(ladder["rungs"]) + 1
        progress(f"rung {k} ({role}): target {_fmt(target)} free …")
        rung = _rung(runner, k, role, target, card_path)
        session += 1
        ladder["rungs"].append(rung)
        ladder["starts"] = len(ladder["rungs"])
        ladder["updated_at"] = cardmod.now_iso()
        store.write(ladder)
        dec = rung.get("decisive") or {}
        cls = f" ({rung['class']}" + (f", line {dec['line']}" if dec.get("line") else "") + ")" if rung.get("class") else ""
        progress(f"rung {k}: free {_fmt(rung['free_bytes'])} → {rung['outcome']}{cls}, "
                 f"{rung['duration_s']:.1f} s (ladder {time.monotonic() - t_ladder:.0f} s)")
        if rung["outcome"] == "error":
            ladder["notes"].append(f"rung {k} failed for a reason that is not memory ({rung.get('class')}"
                                   f"{', line ' + str(dec['line']) if dec.get('line') else ''}): stopped")
            break


def _interrupted(ladder: dict, store: _Store, e: BaseException) -> None:
    ladder["status"] = "interrupted"
    ladder["notes"].append(f"interrupted after {len(ladder['rungs'])} rung(s) ({type(e).__name__}); "
                           "run the same command again to resume")
    ladder["updated_at"] = cardmod.now_iso()
    try:
        store.write(ladder)
    except BaseException:  # noqa: BLE001 - the rungs are already on disk; never mask the interruption
        pass


def _finish(ladder: dict, card: dict, workload: dict, declared: dict | None) -> None:
    ladder["result"] = summarize(ladder, card, workload, declared)
    # the pass/fail points at the top of the section, under the names oomdoctor.profiles reads from a receipt
    ladder["pass_free_bytes"] = ladder["result"]["threshold_bytes"]
    ladder["fail_free_bytes"] = ladder["result"]["fails_at_bytes"] if ladder["result"]["threshold_bytes"] else None
    ladder["status"] = {"incomplete": "incomplete", "error": "stopped"}.get(ladder["result"]["status"], "done")
    ladder["updated_at"] = cardmod.now_iso()


def _load_card(card_path: str | Path | None, card: dict | None, precision: int | None,
               max_starts: int | None) -> dict:
    if precision is None or precision <= 0:
        raise BadInput(f"--precision must be positive (got {precision})")
    if max_starts is not None and max_starts < 1:
        raise BadInput("--max-starts must be at least 1")
    if card_path is not None:
        card = dict(cardmod.load_dict(card_path))
    if card is None:
        raise BadInput("no card and no command: nothing to measure")
    return card


def _new_ladder(ident: dict, card: dict, g: dict | None, device: dict | None, gpu_index: int, ballast: bool,
                injected: bool, precision: int, bracket: tuple[int, str, int, str], now: str) -> dict[str, Any]:
    from oomdoctor.retest.run import device_slug

    eng = card.get("engine") or {}
    L, lsrc, H, hsrc = bracket
    return {
        "format": LADDER_FORMAT, "status": "running", "oomdoctor_version": __version__,
        "workload_fingerprint": ident["workload_fingerprint"], "config_fingerprint": ident["config_fingerprint"],
        "effective_config": ident["effective_config"], "base_changes": ident["plan"].base_changes,
        "engine": eng.get("name"), "engine_version": eng.get("version"),
        "device": device_slug(g.get("name")) if g else None, "device_detail": _device_record(g, device, gpu_index),
        "ballast": bool(ballast), "runner": "injected" if injected else "engine",
        "precision_bytes": int(precision),
        "bracket": {"low_bytes": L, "low_source": lsrc, "high_bytes": H, "high_source": hsrc},
        "started_at": now, "updated_at": now, "starts": 0, "rungs": [], "notes": [],
    }


def run_ladder(card_path: str | Path | None = None, *, card: dict | None = None, runner: Runner | None = None,
               low: int | None = None, high: int | None = None, precision: int = DEFAULT_PRECISION,
               floor: int = DEFAULT_FLOOR, declared: dict | None = None, gpu_index: int = 0, timeout_s: float = 900.0,
               memory_timeout_s: float = 120.0, device: dict | None = None, ballast: bool = True, fresh: bool = False,
               max_starts: int | None = None, runs_dir: str | Path | None = None,
               progress: Progress | None = None) -> dict:
    """Measure the threshold; returns the ladder object (as written to the card's top-level ``ladder``).

    ``card_path``: the card to read the workload from and to write every rung to (resumable). ``card``: a card
    dict used instead (nothing is written: ``-- CMD`` without --out). ``declared``: {"bytes", "source"}.
    """
    say: Progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    card = _load_card(card_path, card, precision, max_starts)
    ident = workload_identity(cast(CardDict, card), gpu_index)
    plan = ident["plan"]
    if device is None:
        from oomdoctor.device import nvml as devmod

        device = devmod.capture(with_processes=False)
    g = _gpu(device, gpu_index)
    bracket = derive_bracket(card, plan.workload, low, high, floor, precision, device, gpu_index)
    if runner is None and ballast and g is None:
        raise BadInput(f"the ladder measures each rung's free memory with NVML, which is not available on GPU {gpu_index} "
                       f"({(device or {}).get('reason') or (device or {}).get('status') or 'no device state'}); "
                       "--no-ballast runs without holding memory (no measurement of the device)")
    store = _Store(Path(card_path) if card_path is not None else None)
    old = card.get("ladder") if isinstance(card.get("ladder"), dict) else None
    now = cardmod.now_iso()
    ladder = _new_ladder(ident, card, g, device, gpu_index, ballast, runner is not None, precision, bracket, now)
    if old and old.get("rungs") is not None:
        _resume(ladder, old, ident, fresh, now, say)
    ladder["starts"] = len(ladder["rungs"])
    L, lsrc, H, hsrc = bracket
    say(f"ladder: low {_fmt(L)} ({lsrc}), high {_fmt(H)} ({hsrc}), precision {human_bytes(precision)}; "
        f"at most {expected_starts(L, H, precision)} bisection start(s) + the ends only if they decide")
    if runner is None:
        runner = EngineRunner(card, plan, _runs_dir(card_path, runs_dir, now), gpu_index=gpu_index, timeout_s=timeout_s,
                              memory_timeout_s=memory_timeout_s, ballast=ballast, progress=say,
                              baseline_free=g.get("free_bytes") if g else None)
    store.write(ladder)
    try:
        _climb(ladder, runner, store, card_path, max_starts, say)
    except BaseException as e:  # KeyboardInterrupt, Interrupted, a ballast that failed: keep what was measured
        _interrupted(ladder, store, e)
        raise
    _finish(ladder, card, plan.workload, declared)
    store.write(ladder)
    return ladder

