"""`oomdoctor rules list|test` — the rule catalogue and its own test cases."""
from __future__ import annotations

import json
from pathlib import Path

import click

from oomdoctor.paths import rules_dir


@click.group("rules")
def command() -> None:
    """List the rules, or run every rule's own test cases."""


@command.command("list")
@click.option("--rules", "rules_path", type=click.Path(path_type=Path), default=None, help="Rules folder (default: the bundled rules/).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(rules_path: Path | None, as_json: bool) -> None:
    """List every rule: id, engine, versions, role, class."""
    from oomdoctor.diagnose.rules import load_rules

    rs = load_rules(rules_path or rules_dir())
    rows = [{"id": r.id, "engine": r.engine, "versions": r.versions or "*", "role": r.role,
             "class": r.klass or ("by phase" if r.class_by_phase else ""), "reaches": r.reaches or "",
             "file": r.path, "tests": len(r.tests)} for r in rs.rules]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['id']:<44} {r['engine']:<9} {r['versions']:<14} {r['role']:<9} {r['class'] or r['reaches']}")


@command.command("test")
@click.option("--rules", "rules_path", type=click.Path(path_type=Path), default=None, help="Rules folder (default: the bundled rules/).")
@click.option("--only", default=None, help="Only rules whose id starts with this.")
@click.option("-v", "--verbose", is_flag=True, help="Print passing cases too.")
def test_cmd(rules_path: Path | None, only: str | None, verbose: bool) -> None:
    """Run every rule's test cases against its fixtures; exit 1 if any fails."""
    from oomdoctor.diagnose.rules import load_rules
    from oomdoctor.diagnose.ruletest import run_rule_tests

    root = rules_path or rules_dir()
    rs = load_rules(root)
    results = run_rule_tests(rs, root, only)
    failed = [r for r in results if not r.ok]
    for r in results:
        if not r.ok or verbose:
            click.echo(f"{'ok  ' if r.ok else 'FAIL'} {r.rule} [{r.fixture}]" + ("" if r.ok else ": " + "; ".join(r.problems)))
    click.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    raise SystemExit(1 if failed else 0)
