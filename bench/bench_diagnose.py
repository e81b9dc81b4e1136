#!/usr/bin/env python3
"""Benchmark `oomdoctor diagnose` on a large, realistic vLLM 0.25.1 serving log.

It BUILDS the log (default bench/out/big.log, >= 1 GiB) from the line shapes of the real
fixtures in fixtures/logs/vllm-0.25.1-h200/, then times, in the same run and on the same
(page-cached) file:

  1. the baseline: ``LC_ALL=C grep -c -E '<the rule anchors, ERE-escaped, joined by |>' big.log``
  2. ``python -m oomdoctor diagnose big.log --no-card --no-device --json`` (grep fast path)
  3. the same with ``--scanner python`` (pure-Python prefilter; a second figure)
  4. ``oomdoctor diagnose`` on a small fixture log (start-up cost), and ``python -X importtime``
     to check that no torch / vllm module is imported.

It prints a table and writes bench/out/results.json. Targets: diagnose <= 3x grep on the big log,
peak RSS of diagnose < 150 MB, small-log diagnose < 0.5 s.

The log: the real start-up of `vllm serve` (Eserve_pass.log, up to "Application startup
complete."), then days of serving in the proportions a real server prints them — uvicorn access
lines of the APIServer (POST /v1/completions and /v1/chat/completions, mostly 200, a few 400s,
/health probes, /metrics scrapes) at a load that varies over the day, and one `loggers.py` stats
line every 10 s (throughput, running/waiting, KV usage, prefix hit rate) — then the real shutdown
block, and at the end a restart that fails: the real A_fail.log sequence (KV capacity: a
4,000,000-token window needs 244.14 GiB of KV cache, 124.52 GiB available). Timestamps advance
through the whole file; numbers vary. Expected diagnosis: kv_capacity, root at a known line.

Usage:
  python bench/bench_diagnose.py                   # build (or reuse) 1 GiB and measure
  python bench/bench_diagnose.py --size-gib 2 --rebuild --repeat 5
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
GEN_VERSION = 1
TS_RE = re.compile(rb"\b\d\d-\d\d \d\d:\d\d:\d\d\b")
TARGET_RATIO = 3.0
TARGET_RSS_MB = 150.0
TARGET_SMALL_S = 0.5


# ----------------------------------------------------------------------------- building the log
def _engine_lines(name: str) -> list[bytes]:
    """The engine's own output of a fixture (the harness's '# ' lines dropped)."""
    return [ln for ln in (FIX / name).read_bytes().split(b"\n") if ln and not ln.startswith(b"# ")]


def _retime(lines: list[bytes], when: dt.datetime) -> list[bytes]:
    ts = when.strftime("%m-%d %H:%M:%S").encode()
    return [TS_RE.sub(ts, ln) for ln in lines]


def build_log(path: Path, size_bytes: int, seed: int = 0) -> dict:
    """Write the big log; return facts about it (lines, expected root line, ...)."""
    rnd = random.Random(seed)
    serve = _engine_lines("Eserve_pass.log")
    start_end = next(i for i, ln in enumerate(serve) if b"Application startup complete." in ln) + 1
    startup = serve[:start_end]
    shut_from = next(i for i, ln in enumerate(serve) if b"[shutdown] EngineCore: trigger received" in ln)
    shutdown = [ln for ln in serve[shut_from:] if ln.startswith(b"(")]
    fail = _engine_lines("A_fail.log")
    root_idx = next(i for i, ln in enumerate(fail) if b"ValueError: To serve at least one request" in ln)

    api = b"(APIServer pid=4392) "
    access_ok = api + b'INFO:     127.0.0.1:%d - "POST /v1/completions HTTP/1.1" 200 OK\n'
    chat_ok = api + b'INFO:     127.0.0.1:%d - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    access_400 = api + b'INFO:     127.0.0.1:%d - "POST /v1/completions HTTP/1.1" 400 Bad Request\n'
    health = api + b'INFO:     127.0.0.1:%d - "GET /health HTTP/1.1" 200 OK\n'
    metrics = api + b'INFO:     127.0.0.1:%d - "GET /metrics HTTP/1.1" 200 OK\n'
    stats = (api + b"INFO %s [loggers.py:273] Engine 000: Avg prompt throughput: %.1f tokens/s, "
             b"Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, "
             b"GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%\n")

    tail = _retime(shutdown, dt.datetime(2026, 12, 31)) + fail
    tail_bytes = sum(len(x) + 1 for x in tail)
    now = dt.datetime(2026, 11, 29, 15, 19, 1)
    port = 32768
    n_lines = 0
    n_stats = 0
    n_access = 0
    t0 = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    with open(tmp, "wb", buffering=8 << 20) as f:
        block = [ln + b"\n" for ln in _retime(startup, now - dt.timedelta(seconds=48))]
        f.write(b"".join(block))
        written = sum(map(len, block))
        n_lines += len(block)
        budget = size_bytes - tail_bytes
        while written < budget:
            # one 10-second stats interval; the load follows the time of day (5-30 requests/s)
            hour = now.hour + now.minute / 60
            rate = 17.5 + 12.5 * math.sin((hour - 9) / 24 * 2 * math.pi)
            n_req = max(1, int(rnd.gauss(rate * 10, rate)))
            out = []
            for _ in range(n_req):
                port = port + rnd.randint(2, 16)
                if port > 60999:
                    port -= 28231
                r = rnd.random()
                tmpl = access_ok if r < 0.78 else chat_ok if r < 0.998 else access_400
                out.append(tmpl % port)
            out.insert(rnd.randrange(len(out) + 1), health % (port + 1))
            if n_stats % 3 == 0:
                out.insert(rnd.randrange(len(out) + 1), metrics % (port + 3))
            running = min(64, max(0, int(n_req * 0.45 + rnd.randint(-3, 3))))
            hot = rnd.random() < 0.03
            waiting = rnd.randint(1, 40) if hot else 0
            kv = rnd.uniform(95.0, 99.9) if hot else min(94.9, max(0.0, running * 1.4 + rnd.uniform(-5, 5)))
            out.append(stats % (now.strftime("%m-%d %H:%M:%S").encode(), rnd.uniform(500, 40000),
                                rnd.uniform(50, 3000), running, waiting, kv, rnd.uniform(0, 60)))
            blob = b"".join(out)
            f.write(blob)
            written += len(blob)
            n_lines += len(out)
            n_access += len(out) - 1
            n_stats += 1
            now += dt.timedelta(seconds=10)
        root_line = n_lines + len(shutdown) + root_idx + 1
        tail = _retime(shutdown, now) + _retime(fail, now + dt.timedelta(minutes=2))
        blob = b"".join(ln + b"\n" for ln in tail)
        f.write(blob)
        written += len(blob)
        n_lines += len(tail)
    os.replace(tmp, path)
    return {"path": str(path), "size_bytes": written, "lines": n_lines, "stats_lines": n_stats,
            "access_lines": n_access, "expected_class": "kv_capacity", "expected_root_line": root_line,
            "expected_root_text": fail[root_idx].decode(), "seed": seed, "gen_version": GEN_VERSION,
            "build_s": round(time.perf_counter() - t0, 2)}


def ensure_log(path: Path, size_gib: float, rebuild: bool) -> dict:
    meta_path = path.with_suffix(".meta.json")
    want = int(size_gib * (1 << 30))
    if not rebuild and path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if (meta.get("gen_version") == GEN_VERSION and meta.get("size_bytes") == path.stat().st_size
                and meta.get("size_bytes", 0) >= want and meta.get("requested_bytes") == want):
            meta["reused"] = True
            return meta
    meta = build_log(path, want)
    meta["requested_bytes"] = want
    meta_path.write_text(json.dumps(meta, indent=1))
    meta["reused"] = False
    return meta


# ----------------------------------------------------------------------------- measuring
def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; wall time, exit code, stdout, and the peak RSS from wait4 (the child and the
    children it waited for, e.g. diagnose's grep: ru_maxrss is the largest of them)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "rc": p.returncode, "maxrss_mb": ru.ru_maxrss / 1024,
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


def explain() -> int:
    lines = (FIX / "Eserve_pass.log").read_bytes().split(b"\n")
    counts = sorted(((sum(x.encode() in ln for ln in lines), x) for x in rule_anchors()), reverse=True)
    total = sum(any(x.encode() in ln for x in rule_anchors()) for ln in lines)
    print(f"{total} of {len(lines)} lines of Eserve_pass.log are prefilter candidates; per literal:")
    for c, x in counts:
        if c:
            print(f"  {c:5d}  {x!r}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0, help="size of the built log (default 1.0)")
    ap.add_argument("--log", type=Path, default=ROOT / "bench" / "out" / "big.log", help="where to build it")
    ap.add_argument("--rebuild", action="store_true", help="rebuild even if a matching log exists")
    ap.add_argument("--repeat", type=int, default=3, help="runs of grep / diagnose on the big log (median)")
    ap.add_argument("--no-python-scanner", action="store_true", help="skip the pure-Python scanner figure")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "out" / "results.json")
    ap.add_argument("--rules", type=Path, default=None,
                    help="rules folder for every run (sets OOMDOCTOR_RULES); default: the checkout's rules/")
    ap.add_argument("--explain", action="store_true",
                    help="only list which anchors / detection strings select lines of the real serving log "
                         "fixtures/.../Eserve_pass.log (the most common first), and exit")
    a = ap.parse_args()
    if a.rules:
        os.environ["OOMDOCTOR_RULES"] = str(a.rules.resolve())
    if a.explain:
        return explain()
    py = sys.executable
    grep = shutil.which("grep")
    if not grep:
        print("bench: no grep on PATH", file=sys.stderr)
        return 2
    env = dict(os.environ, LC_ALL="C")
    env.pop("OOMDOCTOR_NO_GREP", None)

    print(f"building / reusing {a.log} ({a.size_gib} GiB) ...", flush=True)
    meta = ensure_log(a.log, a.size_gib, a.rebuild)
    print(f"  {meta['size_bytes'] / (1 << 30):.2f} GiB, {meta['lines']:,} lines, {meta['stats_lines']:,} stats lines"
          f" ({'reused' if meta['reused'] else 'built in %.1f s' % meta['build_s']})", flush=True)

    anchors = rule_anchors()
    n_anchors = len(anchors)
    pattern = "|".join(ere_escape(x) for x in anchors)
    fixed_file = a.results.parent / "anchors.txt"
    fixed_file.parent.mkdir(parents=True, exist_ok=True)
    fixed_file.write_text("\n".join(anchors) + "\n")
    subprocess.run(["cat", str(a.log)], stdout=subprocess.DEVNULL, check=True)     # warm the page cache
    grep_cmd = [grep, "-c", "-E", pattern, str(a.log)]
    fixed_cmd = [grep, "-c", "-F", "-f", str(fixed_file), str(a.log)]
    diag_cmd = [py, "-m", "oomdoctor", "diagnose", str(a.log), "--no-card", "--no-device", "--json"]

    print("timing grep ...", flush=True)
    g = repeat(grep_cmd, a.repeat, env)
    gf = repeat(fixed_cmd, 1, env)          # the same strings as fixed strings: for reference only
    print("timing oomdoctor diagnose (grep scanner) ...", flush=True)
    d = repeat(diag_cmd, a.repeat, dict(env, PYTHONDONTWRITEBYTECODE="1"))
    d_check = check_diagnosis(d["stdout"], meta)
    p = None
    p_check = None
    if not a.no_python_scanner:
        print("timing oomdoctor diagnose --scanner python ...", flush=True)
        p = repeat(diag_cmd + ["--scanner", "python"], 1, env)
        p_check = check_diagnosis(p["stdout"], meta)

    small = FIX / "A_fail.log"
    small_cmd = [py, "-m", "oomdoctor", "diagnose", str(small), "--no-card", "--no-device", "--json"]
    run_measured(small_cmd, env)                                    # warm (bytecode, page cache)
    s = repeat(small_cmd, 7, env)
    imp = importtime_check(py, small)

    ratio = d["median_s"] / g["median_s"] if g["median_s"] else float("inf")
    p_ratio = (p["median_s"] / g["median_s"]) if p and g["median_s"] else None
    results = {
        "when": dt.datetime.now().isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                 "grep": subprocess.run([grep, "--version"], capture_output=True, text=True).stdout.splitlines()[0]},
        "rules": os.environ.get("OOMDOCTOR_RULES") or str(ROOT / "oomdoctor" / "engines"),
        "log": {k: v for k, v in meta.items() if k != "expected_root_text"},
        "grep": {"cmd": f"LC_ALL=C grep -c -E '<{n_anchors} rule anchors, ERE-escaped, joined by |>' {a.log}",
                 "pattern": pattern, "anchors": n_anchors, "count": int(g["stdout"].strip() or 0),
                 **{k: g[k] for k in ("walls_s", "median_s", "min_s", "maxrss_mb")}},
        "grep_fixed_strings": {"cmd": f"LC_ALL=C grep -c -F -f {fixed_file} {a.log}", "count": int(gf["stdout"].strip() or 0),
                               "wall_s": gf["median_s"]},
        "diagnose": {"cmd": " ".join(diag_cmd[1:]), "rc": d["rc"], **d_check,
                     **{k: d[k] for k in ("walls_s", "median_s", "min_s", "maxrss_mb")},
                     "ratio_to_grep": round(ratio, 2)},
        "diagnose_python_scanner": None if p is None else {
            "cmd": " ".join(diag_cmd[1:] + ["--scanner", "python"]), "rc": p["rc"], **(p_check or {}),
            **{k: p[k] for k in ("walls_s", "median_s", "maxrss_mb")}, "ratio_to_grep": round(p_ratio, 2)},
        "small_log": {"cmd": " ".join(small_cmd[1:]), "rc": s["rc"],
                      **{k: s[k] for k in ("walls_s", "median_s", "min_s", "maxrss_mb")}},
        "importtime": imp,
        "targets": {
            "ratio_le_3": ratio <= TARGET_RATIO,
            "rss_lt_150mb": d["maxrss_mb"] < TARGET_RSS_MB,
            "small_lt_0_5s": s["median_s"] < TARGET_SMALL_S,
            "no_torch_vllm_import": not imp["forbidden"],
            "diagnosis_correct": bool(d_check.get("ok")),
        },
    }
    a.results.parent.mkdir(parents=True, exist_ok=True)
    a.results.write_text(json.dumps(results, indent=1))

    def row(name, val, target="", ok=None):
        mark = "" if ok is None else ("ok" if ok else "MISSED")
        print(f"  {name:<44} {val:>22}  {target:<12} {mark}")

    print()
    print(f"log: {a.log}  {meta['size_bytes'] / (1 << 30):.2f} GiB, {meta['lines']:,} lines; "
          f"{os.cpu_count()} CPUs; medians of {a.repeat} runs (page cache warm)")
    row("grep -c -E <anchors> (baseline)", f"{g['median_s']:.2f} s", "", None)
    share = results["grep"]["count"] / max(meta["lines"], 1)
    row("  lines it counts (prefilter candidates)", f"{results['grep']['count']:,} ({share:.2%})")
    row("  (same strings as grep -c -F -f, 1 run)", f"{gf['median_s']:.2f} s")
    row("oomdoctor diagnose --json (grep scanner)", f"{d['median_s']:.2f} s")
    row("  ratio diagnose / grep", f"{ratio:.2f}x", "<= 3x", ratio <= TARGET_RATIO)
    row("  peak RSS", f"{d['maxrss_mb']:.1f} MB", "< 150 MB", d["maxrss_mb"] < TARGET_RSS_MB)
    row("  diagnosis", f"{d_check.get('class')} @ line {d_check.get('root_line')}",
        f"line {meta['expected_root_line']}", bool(d_check.get("ok")))
    if p:
        row("oomdoctor diagnose --scanner python", f"{p['median_s']:.2f} s")
        row("  ratio to grep / peak RSS", f"{p_ratio:.1f}x / {p['maxrss_mb']:.0f} MB")
        row("  diagnosis", f"{(p_check or {}).get('class')} @ line {(p_check or {}).get('root_line')}", "",
            bool((p_check or {}).get("ok")))
    row("small log (A_fail.log, 110 lines)", f"{s['median_s']:.3f} s (min {s['min_s']:.3f})", "< 0.5 s",
        s["median_s"] < TARGET_SMALL_S)
    row("  torch / vllm imported", ", ".join(imp["forbidden"]) or "none", "none", not imp["forbidden"])
    if share > 0.05:
        print(f"\nWARNING: the rule anchors / detection strings select {share:.0%} of the lines of a serving log; "
              "every candidate line is parsed in Python, so the prefilter no longer saves anything. "
              "Find the too-common literal with: python bench/bench_diagnose.py --explain")
    print(f"\nresults: {a.results}")
    return 0 if all(results["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
