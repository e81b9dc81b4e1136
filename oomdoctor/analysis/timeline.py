"""KV pressure over time: the runtime summary of a serving log as a terminal timeline or a PNG.

Input: the dict of ``RuntimeTracker.summary()`` (oomdoctor/runtime.py; ``Diagnosis.runtime``):
``timeline`` is a list of stats samples ``{line, ts, kv_usage_percent, running, waiting,
preemptions}``; ``preemptions``, ``preemptions_source``, ``kv_pressure_samples`` ... summarise it.
On long logs the tracker keeps every k-th sample (bounded memory), so the timeline and the
episodes below are at that resolution.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from oomdoctor.errors import BadInput, MissingExtra
from oomdoctor.diagnose.signals import KV_PRESSURE_PERCENT

BLOCKS = " ▁▂▃▄▅▆▇█"
ASCII_LEVELS = " .:-=+*#%@"
TS_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f")


def _timeline(summary: dict | None) -> list[dict]:
    if not summary:
        return []
    tl = summary.get("timeline")
    if tl is None:
        return []
    if not isinstance(tl, list) or any(not isinstance(s, dict) or "line" not in s for s in tl):
        raise BadInput("runtime summary: 'timeline' must be a list of samples with a 'line'")
    return tl


def _pressure(s: dict) -> bool:
    kv = s.get("kv_usage_percent")
    return kv is not None and kv >= KV_PRESSURE_PERCENT and (s.get("waiting") or 0) > 0


def episodes(summary: dict | None) -> list[dict]:
    """Contiguous runs of stats samples with KV usage >= 95 % while requests wait.

    Each: start/end line and timestamp, samples, peak waiting, peak and lowest KV usage,
    waiting at the start and at the end."""
    out: list[dict] = []
    cur: list[dict] = []
    for s in _timeline(summary) + [None]:
        if s is not None and _pressure(s):
            cur.append(s)
            continue
        if cur:
            kv = [c["kv_usage_percent"] for c in cur]
            out.append({
                "start_line": cur[0]["line"], "start_ts": cur[0].get("ts"),
                "end_line": cur[-1]["line"], "end_ts": cur[-1].get("ts"),
                "samples": len(cur),
                "peak_waiting": max(c.get("waiting") or 0 for c in cur),
                "waiting_start": cur[0].get("waiting"), "waiting_end": cur[-1].get("waiting"),
                "peak_kv_usage_percent": max(kv), "min_kv_usage_percent": min(kv),
                "preemptions": sum(c.get("preemptions") or 0 for c in cur),
            })
            cur = []
    return out


# ----------------------------------------------------------------------------- text
def _buckets(n: int, width: int) -> list[range]:
    if n <= width:
        return [range(i, i + 1) for i in range(n)]
    return [range(i * n // width, (i + 1) * n // width) for i in range(width)]


def _level(v: float | None, top: float, chars: str) -> str:
    if v is None:
        return "·" if chars is BLOCKS else "?"
    if top <= 0:
        return chars[0]
    k = round(max(0.0, min(1.0, v / top)) * (len(chars) - 1))
    if v > 0 and k == 0:
        k = 1                                  # anything non-zero stays visible
    return chars[k]


def _max(vals: list) -> Any:
    xs = [v for v in vals if v is not None]
    return max(xs) if xs else None


def _peak_notes(tl: list[dict]) -> tuple[str, str]:
    peak = max((s for s in tl if s.get("kv_usage_percent") is not None),
               key=lambda s: s["kv_usage_percent"], default=None)
    kv_note = (f"peak {peak['kv_usage_percent']:g}% at line {peak['line']}" + (f" ({peak['ts']})" if peak.get("ts") else "")
               if peak else "no KV usage figures")
    wpeak = max((s for s in tl if s.get("waiting") is not None), key=lambda s: s["waiting"], default=None)
    w_note = f"peak {wpeak['waiting']} waiting at line {wpeak['line']}" if wpeak else "no waiting figures"
    return kv_note, w_note


def _preemption_note(summary: dict | None, tl: list[dict]) -> str:
    total_pre = (summary or {}).get("preemptions") or 0
    placed = sum(s.get("preemptions") or 0 for s in tl)
    src = (summary or {}).get("preemptions_source") or "none"
    pre_note = f"{total_pre} preemption(s) (source: {src})"
    if total_pre and not placed:
        pre_note += "; the count has no time in the log, so it is not placed on the timeline"
    return pre_note


def _episode_lines(summary: dict | None) -> list[str]:
    eps = episodes(summary)
    lines = []
    for k, e in enumerate(eps, 1):
        when = f" ({e['start_ts']} → {e['end_ts']})" if e.get("start_ts") else ""
        lines.append(f"episode {k}: lines {e['start_line']}-{e['end_line']}{when}, {e['samples']} sample(s), "
                     f"KV {e['min_kv_usage_percent']:g}-{e['peak_kv_usage_percent']:g}%, "
                     f"waiting {e['waiting_start']} → {e['waiting_end']} (peak {e['peak_waiting']})")
    if not eps:
        lines.append(f"no KV pressure episode (KV >= {KV_PRESSURE_PERCENT:g}% while requests waited)")
    return lines


def render_text(summary: dict | None, width: int = 60, ascii: bool = False) -> str:
    """A compact timeline: KV usage, waiting and running as sparklines, pressure and preemption marks,
    the peaks and the pressure episodes. One column per sample, or per bucket (max) on long logs."""
    if width < 8:
        raise BadInput(f"timeline width must be at least 8 columns, got {width}")
    tl = _timeline(summary)
    if not tl:
        return "runtime timeline: no stats lines (no KV usage samples in the log)"
    chars = ASCII_LEVELS if ascii else BLOCKS
    buckets = _buckets(len(tl), width)
    col = [[tl[i] for i in b] for b in buckets]
    kv = [_max([s.get("kv_usage_percent") for s in c]) for c in col]
    waiting = [_max([s.get("waiting") for s in c]) for c in col]
    running = [_max([s.get("running") for s in c]) for c in col]
    w_top = _max(waiting) or 0
    r_top = _max(running) or 0
    press = ["^" if any(_pressure(s) for s in c) else " " for c in col]
    pre = ["P" if any((s.get("preemptions") or 0) > 0 for s in c) else " " for c in col]

    first, last = tl[0], tl[-1]
    per = "" if len(tl) <= width else f", {len(tl) / len(buckets):.1f} samples per column (max)"
    lines = [f"runtime timeline: {len(tl)} stats sample(s), lines {first['line']}-{last['line']}"
             + (f" ({first.get('ts')} → {last.get('ts')})" if first.get("ts") else "") + per]
    kv_note, w_note = _peak_notes(tl)
    lines.append(f"KV usage |{''.join(_level(v, 100.0, chars) for v in kv)}| {kv_note}")
    lines.append(f"waiting  |{''.join(_level(v, w_top, chars) for v in waiting)}| {w_note}")
    lines.append(f"running  |{''.join(_level(v, r_top, chars) for v in running)}| peak {r_top} running")
    n_press = sum(1 for s in tl if _pressure(s))
    lines.append(f"pressure |{''.join(press)}| {n_press} sample(s) with KV >= {KV_PRESSURE_PERCENT:g}% while requests waited")
    lines.append(f"preempt  |{''.join(pre)}| {_preemption_note(summary, tl)}")
    lines += _episode_lines(summary)
    text = "\n".join(lines)
    return text.replace("→", "->") if ascii else text


# ----------------------------------------------------------------------------- PNG
def _seconds(tl: list[dict]) -> list[float] | None:
    """Seconds since the first sample when every timestamp parses and none goes back; else None."""
    out: list[float] = []
    t0 = None
    for s in tl:
        ts = s.get("ts")
        if not ts:
            return None
        t = None
        for fmt in TS_FORMATS:
            for text in (f"2000-{ts}", ts):             # vLLM prints MM-DD HH:MM:SS (no year; 2000 is a leap year)
                try:
                    t = datetime.strptime(text, fmt)
                    break
                except ValueError:
                    continue
            if t is not None:
                break
        if t is None:
            return None
        t0 = t0 or t
        x = (t - t0).total_seconds()
        if out and x < out[-1]:
            return None
        out.append(x)
    return out


def plot(summary: dict | None, path: str | Path) -> Path:
    """Draw KV usage (%) and running/waiting requests over time into a PNG; shade pressure episodes.

    Needs matplotlib (``pip install 'oomdoctor[plot]'``); uses no global pyplot state."""
    tl = _timeline(summary)
    if not tl:
        raise BadInput("no stats lines in the runtime summary: nothing to plot")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra("--plot needs matplotlib: pip install 'oomdoctor[plot]'")
    out = Path(path)
    secs = _seconds(tl)
    xs = secs if secs is not None else [s["line"] for s in tl]
    xlabel = "seconds since the first stats line" if secs is not None else "log line"
    at = {s["line"]: x for s, x in zip(tl, xs)}

    fig = Figure(figsize=(10, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    kv = [s.get("kv_usage_percent") for s in tl]
    ax.plot(xs, [float("nan") if v is None else v for v in kv], color="tab:red", marker=".", label="KV cache usage %")
    ax.axhline(KV_PRESSURE_PERCENT, color="grey", linestyle="--", linewidth=0.8,
               label=f"{KV_PRESSURE_PERCENT:g}% pressure threshold")
    ax.set_ylim(0, 105)
    ax.set_ylabel("KV usage %")
    for e in episodes(summary):
        x0, x1 = at[e["start_line"]], at[e["end_line"]]
        for a in (ax, ax2):
            if x1 > x0:
                a.axvspan(x0, x1, color="tab:orange", alpha=0.2)
            else:                                       # a one-sample episode: a line, not a 0-wide span
                a.axvline(x0, color="tab:orange", alpha=0.5, linewidth=3)
    pre = [(x, s.get("preemptions")) for s, x in zip(tl, xs) if (s.get("preemptions") or 0) > 0]
    if pre:
        ax.scatter([p[0] for p in pre], [100] * len(pre), marker="v", color="black", label="preemptions")
    ax.legend(loc="lower left", fontsize=8)
    title = f"KV pressure: {len(tl)} stats samples, {(summary or {}).get('preemptions') or 0} preemption(s)"
    ax.set_title(title)
    nan = float("nan")
    ax2.step(xs, [nan if s.get("running") is None else s["running"] for s in tl], where="post", label="running")
    ax2.step(xs, [nan if s.get("waiting") is None else s["waiting"] for s in tl], where="post", label="waiting")
    ax2.set_ylabel("requests")
    ax2.set_xlabel(xlabel)
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, format="png")
    except OSError as e:
        raise BadInput(f"cannot write the plot to {out}: {e.strerror or e}")
    return out
