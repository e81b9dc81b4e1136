"""Stage 3 — rules: load the YAML rule files of ``rules/<engine>/`` and match them against lines.

A rule is data (see ``docs/rules.md``): an id, the engine and its versions, a role, the
class/phase it stands for, regex patterns with named groups, the numbers those groups
give (with units), the levers that apply, and test cases beside it. A malformed rule
fails loading with its file name and the reason.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import yaml

from oomdoctor import contract
from oomdoctor.errors import RuleError
from oomdoctor.diagnose.parse import LogLine
from oomdoctor.units import UNIT_BYTES, convert

try:  # Python 3.11+: the regex parser moved under re._parser
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

ROLES = ("root", "cascade", "milestone", "frame", "signal", "info")
NUMBER_UNITS = set(UNIT_BYTES) | {"int", "tokens", "count", "float", "ratio", "percent", "seconds", "str", "size"}
RULE_KEYS = {"id", "engine", "versions", "title", "role", "class", "class_by_phase", "phase", "reaches",
             "priority", "fallback", "message", "patterns", "numbers", "levers", "tests", "references", "status"}
ENGINE_KEYS = {"engine", "name", "covers", "detect", "version_patterns", "phases", "notes"}


# ----------------------------------------------------------------------------- versions
def parse_version(v: str) -> tuple[int, ...]:
    """'0.25.1' → (0, 25, 1); suffixes like '.dev3+gabc', 'rc1', '+cu130' are ignored."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", str(v).strip())
    if not m:
        raise ValueError(f"not a version: {v!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def version_in(version: str, spec: str | None) -> bool:
    """``version_in('0.25.1', '>=0.11,<0.34')``. An empty spec admits every version."""
    if not spec:
        return True
    v = parse_version(version)
    for part in str(spec).split(","):
        part = part.strip()
        m = re.match(r"(>=|<=|==|!=|>|<)\s*(.+)", part)
        if not m:
            raise ValueError(f"bad version spec {part!r}")
        op, rhs = m.group(1), parse_version(m.group(2))
        c = _cmp(v, rhs)
        ok = {">=": c >= 0, "<=": c <= 0, "==": c == 0, "!=": c != 0, ">": c > 0, "<": c < 0}[op]
        if not ok:
            return False
    return True


def _check_spec(spec: Any, where: str) -> None:
    if spec is None:
        return
    try:
        version_in("0.0.0", str(spec))
    except ValueError as e:
        raise RuleError(f"{where}: {e}")


# ----------------------------------------------------------------------------- anchors
def derive_anchor(pattern: str) -> str | None:
    """The longest literal run (≥ 4 chars) that every match of ``pattern`` contains."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    best, cur = "", []
    for op, av in parsed:
        if op is sre_parse.LITERAL:
            cur.append(chr(av))
            continue
        if len(cur) > len(best):
            best = "".join(cur)
        cur = []
    if len(cur) > len(best):
        best = "".join(cur)
    return best if len(best) >= 4 else None


# ----------------------------------------------------------------------------- data classes
@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern[str]
    anchor: str


@dataclass(frozen=True)
class NumberSpec:
    name: str
    group: str
    unit: str


@dataclass
class Rule:
    id: str
    engine: str
    role: str
    patterns: list[Pattern]
    path: str
    versions: str | None = None
    title: str = ""
    klass: str | None = None
    class_by_phase: dict[str, str] = field(default_factory=dict)
    phase: str | None = None
    reaches: str | None = None
    priority: int = 0
    fallback: bool = False
    message: str = ""
    numbers: list[NumberSpec] = field(default_factory=list)
    levers: list[str] = field(default_factory=list)
    tests: list[dict] = field(default_factory=list)

    def applies_to(self, version: str | None) -> bool:
        return version is None or version_in(version, self.versions)

    def match(self, line: LogLine) -> re.Match[str] | None:
        for p in self.patterns:
            if p.anchor in line.text:
                m = p.regex.search(line.msg) or (p.regex.search(line.text) if line.msg is not line.text else None)
                if m:
                    return m
        return None

    def extract(self, m: re.Match[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        gd = m.groupdict()
        for spec in self.numbers:
            raw = gd.get(spec.group)
            if raw is None:
                continue
            try:
                out[spec.name] = convert(raw, spec.unit)
            except (ValueError, Exception):  # a malformed number in a log is skipped, never guessed
                continue
        return out


@dataclass
class EngineSpec:
    engine: str
    name: str
    covers: str | None
    detect: list[str]
    version_patterns: list[re.Pattern[str]]
    phases: list[str]
    path: str


@dataclass
class RuleSet:
    engines: dict[str, EngineSpec]
    rules: list[Rule]

    def for_engine(self, engine: str, version: str | None = None) -> list[Rule]:
        return [r for r in self.rules if r.engine == engine and r.applies_to(version)]

    def by_id(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)


# ----------------------------------------------------------------------------- loading
def _req(d: dict, key: str, where: str, typ: type | tuple = str) -> Any:
    if key not in d:
        raise RuleError(f"{where}: missing required field '{key}'")
    if not isinstance(d[key], typ):
        raise RuleError(f"{where}: field '{key}' must be {getattr(typ, '__name__', typ)}")
    return d[key]


def _compile(regex: Any, where: str) -> re.Pattern[str]:
    if not isinstance(regex, str) or not regex:
        raise RuleError(f"{where}: 'regex' must be a non-empty string")
    try:
        return re.compile(regex)
    except re.error as e:
        raise RuleError(f"{where}: invalid regex ({e})")


def build_rule(d: Any, path: Path, engine_dir: str) -> Rule:
    where = f"{path}"
    if not isinstance(d, dict):
        raise RuleError(f"{where}: a rule must be a mapping")
    rid = _req(d, "id", where)
    where = f"{path} [{rid}]"
    unknown = set(d) - RULE_KEYS
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    engine = _req(d, "engine", where)
    if engine != engine_dir:
        raise RuleError(f"{where}: engine '{engine}' does not match its folder rules/{engine_dir}/")
    role = d.get("role", "root")
    if role not in ROLES:
        raise RuleError(f"{where}: role '{role}' is not one of {', '.join(ROLES)}")
    _check_spec(d.get("versions"), where)
    klass = d.get("class")
    cbp = d.get("class_by_phase") or {}
    if klass is not None and klass not in contract.CLASSES:
        raise RuleError(f"{where}: class '{klass}' is not a contract class")
    if not isinstance(cbp, dict):
        raise RuleError(f"{where}: 'class_by_phase' must be a mapping phase → class")
    for ph, cl in cbp.items():
        if ph not in contract.PHASES:
            raise RuleError(f"{where}: class_by_phase: '{ph}' is not a contract phase")
        if cl not in contract.CLASSES:
            raise RuleError(f"{where}: class_by_phase: '{cl}' is not a contract class")
    if role in ("root", "signal") and not klass and not cbp:
        raise RuleError(f"{where}: a {role} rule needs 'class' or 'class_by_phase'")
    phase = d.get("phase")
    if klass and phase is None:
        phase = contract.CLASSES[klass]["phase"]
    if phase is not None and phase not in contract.PHASES:
        raise RuleError(f"{where}: phase '{phase}' is not a contract phase")
    if klass and phase != contract.CLASSES[klass]["phase"]:
        raise RuleError(f"{where}: class '{klass}' belongs to phase '{contract.CLASSES[klass]['phase']}', not '{phase}'")
    reaches = d.get("reaches")
    if role in ("milestone", "frame"):
        if reaches not in contract.PHASES:
            raise RuleError(f"{where}: a {role} rule needs 'reaches: <phase>' (one of {', '.join(contract.PHASES)})")
    pats = _req(d, "patterns", where, list)
    if not pats:
        raise RuleError(f"{where}: 'patterns' is empty")
    patterns = []
    for i, p in enumerate(pats):
        pw = f"{where} patterns[{i}]"
        if isinstance(p, str):
            p = {"regex": p}
        if not isinstance(p, dict):
            raise RuleError(f"{pw}: must be a mapping with 'regex'")
        rx = _compile(p.get("regex"), pw)
        anchor = p.get("anchor") or derive_anchor(p["regex"])
        if not anchor or not isinstance(anchor, str):
            raise RuleError(f"{pw}: no literal of 4+ characters in the regex; give an 'anchor' the matched lines contain")
        if not anchor.isascii():
            raise RuleError(f"{pw}: the anchor must be ASCII")
        patterns.append(Pattern(rx, anchor))
    numbers = []
    groups = set().union(*(set(p.regex.groupindex) for p in patterns))
    for name, spec in (d.get("numbers") or {}).items():
        nw = f"{where} numbers.{name}"
        if isinstance(spec, str):
            spec = {"group": name, "unit": spec}
        if not isinstance(spec, dict) or "unit" not in spec:
            raise RuleError(f"{nw}: must be 'unit' or a mapping with 'group' and 'unit'")
        group = spec.get("group", name)
        if group not in groups:
            raise RuleError(f"{nw}: group '{group}' is not a named group of any pattern")
        unit = str(spec["unit"])
        if unit.lower() not in NUMBER_UNITS:
            raise RuleError(f"{nw}: unknown unit '{unit}'")
        if unit.lower() in UNIT_BYTES and not name.endswith("_bytes"):
            raise RuleError(f"{nw}: a byte quantity's name must end in _bytes")
        numbers.append(NumberSpec(name, group, unit))
    levers = d.get("levers") or []
    if not isinstance(levers, list):
        raise RuleError(f"{where}: 'levers' must be a list")
    for lv in levers:
        if lv not in contract.LEVERS:
            raise RuleError(f"{where}: lever '{lv}' is not a contract lever id")
    tests = d.get("tests") or []
    if not isinstance(tests, list) or not all(isinstance(t, dict) and "fixture" in t for t in tests):
        raise RuleError(f"{where}: 'tests' must be a list of mappings with 'fixture'")
    prio = d.get("priority", 0)
    if not isinstance(prio, int):
        raise RuleError(f"{where}: 'priority' must be an integer")
    return Rule(
        id=rid, engine=engine, role=role, patterns=patterns, path=str(path), versions=d.get("versions"),
        title=d.get("title", ""), klass=klass, class_by_phase=dict(cbp), phase=phase, reaches=reaches,
        priority=prio, fallback=bool(d.get("fallback", False)), message=str(d.get("message", "")).strip(),
        numbers=numbers, levers=list(levers), tests=tests,
    )


def build_engine(d: Any, path: Path, engine_dir: str) -> EngineSpec:
    where = str(path)
    if not isinstance(d, dict):
        raise RuleError(f"{where}: engine.yaml must be a mapping")
    unknown = set(d) - ENGINE_KEYS
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    engine = _req(d, "engine", where)
    if engine != engine_dir:
        raise RuleError(f"{where}: engine '{engine}' does not match its folder")
    _check_spec(d.get("covers"), where)
    detect = d.get("detect") or []
    if not isinstance(detect, list) or not all(isinstance(x, str) and x for x in detect):
        raise RuleError(f"{where}: 'detect' must be a list of literal strings")
    vps = [_compile(p, f"{where} version_patterns[{i}]") for i, p in enumerate(d.get("version_patterns") or [])]
    for i, p in enumerate(vps):
        if "version" not in p.groupindex:
            raise RuleError(f"{where} version_patterns[{i}]: needs a named group 'version'")
    phases = d.get("phases") or list(contract.PHASES)
    for ph in phases:
        if ph not in contract.PHASES:
            raise RuleError(f"{where}: phase '{ph}' is not a contract phase")
    return EngineSpec(engine, d.get("name", engine), d.get("covers"), detect, vps, phases, str(path))


def _load_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RuleError(f"{path}: cannot be read ({e})")
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise RuleError(f"{path}: malformed YAML{where} ({getattr(e, 'problem', None) or e})")


def load_rules(root: Path) -> RuleSet:
    root = Path(root)
    if not root.is_dir():
        raise RuleError(f"{root}: rules folder not found (set OOMDOCTOR_RULES)")
    engines: dict[str, EngineSpec] = {}
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        # the package keeps an engine's rules in engines/<engine>/rules/; a plain rules root has <engine>/ itself
        edir = folder / "rules" if (folder / "rules").is_dir() else folder
        espec = edir / "engine.yaml"
        if not espec.exists():
            raise RuleError(f"{edir}: missing engine.yaml (engine name, versions covered, detection strings)")
        engines[folder.name] = build_engine(_load_yaml(espec), espec, folder.name)
        for f in sorted(edir.rglob("*.yaml")):
            if f.name == "engine.yaml":
                continue
            data = _load_yaml(f)
            items = data.get("rules") if isinstance(data, dict) and "rules" in data and "id" not in data else [data]
            if not isinstance(items, list):
                raise RuleError(f"{f}: 'rules' must be a list")
            for item in items:
                r = build_rule(item, f, folder.name)
                if r.id in seen:
                    raise RuleError(f"{f}: duplicate rule id '{r.id}' (also in {seen[r.id]})")
                seen[r.id] = str(f)
                rules.append(r)
    if not engines:
        raise RuleError(f"{root}: no engine folders with rules")
    return RuleSet(engines, rules)


@lru_cache(maxsize=4)
def _cached(root: str) -> RuleSet:
    return load_rules(Path(root))


def default_rules(root: str | Path | None = None) -> RuleSet:
    from oomdoctor.paths import rules_dir
    return _cached(str(root or rules_dir()))


def anchors_of(rules: Iterable[Rule], engines: Iterable[EngineSpec] = ()) -> set[bytes]:
    """What the scanner looks for: every pattern's anchor and the version lines. Engine detection strings are
    NOT anchors: detection counts them on the lines that pass anyway (a string on every line of a serving log,
    such as a process prefix, would otherwise send the whole log through Python)."""
    out = {p.anchor.encode() for r in rules for p in r.patterns}
    for e in engines:
        for vp in e.version_patterns:
            a = derive_anchor(vp.pattern)
            if a:
                out.add(a.encode())
    return out
