#!/usr/bin/env python3
"""Build the benchmark's logs into bench/out/ (ignored by git), from the line shapes of the real vLLM 0.25.1
fixtures in fixtures/logs/vllm-0.25.1-h200/:

  serving.log  a quiet serving log: the real start-up of `vllm serve`, days of uvicorn access lines at a load that
               follows the time of day, one stats line every 10 s (0.6 % of the lines hold a rule anchor), the
               real shutdown, and a restart that fails like A_fail.log (kv_capacity, root at a known line);
  stats.log    a stats-heavy serving log: half of the lines are the periodic stats line (as with
               VLLM_LOG_STATS_INTERVAL lowered, or a quiet server with --disable-log-requests), the other half
               access lines and request lines; KV pressure now and then, `Preemptions: N` on some stats lines
               (0.25 prints it when non-zero); ends like serving.log with the failing restart;
  stats.log.gz the same, gzipped (level 6).

Usage: python bench/make_logs.py [--size-mb 420] [--rebuild]
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
OUT = ROOT / "bench" / "out"
GEN_VERSION = 2
TS_RE = re.compile(rb"\b\d\d-\d\d \d\d:\d\d:\d\d\b")
API = b"(APIServer pid=4392) "
STATS = (API + b"INFO %s [loggers.py:273] Engine 000: Avg prompt throughput: %.1f tokens/s, "
         b"Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, %s"
         b"GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%\n")
# vLLM's RequestLogger / AsyncLLM request lines, in the wording of vLLM 0.25 (no rule anchor in them)
RECEIVED = (API + b"INFO %s [logger.py:49] Received request cmpl-%032x-0: params: SamplingParams(n=1, "
            b"presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, top_p=1.0, "
            b"top_k=0, min_p=0.0, seed=None, stop=[], max_tokens=%d, min_tokens=0), prompt_token_ids: None, "
            b"prompt_embeds shape: None, lora_request: None.\n")
ADDED = API + b"INFO %s [async_llm.py:343] Added request cmpl-%032x-0.\n"
ACCESS = API + b'INFO:     127.0.0.1:%d - "POST /v1/completions HTTP/1.1" 200 OK\n'


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


def _tail(now: dt.datetime) -> tuple[list[bytes], int]:
    """The real shutdown block and the failing restart (A_fail.log); the index of the root line in it."""
    serve = _engine_lines("Eserve_pass.log")
    shut_from = next(i for i, ln in enumerate(serve) if b"[shutdown] EngineCore: trigger received" in ln)
    shutdown = [ln for ln in serve[shut_from:] if ln.startswith(b"(")]
    fail = _engine_lines("A_fail.log")
    root_idx = next(i for i, ln in enumerate(fail) if b"ValueError: To serve at least one request" in ln)
    return _retime(shutdown, now) + _retime(fail, now + dt.timedelta(minutes=2)), len(shutdown) + root_idx


def build_stats_log(path: Path, size_bytes: int, seed: int = 0) -> dict:
    """Half stats lines, half access and request lines; ends with the failing restart."""
    rnd = random.Random(seed)
    serve = _engine_lines("Eserve_pass.log")
    start_end = next(i for i, ln in enumerate(serve) if b"Application startup complete." in ln) + 1
    now = dt.datetime(2026, 11, 29, 15, 19, 1)
    t0 = time.perf_counter()
    tmp = path.with_suffix(path.suffix + ".part")
    n_lines = n_stats = 0
    with open(tmp, "wb", buffering=8 << 20) as f:
        block = [ln + b"\n" for ln in _retime(serve[:start_end], now - dt.timedelta(seconds=48))]
        f.write(b"".join(block))
        written, n_lines = sum(map(len, block)), len(block)
        budget = size_bytes - 40_000
        while written < budget:
            out = []
            for _ in range(512):
                ts = now.strftime("%m-%d %H:%M:%S").encode()
                hot = rnd.random() < 0.03
                running = rnd.randint(0, 64)
                pre = b"Preemptions: %d, " % rnd.randint(1, 20) if hot and rnd.random() < 0.3 else b""
                kv = rnd.uniform(95.0, 99.9) if hot else min(94.9, max(0.0, running * 1.4 + rnd.uniform(-5, 5)))
                out.append(STATS % (ts, rnd.uniform(500, 40000), rnd.uniform(50, 3000), running,
                                    rnd.randint(1, 40) if hot else 0, pre, kv, rnd.uniform(0, 60)))
                r = rnd.random()
                rid = rnd.getrandbits(128)
                out.append(ACCESS % rnd.randint(32768, 60999) if r < 0.5 else
                           RECEIVED % (ts, rid, rnd.randint(16, 4096)) if r < 0.75 else ADDED % (ts, rid))
                now += dt.timedelta(seconds=1)
            blob = b"".join(out)
            f.write(blob)
            written += len(blob)
            n_lines += len(out)
            n_stats += len(out) // 2
        tail, root_at = _tail(now)
        root_line = n_lines + root_at + 1
        blob = b"".join(ln + b"\n" for ln in tail)
        f.write(blob)
        written += len(blob)
        n_lines += len(tail)
    os.replace(tmp, path)
    return {"path": str(path), "size_bytes": written, "lines": n_lines, "stats_lines": n_stats,
            "expected_class": "kv_capacity", "expected_root_line": root_line, "seed": seed,
            "gen_version": GEN_VERSION, "build_s": round(time.perf_counter() - t0, 2)}


def ensure(path: Path, size_bytes: int, build, rebuild: bool) -> dict:
    meta_path = path.with_suffix(".meta.json")
    if not rebuild and path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if (meta.get("gen_version") == GEN_VERSION and meta.get("size_bytes") == path.stat().st_size
                and meta.get("requested_bytes") == size_bytes):
            return dict(meta, reused=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(build(path, size_bytes), requested_bytes=size_bytes)
    meta_path.write_text(json.dumps(meta, indent=1))
    return dict(meta, reused=False)


def ensure_gz(path: Path, rebuild: bool) -> Path:
    gz = path.with_name(path.name + ".gz")
    if rebuild or not gz.exists() or gz.stat().st_mtime < path.stat().st_mtime:
        with open(path, "rb") as src, gzip.open(gz.with_suffix(".part"), "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        os.replace(gz.with_suffix(".part"), gz)
    return gz


def ensure_all(size_mb: int, rebuild: bool = False) -> dict:
    size = size_mb * 1_000_000
    return {"serving": ensure(OUT / "serving.log", size, build_log, rebuild),
            "stats": ensure(OUT / "stats.log", size, build_stats_log, rebuild)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=420, help="size of each log in MB (default 420)")
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args()
    metas = ensure_all(a.size_mb, a.rebuild)
    ensure_gz(OUT / "stats.log", a.rebuild)
    for name, m in metas.items():
        print(f"{name}: {m['path']} {m['size_bytes'] / 1e6:.0f} MB, {m['lines']:,} lines, {m['stats_lines']:,} stats lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
