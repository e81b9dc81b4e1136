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


def workload_from_argv(argv: list[str], requests: dict) -> dict:
    """`vllm serve MODEL --flag v ...` or `python -m vllm.entrypoints.cli.main serve ...` → a vllm-serve workload;
    anything else → a generic `command` workload (flags of levers are appended to its argv)."""
    from oomdoctor.redact import redact_env
    from oomdoctor.workload import DEFAULT_REQUESTS

    env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES",
                                                                  "HF_", "TRANSFORMERS_", "NCCL_"))}
    serve_at = None
    for i, a in enumerate(argv):
        if a == "serve" and i > 0 and (argv[i - 1].endswith("vllm") or argv[i - 1] == "vllm.entrypoints.cli.main"):
            serve_at = i
            break
    wl: dict = {"env": redact_env(env), "requests": {**DEFAULT_REQUESTS, **requests}, "baseline": None, "source": "oomdoctor record"}
    if serve_at is not None and serve_at + 1 < len(argv):
        model = argv[serve_at + 1]
        args: dict = {}
        rest = argv[serve_at + 2:]
        i = 0
        while i < len(rest):
            a = rest[i]
            if not a.startswith("--"):
                i += 1
                continue
            key, _, val = a[2:].partition("=")
            key = key.replace("-", "_")
            if val:
                args[key] = _coerce(val)
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                args[key] = _coerce(rest[i + 1])
                i += 1
            elif key.startswith("no_"):
                args[key[3:]] = False
            else:
                args[key] = True
            i += 1
        args.pop("port", None)
        wl.update(launcher="vllm-serve", model=model, engine_args=args, explicit_args=sorted(args))
    else:
        wl.update(launcher="command", model=None, argv=list(argv), engine_args={}, base_args={}, explicit_args=[])
    return wl


def _coerce(v: str):
    from oomdoctor.fingerprint import normalize_value
    return normalize_value(v)


@click.command("record", context_settings={"ignore_unknown_options": True})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Card path (default: incidents/<id>.yaml).")
@click.option("--emulate", default=None, help="Leave this much memory free with a ballast (bytes, 24GiB, or a card name).")
@click.option("--gpu", "gpu_index", type=int, default=0, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True)
@click.option("--prompt-tokens", type=int, default=8, show_default=True)
@click.option("--max-tokens", type=int, default=16, show_default=True)
@click.option("--concurrency", type=int, default=1, show_default=True)
@click.option("--count", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def command(argv: tuple[str, ...], out: Path | None, emulate: str | None, gpu_index: int, timeout_s: float,
            prompt_tokens: int, max_tokens: int, concurrency: int, count: int, as_json: bool) -> int:
    """Run ARGV (after --), tee its log, diagnose it, write a card whose workload re-runs exactly that launch."""
    from oomdoctor import card as cardmod
    from oomdoctor import device as devmod
    from oomdoctor.classify import diagnose_file
    from oomdoctor.commands.diagnose import build_card
    from oomdoctor.paths import default_incidents_dir
    from oomdoctor.report import contract_json, print_json, render
    from oomdoctor.retest import Plan, run_engine, _phase_watcher, launch_argv
    from oomdoctor.rules import default_rules
    from oomdoctor.units import parse_size

    argv_l = list(argv)
    wl = workload_from_argv(argv_l, {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
                                     "concurrency": concurrency, "count": count})
    if emulate:
        wl["emulate_free_bytes"] = parse_size(emulate)
    before = devmod.capture()
    ruleset = default_rules()
    out_dir = (out.parent if out else default_incidents_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"record-{cardmod.now_iso().replace(':', '')}.log"
    run_argv = launch_argv(wl, 0) if wl["launcher"] != "vllm-serve" else argv_l
    p = Plan(lever={"id": "none", "change": {}}, workload=wl, base_changes=[], argv=run_argv,
             env={}, emulate_free_bytes=wl.get("emulate_free_bytes"), target_device=None)
    rr = run_engine(p, log_path, gpu_index, timeout_s, lambda s: click.echo(s, err=True), _phase_watcher(ruleset, "vllm"))
    diag = diagnose_file(log_path, ruleset)
    card = build_card(log_path, diag, before, [f"recorded by oomdoctor record: {shlex.join(argv_l)[:300]}"])
    card["workload"] = {**card["workload"], **wl, "resolved": card["workload"].get("resolved", {})}
    if rr.served and rr.perf:
        card["workload"]["baseline"] = {k: v for k, v in rr.perf.items() if isinstance(v, (int, float))}
    path = out or default_incidents_dir() / f"{card['id']}.yaml"
    cardmod.save(card, path)
    card = cardmod.load_dict(path)
    if as_json:
        print_json(contract_json(card, str(path)))
    else:
        render(card, str(path), file=sys.stderr)
    return contract.EXIT_OK if diag.is_memory_failure else contract.EXIT_NO_MEMORY_FAILURE
