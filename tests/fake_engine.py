"""A stand-in engine for retest tests on machines without a GPU: a process TREE (a parent and a child
in the same process group, as vLLM's front end and EngineCore) that replays a REAL vLLM log.

    python tests/fake_engine.py --pids FILE --fail-log A_fail.log --pass-log A_pass.log
           [--threshold 32768] [--max-model-len N] [--hang]

It replays --pass-log and prints OOMDOCTOR_RESULT (exit 0) when --max-model-len <= --threshold,
else replays --fail-log (exit 1). With --hang it replays the first lines and then sleeps forever
(so the caller must end the group). Every pid of the tree is appended to --pids.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--pids", required=True)
ap.add_argument("--fail-log", required=True)
ap.add_argument("--pass-log", required=True)
ap.add_argument("--threshold", type=int, default=32768)
ap.add_argument("--max-model-len", type=int, default=None)
ap.add_argument("--hang", action="store_true")
a, _ = ap.parse_known_args()

child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
with open(a.pids, "a") as f:
    f.write(f"{os.getpid()}\n{child.pid}\n")
ok = a.max_model_len is not None and a.max_model_len <= a.threshold
src = a.pass_log if ok else a.fail_log
with open(src, encoding="utf-8", errors="replace") as f:
    lines = [ln for ln in f if not ln.startswith("# ")]
for i, line in enumerate(lines):
    sys.stdout.write(line)
    if a.hang and i > 15:
        sys.stdout.flush()
        while True:
            time.sleep(1)
sys.stdout.flush()
if ok:
    print("OOMDOCTOR_RESULT " + json.dumps({"requests": 1, "served": 1, "output_tokens": 16, "output_tokens_per_s": 100.0,
                                            "latency_p50_s": 0.16}), flush=True)
child.kill()
child.wait()
sys.exit(0 if ok else 1)
