"""Runs where vLLM is installed (the GPU machine: vLLM 0.25.1 in /root/site): every lever's pasted command of
``oomdoctor diagnose --json LOG`` (its ``paste``) read by vLLM's OWN ``vllm serve`` argument parser, and the
parsed values compared with the card's arguments and the lever's change. No engine starts.

Usage: python3 tools/gpu/paste_check.py LOG [LOG ...]      prints one line per lever, exit 1 when any differs.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys


def _parser():
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def _same(parsed, want) -> bool:
    if isinstance(want, bool) or isinstance(parsed, bool):
        return bool(parsed) == bool(want)
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            return float(parsed) == float(want)
        except (TypeError, ValueError):
            return False
    if isinstance(want, list) and not isinstance(parsed, list):
        return [str(parsed)] == [str(x) for x in want]
    return parsed == want or str(parsed) == str(want)


def main(logs: list[str]) -> int:
    parser = _parser()
    bad = 0
    for log in logs:
        d = json.loads(subprocess.run([sys.executable, "-m", "oomdoctor", "diagnose", log, "--no-card", "--no-device",
                                       "--json"], capture_output=True, text=True).stdout)
        wl = d["workload"]
        own = {**(wl.get("launch_args") or {}), **(wl.get("engine_args") or {})}
        for lv in d["levers"]:
            line = next((p for p in lv.get("paste") or [] if p.startswith("vllm serve ")), None)
            if line is None:
                continue
            ns = parser.parse_args(shlex.split(line)[2:])
            want = {**own, **{k: v for k, v in lv["change"].items() if not k.isupper()}}     # not an env variable
            diff = {k: (getattr(ns, k, "<missing>"), v) for k, v in want.items() if not _same(getattr(ns, k, None), v)}
            ok = not diff and ns.model_tag == wl["model"]
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {log.rsplit('/', 1)[-1]} {lv['id']}: {len(want)} arguments"
                  + (f" differ: {diff}" if diff else "") + f" | {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
