#!/usr/bin/env python3
"""The full ``diagnose --json`` output of one code tree on many logs, and a key-for-key comparison of two such runs.

  python bench/compare_json.py run  OUT.json [--code DIR] [LOG ...]   # default logs: every fixture + the bench logs
  python bench/compare_json.py diff A.json B.json                     # exit 1 when any log's output differs

``run`` starts ``python -m oomdoctor diagnose LOG --no-card --no-device --json`` with its working directory at
``--code`` (default: this checkout), so an older tree (``git archive <rev> | tar -x -C DIR``) can be measured the
same way. The outputs are compared whole, after dropping nothing but the log's path (the same log is given by the
same path to both runs, so even that is kept) — any difference in classification, evidence, numbers, timeline,
engine, notes or exit code is reported, key by key.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_LOGS = ["bench/out/serving.log", "bench/out/stats.log", "bench/out/stats.log.gz"]


def default_logs() -> list[str]:
    fixtures = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures" / "logs").rglob("*")
                      if p.is_file() and p.suffix not in (".md", ".py", ".yaml"))
    return fixtures + [b for b in BENCH_LOGS if (ROOT / b).exists()]


def run(out: Path, code: Path, logs: list[str]) -> None:
    results = {}
    for log in logs:
        p = subprocess.run([sys.executable, "-m", "oomdoctor", "diagnose", str(ROOT / log), "--no-card",
                            "--no-device", "--json"], cwd=code, capture_output=True, text=True)
        try:
            body = json.loads(p.stdout) if p.stdout.strip() else None
        except json.JSONDecodeError:
            body = {"unparsed stdout": p.stdout}
        results[log] = {"rc": p.returncode, "json": body, "stderr": p.stderr.strip()[-2000:] if p.returncode else ""}
        print(f"{log}: rc {p.returncode}", file=sys.stderr)
    out.write_text(json.dumps(results, indent=1, sort_keys=True))


def differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'B' if k not in a else 'A'}")
            else:
                out.extend(differences(a[k], b[k], f"{where}.{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {repr(a)[:300]} vs {repr(b)[:300]}"]


def diff(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    bad = 0
    for log in sorted(set(a) | set(b)):
        if log not in a or log not in b:
            print(f"{log}: only in {'B' if log not in a else 'A'}")
            bad += 1
            continue
        ds = differences(a[log], b[log])
        if ds:
            bad += 1
            print(f"{log}: {len(ds)} difference(s)")
            for d in ds[:20]:
                print("   ", d)
    print(f"{len(set(a) & set(b))} logs compared, {bad} differ")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--code", type=Path, default=ROOT)
    r.add_argument("logs", nargs="*")
    d = sub.add_parser("diff")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.out, args.code, args.logs or default_logs())
        return 0
    return diff(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
