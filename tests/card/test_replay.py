"""A runtime failure's card replays the requests the log shows the engine running (card/replay.py): the real H200
runtime OOMs did not reproduce with the smoke request (incidents/h200-retest-2026-12-02/)."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.card.incident import diagnose_log
from oomdoctor.card.replay import MAX_REPLAY_REQUESTS
from oomdoctor.card.workload import DEFAULT_REQUESTS

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _card(tmp_path: Path, log: Path):
    card, _, _ = diagnose_log(log, tmp_path / "card.yaml", no_device=True)
    return card


def test_an_offline_runtime_oom_replays_its_prompts(tmp_path):
    wl = _card(tmp_path, LOGS / "vllm-0.25.1-h200-night" / "R1g_runtime.log")["workload"]
    # the kit's workload: 64 prompts of 6,000 tokens, max_tokens 512 (run_llm.py "preempt"), read from vLLM's own lines
    assert wl["requests"] == {"kind": "replay", "prompt_tokens": 6000, "max_tokens": 512, "concurrency": 64, "count": 64}
    assert "progress bar" in wl["requests_source"] and "dump" in wl["requests_source"]


def test_a_server_runtime_oom_replays_its_running_and_waiting_requests(tmp_path):
    wl = _card(tmp_path, LOGS / "vllm-0.33.0-formatstrings" / "runtime_oom.log")["workload"]
    assert wl["launcher"] == "vllm-serve"
    assert (wl["requests"]["prompt_tokens"], wl["requests"]["count"], wl["requests"]["concurrency"]) == (7904, 46, 46)


def test_a_real_server_runtime_oom_replays_the_scheduler_s_running_and_waiting(tmp_path):
    # a real `vllm serve` 0.25.1 on the H200: 64 clients, the engine died on a step of 5 new prompts; its stats dump
    # (SchedulerStats' full repr: num_skipped_waiting_reqs, step_counter, current_wave before kv_cache_usage) says 6
    # running and 9 waiting. No progress bar in a server's log; the smoke request had not reproduced it.
    wl = _card(tmp_path, LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log")["workload"]
    assert wl["launcher"] == "vllm-serve" and wl["free_at_start_bytes"] == 6443630592
    assert wl["requests"] == {"kind": "replay", "prompt_tokens": 6000, "max_tokens": 512, "concurrency": 15, "count": 15}
    assert "6 running + 9 waiting" in wl["requests_source"]


def test_a_start_up_failure_keeps_the_smoke_request(tmp_path):
    for log in ("vllm-0.25.1-h200/A_fail.log", "vllm-0.25.1-h200-night/P2_profile_eager.log"):
        wl = _card(tmp_path, LOGS / log)["workload"]
        assert wl["requests"] == DEFAULT_REQUESTS and "requests_source" not in wl


def test_forged_figures_are_bounded(tmp_path):
    src = (LOGS / "vllm-0.25.1-h200-night" / "R1g_runtime.log").read_text(encoding="utf-8")
    forged = src.replace("| 0/64 [", "| 0/99999999 [").replace("prompt_token_ids_len=6000", "prompt_token_ids_len=90000000")
    p = tmp_path / "forged.log"
    p.write_text(forged, encoding="utf-8")
    req = _card(tmp_path, p)["workload"]["requests"]
    assert req["count"] == MAX_REPLAY_REQUESTS
    assert req["prompt_tokens"] < 32768 and req["prompt_tokens"] + req["max_tokens"] <= 32768   # the start's window


def test_an_explicit_token_budget_above_any_default_is_the_runtime_oom_s_first_suspect(tmp_path):
    card = _card(tmp_path, LOGS / "vllm-0.25.1-h200-night" / "R1g_runtime.log")       # max_num_batched_tokens=65536
    lv = card["levers"][0]
    # the failing step held 36,000 tokens (the dump's total_num_scheduled_tokens): half of the budget, 32,768, builds
    # nearly the same step (it failed on the device, incidents/h200-retest-2026-12-02/replay/), half of the step does
    assert (lv["id"], lv["change"]) == ("max_num_batched_tokens", {"max_num_batched_tokens": 16384})
    assert "above vLLM's largest default" in lv["arithmetic"][0]
    assert any("failing step scheduled 36,000 tokens" in a for a in lv["arithmetic"])
    card = _card(tmp_path, LOGS / "vllm-0.25.1-h200-night" / "R1e_runtime.log")       # the default 16384
    lv = card["levers"][0]
    assert lv["id"] == "max_num_batched_tokens" and not any("largest default" in a for a in lv.get("arithmetic", []))


def test_a_served_runtime_oom_is_sized_below_the_step_that_failed(tmp_path):
    # S1: budget 65,536, the step 30,001 tokens; on the device 32,768 failed and 16,384 passed
    # (incidents/h200-retest-2026-12-02-dawn/second-lease/)
    lv = _card(tmp_path, LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log")["levers"][0]
    assert (lv["id"], lv["change"]) == ("max_num_batched_tokens", {"max_num_batched_tokens": 14336})
    assert lv["flag"] == "--max-num-batched-tokens 14336"
    # a budget the log does not give is said to be the default, not the log's
    paste = tmp_path / "tb.log"
    lines = (LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log").read_text(encoding="utf-8").splitlines()
    paste.write_text("\n".join(lines[94:185]) + "\n", encoding="utf-8")
    lv = next(x for x in _card(tmp_path, paste)["levers"] if x["id"] == "max_num_batched_tokens")
    assert any("the log does not say" in a for a in lv["arithmetic"])
