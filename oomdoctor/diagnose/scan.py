"""Stage 1b — scan: find the lines that can matter, fast.

Every rule names (or has derived from its regex) a literal *anchor* that any line it can
match must contain. Only lines holding an anchor go on to parsing and rule matching.

Two implementations return the same lines:
- ``grep`` (``LC_ALL=C grep -a -n -E -f <one alternation of the escaped anchors>``): used when a
  grep binary is on PATH, because grep is tens of times faster than Python's line loop on the
  gigabyte-sized logs of long-running servers (and, in GNU grep 3.8, one ERE alternation is ~1.7x
  faster than ``-F -f`` with the same strings: docs/performance.md); a .gz is decompressed in a
  thread (zlib) and piped into grep;
- pure Python (line by line, one compiled alternation): the fallback, and the reference
  the test-suite compares the grep path with: same (line number, line) pairs, same cut of lines
  longer than MAX_LINE_BYTES (only their first MAX_LINE_BYTES are searched), same SourceInfo.
The file's sha256, size, line count and over-long lines are computed alongside, in a thread
(hashlib and zlib release the GIL).
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zlib
from pathlib import Path
from typing import IO, Iterable, Iterator

from oomdoctor.errors import BadInput
from oomdoctor.diagnose.read import CHUNK, MAX_LINE_BYTES, SourceInfo, inflate as _inflate, is_utf16, iter_lines, probe


def _anchor_regex(anchors: Iterable[bytes]) -> re.Pattern[bytes]:
    alts = sorted({a for a in anchors if a}, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(a) for a in alts)) if alts else re.compile(b"(?!)")


def scan_python(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo) -> Iterator[tuple[int, bytes]]:
    rx = _anchor_regex(anchors)
    for n, line in iter_lines(path, info):
        if rx.search(line):
            yield n, line


class _Tally:
    """Counts lines and finds the over-long ones (>= MAX_LINE_BYTES before the newline) in a byte
    stream fed chunk by chunk, with the same numbering as ``read.iter_lines``. Cheap: one C-level
    ``count`` per chunk, and a newline probe per half-MiB block (a line of >= 1 MiB must contain a
    whole aligned half-MiB block without a newline), so the per-line work stays out of Python."""

    HALF = MAX_LINE_BYTES // 2

    def __init__(self) -> None:
        self.lines = 0              # complete lines seen (newlines)
        self.offset = 0             # bytes seen
        self.line_start = 0         # offset where the current (unfinished) line starts
        self.cut_lines: list[int] = []

    def feed(self, buf: bytes) -> None:
        if not buf:
            return
        first = buf.find(b"\n")
        if first < 0:
            self.offset += len(buf)
            return
        if self.offset + first - self.line_start >= MAX_LINE_BYTES:
            self.cut_lines.append(self.lines + 1)
        last = buf.rfind(b"\n")
        p = first + 1
        while p + self.HALF <= last:           # lines wholly inside (first, last]
            if buf.find(b"\n", p, p + self.HALF) >= 0:
                p += self.HALF
                continue
            s = buf.rfind(b"\n", 0, p) + 1
            e = buf.find(b"\n", p)
            if e - s >= MAX_LINE_BYTES:
                self.cut_lines.append(self.lines + 1 + buf.count(b"\n", 0, s))
            p = e + 1
        self.lines += buf.count(b"\n")
        self.offset += len(buf)
        self.line_start = self.offset - len(buf) + last + 1

    def finish(self) -> tuple[int, list[int]]:
        if self.offset > self.line_start:          # a last line without a newline
            self.lines += 1
            if self.offset - self.line_start >= MAX_LINE_BYTES:
                self.cut_lines.append(self.lines)
        return self.lines, self.cut_lines


def _read_plain(path: Path, out: dict) -> None:
    """Thread: sha256, size, line count and over-long lines of a plain file (grep reads it itself)."""
    try:
        h = hashlib.sha256()
        tally = _Tally()
        with open(path, "rb") as f:
            while True:
                buf = f.read(CHUNK)
                if not buf:
                    break
                h.update(buf)          # releases the GIL
                tally.feed(buf)
        out["sha256"] = h.hexdigest()
        out["size"] = tally.offset
        out["lines"], out["cut_lines"] = tally.finish()
    except OSError as e:  # pragma: no cover - the file vanished mid-read
        out["error"] = f"cannot be read ({e.strerror or e})"


def _feed_gzip(path: Path, sink, out: dict) -> None:
    """Thread: hash the .gz as stored, decompress it, count its lines and write it to grep's stdin."""
    h = hashlib.sha256()
    tally = _Tally()
    fd = sink.fileno() if hasattr(sink, "raw") else None
    try:
        with open(path, "rb") as f:
            for data in _inflate(f, h):
                tally.feed(data)
                view = memoryview(data)
                while view:                    # os.write: no buffer lock left held if grep is killed mid-write
                    view = view[os.write(fd, view):] if fd is not None else view[sink.write(view):]
            out["size"] = f.tell()
        out["sha256"] = h.hexdigest()
        out["lines"], out["cut_lines"] = tally.finish()
    except (EOFError, zlib.error) as e:
        out["error"] = f"truncated or corrupt gzip file ({e})"
    except (BrokenPipeError, ValueError, OSError) as e:      # grep went away (early stop), or the file did
        out["quiet_error"] = str(e)
    finally:
        try:
            sink.close()
        except OSError:
            pass


def _ere(anchors: list[bytes]) -> bytes:
    """One ERE alternation of fixed strings. GNU grep runs a single alternation through its DFA
    matcher, which on a 1 GiB serving log is ~1.7x faster than ``-F -f`` with the same strings."""
    return b"|".join(re.sub(rb"([.\[\]()*+?{}|^$\\])", rb"\\\1", a) for a in anchors)


def _start_grep(path: Path, anchors: list[bytes], gz: bool, grep: str,
                side: dict) -> tuple[subprocess.Popen[bytes] | None, threading.Thread, str | None]:
    """grep over the file (or over the gunzipped stream fed to its stdin), and the thread that hashes and counts
    the file meanwhile. Returns (grep process or None when there is nothing to look for, thread, pattern file)."""
    env = dict(os.environ, LC_ALL="C")
    env.pop("GREP_OPTIONS", None)            # old greps read options from it (e.g. --color=always)
    # an anchor holding a newline can never match a line (python path neither); drop it from grep's pattern
    grep_anchors = [a for a in anchors if b"\n" not in a]
    if not grep_anchors:                     # nothing to look for: still hash and count
        worker = threading.Thread(target=(_feed_gzip if gz else _read_plain),
                                  args=((path, io.BytesIO(), side) if gz else (path, side)), daemon=True)
        return None, worker, None
    with tempfile.NamedTemporaryFile("wb", suffix=".ere", delete=False) as tf:
        tf.write(_ere(grep_anchors) + b"\n")
        pattern_file = tf.name
    cmd = [grep, "-a", "-n", "-E", "-f", pattern_file]
    if gz:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        worker = threading.Thread(target=_feed_gzip, args=(path, proc.stdin, side), daemon=True)
    else:
        proc = subprocess.Popen(cmd + ["--", str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        worker = threading.Thread(target=_read_plain, args=(path, side), daemon=True)
    return proc, worker, pattern_file


def _grep_records(out: IO[bytes], rx: re.Pattern[bytes]) -> Iterator[tuple[int, bytes]]:
    """grep's ``N:line`` records as (N, line cut to MAX_LINE_BYTES)."""
    limit = MAX_LINE_BYTES + 32              # "<line number>:" + the line's first MAX_LINE_BYTES + "\n"
    while True:
        rec = out.readline(limit)
        if not rec:
            break
        colon = rec.find(b":")
        if colon <= 0:
            continue
        n = int(rec[:colon])
        if rec.endswith(b"\n"):
            line = rec[colon + 1:-1]
        else:                                # longer than the limit: skip the rest of it
            line = rec[colon + 1:]
            while True:
                rest = out.readline(limit)
                if not rest or rest.endswith(b"\n"):
                    break
        text = line[:MAX_LINE_BYTES].rstrip(b"\r\n")
        if len(text) != len(line) and not rx.search(text):
            continue                         # grep matched beyond the cut (or in the stripped tail)
        yield n, text


def _stop_grep(proc: subprocess.Popen[bytes] | None, worker: threading.Thread, pattern_file: str | None) -> None:
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for s in (proc.stdout, proc.stderr):
            if s is not None:
                s.close()
    worker.join()
    if proc is not None and proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    if pattern_file:
        os.unlink(pattern_file)


def scan_grep(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo, grep: str) -> Iterator[tuple[int, bytes]]:
    """The grep fast path; yields exactly what ``scan_python`` yields (the test-suite checks it):
    a line longer than MAX_LINE_BYTES is cut and only its first MAX_LINE_BYTES are searched."""
    path = Path(path)
    gz, _ = probe(path)
    info.compressed = gz
    anchors = sorted({a for a in anchors if a})
    rx = _anchor_regex(anchors)
    side: dict = {}
    proc, worker, pattern_file = _start_grep(path, anchors, gz, grep, side)
    worker.start()
    try:
        out: IO[bytes] = proc.stdout if proc is not None and proc.stdout is not None else io.BytesIO()
        yield from _grep_records(out, rx)
        if proc is not None:
            proc.wait()
        worker.join()
        if "error" in side:
            raise BadInput(f"{path}: {side['error']}")
        if proc is not None and proc.returncode not in (0, 1):
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr is not None else ""
            raise BadInput(f"{path}: cannot be scanned ({err or 'grep exit ' + str(proc.returncode)})")
    finally:
        _stop_grep(proc, worker, pattern_file)
        info.sha256 = side.get("sha256", "")
        info.size_bytes = side.get("size", 0)
        info.lines = side.get("lines", 0)
        info.cut_lines = list(side.get("cut_lines", []))


def scan(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo | None = None,
         engine: str = "auto") -> Iterator[tuple[int, bytes]]:
    """Yield (line_number, raw_line) for every line that holds one of ``anchors``.

    ``engine``: "auto" (grep when available), "grep" or "python".
    """
    info = info if info is not None else SourceInfo(str(path))
    anchors = list(anchors)
    grep = shutil.which("grep") if engine in ("auto", "grep") else None
    if engine == "grep" and not grep:
        raise BadInput("--scanner grep: no grep binary on PATH")
    if (grep and not os.environ.get("OOMDOCTOR_NO_GREP") and not any(b"\x00" in a for a in anchors)
            and not is_utf16(path)):            # grep reads bytes: a UTF-16 log is read (transcoded) in Python
        return scan_grep(path, anchors, info, grep)
    return scan_python(path, anchors, info)
