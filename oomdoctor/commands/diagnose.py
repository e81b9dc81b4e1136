"""`oomdoctor diagnose LOG` — classify, capture device state, write the incident card, propose levers."""
from __future__ import annotations

from pathlib import Path

import click

from oomdoctor import contract
from oomdoctor.card.build import build_card


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
@click.option("--scanner", type=click.Choice(["auto", "grep", "python"]), default="auto", show_default=True,
              help="How lines are pre-filtered: grep (fast) or pure Python.")
def command(log: Path, out: Path | None, no_card: bool, as_json: bool, engine: str | None, engine_version: str | None,
            metrics: str | None, snapshot: Path | None, plot_path: Path | None, model_dir: Path | None,
            gpu_memory: str | None, no_device: bool, rules_path: Path | None, scanner: str) -> int:
    """Classify the memory failure in LOG (plain or .gz) and write an incident card.

    Exit 0: a memory failure was classified; 3: no memory failure found; 2: bad input.
    """
    from oomdoctor.card import store as cardmod
    from oomdoctor.device import nvml as devmod
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.paths import default_incidents_dir
    from oomdoctor.diagnose.report import contract_json, print_json, render
    from oomdoctor.diagnose.rules import default_rules

    ruleset = default_rules(rules_path)
    metrics_text = read_metrics(metrics) if metrics else None
    diag = diagnose_file(log, ruleset, engine=engine, engine_version=engine_version, metrics_text=metrics_text, scanner=scanner)
    dev = {"status": "not_captured", "reason": "--no-device", "source": "nvml", "gpus": []} if no_device else devmod.capture()
    notes = []
    if dev.get("status") == "captured":
        notes.append("device state is NVML's reading now, on this machine — not necessarily the machine or moment of the log")
    card = build_card(log, diag, dev, notes)
    if snapshot is not None:
        from oomdoctor.analysis.snapshot import analyze_snapshot
        card["snapshot"] = analyze_snapshot(snapshot)
    if model_dir is not None:
        from oomdoctor.levers.modelcheck import check

        check(card, str(model_dir), gpu_memory)
    if plot_path is not None:
        from oomdoctor.errors import BadInput
        from oomdoctor.analysis.timeline import plot

        if not (diag.runtime or {}).get("timeline"):
            raise BadInput(f"--plot: {log} has no scheduler stats lines to draw")
        plot(diag.runtime, plot_path)
    path = None
    if not no_card:
        path = out if out is not None else default_incidents_dir() / f"{card['id']}.yaml"
        if path.exists() and path.is_dir():
            path = path / f"{card['id']}.yaml"
        cardmod.save(card, path)
        card = cardmod.load_dict(path)   # what was written (redacted) is what is shown
    if as_json:
        print_json(contract_json(card, str(path) if path else None))
    else:
        render(card, str(path) if path else None)
    return contract.EXIT_OK if diag.is_memory_failure else contract.EXIT_NO_MEMORY_FAILURE


def read_metrics(src: str) -> str:
    from oomdoctor.errors import BadInput

    if src.startswith(("http://", "https://")):
        import ipaddress
        import urllib.parse
        import urllib.request

        host = urllib.parse.urlparse(src).hostname or ""
        try:
            local = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = False
        if not local:
            raise BadInput(f"--metrics {src}: only a URL on this machine (localhost / 127.0.0.0/8 / ::1) is read")
        try:
            with urllib.request.urlopen(src, timeout=10) as r:
                return r.read(50 << 20).decode("utf-8", errors="replace")
        except OSError as e:
            raise BadInput(f"--metrics {src}: cannot be fetched ({e})")
    p = Path(src)
    try:
        data = p.read_bytes()[: 50 << 20]
    except OSError as e:
        raise BadInput(f"--metrics {src}: cannot be read ({e.strerror or e})")
    if b"\x00" in data[:4096]:
        raise BadInput(f"--metrics {src}: binary data, not a Prometheus text")
    return data.decode("utf-8", errors="replace")
