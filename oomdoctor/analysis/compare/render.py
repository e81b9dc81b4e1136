"""Printing a comparison as tables, and plotting both ledgers as stacked bars."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.analysis.compare.fmt import fmt_value
from oomdoctor.analysis.compare.tables import GiB
from oomdoctor.errors import MissingExtra


def print_tables(res: dict, file=None) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = Console(file=file or sys.stdout)
    pa, pb = res["proven"], res["failing"]
    con.print(Text(f"proven:  {pa['path']} — {pa['engine'] or '?'} {pa['engine_version'] or '?'}, {pa['class']}"))
    con.print(Text(f"failing: {pb['path']} — {pb['engine'] or '?'} {pb['engine_version'] or '?'}, {pb['class']}"
                   + (f" (line {pb['decisive']['line']})" if pb.get("decisive") else "")))
    oc = res["outcome"]
    if oc["proven"] != oc["failing"]:
        con.print(Text(f"outcome: {oc['proven']} → {oc['failing']}"
                       + (f" — explained by {', '.join(oc['explained_by'])}" if oc["explained_by"] else "")))
    for w in res["warnings"]:
        con.print(Text("warning: " + w, style="yellow"))
    t = Table(title="Settings", title_justify="left")
    for c in ("setting", "proven", "failing", "change"):
        t.add_column(c)
    for r in res["settings"]:
        kind = "bytes" if r["name"] == "kv_cache_memory_bytes" else ""
        src = lambda v, s: Text(fmt_value(v, kind) + ("" if s == "explicit" else f" ({s})"))  # noqa: E731
        t.add_row(r["label"], src(r["proven"], r["proven_source"]), src(r["failing"], r["failing_source"]),
                  Text(r["delta"] or ("changed" if r["changed"] else ("" if r["aligned"] else "not aligned")),
                       style="bold" if r["changed"] else ""))
    con.print(t)
    t = Table(title="Ledger", title_justify="left")
    for c in ("row", "proven", "failing", "change", "explained by"):
        t.add_column(c)
    for r in res["ledger"]:
        if r["proven"] is None and r["failing"] is None:
            continue
        t.add_row(r["label"], fmt_value(r["proven"], r["unit"]), fmt_value(r["failing"], r["unit"]),
                  Text(r["delta"] if r["aligned"] else "not aligned (versions)", style="bold" if r["changed"] else ""),
                  Text(", ".join(r["explained_by"]) or r.get("note", "") or ("?" if r["changed"] else "")))
    con.print(t)
    for e in res["explanations"]:
        con.print(Text(f"[{e['status']}] {e['arithmetic']}"))
    if res["unexplained"]:
        con.print(Text("not explained by a setting change: " + ", ".join(res["unexplained"]), style="yellow"))


def plot(res: dict, path: str | Path) -> Path:
    """Both ledgers as stacked bars (weights / activations / CUDA graphs / KV / other). Needs matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra("--plot needs matplotlib: pip install 'oomdoctor[plot]'")
    rows = {r["name"]: r for r in res["ledger"]}
    pins = {s["name"]: s for s in res["settings"]}["kv_cache_memory_bytes"]
    parts = [("weights", "weights_bytes", "#4c72b0"), ("activations", "activation_peak_bytes", "#dd8452"),
             ("CUDA graphs", "cuda_graph_bytes", "#55a868"), ("KV", None, "#c44e52"), ("other (non-torch)", "non_torch_bytes", "#8172b3")]
    fig = Figure(figsize=(6.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    def value(key: str | None, side: str) -> float:
        if key is None:
            v = rows["kv_cache_memory_bytes"][side] or (pins[side] if isinstance(pins[side], (int, float)) else None) \
                or rows["kv_available_bytes"][side]
        else:
            v = rows[key][side]
        return (v or 0) / GiB

    missing = [name for name, key, _ in parts if not any(value(key, s) for s in ("proven", "failing"))]
    for i, side in enumerate(("proven", "failing")):
        bottom = 0.0
        for name, key, color in parts:
            v = value(key, side)
            if name in missing:
                continue
            ax.bar(i, v, bottom=bottom, color=color, label=name if i == 0 else None, width=0.55)
            if v > 0.05:
                ax.text(i, bottom + v / 2, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white")
            bottom += v
        free = rows["free_before_start_bytes"][side]
        if free:
            ax.plot([i - 0.3, i + 0.3], [free / GiB] * 2, color="black", linestyle="--", linewidth=1,
                    label="free before the start" if i == 0 else None)
    if missing:
        ax.text(0.0, -0.16, "not printed by these logs: " + ", ".join(missing), transform=ax.transAxes, fontsize=7)
    ax.set_xticks([0, 1])
    ax.set_xticklabels([f"proven\n{Path(res['proven']['path']).name}", f"failing\n{Path(res['failing']['path']).name}"])
    ax.set_ylabel("GiB")
    ax.set_title("Start-up ledgers")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out
