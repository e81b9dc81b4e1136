"""vLLM's own numbers that several stages need: one place, one value.

Per-version defaults live in ``DEFAULTS_BY_VERSION`` (a table, not ``== "0.25.1"`` comparisons scattered over
the code); ``defaults_for(version)`` picks the row of the nearest known version at or below it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20

#: vLLM's own CUDA context on the GPU before its start-up check: a ballast leaving 40.00 GiB free shows as
#: 39.49 GiB in vLLM's "Free memory on device" line on the H200 (0.25.1), i.e. 0.51 GiB.
CUDA_CONTEXT_BYTES = round(0.51 * GiB)

#: the share of free memory a utilization lever keeps below vLLM's start-up check (free >= ceil(total x util)).
CHECK_KEEP_BACK = 0.02


def max_passing_utilization(total_bytes: int, free_bytes: int, keep_back: float = CHECK_KEEP_BACK,
                            decimals: int = 2, margin_bytes: int = 0) -> float:
    """The largest ``gpu_memory_utilization`` (rounded down to ``decimals``) whose request ``ceil(total x util)``
    stays within ``free x (1 - keep_back) - margin_bytes``: what passes vLLM's free-memory check with that share
    (and that many bytes) kept back. 0.0 when none does. The one definition that levers, plan and profiles use."""
    if total_bytes <= 0 or free_bytes <= 0:
        return 0.0
    scale = 10 ** decimals
    budget = free_bytes * (1 - keep_back) - margin_bytes
    u = math.floor(budget / total_bytes * scale) / scale
    while u > 0 and math.ceil(total_bytes * u) > budget:
        u = round(u - 1 / scale, decimals)
    return max(0.0, min(1.0, u))


# ---------------------------------------------------------------------------------------------------
# Defaults per vLLM version (read from each published wheel)
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchRule:
    """One row of ``EngineArgs.get_batch_defaults``: from ``min_total_bytes`` of NVML total up (and not on a card
    whose name contains one of ``excluded_cards``), (max_num_batched_tokens, max_num_seqs) per usage context."""
    min_total_bytes: int
    serve: tuple[int, int]                  # OPENAI_API_SERVER
    llm: tuple[int, int]                    # LLM_CLASS
    excluded_cards: tuple[str, ...] = ()

    def applies(self, gpu_total_bytes: int, gpu_name: str) -> bool:
        name = gpu_name.lower()
        return gpu_total_bytes >= self.min_total_bytes and not any(c in name for c in self.excluded_cards)


#: the rules both modelled versions share: >= 70 GiB (not an A100) gets the large-card batch, else the small one.
_LARGE_CARD = BatchRule(70 * GiB, (8192, 1024), (16384, 1024), excluded_cards=("a100",))
_SMALL_CARD = BatchRule(0, (2048, 256), (8192, 256))


@dataclass(frozen=True)
class VersionDefaults:
    """What the memory model needs to know about one vLLM version."""
    version: str
    gpu_memory_utilization: float = 0.92        # CacheConfig
    block_size: int = 16                        # CacheConfig.DEFAULT_BLOCK_SIZE (FlashAttention: MultipleOf(16))
    batch_rules: tuple[BatchRule, ...] = (_LARGE_CARD, _SMALL_CARD)   # first that applies wins
    #: MoE architectures that still get the V2 model runner; None: every non-hybrid model gets it.
    v2_runner_moe_archs: frozenset[str] | None = None
    #: the V2 runner subtracts its CUDA-graph estimate from the KV budget (0.25.1's V2 runner captures after
    #: the KV cache without a reservation).
    v2_runner_budgets_cuda_graphs: bool = True
    #: the KV pool keeps one null block back (estimate_max_model_len, the one-request check).
    reserves_null_block: bool = False

    def batch_defaults(self, gpu_total_bytes: int, usage_context: str, gpu_name: str = "") -> tuple[int, int]:
        for rule in self.batch_rules:
            if rule.applies(gpu_total_bytes, gpu_name):
                return rule.serve if usage_context == "serve" else rule.llm
        return _SMALL_CARD.serve if usage_context == "serve" else _SMALL_CARD.llm


DEFAULTS_BY_VERSION: dict[str, VersionDefaults] = {
    "0.25.1": VersionDefaults(
        "0.25.1",
        # DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES: MoE models that still get the V2 runner
        v2_runner_moe_archs=frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}),
        v2_runner_budgets_cuda_graphs=False,
    ),
    "0.33.0": VersionDefaults(
        "0.33.0",
        batch_rules=(BatchRule(160 * GiB, (16384, 1024), (16384, 1024)), _LARGE_CARD, _SMALL_CARD),
        reserves_null_block=True,
    ),
}
DEFAULT_ENGINE_VERSION = "0.25.1"


#: vLLM's default gpu_memory_utilization before 0.20.0: 0.9 (``CacheConfig``: 0.19.1 ``config/cache.py:41``
#: ``Field(default=0.9, gt=0, le=1)``, 0.11.0 and 0.8.5 alike); 0.20.0 made it 0.92 (``config/cache.py:66``), the value
#: of every row above. ``EngineArgs`` takes CacheConfig's, so the ``--gpu-memory-utilization`` flag changed with it.
UTILIZATION_BEFORE_0_20 = 0.9
UTILIZATION_CHANGED_IN = (0, 20, 0)


def default_utilization(version: str | None) -> float:
    """vLLM's own gpu_memory_utilization for ``version``: 0.9 before 0.20.0, else its row's (0.92). An unknown
    version gets the row's: :func:`utilization_assumed` says when that was a guess."""
    key = _version_key(version) if version else None
    if key is not None and key < UTILIZATION_CHANGED_IN:
        return UTILIZATION_BEFORE_0_20
    return defaults_for(version).gpu_memory_utilization


def utilization_assumed(version: str | None) -> bool:
    """True when the default utilization is a guess: no version is known, so 0.92 (0.20.0 on) may be 0.9."""
    return _version_key(version) is None if version else True


def largest_default_batched_tokens() -> int:
    """The largest max_num_batched_tokens any known version picks by itself (any card, either usage context)."""
    return max(max(r.serve[0], r.llm[0]) for d in DEFAULTS_BY_VERSION.values() for r in d.batch_rules)
SUPPORTED_ENGINE_VERSIONS = tuple(DEFAULTS_BY_VERSION)


def _version_key(version: str) -> tuple[int, ...] | None:
    parts = re.findall(r"\d+", str(version).split("+")[0])[:3]
    return tuple(int(p) for p in parts) if parts else None


def defaults_for(version: str | None) -> VersionDefaults:
    """The row of ``version``, else of the nearest known version below it; the oldest row for an older or
    unreadable version (and for None)."""
    if version in DEFAULTS_BY_VERSION:
        return DEFAULTS_BY_VERSION[version]
    key = _version_key(version) if version else None
    rows = sorted(DEFAULTS_BY_VERSION.values(), key=lambda r: _version_key(r.version) or ())
    best = rows[0]
    for row in rows:
        rk = _version_key(row.version)
        if key is not None and rk is not None and rk <= key:
            best = row
    return best
