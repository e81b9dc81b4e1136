#!/usr/bin/env python3
"""Benchmark `oomdoctor diagnose` on two >= 400 MB vLLM 0.25.1 serving logs built by bench/make_logs.py
(serving.log: 0.6 % of the lines hold a rule anchor; stats.log: half of the lines are the periodic stats line),
and on stats.log gzipped. In the same run, on the same page-cached files, it times:

  - the baselines: ``LC_ALL=C grep -c -E '<the rule anchors, ERE-escaped, joined by |>' LOG``, ``rg -c`` of the same
    anchors (ripgrep; the table says so when rg is absent), and for the .gz ``zcat LOG.gz | grep -c -E ...``;
  - ``python -m oomdoctor diagnose LOG --no-card --no-device --json`` as a user runs it (on a large log and three or
    more cores: worker processes, diagnose/parallel.py) and with ``OOMDOCTOR_JOBS=1`` (one process and its grep);
    memory: the peak RSS from wait4 (the largest single process of the run) and, sampled every 20 ms, the peak sum
    over the whole process tree of RSS and of PSS (shared pages divided among the processes sharing them: what
    the run takes of the machine; the RSS target is checked on it);
  - ``oomdoctor diagnose`` of a small fixture (best of 5) and ``python -X importtime`` (no torch / vllm import).

It prints the table and writes bench/out/results.json. Targets (issue 13): diagnose <= 1.5x grep -c -E on both
logs and <= 1.5x zcat | grep -c -E on the .gz, same classification as expected, peak RSS < 100 MB, small log
< 0.3 s.

Usage:
  python bench/bench_diagnose.py [--size-mb 420] [--repeat 3] [--rebuild]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from make_logs import FIX, OUT, ensure_all, ensure_gz  # noqa: E402

TARGET_RATIO = 1.5
TARGET_RSS_MB = 100.0
TARGET_SMALL_S = 0.3


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc; children files where the kernel has them, else a /proc scan)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _kib(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for ln in f:
                if ln.startswith(key):
                    return int(ln.split()[1])
    except OSError:
        pass
    return 0


class TreeMemory(threading.Thread):
    """Samples the process tree of ``pid`` every 20 ms: the peak of the summed RSS and of the summed PSS, in MB."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.rss_mb, self.pss_mb, self.stop = pid, 0.0, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            procs = _tree(self.pid)
            self.rss_mb = max(self.rss_mb, sum(_kib(f"/proc/{p}/status", "VmRSS:") for p in procs) / 1024)
            self.pss_mb = max(self.pss_mb, sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in procs) / 1024)
            self.stop.wait(0.02)


def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; wall time, exit code, stdout, the peak RSS from wait4 (the child and the children it waited for,
    e.g. diagnose's grep and workers: ru_maxrss is the largest of them), and the tree's peak summed RSS and PSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        mem = TreeMemory(p.pid)
        mem.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        mem.stop.set()
        mem.join()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "rc": p.returncode, "maxrss_mb": ru.ru_maxrss / 1024,
                "tree_rss_mb": mem.rss_mb, "tree_pss_mb": mem.pss_mb,
                "cpu_s": ru.ru_utime + ru.ru_stime,          # of it and its children (grep, zcat)
                "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def repeat(cmd: list[str], n: int, env: dict | None = None) -> dict:
    runs = [run_measured(cmd, env) for _ in range(n)]
    walls = [r["wall_s"] for r in runs]
    last = runs[-1]
    return {"walls_s": [round(w, 3) for w in walls], "median_s": round(statistics.median(walls), 3),
            "min_s": round(min(walls), 3), "maxrss_mb": round(max(r["maxrss_mb"] for r in runs), 1),
            "rc": last["rc"], "stdout": last["stdout"], "stderr": last["stderr"]}


def ere_escape(s: str) -> str:
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", s)


def rule_anchors() -> list[str]:
    """The literal every rule pattern needs (and the engines' detection strings): what diagnose's
    prefilter looks for, taken from the same rules (``oomdoctor.diagnose.rules.anchors_of``)."""
    sys.path.insert(0, str(ROOT))
    from oomdoctor.diagnose.rules import anchors_of, default_rules
    rs = default_rules()
    return sorted(a.decode() for a in anchors_of(rs.rules, rs.engines.values()))


def check_diagnosis(stdout: str, meta: dict) -> dict:
    try:
        d = json.loads(stdout)
    except ValueError:
        return {"ok": False, "why": "no JSON on stdout"}
    cls = d["classification"]["class"]
    root = next((e for e in d["evidence"] if e.get("role") == "root"), d["evidence"][0] if d["evidence"] else {})
    ok = cls == meta["expected_class"] and root.get("line") == meta["expected_root_line"]
    return {"ok": ok, "class": cls, "root_line": root.get("line"), "lines_seen": d["source"].get("lines"),
            "sha256": d["source"].get("sha256")}


def importtime_check(py: str, small: Path) -> dict:
    r = subprocess.run([py, "-X", "importtime", "-m", "oomdoctor", "diagnose", str(small), "--no-card",
                        "--no-device", "--json"], capture_output=True, text=True, cwd=ROOT)
    mods = []
    for ln in r.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", ln)
        if m:
            mods.append((m.group(4), int(m.group(2)), len(m.group(3))))
    names = {m[0] for m in mods}
    heavy = sorted(n for n in names if n.split(".")[0] in ("torch", "vllm", "numpy", "transformers", "triton", "pynvml", "rich"))
    top = sorted((m for m in mods if m[2] == 1), key=lambda m: -m[1])[:6]
    return {"modules": len(names), "forbidden": sorted(n for n in heavy if n.split(".")[0] in ("torch", "vllm")),
            "heavy_seen": heavy, "top_level_us": {n: us for n, us, _ in top}, "rc": r.returncode}


def _summary(runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    return {"walls_s": [round(w, 3) for w in walls], "median_s": round(statistics.median(walls), 3),
            "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 2),
            "maxrss_mb": round(max(r["maxrss_mb"] for r in runs), 1), "rc": runs[-1]["rc"],
            "tree_rss_mb": round(max(r.get("tree_rss_mb", 0) for r in runs), 1),
            "tree_pss_mb": round(max(r.get("tree_pss_mb", 0) for r in runs), 1),
            "stdout": runs[-1]["stdout"]}


def measure_log(path: Path, meta: dict, pattern: str, tools: dict, n: int, env: dict, gz: bool = False) -> dict:
    """The baselines and diagnose, run in turns (baseline, diagnose, baseline, ...) so that a change of the load of
    a shared machine falls on both alike; medians of ``n``."""
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)     # warm the page cache
    cmds = {}
    if gz:
        cmds["zcat | grep -c -E"] = ["sh", "-c", f"zcat '{path}' | {tools['grep']} -c -E \"$P\""]
    else:
        cmds["grep -c -E"] = [tools["grep"], "-c", "-E", pattern, str(path)]
        if tools["rg"]:
            cmds["rg -c"] = [tools["rg"], "-c", "--no-config", "-a", pattern, str(path)]
    cmds["diagnose"] = [sys.executable, "-m", "oomdoctor", "diagnose", str(path), "--no-card", "--no-device", "--json"]
    cmds["diagnose, one process"] = cmds["diagnose"]
    runs: dict[str, list[dict]] = {k: [] for k in cmds}
    for _ in range(n):
        for k, cmd in cmds.items():
            extra = {"OOMDOCTOR_JOBS": "1"} if k == "diagnose, one process" else {}
            runs[k].append(run_measured(cmd, dict(env, P=pattern, PYTHONDONTWRITEBYTECODE="1", **extra)))
    d = _summary(runs.pop("diagnose"))
    one = _summary(runs.pop("diagnose, one process"))
    size_mb = meta["size_bytes"] / 1e6                 # of the log itself (decompressed for the .gz)
    out = {"log": str(path), "size_mb": round(size_mb, 1), "file_mb": round(path.stat().st_size / 1e6, 1), "lines": meta["lines"], "stats_lines": meta["stats_lines"],
           "diagnose": {k: d[k] for k in ("median_s", "walls_s", "cpu_s", "maxrss_mb", "tree_rss_mb", "tree_pss_mb", "rc")},
           "one_process": {k: one[k] for k in ("median_s", "walls_s", "cpu_s", "maxrss_mb", "tree_pss_mb", "rc")},
           "baselines": {}}
    out["diagnose"].update(mb_per_s=round(size_mb / d["median_s"], 1), **check_diagnosis(d["stdout"], meta))
    out["one_process"].update(same_output=one["stdout"] == d["stdout"], **check_diagnosis(one["stdout"], meta))
    for k, rs in runs.items():
        b = _summary(rs)
        out["baselines"][k] = {"median_s": b["median_s"], "walls_s": b["walls_s"], "cpu_s": b["cpu_s"],
                               "count": b["stdout"].strip(),
                               "ratio": round(d["median_s"] / b["median_s"], 2) if b["median_s"] else None,
                               "one_process_ratio": round(one["median_s"] / b["median_s"], 2) if b["median_s"] else None,
                               "cpu_ratio": round(d["cpu_s"] / b["cpu_s"], 2) if b["cpu_s"] else None}
    return out


def small_log(env: dict) -> dict:
    small = FIX / "A_fail.log"
    cmd = [sys.executable, "-m", "oomdoctor", "diagnose", str(small), "--no-card", "--no-device", "--json"]
    run_measured(cmd, env)                                       # warm (bytecode, page cache)
    s = repeat(cmd, 5, env)
    return {"cmd": " ".join(cmd[1:]), "best_s": s["min_s"], "median_s": s["median_s"], "maxrss_mb": s["maxrss_mb"],
            "importtime": importtime_check(sys.executable, small)}


def print_table(res: dict) -> None:
    print(f"\n{res['host']['cpus']} CPUs, load average before: {res['host']['loadavg']}; medians of {res['repeat']} runs")
    print(f"{'log':<14}{'MB':>6} {'diagnose':>9} {'MB/s':>6} {'PSS MB':>7}  {'baseline':<20}{'time':>7} {'ratio':>6}"
          f" {'CPU ratio':>9}  {'1 process':>9} {'ratio':>6}  class")
    for name, r in res["logs"].items():
        d, one = r["diagnose"], r["one_process"]
        for i, (k, b) in enumerate(r["baselines"].items()):
            head = (f"{name:<14}{r['size_mb']:>6.0f} {d['median_s']:>8.2f}s {d['mb_per_s']:>6.0f} {d['tree_pss_mb']:>7.1f}"
                    if i == 0 else " " * 46)
            print(f"{head}  {k:<20}{b['median_s']:>6.2f}s {b['ratio']:>5.2f}x {b['cpu_ratio']:>8.2f}x  "
                  f"{one['median_s']:>8.2f}s {b['one_process_ratio']:>5.2f}x  "
                  + (f"{d.get('class')} {'ok' if d.get('ok') else 'WRONG'}"
                     f"{'' if one.get('same_output') else ' (1-process output DIFFERS)'}" if i == 0 else ""))
    if not res["tools"]["rg"]:
        print("rg (ripgrep) is not installed: no rg -c column")
    s = res["small_log"]
    print(f"small log (A_fail.log): best of 5 {s['best_s']:.3f} s; torch/vllm imported: "
          f"{', '.join(s['importtime']['forbidden']) or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=420, help="size of each built log in MB (default 420)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--results", type=Path, default=OUT / "results.json")
    a = ap.parse_args()
    tools = {"grep": shutil.which("grep"), "rg": shutil.which("rg")}
    if not tools["grep"]:
        print("bench: no grep on PATH", file=sys.stderr)
        return 2
    env = dict(os.environ, LC_ALL="C")
    env.pop("OOMDOCTOR_NO_GREP", None)
    metas = ensure_all(a.size_mb, a.rebuild)
    gz = ensure_gz(OUT / "stats.log", a.rebuild)
    pattern = "|".join(ere_escape(x) for x in rule_anchors())
    res: dict = {"when": dt.datetime.now().isoformat(timespec="seconds"), "repeat": a.repeat, "tools": tools,
                 "host": {"cpus": os.cpu_count(), "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                          "python": sys.version.split()[0]},
                 "anchors": pattern.count("|") + 1, "logs": {}}
    for name, path, meta, is_gz in (("serving.log", OUT / "serving.log", metas["serving"], False),
                                    ("stats.log", OUT / "stats.log", metas["stats"], False),
                                    ("stats.log.gz", gz, metas["stats"], True)):
        print(f"timing {name} ...", flush=True)
        res["logs"][name] = measure_log(path, meta, pattern, tools, a.repeat, env, gz=is_gz)
    res["small_log"] = small_log(env)
    res["targets"] = {
        "ratio_le_1_5": all(list(r["baselines"].values())[0]["ratio"] <= TARGET_RATIO for r in res["logs"].values()),
        "rss_lt_100mb": all(max(r["diagnose"]["maxrss_mb"], r["diagnose"]["tree_pss_mb"]) < TARGET_RSS_MB
                            for r in res["logs"].values()),
        "diagnosis_correct": all(r["diagnose"].get("ok") and r["one_process"].get("same_output")
                                 for r in res["logs"].values()),
        "small_lt_0_3s": res["small_log"]["best_s"] < TARGET_SMALL_S,
        "no_torch_vllm_import": not res["small_log"]["importtime"]["forbidden"],
    }
    a.results.parent.mkdir(parents=True, exist_ok=True)
    a.results.write_text(json.dumps(res, indent=1))
    print_table(res)
    print("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in res["targets"].items()))
    print(f"results: {a.results}")
    return 0 if all(res["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
