"""vLLM's "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`" carries no KV figures
to size a window by: nine field-guide pastes ended with only "a larger GPU" (an operator's review). What is taken
before the cache, and vLLM's own advice, come first (levers/by_class.py no_room_levers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.card.incident import diagnose_log

FG = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "field-guide"


def _levers(tmp_path: Path, case: str) -> list[tuple[str, dict]]:
    card, _, _ = diagnose_log(FG / f"{case}.log", tmp_path / "c.yaml", no_device=True)
    assert card["classification"]["class"] == "kv_capacity"
    return [(lv["id"], lv["change"]) for lv in card["levers"]]


def test_the_cuda_graphs_estimate_before_the_cache_is_the_first_suspect(tmp_path):
    # "Estimated CUDA graph memory: 118.65 GiB total", then no cache blocks
    assert _levers(tmp_path, "vllm-v1-013")[0] == ("enforce_eager", {"enforce_eager": True})


@pytest.mark.parametrize("case", ["vllm-v0p-012", "vllm-v0p-013", "vllm-v0p-014", "vllm-v0p-015", "vllm-v0p-016",
                                  "vllm-v1-014", "vllm-v1-015", "vllm-v1-016"])
def test_a_setting_comes_before_other_hardware(tmp_path, case):
    levers = _levers(tmp_path, case)
    assert levers[0][0] != "larger_gpu" and levers[-1][0] == "larger_gpu", levers
    util = [c for i, c in levers if i == "gpu_memory_utilization"]
    if case == "vllm-v1-014":      # its quoted command set 0.4: that low value is the first suspect, 0.05 more
        assert levers[0] == ("gpu_memory_utilization", {"gpu_memory_utilization": 0.45})
    elif case.startswith("vllm-v0p-01") and case != "vllm-v0p-012":
        # V0's "max seq len (N) is larger than ... tokens that can be stored in KV cache (M)": the window, from M
        # (tests/levers/test_window_tokens.py)
        assert levers[0][0] == "max_model_len"
    else:
        assert util and 0.9 < util[0]["gpu_memory_utilization"] <= 0.95
