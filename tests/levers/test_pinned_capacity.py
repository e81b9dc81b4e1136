"""A pinned KV budget too small for one sequence (the real R1a start: kv_cache_memory_bytes 2.0e9, a 32,768-token
window needs 2.0 GiB) is offered its own lever, sized and checked against the free memory the log reports."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.card.incident import diagnose_log

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def test_the_pinned_budget_grows_to_one_sequence_and_says_when_the_gpu_is_short(tmp_path):
    card, _, _ = diagnose_log(LOGS / "vllm-0.25.1-h200-night" / "R1a_kv_pinned.log", tmp_path / "c.yaml", no_device=True)
    assert card["classification"]["class"] == "kv_capacity"
    lv = next(lv for lv in card["levers"] if lv["id"] == "kv_cache_memory_bytes")
    assert lv["change"] == {"kv_cache_memory_bytes": 21 * 100 * 2**20}            # 2 GiB rounded up to 100 MiB
    # 3.79 GiB free (the worker's) - 1.66 GiB weights - 1 GiB reserve: short; a real start pinned at 2.5e9 under
    # 4.8 GiB free ran out allocating it (R1c)
    assert lv["predicted"]["outcome"] == "short" and lv["predicted"]["short_by_bytes"] > 0
    ids = [x["id"] for x in card["levers"]]
    assert ids.index("max_model_len") < ids.index("kv_cache_memory_bytes")         # a short lever ranks after


def test_an_unpinned_capacity_failure_gets_no_pinned_lever(tmp_path):
    card, _, _ = diagnose_log(LOGS / "vllm-0.25.1-h200" / "A_fail.log", tmp_path / "a.yaml", no_device=True)
    assert card["classification"]["class"] == "kv_capacity"
    assert "kv_cache_memory_bytes" not in [lv["id"] for lv in card["levers"]]


def test_a_lever_that_keeps_an_arena_the_free_memory_cannot_hold_says_what_comes_next(tmp_path):
    # R1a: the arena (1.86 GiB) beside the weights (1.66 GiB) and the reserve does not fit in 3.79 GiB free; on the
    # device fp8 passed the capacity check and ran out allocating the arena (incidents/h200-retest-2026-12-02-dawn/)
    from oomdoctor.card.incident import diagnose_log

    logs = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
    card, _, _ = diagnose_log(logs / "vllm-0.25.1-h200-night" / "R1a_kv_pinned.log", tmp_path / "a.yaml", no_device=True)
    kept = [lv for lv in card["levers"] if lv["id"] in ("kv_cache_dtype", "max_model_len")]
    assert kept and all(lv["predicted"].get("then") == "kv_allocation_oom" for lv in kept)
    assert "leaves 1.13 GiB" in kept[0]["predicted"]["warning"]
    # a pinned arena the free memory holds (S3: no co-tenant) gets no such warning
    card, _, _ = diagnose_log(logs / "vllm-0.25.1-h200-dawn" / "S3_serve_kv_pinned.log", tmp_path / "b.yaml",
                              no_device=True)
    assert not any("warning" in lv["predicted"] for lv in card["levers"])
