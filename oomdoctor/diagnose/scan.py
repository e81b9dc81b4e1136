"""Stage 1b — scan: find the lines that can matter, fast.

Every rule names (or has derived from its regex) a literal *anchor* that any line it can
match must contain. Only lines holding an anchor go on to parsing and rule matching.

Two implementations return the same lines:
- ``grep`` (``LC_ALL=C grep -a -n -E -f <one alternation of the escaped anchors>``): used when a
  grep binary is on PATH, because grep is tens of times faster than Python's line loop on the
  gigabyte-sized logs of long-running servers (and, in GNU grep 3.8, one ERE alternation is ~1.7x
  faster than ``-F -f`` with the same strings: docs/performance.md); a .gz (zlib) or .zst is decompressed in
  a thread and piped into grep (diagnose/feed.py); grep's output comes back in 4 MiB blocks of ``N:line``
  records, the matcher's fast input (``scan_blocks``; ``scan`` gives (number, line) pairs);
- pure Python (line by line, one compiled alternation): the fallback, and the reference
  the test-suite compares the grep path with: same (line number, line) pairs, same cut of lines
  longer than MAX_LINE_BYTES (only their first MAX_LINE_BYTES are searched), same SourceInfo.
The file's sha256, size, line count and over-long lines are computed alongside, in a thread
(hashlib and zlib release the GIL).
"""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from oomdoctor.errors import BadInput
from oomdoctor.diagnose.feed import _feed_gzip, _feed_zstd, _read_plain, is_zstd, zstd_lines
from oomdoctor.diagnose.progress import Progress
from oomdoctor.diagnose.read import MAX_LINE_BYTES, SourceInfo, is_utf16, iter_lines, probe


# the logs diagnose/parallel.py takes (on three or more cores): a plain one of PARALLEL_MIN_BYTES or more, a compressed
# one of PARALLEL_MIN_COMPRESSED or more as stored; below the latter that module is not even imported (classify)
PARALLEL_MIN_BYTES = 64 << 20
PARALLEL_MIN_COMPRESSED = PARALLEL_MIN_BYTES // 8


def _anchor_regex(anchors: Iterable[bytes]) -> re.Pattern[bytes]:
    alts = sorted({a for a in anchors if a}, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(a) for a in alts)) if alts else re.compile(b"(?!)")


class LazyAnchors:
    """The anchors' alternation for the grep path, compiled when first searched: only a record that grep matched
    beyond the read limit (a cut line) is searched again, and compiling ~300 anchors costs more than a small log."""

    def __init__(self, anchors: Iterable[bytes]) -> None:
        self._anchors = list(anchors)
        self._rx: re.Pattern[bytes] | None = None

    def search(self, data: bytes) -> re.Match[bytes] | None:
        if self._rx is None:
            self._rx = _anchor_regex(self._anchors)
        return self._rx.search(data)


def scan_python(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo) -> Iterator[tuple[int, bytes]]:
    rx = _anchor_regex(anchors)
    lines = zstd_lines(Path(path), info) if is_zstd(Path(path)) else iter_lines(path, info)
    for n, line in lines:
        if rx.search(line):
            yield n, line


def _ere(anchors: list[bytes]) -> bytes:
    """One ERE alternation of fixed strings. GNU grep runs a single alternation through its DFA
    matcher, which on a 1 GiB serving log is ~1.7x faster than ``-F -f`` with the same strings."""
    return b"|".join(re.sub(rb"([.\[\]()*+?{}|^$\\])", rb"\\\1", a) for a in anchors)


def grep_env() -> dict[str, str]:
    """The environment grep runs in: bytes as bytes (LC_ALL=C), no options from GREP_OPTIONS."""
    env = dict(os.environ, LC_ALL="C")
    env.pop("GREP_OPTIONS", None)            # old greps read options from it (e.g. --color=always)
    return env


def write_pattern(grep_anchors: list[bytes]) -> str:
    """A temporary file holding the anchors' ERE (grep -f): its path; the caller removes it."""
    with tempfile.NamedTemporaryFile("wb", suffix=".ere", delete=False) as tf:
        tf.write(_ere(grep_anchors) + b"\n")
        return tf.name


def grep_command(grep: str, pattern_file: str) -> list[str]:
    return [grep, "-a", "-n", "-E", "-f", pattern_file]


#: the address space grep may take (OOMDOCTOR_GREP_MAX_BYTES overrides). GNU grep holds a whole line in memory (a
#: 300 MB line without a newline took 590 MB); past this bound it stops with "memory exhausted" and the log is read
#: again by the Python scanner, whose memory does not grow with a line (diagnose.classify)
GREP_MAX_BYTES = 256 << 20
GREP_OUT_OF_MEMORY = "memory exhausted"          # gnulib's xalloc_die, in the C locale grep runs in


def grep_limit() -> None:
    """preexec_fn of a grep process: its address space bounded (GREP_MAX_BYTES)."""
    import resource

    cap = int(os.environ.get("OOMDOCTOR_GREP_MAX_BYTES") or GREP_MAX_BYTES)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def grep_failure(returncode: int | None, stderr: IO[bytes] | None) -> str | None:
    """Why grep failed (its exit status is neither 0, lines found, nor 1, none found), or None."""
    if returncode in (0, 1):
        return None
    err = stderr.read().decode(errors="replace").strip() if stderr is not None else ""
    return f"cannot be scanned ({err or 'grep exit ' + str(returncode)})"


def compression_of(path: Path, info: SourceInfo) -> Callable | bool:
    """The log's compression as the readers take it: feed._feed_zstd for zstd, True for gzip, False for none
    (``info.compressed`` set)."""
    gz: Callable | bool = _feed_zstd if is_zstd(path) else probe(path)[0]
    info.compressed = bool(gz)
    return gz


def finish_side(path: Path, side: dict, progress: Progress | None) -> None:
    """After the side thread (feed.py) ended: the progress line's last word, and its error, if any, as BadInput."""
    if progress is not None:
        tally = side.get("tally")
        progress.done(tally.offset if tally is not None else 0, side.get("lines", 0))
    if "error" in side:
        raise BadInput(f"{path}: {side['error']}")


def fill_info(info: SourceInfo, side: dict) -> None:
    """What the side thread counted, into the log's SourceInfo."""
    info.sha256 = side.get("sha256", "")
    info.size_bytes = side.get("size", 0)
    info.lines = side.get("lines", 0)
    info.cut_lines = list(side.get("cut_lines", []))


def _start_grep(path: Path, anchors: list[bytes], gz: Callable | bool, grep: str,
                side: dict) -> tuple[subprocess.Popen[bytes] | None, threading.Thread, str | None]:
    """grep over the file (or over the decompressed stream fed to its stdin; ``gz``: True for gzip, or the feeding
    function, e.g. feed._feed_zstd), and the thread that hashes and counts the file meanwhile. Returns (grep process
    or None when there is nothing to look for, thread, pattern file)."""
    feeder = gz if callable(gz) else _feed_gzip
    env = grep_env()
    # an anchor holding a newline can never match a line (python path neither); drop it from grep's pattern
    grep_anchors = [a for a in anchors if b"\n" not in a]
    if not grep_anchors:                     # nothing to look for: still hash and count
        worker = threading.Thread(target=(feeder if gz else _read_plain),
                                  args=((path, io.BytesIO(), side) if gz else (path, side)), daemon=True)
        return None, worker, None
    pattern_file = write_pattern(grep_anchors)
    cmd = grep_command(grep, pattern_file)
    if gz:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                preexec_fn=grep_limit)
        worker = threading.Thread(target=feeder, args=(path, proc.stdin, side), daemon=True)
    else:
        proc = subprocess.Popen(cmd + ["--", str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, preexec_fn=grep_limit)
        worker = threading.Thread(target=_read_plain, args=(path, side), daemon=True)
    return proc, worker, pattern_file


def _record(rec: bytes, whole: bool, rx: re.Pattern[bytes] | LazyAnchors) -> tuple[int, bytes] | None:
    """One grep ``N:line`` record (without its newline; ``whole``: not cut by the read limit) as (N, line cut to
    MAX_LINE_BYTES), or None when it is no candidate after the cut."""
    colon = rec.find(b":")
    if colon <= 0:
        return None
    line = rec[colon + 1:]
    text = line[:MAX_LINE_BYTES].rstrip(b"\r\n")
    if (len(text) != len(line) or not whole) and not rx.search(text):
        return None                          # grep matched beyond the cut (or in the stripped tail)
    return int(rec[:colon]), text


def _grep_records(out: IO[bytes], rx: re.Pattern[bytes] | LazyAnchors) -> Iterator[tuple[int, bytes]]:
    """grep's ``N:line`` records as (N, line cut to MAX_LINE_BYTES)."""
    limit = MAX_LINE_BYTES + 32              # "<line number>:" + the line's first MAX_LINE_BYTES + "\n"
    while True:
        rec = out.readline(limit)
        if not rec:
            break
        whole = rec.endswith(b"\n")
        if not whole:                        # longer than the limit: skip the rest of it
            while True:
                rest = out.readline(limit)
                if not rest or rest.endswith(b"\n"):
                    break
        got = _record(rec[:-1] if whole else rec, whole, rx)
        if got is not None:
            yield got


BLOCK_READ = 1 << 20
BLOCK_BYTES = 4 << 20            # records handed to the matcher at once (its per-block work is per shape)
_HALF = MAX_LINE_BYTES // 2


def _clean(block: bytes) -> bool:
    """No carriage return and certainly no line of MAX_LINE_BYTES or more (such a line holds a whole aligned
    half-MiB window without a newline): the block's records need no cutting or stripping."""
    if b"\r" in block:
        return False
    return all(block.find(b"\n", p, p + _HALF) >= 0 for p in range(0, len(block) - _HALF + 1, _HALF))


def _grep_blocks(out: IO[bytes], rx: re.Pattern[bytes] | LazyAnchors,
                 block_bytes: int = BLOCK_BYTES) -> Iterator[bytes | tuple[int, bytes]]:
    """grep's output in blocks: a ``bytes`` item is whole ``N:line`` records joined by newlines (the matcher's
    fast input, see match.LineMatcher.add_block); records that need cutting or stripping come as (N, line)
    pairs, exactly as ``_grep_records`` gives them."""
    fd = out.fileno()
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), BLOCK_READ)
    except (ImportError, OSError):           # pragma: no cover - not Linux, or a pipe size limit
        pass
    limit = MAX_LINE_BYTES + 32
    parts: list[bytes] = []                  # whole records (each piece ends with a newline), gathered to a block
    size, partial, skipping = 0, b"", False  # partial: the unfinished record after the last newline
    while True:
        buf = os.read(fd, BLOCK_READ)
        if not buf:
            break
        if skipping:                         # the tail of an over-long record
            nl = buf.find(b"\n")
            if nl < 0:
                continue
            buf, skipping = buf[nl + 1:], False
        cut = buf.rfind(b"\n")
        if cut < 0:
            partial += buf
            if len(partial) >= limit:        # an over-long record: the records before it, its head, skip its end
                if parts:
                    yield from _split_dirty(b"".join(parts)[:-1], rx)
                    parts, size = [], 0
                got = _record(partial[:limit], False, rx)
                if got is not None:
                    yield got
                partial, skipping = b"", True
            continue
        parts.append(partial + buf[:cut + 1])
        size += len(parts[-1])
        partial = buf[cut + 1:]
        if size >= block_bytes:
            yield from _split_dirty(b"".join(parts)[:-1], rx)
            parts, size = [], 0
    if parts:
        yield from _split_dirty(b"".join(parts)[:-1], rx)
    if partial and not skipping:
        yield from _grep_records(io.BytesIO(partial), rx)


def _split_dirty(block: bytes, rx: re.Pattern[bytes] | LazyAnchors) -> Iterator[bytes | tuple[int, bytes]]:
    """A block as is when it is clean; else its clean runs of records as blocks and the others (a carriage
    return, a line to cut) as (N, line) pairs."""
    if _clean(block):
        yield block
        return
    run: list[bytes] = []
    for rec in block.split(b"\n"):
        if b"\r" not in rec and len(rec) < MAX_LINE_BYTES:
            run.append(rec)
            continue
        if run:
            yield b"\n".join(run)
            run = []
        got = _record(rec, len(rec) <= MAX_LINE_BYTES + 31, rx)
        if got is not None:
            yield got
    if run:
        yield b"\n".join(run)


def _last_line(item: bytes | tuple[int, bytes]) -> int:
    """The number of the last line in a ``_grep_blocks`` item: how far the matcher has come."""
    if isinstance(item, tuple):
        return item[0]
    start = item.rfind(b"\n") + 1
    return int(item[start:item.find(b":", start)])


def pairs_of(items: Iterable[bytes | tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    """(N, line) pairs of ``_grep_blocks``' items."""
    for item in items:
        if isinstance(item, tuple):
            yield item
            continue
        for rec in item.split(b"\n"):
            colon = rec.find(b":")
            yield int(rec[:colon]), rec[colon + 1:]


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


def _grep_items(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo, grep: str,
                progress: Progress | None = None) -> Iterator[bytes | tuple[int, bytes]]:
    path = Path(path)
    gz = compression_of(path, info)
    anchors = sorted({a for a in anchors if a})
    rx = LazyAnchors(anchors)
    side: dict = {}
    proc, worker, pattern_file = _start_grep(path, anchors, gz, grep, side)
    worker.start()
    try:
        if proc is not None and proc.stdout is not None:
            for item in _grep_blocks(proc.stdout, rx):
                yield item
                if progress is not None and "tally" in side:
                    progress.update(side["tally"].offset, _last_line(item))
            proc.wait()
        worker.join()
        finish_side(path, side, progress)
        why = grep_failure(proc.returncode, proc.stderr) if proc is not None else None
        if why:
            raise BadInput(f"{path}: {why}")
    finally:
        _stop_grep(proc, worker, pattern_file)
        fill_info(info, side)


def scan_grep(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo, grep: str) -> Iterator[tuple[int, bytes]]:
    """The grep fast path; yields exactly what ``scan_python`` yields (the test-suite checks it):
    a line longer than MAX_LINE_BYTES is cut and only its first MAX_LINE_BYTES are searched."""
    return pairs_of(_grep_items(path, anchors, info, grep))


def _grep_for(anchors: list[bytes], engine: str, path: str | os.PathLike) -> str | None:
    grep = shutil.which("grep") if engine in ("auto", "grep") else None
    if engine == "grep" and not grep:
        raise BadInput("--scanner grep: no grep binary on PATH")
    if (grep and not os.environ.get("OOMDOCTOR_NO_GREP") and not any(b"\x00" in a for a in anchors)
            and not is_utf16(path)):            # grep reads bytes: a UTF-16 log is read (transcoded) in Python
        return grep
    return None


def scan(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo | None = None,
         engine: str = "auto") -> Iterator[tuple[int, bytes]]:
    """Yield (line_number, raw_line) for every line that holds one of ``anchors``.

    ``engine``: "auto" (grep when available), "grep" or "python".
    """
    info = info if info is not None else SourceInfo(str(path))
    anchors = list(anchors)
    grep = _grep_for(anchors, engine, path)
    return scan_grep(path, anchors, info, grep) if grep else scan_python(path, anchors, info)


def _python_items(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo,
                  progress: Progress | None) -> Iterator[tuple[int, bytes]]:
    n = 0
    for n, line in scan_python(path, anchors, info):
        yield n, line
        if progress is not None and not n % 4096:
            progress.update(info.size_bytes, n)
    if progress is not None:
        progress.done(info.size_bytes, info.lines)


def scan_blocks(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo | None = None,
                engine: str = "auto", progress: Progress | None = None) -> Iterator[bytes | tuple[int, bytes]]:
    """What ``scan`` finds, in the matcher's fast form: blocks of grep ``N:line`` records (``bytes`` items) and
    (number, line) pairs (see ``match.match_lines``). ``progress`` gets the bytes and lines read as they go."""
    info = info if info is not None else SourceInfo(str(path))
    anchors = list(anchors)
    grep = _grep_for(anchors, engine, path)
    if grep:
        return _grep_items(path, anchors, info, grep, progress)
    return _python_items(path, anchors, info, progress) if progress is not None else scan_python(path, anchors, info)
