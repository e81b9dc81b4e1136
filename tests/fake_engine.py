"""A stand-in engine for retest tests on machines without a GPU: a process TREE (a parent and a child
in the same process group, as vLLM's front end and EngineCore) that replays a REAL vLLM log.

    python tests/fake_engine.py --pids FILE --fail-log A_fail.log --pass-log A_pass.log
           [--threshold 32768] [--max-model-len N] [--hang] [--hang-after N] [--crash-after N]
           [--require-env VAR=VALUE]

It replays --pass-log and prints OOMDOCTOR_RESULT (exit 0) when --max-model-len <= --threshold,
else replays --fail-log (exit 1). With --hang it replays the first lines and then sleeps forever
(so the caller must end the group); --hang-after N hangs after N lines (0: before any). --crash-after N
replays N lines of the log it would replay and then dies by SIGKILL, printing nothing more (as a process the
kernel killed). --require-env VAR=VALUE: without that variable the engine fails as vLLM 0.25.1 does without
FlashInfer when VLLM_USE_FLASHINFER_SAMPLER=0 is missing — the log's lines up to the sampler, then
``ModuleNotFoundError: No module named 'flashinfer'`` and the front end's cascade. Every pid of the tree is
appended to --pids. --fail-with LINE: 20 lines of the log, then LINE as the engine core's error, exit 1.
"""
import argparse
import json
import os
import signal
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
ap.add_argument("--hang-after", type=int, default=None)
ap.add_argument("--crash-after", type=int, default=None)
ap.add_argument("--require-env", default=None)
ap.add_argument("--fail-with", default=None)
a, _ = ap.parse_known_args()
if a.hang and a.hang_after is None:
    a.hang_after = 16

child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
with open(a.pids, "a") as f:
    f.write(f"{os.getpid()}\n{child.pid}\n")
ok = a.max_model_len is not None and a.max_model_len <= a.threshold
src = a.pass_log if ok else a.fail_log
with open(src, encoding="utf-8", errors="replace") as f:
    lines = [ln for ln in f if not ln.startswith("# ")]

def import_error(lines: list) -> None:
    """The run without the env the log names: up to the sampler's line, then the import error and the cascade."""
    for line in lines:
        if "topk_topp_sampler" in line:
            break
        sys.stdout.write(line)
    pre = "(EngineCore pid=%d) ERROR 11-29 15:05:42 [core.py:1231] " % os.getpid()
    for t in ("EngineCore failed to start.", "Traceback (most recent call last):",
              '  File "/root/site/vllm/v1/sample/ops/topk_topp_sampler.py", line 41, in __init__',
              "    import flashinfer  # noqa: F401", "ModuleNotFoundError: No module named 'flashinfer'"):
        sys.stdout.write(pre + t + "\n")
    sys.stdout.write("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    sys.stdout.flush()
    child.kill()
    sys.exit(1)


if a.fail_with:                                  # 20 lines of the log, then the engine core's error line
    sys.stdout.write("".join(lines[:20]))
    sys.stdout.write("(EngineCore pid=%d) ERROR 11-29 15:05:42 [core.py:1231] %s\n" % (os.getpid(), a.fail_with))
    sys.stdout.flush()
    child.kill()
    sys.exit(1)
if a.require_env:
    var, _, val = a.require_env.partition("=")
    if os.environ.get(var) != val:
        import_error(lines)
for i, line in enumerate(lines):
    if a.hang_after is not None and i >= a.hang_after:
        sys.stdout.flush()
        while True:
            time.sleep(1)
    if a.crash_after is not None and i >= a.crash_after:
        sys.stdout.flush()
        child.kill()
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdout.write(line)
sys.stdout.flush()
if ok:
    print("OOMDOCTOR_RESULT " + json.dumps({"requests": 1, "served": 1, "output_tokens": 16, "output_tokens_per_s": 100.0,
                                            "latency_p50_s": 0.16}), flush=True)
child.kill()
child.wait()
sys.exit(0 if ok else 1)
