"""Finding the project file and the serving configs it declares (for ``record --serving-config`` and the gate)."""
from __future__ import annotations

import os
from pathlib import Path

from oomdoctor.errors import BadInput
from oomdoctor.gate.configs import ServingConfig, build_serving_configs
from oomdoctor.gate.git import Git, Tree, WorkTree
from oomdoctor.gate.project import PROJECT_FILE, ConfigEntry, Project, load_project


def _project_for(git: Git | None, cwd: Path, project_file: str | os.PathLike | None) -> tuple[Path, Path]:
    """(repository root, project file): ``project_file`` relative to ``cwd``, else the nearest
    .oomdoctor.yaml from ``cwd`` up to the repository root (the root's when run from the root)."""
    root = git.root if git is not None else cwd
    if project_file:
        p = Path(project_file)
        return root, p if p.is_absolute() else cwd / p
    here = cwd.resolve()
    top = Path(root).resolve()
    while True:
        if (here / PROJECT_FILE).is_file():
            return root, here / PROJECT_FILE
        if here == top or here.parent == here or top not in here.parents:
            return root, Path(root) / PROJECT_FILE
        here = here.parent


def _open_project(project_file: str | os.PathLike | None, cwd: str | os.PathLike | None):
    """(cwd, git or None outside a repository, project root, the parsed project file)."""
    here = Path(cwd or os.getcwd())
    try:
        git: Git | None = Git(here)
    except BadInput:
        git = None
    root, pf = _project_for(git, here, project_file)
    return here, git, root, load_project(pf, root)


def list_serving_configs(project_file: str | os.PathLike | None = None,
                         cwd: str | os.PathLike | None = None) -> list[ServingConfig]:
    """Every serving config the project file declares, as in the working tree."""
    cwd, git, root, project = _open_project(project_file, cwd)
    tree = WorkTree(root, git)
    out: list[ServingConfig] = []
    for rel, entry in _instances(project, tree):
        out += build_serving_configs(project, entry, rel, tree)
    return out


def load_serving_config(config_path: str | os.PathLike, profile: str | None = None,
                        project_file: str | os.PathLike | None = None,
                        cwd: str | os.PathLike | None = None) -> ServingConfig:
    """The serving config at ``config_path`` (relative to ``cwd``), as the project file declares it.
    For a serving-profiles file, ``profile`` names the profile (required). BadInput when the path is not
    a declared serving config, or the profile does not exist."""
    cwd, git, root, project = _open_project(project_file, cwd)
    cp = Path(config_path)
    cp = cp if cp.is_absolute() else cwd / cp
    try:
        rel = cp.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        raise BadInput(f"{config_path}: outside the repository {root}")
    entry = project.entry_for(rel)
    if entry is None:
        raise BadInput(f"{rel}: not a serving config of {project.origin} (add it under configs:)")
    configs = build_serving_configs(project, entry, rel, WorkTree(root, git))
    if entry.kind == "serving-profiles":
        names = [c.profile for c in configs]
        if profile is None:
            raise BadInput(f"{rel}: a serving-profiles file; name the profile (one of {', '.join(map(str, names))})")
        for c in configs:
            if c.profile == profile:
                return c
        raise BadInput(f"{rel}: no profile {profile!r} (profiles: {', '.join(map(str, names))})")
    if profile is not None:
        raise BadInput(f"{rel}: is a {entry.kind}, not a serving-profiles file; drop the profile")
    return configs[0]


def _instances(project: Project, tree: Tree) -> list[tuple[str, ConfigEntry]]:
    """(path, entry) for every declared config present in ``tree`` (the first entry that matches wins)."""
    files = None
    out: dict[str, ConfigEntry] = {}
    for e in project.configs:
        if e.is_glob:
            files = files if files is not None else tree.files()
            for f in files:
                if e.matches(f) and f not in out:
                    out[f] = e
        elif e.path not in out and tree.read(e.path) is not None:
            out[e.path] = e
    return [(p, out[p]) for p in sorted(out)]
