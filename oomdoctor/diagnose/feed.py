"""The scanner's side thread: the file's sha256, size, line count and over-long lines, computed while grep reads
the file (plain) or while the thread decompresses it into grep's stdin (gzip). ``hashlib`` and ``zlib`` release
the GIL, so this runs beside the matcher on a second core."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from oomdoctor.diagnose.read import CHUNK, MAX_LINE_BYTES, inflate as _inflate
from oomdoctor.errors import BadInput


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


def _read_plain(path: Path, out: dict, sink: Any = None) -> None:
    """Thread: sha256, size, line count and over-long lines of a plain file (grep reads it itself; or, with
    ``sink``, the bytes are written to it as they are read: parallel.Dispatcher)."""
    try:
        h = hashlib.sha256()
        tally = out["tally"] = _Tally()         # read by the progress line while it counts
        with open(path, "rb") as f:
            while True:
                buf = f.read(CHUNK)
                if not buf:
                    break
                h.update(buf)          # releases the GIL
                tally.feed(buf)
                if sink is not None:
                    sink.write(buf)
        out["sha256"] = h.hexdigest()
        out["size"] = tally.offset
        out["lines"], out["cut_lines"] = tally.finish()
    except BrokenPipeError as e:               # a worker went away (it reports why)
        out["quiet_error"] = str(e)
    except OSError as e:  # pragma: no cover - the file vanished mid-read
        out["error"] = f"cannot be read ({e.strerror or e})"
    finally:
        if sink is not None:
            try:
                sink.close()
            except OSError:
                pass


def _feed_compressed(path: Path, sink, out: dict, chunks: Callable, what: str) -> None:
    """Thread: hash the file as stored, decompress it (``chunks(f, h)``), count its lines, write it to grep's stdin."""
    h = hashlib.sha256()
    tally = out["tally"] = _Tally()
    fd = sink.fileno() if hasattr(sink, "raw") else None
    try:
        with open(path, "rb") as f:
            for data in chunks(f, h):
                tally.feed(data)
                view = memoryview(data)
                while view:                    # os.write: no buffer lock left held if grep is killed mid-write
                    view = view[os.write(fd, view):] if fd is not None else view[sink.write(view):]
            out["size"] = os.fstat(f.fileno()).st_size
        out["sha256"] = h.hexdigest()
        out["lines"], out["cut_lines"] = tally.finish()
    except (EOFError, zlib.error) as e:
        out["error"] = f"truncated or corrupt {what} file ({e})"
    except BadInput as e:
        out["error"] = str(e)
    except (BrokenPipeError, ValueError, OSError) as e:      # grep went away (early stop), or the file did
        out["quiet_error"] = str(e)
    finally:
        try:
            sink.close()
        except OSError:
            pass


def _feed_gzip(path: Path, sink, out: dict) -> None:
    _feed_compressed(path, sink, out, _inflate, "gzip")


def _feed_zstd(path: Path, sink, out: dict) -> None:
    _feed_compressed(path, sink, out, unzstd, "zstd")


# ----------------------------------------------------------------------------- zstd
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def is_zstd(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == ZSTD_MAGIC
    except OSError:
        return False


class _Hashed:
    """A file that feeds what is read from it into ``h`` (the sha256 of the file as stored)."""

    def __init__(self, f: BinaryIO, h: Any) -> None:
        self.f, self.h = f, h

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        return b


def unzstd(f: BinaryIO, h: Any) -> Iterator[bytes]:
    """The decompressed bytes of a .zst log (every frame), streamed: by the zstandard package when it is installed
    (``pip install 'oomdoctor[zstd]'``), else by the zstd program. ``h`` hashes the file as stored."""
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        zstandard = None
    if zstandard is not None:
        reader = zstandard.ZstdDecompressor().stream_reader(_Hashed(f, h), read_across_frames=True)
        try:
            while chunk := reader.read(CHUNK):
                yield chunk
        except zstandard.ZstdError as e:
            raise EOFError(str(e))
        return
    exe = shutil.which("zstd")
    if exe is None:
        raise BadInput("a zstd-compressed log needs the zstd program or the Python package zstandard "
                       "(pip install 'oomdoctor[zstd]')")
    while buf := f.read(CHUNK):                     # the program reads the file itself: hash it first
        h.update(buf)
    proc = subprocess.Popen([exe, "-dcq", "--", str(f.name)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        while chunk := proc.stdout.read(CHUNK):
            yield chunk
        err = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0:
            raise EOFError(err or f"zstd exit {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def zstd_lines(path: Path, info: Any) -> Iterator[tuple[int, bytes]]:
    """(number, line) of a .zst log, cut and numbered as read.iter_lines does (the pure-Python scanner's input)."""
    h = hashlib.sha256()
    tally = _Tally()
    n, rest = 0, b""
    info.compressed = True
    try:
        with open(path, "rb") as f:
            for data in unzstd(f, h):
                tally.feed(data)
                parts = (rest + data).split(b"\n")
                rest = parts.pop()
                for line in parts:
                    n += 1
                    yield n, line[:MAX_LINE_BYTES].rstrip(b"\r\n")
                if len(rest) > MAX_LINE_BYTES:         # an over-long line: keep only what is searched
                    rest = rest[:MAX_LINE_BYTES]
            if rest:
                n += 1
                yield n, rest[:MAX_LINE_BYTES].rstrip(b"\r\n")
            info.size_bytes = os.fstat(f.fileno()).st_size
    except (EOFError, zlib.error) as e:
        raise BadInput(f"{path}: truncated or corrupt zstd file after line {n} ({e})")
    except BadInput as e:
        raise BadInput(f"{path}: {e}")
    info.sha256 = h.hexdigest()
    info.lines, info.cut_lines = tally.finish()
