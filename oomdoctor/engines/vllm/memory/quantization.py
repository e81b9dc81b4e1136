"""Weight quantization from ``quantization_config`` (or ``compression_config``): one reader per method."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from oomdoctor.errors import BadInput


@dataclass(frozen=True)
class Quantization:
    """Weight quantization read from ``quantization_config`` (or ``compression_config``)."""
    method: str
    bits: float                     # bits per quantized weight element
    group_size: int = 0             # elements per scale (0: per channel / per tensor)
    scale_bytes: float = 2.0        # bytes of one scale (+ zero point) per group
    kv_cache_dtype: str | None = None   # a kv cache scheme the checkpoint declares ('fp8'), if any

    def bytes_per_param(self) -> float:
        extra = self.scale_bytes / self.group_size if self.group_size else 0.0
        return self.bits / 8 + extra


def _kv_scheme(qc: dict[str, Any]) -> str | None:
    kv_scheme = qc.get("kv_cache_scheme") or qc.get("kv_cache_quant_algo")
    if isinstance(kv_scheme, dict) and kv_scheme.get("num_bits") == 8:
        return "fp8"
    if isinstance(kv_scheme, str) and "fp8" in kv_scheme.lower():
        return "fp8"
    return None


def _fp8(method: str, qc: dict[str, Any], kv: str | None) -> Quantization:
    block = qc.get("weight_block_size")
    if isinstance(block, list) and len(block) == 2:
        return Quantization(method, 8, int(block[0]) * int(block[1]), 4.0, kv)
    return Quantization(method, 8, 0, 0.0, kv)


def _int_grouped(method: str, qc: dict[str, Any], kv: str | None) -> Quantization:
    """awq / gptq / auto-round: ``bits`` per weight, an fp16 scale + packed zero point per group
    (per output channel when group_size is -1)."""
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if not isinstance(bits, (int, float)) or bits <= 0:
        raise BadInput(f"config.json: {method} quantization_config lacks 'bits'")
    group = int(group) if isinstance(group, (int, float)) and group > 0 else 0
    return Quantization(method, float(bits), group, 2 + bits / 8, kv)


def _bitsandbytes(method: str, qc: dict[str, Any], kv: str | None) -> Quantization:
    if qc.get("load_in_4bit") or qc.get("bnb_4bit_quant_type"):
        return Quantization(method, 4, 64, 1.0 if qc.get("bnb_4bit_use_double_quant") else 4.0, kv)
    if qc.get("load_in_8bit"):
        return Quantization(method, 8, 0, 0.0, kv)
    raise BadInput("config.json: bitsandbytes quantization_config says neither load_in_4bit nor load_in_8bit")


def _compressed_tensors(method: str, qc: dict[str, Any], kv: str | None) -> Quantization:
    groups = qc.get("config_groups") or {}
    bits_seen = []
    for g in groups.values() if isinstance(groups, dict) else []:
        w = (g or {}).get("weights") or {}
        if isinstance(w.get("num_bits"), (int, float)):
            gs = w.get("group_size") if w.get("strategy") in ("group", "tensor_group") else 0
            bits_seen.append((float(w["num_bits"]), int(gs or 0), str(w.get("type", "int"))))
    if not bits_seen:
        raise BadInput("config.json: compressed-tensors quantization_config has no config_groups.*.weights.num_bits")
    bits, gs, typ = max(bits_seen)
    scale = 1.0 if (typ == "float" and bits == 4) else 2.0
    return Quantization(method, bits, gs, scale, kv)


def _modelopt(method: str, qc: dict[str, Any], kv: str | None) -> Quantization:
    algo = str((qc.get("quantization") or qc).get("quant_algo", "")).upper()
    if "FP4" in algo:
        return Quantization(method, 4, 16, 1.0, kv)
    if "FP8" in algo:
        return Quantization(method, 8, 0, 0.0, kv)
    raise BadInput(f"config.json: modelopt quant_algo {algo!r}: cannot derive the weight bits")


def _mxfp4(method: str, qc: dict[str, Any], kv: str | None) -> Quantization:
    return Quantization(method, 4, 32, 1.0, kv)


_Reader = Callable[[str, dict[str, Any], "str | None"], Quantization]
#: quant_method -> its reader; a new method is one function and one line here.
READERS: dict[str, _Reader] = {
    **dict.fromkeys(("fp8", "fbgemm_fp8", "ptpc_fp8"), _fp8),
    **dict.fromkeys(("awq", "awq_marlin", "gptq", "gptq_marlin", "auto-round", "auto_round"), _int_grouped),
    "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors,
    **dict.fromkeys(("modelopt", "modelopt_fp4", "modelopt_mxfp8"), _modelopt),
    "mxfp4": _mxfp4,
}


def parse_quantization(cfg: dict[str, Any]) -> Quantization | None:
    """Weight bits from ``quantization_config``: fp8, awq, gptq, bitsandbytes (4/8-bit), compressed-tensors,
    modelopt (fp8 / nvfp4), mxfp4. Raises BadInput when the bits cannot be derived."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise BadInput("config.json: quantization_config must be an object")
    method = str(qc.get("quant_method", "")).lower().replace("compressed_tensors", "compressed-tensors")
    reader = READERS.get(method)
    if reader is None:
        raise BadInput(f"config.json: quantization method {method or '(none)'!r}: cannot derive the weight bits "
                       "from the config; put the *.safetensors files (or model.safetensors.index.json) in the directory")
    return reader(method, qc, _kv_scheme(qc))
