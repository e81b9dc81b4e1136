"""A dry run of the plugin's selection: ``python -m oomdoctor.profiles FILE --free B --total B``."""
from __future__ import annotations

import json
from typing import Any

from oomdoctor.errors import BadInput
from oomdoctor.profiles.reader import UTIL_FIELD, ProfileSet, load_profiles
from oomdoctor.profiles.select import Selection, select_profile


def report(ps: ProfileSet, sel: Selection) -> str:
    lines = [f"profiles: {ps.path or '(inline)'} (safety factor {ps.safety_factor})"]
    for c in sel.candidates:
        req = f"{c['requirement_bytes']:,} B ({c['requirement_kind']})" if c["requirement_bytes"] is not None else "-"
        lines.append(f"  {c['name']:<16} window {c['window'] if c['window'] is not None else '-':>9}  {c['status']:<10} "
                     f"needs {req:<34} {'ELIGIBLE' if c['eligible'] else c['why_not']}")
    lines += [f"reason: {r}" for r in sel.reasons]
    lines += sel.log_lines()
    lines += [f"warning: {w}" for w in sel.warnings]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m oomdoctor.profiles FILE [--free BYTES --total BYTES] [--explicit k=v ...] [--forced NAME]
    [--engine-version V] [--allow-unmeasured] [--json]`` — what the plugin would select (no engine)."""
    import argparse
    import sys

    from oomdoctor.units import parse_size

    ap = argparse.ArgumentParser(prog="python -m oomdoctor.profiles", description=main.__doc__)
    ap.add_argument("file")
    ap.add_argument("--free", default=None, help="free bytes of the engine's GPU (default: NVML now)")
    ap.add_argument("--total", default=None, help="total bytes of the engine's GPU (default: NVML now)")
    ap.add_argument("--explicit", action="append", default=[], metavar="K=V")
    ap.add_argument("--forced", default=None)
    ap.add_argument("--engine-version", default=None)
    ap.add_argument("--default-util", type=float, default=0.92, help="vLLM's default utilization (0.92 in 0.25.1)")
    ap.add_argument("--allow-unmeasured", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        ps = load_profiles(a.file)
        free = parse_size(a.free) if a.free else None
        total = parse_size(a.total) if a.total else None
        if free is None or total is None:
            from oomdoctor.device import nvml as device

            st = device.capture(with_processes=False)
            if st.get("status") == "captured" and st["gpus"]:
                g = st["gpus"][0]
                free = g["free_bytes"] if free is None else free
                total = g["total_bytes"] if total is None else total
        explicit: dict[str, Any] = {}
        for kv in a.explicit:
            k, _, v = kv.partition("=")
            try:
                explicit[k] = json.loads(v)
            except ValueError:
                explicit[k] = v
    except BadInput as e:
        print(f"oomdoctor: error: {e}", file=sys.stderr)
        return 2
    sel = select_profile(ps, free, total, explicit, a.forced, defaults={UTIL_FIELD: a.default_util},
                         engine_version=a.engine_version, allow_unmeasured=a.allow_unmeasured)
    if a.json:
        print(json.dumps(sel.to_dict(), indent=1, default=str))
    else:
        print(report(ps, sel))
    return 0 if sel.selected else 1
