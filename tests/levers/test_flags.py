"""Lever changes in the engine's own words (engines/<engine>/levers.yaml)."""
from __future__ import annotations

from oomdoctor.levers.flags import flag_for, flags_for_change


def test_vllm_serve_and_offline_words() -> None:
    assert flag_for("vllm", "max_model_len", 1998848, "vllm-serve") == "--max-model-len 1998848"
    assert flag_for("vllm", "max_model_len", 1998848, "vllm-llm") == "max_model_len=1998848"
    assert flag_for("vllm", "enforce_eager", True, "vllm-serve") == "--enforce-eager"
    assert flag_for("vllm", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "vllm-serve") == \
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def test_unknown_engine_or_setting_gives_none() -> None:
    assert flag_for("no-such-engine", "max_model_len", 1) is None
    assert flag_for("vllm", "stop_pids", [1]) is None
    assert flags_for_change("vllm", {"stop_pids": [1], "max_num_seqs": 64}, "vllm-serve") == ["--max-num-seqs 64"]
