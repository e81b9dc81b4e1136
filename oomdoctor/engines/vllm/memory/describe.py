"""``describe_model``: a config.json (and its directory) -> ``ModelInfo``."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from oomdoctor.engines.vllm.memory.architectures import (LayerLayout, attention_layout, hybrid_layout, mla_dims,
                                                         moe_layout)
from oomdoctor.engines.vllm.memory.common import DTYPE_BYTES, positive_int
from oomdoctor.engines.vllm.memory.config_fields import (Config, derive_max_model_len, dtype_of, get, need_int,
                                                         rope_cache_rows, rope_params, text_config)
from oomdoctor.engines.vllm.memory.model import (HYBRID_ARCHS, MLA_ARCHS, MOE_ARCHS, REMOVED_ARCHS, SUPPORTED_ARCHS,
                                                 MLADims, ModelInfo)
from oomdoctor.engines.vllm.memory.model_files import read_config
from oomdoctor.engines.vllm.memory.quantization import parse_quantization
from oomdoctor.errors import BadInput


def _architecture(cfg0: Config, model_dir: Any) -> str:
    archs = cfg0.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise BadInput(f"{model_dir}: config.json has no 'architectures' list; cannot tell what the model is")
    arch = archs[0]
    if arch in REMOVED_ARCHS:
        raise BadInput(f"{arch} was removed from vLLM in {REMOVED_ARCHS[arch]}; vLLM 0.25.1 cannot load it")
    if arch not in SUPPORTED_ARCHS:
        raise BadInput(f"unknown architecture {arch!r} (the memory model knows: {', '.join(sorted(SUPPORTED_ARCHS))})")
    return arch


def _decoder_layout(cfg: Config, arch: str, model_type: str, where: str, head_dim: int, intermediate: int,
                    derived: int) -> tuple[LayerLayout, MLADims | None, list[tuple[int, int]]]:
    """Layout of a non-hybrid decoder (dense, MoE, MLA) and its RoPE caches."""
    n = need_int(cfg, "num_hidden_layers", where)
    max_pos = int(cfg.get("max_position_embeddings") or derived)
    rp = rope_params(cfg)
    partial = float(rp.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0)
    rope_caches: list[tuple[int, int]] = []
    mla = None
    if arch in MLA_ARCHS:
        kinds, windows = ["mla"] * n, [0] * n
        mla = mla_dims(cfg, where)
        rope_caches.append((rope_cache_rows(cfg, max_pos), mla["qk_rope_head_dim"]))
    else:
        kinds, windows = attention_layout(cfg, model_type, n)
        rope_caches.append((rope_cache_rows(cfg, max_pos), int(head_dim * partial)))
        if model_type.startswith("gemma3") and "sliding" in kinds:
            # Gemma-3 builds a second (local, unscaled) RoPE for its sliding layers.
            rope_caches.append((max_pos, int(head_dim * partial)))
    mlps, moe = ["gated"] * n, None
    if arch in MOE_ARCHS or arch in MLA_ARCHS:
        moe, mlps = moe_layout(cfg, arch, where, n, intermediate)
    elif intermediate <= 0:
        raise BadInput(f"{where}: config.json lacks 'intermediate_size', which the memory model needs")
    return LayerLayout(kinds, windows, mlps, moe), mla, rope_caches


def describe_model(model_dir: Union[str, Path], config: dict[str, Any] | None = None) -> ModelInfo:
    """Normalise a config.json into a ModelInfo. Raises BadInput for unknown/removed architectures and for
    missing fields (naming them)."""
    cfg0 = read_config(model_dir) if config is None else config
    arch = _architecture(cfg0, model_dir)
    where = f"{model_dir} ({arch})"
    cfg = text_config(cfg0, arch)
    model_type = str(cfg.get("model_type") or cfg0.get("model_type") or "")
    dtype = dtype_of(cfg, cfg0)
    hidden = need_int(cfg, "hidden_size", where)
    vocab = need_int(cfg, "vocab_size", where)
    heads = need_int(cfg, "num_attention_heads", where)
    kv_heads = positive_int(get(cfg, "num_key_value_heads", "num_kv_heads", default=heads), f"{where}: num_key_value_heads")
    hd = cfg.get("head_dim")
    head_dim = int(hd) if isinstance(hd, (int, float)) and hd and hd > 0 else hidden // heads
    if head_dim <= 0:
        raise BadInput(f"{where}: head_dim must be positive")
    derived, key = derive_max_model_len(cfg, model_type)
    notes: list[str] = []
    if cfg is not cfg0:
        notes.append(f"{arch}: only the text model is counted from config.json (vision tower weights and the "
                     "multimodal encoder's profiling peak are not; safetensors shards would include the weights)")
    quant = parse_quantization(cfg)
    tie = bool(cfg.get("tie_word_embeddings", model_type.startswith("gemma")))
    intermediate = int(cfg.get("intermediate_size") or 0)
    mla: MLADims | None = None
    rope_caches: list[tuple[int, int]] = []
    if arch in HYBRID_ARCHS:
        layout = hybrid_layout(cfg, arch, where, hidden, dtype)
    else:
        layout, mla, rope_caches = _decoder_layout(cfg, arch, model_type, where, head_dim, intermediate,
                                                      derived)
        if mla is not None:
            kv_heads = 1       # one latent per token, shared by all heads (get_num_kv_heads -> 1 for MLA)
            head_dim = mla["kv_lora_rank"] + mla["qk_rope_head_dim"]
    return ModelInfo(
        path=str(model_dir), architecture=arch, model_type=model_type, dtype=dtype, dtype_bytes=DTYPE_BYTES[dtype],
        hidden_size=hidden, num_layers=layout.num_layers, vocab_size=vocab, tie_word_embeddings=tie,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, layer_kinds=tuple(layout.kinds),
        sliding_windows=tuple(layout.windows), mlp_kinds=tuple(layout.mlps), intermediate_size=intermediate,
        derived_max_model_len=derived, max_len_key=key, rope_caches=tuple(rope_caches),
        attention_bias=bool(cfg.get("attention_bias") or model_type == "qwen2"),
        qk_norm=model_type.startswith(("qwen3", "gemma3")), moe=layout.moe, mla=mla, mamba=layout.mamba,
        quantization=quant, notes=tuple(notes),
    )

