"""Runs one offline vLLM start and the recorded requests, in its own process (it imports vllm).

    python -m oomdoctor.retest.engine_runner MODEL 'JSON_LLM_KWARGS' 'JSON_REQUESTS'

JSON_REQUESTS: {"prompt_tokens": 8, "max_tokens": 16, "count": 1, "concurrency": 1, "seed": 0}
Prints ``OOMDOCTOR_READY {...}`` once the engine is up and ``OOMDOCTOR_RESULT {...}`` with the
performance figures after the requests; exits 0 only when every request was served.
"""
from __future__ import annotations

import json
import random
import sys
import time


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    model, kwargs, req = argv[0], json.loads(argv[1]), json.loads(argv[2] if len(argv) > 2 else "{}")
    print(f"OOMDOCTOR_INVOCATION LLM(model={model!r}, **{kwargs!r}); requests={req}", flush=True)
    t0 = time.time()
    from vllm import LLM, SamplingParams  # noqa: PLC0415

    llm = LLM(model=model, **kwargs)
    ready_s = time.time() - t0
    print("OOMDOCTOR_READY " + json.dumps({"engine_ready_s": round(ready_s, 2)}), flush=True)
    try:
        from vllm import TokensPrompt  # noqa: PLC0415
    except ImportError:  # pragma: no cover - older vLLM
        from vllm.inputs import TokensPrompt  # type: ignore  # noqa: PLC0415
    rng = random.Random(req.get("seed", 0))
    n = int(req.get("count", 1))
    plen = int(req.get("prompt_tokens", 8))
    vocab = int(req.get("vocab", 32000))
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(3, vocab) for _ in range(plen)]) for _ in range(n)]
    sp = SamplingParams(max_tokens=int(req.get("max_tokens", 16)), temperature=float(req.get("temperature", 0.0)),
                        ignore_eos=True, seed=req.get("seed", 0))
    t1 = time.time()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    gen_s = time.time() - t1
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    ttfts, lats = [], []
    for o in outs:
        m = getattr(o, "metrics", None)
        if m is None:
            continue
        ftl = getattr(m, "first_token_latency", None)          # vLLM V1 RequestStateStats (0.25.x)
        if ftl:
            ttfts.append(float(ftl))
        first = getattr(m, "first_token_time", None)            # older RequestMetrics
        arrival = getattr(m, "arrival_time", None)
        last = getattr(m, "last_token_time", None)
        if first and arrival and not ftl:
            ttfts.append(first - arrival)
        if last and arrival:
            lats.append(last - arrival)
    result = {"requests": n, "served": len(outs), "output_tokens": toks, "generate_s": round(gen_s, 3),
              "output_tokens_per_s": round(toks / gen_s, 2) if gen_s > 0 else None,
              "ttft_p50_s": _pct(ttfts, 50), "latency_p50_s": _pct(lats, 50) or (round(gen_s, 3) if n == 1 else None),
              "latency_p99_s": _pct(lats, 99), "engine_ready_s": round(ready_s, 2)}
    print("OOMDOCTOR_RESULT " + json.dumps(result), flush=True)
    return 0 if len(outs) == n and all(len(o.outputs[0].token_ids) > 0 for o in outs) else 1


if __name__ == "__main__":
    sys.exit(main())
