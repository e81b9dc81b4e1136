"""Per-layer layout of each architecture family: attention kind and window, MLP kind, MoE / Mamba dims,
the way vLLM 0.25.1 builds the layers."""
from __future__ import annotations

import math
from dataclasses import dataclass

from oomdoctor.engines.vllm.memory.common import DTYPE_BYTES
from oomdoctor.engines.vllm.memory.config_fields import Config, need_int
from oomdoctor.engines.vllm.memory.model import MambaDims, MLADims, MoEDims
from oomdoctor.errors import BadInput


@dataclass(frozen=True)
class LayerLayout:
    """What a family's layout reader returns: per layer, the cache kind, window and MLP kind."""
    kinds: list[str]
    windows: list[int]
    mlps: list[str]
    moe: MoEDims | None = None
    mamba: MambaDims | None = None

    @property
    def num_layers(self) -> int:
        return len(self.kinds)


def _window_pattern(cfg: Config, model_type: str, n: int) -> list[bool]:
    """Which layers slide when the config gives one model-level window and no ``layer_types``."""
    if model_type.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return [bool((i + 1) % pattern) for i in range(n)]
    if model_type.startswith("gemma2"):
        return [i % 2 == 0 for i in range(n)]
    if model_type.startswith("qwen2") or model_type.startswith("qwen3"):
        mwl = int(cfg.get("max_window_layers") or 0)
        return [i >= mwl for i in range(n)]
    return [True] * n   # Mistral-style: one model-level window applies to every layer (CacheConfig.sliding_window)


def attention_layout(cfg: Config, model_type: str, n: int) -> tuple[list[str], list[int]]:
    """Per-layer attention kind ('full' / 'sliding') and window, the way vLLM 0.25.1 builds the layers."""
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    layer_types = cfg.get("layer_types")
    kinds, windows = ["full"] * n, [0] * n
    if isinstance(layer_types, list) and layer_types:
        if len(layer_types) < n:
            raise BadInput(f"config.json: layer_types has {len(layer_types)} entries for {n} layers")
        for i in range(n):
            if layer_types[i] == "sliding_attention" and window:
                kinds[i], windows[i] = "sliding", int(window)
        return kinds, windows
    if not window:
        return kinds, windows
    for i, sliding in enumerate(_window_pattern(cfg, model_type, n)):
        if sliding:
            kinds[i], windows[i] = "sliding", int(window)
    return kinds, windows


def mla_dims(cfg: Config, where: str) -> MLADims:
    return MLADims(kv_lora_rank=need_int(cfg, "kv_lora_rank", where),
                   qk_rope_head_dim=need_int(cfg, "qk_rope_head_dim", where),
                   qk_nope_head_dim=need_int(cfg, "qk_nope_head_dim", where),
                   v_head_dim=need_int(cfg, "v_head_dim", where), q_lora_rank=int(cfg.get("q_lora_rank") or 0))


def _dense_needs_intermediate(mlps: list[str], intermediate: int, where: str, what: str = " for its dense layers") -> None:
    if "gated" in mlps and intermediate <= 0:
        raise BadInput(f"{where}: config.json lacks 'intermediate_size'{what}")


def moe_layout(cfg: Config, arch: str, where: str, n: int, intermediate: int) -> tuple[MoEDims | None, list[str]]:
    """(MoE dims, per-layer MLP kind) of Mixtral, Qwen2/3-MoE and DeepSeek V2/V3."""
    if arch == "MixtralForCausalLM":
        e = need_int(cfg, "num_local_experts", where)
        return MoEDims(num_experts=e, top_k=need_int(cfg, "num_experts_per_tok", where),
                       moe_intermediate=need_int(cfg, "intermediate_size", where), shared_intermediate=0,
                       gated=True), ["moe"] * n
    if arch in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        e = need_int(cfg, "num_experts", where)
        step = int(cfg.get("decoder_sparse_step") or 1)
        only = set(cfg.get("mlp_only_layers") or [])
        moe = MoEDims(num_experts=e, top_k=need_int(cfg, "num_experts_per_tok", where),
                      moe_intermediate=need_int(cfg, "moe_intermediate_size", where),
                      shared_intermediate=int(cfg.get("shared_expert_intermediate_size") or 0), gated=True)
        mlps = ["moe" if (i not in only and (i + 1) % step == 0) else "gated" for i in range(n)]
        _dense_needs_intermediate(mlps, intermediate, where)
        return moe, mlps
    # DeepSeek V2/V3
    e = int(cfg.get("n_routed_experts") or 0)
    if e <= 0:
        _dense_needs_intermediate(["gated"], intermediate, where, "")
        return None, ["gated"] * n
    first = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    moe_i = need_int(cfg, "moe_intermediate_size", where)
    moe = MoEDims(num_experts=e, top_k=need_int(cfg, "num_experts_per_tok", where), moe_intermediate=moe_i,
                  shared_intermediate=int(cfg.get("n_shared_experts") or 0) * moe_i, gated=True)
    mlps = ["moe" if (i >= first and i % freq == 0) else "gated" for i in range(n)]
    _dense_needs_intermediate(mlps, intermediate, where)
    return moe, mlps


def _nemotron_blocks(cfg: Config, where: str) -> list[str]:
    pattern = cfg.get("hybrid_override_pattern")
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if isinstance(pattern, str) and pattern:
        mapping = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
        if any(c not in mapping for c in pattern):
            raise BadInput(f"{where}: hybrid_override_pattern has characters other than M * - E: {pattern!r}")
        return [mapping[c] for c in pattern]
    if isinstance(types, list) and types:
        alias = {"linear_attention": "mamba", "full_attention": "attention"}
        return [str(alias.get(t, t)) for t in types]
    raise BadInput(f"{where}: config.json lacks 'hybrid_override_pattern' (or layers_block_type)")


def _nemotron_h_layout(cfg: Config, where: str, dtype: str) -> LayerLayout:
    blocks = _nemotron_blocks(cfg, where)
    n = len(blocks)
    kinds = ["mamba" if b == "mamba" else "full" if b == "attention" else "none" for b in blocks]
    mlps = ["plain" if b == "mlp" else "moe" if b == "moe" else "none" for b in blocks]
    heads = need_int(cfg, "mamba_num_heads", where)
    hdim = need_int(cfg, "mamba_head_dim", where)
    ssm_dtype = str(cfg.get("mamba_ssm_cache_dtype") or "float32")
    mamba = MambaDims("mamba2", heads * hdim, need_int(cfg, "ssm_state_size", where), need_int(cfg, "conv_kernel", where),
                      n_groups=need_int(cfg, "n_groups", where), num_heads=heads, head_dim=hdim,
                      chunk_size=int(cfg.get("chunk_size") or 128), ssm_dtype_bytes=DTYPE_BYTES.get(ssm_dtype, 4),
                      conv_dtype_bytes=DTYPE_BYTES[dtype])
    moe = None
    if "moe" in mlps:
        i_moe = need_int(cfg, "moe_intermediate_size", where)
        shared = int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_shared_expert_intermediate_size") or i_moe)
        moe = MoEDims(num_experts=need_int(cfg, "n_routed_experts", where),
                      top_k=need_int(cfg, "num_experts_per_tok", where), moe_intermediate=i_moe,
                      shared_intermediate=shared, gated=False)
    if "plain" in mlps:
        need_int(cfg, "intermediate_size", where)
    return LayerLayout(kinds, [0] * n, mlps, moe, mamba)


def _jamba_layout(cfg: Config, where: str, hidden: int, dtype: str) -> LayerLayout:
    n = need_int(cfg, "num_hidden_layers", where)
    ap, ao = int(cfg.get("attn_layer_period") or 8), int(cfg.get("attn_layer_offset") or 4)
    ep, eo = int(cfg.get("expert_layer_period") or 2), int(cfg.get("expert_layer_offset") or 1)
    e = int(cfg.get("num_experts") or 1)
    kinds = ["full" if i % ap == ao else "mamba" for i in range(n)]
    mlps = ["moe" if (e > 1 and i % ep == eo) else "gated" for i in range(n)]
    expand = need_int(cfg, "mamba_expand", where)
    dt_rank_cfg = cfg.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank_cfg in (None, "auto") else int(dt_rank_cfg)
    mamba = MambaDims("mamba1", expand * hidden, need_int(cfg, "mamba_d_state", where), need_int(cfg, "mamba_d_conv", where),
                      dt_rank=dt_rank, ssm_dtype_bytes=DTYPE_BYTES[dtype], conv_dtype_bytes=DTYPE_BYTES[dtype])
    moe = None
    if "moe" in mlps:
        moe = MoEDims(num_experts=e, top_k=need_int(cfg, "num_experts_per_tok", where),
                      moe_intermediate=need_int(cfg, "intermediate_size", where), shared_intermediate=0, gated=True)
    need_int(cfg, "intermediate_size", where)
    return LayerLayout(kinds, [0] * n, mlps, moe, mamba)


def hybrid_layout(cfg: Config, arch: str, where: str, hidden: int, dtype: str) -> LayerLayout:
    """Mamba + attention models: NemotronH (from its block pattern) and Jamba (periods and offsets)."""
    if arch == "NemotronHForCausalLM":
        return _nemotron_h_layout(cfg, where, dtype)
    return _jamba_layout(cfg, where, hidden, dtype)
