"""``oomdoctor plan``: the contract's JSON, exit codes, vLLM's defaults, and levers that really fit."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from oomdoctor.engines.vllm import memory as M
from oomdoctor.cli import main
from oomdoctor.levers import plan as P
from oomdoctor.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
GPUKIT = str(ROOT / "fixtures" / "models" / "gpukit-llama-886m")
MODELS = ROOT / "fixtures" / "models"
GIB = 1 << 30
CONTRACT_KEYS = {"fits", "engine", "engine_version", "weights_bytes", "kv_bytes_per_token", "available_kv_bytes",
                 "kv_tokens", "max_concurrency", "max_model_len_that_fits", "levers"}


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(["plan", *args])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_contract_keys_and_types_on_h200():
    r = P.plan(GPUKIT, "h200", max_model_len=32768)
    assert CONTRACT_KEYS <= set(r)
    assert r["engine"] == "vllm" and r["engine_version"] == "0.25.1"
    for k in ("weights_bytes", "kv_bytes_per_token", "available_kv_bytes", "kv_tokens", "max_model_len_that_fits"):
        assert isinstance(r[k], int) and not isinstance(r[k], bool), k
    assert isinstance(r["max_concurrency"], float) and isinstance(r["levers"], list)
    assert r["fits"] is True and r["levers"] == [] and r["failure"] is None
    assert r["kv_bytes_per_token"] == 65_536
    assert r["weights_bytes"] == 1_772_228_608 + 1_024_000_000
    json.dumps(r)   # serialisable as is


def test_defaults_follow_vllm_0_25_1():
    r = P.plan(GPUKIT, "h200")
    s = r["settings"]
    assert s["gpu_memory_utilization"] == 0.92
    assert s["max_model_len"] == 4_000_000 and "max_position_embeddings" in s["max_model_len_source"]
    assert (s["max_num_batched_tokens"], s["max_num_seqs"]) == (8192, 1024)        # vllm serve on an H200
    assert s["kv_cache_dtype"] == "auto" and s["block_size"] == 16 and s["model_runner"] == "v2"
    llm = P.plan(GPUKIT, "h200", usage_context="llm")["settings"]
    assert (llm["max_num_batched_tokens"], llm["max_num_seqs"]) == (16384, 1024)
    small = P.plan(GPUKIT, "rtx4090")["settings"]
    assert (small["max_num_batched_tokens"], small["max_num_seqs"]) == (2048, 256)
    a100 = P.plan(GPUKIT, "a100-80")["settings"]
    assert (a100["max_num_batched_tokens"], a100["max_num_seqs"]) == (2048, 256)


def test_flagless_h200_is_a_kv_capacity_failure_like_a_fail():
    """A_fail: the 4,000,000-token window cannot be held; vLLM estimated 2,040,160 tokens would fit (with
    LLM()'s 16384 batched tokens)."""
    r = P.plan(GPUKIT, "h200", usage_context="llm")
    assert r["fits"] is False and r["failure"]["class"] == "kv_capacity"
    assert r["kv_needed_bytes"] == 250_000 * (1 << 20)            # 244.14 GiB
    assert abs(r["max_model_len_that_fits"] - 2_040_160) / 2_040_160 < 0.01
    lev = r["levers"][0]
    assert lev["id"] == "max_model_len"
    n = lev["change"]["max_model_len"]
    assert n % 16 == 0 and n <= r["max_model_len_that_fits"] * (1 - P.LEVER_KV_MARGIN) + 16
    assert lev["predicted"]["fits"] is True and lev["cost"] and lev["source"]
    # the lever's prediction is what plan says for that setting
    again = P.plan(GPUKIT, "h200", usage_context="llm", max_model_len=n)
    assert again["fits"] is True and again["kv_tokens"] == lev["predicted"]["kv_tokens"]
    ids = [x["id"] for x in r["levers"]]
    assert "kv_cache_dtype" in ids and ids.index("max_model_len") < ids.index("kv_cache_dtype")
    fp8 = next(x for x in r["levers"] if x["id"] == "kv_cache_dtype")
    assert fp8["change"] == {"kv_cache_dtype": "fp8"}
    # twice the blocks (or one more: the halved block divides the arena once more); int() of a float ratio
    assert abs(fp8["predicted"]["kv_tokens"] - 2 * r["kv_tokens"]) <= 16 + 2


def test_24gib_card(capsys):
    code, out, _ = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "24GiB", "--json")
    r = json.loads(out)
    assert code == 1 and r["fits"] is False and r["failure"]["class"] == "kv_capacity"
    assert 0 < r["available_kv_bytes"] < 24 * GIB
    n = r["levers"][0]["change"]["max_model_len"]
    code2, out2, _ = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "24GiB", "--max-model-len", str(n), "--json")
    assert code2 == 0 and json.loads(out2)["fits"] is True


def test_exit_codes(capsys):
    code, out, _ = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "h200", "--max-model-len", "32K", "--json")
    assert code == 0 and json.loads(out)["max_model_len"] == 32768
    code, out, _ = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "150754820096", "--json")
    assert code == 1 and json.loads(out)["fits"] is False
    code, out, err = run_cli(capsys, "--model", str(ROOT / "no-such-model"), "--gpu-memory", "h200", "--json")
    assert code == 2 and out == "" and "not found" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "0", "--json")
    assert code == 2 and "gpu memory" in err
    code, _, err = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "h200", "--gpu-memory-utilization", "1.2")
    assert code == 2 and "gpu_memory_utilization" in err
    code, _, err = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "a-potato")
    assert code == 2 and "not a memory size" in err
    code, _, err = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "h200", "--engine-version", "0.9.9")
    assert code == 2 and "engine version" in err


def test_human_output(capsys):
    code, out, _ = run_cli(capsys, "--model", GPUKIT, "--gpu-memory", "rtx4090")
    assert code == 1 and "does not fit" in out and "kv_capacity" in out and "max_model_len=" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_utilization_lever_never_exceeds_what_free_memory_allows():
    """B_fail: 40 GiB free on the H200 with the default 0.92: the lever lowers utilization to what free memory
    allows, and vLLM's check free >= ceil(total x util) holds for it."""
    r = P.plan(GPUKIT, "h200", free=42_950_852_608, max_model_len=32768, usage_context="llm")
    assert r["failure"]["class"] == "free_memory_below_utilization"
    lev = r["levers"][0]
    assert lev["id"] == "gpu_memory_utilization"
    u = lev["change"]["gpu_memory_utilization"]
    assert u < 0.92
    assert math.ceil(r["gpu"]["cuda_total_bytes"] * u) <= r["gpu"]["startup_free_bytes"]
    assert u <= r["gpu"]["free_bytes"] / r["gpu"]["total_bytes"]
    assert lev["predicted"]["fits"] is True
    assert P.plan(GPUKIT, "h200", free=42_950_852_608, max_model_len=32768, usage_context="llm",
                  gpu_memory_utilization=u)["fits"] is True
    ids = [x["id"] for x in r["levers"]]
    assert "free_other_processes" in ids


def test_raising_utilization_stops_at_what_free_memory_allows():
    # kv_capacity at util 0.3 with 60 GiB free (another process holds the rest): raising utilization helps,
    # but only up to free/total -- never to the 0.92 default or beyond
    r = P.plan(GPUKIT, "h200", free=60 * GIB, gpu_memory_utilization=0.3, max_model_len=700_000)
    assert r["failure"]["class"] == "kv_capacity"
    lev = next(x for x in r["levers"] if x["id"] == "gpu_memory_utilization")
    u = lev["change"]["gpu_memory_utilization"]
    assert 0.3 < u <= 60 * GIB / r["gpu"]["total_bytes"]
    assert math.ceil(r["gpu"]["cuda_total_bytes"] * u) <= r["gpu"]["startup_free_bytes"]
    assert lev["predicted"]["fits"] is True
    assert r["levers"][0]["id"] == "max_model_len"


def test_pinned_arena_levers_d_fail_and_f1b_fail():
    d_fail = P.plan(GPUKIT, "h200", free=8_591_114_240, max_model_len=32768, gpu_memory_utilization=0.05,
                    kv_cache_memory_bytes=7_500_000_000, usage_context="llm")
    assert d_fail["failure"]["class"] == "kv_allocation_oom" and d_fail["available_kv_bytes"] == 7_500_000_000
    lev = d_fail["levers"][0]
    assert lev["id"] == "kv_cache_memory_bytes"
    pinned = lev["change"]["kv_cache_memory_bytes"]
    assert 2 * GIB <= pinned < 7_500_000_000 and pinned % d_fail["bytes_per_block"] == 0
    assert lev["predicted"]["fits"] is True
    f1b = P.plan(GPUKIT, "h200", free=8_591_114_240, max_model_len=32768, gpu_memory_utilization=0.05,
                 kv_cache_memory_bytes="4.4e9", usage_context="llm")
    assert f1b["failure"]["class"] == "cuda_graph_oom"
    assert f1b["levers"][0]["id"] == "enforce_eager" and f1b["levers"][0]["predicted"]["fits"] is True
    assert f1b["kv_tokens"] == 67_136                     # the real log's "GPU KV cache size"


def test_weights_that_do_not_fit():
    r = P.plan(str(MODELS / "deepseek-v2-lite"), "rtx4090", max_model_len=8192)
    assert r["failure"]["class"] == "weights_load_oom"
    ids = [x["id"] for x in r["levers"]]
    assert ids[0] == "quantization" and ids[-1] == "larger_gpu"
    assert all(x["predicted"]["fits"] for x in r["levers"])
    tp = next(x for x in r["levers"] if x["id"] == "tensor_parallel_size")
    assert tp["change"]["tensor_parallel_size"] in (2, 4, 8)


def test_hybrid_and_mla_models_plan():
    nem = P.plan(str(MODELS / "nemotron-h-8b-base-8k"), "h200")
    assert nem["fits"] and nem["settings"]["block_size"] == 1040 and nem["settings"]["model_runner"] == "v1"
    assert nem["mamba_state_bytes_per_sequence"] == 102_137_856 and nem["cuda_graph_estimate_bytes"] > 0
    mla = P.plan(str(MODELS / "deepseek-v2-lite"), "h200")
    assert mla["kv_bytes_per_token"] == 31_104 and mla["fits"]


def test_tensor_parallel_divides_weights_and_kv_heads():
    one = P.plan(str(MODELS / "llama-3-8b"), "h100")
    two = P.plan(str(MODELS / "llama-3-8b"), "h100", tensor_parallel_size=2)
    assert two["kv_bytes_per_token"] * 2 == one["kv_bytes_per_token"]
    assert two["parameter_bytes"] == math.ceil(one["parameter_bytes"] / 2)
    assert two["kv_tokens"] > 2 * one["kv_tokens"]


def test_human_int_parsing():
    assert P.parse_human_int("32k", "x") == 32000
    assert P.parse_human_int("32K", "x") == 32768
    assert P.parse_human_int("1,048,576", "x") == 1_048_576
    assert P.parse_kv_bytes("8G") == 8 * GIB and P.parse_kv_bytes("8g") == 8 * 10**9
    assert P.parse_kv_bytes("5.2e9") == 5_200_000_000 and P.parse_kv_bytes("2GiB") == 2 * GIB
    with pytest.raises(BadInput):
        P.parse_human_int("lots", "max_model_len")


def test_auto_max_model_len_fits_the_arena():
    r = P.plan(GPUKIT, "rtx4090", max_model_len="auto")
    assert r["fits"] is True and r["max_model_len"] == r["max_model_len_that_fits"] > 0
    assert r["kv_needed_bytes"] <= r["available_kv_bytes"]


def test_model_len_above_the_model_limit_is_config_invalid():
    r = P.plan(str(MODELS / "llama-3-8b"), "h200", max_model_len=100_000)
    assert r["failure"]["class"] == "config_invalid"
    assert r["levers"][0]["change"] == {"max_model_len": 8192} and r["levers"][0]["predicted"]["fits"]


def test_plan_matches_memory_module():
    info = M.describe_model(GPUKIT)
    s = M.resolve_settings(info, 24 * GIB)
    p = M.evaluate(info, s)
    r = P.plan(GPUKIT, "24GiB")
    assert r["available_kv_bytes"] == p.available_kv_bytes and r["kv_tokens"] == p.capacity.kv_tokens


@pytest.mark.parametrize("kw", [dict(free=42_950_852_608, max_model_len=32768, usage_context="llm"),
                                dict(free=60 * GIB, gpu_memory_utilization=0.3, max_model_len=700_000)])
def test_utilization_lever_is_the_one_definition_diagnose_uses(kw):
    """Bug (issue 11): plan kept 256 MiB back, diagnose 2 % of free; both now use max_passing_utilization, so the
    same free/total gives the same utilization lever in plan and in diagnose."""
    from oomdoctor.engines.vllm.defaults import max_passing_utilization
    from oomdoctor.levers.engine import propose

    r = P.plan(GPUKIT, "h200", **kw)
    total, free = r["gpu"]["cuda_total_bytes"], r["gpu"]["startup_free_bytes"]
    u = next(x for x in r["levers"] if x["id"] == "gpu_memory_utilization")["change"]["gpu_memory_utilization"]
    assert u == max_passing_utilization(total, free)
    util = kw.get("gpu_memory_utilization", 0.92)
    diag = propose("free_memory_below_utilization",
                   {"gpu_total_bytes": total, "free_at_start_bytes": free, "gpu_memory_utilization": util})
    assert diag[0]["id"] == "gpu_memory_utilization" and diag[0]["change"]["gpu_memory_utilization"] == u
