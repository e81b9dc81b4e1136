"""``oomdoctor gate [--base REF] [--config .oomdoctor.yaml] [--json]`` — the CI gate.

Every serving config that changed against the base revision needs a passing retest of its exact
effective config (a receipt or an incident-card attempt: outcome 'pass', engine mode 'real', one of
the declared target devices). Exit codes: 0 every changed config has one (or nothing changed),
1 at least one does not, 2 bad input (project file, a config that cannot be parsed, a base ref that
does not exist, not a git repository).
"""
from __future__ import annotations

import json

import click


@click.command(name="gate")
@click.option("--base", "base", default="HEAD", show_default=True, envvar="OOMDOCTOR_GATE_BASE",
              help="Compare against this revision (its merge-base with HEAD), plus the uncommitted changes. "
                   "In CI: origin/<target branch>.")
@click.option("--config", "project_file", default=None, metavar="FILE",
              help="The project file that lists the serving configs (default: the nearest .oomdoctor.yaml from here up to "
                   "the repository root).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object {passed, configs: [...]} on stdout.")
def command(base: str, project_file: str | None, as_json: bool) -> int:
    """CI gate: every changed serving config needs a passing retest for its exact fingerprint."""
    from oomdoctor.gate import render_text, run_gate

    res = run_gate(base=base, project_file=project_file)
    if as_json:
        click.echo(json.dumps(res.to_dict(), sort_keys=False))
    else:
        click.echo(render_text(res))
    return res.exit_code
