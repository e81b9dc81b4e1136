"""Terminal report and the contract's JSON output for a diagnosis / card."""
from __future__ import annotations

import json
import sys
from typing import Any

from oomdoctor.units import human_bytes


def contract_json(card: dict, card_path: str | None) -> dict:
    """``diagnose --json``: the contract's keys first, then the rest of what a script may want (each lever's
    ``paste``: the lines the screen gives to paste, the user's whole command when the card knows it)."""
    from oomdoctor.diagnose.screen import launcher_text

    c = card["classification"]
    out = {
        "classification": {"class": c["class"], "phase": c["phase"], "type": c["type"], "rule": c.get("rule"),
                           "engine": c.get("engine"),
                           **{k: c[k] for k in ("phase_basis", "confidence", "settled_by", "root_cause_in",
                                                         "version_caveat") if k in c}},
        "evidence": [{k: e[k] for k in ("line", "text", "rule", "role", "process") if k in e} for e in card["evidence"]],
        "numbers": card["numbers"],
        "numbers_printed": card.get("numbers_printed") or {},
        "levers": [{**{k: lv[k] for k in ("id", "change", "flag", "predicted", "cost", "rank", "basis",
                                          "explicit_override", "arithmetic") if k in lv},
                    "paste": launcher_text(card, lv)} for lv in card["levers"]],
        "engine": card["engine"],
        "phase_reached": card.get("phase_reached"),
        "summary": card.get("summary", ""),
        "device": card["device"],
        "log_device": card.get("log_device", []),
        "workload": card["workload"],
        "notes": card.get("notes", []),
        "card": card_path,
        "source": card["source"],
    }
    if card.get("runtime"):
        out["runtime"] = {k: v for k, v in card["runtime"].items() if k != "timeline"}
    if card.get("model_check"):
        out["model_check"] = card["model_check"]
    return out


def _fmt_num(k: str, v: Any, printed: str | None = None) -> str:
    """A number as the tables write it; a byte count the log printed rounded (``printed``: ``124.52 GiB``) is given
    as printed, its rebuilt bytes with ≈."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if k.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{printed} (≈ {int(v):,} B)" if printed else f"{human_bytes(v)} ({int(v):,} B)"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _evidence(con: Any, card: dict) -> None:
    from rich.table import Table
    from rich.text import Text

    if card["evidence"]:
        t = Table(title="Evidence", show_header=True, header_style="bold", expand=False, title_justify="left")
        t.add_column("line", justify="right")
        t.add_column("role")
        t.add_column("text", overflow="fold", max_width=140)
        for e in card["evidence"][:10]:
            text = e["text"] if len(e["text"]) < 400 else e["text"][:400] + " …"
            t.add_row(str(e["line"]), e.get("role", ""), Text(text))
        con.print(t)
    if card["numbers"]:
        t = Table(title="Numbers (from the log)", show_header=False, expand=False, title_justify="left")
        t.add_column(overflow="ellipsis")
        t.add_column(no_wrap=True)          # a figure is never cut: the name gives way
        t.add_column(no_wrap=True)
        for k, v in card["numbers"].items():
            src = card.get("numbers_source", {}).get(k)
            t.add_row(Text(k), Text(_fmt_num(k, v, (card.get("numbers_printed") or {}).get(k))),
                      f"line {src}" if src else "")
        con.print(t)


def _runtime_snapshot_device(con: Any, card: dict) -> None:
    from rich.text import Text

    rt = card.get("runtime") or {}
    if rt.get("timeline"):
        from oomdoctor.analysis.timeline import render_text

        con.print(Text(render_text(rt, width=60)))
    if card.get("snapshot"):
        sn = card["snapshot"].get("total", {})
        con.print(Text("snapshot: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in sn.items()
                                                 if k.endswith("_bytes") and isinstance(v, int))[:400]))
    dev = card["device"]
    if dev.get("status") == "captured":
        for g in dev.get("gpus", []):
            procs = ", ".join(f"{p['pid']} {human_bytes(p.get('used_bytes') or 0)}" for p in g.get("processes", []))
            con.print(f"GPU {g['index']} {g.get('name', '')}: free {human_bytes(g['free_bytes'])} of {human_bytes(g['total_bytes'])}"
                      + (f"; holders: {procs}" if procs else ""))
    else:
        con.print(Text(f"device state: {dev.get('status')} — {dev.get('reason', '')}", style="dim"))


def _predicted(pred: dict) -> str:
    """``fits; kv_needed_bytes 122.00 GiB (130,996,167,176 B); model: fits, kv_tokens 2,041,760`` — nested records
    (the memory model's prediction under --model) are written out, never as a Python dict."""
    parts = [str(pred.get("outcome", ""))] if pred.get("outcome") else []
    for k, v in pred.items():
        if k == "outcome":
            continue
        if isinstance(v, dict):
            parts.append(f"{k}: " + ", ".join(f"{kk} {_fmt_num(kk, vv)}" for kk, vv in v.items()))
        else:
            parts.append(f"{k} {_fmt_num(k, v)}")
    return "; ".join(parts)


def lever_lines(card: dict, width: int) -> list[str]:
    """Every lever, one block each: rank, id, the change as pasted, prediction, cost, arithmetic (--verbose)."""
    from oomdoctor.diagnose.screen import launcher_text, paste_lines, wrap

    lines: list[str] = []
    if card["levers"]:
        lines.append("Levers (try #1 first; one at a time):")
    for lv in card["levers"]:
        head = f"#{lv['rank']} {lv['id']}" + (" (overrides your value)" if lv.get("explicit_override") else "")
        lines += wrap(head, width, indent="    ")
        lines += paste_lines(launcher_text(card, lv), width, "    ")
        lines += wrap("predicted: " + _predicted(lv.get("predicted") or {}), width, indent="      ", first="    ")
        lines += wrap("cost: " + str(lv.get("cost", "")), width, indent="      ", first="    ")
        for a in lv.get("arithmetic") or []:
            lines += wrap(a, width, indent="        ", first="    · ")
    return lines


def render(card: dict, card_path: str | None, file: Any = None, verbose: bool = False, width: int | None = None) -> None:
    """The first screen (what failed, where, why, the ONE change); with ``verbose`` everything after it."""
    import shutil

    from rich.console import Console
    from rich.text import Text

    from oomdoctor.redact import redact_obj

    card = redact_obj(card)           # stdout is an output path like a card: the same redaction
    from oomdoctor.diagnose.screen import WIDTH, first_screen

    out = file or sys.stdout
    width = width or min(max(shutil.get_terminal_size((WIDTH, 24)).columns, 60), 120)
    screen = first_screen(card, card_path, width)
    if verbose and screen and screen[-1].endswith(": --verbose"):
        screen = screen[:-1]          # "More (...): --verbose" is what follows
    out.write("\n".join(screen) + "\n")
    if not verbose:
        return
    con = Console(file=out, highlight=False, soft_wrap=False, width=width)
    con.print(Text("─" * width))
    _evidence(con, card)
    _runtime_snapshot_device(con, card)
    for ln in lever_lines(card, width):
        con.print(Text(ln), overflow="ignore", crop=False)
    mc = card.get("model_check")
    if mc:
        rc = mc["recorded_config"]
        con.print(Text(f"memory model ({mc['model']}): the recorded config "
                       + ("fits" if rc.get("fits") else f"fails with {rc.get('failure')}")
                       + (" — agrees with the log" if mc.get("agrees_with_log") else " — DISAGREES with the log")))
    for n in card.get("notes", []):
        con.print(Text(f"note: {n}", style="dim"))
    if card_path:
        con.print(f"card: {card_path}")


def print_json(obj: Any) -> None:
    from oomdoctor.redact import redact_obj

    sys.stdout.write(json.dumps(redact_obj(obj), indent=2, default=str) + "\n")
