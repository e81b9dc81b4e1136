"""Stages 1b and 3 on several cores: a large log cut into pieces at line starts, each piece grepped and matched
in a worker process, and the workers' results merged into exactly what one LineMatcher over the whole log gives.

- main process, side thread (feed.py's reader or decompressor): reads the log, hashes and counts it as the
  one-process scanner does, and hands the stream to a :class:`Dispatcher`, which cuts it into pieces of about
  ``PIECE`` bytes ending at a newline and sends each one, with the number of its first line, to the worker whose
  pipe holds the least (a line longer than a piece stays with one worker: continuation frames). A plain file's
  piece goes as (offset, length) only, and the worker has the kernel copy it from the file into grep's stdin
  (``os.sendfile``); a decompressed piece goes through the pipe (and on with ``os.splice``);
- worker processes (diagnose/workers.py; forked once the rules are loaded, before any thread starts;
  ``gc.freeze`` first, so that the rules' pages stay shared): each runs one grep (the scanner's command) over
  everything it is sent, and grep's records through a LineMatcher whose ``base`` turns the worker's own line
  numbers into the log's (the records are cut at the pieces' boundaries);
- main thread: waits for the workers' results (showing progress) and merges them: matches in line order,
  detection counts summed, each engine's first version line, each rule's first hit and its count, the runtime
  buckets (RuntimeTracker.absorb: the timeline is defined per window of line numbers, so it merges exactly).
tests/diagnose/test_parallel.py checks that the result equals the one-process path on every fixture, cut into
tiny pieces. Used for logs of ``PARALLEL_MIN_BYTES`` or more (compressed: an eighth of it, as stored) on Linux
with three or more usable cores, when grep does the scanning, with ``MAX_JOBS`` workers; ``OOMDOCTOR_JOBS=N`` sets
the number of workers for any log (``1``: one process).
"""
from __future__ import annotations

import array
import gc
import mmap
import os
import pickle
import select
import signal
import sys
import threading
from pathlib import Path
from typing import Iterable, NoReturn

from oomdoctor.diagnose.feed import _feed_gzip, _read_plain, is_zstd
from oomdoctor.diagnose.match import MAX_STORED_MATCHES, Match, Matched
from oomdoctor.diagnose.progress import Progress
from oomdoctor.diagnose.read import SourceInfo, probe
from oomdoctor.diagnose.rules import EngineSpec, Rule
from oomdoctor.diagnose.scan import (PARALLEL_MIN_BYTES, PARALLEL_MIN_COMPRESSED, compression_of, fill_info,
                                     finish_side, grep_command, grep_env, write_pattern)
from oomdoctor.diagnose.signals import RuntimeTracker
from oomdoctor.diagnose.workers import _F_GETPIPE_SZ, _F_SETPIPE_SZ, _HEAD, PIECE, _worker
from oomdoctor.errors import BadInput

try:                                    # POSIX only; elsewhere jobs_for says 0 and this module is not used
    import fcntl
    import termios
except ImportError:  # pragma: no cover - Windows
    fcntl = termios = None  # type: ignore[assignment]

MAX_JOBS = 2   # by default: bench/bench_jobs.py on an idle 16-core host (docs/performance.md) — two workers bring the
               # stats-heavy log from 2.8x grep to 1.3x with the tree's PSS under 100 MB; three, 1.0x at 98-109 MB
FILE_PIECE = 4 << 20            # a plain file's piece (sent as an offset)


def jobs_for(path: str | os.PathLike, grep: str | None, anchors: Iterable[bytes]) -> int:
    """How many workers diagnose should use on ``path`` (0 or 1: the one-process path): only where grep scans
    (``scan._grep_for``), there is something to grep for, os.fork exists (Linux) and no thread runs yet."""
    env = os.environ.get("OOMDOCTOR_JOBS", "").strip()
    if grep is None or fcntl is None or not hasattr(os, "fork") or not sys.platform.startswith("linux") or \
            threading.active_count() > 1 or not any(a and b"\n" not in a for a in anchors):
        return 0
    if env:
        try:
            return max(0, min(int(env), 64))
        except ValueError:
            raise BadInput(f"OOMDOCTOR_JOBS={env!r}: not a number of workers")
    try:
        size = os.stat(path).st_size
        cores = len(os.sched_getaffinity(0))
    except OSError:
        return 0
    if size < PARALLEL_MIN_COMPRESSED or cores < 3:
        return 0
    if size < PARALLEL_MIN_BYTES and not (is_zstd(Path(path)) or probe(Path(path))[0]):
        return 0
    return min(cores - 1, MAX_JOBS)


# ----------------------------------------------------------------------------- the main side: cutting and sending
class Dispatcher:
    """A byte stream cut into pieces at newlines and sent to the workers' pipes (``write``/``close``, as feed.py
    writes to grep's stdin). Frames: ``_HEAD`` (first line, offset, length, newlines), then the bytes unless
    ``by_offset`` (the stream is the file the workers read themselves: offsets only)."""

    def __init__(self, fds: list[int], piece: int = PIECE, by_offset: bool = False) -> None:
        self.fds, self.piece, self.by_offset = fds, piece, by_offset
        self.carry = b""
        self.offset = 0                   # of the carry's first byte in the stream
        self.lines = 0                    # newlines sent so far
        self.long: int | None = None      # the worker a line longer than a piece is going to
        self._n = array.array("i", [0])

    def _least(self) -> int:
        best, fill = self.fds[0], None
        for fd in self.fds:
            fcntl.ioctl(fd, termios.FIONREAD, self._n)
            if fill is None or self._n[0] < fill:
                best, fill = fd, self._n[0]
        return best

    def _send(self, fd: int, first: int, data: memoryview, newlines: int, at: int) -> None:
        """``data``: the piece's bytes, at ``at`` in the stream."""
        head = memoryview(_HEAD.pack(first, at if self.by_offset else -1, len(data), newlines))
        for view in ((head,) if self.by_offset else (head, data)):
            while view:
                view = view[os.write(fd, view):]

    def write(self, data: bytes | memoryview) -> int:
        n = len(data)
        buf = self.carry + data if self.carry else bytes(data)
        view, pos, end, at = memoryview(buf), 0, len(buf), self.offset
        while True:
            if self.long is not None:                       # inside an over-long line: to the same worker
                nl = buf.find(b"\n", pos)
                stop = end if nl < 0 else nl + 1
                self._send(self.long, -1, view[pos:stop], 0 if nl < 0 else 1, at + pos)
                pos = stop
                if nl < 0:
                    break
                self.lines += 1
                self.long = None
                continue
            if end - pos < self.piece:
                break
            cut = buf.rfind(b"\n", pos, pos + self.piece)
            fd = self._least()
            if cut < 0:                                     # a line longer than a piece starts here
                self._send(fd, self.lines + 1, view[pos:pos + self.piece], 0, at + pos)
                self.long, pos = fd, pos + self.piece
                continue
            k = buf.count(b"\n", pos, cut + 1)
            self._send(fd, self.lines + 1, view[pos:cut + 1], k, at + pos)
            self.lines += k
            pos = cut + 1
        self.carry = buf[pos:]
        self.offset = at + pos
        return n

    def close(self) -> None:
        try:
            if self.carry:
                k = self.carry.count(b"\n")
                fd = self.long if self.long is not None else self._least()
                self._send(fd, -1 if self.long is not None else self.lines + 1, memoryview(self.carry), k,
                           self.offset)
                self.lines += k
                self.carry = b""
        finally:
            for fd in self.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.fds = []


# ----------------------------------------------------------------------------- merging
def merge(parts: list[dict], rules: dict[str, Rule], engines: Iterable[str]) -> Matched:
    """The workers' results as one matcher's (see the module's docstring)."""
    def unwire(m: Match) -> Match:
        m.rule = rules[m.rule]  # type: ignore[index]
        return m

    matches = sorted((unwire(m) for p in parts for m in p["matches"]), key=lambda m: m.line.n)[:MAX_STORED_MATCHES]
    counts = {e: 0 for e in engines}
    versions: dict[str, tuple[str, int]] = {}
    hits: dict[str, dict] = {}
    runtime = RuntimeTracker()
    for p in parts:
        for e, c in p["counts"].items():
            counts[e] = counts.get(e, 0) + c
        for e, v in p["versions"].items():
            if e not in versions or v[1] < versions[e][1]:
                versions[e] = v
        for rid, h in p["hits"].items():
            mine = hits.get(rid)
            if mine is None:
                hits[rid] = dict(h)
                continue
            count = 1 if rules[rid].role == "serving" else mine["count"] + h["count"]
            if h["line"] < mine["line"]:
                mine.update(h)
            mine["count"] = count
        for b in p["runtime"]._buckets.values():
            b.rejections = [unwire(m) for m in b.rejections]
        runtime.absorb(p["runtime"])
    return Matched(matches, counts, versions, runtime, hits)


# ----------------------------------------------------------------------------- running it
def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def scan_and_match(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo, rules: list[Rule],
                   engines: list[EngineSpec], grep: str, jobs: int, progress: Progress | None = None,
                   piece: int | None = None) -> Matched:
    """The parallel scan and match of ``path`` with ``jobs`` workers; fills ``info`` as scan.scan_blocks does."""
    path = Path(path)
    gz = compression_of(path, info)
    feeder = gz if callable(gz) else (_feed_gzip if gz else None)
    grep_anchors = sorted({a for a in anchors if a and b"\n" not in a})
    pattern_file = write_pattern(grep_anchors)
    cmd = grep_command(grep, pattern_file)
    env = grep_env()
    pids: list[int] = []
    data_w: list[int] = []
    result_r: list[int] = []
    side: dict = {}
    thread: threading.Thread | None = None
    try:
        shared = mmap.mmap(-1, 8 * jobs)                     # each worker's lines done, for the progress line
        progress_of = memoryview(shared).cast("q")
        _fork_workers(jobs, (path, cmd, env, grep_anchors, rules, engines), progress_of, pids, data_w, result_r)
        if feeder is None:                                    # offsets only: pieces need not fit a pipe
            piece = piece or FILE_PIECE
        else:
            piece = min(piece or PIECE, fcntl.fcntl(data_w[0], _F_GETPIPE_SZ))
        sink = Dispatcher(list(data_w), piece, by_offset=feeder is None)
        data_w = []                                           # the dispatcher closes them
        if feeder is None:
            thread = threading.Thread(target=_read_plain, args=(path, side, sink), daemon=True)
        else:
            thread = threading.Thread(target=feeder, args=(path, sink, side), daemon=True)
        thread.start()
        parts = _collect(result_r, side, progress, progress_of)
        thread.join()
        finish_side(path, side, progress)
        for p in parts:
            if "error" in p:
                raise BadInput(f"{path}: {p['error']}")
        return merge(parts, {r.id: r for r in rules}, [e.engine for e in engines])
    finally:
        _close(*data_w, *result_r)
        _reap(pids)
        if thread is not None:
            thread.join()
        os.unlink(pattern_file)
        fill_info(info, side)


_WorkerArgs = tuple[Path, list[str], dict, list[bytes], list[Rule], list[EngineSpec]]


def _fork_workers(jobs: int, args: _WorkerArgs, progress_of: memoryview, pids: list[int], data_w: list[int],
                  result_r: list[int]) -> None:
    """Fork ``jobs`` workers (``workers._worker(data pipe, result pipe, *args, progress slot)``); ``pids``,
    ``data_w`` and ``result_r`` get each one's pid, the write end of its data pipe, the read end of its result
    pipe, as it starts (the caller closes and reaps what they hold, whatever happens)."""
    pipes = [(os.pipe(), os.pipe()) for _ in range(jobs)]
    gc.freeze()                      # the objects made so far (the rules) stay out of the children's collections
    try:
        for i, ((dr, dw), (rr, rw)) in enumerate(pipes):
            try:
                fcntl.fcntl(dw, _F_SETPIPE_SZ, PIECE)
            except OSError:  # pragma: no cover - a pipe size limit
                pass
            pid = os.fork()
            if pid == 0:
                _child(i, pipes, args, progress_of[i:i + 1])
            pids.append(pid)
            _close(dr, rw)
            data_w.append(dw)
            result_r.append(rr)
    except BaseException:
        _close(*[fd for (dr, dw), (rr, rw) in pipes[len(pids):] for fd in (dr, dw, rr, rw)])
        raise
    finally:
        gc.unfreeze()


def _child(i: int, pipes: list, args: _WorkerArgs, slot: memoryview) -> NoReturn:
    """The forked worker ``i``: only its own two pipe ends stay open; nothing escapes it but its exit."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # the main process decides on ^C
        for j, ((dr, dw), (rr, rw)) in enumerate(pipes):
            _close(dw, rr)
            if j != i:
                _close(dr, rw)
        _worker(pipes[i][0][0], pipes[i][1][1], *args, slot)
    except BaseException:  # pragma: no cover - reported through the missing result
        code = 1
    finally:
        os._exit(code)


def _reap(pids: list[int]) -> None:
    """Done (results read) or not: no worker outlives the call."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass


def _collect(fds: list[int], side: dict, progress: Progress | None, done: memoryview) -> list[dict]:
    """Every worker's pickled result (read as it comes, all at once: a worker blocks on a full pipe)."""
    bufs: dict[int, list[bytes]] = {fd: [] for fd in fds}
    open_fds = list(fds)
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [], 0.25)
        for fd in ready:
            b = os.read(fd, 1 << 20)
            if b:
                bufs[fd].append(b)
            else:
                open_fds.remove(fd)
        if progress is not None and "tally" in side:
            progress.update(side["tally"].offset, sum(done))
    parts = []
    for fd in fds:
        data = b"".join(bufs[fd])
        if not data:
            parts.append({"error": "a scan worker stopped without a result"})
            continue
        parts.append(pickle.loads(data))  # noqa: S301 - our own forked child's bytes, over a private pipe
    return parts
