"""The project file (``.oomdoctor.yaml``): which files are serving configs, of which kind, running what."""
from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomdoctor.engines.vllm.argv import size_arg as _size
from oomdoctor.errors import BadInput
from oomdoctor.profiles.files import load_yaml

PROJECT_FILE = ".oomdoctor.yaml"
PROJECT_VERSION = 1
KINDS = ("vllm-config", "serving-profiles", "serve-script", "env")
ENGINES = ("vllm",)
TOP_FIELDS = ("version", "defaults", "configs", "receipts", "incidents", "signers")
DECL_FIELDS = ("engine", "engine_version", "model", "model_revision", "targets", "env_file", "requires_free_bytes")
ENTRY_FIELDS = ("path", "kind") + DECL_FIELDS


def _glob_re(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("^" + "".join(out) + "$")


@dataclass
class ConfigEntry:
    """One ``configs[]`` item of the project file, paths made repo-relative, defaults applied."""

    index: int
    path: str                       # repo-relative path or glob
    kind: str
    engine: str
    engine_version: str
    model: str | None
    model_revision: str | None
    targets: list[str]
    env_file: str | None = None     # repo-relative
    requires_free_bytes: int | None = None

    @property
    def is_glob(self) -> bool:
        return any(c in self.path for c in "*?[")

    def matches(self, rel: str) -> bool:
        return _glob_re(self.path).match(rel) is not None if self.is_glob else rel == self.path

    def declaration(self) -> dict:
        return {"kind": self.kind, "engine": self.engine, "engine_version": self.engine_version, "model": self.model,
                "model_revision": self.model_revision, "targets": sorted(self.targets), "env_file": self.env_file,
                "requires_free_bytes": self.requires_free_bytes}


@dataclass
class Project:
    origin: str                     # how to name the project file in messages
    rel: str | None                 # repo-relative path of the project file (None: outside the repository)
    configs: list[ConfigEntry]
    receipts: list[str]             # repo-relative folders searched for receipts
    incidents: list[str]            # repo-relative folders searched for incident cards
    signers: str | None = None      # repo-relative allowed_signers file: receipts must be signed (gate/signing.py)

    def entry_for(self, rel: str) -> ConfigEntry | None:
        for e in self.configs:
            if e.matches(rel):
                return e
        return None


def _repo_path(base_dir: str, value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"{where}: must be a non-empty path (a string)")
    v = value.strip().replace("\\", "/")
    if v.startswith("/") or re.match(r"^[A-Za-z]:/", v):
        raise BadInput(f"{where}: {value!r} is absolute; write it relative to the project file")
    p = posixpath.normpath(posixpath.join(base_dir, v)) if base_dir else posixpath.normpath(v)
    if p == ".." or p.startswith("../"):
        raise BadInput(f"{where}: {value!r} points outside the repository")
    return p


def _str_field(v: Any, where: str, *, example: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        if isinstance(v, float):
            raise BadInput(f"{where}: YAML read {v!r} as a number; quote it, e.g. {example}")
        raise BadInput(f"{where}: must be a string, found {type(v).__name__} {v!r}")
    s = str(v).strip()
    if not s:
        raise BadInput(f"{where}: must not be empty")
    return s


def _check_top(d: Any, origin: str) -> dict:
    if not isinstance(d, dict):
        raise BadInput(f"{origin}: must be a YAML mapping with 'version: 1' and 'configs:' (see docs/gate.md)")
    for k in d:
        if k not in TOP_FIELDS:
            raise BadInput(f"{origin}: {k}: unknown field (allowed: {', '.join(TOP_FIELDS)})")
    if "version" not in d:
        raise BadInput(f"{origin}: version: required field is missing (write 'version: 1')")
    if d["version"] != PROJECT_VERSION or isinstance(d["version"], bool):
        raise BadInput(f"{origin}: version: {d['version']!r} is not supported; this oomdoctor reads version 1")
    return d


def _defaults(d: dict, origin: str) -> dict:
    defaults = d.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise BadInput(f"{origin}: defaults: must be a mapping of {', '.join(DECL_FIELDS)}")
    for k in defaults:
        if k not in DECL_FIELDS:
            raise BadInput(f"{origin}: defaults.{k}: unknown field (allowed: {', '.join(DECL_FIELDS)})")
    return defaults


def _folders(d: dict, key: str, origin: str, base_dir: str) -> list[str]:
    v = d.get(key, [key])
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or not v:
        raise BadInput(f"{origin}: {key}: must be a folder or a list of folders")
    return [_repo_path(base_dir, x, f"{origin}: {key}[{i}]") for i, x in enumerate(v)]


def _configs_list(d: dict, origin: str) -> list:
    configs = d.get("configs")
    if configs is None:
        raise BadInput(f"{origin}: configs: required field is missing (the list of serving configs)")
    if not isinstance(configs, list) or not configs:
        raise BadInput(f"{origin}: configs: must be a non-empty list of {{path, kind, ...}}")
    return configs


def _merged_entry(raw: Any, defaults: dict, w: str) -> dict:
    """A configs[] item with the defaults under it, its own fields checked and the required ones present."""
    if not isinstance(raw, dict):
        raise BadInput(f"{w}: must be a mapping with at least path and kind")
    for k in raw:
        if k not in ENTRY_FIELDS:
            raise BadInput(f"{w}.{k}: unknown field (allowed: {', '.join(ENTRY_FIELDS)})")
    e = {**defaults, **raw}
    for req in ("path", "kind"):
        if e.get(req) in (None, ""):
            raise BadInput(f"{w}.{req}: required field is missing")
    return e


def _optional_str(e: dict, key: str, w: str, example: str) -> str | None:
    return _str_field(e[key], f"{w}.{key}", example=example) if e.get(key) is not None else None


def _targets(e: dict, w: str) -> list[str]:
    targets = e["targets"]
    targets = [targets] if isinstance(targets, str) else targets
    if not isinstance(targets, list) or not all(isinstance(t, str) and t.strip() for t in targets):
        raise BadInput(f"{w}.targets: must be a device name or a list of them (e.g. [nvidia-h200])")
    return [t.strip() for t in targets]


def _entry(i: int, raw: Any, defaults: dict, origin: str, base_dir: str) -> ConfigEntry:
    w = f"{origin}: configs[{i}]"
    e = _merged_entry(raw, defaults, w)
    path = _repo_path(base_dir, e["path"], f"{w}.path")
    if e["kind"] not in KINDS:
        raise BadInput(f"{w}.kind: {e['kind']!r} is not one of {', '.join(KINDS)}")
    for req in ("engine", "engine_version", "targets"):
        if e.get(req) in (None, "", []):
            raise BadInput(f"{w}.{req}: required field is missing (here or under defaults)")
    engine = _str_field(e["engine"], f"{w}.engine", example="vllm")
    if engine not in ENGINES:
        raise BadInput(f"{w}.engine: {engine!r} is not supported (supported: {', '.join(ENGINES)})")
    version = _str_field(e["engine_version"], f"{w}.engine_version", example='engine_version: "0.11.0"')
    model = _optional_str(e, "model", w, 'model: "org/name"')
    rev = _optional_str(e, "model_revision", w, 'model_revision: "abc123"')
    targets = _targets(e, w)
    env_file = _repo_path(base_dir, e["env_file"], f"{w}.env_file") if e.get("env_file") is not None else None
    rfb = _size(e["requires_free_bytes"], f"{w}.requires_free_bytes") if e.get("requires_free_bytes") is not None else None
    if e["kind"] == "env" and env_file:
        raise BadInput(f"{w}.env_file: an 'env' config is itself the env file; drop env_file")
    return ConfigEntry(i, path, e["kind"], engine, version, model, rev, targets, env_file, rfb)


def parse_project(text: str, origin: str, base_dir: str = "", rel: str | None = None) -> Project:
    """Validate a project file's text. Every problem is a BadInput naming the file and the field."""
    d = _check_top(load_yaml(text, origin), origin)
    defaults = _defaults(d, origin)
    receipts, incidents = (_folders(d, key, origin, base_dir) for key in ("receipts", "incidents"))
    entries = [_entry(i, raw, defaults, origin, base_dir) for i, raw in enumerate(_configs_list(d, origin))]
    signers = _repo_path(base_dir, d["signers"], f"{origin}: signers") if d.get("signers") is not None else None
    return Project(origin, rel, entries, receipts, incidents, signers)


def load_project(path: str | os.PathLike, repo_root: str | os.PathLike | None = None) -> Project:
    """Read the project file at ``path``; its paths are relative to its folder, returned repo-relative."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"no project file at {p} (write a {PROJECT_FILE} listing the serving configs; see docs/gate.md)")
    from oomdoctor import safeyaml  # noqa: PLC0415
    from oomdoctor.diagnose.read import read_capped  # noqa: PLC0415

    try:
        text = read_capped(p, safeyaml.MAX_BYTES, "project file").decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInput(f"{p}: cannot be read ({e})")
    root = Path(repo_root).resolve() if repo_root else p.resolve().parent
    try:
        rel = p.resolve().relative_to(root).as_posix()
    except ValueError:
        rel = None
    base_dir = posixpath.dirname(rel) if rel else ""
    return parse_project(text, rel or str(p), base_dir, rel)
