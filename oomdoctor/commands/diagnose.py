"""`oomdoctor diagnose LOG` — classify, capture device state, write the incident card, propose levers."""
from __future__ import annotations

from pathlib import Path

import click

from oomdoctor import contract


@click.command("diagnose")
@click.argument("log", type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Where to write the incident card (default: incidents/<id>.yaml).")
@click.option("--no-card", is_flag=True, help="Do not write a card.")
@click.option("--json", "as_json", is_flag=True, help="Print the contract's JSON object on stdout.")
@click.option("--engine", default=None, help="Force the engine (vllm, sglang, llamacpp); default: detected.")
@click.option("--engine-version", default=None, help="Match rules for this engine version instead of the detected one.")
@click.option("--metrics", "metrics", default=None,
              help="A saved Prometheus /metrics text (file), or a URL on this machine, for preemption counters.")
@click.option("--snapshot", "snapshot", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="A PyTorch memory snapshot (.pickle) to add as evidence.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Draw the KV-usage / waiting / preemption timeline of a serving log as a PNG (needs matplotlib).")
@click.option("--model", "model_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="The model's directory (config.json, safetensors): the memory model checks the recorded config and "
                   "predicts each lever.")
@click.option("--gpu-memory", default=None, help="With --model: the GPU's total memory when the log does not state it.")
@click.option("--no-device", is_flag=True, help="Do not query NVML (device state is recorded as not captured).")
@click.option("--rules", "rules_path", type=click.Path(path_type=Path), default=None, help="Rules folder.")
@click.option("-v", "--verbose", is_flag=True, help="After the first screen: all evidence, numbers, levers, device, notes.")
@click.option("--scanner", type=click.Choice(["auto", "grep", "python"]), default="auto", show_default=True,
              help="How lines are pre-filtered: grep (fast) or pure Python.")
@click.option("--quiet", "-q", is_flag=True, help="No progress line on stderr (there is none under --json either).")
def command(log: Path, out: Path | None, no_card: bool, as_json: bool, engine: str | None, engine_version: str | None,
            metrics: str | None, snapshot: Path | None, plot_path: Path | None, model_dir: Path | None,
            gpu_memory: str | None, no_device: bool, rules_path: Path | None, verbose: bool, scanner: str,
            quiet: bool) -> int:
    """Classify the memory failure in LOG (plain, .gz or .zst; `-` or /dev/stdin: read stdin) and write an incident card.

    Exit 0: a memory failure was classified; 3: no memory failure found; 2: bad input.
    """
    from oomdoctor.card.incident import diagnose_log
    from oomdoctor.diagnose.read import log_source
    from oomdoctor.diagnose.report import contract_json, print_json, render

    with log_source(log) as (readable, shown):
        card, path, diag = diagnose_log(readable, out=out, no_card=no_card, engine=engine, engine_version=engine_version,
                                        metrics=metrics, snapshot=snapshot, plot_path=plot_path, model_dir=model_dir,
                                        gpu_memory=gpu_memory, no_device=no_device, rules_path=rules_path,
                                        scanner=scanner, shown=None if readable == log else shown,
                                        warn=lambda m: click.echo(f"oomdoctor: warning: {m}", err=True),
                                        progress=not (quiet or as_json))
    if as_json:
        print_json(contract_json(dict(card), str(path) if path else None))
    else:
        render(dict(card), str(path) if path else None, verbose=verbose)
    return contract.EXIT_OK if diag.is_memory_failure else contract.EXIT_NO_MEMORY_FAILURE
