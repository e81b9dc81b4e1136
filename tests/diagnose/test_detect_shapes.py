"""Engine detection from short pastes (issue 12): a paste of only line shapes that no rule reads is told apart by the
engine's ``detect_lines`` (fixtures/logs/detect-formatstrings/ORIGIN.md), and such a string never names an engine
in another engine's fixtures (tests/diagnose/test_rules_catalogue.py, the field guide)."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "detect-formatstrings"
RULES = default_rules()


@pytest.mark.parametrize("name,engine", [
    ("vllm_v0_engine_line.log", "vllm"),
    ("vllm_prefix_cache_reset.log", "vllm"),
    ("vllm_hpu_graph_summary.log", "vllm"),
    ("sglang_moe_default_config.log", "sglang"),
    ("tgi_router_connected.log", "tgi"),
    ("ollama_discovery_took.log", "ollama"),
    ("llamacpp_metal_command_buffer.log", "llamacpp"),
    ("vllm_offline_progress.log", "vllm"),
    ("vllm_autofit_reduced.log", "vllm"),
    ("sglang_capturing_batches.log", "sglang"),
    ("llamacpp_vulkan_devices.log", "llamacpp"),
    ("vllm_rollout_worker_tail.log", "vllm"),
])
def test_a_paste_of_only_unread_lines_names_its_engine(name, engine):
    d = diagnose_file(LOGS / name, RULES)
    assert (d.engine, d.klass, d.rule) == (engine, "unknown", None)


def test_sglang_moe_warning_is_not_vllms():
    # vLLM's fused_moe.py prints "Using default MoE config" (a vLLM detect_line); SGLang's says "MoE kernel config"
    assert "Using default MoE kernel config" not in RULES.engines["vllm"].detect
    assert not any("Using default MoE config" in s for s in RULES.engines["sglang"].detect)


def test_tgi_per_request_lines_are_not_scan_anchors():
    # a request's lines are inside its span ("generate{...}: text_generation_router::server: ..."): no anchor
    line = ("2025-03-04T10:01:00.000000Z  INFO generate{parameters=GenerateParameters { max_new_tokens: Some(20) }}:"
            " text_generation_router::server: router/src/server.rs:432: Success")
    assert not any(s in line for s in RULES.engines["tgi"].detect_lines)


TRTLLM = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "tensorrt_llm-doc-logs"


@pytest.mark.parametrize("name,version", [
    ("build_info_lines.log", None),            # TensorRT's [TRT] [I] report and TensorRT-LLM's [TRT-LLM] [I] build lines
    ("run_py_logger_lines.log", None),         # the Python logger's lines alone
    ("run_py_0.9.0.log", "0.9.0"),             # "[TensorRT-LLM] TensorRT-LLM version: 0.9.0" printed at import
    ("version_line_0.17.0.log", "0.17.0.post1"),
])
def test_tensorrt_llm_python_logger_and_version_line(name, version):
    # real output quoted in NVIDIA's docs (fixtures/logs/tensorrt_llm-doc-logs/ORIGIN.md)
    d = diagnose_file(TRTLLM / name, RULES)
    assert (d.engine, d.engine_version, d.klass, d.rule) == ("tensorrt_llm", version, "unknown", None)


def test_tensorrt_llm_detect_line_is_not_the_cpp_runtimes():
    # the C++ runtime writes "[TensorRT-LLM][INFO] " (no space, no severity letter); the Python logger "[TRT-LLM] [I] "
    spec = RULES.engines["tensorrt_llm"]
    assert "[TRT-LLM] [" in spec.detect_lines and "[TensorRT-LLM][INFO] " in spec.detect_lines
    assert not any("[TRT-LLM] [" in s for e, o in RULES.engines.items() if e != "tensorrt_llm" for s in o.detect)
