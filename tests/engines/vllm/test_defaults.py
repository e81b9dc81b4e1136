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
