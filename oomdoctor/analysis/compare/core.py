"""compare(proven, failing): read both starts, line up their rows, explain the differences, say the verdict."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from oomdoctor.analysis.compare.explain import Explanation, explain
from oomdoctor.analysis.compare.fmt import _significant, fmt_delta
from oomdoctor.analysis.compare.read import Start, read_start
from oomdoctor.analysis.compare.tables import CONDITIONS, LEDGER, SETTINGS, TIMINGS
from oomdoctor.errors import BadInput

Row = dict[str, Any]
HEAD = ("path", "engine", "engine_version", "class", "rule", "phase_reached", "model", "decisive")


def _version_warning(A: Start, B: Start) -> tuple[list[str], str]:
    va, vb = A["engine_version"] or "unknown", B["engine_version"] or "unknown"
    not_aligned = [label for name, label, _, stable in LEDGER if not stable]
    return not_aligned, (
        f"different engine versions ({A['engine'] or '?'} {va} vs {vb}): only the version-stable rows are "
        f"compared. Not aligned: {', '.join(not_aligned)} (their meaning or the line that prints them "
        "differs between versions), and every setting left at a default whose value the log does not "
        "print (defaults change between versions, e.g. max_num_seqs 256 → 1024)")


def _align_totals(A: Start, B: Start) -> None:
    """One source of the GPU total for both sides (NVML 140.40 GiB vs torch 139.80)."""
    for src in ("nvml", "engine"):
        if A["totals"][src] and B["totals"][src]:
            A["ledger"]["gpu_total_bytes"], B["ledger"]["gpu_total_bytes"] = A["totals"][src], B["totals"][src]
            break


def _setting_delta(a: Any, b: Any, kind: str) -> str:
    if a is not None and b is not None:
        return fmt_delta(a, b, kind)
    return f"{'set' if a is not None else 'default'} → {'set' if b is not None else 'default'}"


def _settings_rows(A: Start, B: Start, same_version: bool, same_launcher: bool) -> tuple[list[Row], set[str]]:
    aligned_settings = set()
    rows = []
    for key, label in SETTINGS:
        a, b = A["settings"][key], B["settings"][key]
        known_a = a["source"] != "default" or a.get("known", False)
        known_b = b["source"] != "default" or b.get("known", False)
        aligned = (known_a and known_b) or (same_version and same_launcher)
        if aligned:
            aligned_settings.add(key)
        changed = aligned and a["value"] != b["value"]
        kind = "bytes" if key == "kv_cache_memory_bytes" else ("tokens" if key in ("max_model_len", "max_num_batched_tokens") else "")
        rows.append({"name": key, "label": label, "proven": a["value"], "proven_source": a["source"],
                     "failing": b["value"], "failing_source": b["source"], "changed": changed, "aligned": aligned,
                     "delta": _setting_delta(a["value"], b["value"], kind) if changed else ""})
    return rows, aligned_settings


def _ledger_rows(A: Start, B: Start, aligned_ledger: set[str], expls: list[Explanation]) -> tuple[list[Row], list[str]]:
    rows = []
    unexplained = []
    for name, label, kind, _stable in LEDGER:
        a, b = A["ledger"].get(name), B["ledger"].get(name)
        aligned = name in aligned_ledger
        changed = aligned and _significant(a, b, kind)
        by = [e["cause"] for e in expls if name in e["explains"]]
        row: Row = {"name": name, "label": label, "unit": kind, "proven": a, "failing": b, "aligned": aligned,
                    "changed": changed, "delta": fmt_delta(a, b, kind) if aligned else "", "explained_by": by}
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            row["delta_exact"] = b - a
        if aligned and (a is None) != (b is None) and not by:
            missing = "failing" if b is None else "proven"
            side = B if b is None else A
            row["note"] = (f"not printed by the {missing} start" +
                           (f" (it stopped in phase {side['phase_reached']}: {side['class']})"
                            if side["class"] not in ("unknown", "kv_preemption") else ""))
        elif changed and name in CONDITIONS:
            row["note"] = "a start condition, not a result of the settings"
        elif changed and name in TIMINGS and not by:
            row["note"] = "timing: varies between runs (compile caches)"
        elif changed and not by:
            unexplained.append(name)
        rows.append(row)
    return rows, unexplained


def _verdict(expls: list[Explanation], changed_settings: list[str], unexplained: list[str], same_version: bool) -> str:
    main = [e for e in expls if e["status"] in ("explained", "inferred") and e["cause_kind"] in ("setting", "condition")
            and e["explains"]]
    main.sort(key=lambda e: "outcome" not in e["explains"])
    if main:
        return "; ".join(e["arithmetic"] for e in main[:3])
    if changed_settings:
        return (f"settings changed ({', '.join(changed_settings)}) but the ledgers do not show their effect in the "
                "printed figures")
    return "no setting differs between the two starts" + (": the differences come from the start conditions "
                                                          "or the engine" if unexplained or not same_version else "")


def _warnings(A: Start, B: Start, same_version: bool, same_launcher: bool) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    not_aligned: list[str] = []
    if not same_version:
        not_aligned, text = _version_warning(A, B)
        warnings.append(text)
    if not same_launcher:
        warnings.append(f"different launchers ({A['launcher']} vs {B['launcher']}): settings left at their defaults can "
                        "differ by usage context (offline LLM vs serve: max_num_seqs, max_num_batched_tokens); only the "
                        "printed values are compared")
    if A["model"] and B["model"] and A["model"] != B["model"]:
        warnings.append(f"different models ({A['model']} vs {B['model']}): weights and KV bytes per token differ by design")
    return warnings, not_aligned


def compare(proven: str | Path, failing: str | Path, engine: str | None = None, proven_version: str | None = None,
            failing_version: str | None = None) -> dict[str, Any]:
    for p in (proven, failing):
        if not Path(p).exists():
            raise BadInput(f"{p}: no such log")
    A = read_start(proven, engine, proven_version)
    B = read_start(failing, engine, failing_version)
    if A["engine"] and B["engine"] and A["engine"] != B["engine"]:
        raise BadInput(f"compare lines up two start-ups of one engine; {proven} is {A['engine']}, {failing} is {B['engine']}")
    same_version = A["engine_version"] == B["engine_version"] and A["engine_version"] is not None
    same_launcher = A["launcher"] == B["launcher"]
    warnings, not_aligned = _warnings(A, B, same_version, same_launcher)
    _align_totals(A, B)
    aligned_ledger = {name for name, _, _, stable in LEDGER if same_version or stable}
    settings_rows, aligned_settings = _settings_rows(A, B, same_version, same_launcher)
    expls = explain(A, B, aligned_ledger, aligned_settings)
    ledger_rows, unexplained = _ledger_rows(A, B, aligned_ledger, expls)
    outcome = {"proven": A["class"], "failing": B["class"],
               "explained_by": [e["cause"] for e in expls if "outcome" in e["explains"]]}
    changed_settings = [r["name"] for r in settings_rows if r["changed"]]
    return {
        "proven": {k: A[k] for k in HEAD},
        "failing": {k: B[k] for k in HEAD},
        "same_version": same_version, "warnings": warnings, "not_aligned": not_aligned,
        "outcome": outcome, "settings": settings_rows, "ledger": ledger_rows, "explanations": expls,
        "changed_settings": changed_settings, "unexplained": unexplained, 
        "verdict": _verdict(expls, changed_settings, unexplained, same_version),
    }

