"""The CI gate: no serving-config change lands without a passing retest of its exact effective config.

Pipeline (plain functions, each testable alone):

1. ``load_project`` reads the project file (``.oomdoctor.yaml``): which files are serving configs, what kind
   each is, and what it runs (engine, engine version in use, model, revision, target devices).
2. ``Git`` finds what changed against the base: ``git diff --name-status -M <merge-base>`` (committed,
   staged and unstaged changes of tracked files) plus untracked files, with renames.
3. ``build_serving_configs`` parses each config (vLLM ``--config`` YAML, serving-profiles JSON, serve
   script, env file) into :class:`ServingConfig` objects, one per profile, and computes the effective
   config and fingerprint with :mod:`oomdoctor.fingerprint`, exactly as ``retest`` does.
4. ``verdict`` looks the fingerprint up in the receipts and incident cards (:mod:`oomdoctor.receipt`) and
   says pass, or why not and which command would produce the missing receipt.

``load_serving_config(path, profile)`` is the entry point for ``oomdoctor record --serving-config``.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oomdoctor.card import fingerprint as fpmod
from oomdoctor.card import receipt as rcpt
from oomdoctor.errors import BadInput
from oomdoctor.units import parse_size

PROJECT_FILE = ".oomdoctor.yaml"
PROJECT_VERSION = 1
KINDS = ("vllm-config", "serving-profiles", "serve-script", "env")
ENGINES = ("vllm",)
TOP_FIELDS = ("version", "defaults", "configs", "receipts", "incidents")
DECL_FIELDS = ("engine", "engine_version", "model", "model_revision", "targets", "env_file", "requires_free_bytes")
ENTRY_FIELDS = ("path", "kind") + DECL_FIELDS

# ----------------------------------------------------------------------------- vLLM argument knowledge
# vLLM flags that take no value (argparse store_true / BooleanOptionalAction). Needed to tell
# ``--enforce-eager MODEL`` (flag, then the positional model) from ``--max-model-len 32768``.
BOOL_FLAGS = frozenset({
    "enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "skip_mm_profiling",
    "enable_flashinfer_autotune", "trust_remote_code", "disable_log_stats", "disable_log_requests",
    "enable_log_requests", "enable_log_outputs", "enable_auto_tool_choice", "disable_custom_all_reduce",
    "enable_lora", "enable_lora_bias", "fully_sharded_loras", "disable_frontend_multiprocessing",
    "enable_sleep_mode", "headless", "disable_uvicorn_access_log", "enable_request_id_headers",
    "disable_fastapi_docs", "enable_server_load_tracking", "enable_force_include_usage",
    "enable_prompt_tokens_details", "return_tokens_as_token_ids", "enable_expert_parallel", "enable_eplb",
    "async_scheduling", "disable_sliding_window", "disable_cascade_attn", "skip_tokenizer_init",
    "enable_prompt_embeds", "allow_credentials", "enable_tokenizer_info_endpoint", "use_tqdm_on_load",
    "disable_mm_preprocessor_cache", "disable_async_output_proc", "enable_dbo", "data_parallel_hybrid_lb",
    "data_parallel_external_lb", "enable_multimodal_encoder_data_parallel", "enable_log_deltas",
    "disable_chunked_mm_input", "enable_mfu_metrics", "kv_sharing_fast_prefill", "calculate_kv_scales",
})
LIST_SETTINGS = frozenset({"cuda_graph_sizes"})              # canonical names; nargs='+' on the command line
SHORT_FLAGS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
               "q": "quantization"}
SERVE_MODULES = ("vllm.entrypoints.openai.api_server",)
SERVE_CLI_MODULES = ("vllm.entrypoints.cli.main",)


# ----------------------------------------------------------------------------- git
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
                old = by_blob.pop(h.stdout.decode().strip(), None) if h.returncode == 0 else None
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


# ----------------------------------------------------------------------------- trees (working tree / base)
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
        try:
            data = p.read_bytes()
        except OSError as e:
            raise BadInput(f"{rel}: cannot be read ({e})")
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


# ----------------------------------------------------------------------------- project file
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


def parse_project(text: str, origin: str, base_dir: str = "", rel: str | None = None) -> Project:
    """Validate a project file's text. Every problem is a BadInput naming the file and the field."""
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        prob = getattr(e, "problem", None) or "malformed"
        raise BadInput(f"{origin}: malformed YAML{f' at line {mark.line + 1}' if mark else ''}: {prob}")
    if not isinstance(d, dict):
        raise BadInput(f"{origin}: must be a YAML mapping with 'version: 1' and 'configs:' (see docs/gate.md)")
    for k in d:
        if k not in TOP_FIELDS:
            raise BadInput(f"{origin}: {k}: unknown field (allowed: {', '.join(TOP_FIELDS)})")
    if "version" not in d:
        raise BadInput(f"{origin}: version: required field is missing (write 'version: 1')")
    if d["version"] != PROJECT_VERSION or isinstance(d["version"], bool):
        raise BadInput(f"{origin}: version: {d['version']!r} is not supported; this oomdoctor reads version 1")
    defaults = d.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise BadInput(f"{origin}: defaults: must be a mapping of {', '.join(DECL_FIELDS)}")
    for k in defaults:
        if k not in DECL_FIELDS:
            raise BadInput(f"{origin}: defaults.{k}: unknown field (allowed: {', '.join(DECL_FIELDS)})")
    dirs: dict[str, list[str]] = {}
    for key in ("receipts", "incidents"):
        v = d.get(key, [key])
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not v:
            raise BadInput(f"{origin}: {key}: must be a folder or a list of folders")
        dirs[key] = [_repo_path(base_dir, x, f"{origin}: {key}[{i}]") for i, x in enumerate(v)]
    configs = d.get("configs")
    if configs is None:
        raise BadInput(f"{origin}: configs: required field is missing (the list of serving configs)")
    if not isinstance(configs, list) or not configs:
        raise BadInput(f"{origin}: configs: must be a non-empty list of {{path, kind, ...}}")
    entries = []
    for i, raw in enumerate(configs):
        w = f"{origin}: configs[{i}]"
        if not isinstance(raw, dict):
            raise BadInput(f"{w}: must be a mapping with at least path and kind")
        for k in raw:
            if k not in ENTRY_FIELDS:
                raise BadInput(f"{w}.{k}: unknown field (allowed: {', '.join(ENTRY_FIELDS)})")
        e = {**defaults, **raw}
        for req in ("path", "kind"):
            if e.get(req) in (None, ""):
                raise BadInput(f"{w}.{req}: required field is missing")
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
        model = _str_field(e["model"], f"{w}.model", example='model: "org/name"') if e.get("model") is not None else None
        rev = (_str_field(e["model_revision"], f"{w}.model_revision", example='model_revision: "abc123"')
               if e.get("model_revision") is not None else None)
        targets = e["targets"]
        targets = [targets] if isinstance(targets, str) else targets
        if not isinstance(targets, list) or not all(isinstance(t, str) and t.strip() for t in targets):
            raise BadInput(f"{w}.targets: must be a device name or a list of them (e.g. [nvidia-h200])")
        env_file = _repo_path(base_dir, e["env_file"], f"{w}.env_file") if e.get("env_file") is not None else None
        rfb = None
        if e.get("requires_free_bytes") is not None:
            rfb = _size(e["requires_free_bytes"], f"{w}.requires_free_bytes")
        if e["kind"] == "env" and env_file:
            raise BadInput(f"{w}.env_file: an 'env' config is itself the env file; drop env_file")
        entries.append(ConfigEntry(i, path, e["kind"], engine, version, model, rev,
                                   [t.strip() for t in targets], env_file, rfb))
    return Project(origin, rel, entries, dirs["receipts"], dirs["incidents"])


def _size(v: Any, where: str) -> int:
    if isinstance(v, bool):
        raise BadInput(f"{where}: must be a size in bytes (e.g. 25769803776 or \"24GiB\"), found {v!r}")
    try:
        n = parse_size(str(v))
    except BadInput as e:
        raise BadInput(f"{where}: {e}")
    if n < 0:
        raise BadInput(f"{where}: must not be negative")
    return n


def load_project(path: str | os.PathLike, repo_root: str | os.PathLike | None = None) -> Project:
    """Read the project file at ``path``; its paths are relative to its folder, returned repo-relative."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"no project file at {p} (write a {PROJECT_FILE} listing the serving configs; see docs/gate.md)")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{p}: cannot be read ({e})")
    root = Path(repo_root).resolve() if repo_root else p.resolve().parent
    try:
        rel = p.resolve().relative_to(root).as_posix()
    except ValueError:
        rel = None
    base_dir = posixpath.dirname(rel) if rel else ""
    return parse_project(text, rel or str(p), base_dir, rel)


# ----------------------------------------------------------------------------- parsing configs
def _json_like(v: Any) -> Any:
    if isinstance(v, str) and v.strip()[:1] in ("{", "["):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def normalize_args(pairs: list[tuple[str, Any]], origin: str, strict: bool) -> dict[str, Any]:
    """Engine options as written (kebab or snake, ``--no-x``) → one snake_case dict.

    ``no_x: true`` becomes ``x: false`` for memory settings, JSON strings become objects, the nargs='+'
    settings become lists. ``strict`` (a YAML/JSON mapping): two spellings of one setting with different
    values are an error; otherwise (a command line) the later one wins, as with argparse."""
    out: dict[str, Any] = {}
    seen: dict[str, tuple[str, Any]] = {}
    for raw, v in pairs:
        k = str(raw).strip().lstrip("-").replace("-", "_")
        if not k:
            continue
        if k.startswith("no_") and fpmod.canonical_key(k[3:]) is not None and (isinstance(v, bool) or v in (None, "")):
            k, v = k[3:], (not v) if isinstance(v, bool) else False
        v = _json_like(v)
        ck = fpmod.canonical_key(k)
        if ck == "kv_cache_memory_bytes" and isinstance(v, str) and not fpmod.HUMAN_INT_RE.match(v.strip()) \
                and not _is_number(v.strip()):
            v = _size(v, f"{origin}: {raw}")                    # '4.84GiB' (vLLM itself takes '5G' or bytes)
        if ck in LIST_SETTINGS and v is not None and not isinstance(v, (list, tuple, bool)):
            v = [v]
        slot = ck or k
        if slot in seen:
            prev_k, prev_v = seen[slot]
            if strict and fpmod.normalize_value(prev_v) != fpmod.normalize_value(v):
                raise BadInput(f"{origin}: {prev_k!r} and {raw!r} both set {slot}, to different values "
                               f"({prev_v!r} and {v!r})")
            out.pop(prev_k, None)
        out[k] = v
        seen[slot] = (k, v)
    return out


_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s?(.*?)\s*$")


def parse_env_file(text: str, origin: str) -> dict[str, str]:
    """KEY=VALUE lines (``export`` allowed, ``#`` comments, values in quotes or bare)."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            raise BadInput(f"{origin}:{n}: not a KEY=VALUE line: {s[:80]!r}")
        val = m.group(2).strip()
        if val[:1] in ("'", '"'):
            try:
                toks = shlex.split(val, comments=True)
            except ValueError as e:
                raise BadInput(f"{origin}:{n}: {e} in the value of {m.group(1)}")
            if len(toks) != 1:
                raise BadInput(f"{origin}:{n}: the value of {m.group(1)} is not one quoted string")
            val = toks[0]
        else:
            val = re.sub(r"\s+#.*$", "", val)
        out[m.group(1)] = val
    return out


def _load_yaml_text(text: str, origin: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        prob = getattr(e, "problem", None) or "malformed"
        raise BadInput(f"{origin}: malformed YAML{f' at line {mark.line + 1}' if mark else ''}: {prob}")


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


PROFILES_SCHEMA_ID = "oomdoctor.serving-profiles/v1"
# The one serving-profiles format, shared with oomdoctor/profiles.py (the vLLM plugin's profile picker):
# engine options live under `settings` (vLLM's snake_case names), `window` is max_model_len.
PROFILE_FIELDS = ("name", "window", "max_model_len", "settings", "requires_free_bytes", "measured",
                  "declared_free_bytes", "note", "description")


@dataclass
class Profile:
    name: str
    args: dict[str, Any]
    requires_free_bytes: int | None
    resolved: dict[str, Any]        # the profile as written (for change detection)


def _load_profiles_doc(text: str, origin: str) -> Any:
    if origin.lower().endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as e:
            msg = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            raise BadInput(f"{origin}: not valid JSON: {msg}")
    return _load_yaml_text(text, origin)


def parse_profiles(text: str, origin: str) -> dict[str, Profile]:
    """A serving-profiles file (JSON, or YAML when not named *.json; see docs/gate.md) → name → Profile.

    The format is the one oomdoctor/profiles.py reads, so that the gate fingerprints exactly what the
    plugin applies: ``{"schema": "oomdoctor.serving-profiles/v1", "profiles": {NAME: {"window": N,
    "settings": {...}, "requires_free_bytes": B, ...}}}`` (or a list of profiles with ``name``, under
    ``profiles``, or ``serving_profiles`` inside a model's config.json)."""
    d = _load_profiles_doc(text, origin)
    if not isinstance(d, dict):
        raise BadInput(f"{origin}: a serving-profiles file is an object with 'profiles' (see docs/gate.md)")
    if d.get("schema", PROFILES_SCHEMA_ID) != PROFILES_SCHEMA_ID:
        raise BadInput(f"{origin}: schema {d.get('schema')!r}; this oomdoctor reads {PROFILES_SCHEMA_ID!r}")
    key = "profiles" if "profiles" in d else "serving_profiles" if "serving_profiles" in d else None
    if key is None:
        raise BadInput(f"{origin}: no 'profiles' (or 'serving_profiles') mapping or list; see docs/gate.md")
    profiles = d[key]
    items: list[tuple[str, Any, str]] = []
    if isinstance(profiles, dict):
        items = [(str(name), p, f"{key}.{name}") for name, p in profiles.items()]
    elif isinstance(profiles, list):
        for i, p in enumerate(profiles):
            w = f"{key}[{i}]"
            if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not p["name"].strip():
                raise BadInput(f"{origin}: {w}.name: required field is missing (each profile in a list needs a name)")
            items.append((p["name"].strip(), p, w))
    else:
        raise BadInput(f"{origin}: {key}: must be a mapping (name → profile) or a list of profiles")
    if not items:
        raise BadInput(f"{origin}: {key}: no profiles")
    out: dict[str, Profile] = {}
    for name, p, w in items:
        if not isinstance(p, dict):
            raise BadInput(f"{origin}: {w}: must be a mapping with settings")
        if name in out:
            raise BadInput(f"{origin}: {w}.name: profile {name!r} is defined twice")
        for k in p:
            if k not in PROFILE_FIELDS:
                hint = " (engine options go under `settings`)" if fpmod.canonical_key(str(k)) else ""
                raise BadInput(f"{origin}: {w}.{k}: unknown field{hint}; allowed: {', '.join(PROFILE_FIELDS)}")
        settings = p.get("settings") or {}
        if not isinstance(settings, dict):
            raise BadInput(f"{origin}: {w}.settings: must be a mapping of engine options")
        pairs: list[tuple[str, Any]] = []
        for k, v in settings.items():
            if not isinstance(k, str) or not k.isidentifier():
                raise BadInput(f"{origin}: {w}.settings.{k}: not an engine argument name (use vLLM's snake_case)")
            if fpmod.canonical_key(k) == "kv_cache_memory_bytes" and v is not None:
                v = _size(v, f"{origin}: {w}.settings.{k}")      # as the plugin reads it: '4.84GiB', '8G', bytes
            pairs.append((k, v))
        for k in ("window", "max_model_len"):
            if p.get(k) is not None:
                pairs.append(("max_model_len", p[k]))
        args = normalize_args(pairs, f"{origin}: {w}", strict=True)
        rfb = _size(p["requires_free_bytes"], f"{origin}: {w}.requires_free_bytes") \
            if p.get("requires_free_bytes") is not None else None
        resolved = {k: v for k, v in p.items() if k not in ("note", "description")}
        out[name] = Profile(name, args, rfb, resolved)
    return out


# --- serve scripts -----------------------------------------------------------------------------------
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN_RE = re.compile(rf"^({_NAME})=(.*)$", re.S)
_ARGS_SENTINEL = "\x00oomdoctor-args\x00"


class _Unresolvable(str):
    """A script variable whose value cannot be known statically (the reason is the string)."""


def _split_commands(text: str, origin: str) -> list[tuple[int, str]]:
    """A shell script → its simple commands as (line number, raw text): line continuations joined,
    comments dropped, split at unquoted newlines, ';', '&&', '||', '|' and '&'. Quotes are kept."""
    cmds: list[tuple[int, str]] = []
    buf: list[str] = []
    line, start = 1, 1
    quote: str | None = None
    depth = 0           # inside $( ... )
    heredocs: list[tuple[str, bool]] = []
    i, n = 0, len(text)

    def flush() -> None:
        s = "".join(buf).strip()
        if s:
            cmds.append((start, s))
        buf.clear()

    while i < n:
        c = text[i]
        if not buf:
            if c in (" ", "\t"):
                i += 1
                continue
            start = line
        if quote == "'":
            buf.append(c)
            if c == "'":
                quote = None
            elif c == "\n":
                line += 1
            i += 1
            continue
        if c == "\\":
            if text.startswith("\\\r\n", i):
                i += 3
                line += 1
                continue
            if i + 1 < n and text[i + 1] == "\n":
                i += 2
                line += 1
                continue
            buf.append(text[i:i + 2])
            i += 2
            continue
        if quote == '"':
            buf.append(c)
            if c == '"':
                quote = None
            elif c == "\n":
                line += 1
            i += 1
            continue
        if c in ("'", '"'):
            quote = c
            buf.append(c)
            i += 1
            continue
        if c == "`":
            j = text.find("`", i + 1)
            j = n - 1 if j < 0 else j
            line += text.count("\n", i, j + 1)
            buf.append(text[i:j + 1])
            i = j + 1
            continue
        if text.startswith("$(", i):
            depth += 1
            buf.append("$(")
            i += 2
            continue
        if depth and c == ")":
            depth -= 1
            buf.append(c)
            i += 1
            continue
        if c == "#" and (not buf or buf[-1][-1:] in (" ", "\t", "\n", ";", "&", "|", "(")):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
            m = re.match(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2", text[i:])
            if m:
                heredocs.append((m.group(3), bool(m.group(1))))
                buf.append(m.group(0))
                i += m.end()
                continue
        if depth == 0 and (c in ("\n", ";", "|", "&")):
            flush()
            if c == "\n":
                line += 1
            i += 1
            if c == "\n" and heredocs:                     # skip the here-document bodies
                for word, strip_tabs in heredocs:
                    while i < n:
                        j = text.find("\n", i)
                        body_line = text[i:n if j < 0 else j]
                        i = n if j < 0 else j + 1
                        line += 1
                        if (body_line.lstrip("\t") if strip_tabs else body_line) == word:
                            break
                heredocs.clear()
            while i < n and text[i] in ("|", "&") and c in ("|", "&"):
                i += 1
            continue
        if c == "\n":
            line += 1
        buf.append(c)
        i += 1
    if quote:
        raise BadInput(f"{origin}:{start}: unterminated {quote} quote")
    flush()
    return cmds


def _escape(val: str, quote: str | None) -> str:
    if quote == '"':
        return val.replace("\\", "\\\\").replace('"', '\\"')
    return re.sub(r"([\\'\"])", r"\\\1", val)


_PARAM_RE = re.compile(rf"\$(?:\{{([^}}]*)\}}|({_NAME})|([0-9@*#?$!-]))")
_BRACE_RE = re.compile(rf"^({_NAME})(?:(:?[-=+?])(.*))?$", re.S)


def _lookup(name: str, vars_: dict[str, str], where: str, hint: str) -> str | None:
    v = vars_.get(name)
    if isinstance(v, _Unresolvable):
        raise BadInput(f"{where}: ${name} cannot be resolved: {v}")
    return v


def _expand(raw: str, vars_: dict[str, str], where: str, hint: str) -> str:
    """Expand $VAR, ${VAR}, ${VAR:-default} (and -, :=, =, :+, +) outside single quotes, escaping the
    values so that shlex then splits the words the way the shell would. Anything that cannot be known
    without running the script ($(...), `...`, $1) is an error naming the line."""
    out: list[str] = []
    quote: str | None = None
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if quote == "'":
            out.append(c)
            if c == "'":
                quote = None
            i += 1
            continue
        if c == "\\":
            out.append(raw[i:i + 2])
            i += 2
            continue
        if c == '"':
            quote = None if quote == '"' else '"'
            out.append(c)
            i += 1
            continue
        if c == "'" and quote is None:
            quote = "'"
            out.append(c)
            i += 1
            continue
        if c == "`" or raw.startswith("$(", i):
            raise BadInput(f"{where}: a command substitution ({'`...`' if c == '`' else '$(...)'}) cannot be resolved "
                           f"without running the script; write the value, or set it in the env file")
        if c == "$":
            m = _PARAM_RE.match(raw, i)
            if not m:
                out.append(c)
                i += 1
                continue
            if m.group(3) is not None:
                if m.group(3) in ("@", "*"):
                    out.append(_ARGS_SENTINEL)
                    i = m.end()
                    continue
                raise BadInput(f"{where}: ${m.group(3)} cannot be resolved without running the script")
            if m.group(2) is not None:
                name, op, word = m.group(2), None, ""
            else:
                bm = _BRACE_RE.match(m.group(1))
                if not bm:
                    raise BadInput(f"{where}: ${{{m.group(1)}}} is not supported (use $VAR, ${{VAR}} or ${{VAR:-default}})")
                name, op, word = bm.group(1), bm.group(2), bm.group(3) or ""
            val = _lookup(name, vars_, where, hint)
            if op in (":-", ":=", "-", "="):
                if val is None or (op.startswith(":") and val == ""):
                    val = _plain_word(word, vars_, where, hint)
                    if op.endswith("="):
                        vars_[name] = val
            elif op in (":+", "+"):
                val = _plain_word(word, vars_, where, hint) if (val is not None and (op == "+" or val != "")) else ""
            elif op in (":?", "?"):
                if val is None or (op == ":?" and val == ""):
                    raise BadInput(f"{where}: ${name} is not set ({hint})")
            if val is None:
                raise BadInput(f"{where}: ${name} is not set ({hint}); the gate needs its value for the fingerprint")
            out.append(_escape(val, quote))
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _plain_word(word: str, vars_: dict[str, str], where: str, hint: str) -> str:
    """The word of ${VAR:-word}: expanded, quotes removed."""
    exp = _expand(word, vars_, where, hint)
    try:
        toks = shlex.split(exp)
    except ValueError:
        return exp
    return " ".join(toks).replace(_ARGS_SENTINEL, "")


def _is_number(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


def _is_flag(t: str) -> bool:
    return t.startswith("-") and t != "-" and not _is_number(t)


def _find_serve(toks: list[str]) -> int | None:
    """Index of the first engine argument after ``vllm serve`` / ``python -m vllm.entrypoints...``."""
    for i, t in enumerate(toks):
        b = posixpath.basename(t)
        if b == "vllm" and i + 1 < len(toks) and toks[i + 1] == "serve":
            return i + 2
        if re.fullmatch(r"python[0-9.]*", b) and i + 2 < len(toks) and toks[i + 1] == "-m":
            if toks[i + 2] in SERVE_MODULES:
                return i + 3
            if toks[i + 2] in SERVE_CLI_MODULES and i + 3 < len(toks) and toks[i + 3] == "serve":
                return i + 4
    return None


@dataclass
class ServeCommand:
    line: int
    model: str | None
    revision: str | None
    args: dict[str, Any]
    env: dict[str, str]
    config_files: list[str]
    argv: list[str]
    notes: list[str] = field(default_factory=list)


def parse_serve_args(toks: list[str], where: str) -> tuple[str | None, str | None, list[tuple[str, Any]], list[str]]:
    """The tokens after ``vllm serve`` → (model, revision, [(option, value)], [--config files])."""
    model = revision = None
    pairs: list[tuple[str, Any]] = []
    configs: list[str] = []
    positional: list[str] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "--":
            positional += toks[i + 1:]
            break
        if _is_flag(t):
            long = t.startswith("--")
            name, eq, val = t[2 if long else 1:].partition("=")
            key = name.replace("-", "_")
            if not long:
                key = SHORT_FLAGS.get(key, key)
            if eq:
                value: Any = val
                i += 1
            elif key in BOOL_FLAGS or (key.startswith("no_") and (key[3:] in BOOL_FLAGS or fpmod.canonical_key(key[3:]))):
                value = True
                i += 1
            elif fpmod.canonical_key(key) in LIST_SETTINGS:
                vals = []
                i += 1
                while i < len(toks) and not _is_flag(toks[i]):
                    vals += [x for x in toks[i].split(",") if x]
                    i += 1
                value = vals
            elif i + 1 < len(toks) and not _is_flag(toks[i + 1]):
                value = toks[i + 1]
                i += 2
            else:
                value = True
                i += 1
            if key in ("model", "model_tag"):
                model = str(value)
            elif key == "revision":
                revision = str(value)
            elif key == "config":
                configs.append(str(value))
            else:
                pairs.append((key, value))
            continue
        positional.append(t)
        i += 1
    if positional:
        if model is not None or len(positional) > 1:
            extra = positional[1:] if model is None else positional
            raise BadInput(f"{where}: unexpected argument {extra[0]!r} (one model only; if it is the value of a flag "
                           f"the gate does not know, write --flag=value)")
        model = positional[0]
    return model, revision, pairs, configs


def parse_serve_script(text: str, origin: str, env: dict[str, str], env_origin: str | None = None) -> ServeCommand:
    """A shell script that starts ``vllm serve MODEL --flag value ...`` → the one serve command.

    Variables come from ``env`` (the env file listed alongside: the process environment) and from the
    script's own assignments (``X=...``, ``export X=...``, ``set -a``), in order. The engine's environment
    is the env file, the exported variables, and the ``NAME=value`` words before the command."""
    text = text.replace("\r\n", "\n")
    hint = f"not in {env_origin}, not assigned in the script" if env_origin else \
        "no env file is listed for this script (env_file:) and the script does not assign it"
    vars_: dict[str, str] = dict(env)
    exported: set[str] = set(env)
    allexport = False
    found: list[ServeCommand] = []
    notes: list[str] = []
    for line, raw in _split_commands(text, origin):
        where = f"{origin}:{line}"
        try:
            rtoks = shlex.split(raw)
        except ValueError as e:
            raise BadInput(f"{where}: cannot be read as a shell command ({e})")
        if not rtoks:
            continue
        head = rtoks[0]
        if head in ("echo", "printf", ":", "true", "logger", "#"):
            continue
        if head == "set":
            for t in rtoks[1:]:
                if t.startswith("-") and "a" in t[1:] and not t.startswith("--"):
                    allexport = True
                elif t.startswith("+") and "a" in t[1:]:
                    allexport = False
            if "allexport" in rtoks:
                allexport = rtoks[rtoks.index("allexport") - 1] == "-o"
            continue
        is_decl = head in ("export", "declare", "typeset", "readonly", "local")
        if is_decl or all(_ASSIGN_RE.match(t) for t in rtoks):
            try:
                toks = shlex.split(_expand(raw, vars_, where, hint))
                err = None
            except BadInput as e:
                toks, err = rtoks, str(e)
            do_export = head == "export" or (head in ("declare", "typeset") and any(
                t.startswith("-") and "x" in t for t in rtoks[1:]))
            for t in toks[1:] if is_decl else toks:
                if t.startswith("-"):
                    continue
                m = _ASSIGN_RE.match(t)
                name = m.group(1) if m else t if re.fullmatch(_NAME, t) else None
                if name is None:
                    continue
                if m:
                    vars_[name] = _Unresolvable(err) if err else m.group(2).replace(_ARGS_SENTINEL, "")
                if do_export or allexport:
                    exported.add(name)
            continue
        start = _find_serve(rtoks)
        if start is None:
            if head in ("source", ".") and len(rtoks) > 1:
                notes.append(f"{where}: '{raw}' is not followed; the gate reads variables from the env file and "
                             f"the script's own assignments")
            continue
        expanded = _expand(raw, vars_, where, hint)
        try:
            toks = [t for t in shlex.split(expanded) if t != _ARGS_SENTINEL]
        except ValueError as e:
            raise BadInput(f"{where}: cannot be read as a shell command after expanding variables ({e})")
        if _ARGS_SENTINEL in expanded:
            notes.append(f"{where}: \"$@\" passes the script's own arguments to the engine; the gate checks the "
                         f"command without them")
        toks = [t.replace(_ARGS_SENTINEL, "") for t in toks]
        start = _find_serve(toks)
        if start is None:
            raise BadInput(f"{where}: the serve command changed shape after expanding variables; write "
                           f"'vllm serve' literally")
        inline: dict[str, str] = {}
        for t in toks[:start]:
            m = _ASSIGN_RE.match(t)
            if m:
                inline[m.group(1)] = m.group(2)
        model, revision, pairs, cfgs = parse_serve_args(toks[start:], where)
        cmd_env = {k: vars_[k] for k in exported if k in vars_}
        for k, v in list(cmd_env.items()):
            if isinstance(v, _Unresolvable):
                if k in fpmod.MEMORY_ENV:
                    raise BadInput(f"{where}: ${k} cannot be resolved: {v}")
                del cmd_env[k]
        cmd_env.update(inline)
        found.append(ServeCommand(line, model, revision, normalize_args(pairs, where, strict=False), cmd_env,
                                  cfgs, toks[start:], []))
    if not found:
        raise BadInput(f"{origin}: no `vllm serve` command found (a serve script must start the engine with "
                       f"`vllm serve MODEL ...` or `python -m vllm.entrypoints.openai.api_server ...`)")
    if len(found) > 1:
        raise BadInput(f"{origin}: {len(found)} `vllm serve` commands (lines {', '.join(str(f.line) for f in found)}); "
                       f"a serve script must start exactly one engine")
    cmd = found[0]
    cmd.notes = notes
    return cmd


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


def build_serving_configs(project: Project, entry: ConfigEntry, rel: str, tree: Tree) -> list[ServingConfig]:
    """Parse the config at ``rel`` (read from ``tree``) → one ServingConfig, or one per profile."""
    text = tree.read(rel)
    if text is None:
        raise BadInput(f"{rel}: no such file ({tree.label})")
    w = f"{project.origin}: configs[{entry.index}]"
    env: dict[str, str] = {}
    sources = [rel]
    texts = {rel: text}
    if entry.env_file:
        et = tree.read(entry.env_file)
        if et is None:
            raise BadInput(f"{w}.env_file: {entry.env_file} does not exist ({tree.label})")
        env = parse_env_file(et, entry.env_file)
        sources.append(entry.env_file)
        texts[entry.env_file] = et
    decl = entry.declaration()
    cond = {"requires_free_bytes": entry.requires_free_bytes} if entry.requires_free_bytes is not None else {}

    def make(profile: str | None, model: str, rev: str | None, args: dict, env_: dict, cond_: dict,
             notes: list[str], content: Any) -> ServingConfig:
        return ServingConfig(rel, profile, entry.kind, entry.engine, entry.engine_version, model, rev, args, env_,
                             list(entry.targets), cond_, list(sources), notes, _key(decl, content))

    if entry.kind == "vllm-config":
        args, ident = parse_vllm_yaml(text, rel)
        model, rev = _identity(entry, project, ident, rel)
        return [make(None, model, rev, args, env, cond, [], texts)]
    if entry.kind == "env":
        env2 = {**env, **parse_env_file(text, rel)}
        model, rev = _identity(entry, project, {}, rel)
        return [make(None, model, rev, {}, env2, cond, [], texts)]
    if entry.kind == "serve-script":
        cmd = parse_serve_script(text, rel, env, entry.env_file)
        args: dict[str, Any] = {}
        ident = {"model": cmd.model, "revision": cmd.revision}
        for ref in cmd.config_files:
            path = _resolve_ref(tree, ref, rel)
            if path is None:
                raise BadInput(f"{rel}:{cmd.line}: --config {ref}: no such file in the repository ({tree.label})")
            yargs, yident = parse_vllm_yaml(tree.read(path) or "", path)
            args.update(yargs)
            for k, v in yident.items():
                if ident.get(k) is None:
                    ident[k] = v
            sources.append(path)
            texts[path] = tree.read(path)
        args = normalize_args(list(args.items()) + list(cmd.args.items()), rel, strict=False)
        model, rev = _identity(entry, project, ident, rel)
        return [make(None, model, rev, args, cmd.env, cond, list(cmd.notes), texts)]
    # serving-profiles
    out = []
    for name, prof in parse_profiles(text, rel).items():
        model, rev = _identity(entry, project, {}, f"{rel} profile {name!r}")
        cond_p = dict(cond)
        if prof.requires_free_bytes is not None:
            cond_p["requires_free_bytes"] = prof.requires_free_bytes
        content = {"profile": prof.resolved, **{k: v for k, v in texts.items() if k != rel}}
        out.append(make(name, model, rev, prof.args, env, cond_p, [], content))
    return out


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


def list_serving_configs(project_file: str | os.PathLike | None = None,
                         cwd: str | os.PathLike | None = None) -> list[ServingConfig]:
    """Every serving config the project file declares, as in the working tree."""
    cwd = Path(cwd or os.getcwd())
    try:
        git: Git | None = Git(cwd)
    except BadInput:
        git = None
    root, pf = _project_for(git, cwd, project_file)
    project = load_project(pf, root)
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
    cwd = Path(cwd or os.getcwd())
    try:
        git: Git | None = Git(cwd)
    except BadInput:
        git = None
    root, pf = _project_for(git, cwd, project_file)
    project = load_project(pf, root)
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


# ----------------------------------------------------------------------------- verdicts
@dataclass
class ConfigResult:
    path: str
    profile: str | None
    kind: str
    change: str                     # added | modified | renamed | deleted | profile_removed
    status: str                     # pass | fail
    reason_code: str                # receipt | deleted | no_receipt | other_fingerprint | stale | wrong_target | not_real | not_passing
    reason: str
    fingerprint: str | None
    command: str | None
    renamed_from: str | None = None
    receipt: dict | None = None
    diff: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.path} [{self.profile}]" if self.profile is not None else self.path

    def to_dict(self) -> dict:
        return {"path": self.path, "profile": self.profile, "status": self.status, "fingerprint": self.fingerprint,
                "reason": self.reason, "command": self.command, "kind": self.kind, "change": self.change,
                "renamed_from": self.renamed_from, "reason_code": self.reason_code, "receipt": self.receipt,
                "diff": self.diff, "notes": self.notes}


@dataclass
class GateResult:
    base: str
    base_commit: str
    merge_base: str
    project_file: str
    configs: list[ConfigResult]
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status == "pass" for c in self.configs)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict:
        return {"passed": self.passed, "configs": [c.to_dict() for c in self.configs], "base": self.base,
                "base_commit": self.base_commit, "merge_base": self.merge_base, "project_file": self.project_file,
                "notes": self.notes}


def record_command(sc: ServingConfig, project: Project | None = None) -> str:
    """The command that produces the missing receipt."""
    parts = ["oomdoctor", "record", "--serving-config", sc.path]
    if sc.profile is not None:
        parts += ["--profile", sc.profile]
    parts += ["--target", sc.targets[0]]
    if project is not None and project.rel != PROJECT_FILE:
        parts += ["--config", project.rel or project.origin]
    return " ".join(shlex.quote(p) for p in parts)


def _same_except_version(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "engine_version"} == {k: v for k, v in b.items() if k != "engine_version"}


def verdict(sc: ServingConfig, attempts: list[rcpt.FoundAttempt], root: Path | None = None) -> tuple[str, str, str, dict | None, list[str]]:
    """(status, reason_code, reason, receipt, diff) for one serving config against every attempt found."""
    fp, ec, targets = sc.fingerprint, sc.effective_config, sc.targets
    newest = sorted(attempts, key=lambda a: a.at, reverse=True)
    exact = [a for a in newest if a.fingerprint == fp and a.consistent and not a.problems]
    ok = [a for a in exact if a.is_passing(targets)]
    tl = ", ".join(targets)
    if ok:
        a = ok[0]
        return "pass", "receipt", f"passing retest: {a.describe(root)}", _receipt_info(a, root), []
    if exact:
        wrong_target = [a for a in exact if a.outcome == "pass" and a.mode == "real"]
        twin = [a for a in exact if a.outcome == "pass" and a.mode != "real"]
        if wrong_target:
            a = wrong_target[0]
            return ("fail", "wrong_target", f"the retest of this fingerprint passed on {a.target_device or 'an unnamed device'} "
                    f"({a.describe(root)}), but a receipt must be for {tl}", _receipt_info(a, root), [])
        if twin:
            a = twin[0]
            return ("fail", "not_real", f"only a {a.mode or 'unspecified-mode'} retest of this fingerprint passed "
                    f"({a.describe(root)}); a receipt needs the real engine (mode 'real')", _receipt_info(a, root), [])
        a = exact[0]
        return ("fail", "not_passing", f"the retest of this fingerprint did not pass (outcome {a.outcome!r}: "
                f"{a.describe(root)})", _receipt_info(a, root), [])
    eligible = [a for a in newest if a.is_passing(targets) and a.effective_config is not None]
    stale = [a for a in eligible if _same_except_version(a.effective_config, ec)
             and rcpt.compare_versions(a.effective_config.get("engine_version"), sc.engine_version) == -1]
    if stale:
        a = stale[0]
        return ("fail", "stale", f"stale receipt: {a.describe(root)} was recorded with {sc.engine} "
                f"{a.effective_config.get('engine_version')}; the engine in use is {sc.engine} {sc.engine_version}",
                _receipt_info(a, root), fpmod.diff(a.effective_config, ec))
    if eligible:
        a = min(eligible, key=lambda x: len(fpmod.diff(x.effective_config, ec)))
        d = fpmod.diff(a.effective_config, ec)
        return ("fail", "other_fingerprint", f"receipt for another fingerprint: the nearest, {a.describe(root)}, "
                f"differs in {len(d)} setting{'s' if len(d) != 1 else ''} (receipt → this config):",
                _receipt_info(a, root), d)
    return ("fail", "no_receipt", f"no receipt: no passing real retest on {tl} for this fingerprint", None, [])


def _receipt_info(a: rcpt.FoundAttempt, root: Path | None) -> dict:
    where = a.where(root).rsplit(" attempt ", 1)[0]
    return {"path": where, "kind": a.kind, "attempt": a.n, "fingerprint": a.fingerprint, "outcome": a.outcome,
            "mode": a.mode, "engine_version": a.engine_version, "target_device": a.target_device, "at": a.at or None}


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


# ----------------------------------------------------------------------------- output
def render_text(res: GateResult) -> str:
    lines = []
    n = len(res.configs)
    head = f"oomdoctor gate: base {res.base} (merge-base {res.merge_base[:12]}), project {res.project_file}"
    lines.append(head)
    if not n:
        lines.append("no serving config changed")
    for c in res.configs:
        tag = "PASS" if c.status == "pass" else "FAIL"
        what = c.change + (f" from {c.renamed_from}" if c.renamed_from else "")
        lines.append("")
        lines.append(f"{tag}  {c.label}  ({what})")
        if c.fingerprint:
            lines.append(f"      fingerprint: {c.fingerprint}")
        lines.append(f"      why: {c.reason}")
        for d in c.diff:
            lines.append(f"        {d}")
        for note in c.notes:
            lines.append(f"      note: {note}")
        if c.command:
            lines.append(f"      to produce it: {c.command}")
    for note in res.notes:
        lines.append(f"note: {note}")
    failed = sum(1 for c in res.configs if c.status != "pass")
    lines.append("")
    if failed:
        lines.append(f"gate: FAIL: {failed} of {n} changed serving config{'s' if n != 1 else ''} "
                     f"{'has' if failed == 1 else 'have'} no passing retest")
    elif n:
        lines.append(f"gate: PASS: {n} changed serving config{'s' if n != 1 else ''}, each with a passing retest "
                     f"or nothing to verify")
    else:
        lines.append("gate: PASS: no serving config changed")
    return "\n".join(lines)
