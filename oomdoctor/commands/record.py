"""`oomdoctor record -- vllm serve MODEL ...` — run a launch, capture device state and its log, diagnose it.

The workload (argv as a list, explicit flags, env) is recorded in the card so that `oomdoctor retest`
re-runs exactly that launch.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from oomdoctor import contract


@click.command("record", context_settings={"ignore_unknown_options": True})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=False)
@click.option("--serving-config", "serving_config", type=click.Path(path_type=Path), default=None,
              help="Run a serving config declared in the project file (instead of ARGV) and write a gate receipt.")
@click.option("--profile", default=None, help="The profile of a serving-profiles file.")
@click.option("--config", "project_file", type=click.Path(path_type=Path), default=None,
              help="The project file (default: the nearest .oomdoctor.yaml).")
@click.option("--target", default=None,
              help="The device the receipt is for: this GPU (e.g. nvidia-h200) or a named card to emulate (rtx4090).")
@click.option("--receipt", "receipt_path", type=click.Path(path_type=Path), default=None,
              help="Receipt file or folder (default: the project's first receipts folder).")
@click.option("--sign", "sign_key", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Sign the receipt with this SSH private key (ssh-keygen -Y sign; for a project file with signers:).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Card path (default: incidents/<id>.yaml).")
@click.option("--emulate", default=None, help="Leave this much memory free with a ballast (bytes, 24GiB, or a card name).")
@click.option("--gpu", "gpu_index", type=int, default=0, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True)
@click.option("--prompt-tokens", type=int, default=8, show_default=True)
@click.option("--max-tokens", type=int, default=16, show_default=True)
@click.option("--concurrency", type=int, default=1, show_default=True)
@click.option("--count", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def command(argv: tuple[str, ...], serving_config: Path | None, profile: str | None, project_file: Path | None,
            target: str | None, receipt_path: Path | None, sign_key: Path | None, out: Path | None,
            emulate: str | None, gpu_index: int, timeout_s: float, prompt_tokens: int, max_tokens: int, concurrency: int, count: int, as_json: bool) -> int:
    """Run ARGV (after --), tee its log, diagnose it, write a card whose workload re-runs exactly that launch.

    With --serving-config, run that declared config on --target and append the attempt to a receipt
    that `oomdoctor gate` accepts when the start passed."""
    from oomdoctor.diagnose.report import contract_json, print_json, render
    from oomdoctor.retest.record import record, resolve_launch

    argv_l, sc, emulate = resolve_launch(argv, serving_config, profile, project_file, target, emulate, gpu_index)
    requests = {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "concurrency": concurrency, "count": count}
    card, path, diag = record(argv_l, sc, requests, emulate, target, out, receipt_path, gpu_index, timeout_s,
                              lambda s: click.echo(s, err=True), sign_key=sign_key)
    if as_json:
        print_json(contract_json(dict(card), str(path)))
    else:
        render(dict(card), str(path), file=sys.stderr)
    return contract.EXIT_OK if diag.is_memory_failure else contract.EXIT_NO_MEMORY_FAILURE
