"""The YAML documents of the rule files, and, for the bundled catalogue, a cache of them between runs.

Parsing the ~50 bundled YAML files is most of what loading the catalogue costs (PyYAML builds its objects in
Python). Their parsed documents are plain data (mappings, lists, strings, numbers, booleans), so after a load
they are written as JSON to ``$OOMDOCTOR_CACHE_DIR`` (default ``$XDG_CACHE_HOME/oomdoctor``, else
``~/.cache/oomdoctor``; empty: no cache), in one file named by the oomdoctor version and the sha256 of every rule
file, written atomically (a temporary file renamed). A later load reads the files' bytes and hashes them as before,
and takes the documents from that file only when all of this holds: the file and its folder belong to this user
and nobody else may write them (what the package's own YAML files also rely on), it is at most ``MAX_BYTES``,
it is JSON naming exactly these files, and it was written by this version. Anything else (no file, another
owner, a broken or foreign file) and the YAML is parsed, as without a cache. The documents then go through the
same checks as parsed ones (rules.build_rule). Only what survives a JSON round trip unchanged is written.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

from oomdoctor import __version__

MAX_BYTES = 8 << 20


def cache_dir() -> Path | None:
    env = os.environ.get("OOMDOCTOR_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):                  # unset, or relative (the XDG spec: ignore it)
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):         # no home directory: no cache
            return None
    return Path(base) / "oomdoctor"


def _private(st: os.stat_result) -> bool:
    euid = getattr(os, "geteuid", None)          # no owner to compare with (not POSIX): never trusted
    return euid is not None and st.st_uid == euid() and not st.st_mode & 0o022


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types and key order all the way down (1 is not 1.0 nor True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)     # the order too: it is kept
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


class RuleDocs:
    """``load(path)``: the document of one rule file (``parse(path, bytes)`` when it is not in the cache).
    ``files``: every rule file, read once here (their bytes name the cache)."""

    def __init__(self, root: Path, files: list[Path], read: Callable[[Path], bytes],
                 parse: Callable[[Path, bytes], Any], cache: bool) -> None:
        self._root, self._parse = root, parse
        self._bytes = {f: read(f) for f in files}
        self._parsed: dict[str, Any] = {}
        self._where: Path | None = None
        self._cached: dict[str, Any] = {}
        folder = cache_dir() if cache else None
        if folder is not None:
            h = hashlib.sha256(__version__.encode())
            for f, data in self._bytes.items():
                h.update(b"\0%s\0%s" % (self._key(f).encode(), hashlib.sha256(data).digest()))
            self._where = folder / f"rules-{h.hexdigest()[:32]}.json"
            self._cached = self._read_cache()

    def _key(self, f: Path) -> str:
        return f.relative_to(self._root).as_posix()

    def _read_cache(self) -> dict[str, Any]:
        assert self._where is not None
        try:
            fd = os.open(self._where, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return {}
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > MAX_BYTES or \
                    not _private(os.stat(self._where.parent)):
                return {}
            with os.fdopen(fd, "rb", closefd=False) as f:
                doc = json.loads(f.read(MAX_BYTES + 1))
        except (OSError, ValueError, RecursionError):
            return {}
        finally:
            os.close(fd)
        files = doc.get("files") if isinstance(doc, dict) and doc.get("version") == __version__ else None
        if not isinstance(files, dict) or set(files) != {self._key(f) for f in self._bytes}:
            return {}
        return files

    def load(self, path: Path) -> Any:
        key = self._key(path)
        if key in self._cached:
            return self._cached[key]
        doc = self._parse(path, self._bytes[path])
        self._parsed[key] = doc
        return doc

    def save(self) -> None:
        """After a load that parsed every file: write them to the cache (quietly nothing when it cannot)."""
        if self._where is None or self._cached or len(self._parsed) != len(self._bytes):
            return
        try:
            text = json.dumps({"version": __version__, "files": self._parsed})
        except (TypeError, ValueError):             # a date, a set: not plain JSON data; no cache
            return
        if not _same(json.loads(text)["files"], self._parsed) or len(text) > MAX_BYTES:
            return
        folder = self._where.parent
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _private(os.stat(folder)):
                return
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rules-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(text)
                os.replace(tmp, self._where)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return
