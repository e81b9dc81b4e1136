"""The warm-up after a pinned KV arena, which vLLM does not profile: measured on the H200 (tools/gpu/warmup_probe.py,
incidents/h200-retest-2026-12-02-afternoon/probe/) and checked against every real start of the kit's Llama that ran
it: W1 (served, 1024 dummy requests: ran out; 256: passed), F1b_pass (offline, 1024: passed) and G1 after
enforce_eager (served, the same memory as F1b_pass: ran out at the edge the prediction names)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomdoctor.engines.vllm import memory as M
from oomdoctor.levers.plan import plan

ROOT = Path(__file__).resolve().parents[3]
GPUKIT = ROOT / "fixtures" / "models" / "gpukit-llama-886m"
PROBE = sorted((ROOT / "incidents" / "h200-retest-2026-12-02-afternoon" / "probe").glob("*.jsonl"))
H200 = 150_754_820_096
SHORT_ROPE = {"max_position_embeddings": 32768}     # the kit's hf_overrides: "Model loading took 1.66 GiB"


def _start(free: int, kv: int, mns: int | None, ctx: str, overrides: dict | None) -> dict:
    return plan(str(GPUKIT), H200, free=free, max_model_len=32768, kv_cache_memory_bytes=kv, max_num_seqs=mns,
                enforce_eager=True, hf_overrides=overrides, gpu_memory_utilization=0.02, usage_context=ctx)


def test_the_measured_warm_up_is_what_the_model_allocates() -> None:
    rows = [json.loads(ln) for p in PROBE for ln in p.read_text().splitlines() if ln.strip()]
    assert len(rows) == 8 and {r["runner"] for r in rows} == {"v1", "v2"}
    m = M.describe_model(str(GPUKIT))
    for r in rows:
        start = _start(H200, 2_500_000_000, r["max_num_seqs"], "llm", SHORT_ROPE)
        base = start["weights_bytes"] + start["kv_tokens"] // 16 * 16 * start["kv_bytes_per_token"]
        measured = r["alloc_before"] - base + r["warmup_peak_alloc"]
        n = M.warmup_requests(r["max_num_seqs"], 16384, 10**6, r["runner"] == "v2")
        assert n == r["max_num_seqs"]
        assert abs(M.warmup_bytes(m, n, r["runner"] == "v2") - measured) < 6_000_000, r
        # beside torch's pool the process holds its CUDA context and the non-torch memory, the same at every size
        assert r["total"] - r["free_before"] - r["reserved_before"] == M.NON_TORCH_BYTES + M.CUDA_CONTEXT_BYTES


@pytest.mark.parametrize("name, free, kv, mns, ctx, overrides, fits, edge", [
    ("W1 1024", 5_401_346_048, 2_500_000_000, 1024, "serve", SHORT_ROPE, False, True),     # ran out
    ("W1 256", 5_401_346_048, 2_500_000_000, 256, "serve", SHORT_ROPE, True, True),       # passed, 127 MiB
    ("F1b_pass", 8_591_114_240, 4_400_000_000, None, "llm", None, True, True),            # passed, 110 MiB
    ("G1 eager", 8_591_114_240, 4_400_000_000, 1024, "serve", None, True, True),          # ran out, 110 MiB
    ("G1 eager 512", 8_591_114_240, 4_400_000_000, 512, "serve", None, True, False),
])
def test_the_real_starts_of_the_warm_up(name, free, kv, mns, ctx, overrides, fits, edge) -> None:
    r = _start(free, kv, mns, ctx, overrides)
    assert r["fits"] is fits, (name, r["failure"])
    if not fits:
        assert r["failure"]["class"] == "sampler_warmup_oom" and r["failure"]["phase"] == "warmup"
    assert r["warmup"]["at_the_edge"] is edge, (name, r["warmup"])


def test_the_warm_up_levers_and_the_edge_in_the_chain(tmp_path: Path) -> None:
    w1 = _start(5_401_346_048, 2_500_000_000, 1024, "serve", SHORT_ROPE)
    assert w1["levers"][0]["id"] == "max_num_seqs" and w1["levers"][0]["predicted"]["fits"]
    assert w1["levers"][0]["change"] == {"max_num_seqs": 256}          # what passed on the H200 (W1's walk)
    from oomdoctor.card.incident import diagnose_log
    card, _, _ = diagnose_log(ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200-morning" / "G1_serve_capture.log",
                              no_card=True, no_device=True, model_dir=GPUKIT)
    eager = next(lv for lv in card["levers"] if lv["id"] == "enforce_eager")
    from oomdoctor.levers.chain import expected_chain
    text = expected_chain(dict(card), eager)["text"]
    assert "the warm-up of 1,024 dummy requests after the pinned arena has" in text and "decides" in text


def test_the_runners_warm_up_requests() -> None:
    assert M.warmup_requests(1024, 8192, 4196, v2_runner=True) == 1024
    assert M.warmup_requests(1024, 512, 4196, v2_runner=True) == 256          # 2-token prompts
    assert M.warmup_requests(1024, 8192, 100, v2_runner=True) == 99           # one block each, null block kept
    assert M.warmup_requests(1024, 512, 100, v2_runner=False) == 512          # V1: min(max_num_seqs, budget)
