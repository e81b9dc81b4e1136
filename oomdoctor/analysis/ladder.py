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
"""
from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from oomdoctor import __version__
from oomdoctor.card import store as cardmod
from oomdoctor import contract
from oomdoctor.errors import BadInput, OomdoctorError
from oomdoctor.card.fingerprint import effective_config, fingerprint, normalize_value
from oomdoctor.units import human_bytes, parse_size

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_PRECISION = 64 * MiB
DEFAULT_FLOOR = 512 * MiB
LADDER_FORMAT = 1
FREE_ENV = "OOMDOCTOR_LADDER_FREE_BYTES"
NONE_LEVER = {"id": "none", "change": {}, "rank": 0, "predicted": {}, "cost": "nothing: the workload as recorded"}
LEDGER_KEYS = ("weights_bytes", "kv_cache_memory_bytes", "kv_available_bytes", "kv_cache_tokens", "cuda_graph_bytes",
               "initial_free_bytes", "free_at_start_bytes", "engine_init_seconds")

Runner = Callable[[int], Any]


# ----------------------------------------------------------------------------- identity of the workload
def workload_identity(card: dict, gpu_index: int = 0) -> dict:
    """What the ladder measures: the card's workload as ``retest`` would run it with no lever (the recorded
    launch + the changes of earlier attempts that fixed their failure). Raises BadInput for a card whose
    workload cannot be re-run."""
    from oomdoctor.retest.run import plan

    if not isinstance(card.get("workload"), dict) or not card["workload"]:
        raise BadInput("the card has no workload: nothing to start (record one with `oomdoctor record -- CMD ...`)")
    p = plan(card, NONE_LEVER, None, gpu_index, True)
    wl = p.workload
    eng = card.get("engine") or {}
    eff = effective_config(eng.get("name") or "unknown", eng.get("version"), wl.get("model"), wl.get("model_revision"),
                           wl.get("engine_args") or {}, wl.get("env") or {})
    ident = {"config": eff, "launcher": wl.get("launcher"), "requests": wl.get("requests") or {}}
    if wl.get("launcher") == "command":
        ident["argv"] = list(wl.get("argv") or [])
    return {"plan": p, "effective_config": eff, "config_fingerprint": fingerprint(eff),
            "workload_fingerprint": fingerprint(ident)}


def card_for_command(argv: list[str], requests: dict | None = None) -> dict:
    """A card for a generic ``-- CMD ...`` workload (no log yet: class unknown, no numbers, no levers)."""
    from oomdoctor.card.workload import workload_from_argv

    wl = workload_from_argv(list(argv), dict(requests or {}))
    wl["source"] = "oomdoctor ladder -- CMD"
    engine = "vllm" if wl.get("launcher") == "vllm-serve" else None
    c = cardmod.Card(
        id=cardmod.new_id("unknown", ""), created_at=cardmod.now_iso(),
        summary="free-memory ladder of a command workload",
        source={"path": "(oomdoctor ladder -- CMD)", "sha256": ""},
        engine={"name": engine, "version": None},
        classification={**contract.classification("unknown"), "rule": None, "engine": engine, "engine_version": None},
        evidence=[], numbers={}, device={"status": "not_captured", "reason": "oomdoctor ladder", "source": "nvml", "gpus": []},
        workload=wl, levers=[], notes=["created by oomdoctor ladder for a command given after --"],
    )
    return c.to_dict()


# ----------------------------------------------------------------------------- bracket
def _gpu(device: dict | None, index: int) -> dict | None:
    if not device or device.get("status") != "captured":
        return None
    return next((g for g in device.get("gpus") or [] if g.get("index") == index), None)


def pinned_arena(card: dict, workload: dict | None = None) -> tuple[int | None, str]:
    """The pinned KV arena: the exact ``kv_cache_memory_bytes`` setting, else the figure the engine printed."""
    args = (workload or card.get("workload") or {}).get("engine_args") or {}
    if args.get("kv_cache_memory_bytes") not in (None, ""):
        v = normalize_value(args["kv_cache_memory_bytes"])
        if isinstance(v, (int, float)) and v > 0:
            return int(v), "workload.engine_args.kv_cache_memory_bytes"
    n = card.get("numbers") or {}
    if n.get("kv_cache_memory_bytes"):
        return int(n["kv_cache_memory_bytes"]), "the engine's 'reserved ... for KV Cache' line (card numbers)"
    return None, ""


def derive_bracket(card: dict, workload: dict, low: int | None, high: int | None, floor: int, precision: int,
                   device: dict | None, gpu_index: int) -> tuple[int, str, int, str]:
    if high is not None:
        h, hsrc = int(high), "--high"
    else:
        g = _gpu(device, gpu_index)
        if g is None:
            why = (device or {}).get("reason") or "no device state"
            raise BadInput(f"--high is needed: the device's free memory cannot be read ({why})")
        h, hsrc = int(g["free_bytes"]), f"the free memory of GPU {gpu_index} now (NVML)"
    if low is not None:
        lo, lsrc = int(low), "--low"
    else:
        w = (card.get("numbers") or {}).get("weights_bytes")
        arena, asrc = pinned_arena(card, workload)
        if w:
            lo = int(w) + (arena or 0)
            lsrc = "weights" + (" + pinned KV arena" if arena else "") + " (card numbers): it cannot start with less"
            lo = (lo // precision) * precision
        else:
            lo, lsrc = int(floor), "--floor"
    if precision <= 0:
        raise BadInput(f"--precision must be positive (got {precision})")
    if lo < 0 or h <= 0:
        raise BadInput("the bracket needs positive sizes")
    if lo >= h:
        raise BadInput(f"low ({human_bytes(lo)}, {lsrc}) must be below high ({human_bytes(h)}, {hsrc})")
    return lo, lsrc, h, hsrc


def bracket_state(rungs: list[dict], low: int, high: int) -> dict:
    """What the recorded rungs (and the assumed ends) say: the open interval and whether each side is measured."""
    passes = sorted(r["target_free_bytes"] for r in rungs if r["outcome"] == "pass")
    fails = sorted(r["target_free_bytes"] for r in rungs if r["outcome"] in ("fail", "timeout"))
    hi_k = passes[0] if passes else None
    below = [f for f in fails if hi_k is None or f < hi_k]
    lo_k = below[-1] if below else None
    inconsistent = [f for f in fails if hi_k is not None and f >= hi_k]
    st: dict[str, Any] = {"inconsistent_fails": inconsistent}
    if hi_k is not None and hi_k <= high:
        st.update(hi=hi_k, hi_known=True)
    else:
        st.update(hi=high, hi_known=False)
    if lo_k is not None and lo_k >= low:
        st.update(lo=lo_k, lo_known=True)
    else:
        st.update(lo=low, lo_known=False)
    if st["lo"] >= st["hi"]:
        if st["lo_known"] and not st["hi_known"]:          # a failure at or above the assumed high end
            if hi_k is not None:
                st.update(hi=hi_k, hi_known=True)
            else:
                st["status"] = "no_start"
        elif st["hi_known"] and not st["lo_known"]:        # a pass at or below the assumed low end
            if lo_k is not None:
                st.update(lo=lo_k, lo_known=True)
            else:
                st["status"] = "starts_at_low"
    return st


def next_rung(rungs: list[dict], low: int, high: int, precision: int) -> tuple[str, int | None, str]:
    """("run", target, role) or ("done", None, status). The grid is anchored at ``low``."""
    st = bracket_state(rungs, low, high)
    if st.get("status"):
        return "done", None, st["status"]
    lo, hi = st["lo"], st["hi"]
    measured = {r["target_free_bytes"] for r in rungs if r["outcome"] in ("pass", "fail", "timeout")}
    if hi - lo <= precision:
        if not st["hi_known"] and high not in measured:
            return "run", high, "verify_high"
        if not st["lo_known"] and low not in measured:
            return "run", low, "verify_low"
        return "done", None, "measured"
    i_lo = math.floor((lo - low) / precision)
    i_hi = math.ceil((hi - low) / precision)
    t = low + ((i_lo + i_hi) // 2) * precision
    if not lo < t < hi:                                      # cannot happen when hi - lo > precision; be safe
        t = lo + (hi - lo) // 2
    return "run", int(t), "bisect"


def expected_starts(low: int, high: int, precision: int) -> int:
    """Starts of a bisection whose threshold lies strictly inside the bracket (no end to verify)."""
    m = math.ceil((high - low) / precision)
    return max(0, math.ceil(math.log2(m))) if m > 1 else 0


# ----------------------------------------------------------------------------- results
def _fmt(n: int | None) -> str:
    return "?" if n is None else f"{human_bytes(n)} ({n:,} B)"


def summarize(ladder: dict, card: dict, workload: dict, declared: dict | None) -> dict:
    rungs = ladder["rungs"]
    b = ladder["bracket"]
    P = ladder["precision_bytes"]
    low, high = b["low_bytes"], b["high_bytes"]
    st = bracket_state(rungs, low, high)
    act, _, status = next_rung(rungs, low, high, P)
    if act == "run":
        status = "incomplete"
    if rungs and rungs[-1]["outcome"] == "error":
        status = "error"
    by_target = {}
    for r in rungs:
        if r["outcome"] != "error":
            by_target.setdefault(r["target_free_bytes"], r)
    passing = by_target.get(st["hi"]) if st["hi_known"] else None
    failing = by_target.get(st["lo"]) if st["lo_known"] else None
    free = lambda r: r.get("free_bytes") if r.get("free_bytes") is not None else r["target_free_bytes"]  # noqa: E731
    res: dict[str, Any] = {"status": status, "precision_bytes": P,
                           "passes_at_bytes": free(passing) if passing else None,
                           "passes_at_target_bytes": passing["target_free_bytes"] if passing else None,
                           "fails_at_bytes": free(failing) if failing else None,
                           "fails_at_target_bytes": failing["target_free_bytes"] if failing else None,
                           "threshold_bytes": free(passing) if passing and status == "measured" else None}
    if passing and failing:
        res["interval_bytes"] = res["passes_at_bytes"] - res["fails_at_bytes"]
    if status == "measured":
        res["message"] = (f"starts at ≥ {_fmt(res['passes_at_bytes'])} free, fails at ≤ {_fmt(res['fails_at_bytes'])}, "
                          f"precision {human_bytes(P)}")
    elif status == "no_start":
        everything = b.get("high_source", "").startswith("the free memory")
        res["message"] = ("does not start even with everything free" if everything
                          else f"does not start even at --high {_fmt(high)}: the threshold is above it")
        if res["fails_at_bytes"] is not None:
            res["message"] += f" (fails at {_fmt(res['fails_at_bytes'])})"
    elif status == "starts_at_low":
        p = by_target.get(st["hi"])
        res["message"] = (f"starts even at the low end {_fmt(free(p) if p else low)}: the threshold is below it "
                          "(lower --low to measure it)")
    elif status == "error":
        e = rungs[-1]
        dec = e.get("decisive") or {}
        res["message"] = (f"rung {e['k']} at {_fmt(e['free_bytes'])} failed for a reason that is not memory "
                          f"({e.get('class')}{', line ' + str(dec['line']) + ': ' + dec.get('text', '')[:200] if dec else ''}); "
                          "the ladder measures memory only: make the workload start with everything free, then run "
                          "the ladder again (error rungs are not used)")
    else:
        lo_s = _fmt(res["fails_at_bytes"]) if failing else f"{_fmt(st['lo'])} (assumed: low end)"
        hi_s = _fmt(res["passes_at_bytes"]) if passing else f"{_fmt(st['hi'])} (assumed: high end)"
        res["message"] = (f"incomplete: between {lo_s} and {hi_s} so far; run the same command again to resume")
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


def read_profile(path: str | Path, name: str) -> dict:
    """``requires_free_bytes`` (else ``declared_free_bytes``) of profile NAME in a serving-profiles file, read by
    THE profiles reader (:mod:`oomdoctor.profiles.reader`)."""
    from oomdoctor.profiles.reader import profile_entries, read_doc

    p = Path(path)
    try:
        entries = profile_entries(read_doc(p), str(p))
    except BadInput as e:
        raise BadInput(f"--profile-file {e}")
    prof = next((e.raw for e in entries if e.name == name), None)
    if prof is None:
        raise BadInput(f"--profile {name!r} is not in {p} (profiles: {', '.join(e.name for e in entries) or 'none'})")
    key = "requires_free_bytes" if prof.get("requires_free_bytes") is not None else "declared_free_bytes"
    v = prof.get(key)
    if v is None:
        raise BadInput(f"profile {name!r} in {p} has no requires_free_bytes (nor declared_free_bytes)")
    n = parse_size(str(v))
    if n <= 0:
        raise BadInput(f"profile {name!r} in {p}: {key} must be positive")
    return {"bytes": n, "source": f"{p} profile {name} {key}"}


# ----------------------------------------------------------------------------- the default runner
class EngineRunner:
    """Runs the card's workload once per rung: a ballast leaves the target free (``ballast=False``: no memory is
    held, the target only reaches the command as env OOMDOCTOR_LADDER_FREE_BYTES — for tests and dry runs),
    the engine runs in its own process group, its log is diagnosed."""

    def __init__(self, card: dict, plan, runs_dir: Path, gpu_index: int = 0, timeout_s: float = 900.0,
                 memory_timeout_s: float = 120.0, ballast: bool = True, progress: Callable[[str], None] | None = None,
                 baseline_free: int | None = None):
        from oomdoctor.retest.run import _phase_watcher
        from oomdoctor.diagnose.rules import default_rules

        self.card, self.plan, self.runs_dir = card, plan, Path(runs_dir)
        self.gpu_index, self.timeout_s, self.memory_timeout_s = gpu_index, timeout_s, memory_timeout_s
        self.ballast = ballast
        self.progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
        self.ruleset = default_rules()
        name = (card.get("engine") or {}).get("name")
        self.engine = name if name in self.ruleset.engines else None
        self.watch = _phase_watcher(self.ruleset, self.engine or "vllm")
        self.baseline_free = baseline_free

    def _free_now(self) -> int | None:
        from oomdoctor.retest.run import _gpu_state

        return _gpu_state(self.gpu_index)[1]

    def __call__(self, target: int) -> dict:
        from oomdoctor.diagnose.classify import diagnose_file
        from oomdoctor.retest.procs import wait_memory_back
        from oomdoctor.retest.run import run_engine
        from oomdoctor.card.workload import read_header

        if self.baseline_free is not None:
            ok, last = wait_memory_back(self.baseline_free, self._free_now, timeout_s=self.memory_timeout_s,
                                        progress=self.progress)
            if not ok:
                raise OomdoctorError(f"GPU {self.gpu_index} memory is not back ({human_bytes(last)} free, "
                                     f"{human_bytes(self.baseline_free)} when the ladder started): refusing to measure "
                                     "the next rung; the rungs measured so far are recorded — run again to resume")
        p = copy.copy(self.plan)
        p.env = {**self.plan.env, FREE_ENV: str(int(target))}
        p.emulate_free_bytes = int(target) if self.ballast else None
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        stamp = cardmod.now_iso().replace(":", "").replace("-", "")
        log = self.runs_dir / f"ladder-{stamp}-{int(target)}.log"
        log.unlink(missing_ok=True)
        rr = run_engine(p, log, self.gpu_index, self.timeout_s, self.progress, self.watch)
        out: dict[str, Any] = {"served": rr.served, "rc": rr.rc, "log_path": str(log), "notes": list(rr.notes)}
        hdr = read_header(log)
        nv = hdr.get("nvml_before_start")
        if isinstance(nv, dict) and nv.get("free") is not None:
            out.update(free_bytes=int(nv["free"]), free_source="nvml")
        elif rr.ballast and rr.ballast.get("nvml_free") is not None:
            out.update(free_bytes=int(rr.ballast["nvml_free"]), free_source="ballast (nvml)")
        else:
            out.update(free_bytes=int(target),
                       free_source="target (not measured: no ballast)" if not self.ballast else "target (NVML unavailable)")
        if rr.ballast:
            out["ballast"] = {k: rr.ballast.get(k) for k in ("target_free", "held_bytes", "nvml_free", "torch_free")}
        out["outcome"] = "timeout" if rr.timed_out else ("pass" if rr.served else "fail")
        # (a failure that is not memory — no engine, a missing model, NCCL — becomes "error" below: not a rung)
        try:
            d = diagnose_file(log, self.ruleset, engine=self.engine)
        except OomdoctorError as e:
            out["notes"].append(f"the rung's log could not be diagnosed: {e}")
            return out
        out["class"], out["rule"] = d.klass, d.rule
        if out["outcome"] == "fail" and d.klass == "not_memory":
            out["outcome"] = "error"
        out["ledger"] = {k: d.numbers[k] for k in LEDGER_KEYS if k in d.numbers}
        out["decisive"] = decisive_line(d)
        return out


def decisive_line(d) -> dict | None:
    """The root line of a failure, else the last ledger line the start printed; with that line's numbers."""
    if d.root is not None:
        return {"line": d.root.n, "text": d.root.line.text[:500], "rule": d.root.rule.id, "numbers": dict(d.root.numbers)}
    ledger = [m for m in d.matches if m.rule.role in ("milestone", "info") and m.numbers]
    if not ledger:
        return None
    m = max(ledger, key=lambda m: m.n)
    return {"line": m.n, "text": m.line.text[:500], "rule": m.rule.id, "numbers": dict(m.numbers)}


# ----------------------------------------------------------------------------- persistence
class _Store:
    """The card the ladder is written to (atomically, under the card's lock), or nothing (``-- CMD`` without --out)."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None

    def write(self, ladder: dict) -> None:
        if self.path is None:
            return
        from oomdoctor.redact import redact_obj

        with cardmod.locked(self.path):
            d = cardmod.load_dict(self.path)
            d["ladder"] = copy.deepcopy(ladder)
            d = redact_obj(d)
            cardmod.check(d, str(self.path))
            cardmod.atomic_write(self.path, cardmod.dumps(d))


def _normalize(res: Any, target: int) -> dict:
    if isinstance(res, bool):
        res = {"outcome": "pass" if res else "fail"}
    if not isinstance(res, dict):
        raise OomdoctorError(f"the ladder runner returned {type(res).__name__}; a bool or a rung dict is expected")
    res = dict(res)
    if res.get("outcome") not in ("pass", "fail", "timeout", "error"):
        raise OomdoctorError(f"the ladder runner returned outcome {res.get('outcome')!r} (pass, fail, timeout or error)")
    if res.get("free_bytes") is None:
        res["free_bytes"] = int(target)
        res.setdefault("free_source", "target")
    return res


# ----------------------------------------------------------------------------- the ladder
def run_ladder(card_path: str | Path | None = None, *, card: dict | None = None, runner: Runner | None = None,
               low: int | None = None, high: int | None = None, precision: int = DEFAULT_PRECISION,
               floor: int = DEFAULT_FLOOR, declared: dict | None = None, gpu_index: int = 0, timeout_s: float = 900.0,
               memory_timeout_s: float = 120.0, device: dict | None = None, ballast: bool = True, fresh: bool = False,
               max_starts: int | None = None, runs_dir: str | Path | None = None,
               progress: Callable[[str], None] | None = None) -> dict:
    """Measure the threshold; returns the ladder object (as written to the card's top-level ``ladder``).

    ``card_path``: the card to read the workload from and to write every rung to (resumable). ``card``: a card
    dict used instead (nothing is written: ``-- CMD`` without --out). ``declared``: {"bytes", "source"}.
    """
    progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    if precision is None or precision <= 0:
        raise BadInput(f"--precision must be positive (got {precision})")
    if max_starts is not None and max_starts < 1:
        raise BadInput("--max-starts must be at least 1")
    if card_path is not None:
        card = cardmod.load_dict(card_path)
    if card is None:
        raise BadInput("no card and no command: nothing to measure")
    ident = workload_identity(card, gpu_index)
    plan = ident["plan"]
    if device is None:
        from oomdoctor.device import nvml as devmod

        device = devmod.capture(with_processes=False)
    g = _gpu(device, gpu_index)
    L, lsrc, H, hsrc = derive_bracket(card, plan.workload, low, high, floor, precision, device, gpu_index)
    if runner is None and ballast and g is None:
        raise BadInput(f"the ladder measures each rung's free memory with NVML, which is not available on GPU {gpu_index} "
                       f"({(device or {}).get('reason') or (device or {}).get('status') or 'no device state'}); "
                       "--no-ballast runs without holding memory (no measurement of the device)")
    eng = card.get("engine") or {}
    from oomdoctor.retest.run import device_slug

    dev_rec: dict[str, Any] = ({"index": gpu_index, "name": g.get("name"), "total_bytes": g.get("total_bytes"),
                                "free_at_ladder_start_bytes": g.get("free_bytes")} if g else
                               {"index": gpu_index, "status": (device or {}).get("status", "unavailable"),
                                "reason": (device or {}).get("reason", "")})
    store = _Store(Path(card_path) if card_path is not None else None)
    old = card.get("ladder") if isinstance(card.get("ladder"), dict) else None
    now = cardmod.now_iso()
    ladder: dict[str, Any] = {
        "format": LADDER_FORMAT, "status": "running", "oomdoctor_version": __version__,
        "workload_fingerprint": ident["workload_fingerprint"], "config_fingerprint": ident["config_fingerprint"],
        "effective_config": ident["effective_config"], "base_changes": plan.base_changes,
        "engine": eng.get("name"), "engine_version": eng.get("version"),
        "device": device_slug(g.get("name")) if g else None, "device_detail": dev_rec,
        "ballast": bool(ballast), "runner": "engine" if runner is None else "injected",
        "precision_bytes": int(precision),
        "bracket": {"low_bytes": L, "low_source": lsrc, "high_bytes": H, "high_source": hsrc},
        "started_at": now, "updated_at": now, "starts": 0, "rungs": [], "notes": [],
    }
    if old and old.get("rungs") is not None:
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
        else:
            msg = f"starting afresh: {why}; the {len(old.get('rungs') or [])} recorded rung(s) are not used"
            progress(msg)
            ladder["notes"].append(msg)
            ladder["previous"] = (old.get("previous") or [])[-4:] + [{
                "workload_fingerprint": old.get("workload_fingerprint"), "device": old.get("device"),
                "rungs": len(old.get("rungs") or []), "result": old.get("result"), "replaced_at": now, "reason": why}]
    ladder["starts"] = len(ladder["rungs"])
    progress(f"ladder: low {_fmt(L)} ({lsrc}), high {_fmt(H)} ({hsrc}), precision {human_bytes(precision)}; "
             f"at most {expected_starts(L, H, precision)} bisection start(s) + the ends only if they decide")
    if runner is None:
        if card_path is not None:
            rd = Path(card_path).with_suffix("")
            rd = rd.parent / (rd.name + ".runs")
        else:
            from oomdoctor.paths import default_incidents_dir

            rd = default_incidents_dir() / f"ladder-{now.replace(':', '')}.runs"
        runner = EngineRunner(card, plan, Path(runs_dir) if runs_dir else rd, gpu_index=gpu_index, timeout_s=timeout_s,
                              memory_timeout_s=memory_timeout_s, ballast=ballast, progress=progress,
                              baseline_free=g.get("free_bytes") if g else None)
    store.write(ladder)
    session = 0
    t_ladder = time.monotonic()
    try:
        while True:
            act, target, role = next_rung(ladder["rungs"], L, H, precision)
            if act == "done":
                break
            if max_starts is not None and session >= max_starts:
                ladder["notes"].append(f"stopped after --max-starts {max_starts}; run again to resume")
                break
            k = len(ladder["rungs"]) + 1
            progress(f"rung {k} ({role}): target {_fmt(target)} free …")
            t0 = time.monotonic()
            res = _normalize(runner(int(target)), int(target))
            session += 1
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
    except BaseException as e:  # KeyboardInterrupt, Interrupted, a ballast that failed: keep what was measured
        ladder["status"] = "interrupted"
        ladder["notes"].append(f"interrupted after {len(ladder['rungs'])} rung(s) ({type(e).__name__}); "
                               "run the same command again to resume")
        ladder["updated_at"] = cardmod.now_iso()
        try:
            store.write(ladder)
        except BaseException:  # noqa: BLE001 - the rungs are already on disk; never mask the interruption
            pass
        raise
    ladder["result"] = summarize(ladder, card, plan.workload, declared)
    # the pass/fail points at the top of the section, under the names oomdoctor.profiles reads from a receipt
    ladder["pass_free_bytes"] = ladder["result"]["threshold_bytes"]
    ladder["fail_free_bytes"] = ladder["result"]["fails_at_bytes"] if ladder["result"]["threshold_bytes"] else None
    ladder["status"] = {"incomplete": "incomplete", "error": "stopped"}.get(ladder["result"]["status"], "done")
    ladder["updated_at"] = cardmod.now_iso()
    store.write(ladder)
    return ladder


def _resume_refusal(old: dict, new: dict, fresh: bool) -> str | None:
    if fresh:
        return "--fresh"
    if old.get("workload_fingerprint") != new["workload_fingerprint"]:
        return (f"the workload changed (fingerprint {str(old.get('workload_fingerprint'))[:19]}… → "
                f"{new['workload_fingerprint'][:19]}…)")
    on, nn = old.get("device"), new.get("device")
    if on and nn and on != nn:
        return f"another device ({on} → {nn})"
    if bool(old.get("ballast", True)) != new["ballast"]:
        return "the ballast mode changed (--no-ballast rungs are not measurements of the device)"
    return None


def exit_code(ladder: dict) -> int:
    res = ladder.get("result") or {}
    if res.get("status") != "measured":
        return contract.EXIT_FAIL
    if (res.get("declared") or {}).get("verdict") == "under":
        return contract.EXIT_FAIL
    return contract.EXIT_OK


def to_json(ladder: dict, card_path: str | None) -> str:
    return json.dumps({"card": card_path, **ladder}, indent=2, default=str)
