"""vLLM's numbers per version (oomdoctor.engines.vllm.defaults): the table and the one utilization formula."""
from __future__ import annotations

import math

import pytest

from oomdoctor.engines.vllm import defaults as D

GIB = 1 << 30


def test_every_supported_version_has_a_row():
    assert D.SUPPORTED_ENGINE_VERSIONS == ("0.25.1", "0.33.0")
    assert D.DEFAULT_ENGINE_VERSION in D.DEFAULTS_BY_VERSION
    for v in D.SUPPORTED_ENGINE_VERSIONS:
        row = D.defaults_for(v)
        assert row.version == v and row.gpu_memory_utilization == 0.92 and row.block_size == 16


def test_version_flags_are_table_entries():
    old, new = D.defaults_for("0.25.1"), D.defaults_for("0.33.0")
    assert not old.v2_runner_budgets_cuda_graphs and new.v2_runner_budgets_cuda_graphs
    assert not old.reserves_null_block and new.reserves_null_block
    assert old.v2_runner_moe_archs is not None and "Qwen2MoeForCausalLM" in old.v2_runner_moe_archs
    assert new.v2_runner_moe_archs is None


@pytest.mark.parametrize("version, row", [("0.25.1", "0.25.1"), ("0.30.2", "0.25.1"), ("0.33.0", "0.33.0"),
                                          ("0.33.1rc1", "0.33.0"), ("0.40.0+cu128", "0.33.0"), ("0.20.0", "0.25.1"),
                                          (None, "0.25.1"), ("dev", "0.25.1")])
def test_defaults_for_picks_the_nearest_version_at_or_below(version, row):
    assert D.defaults_for(version).version == row


def test_batch_rules_by_card():
    assert D.defaults_for("0.25.1").batch_defaults(180 * 10**9, "serve") == (8192, 1024)
    assert D.defaults_for("0.33.0").batch_defaults(180 * 10**9, "serve") == (16384, 1024)
    assert D.defaults_for("0.33.0").batch_defaults(80 * GIB, "serve", "a100-80") == (2048, 256)


def test_max_passing_utilization_with_a_byte_margin():
    total, free = 150_109_880_320, 40 * GIB
    u = D.max_passing_utilization(total, free, keep_back=0.0, margin_bytes=256 << 20)
    assert math.ceil(total * u) <= free - (256 << 20) < math.ceil(total * (u + 0.01))
    assert D.max_passing_utilization(total, free, keep_back=0.0) >= u
    assert D.max_passing_utilization(total, 10, keep_back=0.0, margin_bytes=256 << 20) == 0.0


@pytest.mark.parametrize("version, util, assumed", [
    ("0.8.5", 0.9, False), ("0.11.0", 0.9, False), ("0.19.1", 0.9, False),    # CacheConfig default=0.9
    ("0.20.0", 0.92, False), ("0.25.1", 0.92, False), ("0.33.0", 0.92, False),  # 0.20.0 config/cache.py:66: 0.92
    ("0.19.2.dev3+g1234", 0.9, False), (None, 0.92, True), ("dev", 0.92, True)])
def test_the_default_utilization_follows_the_version(version, util, assumed):
    assert D.default_utilization(version) == util
    assert D.utilization_assumed(version) is assumed


def test_the_lever_arithmetic_uses_the_logs_version_default_and_says_when_it_guessed(tmp_path):
    from pathlib import Path

    from oomdoctor.card.incident import diagnose_log

    logs = Path(__file__).resolve().parents[3] / "fixtures" / "logs"

    def util_line(log: Path) -> str:
        card, _, _ = diagnose_log(log, tmp_path / "c.yaml", no_device=True)
        lv = next(lv for lv in card["levers"] if lv["id"] == "gpu_memory_utilization")
        return lv["arithmetic"][0]

    # a V0 log of 0.8.5 (its version line): vLLM's own 0.9, not the 0.92 of 0.20.0 on
    assert util_line(logs / "vllm-0.8.5-formatstrings" / "v0_no_blocks.log") == \
        "gpu_memory_utilization 0.9 → 0.95: 0.05 of the GPU more for the cache"
    # a paste that names no version: 0.92 assumed, and said to be
    assert util_line(logs / "field-guide" / "vllm-v1-015.log").startswith(
        "gpu_memory_utilization 0.92 (vLLM's default since 0.20; 0.9 before: the log names no version) → 0.95")
