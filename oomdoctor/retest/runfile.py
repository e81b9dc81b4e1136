"""The run file: which oomdoctor process runs which engine process groups for a card, so that a run that was
killed (SIGKILL, a lost terminal, the OOM killer) leaves nothing the next run does not find.

``CARD.runs/run.json`` holds the oomdoctor pid, a run id and the process groups it started. Every engine and
ballast process carries ``OOMDOCTOR_RUN_ID=<id>`` in its environment. The next run of the same card:

- refuses, naming the pids, while the recorded oomdoctor process is still alive (another retest of this card);
- else ends every process that carries the dead run's id (found through /proc, so a reused pid is never hit)
  and says what it cleaned.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

from oomdoctor.card.locking import atomic_write, locked, refuse_linked_dir, refuse_special
from oomdoctor.errors import OomdoctorError
from oomdoctor.retest import procs

NAME = "run.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return True
    return state != "Z"


def carriers(run_id: str, proc_root: str = "/proc") -> list[int]:
    """The live pids whose environment carries ``OOMDOCTOR_RUN_ID=run_id``."""
    needle = f"OOMDOCTOR_RUN_ID={run_id}".encode()
    out = []
    for d in os.listdir(proc_root) if os.path.isdir(proc_root) else []:
        if not d.isdigit() or int(d) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(proc_root, d, "environ").read_bytes().split(b"\0") and _alive(int(d)):
                out.append(int(d))
    return sorted(out)


def _end(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM (group and pid), then SIGKILL after ``grace_s``; the pids that were ended."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(OSError):
                os.killpg(p, sig) if os.getpgid(p) == p else os.kill(p, sig)
            with contextlib.suppress(OSError):
                os.kill(p, sig)
        t0 = time.monotonic()
        while any(_alive(p) for p in pids) and time.monotonic() - t0 < grace_s:
            for p in pids:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(p, os.WNOHANG)
            time.sleep(0.1)
        if not any(_alive(p) for p in pids):
            break
    return pids


def _read(path: Path) -> dict:
    refuse_special(path, "run file")
    try:
        d = json.loads(path.read_text(encoding="utf-8")[:1 << 16])
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def clean_orphans(run_dir: Path, say: Callable[[str], None]) -> list[int]:
    """End what a dead earlier run left (its pids, said), refuse while that run is alive; [] when nothing was left."""
    path = Path(run_dir) / NAME
    old = _read(path)
    if not old:
        return []
    rid, owner = str(old.get("run_id") or ""), old.get("pid")
    left = carriers(rid) if rid else []
    if isinstance(owner, int) and owner != os.getpid() and _alive(owner) and _is_oomdoctor(owner, rid):
        raise OomdoctorError(f"another oomdoctor run (pid {owner}, started {old.get('started_at')}) is running this "
                             f"card; its engine pids: {', '.join(map(str, left)) or 'none yet'} — wait for it or end it")
    if left:
        _end(left)
        say(f"cleaned up an earlier run that was killed (oomdoctor pid {owner}, started {old.get('started_at')}): "
            f"ended {len(left)} orphaned process(es), pids {', '.join(map(str, left))}")
    else:
        say(f"an earlier run (oomdoctor pid {owner}, started {old.get('started_at')}) ended without cleaning up; "
            f"none of its processes is left")
    with contextlib.suppress(OSError):
        path.unlink()
    return left


def _is_oomdoctor(pid: int, run_id: str) -> bool:
    """The recorded owner is still that oomdoctor run (not a reused pid): its command line names oomdoctor."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True                 # cannot tell: assume it is, and refuse rather than kill a live run's engine
    return b"oomdoctor" in cmd


def fresh_log(run_dir: Path, stem: str) -> Path:
    """``stem.log``, else ``stem.run2.log``, ... : a log name no earlier run used (a killed run's log is kept)."""
    p = Path(run_dir) / f"{stem}.log"
    k = 1
    while os.path.lexists(p) or os.path.lexists(p.with_suffix(".ballast.log")):
        k += 1
        p = Path(run_dir) / f"{stem}.run{k}.log"
    return p


@contextlib.contextmanager
def active(run_dir: Path, say: Callable[[str], None]) -> Iterator[dict]:
    """While inside: the run file names this process and every group it starts; orphans of a dead run are
    ended first. The file is removed on the way out (not by SIGKILL: then the next run reads it)."""
    run_dir = Path(run_dir)
    refuse_linked_dir(run_dir)
    path = run_dir / NAME
    with locked(path):
        cleaned = clean_orphans(run_dir, say)
        rec: dict = {"pid": os.getpid(), "run_id": uuid.uuid4().hex, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                     time.gmtime()), "groups": [], "cleaned": cleaned}
        atomic_write(path, json.dumps(rec), "run file")

    def started(g: procs.Group) -> None:
        rec["groups"].append({"pgid": g.pgid, "argv0": os.path.basename(str(g.argv[0])),
                              "log": g.log_path.name if g.log_path else None})
        atomic_write(path, json.dumps(rec), "run file")

    procs.RUN_ID["id"] = rec["run_id"]
    procs.ON_START.append(started)
    try:
        yield rec
    finally:
        procs.ON_START.remove(started)
        procs.RUN_ID.pop("id", None)
        with contextlib.suppress(OSError):
            path.unlink()
