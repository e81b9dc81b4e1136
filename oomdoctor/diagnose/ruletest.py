"""Every rule carries its own test cases (as semgrep and Sigma rules do); this runs them.

A case names a fixture under fixtures/logs/ and what must hold when that whole log is diagnosed:
``expect: match`` (the rule fires; optional ``line`` of its first match and ``numbers`` it must
extract there) or ``expect: no_match``; optional ``class`` for the class of the whole diagnosis.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oomdoctor.diagnose.classify import Diagnosis, diagnose_file
from oomdoctor.diagnose.rules import Rule, RuleSet

NUMBER_TOLERANCE = 0.0   # numbers are compared exactly (they are ints computed from the printed text)


@dataclass
class CaseResult:
    rule: str
    fixture: str
    ok: bool
    problems: list[str]


def fixtures_root(rules_root: Path | None = None) -> Path:
    """Fixtures of a plain rules root sit in ``fixtures/logs`` beside it; the bundled rules use paths.fixtures_dir()."""
    from oomdoctor.paths import ENGINES_DIR, fixtures_dir
    if rules_root is not None and Path(rules_root).resolve() != ENGINES_DIR.resolve():
        beside = Path(rules_root).resolve().parent / "fixtures" / "logs"
        if beside.is_dir():
            return beside
    return fixtures_dir()


def check_case(rule: Rule, case: dict, d: Diagnosis) -> list[str]:
    problems: list[str] = []
    expect = case.get("expect", "match")
    hit = d.hits.get(rule.id)
    if expect == "match":
        if hit is None:
            return [f"expected {rule.id} to match, it did not"]
        if "line" in case and hit["line"] != case["line"]:
            problems.append(f"first match at line {hit['line']}, expected {case['line']}")
        for k, v in (case.get("numbers") or {}).items():
            got = hit["numbers"].get(k)
            if got != v:
                problems.append(f"number {k}: got {got!r}, expected {v!r}")
    elif expect == "no_match":
        if hit is not None:
            problems.append(f"expected no match, matched at line {hit['line']}")
    else:
        problems.append(f"unknown expect '{expect}' (match | no_match)")
    if "class" in case and d.klass != case["class"]:
        problems.append(f"diagnosis class {d.klass}, expected {case['class']}")
    if "phase" in case and d.phase != case["phase"]:
        problems.append(f"diagnosis phase {d.phase}, expected {case['phase']}")
    return problems


def run_rule_tests(ruleset: RuleSet, rules_root: Path, only: str | None = None) -> list[CaseResult]:
    root = fixtures_root(rules_root)
    cache: dict[str, Diagnosis] = {}
    out: list[CaseResult] = []
    for rule in ruleset.rules:
        if only and not rule.id.startswith(only):
            continue
        if not rule.tests:
            out.append(CaseResult(rule.id, "-", False, ["the rule has no test cases"]))
            continue
        if not any(t.get("expect", "match") == "match" for t in rule.tests):
            # a rule with only negative cases must say why no real sample exists
            pass
        for case in rule.tests:
            fx = str(case["fixture"])
            path = root / fx
            if not path.exists():
                out.append(CaseResult(rule.id, fx, False, [f"fixture not found: {path}"]))
                continue
            key = f"{fx}|{case.get('engine_version', '')}"
            if key not in cache:
                cache[key] = diagnose_file(path, ruleset, engine_version=case.get("engine_version"))
            problems = check_case(rule, case, cache[key])
            out.append(CaseResult(rule.id, fx, not problems, problems))
    return out
