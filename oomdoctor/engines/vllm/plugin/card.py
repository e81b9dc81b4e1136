"""The incident card of a failed start: the log it captured (front end, children's spools, or the log file),
the workload that lets ``oomdoctor retest`` re-run that launch, diagnosed with oomdoctor's rules."""
from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oomdoctor.engines.vllm.plugin.state import ENV_INCIDENTS, ENV_LOG, S, StartRecord, tail_n
from oomdoctor.engines.vllm.plugin.values import jsonable

if TYPE_CHECKING:
    from oomdoctor.diagnose.rules import RuleSet

CHILD_NOTE = ("engine-core/worker records reach the front end only when the plugin runs in "
              "those processes (installed entry point, or processes forked from this one)")


def incidents_dir() -> Path:
    env = os.environ.get(ENV_INCIDENTS)
    return Path(env) if env else Path.cwd() / "incidents"


def _read_tail(path: Path, n: int) -> list[str]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size > (16 << 20):
            f.seek(size - (16 << 20))
        data = f.read()
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:]


def _spool_records(spool: str | None, n: int) -> tuple[list[tuple[float, str]], dict[str, int]]:
    """The records the children (engine core, workers) spooled, and how many came from each pid."""
    children: list[tuple[float, str]] = []
    kids: dict[str, int] = {}
    if not spool or not os.path.isdir(spool):
        return children, kids
    for fn in sorted(os.listdir(spool)):
        if not fn.endswith(".jsonl"):
            continue
        got = []
        try:
            for ln in _read_tail(Path(spool) / fn, n):
                try:
                    d = json.loads(ln)
                    got.append((float(d["t"]), str(d["text"])))
                except (ValueError, KeyError, TypeError):
                    continue
        except OSError:
            continue
        kids[fn[:-6]] = len(got)
        children += got
    return children, kids


def _log_file_lines(n: int, src: dict[str, Any]) -> list[str] | None:
    """The tail of ``OOMDOCTOR_PLUGIN_LOG`` when it is set and not empty; ``src['file']`` says what happened."""
    fpath = os.environ.get(ENV_LOG)
    if not fpath:
        src["file"] = {"status": f"not set ({ENV_LOG})"}
        return None
    p = Path(fpath)
    try:
        time.sleep(0.3)     # let the engine processes' last lines reach the file
        flines = _read_tail(p, n)
        src["file"] = {"path": str(p), "lines": len(flines), "status": "used" if flines else "empty"}
        return flines or None
    except OSError as e:
        src["file"] = {"path": str(p), "status": f"unreadable: {e.strerror or e}"}
        return None


def collect_log(start: StartRecord, exc: BaseException | None) -> tuple[list[str], dict[str, Any]]:
    """The log lines of this start and a description of where they came from."""
    n = tail_n()
    src: dict[str, Any] = {"tail_lines": n}
    h = S["handler"]
    own = [(t, s) for t, s in (list(h.buf) if h is not None else []) if t >= start.get("log_from", 0)]
    children, kids = _spool_records(start.get("spool"), n)
    src["frontend_logger"] = {"records": len(own)}
    src["child_processes"] = {"records_by_pid": kids, "note": CHILD_NOTE}
    captured = [s for _, s in sorted(own + children, key=lambda x: x[0])]
    lines: list[str] = []
    for s in captured:
        lines += s.split("\n")
    lines = lines[-n:]
    used = "captured"
    flines = _log_file_lines(n, src)
    if flines:
        lines, used = flines, "file"
    src["used"] = used
    if exc is not None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip("\n").split("\n")
        lines += tb
        src["exception"] = f"{type(exc).__name__} appended as Python prints it ({len(tb)} lines)"
    return lines, src


def workload_of(start: StartRecord) -> dict[str, Any]:
    """The card's workload: what ``oomdoctor retest`` needs to re-run exactly this launch."""
    from oomdoctor.card.workload import DEFAULT_REQUESTS  # noqa: PLC0415

    explicit = dict(start.get("explicit") or {})
    args: dict[str, Any] = {}
    notes: list[str] = []
    not_plain = set(start.get("explicit_not_plain") or [])
    for k, v in explicit.items():
        if k == "model":
            continue
        if k in not_plain:
            notes.append(f"explicit argument {k} has no plain value ({str(v)[:80]}): retest cannot pass it back")
            continue
        args[k] = v
    for k, v in (start.get("applied") or {}).items():
        args[k] = v
    wl: dict[str, Any] = {
        "launcher": start.get("launcher", "vllm-llm"),
        "model": (start.get("model") or {}).get("path"),
        "engine_args": args,
        "explicit_args": sorted(k for k in explicit if k != "model"),
        "resolved": dict(start.get("resolved") or {}),
        "env": dict(start.get("env") or {}),
        "requests": dict(DEFAULT_REQUESTS),
        "baseline": None,
        "source": "oomdoctor vLLM plugin",
    }
    argv = start.get("argv")
    if argv:
        from oomdoctor.redact import redact_argv  # noqa: PLC0415

        wl["argv"] = redact_argv([str(a) for a in argv])
    free, total = start.get("free_bytes"), start.get("total_bytes")
    if free is not None:
        wl["free_at_start_bytes"] = int(free)
        wl["free_at_start_source"] = "NVML at create_engine_config (oomdoctor plugin), before the engine started"
    if total is not None:
        wl["gpu_total_bytes"] = int(total)
    if start.get("applied"):
        wl["profile"] = {"name": (start.get("profile") or {}).get("selected"), "applied": start["applied"]}
        notes.append("engine_args include the serving profile's substitutions, so retest re-runs the config that "
                     "failed without the plugin (OOMDOCTOR_* variables are not recorded)")
    if notes:
        wl["notes"] = notes
    return wl


def write_card(start: StartRecord, exc: BaseException | None) -> Path:
    """Diagnose the captured log and write an ``oomdoctor.incident/v1`` card (+ the log beside it)."""
    from oomdoctor.card import store as cardmod  # noqa: PLC0415
    from oomdoctor.diagnose.classify import diagnose_file  # noqa: PLC0415
    from oomdoctor.card.build import build_card  # noqa: PLC0415
    inc = incidents_dir()
    inc.mkdir(parents=True, exist_ok=True)
    lines, sources = collect_log(start, exc)
    start["log_sources"] = sources
    wl = workload_of(start)
    tmp = inc / f".plugin-{start['id']}.log"
    tmp.write_text("\n".join(_log_header(start, wl, sources) + lines) + "\n", encoding="utf-8")
    try:
        rules, rules_note = ruleset()
        diag = diagnose_file(tmp, rules)
        dev = start.get("device") or {"status": "not_captured", "gpus": []}
        notes = ["written by the oomdoctor vLLM plugin at the failing start itself; device state is NVML's reading at "
                 "create_engine_config, before the engine started",
                 f"log source: {sources['used']} (see plugin.log_sources)"] + ([rules_note] if rules_note else [])
        card = build_card(tmp, diag, dev, notes)
        final = _free_name(inc, card["id"])
        os.replace(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    card["source"]["path"] = str(final)
    eng = card.get("engine") or {}
    card["engine"] = {**eng, "name": eng.get("name") or "vllm", "version": eng.get("version") or start["engine"]["version"]}
    card["plugin"] = jsonable({k: v for k, v in start.items() if k not in ("t0", "log_from", "spool", "device")})
    path = final.with_suffix(".yaml")
    cardmod.save(card, path)
    return path


def _log_header(start: StartRecord, wl: dict[str, Any], sources: dict[str, Any]) -> list[str]:
    """The comment lines above the captured log: what failed, and the workload ``oomdoctor record`` would write."""
    header = [f"# oomdoctor plugin {start.get('oomdoctor_version')}: start {start['id']} ({wl['launcher']}) failed at "
              f"{(start.get('failure') or {}).get('stage')}; log from {sources['used']}",
              "# oomdoctor-record: " + json.dumps({"workload": jsonable(wl)}, sort_keys=True)]
    if start.get("free_bytes") is not None:
        header.append("# nvml before start: " + json.dumps({"free": start["free_bytes"], "total": start.get("total_bytes")}))
    return header


def _free_name(inc: Path, card_id: str) -> Path:
    """``<id>.log``, else ``<id>-2.log``, ... : the first name whose log and card are both still free."""
    final = inc / f"{card_id}.log"
    k = 1
    while final.exists() or (inc / f"{final.stem}.yaml").exists():
        k += 1
        final = inc / f"{card_id}-{k}.log"
    return final


def ruleset() -> tuple[RuleSet, str | None]:
    """oomdoctor's rules; when another engine's folder does not load, the vLLM rules alone (a broken
    llama.cpp rule must not cost a vLLM incident its card)."""
    from oomdoctor.paths import rules_dir  # noqa: PLC0415
    from oomdoctor.diagnose.rules import default_rules, load_rules  # noqa: PLC0415

    try:
        return default_rules(), None
    except Exception as e:  # noqa: BLE001
        import shutil  # noqa: PLC0415
        import tempfile  # noqa: PLC0415

        d = Path(tempfile.mkdtemp(prefix="oomdoctor-rules-"))
        try:
            (d / "vllm").symlink_to(rules_dir() / "vllm", target_is_directory=True)
            return load_rules(d), f"the full rule set did not load ({e}); the vLLM rules alone were used"
        finally:
            shutil.rmtree(d, ignore_errors=True)

