"""`oomdoctor compare proven.log failing.log` — line up two start-up ledgers row by row and explain the difference."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command("compare")
@click.argument("proven", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
@click.argument("failing", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
@click.option("--engine", default=None, help="Force the engine (default: detected).")
@click.option("--proven-version", default=None, help="Match the proven log's rules for this engine version.")
@click.option("--failing-version", default=None, help="Match the failing log's rules for this engine version.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON on stdout.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Draw both ledgers as stacked bars into this PNG (needs matplotlib: the 'plot' extra).")
def command(proven: Path, failing: Path, engine: str | None, proven_version: str | None, failing_version: str | None,
            as_json: bool, plot_path: Path | None) -> int:
    """Line up the start-ups in PROVEN and FAILING (two logs of the same model; one may be `-`, stdin): settings and the memory ledger,
    what changed, by how much, and which change the memory arithmetic says explains the difference.

    Exit 0: compared (with warnings if the engine versions differ); 2: bad input.
    """
    from oomdoctor.analysis.compare import compare, plot, print_tables
    from oomdoctor.diagnose.read import is_stdin, log_source
    from oomdoctor.errors import BadInput, MissingExtra

    if is_stdin(proven) and is_stdin(failing):
        raise BadInput("only one of PROVEN and FAILING can be read from stdin (-)")
    with log_source(proven) as (p_read, p_shown), log_source(failing) as (f_read, f_shown):
        res = compare(p_read, f_read, engine=engine, proven_version=proven_version, failing_version=failing_version)
    for side, shown in (("proven", p_shown), ("failing", f_shown)):     # the name the user gave, not a spooled copy
        if isinstance(res.get(side), dict) and "path" in res[side]:
            res[side]["path"] = shown
    if plot_path is not None:
        try:
            res["plot"] = str(plot(res, plot_path))
        except MissingExtra as e:       # the comparison is the result; the plot is an extra
            click.echo(f"oomdoctor: warning: {e}; the comparison is complete without the plot", err=True)
    if as_json:
        sys.stdout.write(json.dumps(res, indent=2, default=str) + "\n")
    else:
        print_tables(res)
        if res.get("plot"):
            click.echo(f"plot: {res['plot']}")
    return 0
