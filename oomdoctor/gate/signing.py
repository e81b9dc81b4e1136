"""Signed receipts (optional): SSH signatures as git uses them, made and checked by ``ssh-keygen -Y``.

With ``signers: PATH`` in the project file (an ``allowed_signers`` file, git's ``gpg.ssh.allowedSignersFile``
format: ``principal key-type key``), an attempt counts only when the file it was read from (receipt or card) has
a detached signature ``FILE.sig`` in namespace ``oomdoctor-receipt`` by one of those keys. The signers file is read
from the BASE revision, so a change cannot bring the key that signs its own receipts.

Sign after ``record``: ``ssh-keygen -Y sign -f ~/.ssh/id_ed25519 -n oomdoctor-receipt receipts/<16 hex>.yaml``
(or ``oomdoctor record ... --sign KEY``). A receipt that gains an attempt must be signed again.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from oomdoctor.errors import BadInput

NAMESPACE = "oomdoctor-receipt"


def _keygen() -> str:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise BadInput("the project file names signers, and ssh-keygen (OpenSSH >= 8.2) is not installed")
    return exe


def sign(path: Path, key: Path) -> Path:
    """Write ``path``.sig with ``key`` (a private key file); the signature path."""
    sig = Path(str(path) + ".sig")
    sig.unlink(missing_ok=True)
    cp = subprocess.run([_keygen(), "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(path)], capture_output=True,
                        text=True, stdin=subprocess.DEVNULL, timeout=60)
    if cp.returncode != 0 or not sig.is_file():
        raise BadInput(f"{path}: cannot be signed with {key}: {(cp.stderr or cp.stdout).strip().splitlines()[-1:] or '?'}")
    return sig


class Signatures:
    """Checks attempts' files against an allowed_signers text; results cached per file."""

    def __init__(self, signers_text: str, origin: str):
        self.origin = origin
        fd, self._file = tempfile.mkstemp(prefix="oomdoctor-signers-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(signers_text)
        self._cache: dict[Path, str] = {}

    def close(self) -> None:
        Path(self._file).unlink(missing_ok=True)

    def check(self, path: Path) -> str:
        """'' when ``path`` carries a good signature of a signer, else why not."""
        if path in self._cache:
            return self._cache[path]
        sig = Path(str(path) + ".sig")
        why = ""
        if not sig.is_file():
            why = f"it is not signed ({sig.name} is missing; the project requires signatures of {self.origin})"
        else:
            why = self._verify(path, sig)
        self._cache[path] = why
        return why

    def _verify(self, path: Path, sig: Path) -> str:
        exe = _keygen()
        cp = subprocess.run([exe, "-Y", "find-principals", "-s", str(sig), "-f", self._file], capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=60)
        principals = [p for p in cp.stdout.split() if p] if cp.returncode == 0 else []
        if not principals:
            return f"its signature {sig.name} is by no signer of {self.origin}"
        with open(path, "rb") as data:
            vp = subprocess.run([exe, "-Y", "verify", "-f", self._file, "-I", principals[0], "-n", NAMESPACE, "-s",
                                 str(sig)], stdin=data, capture_output=True, text=True, timeout=60)
        if vp.returncode != 0:
            return f"its signature {sig.name} does not verify (the file changed after it was signed?)"
        return ""

    def __call__(self, a) -> bool:      # noqa: ANN001 - a FoundAttempt
        return not self.check(a.path)

    def why(self, a) -> str:            # noqa: ANN001
        return self.check(a.path)
