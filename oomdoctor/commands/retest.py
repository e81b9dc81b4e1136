"""`oomdoctor retest CARD` — apply ONE lever to the recorded workload, re-run it, record the attempt."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from oomdoctor.card.records import CardDict


def print_summary(card: CardDict) -> None:
    """One block per attempt on stderr, wrapped at spaces only: a value (a lever's new value, a time) is never cut."""
    import shutil

    from oomdoctor.diagnose.screen import wrap
    from oomdoctor.retest.run import summary_rows

    rows = summary_rows(card)
    if not rows:
        return
    width = min(max(shutil.get_terminal_size((80, 24)).columns, 60), 120)
    lines = wrap(f"Attempts on {card['id']} (original: {card['classification']['class']}):", width, indent="  ", first="")
    for r in rows:
        parts = [f"#{r['n']} {r['lever']} {json.dumps(r['change'])}", r["mode"] or "", r["outcome"] or "",
                 f"now {r['class']}" if r["class"] else "", f"{r['duration_s']:.0f} s" if r["duration_s"] else "",
                 f"{r['tok_s']} tok/s" if r["tok_s"] else "", f"on {r['target']}" if r["target"] else ""]
        lines += wrap(" · ".join(p for p in parts if p), width, indent="      ", first="  ")
    click.echo("\n".join(lines), err=True)


@click.command("retest")
@click.argument("card", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--lever", "lever_id", default=None, help="The lever to apply (an id from the card); 'none' reproduces the failure.")
@click.option("--next", "next_", is_flag=True, help="Apply the first lever not tried yet.")
@click.option("--dry-run", is_flag=True, help="Show the one change and the command; run nothing.")
@click.option("--engine", type=click.Choice(["auto", "real", "twin"]), default="auto", show_default=True,
              help="real: run the engine; twin: the memory model predicts (labelled as a prediction); auto: real when a GPU and vllm are present.")
@click.option("--emulate", "emulate", default=None,
              help="Leave this much memory free with a ballast: bytes, a size (24GiB) or a card name (rtx4090).")
@click.option("--emulate-free", "emulate_free", default=None, help="Same as --emulate, in bytes.")
@click.option("--no-emulate", is_flag=True, help="Do not reproduce the recorded free memory.")
@click.option("--gpu", "gpu_index", type=int, default=0, show_default=True, help="GPU index to run on.")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True, help="Seconds for the engine start and the requests.")
@click.option("--tolerance", type=float, default=0.10, show_default=True, help="Allowed performance change vs the baseline.")
@click.option("--json", "as_json", is_flag=True, help="Print the attempt as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress and no summary on stderr (errors still are): the exit code and, with --json, stdout "
                   "say the result.")
@click.option("--trust-card", is_flag=True,
              help="Run what the card says even where oomdoctor did not derive it: a 'command' launcher (the card's own "
                   "argv), code-loading engine arguments, its whole environment. Only for a card you wrote or checked.")
def command(card: Path, lever_id: str | None, next_: bool, dry_run: bool, engine: str, emulate: str | None,
            emulate_free: str | None, no_emulate: bool, gpu_index: int, timeout_s: float, tolerance: float, as_json: bool,
            trust_card: bool, quiet: bool = False) -> int:
    """Re-run the workload recorded in CARD with exactly one lever applied; the attempt is appended to CARD
    (atomically, under its lock), and its logs go to CARD's .runs/ folder.

    Exit 0: the failure is gone and performance passed; 1: it still fails or regressed; 2: bad input;
    3: inconclusive (the run failed for a reason that is not the lever's); 4: a twin prediction (no engine ran).
    """
    from oomdoctor.retest.run import retest

    rc, attempt, after = retest(card, lever_id=lever_id, next_=next_, dry_run=dry_run, engine=engine,
                                emulate=emulate or emulate_free, no_emulate=no_emulate, gpu_index=gpu_index,
                                timeout_s=timeout_s, tolerance=tolerance, trust_card=trust_card,
                                progress=(lambda _s: None) if quiet else None)
    if as_json:
        sys.stdout.write(json.dumps(attempt, indent=2, default=str) + "\n")
    elif dry_run and attempt.get("twin_not_run"):
        click.echo(f"dry run: attempt {attempt.get('n')} already ran this configuration on the real engine "
                   f"({attempt.get('outcome')}); the twin would predict nothing")
    elif dry_run and attempt.get("mode") == "twin":
        click.echo("dry run: the twin engine (the memory model) would predict this change; no engine would run")
    elif dry_run:
        click.echo("dry run: would run " + shlex.join(attempt["argv"]))
        if attempt.get("needs_trust_card"):
            click.echo("a real run needs --trust-card: " + "; ".join(attempt["needs_trust_card"]), err=True)
    if not dry_run and not quiet:
        print_summary(after)
        inc = attempt.get("inconclusive")
        if inc:
            click.echo(f"inconclusive: {inc['reason']} — fix: {inc['fix']} (the lever stays untried; the walk stops here)",
                       err=True)
        cc = attempt.get("chain_check")
        if cc:
            click.echo(f"chain: expected {cc['expected']}, observed {cc['observed']}: {cc['status']}", err=True)
        if attempt.get("outcome") != "pass" and attempt.get("next_lever"):
            nl = attempt["next_lever"]
            click.echo(f"next lever: {nl['id']} {json.dumps(nl['change'])} — {nl.get('cost', '')} "
                       f"(oomdoctor retest {card} --next)", err=True)
    return rc
