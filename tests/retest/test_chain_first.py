"""After an attempt that confirmed its chain, the lever the chain planned next is tried next (retest/decide.py
chain_first). The real walk of P2 (incidents/h200-retest-2026-12-02/) spent a start on the ranking's choice."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.card import store
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.retest.decide import chain_first, next_levers

INC = Path(__file__).resolve().parents[2] / "incidents" / "h200-retest-2026-12-02"


def test_the_chain_s_planned_lever_goes_first_after_a_confirmed_chain():
    card = store.load_dict(INC / "h200-P2_profile_eager.yaml")
    first = dict(card["attempts"][1])              # free_other_processes: kv_capacity, as its chain expected
    assert first["lever"] == "free_other_processes" and first["chain_check"]["status"] == "confirmed"
    assert first["next_lever"]["id"] == "max_num_batched_tokens"          # what the walk did on the device
    new = diagnose_file(INC / first["log_path"], default_rules())
    assert new.klass == "kv_capacity"
    prior = {**card, "attempts": card["attempts"][:1]}
    gpu = first["device_before"]["gpus"][0]                  # NVML before that attempt: the ballast was not started
    wl_now = {**card["workload"], "free_at_start_bytes": gpu["free_bytes"], "gpu_total_bytes": gpu["total_bytes"]}
    levers = next_levers(prior, first, new, True, wl_now, first["device_before"])
    assert levers[0]["id"] == "gpu_memory_utilization", [lv["id"] for lv in levers]
    assert "chain planned it next" in levers[0]["basis"] and [lv["rank"] for lv in levers] == list(range(1, len(levers) + 1))
    # the third real attempt: that lever passed
    assert card["attempts"][3]["lever"] == "gpu_memory_utilization" and card["attempts"][3]["outcome"] == "pass"


def test_an_unconfirmed_or_chainless_attempt_keeps_the_ranking():
    levers = [{"id": "max_num_batched_tokens", "rank": 1, "basis": "x"}, {"id": "gpu_memory_utilization", "rank": 2, "basis": "y"}]
    chain = {"steps": [{"lever": "free_other_processes"}, {"failure": "kv_capacity"}, {"lever": "gpu_memory_utilization"}]}
    assert chain_first(levers, {"expected_chain": chain, "chain_check": {"status": "not_confirmed"}}) == levers
    assert chain_first(levers, {"chain_check": {"status": "confirmed"}}) == levers
    moved = chain_first(levers, {"expected_chain": chain, "chain_check": {"status": "confirmed"}})
    assert [lv["id"] for lv in moved] == ["gpu_memory_utilization", "max_num_batched_tokens"]
