"""Stage 7 — retest: the SAME workload, ONE lever, the real engine, performance rechecked.

``retest(card_path, lever=..., ...)``:
1. picks exactly one lever (``--lever ID``, ``--next`` = the first one not tried yet, default the card's #1);
2. builds the workload: the recorded one + the changes of earlier attempts that made their own failure
   go away + this lever's change (as an engine flag / LLM kwarg, an env var, or removing a co-tenant);
3. checks that GPU memory is back to the baseline (refuses with the reason if it is not), starts the
   ballast that reproduces the recorded free memory, starts the engine in its own process group with a
   timeout, tees its log, sends the recorded requests, and ends every process it started (success,
   failure, timeout, SIGINT, SIGTERM);
4. diagnoses the new log and decides: the original failure signature is gone, the engine served the
   requests, and performance is within tolerance of the baseline (or of the cost the lever announced);
5. appends the attempt to the card atomically, with the next lever if it still fails.
``--engine twin`` runs no engine: the lever engine's arithmetic predicts the outcome, labelled as such.
"""
from __future__ import annotations

import copy
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from oomdoctor import __version__
from oomdoctor.card import store as cardmod
from oomdoctor.device import nvml as devmod
from oomdoctor.levers import engine as levermod
from oomdoctor.errors import BadInput, OomdoctorError
from oomdoctor.card.fingerprint import effective_config, fingerprint
from oomdoctor.paths import SOURCE_ROOT
from oomdoctor.retest.procs import Group, cleanup_on_signals, python, wait_memory_back
from oomdoctor.redact import MASK, redact_argv, redact_env
from oomdoctor.units import NAMED_CARDS, human_bytes, parse_size

GiB = 1 << 30
PERF_TOLERANCE = 0.10
SPEED_COST_TOLERANCE = {"enforce_eager": 0.35, "cpu_offload_gb": 0.9, "max_num_batched_tokens": 0.25, "max_num_seqs": 0.5,
                        "cuda_graph_sizes": 0.25}
UNAPPLIABLE = {"larger_gpu": "needs other hardware", "admission_queue": "is a server-side change, not an engine setting",
               "tensor_parallel_size": None, "pipeline_parallel_size": None}
RESULT_RE = re.compile(r"OOMDOCTOR_RESULT (\{.*\})")
CUDA_CONTEXT_BYTES = 512 << 20     # vLLM's own CUDA context: a ballast leaving 40.00 GiB shows as 39.49 in its check


@dataclass
class Plan:
    lever: dict
    workload: dict
    base_changes: list[dict]
    argv: list[str]
    env: dict[str, str]
    emulate_free_bytes: int | None
    target_device: str | None
    description: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- choosing and applying a lever
def choose_lever(card: dict, lever_id: str | None, next_: bool) -> dict:
    levers = card.get("levers") or []
    tried = [(a.get("lever"), a.get("change")) for a in card.get("attempts") or []]
    if lever_id:
        for lv in levers:
            if lv["id"] == lever_id:
                return lv
        if lever_id == "none":
            return {"id": "none", "change": {}, "rank": 0, "predicted": {}, "cost": "nothing: reproduces the recorded failure"}
        raise BadInput(f"lever '{lever_id}' is not among the card's levers ({', '.join(lv['id'] for lv in levers) or 'none'})")
    for lv in levers:
        if next_ and (lv["id"], lv["change"]) in tried:
            continue
        return lv
    raise BadInput("no lever left to try on this card" if levers else
                   f"the card has no levers (class {card['classification']['class']}): nothing to retest")


def kept_changes(card: dict) -> list[dict]:
    """Changes of earlier real attempts that made their own failure go away: the next attempt builds on them."""
    out = []
    for a in card.get("attempts") or []:
        if a.get("engine", {}).get("mode") == "real" and a.get("signature_gone") and a.get("lever") not in (None, "none"):
            out.append({"lever": a["lever"], "change": a["change"]})
    return out


def apply_change(wl: dict, lever_id: str, change: dict) -> tuple[dict, str]:
    wl = copy.deepcopy(wl)
    args = wl.setdefault("engine_args", {})
    env = wl.setdefault("env", {})
    if lever_id in ("larger_gpu", "admission_queue"):
        raise BadInput(f"lever '{lever_id}' {UNAPPLIABLE[lever_id]}: a re-run cannot apply it")
    if lever_id == "free_other_processes":
        wl["co_tenant_bytes"] = None
        wl["emulate_free_bytes"] = wl.get("card_emulate_free_bytes")
        return wl, "the co-tenant that held memory is not started (on this device it was reproduced by a ballast)"
    if lever_id == "expandable_segments":
        env["PYTORCH_CUDA_ALLOC_CONF"] = change.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        return wl, f"env PYTORCH_CUDA_ALLOC_CONF={env['PYTORCH_CUDA_ALLOC_CONF']}"
    desc = []
    for k, v in change.items():
        args[k] = v
        desc.append(f"{k}={v}")
    return wl, ("engine argument " if wl.get("launcher") == "vllm-llm" else "flag ") + ", ".join(desc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_argv(wl: dict, port: int | None = None) -> list[str]:
    launcher = wl.get("launcher")
    args = dict(wl.get("engine_args") or {})
    req = dict(wl.get("requests") or {})
    if launcher == "vllm-llm":
        return [python(), "-m", "oomdoctor.retest.engine_runner", str(wl["model"]), json.dumps(args, sort_keys=True),
                json.dumps(req, sort_keys=True)]
    if launcher == "vllm-serve":
        argv = [python(), "-m", "vllm.entrypoints.cli.main", "serve", str(wl["model"])]
        for k, v in sorted(args.items()):
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                argv.append(flag if v else "--no-" + k.replace("_", "-"))
            elif isinstance(v, (dict, list)):
                argv += [flag, json.dumps(v)]
            elif v is not None:
                argv += [flag, str(v)]
        return argv + ["--port", str(port or 8000)]
    if launcher == "command":
        argv = list(wl.get("argv") or [])
        if not argv:
            raise BadInput("workload.argv is empty")
        for k, v in sorted(args.items()):
            if k in (wl.get("base_args") or {}):
                continue
            flag = "--" + k.replace("_", "-")
            argv += [flag] if v is True else ([] if v is False else [flag, str(v)])
        return argv
    raise BadInput(f"workload.launcher '{launcher}' cannot be re-run (vllm-serve, vllm-llm or command)")


def target_free_from_card(card: dict) -> tuple[int | None, str]:
    wl = card.get("workload") or {}
    if wl.get("emulate_free_bytes"):
        return int(wl["emulate_free_bytes"]), "workload.emulate_free_bytes"
    if wl.get("free_at_start_bytes"):
        return int(wl["free_at_start_bytes"]), wl.get("free_at_start_source", "workload.free_at_start_bytes")
    n = card.get("numbers") or {}
    if n.get("free_at_start_bytes"):
        return int(n["free_at_start_bytes"]) + CUDA_CONTEXT_BYTES, "the engine's free-memory check + its CUDA context"
    if n.get("initial_free_bytes"):
        return int(n["initial_free_bytes"]) + CUDA_CONTEXT_BYTES, "the worker's initial free memory + its CUDA context"
    if n.get("gpu_free_bytes") is not None and n.get("other_process_bytes"):
        total = n.get("gpu_total_bytes")
        if total:
            return int(total) - int(n["other_process_bytes"]), "total - the co-tenant named in the OOM message"
    return None, ""


def plan(card: dict, lever: dict, emulate: str | None, gpu_index: int, no_emulate: bool) -> Plan:
    wl0 = copy.deepcopy(card.get("workload") or {})
    if wl0.get("launcher") in (None, "unknown"):
        raise BadInput("the card's workload does not say how the engine was launched (workload.launcher); "
                       "record it with `oomdoctor record -- vllm serve ...`")
    if not wl0.get("model") and wl0.get("launcher") != "command":
        raise BadInput("the card's workload has no model (workload.model)")
    base = kept_changes(card)
    desc = []
    target, target_src = (None, "")
    if emulate:
        key = emulate.lower().replace("_", "").replace(" ", "")
        target = parse_size(emulate)
        target_src = f"--emulate {emulate}"
        wl0["card_emulate_free_bytes"] = target
        if key in NAMED_CARDS:
            desc.append(f"emulating {NAMED_CARDS[key][0]}: a ballast leaves {human_bytes(target)} free")
    elif not no_emulate:
        target, target_src = target_free_from_card(card)
    wl0["emulate_free_bytes"] = target
    co = card.get("numbers", {}).get("other_process_bytes")
    if co and not emulate:
        wl0["co_tenant_bytes"] = int(co)
    wl = wl0
    for b in base:
        wl, d = apply_change(wl, b["lever"], b["change"])
        desc.append(f"kept from an earlier attempt: {b['lever']} ({d})")
    if lever["id"] != "none":
        wl, d = apply_change(wl, lever["id"], lever["change"])
        desc.append(f"this attempt's ONE change: {lever['id']} → {d}")
    else:
        desc.append("no change: reproduce the recorded failure")
    if wl.get("emulate_free_bytes"):
        desc.append(f"free memory at start reproduced with a ballast: {human_bytes(wl['emulate_free_bytes'])} ({target_src})")
    env = {k: str(v) for k, v in (wl.get("env") or {}).items() if v != MASK}
    tdev = None
    if emulate and emulate.lower().replace("_", "") in NAMED_CARDS:
        tdev = emulate.lower().replace("_", "")
    return Plan(lever=lever, workload=wl, base_changes=base, argv=launch_argv(wl, 0), env=env,
                emulate_free_bytes=wl.get("emulate_free_bytes"), target_device=tdev, description=desc)


# ----------------------------------------------------------------------------- running
def _gpu_state(index: int) -> tuple[dict, int | None, str | None]:
    st = devmod.capture()
    if st.get("status") != "captured":
        return st, None, None
    for g in st["gpus"]:
        if g["index"] == index:
            return st, g["free_bytes"], g.get("name")
    return st, None, None


def device_slug(name: str | None) -> str | None:
    if not name:
        return None
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass
class RunResult:
    rc: int | None
    timed_out: bool
    duration_s: float
    log_path: Path
    perf: dict | None
    served: bool
    ballast: dict | None
    notes: list[str]
    free_at_start: int | None = None


def run_engine(p: Plan, log_path: Path, gpu_index: int, timeout_s: float, progress: Callable[[str], None],
               phase_watch: Callable[[str], str | None] | None = None) -> RunResult:
    notes: list[str] = []
    env = dict(os.environ)
    env.update(p.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("CUDA_VISIBLE_DEVICES", str(gpu_index))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    ballast_info = None
    t0 = time.monotonic()
    port = free_port() if p.workload.get("launcher") == "vllm-serve" else None
    argv = launch_argv(p.workload, port) if port else p.argv
    ballast = None
    header = (f"# oomdoctor retest {__version__}; lever {p.lever['id']} {json.dumps(p.lever.get('change', {}))}\n"
              f"# cmd: {' '.join(redact_argv(argv))}\n# env: {json.dumps(redact_env(p.env), sort_keys=True)}\n")
    with cleanup_on_signals():
        _, free_before, _ = _gpu_state(gpu_index)
        if p.emulate_free_bytes and free_before is not None and p.emulate_free_bytes >= free_before - GiB:
            notes.append(f"no ballast needed: {human_bytes(free_before)} free already is about the recorded "
                         f"{human_bytes(p.emulate_free_bytes)}")
        elif p.emulate_free_bytes:
            ready = log_path.with_suffix(".ballast.json")
            ready.unlink(missing_ok=True)
            progress(f"ballast: holding memory until {human_bytes(p.emulate_free_bytes)} is free on GPU {gpu_index}")
            benv = dict(env, CUDA_VISIBLE_DEVICES=str(gpu_index))
            ballast = Group([python(), "-m", "oomdoctor.retest.ballast", str(p.emulate_free_bytes), str(ready), "--index", str(gpu_index)],
                            log_path.with_suffix(".ballast.log"), env=benv)
            while not ready.exists():
                if ballast.proc.poll() is not None:
                    ballast.stop()
                    raise OomdoctorError(f"the ballast exited before it was ready (see {log_path.with_suffix('.ballast.log')})")
                if time.monotonic() - t0 > 180:
                    ballast.stop()
                    raise OomdoctorError("the ballast was not ready within 180 s")
                time.sleep(0.2)
            ballast_info = json.loads(ready.read_text())
            header += f"# ballast: {json.dumps(ballast_info)}\n"
        _, free_now, _ = _gpu_state(gpu_index)
        if free_now is not None:
            header += f"# nvml before start: {json.dumps({'free': free_now})}\n"
        perf: dict | None = None
        phase = {"now": None}

        def on_line(line: str) -> None:
            nonlocal perf
            m = RESULT_RE.search(line)
            if m:
                try:
                    perf = json.loads(m.group(1))
                except ValueError:
                    pass
            if phase_watch:
                ph = phase_watch(line)
                if ph and ph != phase["now"]:
                    phase["now"] = ph
                    progress(f"[{time.monotonic() - t0:6.1f}s] engine reached phase: {ph}")

        progress(f"engine: {' '.join(redact_argv(argv))[:300]}")
        eng = Group(argv, log_path, env=env, on_line=on_line, header=header)
        timed_out = False
        served = False
        try:
            if port:
                from oomdoctor.retest import client

                deadline = timeout_s - (time.monotonic() - t0)
                if client.wait_ready(port, lambda: eng.proc.poll() is None, deadline):
                    progress(f"[{time.monotonic() - t0:6.1f}s] server ready; sending the recorded requests")
                    perf = client.send(port, str(p.workload["model"]), p.workload.get("requests") or {})
                    m = client.metrics(port)
                    if m is not None:
                        mp = log_path.with_suffix(".metrics.txt")
                        mp.write_text(m)
                        perf["metrics_file"] = mp.name
                    served = perf["served"] == perf["requests"]
                elif eng.proc.poll() is None:
                    timed_out = True
                rc = None if eng.proc.poll() is None else eng.proc.returncode
            else:
                rc = eng.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
                timed_out = rc is None
        finally:
            rc_final = eng.stop()          # joins the output reader: every line (the result too) is seen after this
            if ballast is not None:
                ballast.stop()
        if not port:
            served = rc == 0 and perf is not None and perf.get("served") == perf.get("requests")
        if timed_out:
            notes.append(f"timed out after {timeout_s:.0f} s; the process group was ended")
    return RunResult(rc if not port else rc_final, timed_out, time.monotonic() - t0, log_path, perf, served, ballast_info, notes,
                     free_now)


# ----------------------------------------------------------------------------- deciding
def perf_check(perf: dict | None, baseline: dict | None, lever_id: str, tolerance: float) -> dict:
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


def signature(card_or_class: dict) -> tuple[str, str | None]:
    c = card_or_class.get("classification", card_or_class)
    return c.get("class"), c.get("rule")


def retest(card_path: Path, lever_id: str | None = None, next_: bool = False, dry_run: bool = False,
           engine: str = "auto", emulate: str | None = None, no_emulate: bool = False, gpu_index: int = 0,
           timeout_s: float = 900.0, tolerance: float = PERF_TOLERANCE, progress: Callable[[str], None] | None = None,
           memory_timeout_s: float = 120.0) -> tuple[int, dict, dict]:
    """Returns (exit code, attempt, card dict after the attempt)."""
    progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    card = cardmod.load_dict(card_path)
    lever = choose_lever(card, lever_id, next_)
    p = plan(card, lever, emulate, gpu_index, no_emulate)
    mode = engine
    if mode == "auto":
        mode = "real" if _real_engine_available(card) else "twin"
    orig = signature(card)
    eng = card.get("engine") or {}
    eff = effective_config(eng.get("name") or "unknown", eng.get("version"), p.workload.get("model"),
                           p.workload.get("model_revision"), p.workload.get("engine_args") or {}, p.workload.get("env") or {})
    fp = fingerprint(eff)
    for d in p.description:
        progress(d)
    progress(f"lever #{lever.get('rank', '-')}: {lever['id']} {json.dumps(lever.get('change', {}))} — predicted: "
             f"{lever.get('predicted', {}).get('outcome', '?')}; cost: {lever.get('cost', '')}")
    progress(f"engine mode: {mode}; config fingerprint {fp[:19]}…")
    if dry_run:
        return 0, {"dry_run": True, "lever": lever["id"], "change": lever.get("change", {}), "argv": redact_argv(p.argv),
                   "description": p.description, "config_fingerprint": fp, "mode": mode}, card
    attempt: dict[str, Any] = {
        "at": cardmod.now_iso(), "lever": lever["id"], "change": lever.get("change", {}),
        "base_changes": p.base_changes, "engine": {"name": eng.get("name") or "unknown", "version": eng.get("version"), "mode": mode},
        "config_fingerprint": fp, "effective_config": eff, "argv": redact_argv(p.argv),
        "emulate_free_bytes": p.emulate_free_bytes, "oomdoctor_version": __version__, "notes": list(p.description),
    }
    if mode == "twin":
        outcome = lever.get("predicted", {}).get("outcome")
        attempt["outcome"] = ("predicted_pass" if outcome in ("fits", "passes_startup_check")
                              else "predicted_fail" if outcome == "short" else "predicted_unknown")
        attempt["notes"].append("PREDICTION by the memory model (twin engine), not a run of the real engine")
        attempt["signature_gone"] = None
        attempt["served"] = None
        attempt["target_device"] = p.target_device
        attempt = cardmod.append_attempt(card_path, attempt)
        return (0 if attempt["outcome"] == "predicted_pass" else 1), attempt, cardmod.load_dict(card_path)

    # ---- real engine
    st, baseline_free, gpu_name = _gpu_state(gpu_index)
    attempt["device_before"] = st
    attempt["gpu"] = gpu_name
    attempt["target_device"] = p.target_device or device_slug(gpu_name)
    if st.get("status") == "captured":
        g = next((g for g in st["gpus"] if g["index"] == gpu_index), None)
        if g is None:
            raise BadInput(f"--gpu {gpu_index}: no such GPU (NVML sees {len(st['gpus'])})")
        expected = g["total_bytes"] - (2 * GiB)
        if g["free_bytes"] < expected and not os.environ.get("OOMDOCTOR_ALLOW_BUSY_GPU"):
            holders = ", ".join(f"pid {x['pid']} ({human_bytes(x.get('used_bytes') or 0)})" for x in g.get("processes", []))
            ok, last = wait_memory_back(expected, lambda: _gpu_state(gpu_index)[1], timeout_s=memory_timeout_s, progress=progress)
            if not ok:
                raise OomdoctorError(f"GPU {gpu_index} has only {human_bytes(last)} free of {human_bytes(g['total_bytes'])} "
                                     f"(held: {holders or 'unknown holders'}); refusing to run until memory is back "
                                     "(set OOMDOCTOR_ALLOW_BUSY_GPU=1 to run anyway)")
            baseline_free = last
    else:
        attempt["notes"].append(f"device state unavailable ({st.get('reason')}): memory could not be checked before/after")
    run_dir = Path(card_path).with_suffix("")
    run_dir = run_dir.parent / (run_dir.name + ".runs")
    n_prev = len(card.get("attempts") or [])
    log_path = run_dir / f"attempt-{n_prev + 1}-{lever['id']}.log"
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.rules import default_rules

    ruleset = default_rules()
    watch = _phase_watcher(ruleset, eng.get("name") or "vllm")
    t_start = time.monotonic()
    try:
        rr = run_engine(p, log_path, gpu_index, timeout_s, progress, watch)
    finally:
        if baseline_free is not None:
            ok, last = wait_memory_back(baseline_free, lambda: _gpu_state(gpu_index)[1], timeout_s=memory_timeout_s,
                                        progress=progress)
            if not ok:
                progress(f"warning: GPU memory not back after the run ({human_bytes(last)} free, baseline "
                         f"{human_bytes(baseline_free)})")
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
    gone = (new.klass, new.rule) != orig
    attempt["signature_gone"] = gone
    baseline = (card.get("workload") or {}).get("baseline")
    pc = perf_check(rr.perf, baseline, lever["id"], tolerance)
    attempt["perf"] = rr.perf
    attempt["perf_check"] = pc
    if rr.timed_out:
        outcome = "timeout"
    elif gone and rr.served and not new.is_memory_failure:
        outcome = "regressed" if pc.get("status") == "regressed" else "pass"
    else:
        outcome = "fail"
    attempt["outcome"] = outcome
    updates: dict[str, Any] = {}
    if outcome != "pass" and lever["id"] != "none":
        attempts_so_far = list(card.get("attempts") or []) + [attempt]
        src_class = new.klass if (new.is_memory_failure and gone) else card["classification"]["class"]
        src_nums = new.numbers if (new.is_memory_failure and gone) else card.get("numbers", {})
        wl_now = dict(p.workload)
        if rr.free_at_start is not None:       # what this run really had free, not what the card recorded
            wl_now["free_at_start_bytes"] = rr.free_at_start
            wl_now["free_at_start_source"] = f"NVML before attempt {n_prev + 1}"
            g = next((g for g in st.get("gpus", []) if g["index"] == gpu_index), None)
            if g:
                wl_now["gpu_total_bytes"] = g["total_bytes"]
        allowed = (new.levers if (new.is_memory_failure and gone) else None) or None
        nxt = levermod.propose(src_class, src_nums, wl_now, st, attempts_so_far, allowed=allowed)
        attempt["next_lever"] = {k: nxt[0][k] for k in ("id", "change", "predicted", "cost")} if nxt else None
        if new.is_memory_failure and gone:
            attempt["notes"].append(f"the original failure is gone; a new one appeared: {new.klass} ({new.rule})")
        updates["levers"] = nxt or card.get("levers", [])
    elif outcome == "pass" and rr.perf and not baseline:
        updates["workload"] = {**card["workload"], "baseline": {k: v for k, v in rr.perf.items() if isinstance(v, (int, float))}
                               | {"from_attempt": n_prev + 1}}
    attempt = cardmod.append_attempt(card_path, attempt, updates)
    return (0 if outcome == "pass" else 1), attempt, cardmod.load_dict(card_path)


def _sha(p: Path) -> str | None:
    from oomdoctor.diagnose.read import file_sha256

    try:
        return file_sha256(p)
    except OomdoctorError:
        return None


def _real_engine_available(card: dict) -> bool:
    import importlib.util

    launcher = (card.get("workload") or {}).get("launcher")
    if launcher == "command":
        return True
    return importlib.util.find_spec("vllm") is not None and devmod.capture(with_processes=False).get("status") == "captured"


def _phase_watcher(ruleset, engine: str) -> Callable[[str], str | None]:
    from oomdoctor.diagnose.parse import parse_line

    ms = [r for r in ruleset.rules if r.engine == engine and r.role == "milestone"]

    def watch(line: str) -> str | None:
        pl = parse_line(0, line)
        for r in ms:
            if r.match(pl):
                return r.reaches
        return None

    return watch


def summary_rows(card: dict) -> list[dict]:
    rows = []
    for a in card.get("attempts") or []:
        perf = a.get("perf") or {}
        rows.append({"n": a["n"], "lever": a["lever"], "change": a.get("change"), "mode": a["engine"].get("mode"),
                     "outcome": a["outcome"], "class": (a.get("classification") or {}).get("class"),
                     "duration_s": a.get("duration_s"), "tok_s": perf.get("output_tokens_per_s"),
                     "target": a.get("target_device")})
    return rows
