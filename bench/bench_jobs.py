#!/usr/bin/env python3
"""``oomdoctor diagnose`` by the number of scan workers (``OOMDOCTOR_JOBS``) on the benchmark's logs: wall time,
CPU time, and the process tree's peak summed RSS and PSS, against ``grep -c -E`` (``zcat | grep -c -E``) of the
same anchors in the same run. The logs come from bench/make_logs.py (bench/out/).

  python bench/bench_jobs.py [--jobs 1 2 3 4 6 8] [--repeat 3] [--log stats.log ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_diagnose import ere_escape, rule_anchors, run_measured  # noqa: E402
from make_logs import OUT  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--log", nargs="+", default=["serving.log", "stats.log", "stats.log.gz"])
    a = ap.parse_args()
    pattern = "|".join(ere_escape(x) for x in rule_anchors())
    env = dict(os.environ, LC_ALL="C", P=pattern, PYTHONDONTWRITEBYTECODE="1")
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians of {a.repeat}")
    print(f"{'log':<14}{'jobs':>5} {'wall':>7} {'ratio':>6} {'CPU s':>6} {'tree PSS MB':>12} {'tree RSS MB':>12}")
    for name in a.log:
        path = OUT / name
        base_cmd = (["sh", "-c", f"zcat '{path}' | grep -c -E \"$P\""] if name.endswith(".gz")
                    else ["grep", "-c", "-E", pattern, str(path)])
        cmds = {"base": base_cmd}
        for j in a.jobs:
            cmds[j] = [sys.executable, "-m", "oomdoctor", "diagnose", str(path), "--no-card", "--no-device", "--json"]
        runs: dict = {k: [] for k in cmds}
        outs: dict = {}
        for _ in range(a.repeat):
            for k, cmd in cmds.items():
                r = run_measured(cmd, dict(env, OOMDOCTOR_JOBS=str(k)) if k != "base" else env)
                runs[k].append(r)
                outs.setdefault(k, r["stdout"])
        base = statistics.median(r["wall_s"] for r in runs["base"])
        print(f"{name:<14}{'grep':>5} {base:>6.2f}s")
        ref = outs[a.jobs[0]]
        for j in a.jobs:
            rs = runs[j]
            wall = statistics.median(r["wall_s"] for r in rs)
            cpu = statistics.median(r["cpu_s"] for r in rs)
            same = "" if outs[j] == ref else "  OUTPUT DIFFERS"
            print(f"{'':<14}{j:>5} {wall:>6.2f}s {wall / base:>5.2f}x {cpu:>6.2f} {max(r['tree_pss_mb'] for r in rs):>12.1f}"
                  f" {max(r['tree_rss_mb'] for r in rs):>12.1f}{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
