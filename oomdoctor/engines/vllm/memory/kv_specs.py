"""KV cache specs: a common base and one small class per layer kind, like ``vllm/v1/kv_cache_interface.py``.

``KVSpec`` says what every kind answers (bytes per token, page size, the most one request can use, whether
two specs may share a UniformType group); each subclass registers the ``ModelInfo.layer_kinds`` value it
serves and builds itself from the model (``for_layer``). A new attention kind is one class here.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable, TypeVar

from oomdoctor.engines.vllm.defaults import defaults_for
from oomdoctor.engines.vllm.memory.common import DTYPE_BYTES, cdiv, positive_int
from oomdoctor.engines.vllm.memory.model import MambaDims, ModelInfo
from oomdoctor.errors import BadInput

KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
                   "fp8_ds_mla", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "nvfp4")
#: the block size vLLM uses when none is given (the oldest modelled version's CacheConfig default)
DEFAULT_BLOCK_SIZE = defaults_for(None).block_size


@dataclass(frozen=True)
class KVFormat:
    """How one head of K (or V) for one token is stored, for a ``kv_cache_dtype``."""
    name: str
    elem_bytes: int
    per_token_head_scales: bool = False
    packing: str = ""     # "" | "int4" | "nvfp4"

    def head_bytes(self, head_size: int) -> int:
        if self.packing == "nvfp4":
            return head_size // 2 + head_size // 16     # fp4 data + fp8 block scales (nvfp4_kv_cache_full_dim)
        if self.packing == "int4":
            return head_size // 2
        return head_size * self.elem_bytes


def kv_format(kv_cache_dtype: str, model_dtype: str) -> KVFormat:
    """``auto`` = the model dtype; fp8 variants 1 byte; nvfp4 packed 4-bit + fp8 scales per 16."""
    d = (kv_cache_dtype or "auto").lower()
    if d not in KV_CACHE_DTYPES:
        raise BadInput(f"unknown kv_cache_dtype {kv_cache_dtype!r} (use one of: {', '.join(KV_CACHE_DTYPES)})")
    if d == "auto":
        return KVFormat(model_dtype, DTYPE_BYTES[model_dtype])
    if d in ("float16", "bfloat16", "float32"):
        return KVFormat(d, DTYPE_BYTES[d])
    if d in ("int8_per_token_head", "fp8_per_token_head"):
        return KVFormat(d, 1, per_token_head_scales=True)
    if d == "int4_per_token_head":
        return KVFormat(d, 1, per_token_head_scales=True, packing="int4")
    if d == "nvfp4":
        return KVFormat(d, 1, packing="nvfp4")
    return KVFormat(d, 1)


@dataclass(frozen=True)
class SpecContext:
    """What every layer's spec is built from: the rank's share of the model and the cache format."""
    tensor_parallel_size: int
    block_size: int
    fmt: KVFormat
    kv_heads: int                 # KV heads on this rank


S = TypeVar("S", bound="KVSpec")


class KVSpec(ABC):
    """Common base of the per-kind specs (vLLM's ``KVCacheSpec``)."""
    block_size: int
    page_size_padded: int | None

    @property
    @abstractmethod
    def bytes_per_token(self) -> int:
        """Bytes one token costs in this layer (0 for per-sequence state)."""

    @property
    def page_size_bytes(self) -> int:
        """One block of this layer."""
        return self.page_size_padded or self.block_size * self.bytes_per_token

    @abstractmethod
    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The most one request of ``max_model_len`` tokens can hold in this layer."""

    def with_block_size(self: S, block_size: int) -> S:
        return replace(self, block_size=block_size)  # type: ignore[type-var]  # every subclass is a dataclass

    def same_type(self, other: KVSpec) -> bool:
        """May ``other`` share a UniformType group with this spec (same kind, maybe other sizes)?"""
        return type(other) is type(self)

    @classmethod
    @abstractmethod
    def for_layer(cls, m: ModelInfo, layer: int, ctx: SpecContext) -> KVSpec:
        """The spec of layer ``layer`` of ``m`` on one rank."""


#: ModelInfo.layer_kinds value -> the spec class of such a layer ("none": holds no cache)
SPEC_BY_LAYER_KIND: dict[str, type[KVSpec]] = {}


def register(layer_kind: str) -> Callable[[type[S]], type[S]]:
    def add(cls: type[S]) -> type[S]:
        SPEC_BY_LAYER_KIND[layer_kind] = cls
        return cls
    return add


def _scale_bytes(ctx: SpecContext) -> int:
    return 2 * ctx.kv_heads * 4 if ctx.fmt.per_token_head_scales else 0


@register("full")
@dataclass(frozen=True)
class FullAttentionSpec(KVSpec):
    """Full attention (MHA/GQA): K and V for every token, ``cdiv(max_model_len, block_size)`` pages."""
    block_size: int
    num_kv_heads: int
    head_bytes: int                       # one head of K for one token
    scale_bytes: int = 0                  # per-token-head scales (K and V), bytes per token
    page_size_padded: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_bytes + self.scale_bytes

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes

    @classmethod
    def for_layer(cls, m: ModelInfo, layer: int, ctx: SpecContext) -> KVSpec:
        return FullAttentionSpec(ctx.block_size, ctx.kv_heads, ctx.fmt.head_bytes(m.head_dim), _scale_bytes(ctx))


@register("sliding")
@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Sliding-window attention: a request holds ``cdiv(min(window - 1 + max_num_batched_tokens,
    max_model_len), block_size) + 1`` pages (the last window plus the chunk being prefilled)."""
    sliding_window: int = 0

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return (cdiv(tokens, self.block_size) + 1) * self.page_size_bytes

    def same_type(self, other: KVSpec) -> bool:
        return isinstance(other, SlidingWindowSpec) and other.sliding_window == self.sliding_window

    @classmethod
    def for_layer(cls, m: ModelInfo, layer: int, ctx: SpecContext) -> KVSpec:
        return SlidingWindowSpec(ctx.block_size, ctx.kv_heads, ctx.fmt.head_bytes(m.head_dim), _scale_bytes(ctx),
                                 sliding_window=m.sliding_windows[layer])


@register("mla")
@dataclass(frozen=True)
class MLASpec(FullAttentionSpec):
    """Multi-head latent attention (DeepSeek-V2/V3): ONE latent of kv_lora_rank + qk_rope_head_dim per
    token and layer, no K/V factor 2. ``fp8_ds_mla`` is vLLM's 656-byte custom layout."""
    fixed_bytes_per_token: int = 0

    @property
    def bytes_per_token(self) -> int:
        return self.fixed_bytes_per_token or self.num_kv_heads * self.head_bytes

    @classmethod
    def for_layer(cls, m: ModelInfo, layer: int, ctx: SpecContext) -> KVSpec:
        fixed = 656 if ctx.fmt.name == "fp8_ds_mla" else 0
        hb = m.head_dim // 2 if ctx.fmt.packing == "int4" else m.head_dim * ctx.fmt.elem_bytes
        return MLASpec(ctx.block_size, 1, hb, 0, fixed_bytes_per_token=fixed)


def _divide(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise BadInput(f"{what} ({n}) is not divisible by tensor_parallel_size {tp}; vLLM would refuse the model")
    return n // tp


def mamba_state_shapes(d: MambaDims, tp: int) -> tuple[tuple[int, ...], ...]:
    """vLLM's MambaStateShapeCalculator (conv layout 'SD'): mamba2 conv (k-1, (d_inner+2*G*S)/tp) and ssm
    (H/tp, P, S); mamba1 conv (k-1, d_inner/tp) and ssm (d_inner/tp, S)."""
    if d.kind == "mamba2":
        groups = d.n_groups + (0 if d.n_groups % tp == 0 else tp - d.n_groups)
        conv_dim = d.d_inner + 2 * groups * d.state_size
        return ((d.conv_kernel - 1, _divide(conv_dim, tp, "mamba conv dim")),
                (_divide(d.num_heads, tp, "mamba_num_heads"), d.head_dim, d.state_size))
    inner = _divide(d.d_inner, tp, "mamba intermediate size")
    return ((d.conv_kernel - 1, inner), (inner, d.state_size))


@register("mamba")
@dataclass(frozen=True)
class MambaSpec(KVSpec):
    """Mamba state: conv state + SSM state per SEQUENCE (not per token). One page per request with prefix
    caching off (vLLM 0.25.1's default for hybrid models: mamba_cache_mode 'none')."""
    shapes: tuple[tuple[int, ...], ...]
    dtype_bytes: tuple[int, ...]
    block_size: int = 0
    page_size_padded: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return 0

    @property
    def state_bytes(self) -> int:
        return sum(math.prod(s) * b for s, b in zip(self.shapes, self.dtype_bytes))

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded or self.state_bytes

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return self.page_size_bytes

    def same_type(self, other: KVSpec) -> bool:
        return isinstance(other, MambaSpec)

    @classmethod
    def for_layer(cls, m: ModelInfo, layer: int, ctx: SpecContext) -> KVSpec:
        d = m.mamba_dims
        return MambaSpec(mamba_state_shapes(d, ctx.tensor_parallel_size), (d.conv_dtype_bytes, d.ssm_dtype_bytes))


Spec = KVSpec


def layer_specs(m: ModelInfo, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
                block_size: int | None = None) -> list[KVSpec]:
    """One spec per layer that holds cache, on one TP rank, with vLLM 0.25.1's hybrid block-size alignment
    applied (attention block raised so an attention page >= a Mamba page; the Mamba page padded to equal)."""
    tp = positive_int(tensor_parallel_size, "tensor_parallel_size")
    bs = positive_int(block_size or DEFAULT_BLOCK_SIZE, "block_size")
    fmt = kv_format(kv_cache_dtype, m.dtype)
    if m.mla and fmt.name == "nvfp4":
        raise BadInput("nvfp4 KV cache is not supported with MLA models in vLLM 0.25.1 (use fp8 or auto)")
    if fmt.name == "fp8_ds_mla" and not m.mla:
        raise BadInput("kv_cache_dtype fp8_ds_mla only applies to MLA (DeepSeek) models")
    ctx = SpecContext(tp, bs, fmt, max(1, m.num_kv_heads // tp))
    specs = [SPEC_BY_LAYER_KIND[kind].for_layer(m, i, ctx) for i, kind in enumerate(m.layer_kinds)
             if kind in SPEC_BY_LAYER_KIND]
    return align_hybrid_block_size(specs, bs)


def align_hybrid_block_size(specs: list[KVSpec], kernel_block_alignment: int = DEFAULT_BLOCK_SIZE) -> list[KVSpec]:
    """``Platform._align_hybrid_block_size`` (mamba_cache_mode 'none'): attention block size =
    alignment x cdiv(mamba_page, alignment x attention_page_per_token); the Mamba page padded to match."""
    mambas = [s for s in specs if isinstance(s, MambaSpec)]
    attns = [s for s in specs if not isinstance(s, MambaSpec)]
    if not mambas or not attns:
        return specs
    mamba_page = max(s.state_bytes for s in mambas)
    per_token = attns[0].bytes_per_token
    new_block = kernel_block_alignment * cdiv(mamba_page, kernel_block_alignment * per_token)
    block = max(attns[0].block_size, new_block)
    attn_page = block * per_token
    out: list[KVSpec] = []
    for s in specs:
        if isinstance(s, MambaSpec):
            out.append(replace(s, block_size=block, page_size_padded=attn_page if attn_page != s.state_bytes else None))
        else:
            out.append(s.with_block_size(block))
    return out


def kv_bytes_per_token(m: ModelInfo, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    """Bytes one token costs across all attention layers of one rank (sliding layers included, while the
    token is inside the window). Mamba state is per sequence: see ``mamba_state_bytes_per_sequence``."""
    return sum(s.bytes_per_token for s in layer_specs(m, kv_cache_dtype, tensor_parallel_size))


def mamba_state_bytes_per_sequence(m: ModelInfo, tensor_parallel_size: int = 1) -> int:
    """Conv + SSM state of all Mamba layers for one sequence on one rank (unpadded)."""
    return sum(s.state_bytes for s in layer_specs(m, "auto", tensor_parallel_size) if isinstance(s, MambaSpec))
