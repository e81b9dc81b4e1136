"""Retest, step 2: run the planned launch — the engine's command line, the ballast that reproduces the recorded
free memory, the engine in its own process group with a timeout, the recorded requests, and the clean-up."""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from oomdoctor import __version__
from oomdoctor.card.records import Workload
from oomdoctor.device import nvml as devmod
from oomdoctor.engines.vllm.argv import serve_argv
from oomdoctor.errors import BadInput, OomdoctorError
from oomdoctor.paths import SOURCE_ROOT
from oomdoctor.redact import redact_argv, redact_env
from oomdoctor.retest.procs import Group, cleanup_on_signals, python
from oomdoctor.units import human_bytes

if TYPE_CHECKING:
    from oomdoctor.retest.plan import Plan

GiB = 1 << 30
RESULT_RE = re.compile(r"OOMDOCTOR_RESULT (\{.*\})")
BALLAST_READY_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flags(args: dict[str, Any]) -> list[str]:
    """``vllm serve`` flags for engine arguments, sorted by name (THE writer: engines/vllm/argv.py)."""
    return serve_argv(dict(sorted(args.items())))


def launch_argv(wl: Workload, port: int | None = None) -> list[str]:
    launcher = wl.get("launcher")
    args = dict(wl.get("engine_args") or {})
    req = dict(wl.get("requests") or {})
    if launcher == "vllm-llm":
        return [python(), "-m", "oomdoctor.retest.engine_runner", str(wl["model"]), json.dumps(args, sort_keys=True),
                json.dumps(req, sort_keys=True)]
    if launcher == "vllm-serve":
        return ([python(), "-m", "vllm.entrypoints.cli.main", "serve", str(wl["model"])] + _flags(args)
                + ["--port", str(port or 8000)])
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


def gpu_state(index: int) -> tuple[dict[str, Any], int | None, str | None]:
    """(NVML's state, free bytes of GPU ``index``, its name); None, None when NVML has no reading."""
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


def engine_env(p: "Plan", gpu_index: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(p.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("CUDA_VISIBLE_DEVICES", str(gpu_index))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def start_ballast(target: int, log_path: Path, gpu_index: int, env: dict[str, str], t0: float,
                  progress: Callable[[str], None]) -> tuple[Group, dict[str, Any]]:
    """Hold memory until ``target`` bytes are free on the GPU; (the ballast's group, what it reported)."""
    ready = log_path.with_suffix(".ballast.json")
    ready.unlink(missing_ok=True)
    progress(f"ballast: holding memory until {human_bytes(target)} is free on GPU {gpu_index}")
    benv = dict(env, CUDA_VISIBLE_DEVICES=str(gpu_index))
    ballast = Group([python(), "-m", "oomdoctor.retest.ballast", str(target), str(ready), "--index", str(gpu_index)],
                    log_path.with_suffix(".ballast.log"), env=benv)
    while not ready.exists():
        if ballast.proc.poll() is not None:
            ballast.stop()
            raise OomdoctorError(f"the ballast exited before it was ready (see {log_path.with_suffix('.ballast.log')})")
        if time.monotonic() - t0 > BALLAST_READY_S:
            ballast.stop()
            raise OomdoctorError(f"the ballast was not ready within {BALLAST_READY_S} s")
        time.sleep(0.2)
    return ballast, json.loads(ready.read_text())


class LineWatch:
    """Reads the engine's output as it comes: the runner's result line, and the phases the engine reaches."""

    def __init__(self, t0: float, progress: Callable[[str], None], phase_watch: Callable[[str], str | None] | None):
        self.t0, self.progress, self.phase_watch = t0, progress, phase_watch
        self.perf: dict | None = None
        self.phase: str | None = None

    def __call__(self, line: str) -> None:
        m = RESULT_RE.search(line)
        if m:
            try:
                self.perf = json.loads(m.group(1))
            except ValueError:
                pass
        if self.phase_watch:
            ph = self.phase_watch(line)
            if ph and ph != self.phase:
                self.phase = ph
                self.progress(f"[{time.monotonic() - self.t0:6.1f}s] engine reached phase: {ph}")


def serve_requests(p: "Plan", eng: Group, port: int, log_path: Path, t0: float, timeout_s: float,
                   progress: Callable[[str], None]) -> tuple[dict | None, bool, bool]:
    """Wait for the server, send the recorded requests, save its /metrics: (perf, served, timed out)."""
    from oomdoctor.retest import client

    deadline = timeout_s - (time.monotonic() - t0)
    if not client.wait_ready(port, lambda: eng.proc.poll() is None, deadline):
        return None, False, eng.proc.poll() is None
    progress(f"[{time.monotonic() - t0:6.1f}s] server ready; sending the recorded requests")
    perf = client.send(port, str(p.workload["model"]), dict(p.workload.get("requests") or {}))
    m = client.metrics(port)
    if m is not None:
        mp = log_path.with_suffix(".metrics.txt")
        mp.write_text(m)
        perf["metrics_file"] = mp.name
    return perf, perf["served"] == perf["requests"], False


def _header(p: "Plan", argv: list[str]) -> str:
    return (f"# oomdoctor retest {__version__}; lever {p.lever['id']} {json.dumps(p.lever.get('change', {}))}\n"
            f"# cmd: {' '.join(redact_argv(argv))}\n# env: {json.dumps(redact_env(p.env), sort_keys=True)}\n")


def run_engine(p: "Plan", log_path: Path, gpu_index: int, timeout_s: float, progress: Callable[[str], None],
               phase_watch: Callable[[str], str | None] | None = None) -> RunResult:
    notes: list[str] = []
    env = engine_env(p, gpu_index)
    ballast_info = None
    t0 = time.monotonic()
    port = free_port() if p.workload.get("launcher") == "vllm-serve" else None
    argv = launch_argv(p.workload, port) if port else p.argv
    ballast = None
    header = _header(p, argv)
    with cleanup_on_signals():
        _, free_before, _ = gpu_state(gpu_index)
        if p.emulate_free_bytes and free_before is not None and p.emulate_free_bytes >= free_before - GiB:
            notes.append(f"no ballast needed: {human_bytes(free_before)} free already is about the recorded "
                         f"{human_bytes(p.emulate_free_bytes)}")
        elif p.emulate_free_bytes:
            ballast, ballast_info = start_ballast(p.emulate_free_bytes, log_path, gpu_index, env, t0, progress)
            header += f"# ballast: {json.dumps(ballast_info)}\n"
        _, free_now, _ = gpu_state(gpu_index)
        if free_now is not None:
            header += f"# nvml before start: {json.dumps({'free': free_now})}\n"
        watch = LineWatch(t0, progress, phase_watch)
        progress(f"engine: {shlex.join(redact_argv(argv))}")
        eng = Group(argv, log_path, env=env, on_line=watch, header=header)
        timed_out = served = False
        perf: dict | None = None
        try:
            if port:
                perf, served, timed_out = serve_requests(p, eng, port, log_path, t0, timeout_s, progress)
                rc = None if eng.proc.poll() is None else eng.proc.returncode
            else:
                rc = eng.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
                timed_out = rc is None
        finally:
            rc_final = eng.stop()          # joins the output reader: every line (the result too) is seen after this
            if ballast is not None:
                ballast.stop()
        if not port or perf is None:
            perf = watch.perf           # the offline runner's result line (a server's figures come from its client)
        if not port:
            served = rc == 0 and perf is not None and perf.get("served") == perf.get("requests")
        if timed_out:
            notes.append(f"timed out after {timeout_s:.0f} s; the process group was ended")
    return RunResult(rc if not port else rc_final, timed_out, time.monotonic() - t0, log_path, perf, served, ballast_info,
                     notes, free_now)
