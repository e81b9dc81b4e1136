"""A small HTTP client for ``vllm serve`` workloads: wait for /health, send the recorded requests
(OpenAI completions API, streaming, so time to first token is measured), read /metrics.
Only addresses on this machine are used."""
from __future__ import annotations

import http.client
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def wait_ready(port: int, alive: Callable[[], bool], timeout_s: float, host: str = "127.0.0.1") -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not alive():
            return False
        try:
            c = http.client.HTTPConnection(host, port, timeout=2)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return True
        except OSError:
            pass
        time.sleep(1.0)
    return False


def _one(port: int, model: str, i: int, req: dict, host: str) -> dict:
    rng = random.Random(req.get("seed", 0) + i)
    body = {"model": model, "prompt": [rng.randrange(3, int(req.get("vocab", 32000))) for _ in range(int(req.get("prompt_tokens", 8)))],
            "max_tokens": int(req.get("max_tokens", 16)), "temperature": float(req.get("temperature", 0.0)),
            "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    ttft = None
    tokens = 0
    try:
        c = http.client.HTTPConnection(host, port, timeout=float(req.get("timeout_s", 600)))
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return {"status": r.status, "error": r.read(2000).decode(errors="replace"), "latency_s": time.monotonic() - t0}
        done = False
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if line == "data: [DONE]":
                done = True
                continue
            if not line.startswith("data:"):
                continue
            err = stream_error(line[5:])
            if err is not None:
                # vLLM answers 200, then reports a failure inside the stream (serving.py: "data: {error}" then
                # [DONE]): a request whose engine died mid-stream was not served
                return {"status": STREAM_ERROR, "error": err, "latency_s": time.monotonic() - t0}
            if ttft is None:
                ttft = time.monotonic() - t0
            tokens += 1
        if not done:
            return {"status": STREAM_ERROR, "error": "the stream ended without [DONE]", "latency_s": time.monotonic() - t0}
        return {"status": 200, "ttft_s": ttft, "latency_s": time.monotonic() - t0, "chunks": tokens}
    except OSError as e:
        return {"status": -1, "error": str(e), "latency_s": time.monotonic() - t0}


STREAM_ERROR = -2          # HTTP 200, but the stream carried an error or broke off


def stream_error(payload: str) -> str | None:
    """The error a streamed chunk carries (OpenAI's ``{"error": {"message": ...}}``), else None."""
    if '"error"' not in payload:
        return None
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "error" not in obj:
        return None
    err = obj["error"]
    msg = err.get("message") if isinstance(err, dict) else err
    return f"error in the stream: {str(msg)[:280]}"


def _pct(values: list[float | None], p: float) -> float | None:
    xs = sorted(x for x in values if x is not None)
    if not xs:
        return None
    return round(xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 4)


def send(port: int, model: str, req: dict, host: str = "127.0.0.1") -> dict:
    n = int(req.get("count", 1))
    conc = max(1, int(req.get("concurrency", 1)))
    t0 = time.monotonic()
    with ThreadPoolExecutor(conc) as ex:
        res = list(ex.map(lambda i: _one(port, model, i, req, host), range(n)))
    wall = time.monotonic() - t0
    ok = [r for r in res if r["status"] == 200]
    toks = sum(r.get("chunks", 0) for r in ok)
    return {"requests": n, "served": len(ok), "statuses": sorted({r["status"] for r in res}),
            "output_tokens": toks, "wall_s": round(wall, 3),
            "output_tokens_per_s": round(toks / wall, 2) if wall > 0 else None,
            "ttft_p50_s": _pct([r.get("ttft_s") for r in ok], 50), "ttft_p99_s": _pct([r.get("ttft_s") for r in ok], 99),
            "latency_p50_s": _pct([r["latency_s"] for r in ok], 50), "latency_p99_s": _pct([r["latency_s"] for r in ok], 99),
            "errors": [r.get("error", "")[:300] for r in res if r["status"] != 200][:3]}


def metrics(port: int, host: str = "127.0.0.1") -> str | None:
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", "/metrics")
        r = c.getresponse()
        return r.read(20 << 20).decode(errors="replace") if r.status == 200 else None
    except OSError:
        return None


_lock = threading.Lock()
