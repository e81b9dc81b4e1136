"""With the model's config (diagnose --model), the levers the memory model predicts to make the start fit go first
(levers/modelcheck.py model_ranked), as the planner orders its own. A real served walk (S0 of
incidents/h200-retest-2026-12-02-dawn/third-lease/) ran gpu_memory_utilization 0.03 first — its own check passed
and the model said the start would still fail (profiling_oom on the device) — while freeing the co-tenant, which the
model said starts, came second."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.card import store
from oomdoctor.card.incident import diagnose_log

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "fixtures" / "logs"
MODEL = ROOT / "fixtures" / "models" / "gpukit-llama-886m"


def _levers(tmp_path: Path, log: str) -> list[dict]:
    card, _, _ = diagnose_log(LOGS / log, tmp_path / "c.yaml", no_device=True, model_dir=MODEL)
    return card["levers"]


def _ids(levers: list[dict]) -> list[tuple[str, object]]:
    return [(lv["id"], lv["predicted"].get("model", {}).get("fits")) for lv in levers]


def test_the_lever_the_model_says_starts_goes_first(tmp_path):
    lv = _levers(tmp_path, "vllm-0.25.1-h200-dawn/S0_serve_free_memory.log")
    assert _ids(lv)[:2] == [("free_other_processes", True), ("gpu_memory_utilization", False)]
    assert [x["rank"] for x in lv] == list(range(1, len(lv) + 1))
    walk = store.load_dict(ROOT / "incidents" / "h200-retest-2026-12-02-dawn" / "third-lease"
                           / "h200-S0_serve_free_memory.yaml")
    assert (walk["attempts"][1]["lever"], walk["attempts"][1]["classification"]["class"]) == \
        ("gpu_memory_utilization", "profiling_oom")                       # what the device showed of the old first


def test_no_lever_is_moved_when_none_is_predicted_to_start_or_it_needs_other_hardware(tmp_path):
    # R1a: only tensor_parallel_size 2 is predicted to start, and it needs a second GPU
    assert _ids(_levers(tmp_path, "vllm-0.25.1-h200-night/R1a_kv_pinned.log"))[0] == ("kv_cache_dtype", False)


def test_a_runtime_failure_keeps_its_order(tmp_path):
    # every lever of a serving OOM "fits" the start, which says nothing of the serving peak
    lv = _levers(tmp_path, "vllm-0.25.1-h200-dawn/S2_serve_runtime_default.log")
    assert lv[0]["id"] == "expandable_segments" and lv[1]["predicted"]["model"]["fits"] is True


def test_the_first_screen_says_how_to_free_the_gpu_and_what_the_model_predicts(tmp_path):
    from oomdoctor.diagnose.screen import first_screen

    card, _, _ = diagnose_log(LOGS / "vllm-0.25.1-h200-dawn" / "S0_serve_free_memory.log", tmp_path / "c.yaml",
                              no_device=True, model_dir=MODEL)
    lines = first_screen(card, "c.yaml")
    assert "Change ONE thing: stop what holds the GPU's memory" in lines
    assert "  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv" in lines
    assert any(ln.startswith("  Predicted: fits (the memory model).") for ln in lines)
