"""`oomdoctor record`'s core: run a launch (ARGV or a declared serving config) once, tee its log, diagnose it,
and write a card whose workload re-runs exactly that launch — plus, for a serving config, the gate's receipt."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Callable

from oomdoctor.card.records import CardDict, Workload
from oomdoctor.card.workload import workload_from_argv
from oomdoctor.errors import BadInput


def emulation_for(target: str, gpu_index: int) -> str | None:
    """No ballast when the target is this GPU; a named card's capacity when it is one; else refuse."""
    from oomdoctor.device import nvml as devmod
    from oomdoctor.retest.launch import device_slug
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


def write_gate_receipt(sc: Any, card: CardDict, diag: Any, rr: Any, target: str, before: dict, receipt_path: Path | None,
                       log_path: Path) -> Path:
    """Append this run to the config's receipt: outcome pass only when it started, served and showed no memory failure."""
    from oomdoctor import __version__
    from oomdoctor.card.receipt import write_receipt

    from oomdoctor.card.verify import run_passed

    ok = run_passed(diag.klass, diag.is_memory_failure, bool(rr.served)) and not rr.timed_out
    attempt = {
        "outcome": "pass" if ok else "fail",
        "engine": {"name": sc.engine, "version": diag.engine_version or sc.engine_version, "mode": "real"},
        "target_device": target, "device_before": before, "classification": card["classification"],
        "served": bool(rr.served), "perf": rr.perf, "duration_s": round(rr.duration_s, 1),
        "emulate_free_bytes": card["workload"].get("emulate_free_bytes"),
        "oomdoctor_version": __version__, "notes": [f"oomdoctor record --serving-config {sc.label}"],
    }
    dest = receipt_path or Path("receipts")        # the gate's default receipts folder (run from the project root)
    if not str(dest).endswith(".yaml"):
        Path(dest).mkdir(parents=True, exist_ok=True)
    return write_receipt(dest, sc.effective_config, attempt, log=log_path, source={"path": sc.path, "profile": sc.profile})


def rcpt_outcome(path: Path) -> str:
    from oomdoctor.card.receipt import read_receipt

    return str(read_receipt(path)["attempts"][-1].get("outcome"))


def resolve_launch(argv: tuple[str, ...], serving_config: Path | None, profile: str | None, project_file: Path | None,
                   target: str | None, emulate: str | None, gpu_index: int) -> tuple[list[str], Any, str | None]:
    """(argv, the serving config or None, emulate) from either ARGV or --serving-config with --target."""
    if serving_config is None:
        if not argv:
            raise BadInput("nothing to record: give a command after -- (e.g. -- vllm serve MODEL) or --serving-config")
        return list(argv), None, emulate
    if argv:
        raise BadInput("give either --serving-config or a command after --, not both")
    if not target:
        raise BadInput("--serving-config needs --target (the device the receipt is for, e.g. nvidia-h200 or rtx4090)")
    from oomdoctor.gate import load_serving_config

    sc = load_serving_config(serving_config, profile=profile, project_file=project_file)
    if target not in sc.targets:
        raise BadInput(f"--target {target} is not a declared target of {sc.label} ({', '.join(sc.targets)})")
    return list(sc.argv()), sc, emulate or emulation_for(target, gpu_index)


def record(argv: list[str], sc: Any, requests: dict[str, int], emulate: str | None, target: str | None,
           out: Path | None, receipt_path: Path | None, gpu_index: int, timeout_s: float,
           progress: Callable[[str], None], sign_key: Path | None = None) -> tuple[CardDict, Path, Any]:
    """Run the launch once and write its card; (the card as written, its path, the diagnosis)."""
    from oomdoctor.card import store as cardmod
    from oomdoctor.card.build import build_card
    from oomdoctor.device import nvml as devmod
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.rules import default_rules
    from oomdoctor.paths import default_incidents_dir
    from oomdoctor.retest import run as runmod          # run_engine looked up at call time: tests replace it
    from oomdoctor.units import parse_size

    wl: Workload = workload_from_argv(argv, requests)
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
    run_argv = runmod.launch_argv(wl, 0) if wl["launcher"] != "vllm-serve" else argv
    p = runmod.Plan(lever={"id": "none", "change": {}}, workload=wl, base_changes=[], argv=run_argv,
                    env=dict(sc.env) if sc is not None else {}, emulate_free_bytes=wl.get("emulate_free_bytes"),
                    target_device=target)
    rr = runmod.run_engine(p, log_path, gpu_index, timeout_s, progress, runmod._phase_watcher(ruleset, "vllm"))
    log_path = rr.log_path
    diag = diagnose_file(log_path, ruleset)
    card = build_card(log_path, diag, before, [f"recorded by oomdoctor record: {shlex.join(argv)[:300]}"])
    card["workload"] = {**card["workload"], **wl, "resolved": card["workload"].get("resolved", {})}
    if rr.served and rr.perf:
        card["workload"]["baseline"] = {k: v for k, v in rr.perf.items() if isinstance(v, (int, float))}
    path = out or default_incidents_dir() / f"{card['id']}.yaml"
    cardmod.save(card, path)
    written = cardmod.load_dict(path)
    if sc is not None and target is not None:
        rc_path = write_gate_receipt(sc, written, diag, rr, target, before, receipt_path, log_path)
        outcome = rcpt_outcome(rc_path)
        if sign_key is not None:
            from oomdoctor.gate.signing import sign

            progress(f"receipt signed: {sign(rc_path, sign_key)}")
        progress(f"receipt: {rc_path} ({outcome})")
    return written, path, diag
