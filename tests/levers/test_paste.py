"""A lever as the user pastes it, in the engine's own words (engines/vllm/levers.yaml: settings + commands)."""
from __future__ import annotations

from oomdoctor.levers.paste import commands, paste_text


def test_vllm_serve_offline_env_and_bool():
    lv = {"id": "max_model_len", "change": {"max_model_len": 1998848}}
    assert paste_text("vllm", "vllm-serve", "/root/model", lv) == ["vllm serve /root/model ... --max-model-len 1998848"]
    assert paste_text("vllm", "vllm-llm", "/root/model", lv) == ["LLM(..., max_model_len=1998848)"]
    eager = {"id": "enforce_eager", "change": {"enforce_eager": True}}
    assert paste_text("vllm", "vllm-serve", None, eager) == ["vllm serve MODEL ... --enforce-eager"]
    env = {"id": "expandable_segments", "change": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    assert paste_text("vllm", "vllm-serve", "m", env) == ["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]


def test_a_change_that_is_not_an_engine_setting_is_shown_as_it_is():
    lv = {"id": "free_other_processes", "change": {"stop_pids": [2115]}}
    query = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
    assert paste_text("vllm", "vllm-llm", "m", lv) == [query, "kill 2115     # what the log names as holding the memory"]
    assert paste_text("sglang", None, None, {"id": "free_other_processes", "change": {"stop_pids": []}}) == [query]
    # a forged pid is not pasted as a command
    assert paste_text("vllm", None, None, {"id": "free_other_processes", "change": {"stop_pids": ["1; rm -rf /"]}}) \
        == [query]
    assert paste_text("nosuchengine", None, None, {"id": "max_model_len", "change": {"max_model_len": 8}}) == \
        ["max_model_len = 8"]
    assert paste_text("vllm", "vllm-serve", "m", {"id": "larger_gpu", "change": {}}) == []


def test_the_commands_table_is_data():
    assert commands("vllm") == {"serve": "vllm serve {model} ... {flags}", "offline": "LLM(..., {flags})"}
    assert commands("nosuchengine") == {} and commands("../vllm") == {}
