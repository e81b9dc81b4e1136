"""Grouping layers into the shared block pool, block count, capacity (``vllm/v1/core/kv_cache_utils.py``, 0.25.1)."""
from __future__ import annotations

from dataclasses import dataclass

from oomdoctor.engines.vllm.memory.common import cdiv
from oomdoctor.engines.vllm.memory.kv_specs import KVSpec, MambaSpec, layer_specs
from oomdoctor.engines.vllm.memory.model import ModelInfo
from oomdoctor.errors import BadInput


@dataclass(frozen=True)
class KVGroup:
    spec: KVSpec
    num_layers: int


@dataclass(frozen=True)
class KVLayout:
    """How the layers share one block pool. ``uniform_type``: one group of same-type layers with different
    page sizes (UniformTypeKVCacheSpecs); otherwise every group's page is ``page_size_bytes``."""
    groups: tuple[KVGroup, ...]
    group_size: int
    page_size_bytes: int
    uniform_type: bool = False
    layer_specs: tuple[KVSpec, ...] = ()

    @property
    def block_size(self) -> int:
        return self.groups[0].spec.block_size if self.groups else 0

    @property
    def bytes_per_block(self) -> int:
        """One block of the pool across all layers (``_pool_bytes_per_block``)."""
        if self.uniform_type:
            return sum(s.page_size_bytes for s in self.layer_specs)
        return self.page_size_bytes * self.group_size

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens needs (all groups)."""
        if self.uniform_type:
            return max(cdiv(s.max_memory_usage_bytes(max_model_len, max_num_batched_tokens), s.page_size_bytes)
                       for s in self.layer_specs)
        return sum(cdiv(g.spec.max_memory_usage_bytes(max_model_len, max_num_batched_tokens), self.page_size_bytes)
                   for g in self.groups)

    def needed_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """``_max_memory_usage_bytes_from_groups``: KV bytes for ONE request of max_model_len (the number in
        "To serve at least one request ... (X GiB KV cache is needed ...")."""
        if not self.groups:
            return 0
        if self.uniform_type:
            return sum(s.max_memory_usage_bytes(max_model_len, max_num_batched_tokens) for s in self.layer_specs)
        return self.bytes_per_block * self.blocks_per_request(max_model_len, max_num_batched_tokens)

    def num_blocks(self, available_bytes: int) -> int:
        if not self.groups:
            return 1
        return max(0, int(available_bytes) // self.bytes_per_block)


def _same_type(specs: list[KVSpec]) -> bool:
    first = specs[0]
    return all(s.block_size == first.block_size for s in specs) and all(first.same_type(s) for s in specs)


def _unify_page_sizes(specs: list[KVSpec]) -> tuple[list[KVSpec], int]:
    """Raise the block size of layers with smaller pages so every page is the largest one."""
    top = max(s.page_size_bytes for s in specs)
    unified: list[KVSpec] = []
    for s in specs:
        if s.page_size_bytes == top:
            unified.append(s)
        elif top % s.page_size_bytes == 0 and not isinstance(s, MambaSpec):
            unified.append(s.with_block_size(s.block_size * (top // s.page_size_bytes)))
        else:
            raise BadInput("the layers' KV page sizes cannot be unified (vLLM raises NotImplementedError)")
    return unified, top


def group_layers(specs: list[KVSpec]) -> KVLayout:
    """vLLM's ``get_kv_cache_groups``: identical specs -> one group; same type with different sizes -> one
    UniformType group; otherwise page sizes are unified (larger block size for smaller pages) and layers
    are grouped by spec with ``group_size`` = the smallest type's layer count (or the largest one when
    they are within 1.5x), padding the last group of each type."""
    if not specs:
        return KVLayout((), 0, 0)
    if all(s == specs[0] for s in specs):
        return KVLayout((KVGroup(specs[0], len(specs)),), len(specs), specs[0].page_size_bytes, False, tuple(specs))
    if _same_type(specs):
        return KVLayout((KVGroup(specs[0], len(specs)),), len(specs), 0, True, tuple(specs))
    unified, top = _unify_page_sizes(specs)
    by_spec: dict[KVSpec, list[KVSpec]] = {}
    for s in unified:
        by_spec.setdefault(s, []).append(s)
    counts = [len(v) for v in by_spec.values()]
    gs = min(counts)
    if max(counts) < gs * 1.5:
        gs = max(counts)
    groups = []
    for spec, layers in by_spec.items():
        n = len(layers)
        for i in range(cdiv(n, gs)):
            groups.append(KVGroup(spec, len(range(i, n, cdiv(n, gs)))))
    return KVLayout(tuple(groups), gs, top, False, tuple(unified))


def kv_layout(m: ModelInfo, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
              block_size: int | None = None) -> KVLayout:
    return group_layers(layer_specs(m, kv_cache_dtype, tensor_parallel_size, block_size))


@dataclass(frozen=True)
class KVCapacity:
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    kv_tokens: int            # "GPU KV cache size: N tokens" (0.25.1: int(max_concurrency * max_model_len))


def kv_capacity(layout: KVLayout, available_bytes: int, max_model_len: int, max_num_batched_tokens: int) -> KVCapacity:
    """Blocks, max concurrency and the logged token count for an arena of ``available_bytes``."""
    if not layout.groups:
        return KVCapacity(1, 1, 0.0, 0)
    nb = layout.num_blocks(available_bytes)
    per_req = layout.blocks_per_request(max_model_len, max_num_batched_tokens)
    conc = nb / per_req
    return KVCapacity(nb, per_req, conc, int(conc * max_model_len))


def estimate_max_model_len(layout: KVLayout, available_bytes: int, upper: int, max_num_batched_tokens: int,
                           reserve_block: bool = False) -> int:
    """vLLM's ``estimate_max_model_len``: the largest length in [1, upper] whose one-request need fits
    (binary search). 0 when not even one token fits. ``reserve_block``: 0.33.0 keeps one null block back."""
    avail = available_bytes - (layout.bytes_per_block if reserve_block and layout.groups else 0)
    if not layout.groups:
        return upper

    def fits(n: int) -> bool:
        return layout.needed_bytes(n, max_num_batched_tokens) <= avail

    if upper < 1 or not fits(1):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
