"""``oomdoctor snapshot FILE.pickle [--json] [--top N]`` — read a torch memory snapshot safely.

Exit codes: 0 the snapshot was read and reported; 2 bad input (not a pickle, a pickle that
tries to import anything, or not the shape of a ``torch.cuda.memory._dump_snapshot`` file).
"""
from __future__ import annotations

import json

import click


@click.command(name="snapshot")
@click.argument("file", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (byte fields end in _bytes).")
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True,
              help="How many allocation sites to list.")
def command(file: str, as_json: bool, top: int) -> int:
    """Read a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) without torch and without
    executing anything: allocated vs reserved, largest free block, fragmentation, the OOM event,
    the top allocation sites."""
    from oomdoctor.analysis.snapshot import analyze_snapshot, render_text

    report = analyze_snapshot(file, top=top)
    if as_json:
        click.echo(json.dumps(report, sort_keys=False))
    else:
        click.echo(render_text(report))
    return 0
