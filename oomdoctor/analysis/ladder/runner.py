"""The default rung runner: the card's workload started once per rung behind a ballast, its log diagnosed."""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Callable

from oomdoctor.card import store as cardmod
from oomdoctor.card.locking import refuse_linked_dir
from oomdoctor.errors import OomdoctorError
from oomdoctor.units import human_bytes

FREE_ENV = "OOMDOCTOR_LADDER_FREE_BYTES"
LEDGER_KEYS = ("weights_bytes", "kv_cache_memory_bytes", "kv_available_bytes", "kv_cache_tokens", "cuda_graph_bytes",
               "initial_free_bytes", "free_at_start_bytes", "engine_init_seconds")
Runner = Callable[[int], Any]


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
        refuse_linked_dir(self.runs_dir)
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
