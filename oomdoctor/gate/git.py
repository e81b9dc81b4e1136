"""What the gate asks git (what changed against the base, with renames) and the two trees it reads files from."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from oomdoctor.errors import BadInput


class Git:
    """The few git questions the gate asks, each failure turned into one BadInput line."""

    def __init__(self, cwd: str | os.PathLike):
        self.cwd = Path(cwd)
        cp = self._run(["rev-parse", "--show-toplevel"], cwd=self.cwd)
        if cp.returncode != 0:
            raise BadInput(f"not a git repository: {self.cwd} (the gate compares serving configs against a base "
                           f"revision; run it inside a git checkout)")
        self.root = Path(cp.stdout.decode("utf-8", "surrogateescape").strip())

    @staticmethod
    def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
        env = dict(os.environ, LC_ALL="C", GIT_OPTIONAL_LOCKS="0")
        try:
            return subprocess.run(["git", "-c", "core.quotepath=off", *args], cwd=str(cwd), capture_output=True,
                                  env=env, check=False)
        except FileNotFoundError:
            raise BadInput("git is not installed (or not on PATH); the gate needs it to find what changed")
        except OSError as e:
            raise BadInput(f"cannot run git: {e}")

    def run(self, *args: str, what: str) -> bytes:
        cp = self._run(list(args), cwd=self.root)
        if cp.returncode != 0:
            err = cp.stderr.decode("utf-8", "replace").strip().splitlines()
            raise BadInput(f"git {what} failed: {err[-1] if err else 'exit ' + str(cp.returncode)}")
        return cp.stdout

    def resolve(self, ref: str) -> str:
        if not ref or ref.startswith("-"):
            raise BadInput(f"base ref {ref!r} is not a revision name")
        cp = self._run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"], cwd=self.root)
        if cp.returncode != 0:
            if ref == "HEAD":
                raise BadInput("the repository has no commit yet (HEAD does not exist); commit once, or pass --base")
            hint = ""
            if "/" in ref:
                remote, _, branch = ref.partition("/")
                hint = f"; fetch it first (git fetch {remote} {branch}), in CI check out with fetch-depth: 0"
            raise BadInput(f"base ref {ref!r} does not exist in this repository{hint}")
        return cp.stdout.decode().strip()

    def merge_base(self, base_sha: str) -> str:
        head = self._run(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=self.root)
        if head.returncode != 0:
            raise BadInput("the repository has no commit yet (HEAD does not exist); commit once before gating")
        cp = self._run(["merge-base", base_sha, "HEAD"], cwd=self.root)
        if cp.returncode != 0:
            raise BadInput(f"no common ancestor between {base_sha[:12]} and HEAD (a shallow clone? in CI check out "
                           f"with fetch-depth: 0)")
        return cp.stdout.decode().strip()

    def changes(self, commit: str) -> dict[str, tuple[str, str | None]]:
        """path → (status, old path): A added, M modified, D deleted, R renamed (old path given), against
        ``commit``, working tree included (committed + staged + unstaged + untracked)."""
        out = self.run("diff", "--name-status", "-z", "-M", "--no-ext-diff", commit, "--", what="diff")
        toks = out.decode("utf-8", "surrogateescape").split("\0")
        res: dict[str, tuple[str, str | None]] = {}
        i = 0
        while i < len(toks) and toks[i]:
            st = toks[i][:1]
            if st in ("R", "C"):
                old, new = toks[i + 1], toks[i + 2]
                i += 3
                if st == "R":
                    res[new] = ("R", old)
                    res.setdefault(old, ("D", None))
                else:
                    res[new] = ("A", None)
                continue
            path = toks[i + 1]
            i += 2
            res[path] = ({"A": "A", "D": "D"}.get(st, "M"), None)
        for p in self.untracked():
            res.setdefault(p, ("A", None))
        # a file renamed in the working tree without `git mv` shows as D + untracked A: pair them by content
        deleted = [p for p, (s, _) in res.items() if s == "D" and not any(o == p for s2, o in res.values() if s2 == "R")]
        added = [p for p, (s, _) in res.items() if s == "A"]
        if deleted and added:
            by_blob: dict[str, str] = {}
            for p in deleted:
                sha = self._run(["rev-parse", "--verify", "--quiet", f"{commit}:{p}"], cwd=self.root)
                if sha.returncode == 0:
                    by_blob.setdefault(sha.stdout.decode().strip(), p)
            for p in added:
                fp = self.root / p
                if not fp.is_file():
                    continue
                h = self._run(["hash-object", "--", p], cwd=self.root)
                old = by_blob.pop(h.stdout.decode().strip(), "") if h.returncode == 0 else ""
                if old:
                    res[p] = ("R", old)
        return res

    def untracked(self) -> list[str]:
        out = self.run("ls-files", "-z", "--others", "--exclude-standard", what="ls-files")
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]

    def tracked(self) -> list[str]:
        out = self.run("ls-files", "-z", "--cached", what="ls-files")
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]

    def ls_tree(self, commit: str) -> list[str]:
        out = self.run("ls-tree", "-r", "-z", "--name-only", commit, what="ls-tree")
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]

    def show(self, commit: str, path: str) -> bytes | None:
        cp = self._run(["cat-file", "blob", f"{commit}:{path}"], cwd=self.root)
        return cp.stdout if cp.returncode == 0 else None


class Tree:
    label = "tree"

    def read(self, rel: str) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def files(self) -> list[str]:  # pragma: no cover - interface
        raise NotImplementedError


def _decode(data: bytes, rel: str, label: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BadInput(f"{rel}: not UTF-8 text ({label})")


class WorkTree(Tree):
    label = "working tree"

    def __init__(self, root: Path, git: Git | None = None):
        self.root = Path(root)
        self.git = git
        self._files: list[str] | None = None

    def read(self, rel: str) -> str | None:
        p = self.root / rel
        if not p.is_file():
            return None
        from oomdoctor.diagnose.read import read_capped  # noqa: PLC0415

        data = read_capped(p, 16 << 20, "serving config")      # a config, not a data file: 16 MiB at most
        return _decode(data, rel, self.label)

    def files(self) -> list[str]:
        if self._files is None:
            if self.git is not None:
                names = set(self.git.tracked()) | set(self.git.untracked())
                self._files = sorted(p for p in names if (self.root / p).is_file())
            else:
                out = []
                for dp, dns, fns in os.walk(self.root):
                    dns[:] = [d for d in dns if d != ".git"]
                    for f in fns:
                        out.append(Path(dp, f).relative_to(self.root).as_posix())
                self._files = sorted(out)
        return self._files


class GitTree(Tree):
    def __init__(self, git: Git, commit: str):
        self.git = git
        self.commit = commit
        self.label = f"base {commit[:12]}"
        self._files: list[str] | None = None
        self._cache: dict[str, str | None] = {}

    def read(self, rel: str) -> str | None:
        if rel not in self._cache:
            data = self.git.show(self.commit, rel)
            self._cache[rel] = None if data is None else _decode(data, rel, self.label)
        return self._cache[rel]

    def files(self) -> list[str]:
        if self._files is None:
            self._files = self.git.ls_tree(self.commit)
        return self._files
