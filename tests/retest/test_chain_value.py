"""After a confirmed chain, the lever the chain planned is tried with the chain's value (retest/decide.py
chain_first): the real walk of R1a (incidents/h200-retest-2026-12-02-dawn/first-lease/) re-read the KV arena from the
new failure's log (300 MiB, which the model itself said falls short of one 32,768-token sequence) and spent a start;
the chain had planned 1,463,812,096 B, with which the model has the start fit."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.card import store
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.retest.decide import next_levers

INC = Path(__file__).resolve().parents[2] / "incidents" / "h200-retest-2026-12-02-dawn" / "first-lease"


def test_the_chain_s_planned_value_is_the_one_tried():
    card = store.load_dict(INC / "h200-R1a_kv_pinned.yaml")
    fp8 = dict(card["attempts"][1])                 # kv_cache_dtype fp8: kv_allocation_oom, as its chain expected
    assert fp8["lever"] == "kv_cache_dtype" and fp8["chain_check"]["status"] == "confirmed"
    assert fp8["next_lever"]["change"] == {"kv_cache_memory_bytes": 314572800}      # what the walk ran on the device
    assert card["attempts"][2]["classification"]["class"] == "kv_capacity"          # ... and it fell short, as said
    new = diagnose_file(INC / fp8["log_path"], default_rules())
    assert new.klass == "kv_allocation_oom"
    prior = {**card, "attempts": card["attempts"][:1]}
    gpu = fp8["device_before"]["gpus"][0]
    wl_now = {**card["workload"], "free_at_start_bytes": gpu["free_bytes"], "gpu_total_bytes": gpu["total_bytes"]}
    levers = next_levers(prior, fp8, new, True, wl_now, fp8["device_before"])
    first = levers[0]
    assert (first["id"], first["change"]) == ("kv_cache_memory_bytes", {"kv_cache_memory_bytes": 1463812096})
    assert first["predicted"]["outcome"] == "fits" and "chain planned it next" in first["basis"]
    assert first["flag"] == "--kv-cache-memory-bytes 1463812096"
    assert "300" not in first["cost"] and "1,463,812,096" in first["cost"]     # the log's value's cost is not shown


def test_a_chain_value_for_another_setting_is_not_forced_on_the_lever():
    from oomdoctor.retest.decide import chain_first

    levers = [{"id": "kv_cache_memory_bytes", "change": {"kv_cache_memory_bytes": 5}, "rank": 1, "basis": "b",
               "predicted": {"outcome": "unknown"}}]
    chain = {"steps": [{"lever": "x", "change": {}}, {"failure": "kv_allocation_oom"},
                       {"lever": "kv_cache_memory_bytes", "change": {"max_model_len": 9}}, {"predicted": "fits"}]}
    out = chain_first(levers, {"expected_chain": chain, "chain_check": {"status": "confirmed"}})
    assert out[0]["change"] == {"kv_cache_memory_bytes": 5}


def test_a_runtime_failure_s_chain_does_not_judge_the_run_by_the_start():
    from oomdoctor.levers.chain import check_chain, expected_chain

    models = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "gpukit-llama-886m"
    s1 = store.load_dict(INC.parent / "second-lease" / "h200-S1_serve_runtime.yaml")
    # on the device its chain said "then the start fits", and the runtime OOM of the next run read as not confirmed
    assert s1["attempts"][1]["chain_check"] == {"expected": "fits", "observed": "runtime_oom", "status": "not_confirmed"}
    s1["model_check"] = {**(s1.get("model_check") or {}), "model": str(models)}
    chain = expected_chain(s1, {"id": "max_num_batched_tokens", "change": {"max_num_batched_tokens": 32768},
                                "predicted": {"outcome": "unknown"}})
    assert chain["startup_only"] and "not the serving peak" in chain["text"]
    assert check_chain(chain, "fail", "runtime_oom") is None
    r1a = store.load_dict(INC / "h200-R1a_kv_pinned.yaml")
    r1a["model_check"] = {**(r1a.get("model_check") or {}), "model": str(models)}
    chain = expected_chain(r1a, {"id": "kv_cache_dtype", "change": {"kv_cache_dtype": "fp8"}, "predicted": {"outcome": "fits"}})
    assert "startup_only" not in chain
    assert check_chain(chain, "fail", "kv_allocation_oom")["status"] == "confirmed"
