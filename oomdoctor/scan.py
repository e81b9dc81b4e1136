"""Stage 1b — scan: find the lines that can matter, fast.

Every rule names (or has derived from its regex) a literal *anchor* that any line it can
match must contain. Only lines holding an anchor go on to parsing and rule matching.

Two implementations return the same lines:
- ``grep`` (``LC_ALL=C grep -a -n -F -f anchors``): used when a grep binary is on PATH,
  because a fixed-string multi-pattern search in C is ~10x faster than Python's ``re``
  on the gigabyte-sized logs of long-running servers;
- pure Python (line by line, one compiled alternation): the fallback, and the reference
  the test-suite compares the grep path with.
The file's sha256 and line count are computed alongside, in a thread (hashlib releases the GIL).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Iterator

from oomdoctor.errors import BadInput
from oomdoctor.read import CHUNK, MAX_LINE_BYTES, SourceInfo, iter_lines, probe


def _anchor_regex(anchors: Iterable[bytes]) -> re.Pattern[bytes]:
    alts = sorted({a for a in anchors if a}, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(a) for a in alts)) if alts else re.compile(b"(?!)")


def scan_python(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo) -> Iterator[tuple[int, bytes]]:
    rx = _anchor_regex(anchors)
    for n, line in iter_lines(path, info):
        if rx.search(line):
            yield n, line


def _hash_and_count(path: Path, gz: bool, info: SourceInfo, out: dict) -> None:
    try:
        h = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            while True:
                buf = f.read(CHUNK)
                if not buf:
                    break
                h.update(buf)
                size += len(buf)
        out["sha256"] = h.hexdigest()
        out["size"] = size
    except OSError as e:  # pragma: no cover - the file vanished mid-read
        out["error"] = str(e)


def scan_grep(path: str | os.PathLike, anchors: Iterable[bytes], info: SourceInfo, grep: str) -> Iterator[tuple[int, bytes]]:
    path = Path(path)
    gz, _ = probe(path)
    info.compressed = gz
    anchors = sorted({a for a in anchors if a})
    hashed: dict = {}
    hasher = threading.Thread(target=_hash_and_count, args=(path, gz, info, hashed), daemon=True)
    hasher.start()
    with tempfile.NamedTemporaryFile("wb", suffix=".anchors", delete=False) as tf:
        tf.write(b"\n".join(anchors) + b"\n")
        anchor_file = tf.name
    env = dict(os.environ, LC_ALL="C")
    cmd = [grep, "-a", "-n", "-F", "-f", anchor_file]
    feeder = None
    if gz:
        gzip_bin = shutil.which("gzip")
        if not gzip_bin:
            os.unlink(anchor_file)
            yield from scan_python(path, anchors, info)
            return
        feeder = subprocess.Popen([gzip_bin, "-dc", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc = subprocess.Popen(cmd, stdin=feeder.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        feeder.stdout.close()  # type: ignore[union-attr]
    else:
        proc = subprocess.Popen(cmd + ["--", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    last = 0
    try:
        out = proc.stdout
        assert out is not None
        while True:
            rec = out.readline(MAX_LINE_BYTES + 16)
            if not rec:
                break
            colon = rec.find(b":")
            if colon <= 0:
                continue
            n = int(rec[:colon])
            line = rec[colon + 1:]
            if not line.endswith(b"\n") and len(rec) >= MAX_LINE_BYTES + 16:
                info.cut_lines.append(n)
                while True:
                    rest = out.readline(MAX_LINE_BYTES)
                    if not rest or rest.endswith(b"\n"):
                        break
            last = n
            yield n, line.rstrip(b"\r\n")
        proc.wait()
        if feeder is not None:
            feeder.wait()
            if feeder.returncode not in (0, None):
                err = feeder.stderr.read().decode(errors="replace").strip().splitlines()  # type: ignore[union-attr]
                raise BadInput(f"{path}: truncated or corrupt gzip file ({err[-1] if err else 'gzip failed'})")
        if proc.returncode not in (0, 1):
            err = proc.stderr.read().decode(errors="replace").strip()  # type: ignore[union-attr]
            raise BadInput(f"{path}: cannot be scanned ({err or 'grep exit ' + str(proc.returncode)})")
    finally:
        for p in (proc, feeder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        os.unlink(anchor_file)
        hasher.join()
        info.sha256 = hashed.get("sha256", "")
        info.size_bytes = hashed.get("size", 0)
        info.lines = max(info.lines, last)


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
    if grep and not os.environ.get("OOMDOCTOR_NO_GREP"):
        return scan_grep(path, anchors, info, grep)
    return scan_python(path, anchors, info)
