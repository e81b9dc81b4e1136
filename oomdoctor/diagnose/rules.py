"""Stage 3 — rules: load and check the YAML rule files of each ``engines/<engine>/rules/`` folder.

A rule is data (see ``docs/rules.md``): an id, the engine and its versions, a role, the
class/phase it stands for, regex patterns with named groups, the numbers those groups
give (with units), the levers that apply, and test cases beside it. A malformed rule
fails loading with its file name and the reason. The records themselves are in
:mod:`oomdoctor.diagnose.rulespec` (re-exported here).
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from oomdoctor import contract, safeyaml
from oomdoctor.errors import RuleError
from oomdoctor.diagnose.regexcheck import catastrophic
from oomdoctor.paths import ENGINES_DIR
from oomdoctor.diagnose.rulespec import (MATCH_CHARS, EngineSpec, NumberSpec, Pattern, Rule, RuleSet, _after,
                                         _check_spec, _confidence, _likely, _likely_when, anchors_of, derive_anchor,
                                         parse_version, version_in)
from oomdoctor.units import UNIT_BYTES

ROLES = ("root", "cascade", "milestone", "frame", "signal", "info", "serving", "ignored", "stopped")
NUMBER_UNITS = set(UNIT_BYTES) | {"int", "tokens", "count", "float", "ratio", "percent", "seconds", "str", "size"}
RULE_KEYS = {"id", "engine", "versions", "title", "role", "class", "class_by_phase", "phase", "reaches",
             "priority", "fallback", "message", "patterns", "numbers", "levers", "tests", "references", "status",
             "likely_phase", "likely_when", "frames", "root_in", "confidence", "after"}
__all__ = ["EngineSpec", "NumberSpec", "Pattern", "Rule", "RuleSet", "anchors_of", "build_engine", "build_rule",
           "default_rules", "derive_anchor", "load_rules", "parse_version", "version_in"]
ENGINE_KEYS = {"engine", "name", "covers", "detect", "detect_lines", "version_patterns", "phases", "preemption_counters",
               "embeds", "notes"}
_FUNC_RE = re.compile(r"[A-Za-z_<][\w<>]*")


# ----------------------------------------------------------------------------- loading
def _req(d: dict, key: str, where: str, typ: type | tuple = str) -> Any:
    if key not in d:
        raise RuleError(f"{where}: missing required field '{key}'")
    if not isinstance(d[key], typ):
        raise RuleError(f"{where}: field '{key}' must be {getattr(typ, '__name__', typ)}")
    return d[key]


_BUNDLED = str(ENGINES_DIR) + "/"


def _compile(regex: Any, where: str) -> re.Pattern[str]:
    if not isinstance(regex, str) or not regex:
        raise RuleError(f"{where}: 'regex' must be a non-empty string")
    try:
        rx = re.compile(regex)
    except (re.error, RecursionError, OverflowError) as e:
        raise RuleError(f"{where}: invalid regex ({e})")
    # the bundled rules are checked by the test suite (tests/diagnose/test_rule_regex_bounds.py); rules from
    # anywhere else (OOMDOCTOR_RULES, --rules) are checked here, at load (it costs ~0.4 s for the whole catalogue)
    why = None if _bundled(where) else catastrophic(regex)
    if why:
        raise RuleError(f"{where}: the regex can backtrack catastrophically: {why} (write the repeat possessive, "
                        f"e.g. \\d++, or atomic, (?>...), or bound it, e.g. .{{0,512}}?)")
    return rx


#: load every rule's regex at load time, bundled or not (the test suite sets it, to check the bundled catalogue)
EAGER = False
_GROUP_RE = re.compile(r"\(\?P<([A-Za-z_]\w*)>")


def _bundled(where: str) -> bool:
    return where.startswith(_BUNDLED)


def _source(regex: Any, where: str) -> str:
    """A rule pattern's regex: compiled (and checked) now when the rule comes from outside the package; the bundled
    catalogue's are compiled when first used (Pattern.regex), after the test suite compiled and checked them all."""
    if EAGER or not _bundled(where) or not isinstance(regex, str) or not regex:
        _compile(regex, where)
    return regex


def _group_names(p: Pattern, where: str) -> set[str]:
    """The named groups of a pattern; of a bundled one not compiled yet, read from its source (the suite loads the
    catalogue with EAGER set: there they come from the compiled regex)."""
    if EAGER or not _bundled(where):
        return set(p.regex.groupindex)
    return set(_GROUP_RE.findall(p.source))


def _class_and_phase(d: dict, role: str, where: str) -> tuple[str | None, dict, str | None]:
    """The rule's class, class_by_phase and phase, checked against the contract."""
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
    return klass, cbp, phase


def _patterns(pats: list, where: str) -> list[Pattern]:
    if not pats:
        raise RuleError(f"{where}: 'patterns' is empty")
    patterns = []
    for i, p in enumerate(pats):
        pw = f"{where} patterns[{i}]"
        if isinstance(p, str):
            p = {"regex": p}
        if not isinstance(p, dict):
            raise RuleError(f"{pw}: must be a mapping with 'regex'")
        rx = _source(p.get("regex"), pw)
        anchor = p.get("anchor") or derive_anchor(rx)
        if not anchor or not isinstance(anchor, str):
            raise RuleError(f"{pw}: no literal of 4+ characters in the regex; give an 'anchor' the matched lines contain")
        if not anchor.isascii():
            raise RuleError(f"{pw}: the anchor must be ASCII")
        window = p.get("window", "head")
        if window not in ("head", "tail"):
            raise RuleError(f"{pw}: window must be 'head' (the line's first {MATCH_CHARS} characters) or 'tail'")
        patterns.append(Pattern(rx, anchor, tail=window == "tail"))
    return patterns


def frame_patterns(entries: Any, where: str) -> list[dict]:
    """``frames: [profile_run, torch/cuda/graphs.py:capture_end]`` → the patterns of those frames as CPython
    (``File "p", line N, in f``), faulthandler/py-spy (``line N in f``), IPython (``File p:N, in C.f(``) and a
    paste hard-wrapped inside the path print them. Every regex is linear: one bounded class run before a literal."""
    if not isinstance(entries, list) or not entries or not all(isinstance(e, str) and e for e in entries):
        raise RuleError(f"{where}: 'frames' must be a non-empty list of 'function' or 'path:function'")
    bare: list[str] = []
    by_path: list[tuple[str, str]] = []
    for e in entries:
        path, _, func = e.rpartition(":")
        if not _FUNC_RE.fullmatch(func):
            raise RuleError(f"{where}: frames: '{e}' does not end in a function name")
        if path:
            by_path.append((path, func))
        else:
            bare.append(func)
    out: list[dict] = []
    if bare:
        names = "|".join(re.escape(f) for f in bare)
        out.append({"regex": f'File "[^"]*", line \\d+,? in (?:{names})\\s*$', "anchor": '", line '})
        out.append({"regex": f"File [^\\s:]+:\\d+, in (?:[\\w<>]+\\.){{0,3}}(?:{names})\\(", "anchor": ", in "})
        # a paste hard-wrapped at 80 columns: the frame's second half starts the line ('ssing/engine.py", line N, in f')
        out.append({"regex": f'^[^\\s"]*\\.py", line \\d+,? in (?:{names})\\s*$', "anchor": '", line '})
        # a frame's own source line names the call it made, which places a traceback cut below it ('... in
        # compile_or_warm_up_model' then '    warmup_kernels(self.model_runner, ...)'): an indented statement that
        # calls the function (alone, assigned, returned or awaited). In a whole traceback the callee's frame follows
        for f in bare:
            out.append({"regex": f"^\\s{{4,}}(?:[\\w.,:\\[\\] ]{{1,80}}= )?(?:return |await |yield )?(?:\\w+\\.){{0,4}}{re.escape(f)}\\(",
                        "anchor": f"{f}("})
    for path, func in by_path:
        p, f = re.escape(path), re.escape(func)
        out.append({"regex": f'File "[^"]*{p}", line \\d+,? in {f}\\s*$', "anchor": path if len(path) >= 4 else '", line '})
        out.append({"regex": f"File [^\\s:]*{p}:\\d+, in (?:[\\w<>]+\\.){{0,3}}{f}\\(", "anchor": path if len(path) >= 4 else ", in "})
    return out


def _numbers(specs: dict, patterns: list[Pattern], where: str) -> list[NumberSpec]:
    numbers = []
    groups: set[str] = set().union(*(_group_names(p, where) for p in patterns))
    for name, spec in specs.items():
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
    return numbers


def _levers_tests_priority(d: dict, where: str) -> tuple[list, list, int]:
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
    return levers, tests, prio


def _only_known(d: dict, keys: set[str], where: str) -> None:
    unknown = set(d) - keys
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")


def build_rule(d: Any, path: Path, engine_dir: str) -> Rule:
    where = f"{path}"
    if not isinstance(d, dict):
        raise RuleError(f"{where}: a rule must be a mapping")
    rid = _req(d, "id", where)
    where = f"{path} [{rid}]"
    _only_known(d, RULE_KEYS, where)
    engine = _req(d, "engine", where)
    if engine != engine_dir:
        raise RuleError(f"{where}: engine '{engine}' does not match its folder rules/{engine_dir}/")
    role = d.get("role", "root")
    if role not in ROLES:
        raise RuleError(f"{where}: role '{role}' is not one of {', '.join(ROLES)}")
    _check_spec(d.get("versions"), where)
    klass, cbp, phase = _class_and_phase(d, role, where)
    reaches = d.get("reaches")
    if role == "serving":
        reaches = reaches or "runtime"
    if role in ("milestone", "frame", "serving"):
        if reaches not in contract.PHASES:
            raise RuleError(f"{where}: a {role} rule needs 'reaches: <phase>' (one of {', '.join(contract.PHASES)})")
    elif reaches is not None and (role != "cascade" or reaches not in contract.PHASES):
        raise RuleError(f"{where}: 'reaches' is for milestone, frame, serving and cascade rules (one of "
                        f"{', '.join(contract.PHASES)})")
    pats = list(d.get("patterns") or [])
    if "frames" in d:
        if role != "frame":
            raise RuleError(f"{where}: 'frames' is for role: frame")
        pats += frame_patterns(d["frames"], where)
    elif "patterns" not in d:
        _req(d, "patterns", where, list)
    patterns = _patterns(pats, where)
    numbers = _numbers(d.get("numbers") or {}, patterns, where)
    levers, tests, prio = _levers_tests_priority(d, where)
    return Rule(
        id=rid, engine=engine, role=role, patterns=patterns, path=str(path), versions=d.get("versions"),
        title=d.get("title", ""), klass=klass, class_by_phase=dict(cbp), phase=phase, reaches=reaches,
        priority=prio, fallback=bool(d.get("fallback", False)), message=str(d.get("message", "")).strip(),
        numbers=numbers, levers=list(levers), tests=tests, likely_phase=_likely(d, cbp, where),
        likely_when=_likely_when(d, cbp, numbers, where),
        root_in=str(d.get("root_in") or "").strip(), confidence=_confidence(d, where), after=_after(d, role, where),
    )


def _strings(d: dict, key: str, where: str, what: str, ok: Any = None) -> list[str]:
    """An engine.yaml field that is a list of non-empty strings (each passing ``ok``, when given)."""
    xs = d.get(key) or []
    if not isinstance(xs, list) or not all(isinstance(x, str) and x and (ok is None or ok(x)) for x in xs):
        raise RuleError(f"{where}: '{key}' must be {what}")
    return list(xs)


def build_engine(d: Any, path: Path, engine_dir: str) -> EngineSpec:
    where = str(path)
    if not isinstance(d, dict):
        raise RuleError(f"{where}: engine.yaml must be a mapping")
    _only_known(d, ENGINE_KEYS, where)
    engine = _req(d, "engine", where)
    if engine != engine_dir:
        raise RuleError(f"{where}: engine '{engine}' does not match its folder")
    _check_spec(d.get("covers"), where)
    detect = _strings(d, "detect", where, "a list of literal strings")
    # line shapes of the engine's own output that no rule reads (llama_print_timings, [TensorRT-LLM][INFO]): detection
    # strings that are scan anchors too, so that a paste of only such lines is still told apart
    lines = _strings(d, "detect_lines", where, "a list of ASCII literal strings of 4+ characters",
                     lambda x: len(x) >= 4 and x.isascii())
    vps = [_compile(p, f"{where} version_patterns[{i}]") for i, p in enumerate(d.get("version_patterns") or [])]
    for i, p in enumerate(vps):
        if "version" not in p.groupindex:
            raise RuleError(f"{where} version_patterns[{i}]: needs a named group 'version'")
    phases = d.get("phases") or list(contract.PHASES)
    for ph in phases:
        if ph not in contract.PHASES:
            raise RuleError(f"{where}: phase '{ph}' is not a contract phase")
    counters = _strings(d, "preemption_counters", where, "a list of Prometheus metric names")
    embeds = _strings(d, "embeds", where, "a list of other engines' names", lambda x: x != engine)
    return EngineSpec(engine, d.get("name", engine), d.get("covers"), detect + [x for x in lines if x not in detect], vps,
                      phases, str(path), list(counters), embeds=list(embeds), detect_lines=list(lines))


def _read(path: Path) -> bytes:
    from oomdoctor.diagnose.read import read_capped
    from oomdoctor.errors import BadInput

    try:
        return read_capped(path, safeyaml.MAX_BYTES, "rule file")
    except BadInput as e:
        raise RuleError(str(e))


def _parse(path: Path, data: bytes) -> Any:
    try:
        return safeyaml.load(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RuleError(f"{path}: cannot be read ({e})")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise RuleError(f"{path}: malformed YAML{where} ({getattr(e, 'problem', None) or e})")


def _layout(root: Path) -> list[tuple[str, Path, list[Path]]]:
    """(engine, its engine.yaml, its other rule files) for every engine folder of a rules root."""
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        # the package keeps an engine's rules in engines/<engine>/rules/; a plain rules root has <engine>/ itself
        edir = folder / "rules" if (folder / "rules").is_dir() else folder
        espec = edir / "engine.yaml"
        if not espec.exists():
            raise RuleError(f"{edir}: missing engine.yaml (engine name, versions covered, detection strings)")
        out.append((folder.name, espec, [f for f in sorted(edir.rglob("*.yaml")) if f.name != "engine.yaml"]))
    return out


GENERIC = "_generic"        # rules of no engine: what a program every engine runs under prints (a container runtime)


def _generic_files(root: Path) -> list[Path]:
    """The rule files of ``<root>/_generic/`` (``_generic/rules/`` in the package layout): rules that name no engine."""
    gdir = root / GENERIC / "rules" if (root / GENERIC / "rules").is_dir() else root / GENERIC
    return sorted(gdir.rglob("*.yaml")) if gdir.is_dir() else []


def _for_engine(item: Any, engine: str, path: Path) -> dict:
    """A generic rule (``engine: any``, an id without an engine) as one engine's, ``<engine>.<id>``: every engine gets
    it, so a log of any engine is read by it and a paste that names no engine finds none (``engine_of_hits``: a tie)."""
    if not isinstance(item, dict):
        raise RuleError(f"{path}: a rule must be a mapping")
    rid = _req(item, "id", f"{path}")
    if item.get("engine") != "any":
        raise RuleError(f"{path} [{rid}]: a rule under {GENERIC}/ names no engine: 'engine: any'")
    return {**item, "id": f"{engine}.{rid}", "engine": engine}


def _items(data: Any, f: Path) -> list:
    items = data.get("rules") if isinstance(data, dict) and "rules" in data and "id" not in data else [data]
    if not isinstance(items, list):
        raise RuleError(f"{f}: 'rules' must be a list")
    return items


def load_rules(root: Path) -> RuleSet:
    from oomdoctor.diagnose.rulecache import RuleDocs

    root = Path(root)
    if not root.is_dir():
        raise RuleError(f"{root}: rules folder not found (set OOMDOCTOR_RULES)")
    layout, generic = _layout(root), _generic_files(root)
    docs = RuleDocs(root, [f for _, espec, files in layout for f in (espec, *files)] + generic, _read, _parse,
                    cache=root.resolve() == ENGINES_DIR.resolve())     # the bundled catalogue only
    engines = {name: build_engine(docs.load(espec), espec, name) for name, espec, _ in layout}
    if not engines:
        raise RuleError(f"{root}: no engine folders with rules")
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    generic_ids: dict[str, str] = {}
    for f, name in [(f, name) for name, _, files in layout for f in files] + [(f, None) for f in generic]:
        for item in _items(docs.load(f), f):
            for r in ([build_rule(item, f, name)] if name else
                      [build_rule(_for_engine(item, e, f), f, e) for e in engines]):
                if r.id in seen:
                    raise RuleError(f"{f}: duplicate rule id '{r.id}' (also in {seen[r.id]})")
                seen[r.id] = str(f)
                rules.append(r)
                if not name:
                    generic_ids[r.id] = item["id"]
    docs.save()
    for r in rules:
        missing = [x for x in r.after if x not in seen]
        if missing:
            raise RuleError(f"{r.path} [{r.id}]: 'after' names no rule: {', '.join(missing)}")
    return RuleSet(engines, rules, generic_ids)


@lru_cache(maxsize=4)
def _cached(root: str) -> RuleSet:
    return load_rules(Path(root))


def default_rules(root: str | Path | None = None) -> RuleSet:
    from oomdoctor.paths import rules_dir
    return _cached(str(root or rules_dir()))
