"""Stage 1 — read: open a log (plain or gzip), refuse what is not a text log, stream its lines.

Nothing here holds the whole file in memory: lines are produced one at a time, a line
longer than ``MAX_LINE_BYTES`` is cut (the rest of it is skipped, not buffered), and the
file's sha256 is computed while it is read.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import sys
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from oomdoctor.errors import BadInput

MAX_LINE_BYTES = 1 << 20          # 1 MiB: longer lines are cut, their tail skipped
PROBE_BYTES = 64 * 1024           # what is looked at to tell text from binary
CHUNK = 4 << 20
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class SourceInfo:
    """Facts about the file read, filled while it is streamed."""

    path: str
    size_bytes: int = 0
    compressed: bool = False
    sha256: str = ""
    lines: int = 0
    cut_lines: list[int] = field(default_factory=list)   # line numbers longer than MAX_LINE_BYTES


def _open_raw(path: Path) -> io.BufferedReader:
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a log file")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file")
    except PermissionError:
        raise BadInput(f"{path}: permission denied")
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror or e})")


def is_gzip(path: Path) -> bool:
    with _open_raw(path) as f:
        return f.read(2) == GZIP_MAGIC


def looks_binary(sample: bytes) -> bool:
    """True for data that is not a text log: mostly control bytes (NUL included) or mostly invalid UTF-8. A few stray
    bytes in a pasted or crash-truncated log (a NUL, a broken UTF-8 sequence) do not make it binary."""
    if not sample:
        return False
    ctrl = sum(1 for b in sample if b < 32 and b not in (9, 10, 13, 27, 12, 8))
    if ctrl / len(sample) > 0.10:
        return True
    # random bytes: about half of them are >= 0x80 and almost none form valid UTF-8; a log in latin-1 or with
    # a few broken characters has a small share of them
    bad = sample.decode("utf-8", errors="replace").count("\ufffd")
    return bad / len(sample) > 0.35


def probe(path: Path) -> tuple[bool, bytes]:
    """(is_gzip, first decoded bytes). Raises BadInput for empty, binary or broken gzip files."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if path.is_dir():
        raise BadInput(f"{path}: is a directory, not a log file")
    gz = is_gzip(path)
    try:
        with (gzip.open(path, "rb") if gz else _open_raw(path)) as f:
            head = f.read(PROBE_BYTES)
            while head and not head.strip():      # leading blank lines: look further before calling it empty
                head = f.read(PROBE_BYTES)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise BadInput(f"{path}: truncated or corrupt gzip file ({e})")
    if not head.strip():
        raise BadInput(f"{path}: the log is empty")
    if looks_binary(head):
        raise BadInput(f"{path}: binary data, not a text log")
    return gz, head


class HashingReader(io.RawIOBase):
    """Wraps a binary file and feeds every byte read into sha256 (of the file as stored)."""

    def __init__(self, f: io.BufferedReader, info: SourceInfo):
        self._f = f
        self._h = hashlib.sha256()
        self._info = info

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self._f.readinto(b)
        if n:
            self._h.update(memoryview(b)[:n])
            self._info.size_bytes += n
        return n or 0

    def finish(self) -> None:
        # hash whatever the consumer did not read (e.g. the tail after an early stop)
        while True:
            buf = self._f.read(CHUNK)
            if not buf:
                break
            self._h.update(buf)
            self._info.size_bytes += len(buf)
        self._info.sha256 = self._h.hexdigest()

    def close(self) -> None:
        self._f.close()
        super().close()


def iter_lines(path: str | os.PathLike, info: SourceInfo | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield (line_number, raw_line_without_newline) for every line; 1-based numbers.

    A line longer than MAX_LINE_BYTES is yielded cut to that length; its number goes into
    ``info.cut_lines``. Raises BadInput for files that cannot be logs.
    """
    path = Path(path)
    gz, _ = probe(path)
    wants_hash = info is not None        # nobody reads the sha256 of a throw-away SourceInfo
    info = info if info is not None else SourceInfo(str(path))
    info.compressed = gz
    raw = HashingReader(_open_raw(path), info)
    stream: io.BufferedIOBase = gzip.GzipFile(fileobj=io.BufferedReader(raw, CHUNK)) if gz else io.BufferedReader(raw, CHUNK)
    n = 0
    try:
        while True:
            line = stream.readline(MAX_LINE_BYTES)
            if not line:
                break
            n += 1
            if not line.endswith(b"\n") and len(line) >= MAX_LINE_BYTES:
                info.cut_lines.append(n)
                while True:                       # skip the rest of the over-long line
                    rest = stream.readline(MAX_LINE_BYTES)
                    if not rest or rest.endswith(b"\n"):
                        break
            yield n, line.rstrip(b"\r\n")
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise BadInput(f"{path}: truncated or corrupt gzip file after line {n} ({e})")
    finally:
        info.lines = n
        try:
            if wants_hash:           # an early stop (e.g. reading only the header) must not read the whole file
                raw.finish()
        finally:
            stream.close()


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with _open_raw(Path(path)) as f:
        while True:
            buf = f.read(CHUNK)
            if not buf:
                break
            h.update(buf)
    return h.hexdigest()


# --- the stdin entry point -------------------------------------------------------------------------------

#: the names a user gives for "the log comes on stdin" (`journalctl -u vllm | oomdoctor diagnose -`)
STDIN_NAMES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
STDIN_SHOWN = "<stdin>"


def is_stdin(path: str | os.PathLike) -> bool:
    return str(path) in STDIN_NAMES


def _spool(src: BinaryIO, dst: BinaryIO) -> None:
    while True:
        buf = src.read(CHUNK)
        if not buf:
            break
        dst.write(buf)


@contextmanager
def log_source(path: str | os.PathLike, stdin: BinaryIO | None = None) -> Iterator[tuple[Path, str]]:
    """(the path to read, the name to show) for a log argument.

    A file is itself. stdin (``-``, ``/dev/stdin``; a pipe, a redirect, gzip or plain) is streamed CHUNK by
    CHUNK into a private temporary file first: the stages read a log more than once (scan, workload, the grep
    prefilter in its own process, whose stdin is not ours), and a pipe can be read only once. The same bytes
    therefore give the same result as from a file. Errors name ``<stdin>``, never the temporary file.
    """
    if not is_stdin(path):
        yield Path(path), str(path)
        return
    src = stdin if stdin is not None else sys.stdin.buffer
    if src.isatty():
        raise BadInput(f"{path}: stdin is a terminal; pipe a log in (journalctl -u vllm | oomdoctor diagnose -)")
    with tempfile.TemporaryDirectory(prefix="oomdoctor-stdin-") as d:
        tmp = Path(d) / "stdin.log"
        with open(tmp, "wb") as out:
            _spool(src, out)
        try:
            yield tmp, STDIN_SHOWN
        except BadInput as e:
            raise BadInput(str(e).replace(str(tmp), STDIN_SHOWN)) from None
