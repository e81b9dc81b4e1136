"""A stand-in engine for ladder tests on machines without a GPU: a process TREE (a parent and a child in the same
process group, as vLLM's front end and EngineCore) that replays a REAL vLLM log depending on the free memory
the ladder gives it.

    python tests/fake_ladder_engine.py --threshold BYTES --pass-log D_pass.log --fail-log D_fail.log
           [--free BYTES] [--pids FILE] [--calls FILE]

The free memory is --free, else env OOMDOCTOR_LADDER_FREE_BYTES (what `oomdoctor ladder` sets for each rung).
free >= threshold: replays --pass-log, prints OOMDOCTOR_RESULT (every request served), exit 0; else replays
--fail-log, exit 1. Every free value it was started with is appended to --calls (to check that no rung runs twice).
With env FAKE_LADDER_HANG_AFTER=N it hangs (replays a few lines, then sleeps) once --calls holds N starts already,
so that a test can interrupt a ladder in the middle of a rung.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threshold", type=int, required=True)
ap.add_argument("--pass-log", required=True)
ap.add_argument("--fail-log", required=True)
ap.add_argument("--free", type=int, default=None)
ap.add_argument("--pids", default=None)
ap.add_argument("--calls", default=None)
a, _ = ap.parse_known_args()

free = a.free if a.free is not None else int(os.environ.get("OOMDOCTOR_LADDER_FREE_BYTES", "-1"))
child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
if a.pids:
    with open(a.pids, "a") as f:
        f.write(f"{os.getpid()}\n{child.pid}\n")
hang_after = os.environ.get("FAKE_LADDER_HANG_AFTER")
if hang_after is not None and a.calls:
    done = len(open(a.calls).read().split()) if os.path.exists(a.calls) else 0
    if done >= int(hang_after):
        print("INFO 11-29 15:10:22 [model.py:1776] Using max model len 32768", flush=True)
        while True:
            time.sleep(1)
if a.calls:
    with open(a.calls, "a") as f:
        f.write(f"{free}\n")
ok = free >= a.threshold
with open(a.pass_log if ok else a.fail_log, encoding="utf-8", errors="replace") as f:
    for line in f:
        if not line.startswith("# "):
            sys.stdout.write(line)
sys.stdout.flush()
if ok:
    print("OOMDOCTOR_RESULT " + json.dumps({"requests": 1, "served": 1, "output_tokens": 16, "output_tokens_per_s": 100.0,
                                            "latency_p50_s": 0.16}), flush=True)
child.kill()
child.wait()
sys.exit(0 if ok else 1)
