"""Stage 1 (read), a collector's own record format: a log a collector stored as records, read back as the engine's
text.

Docker's json-file logging driver (the default: ``/var/lib/docker/containers/<id>/<id>-json.log``, rotated to
``...-json.log.1`` and, with ``compress=true``, gzipped) keeps every piece of a container's output as one JSON object
per line, ``{"log":"<text>","stream":"stderr","time":"<RFC3339Nano>"}`` — "log" first (moby b985e2313a
daemon/logger/jsonfilelog/jsonlog/jsonlogbytes.go MarshalJSONBuf; fields in jsonlog/jsonlog.go:8-17). A piece of a
line longer than the driver's buffer has no newline at its end and goes on in the next record.

A small paste of such records is undone by diagnose/paste.py with the rest of what pasting adds; this reads a log of
any size (plain, gzip, UTF-16 as read.iter_lines reads it) as a stream: each record's text is written to a private
copy that the scan then reads, in bounded memory (one record at a time; records are cut at read.MAX_LINE_BYTES like
any line). A line that is no record (a truncated last record, an editor's addition) is kept as it is. Nothing read
is executed; the copy is removed when the diagnosis is done.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

from oomdoctor.diagnose.read import SourceInfo, iter_lines

DOCKER_JSON_HEAD = b'{"log":"'


def is_docker_json(path: Path) -> bool:
    """Whether the log's first line is a Docker json-file record (read as iter_lines reads it: gzip, UTF-16)."""
    try:
        for _, line in iter_lines(path):
            return line.startswith(DOCKER_JSON_HEAD) and record_text(line) is not None
    except Exception:            # what cannot be read is refused by the reader itself, with its message
        return False
    return False


def record_text(line: bytes | str) -> str | None:
    """The "log" text of one json-file record, or None when the line is no such record."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj["log"] if isinstance(obj, dict) and isinstance(obj.get("log"), str) else None


def write_docker_text(path: Path, out: BinaryIO, info: SourceInfo) -> int:
    """Write the text of every record of the json-file log ``path`` to ``out``; the number of records read (``info``:
    the file's own sha256 and size, as read)."""
    records = 0
    for _, line in iter_lines(path, info):
        text = record_text(line) if line.startswith(DOCKER_JSON_HEAD) else None
        if text is None:
            out.write(line + b"\n")
            continue
        records += 1
        out.write(text.encode("utf-8", errors="surrogatepass"))
    return records
