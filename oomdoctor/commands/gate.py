"""``oomdoctor gate [--base REF] [--config .oomdoctor.yaml] [--format text|json|github|sarif]`` — the CI gate.

Every serving config that changed against the base revision needs a passing retest of its exact
effective config (a receipt or an incident-card attempt: outcome 'pass', engine mode 'real', one of
the declared target devices). Exit codes: 0 every changed config has one (or nothing changed),
1 at least one does not, 2 bad input (project file, a config that cannot be parsed, a base ref that
does not exist, not a git repository). The formats change what is printed, never the exit code.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from oomdoctor.gate.verdict import GateResult


@click.command(name="gate")
@click.option("--base", "base", default="HEAD", show_default=True, envvar="OOMDOCTOR_GATE_BASE",
              help="Compare against this revision (its merge-base with HEAD), plus the uncommitted changes. "
                   "In CI: origin/<target branch>.")
@click.option("--config", "project_file", default=None, metavar="FILE",
              help="The project file that lists the serving configs (default: the nearest .oomdoctor.yaml from here up to "
                   "the repository root).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object {passed, configs: [...]} (= --format json).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "github", "sarif"]), default=None,
              help="github: workflow annotations (::error file=...,line=...::) on stdout and a Markdown table appended to "
                   "$GITHUB_STEP_SUMMARY when set; sarif: a SARIF 2.1.0 log for code scanning (gate ... > gate.sarif).")
def command(base: str, project_file: str | None, as_json: bool, fmt: str | None) -> int:
    """CI gate: every changed serving config needs a passing retest for its exact fingerprint."""
    from oomdoctor.gate import render_text, run_gate

    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} ask for two formats: give one")
    fmt = "json" if as_json else (fmt or "text")
    res = run_gate(base=base, project_file=project_file)
    if fmt == "json":
        click.echo(json.dumps(res.to_dict(), sort_keys=False))
    elif fmt == "text":
        click.echo(render_text(res))
    else:
        _ci_format(res, fmt)
    return res.exit_code


def _ci_format(res: GateResult, fmt: str) -> None:
    import os
    from pathlib import Path

    from oomdoctor.errors import BadInput
    from oomdoctor.gate import formats, render_text
    from oomdoctor.gate.git import Git

    root = Git(Path.cwd()).root
    if fmt == "sarif":
        click.echo(json.dumps(formats.sarif(res, root, res.exit_code), indent=2))
        return
    for line in formats.github_annotations(res, root):
        click.echo(line)
    click.echo(render_text(res).splitlines()[-1])              # the verdict line, as plain log text
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(formats.job_summary(res) + "\n")
        except OSError as e:
            raise BadInput(f"GITHUB_STEP_SUMMARY={summary}: cannot be written ({e.strerror or e})")
