"""Serving configs: each declared file (vLLM YAML, serving profiles, serve script, env file) → the
:class:`ServingConfig` objects it starts, ready to fingerprint exactly as ``retest`` does."""
from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any, Callable

from oomdoctor.card import fingerprint as fpmod
from oomdoctor.engines.vllm.argv import LIST_SETTINGS, normalize_args, size_arg as _size
from oomdoctor.errors import BadInput
from oomdoctor.gate.git import Tree
from oomdoctor.gate.project import ConfigEntry, Project
from oomdoctor.gate.script import parse_env_file, parse_serve_script
from oomdoctor.profiles import reader as profile_reader
from oomdoctor.profiles.files import load_yaml as _load_yaml_text

def parse_vllm_yaml(text: str, origin: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A vLLM ``--config`` YAML file → (engine args, {model, revision} when it names them)."""
    d = _load_yaml_text(text, origin)
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise BadInput(f"{origin}: a vLLM --config file must be a YAML mapping of option: value, "
                       f"found {type(d).__name__}")
    ident: dict[str, str] = {}
    pairs = []
    for k, v in d.items():
        if not isinstance(k, str):
            raise BadInput(f"{origin}: option name {k!r} is not a string")
        kk = k.strip().lstrip("-").replace("-", "_")
        if kk in ("model", "model_tag"):
            ident["model"] = str(v)
        elif kk == "revision":
            ident["revision"] = str(v)
        else:
            pairs.append((k, v))
    return normalize_args(pairs, origin, strict=True), ident


PROFILES_SCHEMA_ID = profile_reader.SCHEMA_ID
PROFILE_FIELDS = profile_reader.PROFILE_FIELDS


@dataclass
class Profile:
    name: str
    args: dict[str, Any]
    requires_free_bytes: int | None
    resolved: dict[str, Any]        # the profile as written (for change detection)


def _profile_args(e: profile_reader.ProfileEntry, origin: str) -> dict[str, Any]:
    pairs: list[tuple[str, Any]] = []
    for k, v in profile_reader.settings_of(e, origin).items():
        if fpmod.canonical_key(k) == "kv_cache_memory_bytes" and v is not None:
            v = _size(v, f"{origin}: {e.where}.settings.{k}")      # as the plugin reads it: '4.84GiB', '8G', bytes
        pairs.append((k, v))
    for k in ("window", "max_model_len"):
        if e.raw.get(k) is not None:
            pairs.append(("max_model_len", e.raw[k]))
    return normalize_args(pairs, f"{origin}: {e.where}", strict=True)


def parse_profiles(text: str, origin: str) -> dict[str, Profile]:
    """A serving-profiles file (JSON, or YAML when not named *.json; see docs/gate.md) → name → Profile.

    Read by THE profiles reader (:mod:`oomdoctor.profiles.reader`), so that the gate fingerprints exactly
    what the plugin applies."""
    out: dict[str, Profile] = {}
    for e in profile_reader.profile_entries(profile_reader.load_doc(text, origin), origin):
        p = e.raw
        rfb = _size(p["requires_free_bytes"], f"{origin}: {e.where}.requires_free_bytes") \
            if p.get("requires_free_bytes") is not None else None
        resolved = {k: v for k, v in p.items() if k not in ("note", "description")}
        out[e.name] = Profile(e.name, _profile_args(e, origin), rfb, resolved)
    return out


# ----------------------------------------------------------------------------- serving configs
@dataclass
class ServingConfig:
    """One serving config (one profile of a profiles file) as it would start, ready to fingerprint."""

    path: str                       # repo-relative
    profile: str | None
    kind: str
    engine: str
    engine_version: str
    model: str
    model_revision: str | None
    args: dict[str, Any]            # every engine option found (snake_case), memory-shaping or not
    env: dict[str, str]             # the engine's environment from the config (env file, exports, inline)
    targets: list[str]
    conditions: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)       # repo-relative files it was built from
    notes: list[str] = field(default_factory=list)
    content_key: str = ""           # changes when anything it was built from changes

    @property
    def effective_config(self) -> dict[str, Any]:
        return fpmod.effective_config(self.engine, self.engine_version, self.model, self.model_revision,
                                      self.args, self.env, conditions=self.conditions or None)

    @property
    def fingerprint(self) -> str:
        return fpmod.fingerprint(self.effective_config)

    @property
    def label(self) -> str:
        return f"{self.path} [{self.profile}]" if self.profile is not None else self.path

    def argv(self) -> list[str]:
        """``vllm serve MODEL --flag value ...`` for these settings (for ``record`` to start the engine)."""
        out = ["vllm", "serve", self.model]
        if self.model_revision:
            out += ["--revision", self.model_revision]
        for k, v in self.args.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                out.append(flag)
            elif v is False:
                out.append("--no-" + k.replace("_", "-"))
            elif v is None:
                continue
            elif isinstance(v, list) and fpmod.canonical_key(k) in LIST_SETTINGS:
                out += [flag] + [str(x) for x in v]
            elif isinstance(v, (dict, list)):
                out += [flag, json.dumps(v, separators=(",", ":"))]
            else:
                out += [flag, str(v)]
        return out


def _identity(entry: ConfigEntry, project: Project, ident: dict[str, str | None], origin: str) -> tuple[str, str | None]:
    w = f"{project.origin}: configs[{entry.index}]"
    model, rev = entry.model, entry.model_revision
    found_model, found_rev = ident.get("model"), ident.get("revision")
    if found_model is not None:
        if model is not None and found_model != model:
            raise BadInput(f"{origin}: serves model {found_model!r} but {w}.model declares {model!r}; make them agree")
        model = found_model
    if found_rev is not None:
        if rev is not None and found_rev != rev:
            raise BadInput(f"{origin}: uses revision {found_rev!r} but {w}.model_revision declares {rev!r}; "
                           f"make them agree")
        rev = found_rev
    if model is None:
        raise BadInput(f"{w}.model: required field is missing ({origin} does not name the model)")
    return model, rev


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _resolve_ref(tree: Tree, ref: str, near: str) -> str | None:
    """A file named inside a config (``--config x.yaml``): beside the config, else from the repo root."""
    ref = ref.replace("\\", "/")
    if ref.startswith("/"):
        return None
    for cand in (posixpath.normpath(posixpath.join(posixpath.dirname(near), ref)), posixpath.normpath(ref)):
        if not cand.startswith("../") and tree.read(cand) is not None:
            return cand
    return None


@dataclass
class _Source:
    """One declared config file being read: its text, the env file beside it, what it was built from."""

    project: Project
    entry: ConfigEntry
    rel: str
    tree: Tree
    text: str
    env: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    texts: dict[str, str | None] = field(default_factory=dict)

    @property
    def cond(self) -> dict[str, Any]:
        rfb = self.entry.requires_free_bytes
        return {"requires_free_bytes": rfb} if rfb is not None else {}

    def identity(self, ident: dict[str, str | None], origin: str | None = None) -> tuple[str, str | None]:
        return _identity(self.entry, self.project, ident, origin or self.rel)

    def make(self, profile: str | None, ident: tuple[str, str | None], args: dict, env: dict, cond: dict,
             notes: list[str], content: Any) -> ServingConfig:
        e = self.entry
        return ServingConfig(self.rel, profile, e.kind, e.engine, e.engine_version, ident[0], ident[1], args, env,
                             list(e.targets), cond, list(self.sources), notes, _key(e.declaration(), content))


def _open_source(project: Project, entry: ConfigEntry, rel: str, tree: Tree) -> _Source:
    text = tree.read(rel)
    if text is None:
        raise BadInput(f"{rel}: no such file ({tree.label})")
    src = _Source(project, entry, rel, tree, text, sources=[rel], texts={rel: text})
    if entry.env_file:
        et = tree.read(entry.env_file)
        if et is None:
            raise BadInput(f"{project.origin}: configs[{entry.index}].env_file: {entry.env_file} does not exist "
                           f"({tree.label})")
        src.env = parse_env_file(et, entry.env_file)
        src.sources.append(entry.env_file)
        src.texts[entry.env_file] = et
    return src


def _from_vllm_yaml(src: _Source) -> list[ServingConfig]:
    args, ident = parse_vllm_yaml(src.text, src.rel)
    return [src.make(None, src.identity(dict(ident)), args, src.env, src.cond, [], src.texts)]


def _from_env(src: _Source) -> list[ServingConfig]:
    env2 = {**src.env, **parse_env_file(src.text, src.rel)}
    return [src.make(None, src.identity({}), {}, env2, src.cond, [], src.texts)]


def _from_serve_script(src: _Source) -> list[ServingConfig]:
    rel, tree = src.rel, src.tree
    cmd = parse_serve_script(src.text, rel, src.env, src.entry.env_file)
    args: dict[str, Any] = {}
    ident: dict[str, str | None] = {"model": cmd.model, "revision": cmd.revision}
    for ref in cmd.config_files:
        path = _resolve_ref(tree, ref, rel)
        if path is None:
            raise BadInput(f"{rel}:{cmd.line}: --config {ref}: no such file in the repository ({tree.label})")
        yargs, yident = parse_vllm_yaml(tree.read(path) or "", path)
        args.update(yargs)
        for k, v in yident.items():
            if ident.get(k) is None:
                ident[k] = v
        src.sources.append(path)
        src.texts[path] = tree.read(path)
    args = normalize_args(list(args.items()) + list(cmd.args.items()), rel, strict=False)
    return [src.make(None, src.identity(ident), args, cmd.env, src.cond, list(cmd.notes), src.texts)]


def _from_profiles(src: _Source) -> list[ServingConfig]:
    out = []
    for name, prof in parse_profiles(src.text, src.rel).items():
        ident = src.identity({}, f"{src.rel} profile {name!r}")
        cond_p = dict(src.cond)
        if prof.requires_free_bytes is not None:
            cond_p["requires_free_bytes"] = prof.requires_free_bytes
        content = {"profile": prof.resolved, **{k: v for k, v in src.texts.items() if k != src.rel}}
        out.append(src.make(name, ident, prof.args, src.env, cond_p, [], content))
    return out


_BUILDERS: dict[str, Callable[[_Source], list[ServingConfig]]] = {
    "vllm-config": _from_vllm_yaml, "env": _from_env, "serve-script": _from_serve_script,
    "serving-profiles": _from_profiles}


def build_serving_configs(project: Project, entry: ConfigEntry, rel: str, tree: Tree) -> list[ServingConfig]:
    """Parse the config at ``rel`` (read from ``tree``) → one ServingConfig, or one per profile."""
    src = _open_source(project, entry, rel, tree)
    return _BUILDERS[entry.kind](src)


