"""Writing cards and receipts safely: one lock per folder that never loses an update, and an atomic
replacement that never clobbers what is not a regular file.

The lock is ``flock`` on the card's FOLDER (opened read-only as a directory): no lock file is created, so there
is none to unlink (unlinking a lock file lets a third writer lock a new inode while a second one still waits on
the old one — attempts were lost that way) and none that a symlink could redirect (a symlink at ``CARD.lock``
made a writer truncate its target). The lock is re-entrant within one thread.

``atomic_write`` writes a temp file in the same folder (``O_EXCL``, mode 0644), fsyncs it and renames it over the
target — only when the target is missing or a regular file: a symlink, FIFO, device node or folder is refused.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from oomdoctor.errors import CardError

_HELD = threading.local()


def _held() -> dict[tuple[int, int], int]:
    if not hasattr(_HELD, "d"):
        _HELD.d = {}
    return _HELD.d


def _lstat(path: Path) -> os.stat_result | None:
    """``path``'s own status (a symlink's, not its target's); None when it does not exist."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CardError(f"{path}: cannot be examined ({e.strerror or e})")


def refuse_special(path: Path, what: str = "file") -> None:
    """CardError when ``path`` exists and is not a regular file (symlink, FIFO, device node, socket, folder)."""
    st = _lstat(path)
    if st is None or stat.S_ISREG(st.st_mode):
        return
    kind = ("a symlink" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
            "a device node" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
            "a folder" if stat.S_ISDIR(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    raise CardError(f"{path}: is {kind}, not a regular file; the {what} is not written there")


def refuse_linked_dir(path: Path, what: str = "runs folder") -> None:
    """CardError when ``path`` exists and is not a real folder: a symlink (to a folder too) would take the run's
    logs and run file wherever it points, away from the card they belong to."""
    st = _lstat(path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise CardError(f"{path}: is {kind}, not a folder; the {what} is not written there")


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Exclusive lock for writing ``path``: flock on its folder, held until the block ends."""
    parent = Path(path).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise CardError(f"{path}: the card cannot be locked for writing ({e.strerror or e})")
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    held = _held()
    if held.get(key):
        os.close(fd)
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held[key] = 1
        try:
            yield
        finally:
            held.pop(key, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str, what: str = "card") -> None:
    path = Path(path)
    refuse_special(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    except OSError as e:
        raise CardError(f"{path}: the {what} cannot be written ({e.strerror or e})")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        refuse_special(path, what)          # nothing special appeared meanwhile
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise CardError(f"{path}: the {what} cannot be written ({e.strerror or e})")
        with contextlib.suppress(OSError):
            dfd = os.open(str(path.parent), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
