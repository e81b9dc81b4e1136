"""`oomdoctor diagnose`'s core: a log (and optional metrics, snapshot, model) becomes one incident card on disk."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from oomdoctor.card.records import CardDict

NO_DEVICE = {"status": "not_captured", "reason": "--no-device", "source": "nvml", "gpus": []}


def _extras(card: CardDict, diag: Any, log: Path, snapshot: Path | None, model_dir: Path | None,
            gpu_memory: str | None, plot_path: Path | None, warn: Callable[[str], None] | None = None) -> None:
    """The optional sections: a memory snapshot, the memory model's check, the timeline plot (without matplotlib:
    ``warn`` is told and the diagnosis goes on, when given)."""
    if snapshot is not None:
        from oomdoctor.analysis.snapshot import analyze_snapshot
        card["snapshot"] = analyze_snapshot(snapshot)
    if model_dir is not None:
        from oomdoctor.levers.modelcheck import check

        check(card, str(model_dir), gpu_memory)
    if plot_path is not None:
        from oomdoctor.errors import BadInput, MissingExtra
        from oomdoctor.analysis.timeline import plot

        if not (diag.runtime or {}).get("timeline"):
            raise BadInput(f"--plot: {log} has no scheduler stats lines to draw")
        try:
            plot(diag.runtime, plot_path)
        except MissingExtra as e:
            if warn is None:
                raise
            warn(f"{e}; the diagnosis is complete without the plot")


def card_path(card: CardDict, out: Path | None) -> Path:
    from oomdoctor.paths import default_incidents_dir

    path = out if out is not None else default_incidents_dir() / f"{card['id']}.yaml"
    if path.exists() and path.is_dir():
        path = path / f"{card['id']}.yaml"
    return path


def diagnose_log(log: Path, out: Path | None = None, no_card: bool = False, engine: str | None = None,
                 engine_version: str | None = None, metrics: str | None = None, snapshot: Path | None = None,
                 plot_path: Path | None = None, model_dir: Path | None = None, gpu_memory: str | None = None,
                 no_device: bool = False, rules_path: Path | None = None,
                 scanner: str = "auto", shown: str | None = None,
                 warn: Callable[[str], None] | None = None, progress: bool = False) -> tuple[CardDict, Path | None, Any]:
    """Classify LOG, build its card and (unless ``no_card``) write it; (the card as written, its path, the diagnosis).

    ``shown``: the name the card records for the log when LOG is a copy (stdin spooled to a file). ``progress``: bytes
    read and lines/s on stderr while a log takes more than a second."""
    from oomdoctor.card import store as cardmod
    from oomdoctor.card.build import build_card
    from oomdoctor.device import nvml as devmod
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.rules import default_rules

    ruleset = default_rules(rules_path)
    metrics_text = read_metrics(metrics) if metrics else None
    meter = None
    if progress:
        from oomdoctor.diagnose.progress import Progress
        meter = Progress(log.stat().st_size if log.is_file() else None)
    diag = diagnose_file(log, ruleset, engine=engine, engine_version=engine_version, metrics_text=metrics_text,
                         scanner=scanner, progress=meter)
    dev = dict(NO_DEVICE) if no_device else devmod.capture()
    notes = []
    if dev.get("status") == "captured":
        notes.append("device state is NVML's reading now, on this machine — not necessarily the machine or moment of the log")
    card: CardDict = build_card(log, diag, dev, notes)
    if shown is not None:
        card["source"]["path"] = shown
    _extras(card, diag, Path(shown) if shown is not None else log, snapshot, model_dir, gpu_memory, plot_path, warn)
    if no_card:
        from oomdoctor.redact import redact_obj
        return redact_obj(card), None, diag      # shown, not written: redacted all the same
    path = card_path(card, out)
    cardmod.save(card, path)
    return cardmod.load_dict(path), path, diag    # what was written (redacted) is what is shown


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
    from oomdoctor.diagnose.read import open_regular

    try:
        with open_regular(src, "Prometheus metrics file") as f:
            data = f.read(50 << 20)                   # the first 50 MiB: far more than any /metrics page
    except BadInput as e:                             # missing, a FIFO, a device ...: say which option it was
        raise BadInput(f"--metrics {e}")
    if b"\x00" in data[:4096]:
        raise BadInput(f"--metrics {src}: binary data, not a Prometheus text")
    return data.decode("utf-8", errors="replace")
