"""The worker side of the parallel scan (diagnose/parallel.py): a forked process that runs one grep over the pieces
of the log it is sent and grep's records through a LineMatcher, then sends back what the matcher found.

Frames from the main process (``_HEAD``: first line of a new piece or -1 for the same line going on, offset in the
file or -1 when the bytes follow in the pipe, length, newlines) are forwarded into grep's stdin by a thread: a
file's piece by ``os.sendfile`` from the page cache, a decompressed one by ``os.splice`` from the pipe. Each new
piece's (first local line, base) is recorded before its bytes reach grep, so that every record grep gives back
finds its piece, and the matcher's ``base`` maps the worker's own line numbers to the log's.
"""
from __future__ import annotations

import errno
import os
import pickle
import struct
import subprocess
import threading
from bisect import bisect_right
from pathlib import Path
from typing import Any

from oomdoctor.diagnose.match import LineMatcher, Match, _record_number
from oomdoctor.diagnose.rules import EngineSpec, Rule
from oomdoctor.diagnose.scan import LazyAnchors, _grep_blocks, _last_line, grep_failure, grep_limit
from oomdoctor.diagnose.signals import RuntimeTracker
from oomdoctor.errors import BadInput

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the parallel scan is not used there
    fcntl = None  # type: ignore[assignment]

PIECE = 1 << 20                 # at most a pipe's capacity: a piece is written to the least-filled worker at once
WORKER_BLOCK = 1 << 20          # grep records a worker hands its matcher at once (the one-process path: 4 MiB)
# first line of a new piece (or -1: the same line goes on), offset in the file (or -1: the bytes follow), byte
# length, newlines
_HEAD = struct.Struct("<qqqq")
_F_SETPIPE_SZ, _F_GETPIPE_SZ = 1031, 1032


def _read_exact(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _copy_file(src: int, out: int, offset: int, length: int) -> None:
    """``length`` bytes of the file ``src`` at ``offset`` into the pipe ``out``: by the kernel where it can."""
    try:
        while length:
            sent = os.sendfile(out, src, offset, length)
            if sent == 0:
                raise EOFError("the log got shorter while it was read")
            offset, length = offset + sent, length - sent
        return
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    while length:                                         # pragma: no cover - a file system without sendfile
        chunk = os.pread(src, min(length, 1 << 20), offset)
        if not chunk:
            raise EOFError("the log got shorter while it was read")
        offset, length = offset + len(chunk), length - len(chunk)
        _write_all(out, chunk)


def _write_all(out: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(out, view):]


def _copy_pipe(src: int, out: int, length: int) -> None:
    """``length`` bytes from the pipe ``src`` into the pipe ``out``: spliced where the kernel can."""
    splice = getattr(os, "splice", None)
    while length:
        if splice is not None:
            try:
                moved = splice(src, out, length)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                splice = None
                continue
            if moved == 0:
                raise EOFError("the main process stopped mid-piece")
            length -= moved
            continue
        chunk = os.read(src, min(length, 1 << 20))
        if not chunk:
            raise EOFError("the main process stopped mid-piece")
        length -= len(chunk)
        _write_all(out, chunk)


def _forward(fd: int, stdin: Any, path: Path, starts: list[int], bases: list[int], err: list[str]) -> None:
    """Worker thread: the frames from the main process into grep's stdin; each new piece's (first local line,
    base) is recorded before its bytes reach grep, so the records grep gives back always find their piece."""
    local = 0                                   # newlines forwarded
    out = stdin.fileno()
    src = -1
    try:
        while True:
            head = _read_exact(fd, _HEAD.size)
            if len(head) < _HEAD.size:
                break
            first, offset, length, newlines = _HEAD.unpack(head)
            if first >= 0:
                starts.append(local + 1)
                bases.append(first - (local + 1))
            if offset >= 0:
                if src < 0:
                    src = os.open(path, os.O_RDONLY)
                _copy_file(src, out, offset, length)
            else:
                _copy_pipe(fd, out, length)
            local += newlines
    except (OSError, EOFError) as e:
        err.append(str(e))
    finally:
        if src >= 0:
            os.close(src)
        try:
            stdin.close()
        except OSError:
            pass


def _feed_block(lm: LineMatcher, block: bytes, starts: list[int], bases: list[int]) -> None:
    """grep -n records of this worker, cut where a piece begins, each run with its piece's base."""
    first = bisect_right(starts, _record_number(block)) - 1
    last = bisect_right(starts, _last_line(block)) - 1
    if first == last:
        lm.base = bases[first]
        lm.add_block(block)
        return
    recs = block.split(b"\n")
    lo = 0
    for i in range(first, last + 1):
        hi = len(recs) if i == last else bisect_right(recs, starts[i + 1] - 1, lo, key=_record_number)
        if hi > lo:
            lm.base = bases[i]
            lm.add_block(b"\n".join(recs[lo:hi]))
        lo = hi


def _wire(m: Match) -> Match:
    m.rule = m.rule.id  # type: ignore[assignment]   # rules go back by id (the main process has the same ones)
    return m


def _worker(data_fd: int, result_fd: int, path: Path, cmd: list[str], env: dict, anchors: list[bytes],
            rules: list[Rule], engines: list[EngineSpec], done: memoryview) -> None:
    """``done``: this worker's slot of the shared progress counters (the lines its grep has passed)."""
    out: dict[str, Any] = {}
    try:
        runtime = RuntimeTracker()
        hits: dict[str, dict] = {}
        lm = LineMatcher(rules, engines, runtime, hits)
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                preexec_fn=grep_limit)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            fcntl.fcntl(proc.stdin.fileno(), _F_SETPIPE_SZ, PIECE)
        except OSError:  # pragma: no cover - a pipe size limit
            pass
        starts: list[int] = []
        bases: list[int] = []
        err: list[str] = []
        feeder = threading.Thread(target=_forward, args=(data_fd, proc.stdin, path, starts, bases, err), daemon=True)
        feeder.start()
        rx = LazyAnchors(anchors)
        for item in _grep_blocks(proc.stdout, rx, WORKER_BLOCK):
            if isinstance(item, tuple):
                lm.base = bases[bisect_right(starts, item[0]) - 1]
                lm.add_pairs([item])
                done[0] = item[0]
            else:
                _feed_block(lm, item, starts, bases)
                done[0] = _last_line(item)
        proc.wait()
        feeder.join()
        why = grep_failure(proc.returncode, proc.stderr)
        if why:
            raise BadInput(why)
        if err:
            raise BadInput(f"cannot be scanned ({err[0]})")
        for b in runtime._buckets.values():
            b.rejections = [_wire(m) for m in b.rejections]
            b.timeline()                                  # read the lazy samples here: they hold this matcher
        out = {"matches": [_wire(m) for m in lm.matches], "counts": lm.counts, "versions": lm.versions,
               "hits": hits, "runtime": runtime}
    except BadInput as e:
        out = {"error": str(e)}
    except Exception as e:  # pragma: no cover - a bug: reported, not hidden
        out = {"error": f"internal error in a scan worker: {type(e).__name__}: {e}"}
    data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(data)
    while view:
        view = view[os.write(result_fd, view):]
