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
from oomdoctor.gate.verdict import ConfigResult, GateResult, record_command, verdict

# ----------------------------------------------------------------------------- the gate
def run_gate(base: str = "HEAD", project_file: str | os.PathLike | None = None,
             cwd: str | os.PathLike | None = None) -> GateResult:
    cwd = Path(cwd or os.getcwd())
    git = Git(cwd)
    root = git.root
    base_commit = git.resolve(base)
    mb = git.merge_base(base_commit)
    _, pf = _project_for(git, cwd, project_file)
    project = load_project(pf, root)
    notes: list[str] = []
    changes = git.changes(mb)
    work = WorkTree(root, git)
    base_tree = GitTree(git, mb)

    base_project: Project | None = None
    if project.rel is not None:
        btext = base_tree.read(project.rel)
        if btext is not None:
            try:
                base_project = parse_project(btext, f"{project.rel} ({base_tree.label})",
                                             posixpath.dirname(project.rel), project.rel)
            except BadInput as e:
                notes.append(f"the project file at the base cannot be read ({e}); the base is read with the current one")
    base_decl = base_project or project

    # what is declared now (a literal path that exists nowhere is a typo)
    current: dict[str, ConfigEntry] = dict(_instances(project, work))
    for e in project.configs:
        if not e.is_glob and e.path not in current and changes.get(e.path, ("", None))[0] != "D" \
                and base_tree.read(e.path) is None:
            raise BadInput(f"{project.origin}: configs[{e.index}].path: {e.path} does not exist")
    globs_empty = [e for e in project.configs if e.is_glob and not any(m is e for m in current.values())]
    for e in globs_empty:
        notes.append(f"configs[{e.index}].path: {e.path} matches no file")

    base_cache: dict[str, dict[str | None, ServingConfig] | str] = {}

    def base_configs(path: str) -> dict[str | None, ServingConfig] | str | None:
        """The configs at ``path`` in the base (by profile), an error text, or None when not declared there."""
        if path in base_cache:
            return base_cache[path]
        entry = base_decl.entry_for(path)
        proj = base_decl
        if entry is None and base_project is not None:
            entry, proj = project.entry_for(path), project
        if entry is None or base_tree.read(path) is None:
            return None
        try:
            res: dict[str | None, ServingConfig] | str = {c.profile: c for c in build_serving_configs(proj, entry, path, base_tree)}
        except BadInput as e:
            res = str(e)
        base_cache[path] = res
        return res

    attempts, scan_notes = rcpt.scan(root, list(project.receipts) + list(project.incidents))
    results: list[ConfigResult] = []
    renamed_old: set[str] = set()
    for path, entry in current.items():
        st, old = changes.get(path, (None, None))
        configs = build_serving_configs(project, entry, path, work)
        if st == "R" and old:
            renamed_old.add(old)
        for sc in configs:
            srcs = set(sc.sources) | ({project.rel} if project.rel else set())
            touched = sorted(s for s in srcs if s in changes)
            change, cnotes = None, []
            if st == "R" and old:
                change = "renamed"
                bc = base_configs(old)
                if isinstance(bc, dict) and sc.profile in bc and bc[sc.profile].fingerprint != sc.fingerprint:
                    cnotes.append(f"renamed from {old} and its effective config changed")
            elif st == "A":
                change = "added"
            elif touched:
                bc = base_configs(path)
                if bc is None or (isinstance(bc, dict) and sc.profile not in bc):
                    change = "added"
                elif isinstance(bc, str):
                    change = "modified"
                    cnotes.append(f"the base version cannot be read: {bc}")
                else:
                    b = bc[sc.profile]
                    if b.content_key != sc.content_key or b.fingerprint != sc.fingerprint:
                        change = "modified"
                        via = [s for s in touched if s != path]
                        if via and path not in touched:
                            cnotes.append(f"changed through {', '.join(via)}")
            if change is None:
                continue
            status, code, reason, receipt, diff = verdict(sc, attempts, root)
            results.append(ConfigResult(
                path=path, profile=sc.profile, kind=sc.kind, change=change, status=status, reason_code=code,
                reason=reason, fingerprint=sc.fingerprint, command=None if status == "pass" else record_command(sc, project),
                renamed_from=old if change == "renamed" else None, receipt=receipt, diff=diff,
                notes=cnotes + list(sc.notes)))
        # profiles that are gone from a file that is still here (or was renamed)
        if entry.kind == "serving-profiles" and path in changes:
            bc = base_configs(old if st == "R" and old else path)
            if isinstance(bc, dict):
                now = {c.profile for c in configs}
                for prof, b in bc.items():
                    if prof not in now:
                        results.append(ConfigResult(path, prof, b.kind, "profile_removed", "pass", "deleted",
                                                    "profile removed: nothing to verify", b.fingerprint, None))
    # deleted configs (and configs moved to a path the project file does not declare)
    moved_to = {old: new for new, (st, old) in changes.items() if st == "R" and old}
    for path, (st, _) in sorted(changes.items()):
        if st != "D" or path in renamed_old or path in current:
            continue
        bc = base_configs(path)
        if bc is None:
            continue
        if path in moved_to:
            for prof, b in (bc.items() if isinstance(bc, dict) else [(None, None)]):
                results.append(ConfigResult(
                    path, prof, b.kind if b else "?", "renamed", "fail", "undeclared",
                    f"renamed to {moved_to[path]}, which {project.origin} does not declare as a serving config; "
                    f"update its path there so that the gate checks it", b.fingerprint if b else None, None))
            continue
        if isinstance(bc, str):
            be = base_decl.entry_for(path) or project.entry_for(path)
            results.append(ConfigResult(path, None, be.kind if be else "?", "deleted", "pass", "deleted",
                                        "deleted: nothing to verify", None, None))
            continue
        still = next((e for e in project.configs if not e.is_glob and e.path == path), None)
        tail = f" (its entry configs[{still.index}] can go from {project.origin})" if still else ""
        for prof, b in bc.items():
            results.append(ConfigResult(path, prof, b.kind, "deleted", "pass", "deleted",
                                        f"deleted: nothing to verify{tail}", b.fingerprint, None))
    if base_project is not None:
        for e in base_project.configs:
            if e.is_glob or e.path in current:
                continue
            if work.read(e.path) is not None and project.entry_for(e.path) is None:
                notes.append(f"{e.path} is no longer declared in {project.origin}; the gate does not check it")
    notes += [n for n in scan_notes]
    results.sort(key=lambda r: (r.status != "fail", r.path, r.profile or ""))
    return GateResult(base, base_commit, mb, project.origin, results, notes)
