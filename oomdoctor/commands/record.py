"""`oomdoctor record -- vllm serve MODEL ...` — run a launch, capture device state and its log, diagnose it.

The workload (argv as a list, explicit flags, env) is recorded in the card so that `oomdoctor retest`
re-runs exactly that launch.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from oomdoctor import contract
from oomdoctor.card.workload import workload_from_argv


def _emulation_for(target: str, gpu_index: int) -> str | None:
    """No ballast when the target is this GPU; a named card's capacity when it is one; else refuse."""
    from oomdoctor.device import nvml as devmod
    from oomdoctor.errors import BadInput
    from oomdoctor.retest.run import device_slug
    from oomdoctor.units import NAMED_CARDS

    st = devmod.capture(with_processes=False)
    here = next((device_slug(g.get("name")) for g in st.get("gpus", []) if g["index"] == gpu_index), None)
    if here == target:
        return None
    key = target.lower().replace("_", "")
    if key in NAMED_CARDS:
        return key
    raise BadInput(f"--target {target}: this GPU is {here or 'unknown (NVML unavailable)'} and {target} is not a card "
                   f"oomdoctor can emulate ({', '.join(sorted(NAMED_CARDS))})")


def write_gate_receipt(sc, card: dict, diag, rr, target: str, before: dict, receipt_path, log_path) -> Path:
    """Append this run to the config's receipt: outcome pass only when it started, served and showed no memory failure."""
    from oomdoctor import __version__
    from oomdoctor.card.receipt import write_receipt

    ok = bool(rr.served) and not diag.is_memory_failure and not rr.timed_out
    attempt = {
        "outcome": "pass" if ok else "fail",
        "engine": {"name": sc.engine, "version": diag.engine_version or sc.engine_version, "mode": "real"},
        "target_device": target, "device_before": before, "classification": card["classification"],
        "served": bool(rr.served), "perf": rr.perf, "duration_s": round(rr.duration_s, 1),
        "log_path": str(log_path), "emulate_free_bytes": card["workload"].get("emulate_free_bytes"),
        "oomdoctor_version": __version__, "notes": [f"oomdoctor record --serving-config {sc.label}"],
    }
    dest = receipt_path or Path("receipts")        # the gate's default receipts folder (run from the project root)
    if not str(dest).endswith(".yaml"):
        Path(dest).mkdir(parents=True, exist_ok=True)
    return write_receipt(dest, sc.effective_config, attempt, source={"path": sc.path, "profile": sc.profile})


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
            target: str | None, receipt_path: Path | None, out: Path | None, emulate: str | None, gpu_index: int,
            timeout_s: float, prompt_tokens: int, max_tokens: int, concurrency: int, count: int, as_json: bool) -> int:
    """Run ARGV (after --), tee its log, diagnose it, write a card whose workload re-runs exactly that launch.

    With --serving-config, run that declared config on --target and append the attempt to a receipt
    that `oomdoctor gate` accepts when the start passed."""
    from oomdoctor.card import store as cardmod
    from oomdoctor.device import nvml as devmod
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.card.build import build_card
    from oomdoctor.paths import default_incidents_dir
    from oomdoctor.diagnose.report import contract_json, print_json, render
    from oomdoctor.retest.run import Plan, run_engine, _phase_watcher, launch_argv
    from oomdoctor.diagnose.rules import default_rules
    from oomdoctor.units import parse_size

    from oomdoctor.errors import BadInput

    sc = None
    if serving_config is not None:
        if argv:
            raise BadInput("give either --serving-config or a command after --, not both")
        if not target:
            raise BadInput("--serving-config needs --target (the device the receipt is for, e.g. nvidia-h200 or rtx4090)")
        from oomdoctor.gate import load_serving_config

        sc = load_serving_config(serving_config, profile=profile, project_file=project_file)
        if target not in sc.targets:
            raise BadInput(f"--target {target} is not a declared target of {sc.label} ({', '.join(sc.targets)})")
        argv = tuple(sc.argv())
        emulate = emulate or _emulation_for(target, gpu_index)
    elif not argv:
        raise BadInput("nothing to record: give a command after -- (e.g. -- vllm serve MODEL) or --serving-config")
    argv_l = list(argv)
    wl = workload_from_argv(argv_l, {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
                                     "concurrency": concurrency, "count": count})
    if sc is not None:
        wl["env"] = {**wl.get("env", {}), **sc.env}
        wl["model_revision"] = sc.model_revision
    if emulate:
        wl["emulate_free_bytes"] = parse_size(emulate)
    before = devmod.capture()
    ruleset = default_rules()
    out_dir = (out.parent if out else default_incidents_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"record-{cardmod.now_iso().replace(':', '')}.log"
    run_argv = launch_argv(wl, 0) if wl["launcher"] != "vllm-serve" else argv_l
    p = Plan(lever={"id": "none", "change": {}}, workload=wl, base_changes=[], argv=run_argv,
             env=dict(sc.env) if sc is not None else {}, emulate_free_bytes=wl.get("emulate_free_bytes"),
             target_device=target)
    rr = run_engine(p, log_path, gpu_index, timeout_s, lambda s: click.echo(s, err=True), _phase_watcher(ruleset, "vllm"))
    diag = diagnose_file(log_path, ruleset)
    card = build_card(log_path, diag, before, [f"recorded by oomdoctor record: {shlex.join(argv_l)[:300]}"])
    card["workload"] = {**card["workload"], **wl, "resolved": card["workload"].get("resolved", {})}
    if rr.served and rr.perf:
        card["workload"]["baseline"] = {k: v for k, v in rr.perf.items() if isinstance(v, (int, float))}
    path = out or default_incidents_dir() / f"{card['id']}.yaml"
    cardmod.save(card, path)
    card = cardmod.load_dict(path)
    if sc is not None:
        rc_path = write_gate_receipt(sc, card, diag, rr, target, before, receipt_path, log_path)
        click.echo(f"receipt: {rc_path} ({'pass' if rr.served and not diag.is_memory_failure else 'fail'})", err=True)
    if as_json:
        print_json(contract_json(card, str(path)))
    else:
        render(card, str(path), file=sys.stderr)
    return contract.EXIT_OK if diag.is_memory_failure else contract.EXIT_NO_MEMORY_FAILURE
