"""Fields of a HF ``config.json`` read the way vLLM reads them: required values, dtype, RoPE, the length."""
from __future__ import annotations

import math
from typing import Any

from oomdoctor.engines.vllm.memory.common import DTYPE_BYTES, positive_int
from oomdoctor.errors import BadInput

Config = dict[str, Any]

#: HF length keys vLLM's ``_get_and_verify_max_len`` looks at.
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def get(cfg: Config, *names: str, default: Any = None) -> Any:
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def need(cfg: Config, name: str, where: str, *alts: str) -> Any:
    v = get(cfg, name, *alts)
    if v is None:
        alt = f" (or {', '.join(alts)})" if alts else ""
        raise BadInput(f"{where}: config.json lacks {name!r}{alt}, which the memory model needs")
    return v


def need_int(cfg: Config, name: str, where: str, *alts: str) -> int:
    return positive_int(need(cfg, name, where, *alts), f"{where}: {name}")


def dtype_of(cfg: Config, top: Config) -> str:
    d = get(cfg, "dtype", "torch_dtype") or get(top, "dtype", "torch_dtype")
    if d is None:
        return "float32"   # vLLM: a config without dtype loads as float32 -> downcast below
    d = str(d).replace("torch.", "").lower()
    if d not in DTYPE_BYTES:
        raise BadInput(f"config.json: unsupported dtype {d!r}")
    # vLLM's dtype 'auto' keeps fp16/bf16 and downcasts a float32 checkpoint to bfloat16.
    return "bfloat16" if DTYPE_BYTES[d] >= 4 else d


def rope_params(cfg: Config) -> dict[str, Any]:
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        rp = rp.get("full_attention") or next(iter(rp.values()))
    if not isinstance(rp, dict) or not rp:
        rp = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
    rp = dict(rp or {})
    if "type" in rp and "rope_type" not in rp:
        rp["rope_type"] = rp["type"]
    rp.setdefault("rope_type", "default")
    return rp


def derive_max_model_len(cfg: Config, model_type: str) -> tuple[int, str]:
    """vLLM's ``_get_and_verify_max_len`` default: the smallest of the HF length keys, times the RoPE
    scaling factor (``original_max_position_embeddings * factor`` for YaRN; no scaling for llama3/longrope
    and for Gemma-3, whose length is already scaled). 2048 with a warning when no key is present."""
    best: float = math.inf
    key = "default"
    for k in LENGTH_KEYS:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < best:
            best, key = v, k
    if isinstance(cfg.get("model_max_length"), (int, float)) and cfg["model_max_length"]:
        best, key = cfg["model_max_length"], "model_max_length"
    if best == math.inf:
        return 2048, "default (no length key in config.json; vLLM assumes 2048)"
    rp = rope_params(cfg)
    rtype = rp.get("rope_type", "default")
    if "gemma3" not in model_type and rtype not in ("default", "su", "longrope", "llama3"):
        factor = rp.get("factor") or 1.0
        if rtype == "yarn" and rp.get("original_max_position_embeddings"):
            best = rp["original_max_position_embeddings"]
        best = best * factor
    if best <= 0:
        raise BadInput(f"config.json: {key} must be positive, got {best}")
    return int(best), key


def rope_cache_rows(cfg: Config, max_position: int) -> int:
    """Rows of vLLM's ``cos_sin_cache`` (``get_rope``): sized by the config's positions, not by max_model_len."""
    rp = rope_params(cfg)
    rtype = rp.get("rope_type", "default")
    factor = float(rp.get("factor") or 1.0)
    if rtype in ("yarn", "deepseek_yarn", "deepseek_llama_scaling"):
        orig = rp.get("original_max_position_embeddings") or max_position
        return int(orig * factor)
    if rtype in ("linear", "dynamic"):
        return int(max_position * factor)
    return int(max_position)


def text_config(cfg: Config, arch: str) -> Config:
    """A multimodal model's text part (``text_config``), with the top-level fields vLLM reads from there."""
    if arch.endswith("ForConditionalGeneration") and isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        for k in ("dtype", "torch_dtype", "quantization_config", "tie_word_embeddings"):
            if k not in text and k in cfg:
                text[k] = cfg[k]
        return text
    return cfg
