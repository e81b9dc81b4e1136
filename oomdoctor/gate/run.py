"""The gate run: what changed against the base, each changed serving config's verdict."""
from __future__ import annotations

import os
import posixpath
from pathlib import Path

from oomdoctor.card import receipt as rcpt
from oomdoctor.errors import BadInput
from oomdoctor.gate.configs import ServingConfig, build_serving_configs
from oomdoctor.gate.git import Git, GitTree, WorkTree
from oomdoctor.gate.lookup import _instances, _project_for
from oomdoctor.gate.project import ConfigEntry, Project, load_project, parse_project
from oomdoctor.gate.signing import Signatures
from oomdoctor.gate.verdict import ConfigResult, GateResult, record_command, verdict

# ----------------------------------------------------------------------------- the gate
class _GateRun:
    """One gate run: the project now and at the merge base, what changed, the receipts found, the results."""

    def __init__(self, base: str, project_file: str | os.PathLike | None, cwd: Path):
        self.git = git = Git(cwd)
        self.root = git.root
        self.base = base
        self.base_commit = git.resolve(base)
        self.mb = git.merge_base(self.base_commit)
        _, pf = _project_for(git, cwd, project_file)
        self.project = load_project(pf, self.root)
        self.notes: list[str] = []
        self.changes = git.changes(self.mb)
        self.work = WorkTree(self.root, git)
        self.base_tree = GitTree(git, self.mb)
        self.base_project = self._base_project()
        self.base_decl = self.base_project or self.project
        self._base_cache: dict[str, dict[str | None, ServingConfig] | str] = {}
        self.results: list[ConfigResult] = []
        self.renamed_old: set[str] = set()
        self.current: dict[str, ConfigEntry] = {}
        self.attempts: list[rcpt.FoundAttempt] = []
        self.signatures: Signatures | None = None

    def load_signers(self) -> None:
        """The allowed signers, as at the base (a change cannot bring the key that signs its own receipts)."""
        rel = self.project.signers
        if rel is None:
            return
        text = self.base_tree.read(rel) if (self.base_project and self.base_project.signers == rel) else None
        if text is None:
            text = self.work.read(rel)
            if text is None:
                raise BadInput(f"{self.project.origin}: signers: {rel} does not exist")
            self.notes.append(f"signers: {rel} is read from the working tree (it is new or moved since the base)")
        self.signatures = Signatures(text, rel)

    def _base_project(self) -> Project | None:
        rel = self.project.rel
        btext = self.base_tree.read(rel) if rel is not None else None
        if rel is None or btext is None:
            return None
        try:
            return parse_project(btext, f"{rel} ({self.base_tree.label})", posixpath.dirname(rel), rel)
        except BadInput as e:
            self.notes.append(f"the project file at the base cannot be read ({e}); the base is read with the current one")
            return None

    def declared_now(self) -> None:
        """What is declared now (a literal path that exists nowhere is a typo)."""
        project = self.project
        self.current = dict(_instances(project, self.work))
        for e in project.configs:
            if not e.is_glob and e.path not in self.current and self.changes.get(e.path, ("", None))[0] != "D" \
                    and self.base_tree.read(e.path) is None:
                raise BadInput(f"{project.origin}: configs[{e.index}].path: {e.path} does not exist")
        for e in project.configs:
            if e.is_glob and not any(m is e for m in self.current.values()):
                self.notes.append(f"configs[{e.index}].path: {e.path} matches no file")

    def base_configs(self, path: str) -> dict[str | None, ServingConfig] | str | None:
        """The configs at ``path`` in the base (by profile), an error text, or None when not declared there."""
        if path in self._base_cache:
            return self._base_cache[path]
        entry = self.base_decl.entry_for(path)
        proj = self.base_decl
        if entry is None and self.base_project is not None:
            entry, proj = self.project.entry_for(path), self.project
        if entry is None or self.base_tree.read(path) is None:
            return None
        try:
            res: dict[str | None, ServingConfig] | str = {
                c.profile: c for c in build_serving_configs(proj, entry, path, self.base_tree)}
        except BadInput as e:
            res = str(e)
        self._base_cache[path] = res
        return res

    def _modified(self, path: str, sc: ServingConfig, touched: list[str], cnotes: list[str]) -> str | None:
        bc = self.base_configs(path)
        if bc is None or (isinstance(bc, dict) and sc.profile not in bc):
            return "added"
        if isinstance(bc, str):
            cnotes.append(f"the base version cannot be read: {bc}")
            return "modified"
        b = bc[sc.profile]
        if b.content_key == sc.content_key and b.fingerprint == sc.fingerprint:
            return None
        via = [s for s in touched if s != path]
        if via and path not in touched:
            cnotes.append(f"changed through {', '.join(via)}")
        return "modified"

    def change_of(self, path: str, sc: ServingConfig, cnotes: list[str]) -> str | None:
        """added | renamed | modified for one serving config of a current file, or None when unchanged."""
        st, old = self.changes.get(path, (None, None))
        if st == "R" and old:
            bc = self.base_configs(old)
            if isinstance(bc, dict) and sc.profile in bc and bc[sc.profile].fingerprint != sc.fingerprint:
                cnotes.append(f"renamed from {old} and its effective config changed")
            return "renamed"
        if st == "A":
            return "added"
        project = self.project
        srcs = set(sc.sources) | ({project.rel} if project.rel else set())
        touched = sorted(s for s in srcs if s in self.changes)
        return self._modified(path, sc, touched, cnotes) if touched else None

    def check(self, path: str, sc: ServingConfig) -> None:
        cnotes: list[str] = []
        change = self.change_of(path, sc, cnotes)
        if change is None:
            return
        old = self.changes.get(path, (None, None))[1]
        status, code, reason, receipt, diff = verdict(sc, self.attempts, self.root, self.signatures)
        self.results.append(ConfigResult(
            path=path, profile=sc.profile, kind=sc.kind, change=change, status=status, reason_code=code,
            reason=reason, fingerprint=sc.fingerprint,
            command=None if status == "pass" else record_command(sc, self.project),
            renamed_from=old if change == "renamed" else None, receipt=receipt, diff=diff,
            notes=cnotes + list(sc.notes)))

    def removed_profiles(self, path: str, entry: ConfigEntry, configs: list[ServingConfig]) -> None:
        """Profiles that are gone from a file that is still here (or was renamed)."""
        if entry.kind != "serving-profiles" or path not in self.changes:
            return
        st, old = self.changes[path]
        bc = self.base_configs(old if st == "R" and old else path)
        if not isinstance(bc, dict):
            return
        now = {c.profile for c in configs}
        for prof, b in bc.items():
            if prof not in now:
                self.results.append(ConfigResult(path, prof, b.kind, "profile_removed", "pass", "deleted",
                                                 "profile removed: nothing to verify", b.fingerprint, None))

    def current_files(self) -> None:
        for path, entry in self.current.items():
            st, old = self.changes.get(path, (None, None))
            configs = build_serving_configs(self.project, entry, path, self.work)
            if st == "R" and old:
                self.renamed_old.add(old)
            for sc in configs:
                self.check(path, sc)
            self.removed_profiles(path, entry, configs)

    def _moved_undeclared(self, path: str, bc: dict[str | None, ServingConfig] | str, new: str) -> None:
        items = bc.items() if isinstance(bc, dict) else [(None, None)]
        for prof, b in items:
            self.results.append(ConfigResult(
                path, prof, b.kind if b else "?", "renamed", "fail", "undeclared",
                f"renamed to {new}, which {self.project.origin} does not declare as a serving config; "
                f"update its path there so that the gate checks it", b.fingerprint if b else None, None))

    def _deleted(self, path: str, bc: dict[str | None, ServingConfig] | str) -> None:
        project = self.project
        if isinstance(bc, str):
            be = self.base_decl.entry_for(path) or project.entry_for(path)
            self.results.append(ConfigResult(path, None, be.kind if be else "?", "deleted", "pass", "deleted",
                                             "deleted: nothing to verify", None, None))
            return
        still = next((e for e in project.configs if not e.is_glob and e.path == path), None)
        tail = f" (its entry configs[{still.index}] can go from {project.origin})" if still else ""
        for prof, b in bc.items():
            self.results.append(ConfigResult(path, prof, b.kind, "deleted", "pass", "deleted",
                                             f"deleted: nothing to verify{tail}", b.fingerprint, None))

    def gone_files(self) -> None:
        """Deleted configs (and configs moved to a path the project file does not declare)."""
        moved_to = {old: new for new, (st, old) in self.changes.items() if st == "R" and old}
        for path, (st, _) in sorted(self.changes.items()):
            if st != "D" or path in self.renamed_old or path in self.current:
                continue
            bc = self.base_configs(path)
            if bc is None:
                continue
            if path in moved_to:
                self._moved_undeclared(path, bc, moved_to[path])
            else:
                self._deleted(path, bc)

    def undeclared(self) -> None:
        """A serving config the base declared whose file is still here but which the project file no longer
        declares is a FAIL: taking its entry out must not be a way around the gate."""
        if self.base_project is None:
            return
        for path, e in _instances(self.base_project, self.base_tree):
            if path in self.current or self.work.read(path) is None or self.project.entry_for(path) is not None:
                continue
            self.results.append(ConfigResult(
                path, None, e.kind, "undeclared", "fail", "undeclared",
                f"declared at the base (configs[{e.index}]) and still here, but {self.project.origin} no longer "
                f"declares it: delete the file too, or keep its entry", None, None))


def run_gate(base: str = "HEAD", project_file: str | os.PathLike | None = None,
             cwd: str | os.PathLike | None = None) -> GateResult:
    """Every serving config that changed against ``base`` (its merge base with HEAD) and its verdict."""
    g = _GateRun(base, project_file, Path(cwd or os.getcwd()))
    g.declared_now()
    project = g.project
    g.attempts, scan_notes = rcpt.scan(g.root, list(project.receipts) + list(project.incidents))
    g.load_signers()
    try:
        g.current_files()
    finally:
        if g.signatures is not None:
            g.signatures.close()
    g.gone_files()
    g.undeclared()
    notes = g.notes + list(scan_notes)
    results = sorted(g.results, key=lambda r: (r.status != "fail", r.path, r.profile or ""))
    return GateResult(base, g.base_commit, g.mb, project.origin, results, notes)
