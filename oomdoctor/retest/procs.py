"""Process control for real runs: every engine and ballast runs in its own process group and is
ended by group — on success, failure, timeout, SIGINT and SIGTERM — and the GPU memory is
checked to be back before the next run.

vLLM spawns EngineCore and worker processes; killing only the parent leaves them holding GPU
memory, so the whole group (session) is signalled: SIGINT, then SIGTERM, then SIGKILL.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, TextIO

from oomdoctor.errors import OomdoctorError

_LIVE: set[int] = set()          # process-group ids started here and not yet reaped
_LOCK = threading.Lock()
RUN_ID: dict[str, str] = {}      # the active run's id (oomdoctor.retest.runfile): every group's env carries it
ON_START: list[Callable[["Group"], None]] = []
ON_STOP: list[Callable[["Group"], None]] = []


class Interrupted(OomdoctorError):
    exit_code = 130


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float = 15.0) -> None:
    """SIGINT → SIGTERM → SIGKILL to the whole group, waiting up to ``grace_s`` after each of the first two."""
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, grace_s / 2), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait:
            if not group_alive(pgid):
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(-pgid, os.WNOHANG)
            time.sleep(0.1)
        if not group_alive(pgid):
            break
    with _LOCK:
        _LIVE.discard(pgid)


def kill_all() -> None:
    with _LOCK:
        groups = list(_LIVE)
    for g in groups:
        kill_group(g, grace_s=5.0)


# The watchdog: its own session, stdin the read end of a pipe whose write end only this oomdoctor holds. When
# oomdoctor ends in any way — SIGKILL included — the pipe reaches EOF and the watchdog ends the engine's group;
# a "x" written first means "ended normally, nothing to do".
WATCHDOG = ("import os, signal, sys, time\n"
            "g = int(sys.argv[1])\n"
            "b = os.read(0, 1)\n"
            "if b != b'x':\n"
            "    for s, w in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0)):\n"
            "        try:\n"
            "            os.killpg(g, s)\n"
            "        except OSError:\n"
            "            break\n"
            "        t = time.monotonic()\n"
            "        while time.monotonic() - t < w:\n"
            "            time.sleep(0.1)\n"
            "            try:\n"
            "                os.killpg(g, 0)\n"
            "            except OSError:\n"
            "                break\n")


def open_new_log(path: Path) -> TextIO:
    """A log file that did not exist (never appended to, never through a symlink)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OomdoctorError(f"{path}: cannot create the run's log ({e.strerror or e}); every run gets a new log file")
    return os.fdopen(fd, "w", encoding="utf-8", errors="replace")


class Group:
    """A command started in a new session; its output is teed to a NEW file (and optionally a callback).
    A watchdog ends the group if this process dies without ending it (SIGKILL); ``on_start`` hooks (the run
    file) learn every group started."""

    def __init__(self, argv: list[str], log_path: Path | None = None, env: dict | None = None,
                 on_line: Callable[[str], None] | None = None, cwd: str | None = None, header: str = ""):
        self.argv = argv
        self.log_path = log_path
        self.on_line = on_line
        self._log: TextIO | None = None
        if log_path is not None:
            self._log = open_new_log(log_path)
            if header:
                self._log.write(header)
                self._log.flush()
        env = dict(os.environ if env is None else env)
        if RUN_ID.get("id"):
            env["OOMDOCTOR_RUN_ID"] = RUN_ID["id"]
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=cwd, start_new_session=True, bufsize=0)
        except OSError as e:
            if self._log:
                self._log.close()
            raise OomdoctorError(f"cannot start {argv[0]}: {e.strerror or e}")
        self.pgid = self.proc.pid
        with _LOCK:
            _LIVE.add(self.pgid)
        self._watch_w = self._start_watchdog()
        for hook in list(ON_START):
            with contextlib.suppress(Exception):
                hook(self)
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _start_watchdog(self) -> int | None:
        r, w = os.pipe()
        try:
            self._watchdog: subprocess.Popen | None = subprocess.Popen(
                [python(), "-S", "-c", WATCHDOG, str(self.pgid)], stdin=r, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            os.close(w)
            self._watchdog = None
            return None
        finally:
            os.close(r)
        return w

    def _end_watchdog(self) -> None:
        if self._watch_w is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._watch_w, b"x")
        with contextlib.suppress(OSError):
            os.close(self._watch_w)
        self._watch_w = None
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        from oomdoctor.redact import redact_text

        for raw in iter(self.proc.stdout.readline, b""):
            line = redact_text(raw.decode("utf-8", errors="replace"))   # keys in argv dumps never reach the file
            if self._log:
                self._log.write(line)
                self._log.flush()
            if self.on_line:
                with contextlib.suppress(Exception):
                    self.on_line(line.rstrip("\r\n"))

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 15.0) -> int | None:
        kill_group(self.pgid, grace_s)
        self._end_watchdog()
        for hook in list(ON_STOP):
            with contextlib.suppress(Exception):
                hook(self)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._reader.join(timeout=5)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """While inside: SIGINT/SIGTERM end every group started here, then raise Interrupted."""
    def handler(signum, frame):  # noqa: ARG001
        kill_all()
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}; every engine and ballast process was ended")

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if threading.current_thread() is threading.main_thread():
        for s in old:
            signal.signal(s, handler)
    try:
        yield
    finally:
        kill_all()
        if threading.current_thread() is threading.main_thread():
            for s, h in old.items():
                signal.signal(s, h)


def wait_memory_back(baseline_free: int | None, read_free: Callable[[], int | None], tolerance: int = 512 << 20,
                     timeout_s: float = 60.0, progress: Callable[[str], None] | None = None) -> tuple[bool, int | None]:
    """Wait until free GPU memory is within ``tolerance`` of ``baseline_free``. Returns (ok, last reading)."""
    if baseline_free is None:
        return True, None
    t0 = time.monotonic()
    last = read_free()
    while last is not None and last < baseline_free - tolerance:
        if time.monotonic() - t0 > timeout_s:
            return False, last
        if progress:
            progress(f"waiting for GPU memory to come back ({(baseline_free - last) / 2**30:.2f} GiB still held)")
        time.sleep(1.0)
        last = read_free()
    return True, last


def python() -> str:
    return sys.executable or "python3"
