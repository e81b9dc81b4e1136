"""Stage 1 — read: open a log (plain or gzip), refuse what is not a text log, stream its lines.

Nothing here holds the whole file in memory: lines are produced one at a time, a line
longer than ``MAX_LINE_BYTES`` is cut (the rest of it is skipped, not buffered), and the
file's sha256 is computed while it is read.
"""
from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import os
import shutil
import stat
import sys
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Iterator

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
    undone: list[str] = field(default_factory=list)      # what pasting had added and was undone (diagnose/paste.py)
    read_as: str = "a pasted log"                        # what the undone note calls the log (paste.Paste.read_as)


def _kind(mode: int) -> str:
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def open_regular(path: str | os.PathLike, what: str = "log file") -> io.BufferedReader:
    """``path`` opened for reading, refusing (BadInput, one line) what is not a regular file: a directory, a FIFO
    (opening one would wait for a writer: it is opened non-blocking and refused), a device, a socket."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a {what}")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file")
    except PermissionError:
        raise BadInput(f"{path}: permission denied")
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror or e})")
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise BadInput(f"{path}: is a directory, not a {what}")
        if not stat.S_ISREG(mode):
            raise BadInput(f"{path}: is {_kind(mode)}, not a {what} (give a regular file)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike, cap: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``cap`` of them: BadInput (one line) when it is larger, or
    not a regular file. What every small input (card, receipt, project file, metrics, snapshot) is read with."""
    with open_regular(path, what) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise BadInput(f"{path}: larger than {cap:,} bytes; not a {what} this reads")
    return data


def _open_raw(path: Path) -> io.BufferedReader:
    return open_regular(path)


def is_gzip(path: Path) -> bool:
    with _open_raw(path) as f:
        return f.read(2) == GZIP_MAGIC


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def looks_binary(sample: bytes) -> bool:
    """True for data that is not a text log: mostly control bytes (NUL included) or mostly invalid UTF-8. A few stray
    bytes in a pasted or crash-truncated log (a NUL, a broken UTF-8 sequence) do not make it binary."""
    if not sample:
        return False
    # a NUL or two (a stray byte, a crash's zero-filled tail further down) is not what makes a file binary: NULs
    # count as the control bytes they are, and only a file that is mostly not text is refused
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
    gz = is_gzip(path)
    try:
        with (gzip.open(path, "rb") if gz else _open_raw(path)) as f:
            head = f.read(PROBE_BYTES)
            while head and not head.strip():      # leading blank lines: look further before calling it empty
                head = f.read(PROBE_BYTES)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise BadInput(f"{path}: truncated or corrupt gzip file ({e})")
    if head.startswith(UTF16_BOMS):           # a log saved by a Windows tool: UTF-16 with its byte-order mark
        head = head.decode("utf-16", errors="replace").encode("utf-8")
    if not head.strip():
        raise BadInput(f"{path}: the log is empty")
    if looks_binary(head):
        raise BadInput(f"{path}: binary data, not a text log")
    return gz, head


def is_utf16(path: str | os.PathLike) -> bool:
    """Does the log (decompressed, when gzip) start with a UTF-16 byte-order mark?"""
    path = Path(path)
    try:
        with (gzip.open(path, "rb") if is_gzip(path) else _open_raw(path)) as f:
            return f.read(2) in UTF16_BOMS
    except (EOFError, gzip.BadGzipFile, zlib.error):
        return False


class Utf16ToUtf8(io.RawIOBase):
    """A UTF-16 byte stream (with its BOM) read as UTF-8 bytes, chunk by chunk: lines, anchors and rules then see
    the same text as for a UTF-8 log. Broken code units become U+FFFD."""

    def __init__(self, src: "IO[bytes] | io.BufferedIOBase"):
        self._src = src
        self._dec = codecs.getincrementaldecoder("utf-16")(errors="replace")
        self._buf = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while not self._buf and not self._eof:
            chunk = self._src.read(CHUNK)
            self._eof = not chunk
            self._buf = self._dec.decode(chunk, final=self._eof).encode("utf-8")
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


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
    if stream.peek(2)[:2] in UTF16_BOMS:    # type: ignore[attr-defined]
        stream = io.BufferedReader(Utf16ToUtf8(stream), CHUNK)
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


def inflate(f: IO[bytes], h: "hashlib._Hash") -> Iterator[bytes]:
    """The decompressed bytes of a .gz, every member (like ``gzip -dc`` and Python's gzip module; zero
    padding after a member is allowed), in pieces of at most CHUNK bytes, in bounded memory: at most one
    CHUNK of compressed input and one of output are held. ``h`` hashes the file as stored. Raises EOFError /
    zlib.error for a truncated or corrupt file."""
    d: Any = None                # the decompressor of the member being read
    buf = b""                    # compressed bytes not yet given to it
    while True:
        if d is None:
            buf = buf.lstrip(b"\x00")
            while len(buf) < 2:
                more = f.read(CHUNK)
                if not more:
                    break
                h.update(more)
                buf = (buf + more).lstrip(b"\x00")
            if not buf:
                return
            if buf[:2] != GZIP_MAGIC:
                raise zlib.error("trailing data after the last gzip member is not gzip")
            d = zlib.decompressobj(wbits=31)
        data = d.decompress(buf, CHUNK)            # releases the GIL
        buf = d.unconsumed_tail
        if data:
            yield data
        if d.eof:
            # the next member starts in what this one did not use. At the end of a member zlib leaves the rest of
            # the input in BOTH unused_data and unconsumed_tail: take it once (unused_data + tail fed it twice)
            buf = d.unused_data
            d = None
        elif not data and not buf:                 # zlib needs more input
            more = f.read(CHUNK)
            if not more:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            h.update(more)
            buf = more


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


#: what stdin may put in the temporary folder at most (OOMDOCTOR_STDIN_MAX_BYTES overrides), and the free space
#: the folder keeps: a stream that never ends (`< /dev/zero`, `yes |`) must not fill the disk
STDIN_MAX_BYTES = 64 << 30
STDIN_KEEP_FREE = 512 << 20
_MAGICS = (GZIP_MAGIC, b"\x28\xb5\x2f\xfd") + UTF16_BOMS     # gzip, zstd, UTF-16: judged after decoding


def _spool(src: BinaryIO, dst: BinaryIO, where: str) -> None:
    """stdin into ``dst``, refusing (BadInput) binary data at its start — as a file's start is judged — before
    more of it is read, and a stream larger than the cap or than the temporary folder's free space allows."""
    cap = int(os.environ.get("OOMDOCTOR_STDIN_MAX_BYTES") or STDIN_MAX_BYTES)
    head, n = b"", 0
    while True:
        buf = src.read(CHUNK)
        if not buf:
            break
        if len(head) < PROBE_BYTES:
            head += buf[:PROBE_BYTES]
            if not head.startswith(_MAGICS) and head.strip() and looks_binary(head.lstrip()[:PROBE_BYTES]):
                raise BadInput(f"{STDIN_SHOWN}: binary data, not a text log")
        dst.write(buf)
        n += len(buf)
        if n > cap:
            raise BadInput(f"{STDIN_SHOWN}: more than {cap:,} bytes and still coming; save the log to a file "
                           f"(OOMDOCTOR_STDIN_MAX_BYTES raises the cap)")
        if n % (64 * CHUNK) < len(buf) and shutil.disk_usage(where).free < STDIN_KEEP_FREE:
            raise BadInput(f"{STDIN_SHOWN}: stopped after {n:,} bytes: the temporary folder has less than "
                           f"{STDIN_KEEP_FREE >> 20} MiB left; save the log to a file")


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
            _spool(src, out, d)
        try:
            yield tmp, STDIN_SHOWN
        except BadInput as e:
            raise BadInput(str(e).replace(str(tmp), STDIN_SHOWN)) from None
